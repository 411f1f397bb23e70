"""Web text: the main text of HTML pages (trafilatura), and the HTML responses of WARC archives.

`extract(html)` keeps a page's main text (headings, paragraphs, lists, tables, code) and drops
markup, navigation, boilerplate and comments, so byte models and the tf-idf clusters see text,
not tags. `iter_warc(path)` reads *.warc / *.warc.gz files (a file or a folder of them) as a
stream: each HTTP response with a 2xx status and an HTML content type is one document, decoded
by its HTTP charset and its text extracted; other responses, and the revisit, resource,
conversion and continuation records, are Skipped by reason; request, metadata and warcinfo
records, and a crawler's `dns:` lookups, are no documents and are passed over.
Both need the optional extra: pip install -e ".[web]".
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import logging
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator

from soma_jax.data import documents
from soma_jax.data.documents import (
  TEXT_SAMPLE_BYTES,
  Entry,
  Skipped,
  files_at,
  is_text,
)
from soma_jax.errors import UserError

HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".html.gz", ".htm.gz", ".xhtml.gz")
HTML_TYPES = ("text/html", "application/xhtml+xml")
WARC_TYPES = ("warcinfo", "response", "resource", "request", "metadata", "revisit", "conversion", "continuation")
COUNTED_TYPES = ("resource", "revisit", "conversion", "continuation")  # Skipped and counted, not passed over
_WINDOWS_1252 = ("iso8859-1", "ascii")  # labels browsers read as windows-1252 (WHATWG Encoding)
EMPTY = Skipped("empty after extraction")
_INSTALL = 'pip install -e ".[web]"'


def _need(module: str, what: str = "extracting text from HTML"):
  try:
    loaded = __import__(module)
  except ImportError:
    raise UserError(f"{what} needs {module}, which is not installed; fix: {_INSTALL}") from None
  # trafilatura logs each page it finds nothing in at WARNING / ERROR; prepare counts them instead
  logging.getLogger(module).setLevel(logging.CRITICAL)
  return loaded


def extract(html: bytes) -> bytes:
  """The main text of an HTML page as UTF-8 (b"" when the page has none). A fragment without
  <html> or <body> (a record's HTML field) is read as a page's body: trafilatura finds nothing in
  a bare fragment."""
  trafilatura = _need("trafilatura")
  head = html[:TEXT_SAMPLE_BYTES].lower()
  if b"<html" not in head and b"<body" not in head:
    html = b"<html><body>" + html + b"</body></html>"
  text = trafilatura.extract(html, include_comments=False, include_tables=True, deduplicate=False,
                             favor_recall=True, with_metadata=False)
  return (text or "").strip().encode("utf-8", errors="surrogatepass")


def extracted(docs: Iterable[Entry], which, counts: Counter) -> Iterator[Entry]:
  """`docs` with each document whose id passes `which` replaced by its extracted text (EMPTY
  when none is left); counts["html_extracted"] counts the pages extracted. trafilatura reads
  bytes that are valid UTF-8 as UTF-8 and guesses the rest (a <meta charset> guides the guess)."""
  _need("trafilatura")  # before the first document, not at the first page
  for doc_id, data in docs:
    if isinstance(data, Skipped) or not data or not which(doc_id) or not is_text(data):
      yield doc_id, data  # prepare counts what it cannot use
      continue
    counts["html_extracted"] += 1
    text = extract(data)
    yield doc_id, (text if text else EMPTY)


class _Checked(io.RawIOBase):
  """A decompressed WARC stream whose truncation or corruption is a UserError: warcio itself
  ends a cut-off archive quietly, as if it were complete."""

  def __init__(self, f, full: str):
    self._f, self._full = f, full
    self.delivered = 0  # decompressed bytes read so far

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    try:
      data = self._f.read(len(b))
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
      raise UserError(f"WARC file {self._full!r} is truncated or corrupt ({e}); fix: re-create or remove it") from None
    b[: len(data)] = data
    self.delivered += len(data)
    return len(data)

  def close(self) -> None:
    self._f.close()
    super().close()


def _open_warc(full: str):
  opened = gzip.open(full, "rb") if full.endswith(".gz") else open(full, "rb")
  stream = io.BufferedReader(_Checked(opened, full), 1 << 20)
  if not stream.peek(5)[:5].startswith(b"WARC/"):
    stream.close()
    raise UserError(f"{full!r} is not a WARC file (it does not start with 'WARC/'); fix: pass WARC or WARC.gz files")
  return stream


def iter_warc(path: str, on_bad_record: str = "fail") -> Iterator[Entry]:
  """The HTML of every 2xx HTML response in the WARC file(s) at `path` (not yet extracted:
  `extracted` does that); ids are the target URIs."""
  _need("warcio", "reading WARC archives")
  from warcio.archiveiterator import ArchiveIterator

  files, passed = files_at(path, (".warc", ".warc.gz"))
  for _, full in files:
    with _open_warc(full) as stream:
      archive = ArchiveIterator(stream, arc2warc=False)
      it, n = iter(archive), 0
      while (record := _next_record(it, full, n)) is not None:
        n += 1
        _check_header(record, full, n)
        entry = _response(record, full, n, on_bad_record)
        _drain(record, full, n)
        if entry is not None:
          yield entry
      if archive.offset < stream.raw.delivered:  # warcio stops quietly at a cut-off record header
        raise UserError(f"WARC file {full!r} ends in an incomplete record after record {n} (the file is truncated); "
                        "fix: re-create or remove it")
  yield from passed


def _next_record(it, full: str, n: int):
  """warcio's next record; what warcio would print to stderr (a bad Content-Length) is a UserError."""
  warned = io.StringIO()
  try:
    with contextlib.redirect_stderr(warned):
      record = next(it, None)
  except UserError:
    raise
  except Exception as e:  # warcio's ArchiveLoadFailed, or what a cut-off header makes it raise
    from warcio.exceptions import ArchiveLoadFailed

    lines = str(e).strip().splitlines() if isinstance(e, ArchiveLoadFailed) else []
    why = lines[0] if lines else "its WARC header is incomplete"
    raise UserError(f"WARC file {full!r} record {n + 1} is malformed or cut off ({why}); "
                    "fix: re-create or remove the file") from None
  if warned.getvalue().strip():
    raise UserError(f"WARC file {full!r} record {n} is malformed (its Content-Length does not match its content, "
                    "or the file is truncated); fix: re-create or remove the file")
  return record


def _check_header(record, full: str, n: int) -> None:
  """A record whose WARC header lacks a known WARC-Type or a Content-Length (a header cut off,
  which warcio reads as if whole) is a UserError."""
  length = record.rec_headers.get_header("Content-Length") or ""
  if record.rec_type not in WARC_TYPES or not length.strip().isdigit():
    raise UserError(f"WARC file {full!r} record {n} has a malformed or cut-off header (WARC-Type {record.rec_type!r}, "
                    f"Content-Length {length!r}); fix: re-create or remove the file")


def _response(record, full: str, n: int, on_bad_record: str) -> Entry | None:
  """(URI, HTML or Skipped) of an HTTP response record; None for a record that is no page."""
  uri = record.rec_headers.get_header("WARC-Target-URI") or f"{full}#{n}"
  if record.rec_type in COUNTED_TYPES:
    return uri, Skipped(f"WARC {record.rec_type} record")
  if record.rec_type != "response" or uri.startswith("dns:"):
    return None
  headers = record.http_headers
  if headers is None or not (headers.protocol or "").startswith("HTTP/"):
    if on_bad_record == "skip":
      return uri, Skipped("bad record")
    raise UserError(f"WARC file {full!r} record {n} ({uri}) is a response that is not HTTP; fix: pass archives "
                    "of HTTP crawls, or --on_bad_record=skip to count and skip such records")
  status = headers.get_statuscode() or ""
  kind, charset = content_type(headers.get_header("Content-Type") or "")
  if not status.startswith("2"):
    return uri, Skipped("HTTP status not 2xx")
  if kind not in HTML_TYPES:
    return uri, Skipped("not HTML")
  body = record.content_stream().read(documents.MAX_DOCUMENT_BYTES + 1)
  if len(body) > documents.MAX_DOCUMENT_BYTES:
    return uri, Skipped("over the size cap")
  return uri, to_utf8(body, charset)


def content_type(value: str) -> tuple[str, str | None]:
  """(media type, charset or None) of a Content-Type header, both lowercased."""
  kind, *params = value.split(";")
  charset = None
  for param in params:
    name, _, val = param.partition("=")
    if name.strip().lower() == "charset":
      charset = val.strip().strip("\"'").lower() or None
  return kind.strip().lower(), charset


def to_utf8(body: bytes, charset: str | None) -> bytes:
  """`body` decoded by its declared charset, as UTF-8 (a byte no charset maps becomes U+FFFD);
  as it is when no charset is declared, or one Python does not know (then read as UTF-8 where
  valid, else guessed). iso-8859-1 and ascii are read as windows-1252, as browsers do."""
  try:
    codec = codecs.lookup(charset).name if charset else None
  except LookupError:
    codec = None
  if codec is None or codec == "utf-8":
    return body
  codec = "cp1252" if codec in _WINDOWS_1252 else codec
  return body.decode(codec, errors="replace").encode("utf-8", errors="surrogatepass")


def _drain(record, full: str, n: int) -> None:
  """Reads the rest of a record; fewer bytes than its Content-Length means a cut-off file."""
  raw = record.raw_stream
  while raw.read(1 << 16):
    pass
  if getattr(raw, "limit", 0) > 0:
    raise UserError(f"WARC file {full!r} record {n} is cut off (the file is truncated); fix: re-create or remove it")
