"""Document readers: each SOURCE yields (doc_id, raw bytes) lazily, in a fixed order.

SOURCE strings are `KIND[:PATH[:FIELD[:ID]]]` (see `parse_source`); FORMATS, at the end of
this module, is the one list of kinds: each one's usage, what it reads and its reader. Help
text, error messages and docs/data.md's table are read from (or tested against) it.

`extract="html"` replaces every document by its main text (data.web.extract); "auto" does so
for textdir's files named as HTML (web.HTML_SUFFIXES: *.html, *.htm, *.xhtml, gzipped too).
Zero-length documents are yielded as-is; `prepare` skips and counts them, and likewise
documents that are not text (`is_text`: binaries such as .so files in a textdir) and Skipped
entries (files of other names in a folder source, unreadable folders, bad records, ...).
"""

from __future__ import annotations

import gzip
import os
import sysconfig
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from soma_jax.data import formats, web, windows
from soma_jax.data.documents import (
  MAX_DOCUMENT_BYTES,
  TEXT_SAMPLE_BYTES,
  Entry,
  Skipped,
  files_at,
  is_text,
)
from soma_jax.errors import UserError

EXTRACT = ("none", "html", "auto")
ON_BAD_RECORD = ("fail", "skip")
Document = tuple[str, bytes]


@dataclass(frozen=True)
class SourceSpec:
  """A parsed SOURCE string."""

  kind: str
  path: str | None = None  # folder (or file) for file sources, dataset name for tfds
  feature: str = "text"  # tfds feature, or the field / column of a record source, holding the text
  id_field: str | None = None  # a record source's field giving each document's id

  def __str__(self) -> str:
    if self.kind == "pystdlib":
      return "pystdlib"
    if self.kind == "tfds":
      return f"tfds:{self.path}:{self.feature}"
    if FORMATS[self.kind].fields:
      return f"{self.kind}:{self.path}:{self.feature}" + (f":{self.id_field}" if self.id_field else "")
    return f"{self.kind}:{self.path}"


def usages(reads: bool = False) -> str:
  """'fineweb_edu:FOLDER, ..., warc:PATH': every SOURCE form, from FORMATS (`reads`: each with
  what it reads, '; ' between them)."""
  if reads:
    return "; ".join(f"{f.usage}: {f.reads}" for f in FORMATS.values())
  return ", ".join(f.usage for f in FORMATS.values())


def parse_source(source: str) -> SourceSpec:
  """Parses `KIND[:PATH[:FIELD[:ID]]]`; raises UserError for an unknown kind or a missing path."""
  kind, _, rest = (source or "").partition(":")
  fmt = FORMATS.get(kind)
  if fmt is None:
    raise UserError(f"unknown --source={source!r}; fix: use one of {usages()}")
  if fmt.takes == "nothing":
    return SourceSpec(kind)
  if not rest:
    raise UserError(f"--source={source!r} has no path; fix: write --source={kind}:PATH")
  if fmt.takes == "name":
    name, _, feature = rest.partition(":")
    return SourceSpec(kind, name, feature or "text")
  path, fields = _split_path(rest) if fmt.fields else (rest, [])
  path = os.path.abspath(os.path.expanduser(path))
  one_file = fmt.takes == "file or folder"
  if not (os.path.isdir(path) or (one_file and os.path.isfile(path))):
    raise UserError(
      f"source {fmt.takes} {path!r} does not exist{'' if one_file else ' or is not a folder'}; "
      f"fix: pass an existing {fmt.takes} to --source={kind}:PATH"
    )
  if len(fields) > 2 or not all(fields):
    raise UserError(f"--source={source!r}: after the path come at most a text field and an id field, "
                    f"neither empty; fix: write --source={kind}:PATH[:FIELD[:ID]]")
  return SourceSpec(kind, path, *fields) if fields else SourceSpec(kind, path)


def _split_path(rest: str) -> tuple[str, list[str]]:
  """PATH and the fields after it in `PATH[:FIELD[:ID]]`: the longest prefix that exists is the
  path (so a path may hold a colon); if none exists, the part before the first colon."""
  parts = rest.split(":")
  for n in range(len(parts), 0, -1):
    if os.path.exists(os.path.expanduser(":".join(parts[:n]))):
      return ":".join(parts[:n]), parts[n:]
  return parts[0], parts[1:]


