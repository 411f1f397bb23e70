"""Document readers: each SOURCE yields (doc_id, raw bytes) lazily, in a fixed order.

SOURCE strings (see `parse_source`):
  fineweb_edu:PATH   folder of FineWeb-Edu parquet files (column `text`, optional `id`),
                     read one row group at a time.
  wikitext103:PATH   folder with wiki.train.raw; documents are top-level-heading articles.
  textdir:PATH       every file under a folder, one document per file (.gz decompressed).
  tfds:NAME[:FEATURE] a prepared TFDS dataset via tfds.data_source (feature default `text`).
  pystdlib           this Python's standard-library *.py files (no tests, no site-packages).
  jsonl:PATH[:FIELD[:ID]], parquet:PATH[:COLUMN[:ID]], hf_disk:FOLDER[:COLUMN[:ID]]
                     one record = one document (soma_jax.data.formats).
  warc:PATH          the HTML responses of WARC archives, main text extracted (data.web).

`extract="html"` replaces every document by its main text (data.web.extract); "auto" does so
for textdir's *.html / *.htm files. Zero-length documents are yielded as-is; `prepare` skips
and counts them, and likewise documents that are not text (`is_text`: binaries such as .so
files in a textdir) and Skipped entries.
"""

from __future__ import annotations

import gzip
import os
import sysconfig
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from soma_jax.data import formats, web, windows
from soma_jax.data.documents import (
  MAX_DOCUMENT_BYTES,
  TEXT_SAMPLE_BYTES,
  Entry,
  Skipped,
  check_nonempty,
  is_text,
  walk_files,
)
from soma_jax.errors import UserError

KINDS = ("fineweb_edu", "wikitext103", "textdir", "tfds", "pystdlib", "jsonl", "parquet", "hf_disk", "warc")
RECORD_KINDS = ("jsonl", "parquet", "hf_disk")  # KIND:PATH[:FIELD[:ID]]
FILE_KINDS = ("jsonl", "parquet", "warc")  # PATH may be one file
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
    if self.kind in RECORD_KINDS:
      return f"{self.kind}:{self.path}:{self.feature}" + (f":{self.id_field}" if self.id_field else "")
    return f"{self.kind}:{self.path}"


def parse_source(source: str) -> SourceSpec:
  """Parses `KIND[:PATH[:FIELD[:ID]]]`; raises UserError for an unknown kind or a missing path."""
  kind, _, rest = (source or "").partition(":")
  if kind not in KINDS:
    raise UserError(
      f"unknown --source={source!r}; fix: use one of fineweb_edu:PATH, wikitext103:PATH, textdir:PATH, "
      "tfds:NAME[:FEATURE], pystdlib, jsonl:PATH[:FIELD[:ID]], parquet:PATH[:COLUMN[:ID]], "
      "hf_disk:FOLDER[:COLUMN[:ID]], warc:PATH"
    )
  if kind == "pystdlib":
    return SourceSpec("pystdlib")
  if not rest:
    raise UserError(f"--source={source!r} has no path; fix: write --source={kind}:PATH")
  if kind == "tfds":
    name, _, feature = rest.partition(":")
    return SourceSpec("tfds", name, feature or "text")
  path, fields = _split_path(rest) if kind in RECORD_KINDS else (rest, [])
  path = os.path.abspath(os.path.expanduser(path))
  if not (os.path.isdir(path) or (kind in FILE_KINDS and os.path.isfile(path))):
    what = "file or folder" if kind in FILE_KINDS else "folder"
    raise UserError(
      f"source {what} {path!r} does not exist{'' if kind in FILE_KINDS else ' or is not a folder'}; "
      f"fix: pass an existing {what} to --source={kind}:PATH"
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


def iter_fineweb_edu(root: str) -> Iterator[Entry]:
  """FineWeb-Edu parquet files under root (column `text`, ids from `id` where present)."""
  return formats.iter_parquet(root, "text", "id", id_if_present=True,
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
  """Every file under root, one document per file, sorted by relative path; then a Skipped
  entry for each folder that could not be listed."""
  unreadable: list[str] = []
  files = walk_files(root, unreadable=unreadable)
  if not files and not unreadable:
    check_nonempty(files, root, "files")
  for rel in files:
    yield rel, _read_text_file(os.path.join(root, rel))
  for rel in unreadable:
    yield rel + "/", Skipped("unreadable folder")


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
  docs = _raw_documents(spec, tfds_data_dir, on_bad_record)
  if spec.kind == "warc" or extract == "html":
    which = lambda _: True
  elif extract == "auto" and spec.kind == "textdir":
    which = lambda doc_id: doc_id.lower().endswith(web.HTML_SUFFIXES)
  else:
    return docs
  return web.extracted(docs, which, Counter() if counts is None else counts)


def _raw_documents(spec: SourceSpec, tfds_data_dir: str | None, on_bad_record: str) -> Iterator[Entry]:
  if spec.kind in ("jsonl", "parquet", "hf_disk", "warc"):
    if spec.kind == "jsonl":
      return formats.iter_jsonl(spec.path, spec.feature, spec.id_field, on_bad_record)
    if spec.kind == "parquet":
      return formats.iter_parquet(spec.path, spec.feature, spec.id_field)
    if spec.kind == "hf_disk":
      return formats.iter_hf_disk(spec.path, spec.feature, spec.id_field)
    return web.iter_warc(spec.path, on_bad_record)
  if spec.kind == "fineweb_edu":
    return iter_fineweb_edu(spec.path)
  if spec.kind == "wikitext103":
    return iter_wikitext103(spec.path)
  if spec.kind == "textdir":
    return iter_textdir(spec.path)
  if spec.kind == "tfds":
    return iter_tfds(spec.path, spec.feature, tfds_data_dir)
  return iter_pystdlib()