def check_options(extract: str, on_bad_record: str) -> None:
  """UserError for an --extract or --on_bad_record value that is not one of the choices."""
  if extract not in EXTRACT:
    raise UserError(f"--extract={extract!r} is not one of {', '.join(EXTRACT)}; fix: pass --extract=html or auto")
  if on_bad_record not in ON_BAD_RECORD:
    raise UserError(f"--on_bad_record={on_bad_record!r} is not one of {', '.join(ON_BAD_RECORD)}; "
                    "fix: pass --on_bad_record=skip or fail")


def iter_fineweb_edu(root: str, on_bad_record: str = "fail") -> Iterator[Entry]:
  """FineWeb-Edu parquet files under root (column `text`, ids from `id` where present)."""
  return formats.iter_parquet(root, "text", "id", on_bad_record, id_if_present=True,
                              fix="use FineWeb-Edu parquet files with a 'text' column of strings")


def iter_wikitext103(root: str, split: str = "train") -> Iterator[Document]:
  """Top-level-heading articles of wiki.{split}.raw."""
  path = os.path.join(root, f"wiki.{split}.raw")
  if not os.path.isfile(path):
    raise UserError(f"{path!r} not found; fix: point wikitext103:PATH at the folder holding wiki.{split}.raw")
  with open(path, "rb") as f:
    for i, (title, seg) in enumerate(windows.iter_wikitext_segments(f)):
      if seg.strip():
        yield f"{split}:{i}:{title}", seg


def _read_text_file(full: str) -> bytes | Skipped:
  """A file's bytes (.gz decompressed, streamed). A binary file is returned as its first
  64 KiB only, enough for `is_text` to refuse it; one that expands past
  MAX_DOCUMENT_BYTES is Skipped without holding more than that in memory."""
  try:
    opener = gzip.open if full.endswith(".gz") else open
    with opener(full, "rb") as f:
      head = f.read(TEXT_SAMPLE_BYTES)
      if not is_text(head):
        return head
      rest = f.read(MAX_DOCUMENT_BYTES + 1 - len(head))
      if len(head) + len(rest) > MAX_DOCUMENT_BYTES:
        return Skipped("over the size cap")
      return head + rest
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    raise UserError(f"gzip file {full!r} is truncated or corrupt ({e}); fix: re-create or remove it") from None
  except OSError as e:
    raise UserError(f"cannot read {full!r} ({e}); fix: check the file's permissions") from None


def iter_textdir(root: str) -> Iterator[tuple[str, bytes | Skipped]]:
  """Every file under root, one document per file, sorted by relative path, each real file
  once; then a Skipped entry for each folder that could not be listed."""
  files, passed = files_at(root)
  for rel, full in files:
    yield rel, _read_text_file(full)
  yield from passed


def iter_tfds(name: str, feature: str = "text", data_dir: str | None = None, split: str = "train") -> Iterator[Document]:
  """Records of a prepared TFDS dataset through tfds.data_source (no downloads)."""
  import tensorflow_datasets as tfds

  try:
    src = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises many types for a missing or unprepared dataset
    raise UserError(
      f"TFDS dataset {name!r} split {split!r} is not available ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
      "fix: prepare it with tfds.builder(NAME).download_and_prepare() and pass --tfds_data_dir"
    ) from None
  for i in range(len(src)):
    try:
      record = src[i]
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt array_record file
      raise UserError(
        f"TFDS dataset {name!r} split {split!r}: record {i} cannot be read ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:200] if str(e) else ''}); fix: prepare the dataset again "
        "(tfds.builder(NAME).download_and_prepare()) or restore its files"
      ) from None
    if feature not in record:
      raise UserError(
        f"TFDS dataset {name!r} has no feature {feature!r} (features: {', '.join(sorted(record))}); "
        f"fix: write --source=tfds:{name}:FEATURE"
      )
    value = record[feature]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
      value = value.item()
    if not isinstance(value, bytes | str):
      texts = [k for k, v in record.items() if isinstance(v, bytes | str)
               or getattr(getattr(v, "dtype", None), "kind", "-") in ("S", "U", "O")]
      raise UserError(
        f"TFDS feature {feature!r} of {name!r} holds {type(value).__name__} values, not text; "
        f"fix: --source=tfds:{name}:FEATURE with a text feature ({', '.join(sorted(texts)) or 'none found'})"
      )
    data = value if isinstance(value, bytes) else value.encode("utf-8")
    yield f"{name}/{split}/{i}", data


def pystdlib_root() -> str:
  """The running Python's standard-library folder."""
  return sysconfig.get_paths()["stdlib"]


def pystdlib_files() -> list[str]:
  """Sorted stdlib *.py paths, excluding site-packages and test/tests folders."""
  root = pystdlib_root()
  skip = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
    out.extend(os.path.relpath(os.path.join(dirpath, n), root) for n in filenames if n.endswith(".py"))
  return sorted(out)


def iter_pystdlib() -> Iterator[Document]:
  """The standard-library source tree, one document per *.py file."""
  root = pystdlib_root()
  for rel in pystdlib_files():
    with open(os.path.join(root, rel), "rb") as f:
      yield rel, f.read()


def iter_documents(spec: SourceSpec | str, *, tfds_data_dir: str | None = None, extract: str = "none",
                   on_bad_record: str = "fail", counts: Counter | None = None) -> Iterator[Entry]:
  """The training-corpus documents of a source, lazily and in a fixed order, HTML extracted
  as `extract` says (warc: always); `counts` gains "html_extracted", the pages extracted."""
  if isinstance(spec, str):
    spec = parse_source(spec)
  check_options(extract, on_bad_record)
  docs = FORMATS[spec.kind].read(spec, ReadOptions(tfds_data_dir, on_bad_record))
  if spec.kind == "warc" or extract == "html":
    which = lambda _: True
  elif extract == "auto" and spec.kind == "textdir":
    which = lambda doc_id: doc_id.lower().endswith(web.HTML_SUFFIXES)
  else:
    return docs
  return web.extracted(docs, which, Counter() if counts is None else counts)


# ------------------------------------------------------------------ the source formats

@dataclass(frozen=True)
class ReadOptions:
  """What a reader may need besides its SourceSpec."""

  tfds_data_dir: str | None = None
  on_bad_record: str = "fail"  # fail | skip: a record a reader cannot use


@dataclass(frozen=True)
class Format:
  """One kind of SOURCE: how it is written, what it reads, and its reader."""

  usage: str  # the SOURCE string's form, e.g. "jsonl:PATH[:FIELD[:ID]]"
  reads: str  # what it reads, in a few words
  read: Callable[[SourceSpec, ReadOptions], Iterator[Entry]]
  takes: str = "folder"  # after KIND: "folder", "file or folder", "name" (tfds) or "nothing"
  fields: bool = False  # PATH[:FIELD[:ID]]: a record source's text field and id field


FORMATS: dict[str, Format] = {
  "fineweb_edu": Format("fineweb_edu:FOLDER", "FineWeb-Edu parquet files, column text, ids from id",
                        lambda s, o: iter_fineweb_edu(s.path, o.on_bad_record)),
  "wikitext103": Format("wikitext103:FOLDER", "wiki.train.raw, one document per top-level-heading article",
                        lambda s, o: iter_wikitext103(s.path)),
  "textdir": Format("textdir:FOLDER", "every file under the folder, one document each, .gz decompressed",
                    lambda s, o: iter_textdir(s.path)),
  "tfds": Format("tfds:NAME[:FEATURE]", "a TFDS dataset already prepared, feature default text, nothing downloaded",
                 lambda s, o: iter_tfds(s.path, s.feature, o.tfds_data_dir), takes="name"),
  "pystdlib": Format("pystdlib", "this Python's standard-library *.py files, the demo corpus",
                     lambda s, o: iter_pystdlib(), takes="nothing"),
  "jsonl": Format("jsonl:PATH[:FIELD[:ID]]", "*.jsonl, *.jsonl.gz, *.jsonl.zst files, one line = one document, FIELD default text",
                  lambda s, o: formats.iter_jsonl(s.path, s.feature, s.id_field, o.on_bad_record),
                  takes="file or folder", fields=True),
  "parquet": Format("parquet:PATH[:COLUMN[:ID]]", "*.parquet files, one row = one document, COLUMN default text",
                    lambda s, o: formats.iter_parquet(s.path, s.feature, s.id_field, o.on_bad_record),
                    takes="file or folder", fields=True),
  "hf_disk": Format("hf_disk:FOLDER[:COLUMN[:ID]]", "a folder written by datasets' save_to_disk, one row = one document",
                    lambda s, o: formats.iter_hf_disk(s.path, s.feature, s.id_field, o.on_bad_record), fields=True),
  "warc": Format("warc:PATH", "*.warc, *.warc.gz files, the main text of each 2xx HTML response",
                 lambda s, o: web.iter_warc(s.path, o.on_bad_record), takes="file or folder"),
}
