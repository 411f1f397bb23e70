"""Document readers: each SOURCE yields (doc_id, raw bytes) lazily, in a fixed order.

SOURCE strings (see `parse_source`):
  fineweb_edu:PATH   folder of FineWeb-Edu parquet files (column `text`, optional `id`),
                     read one row group at a time.
  wikitext103:PATH   folder with wiki.train.raw; documents are top-level-heading articles.
  textdir:PATH       every file under a folder, one document per file (.gz decompressed).
  tfds:NAME[:FEATURE] a prepared TFDS dataset via tfds.data_source (feature default `text`).
  pystdlib           this Python's standard-library *.py files (no tests, no site-packages).

Zero-length documents are yielded as-is; `prepare` skips and counts them, and likewise
documents that are not text (`is_text`: binaries such as .so files in a textdir).
"""

from __future__ import annotations

import gzip
import os
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from soma_jax.data import windows
from soma_jax.errors import UserError

KINDS = ("fineweb_edu", "wikitext103", "textdir", "tfds", "pystdlib")
Document = tuple[str, bytes]
TEXT_SAMPLE_BYTES = 1 << 16  # is_text looks at this many leading bytes
MAX_INVALID_FRACTION = 0.3  # random bytes are about half invalid UTF-8; Latin-1 text a few %


def is_text(data: bytes) -> bool:
  """False for binary data: a NUL byte, or more than 30% invalid UTF-8, in the first 64 KiB."""
  head = data[:TEXT_SAMPLE_BYTES]
  if b"\0" in head:
    return False
  valid = len(head.decode("utf-8", errors="ignore").encode("utf-8"))
  return len(head) - valid <= MAX_INVALID_FRACTION * len(head)


@dataclass(frozen=True)
class SourceSpec:
  """A parsed SOURCE string."""

  kind: str
  path: str | None = None  # folder for file sources, dataset name for tfds
  feature: str = "text"  # tfds feature holding the text

  def __str__(self) -> str:
    if self.kind == "pystdlib":
      return "pystdlib"
    if self.kind == "tfds":
      return f"tfds:{self.path}:{self.feature}"
    return f"{self.kind}:{self.path}"


def parse_source(source: str) -> SourceSpec:
  """Parses `KIND[:PATH]`; raises UserError for an unknown kind or a missing path."""
  kind, _, rest = (source or "").partition(":")
  if kind not in KINDS:
    raise UserError(
      f"unknown --source={source!r}; fix: use one of fineweb_edu:PATH, wikitext103:PATH, "
      "textdir:PATH, tfds:NAME[:FEATURE], pystdlib"
    )
  if kind == "pystdlib":
    return SourceSpec("pystdlib")
  if not rest:
    raise UserError(f"--source={source!r} has no path; fix: write --source={kind}:PATH")
  if kind == "tfds":
    name, _, feature = rest.partition(":")
    return SourceSpec("tfds", name, feature or "text")
  path = os.path.abspath(os.path.expanduser(rest))
  if not os.path.isdir(path):
    raise UserError(
      f"source folder {path!r} does not exist or is not a folder; fix: pass an existing folder to --source={kind}:PATH"
    )
  return SourceSpec(kind, path)


@dataclass(frozen=True)
class Skipped:
  """Yielded in place of a document's bytes for what a file source could not use: `prepare`
  counts these by `reason` and names the first few in its summary line."""

  reason: str  # "unreadable folder" or "over the size cap"


MAX_DOCUMENT_BYTES = 256 << 20  # a file (after gunzip) larger than this is skipped, never read


def _walk_files(root: str, exts: tuple[str, ...] | None = None,
                unreadable: list[str] | None = None) -> list[str]:
  """Sorted relative paths of regular files under root (hidden entries skipped).

  Symlinked folders are followed, except one leading back to a folder already on the way
  (a loop) or already walked; a folder that cannot be listed is appended to `unreadable`.
  """
  out, seen = [], set()

  def failed(err: OSError) -> None:
    if unreadable is not None:
      unreadable.append(os.path.relpath(err.filename, root) if err.filename else "?")

  for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=True):
    seen.add(os.path.realpath(dirpath))
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                         and os.path.realpath(os.path.join(dirpath, d)) not in seen)
    for name in filenames:
      if name.startswith("."):
        continue
      if exts is not None and not name.endswith(exts):
        continue
      full = os.path.join(dirpath, name)
      if os.path.isfile(full):
        out.append(os.path.relpath(full, root))
  return sorted(out)


def _check_nonempty(files: list[str], root: str, what: str) -> None:
  if not files:
    raise UserError(f"no {what} found under {root!r}; fix: point the source at a folder that holds them")


def iter_fineweb_edu(root: str) -> Iterator[Document]:
  """FineWeb-Edu parquet files under root, read one row group at a time."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  files = _walk_files(root, (".parquet",))
  _check_nonempty(files, root, "*.parquet files")
  for rel in files:
    full = os.path.join(root, rel)
    try:
      pf = pq.ParquetFile(full)
    except (pa.ArrowException, OSError) as e:
      raise UserError(
        f"parquet file {full!r} is unreadable or truncated ({e}); fix: re-download or remove it"
      ) from None
    names = pf.schema_arrow.names
    if "text" not in names:
      raise UserError(
        f"parquet file {full!r} has no 'text' column (columns: {', '.join(names)}); "
        "fix: use FineWeb-Edu parquet files with a 'text' column"
      )
    text_type = pf.schema_arrow.field("text").type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)
            or pa.types.is_binary(text_type) or pa.types.is_large_binary(text_type)):
      raise UserError(
        f"parquet file {full!r} has a 'text' column of {text_type}, not strings; "
        "fix: use FineWeb-Edu parquet files whose 'text' column holds the documents"
      )
    cols = ["text", "id"] if "id" in names else ["text"]
    row = 0
    for g in range(pf.num_row_groups):
      try:
        table = pf.read_row_group(g, columns=cols)
      except (pa.ArrowException, OSError) as e:
        raise UserError(
          f"parquet file {full!r} row group {g} is unreadable or truncated ({e}); fix: re-download or remove it"
        ) from None
      texts = table.column("text").to_pylist()
      ids = table.column("id").to_pylist() if "id" in cols else [None] * len(texts)
      for text, doc_id in zip(texts, ids, strict=True):
        if text is None:
          data = b""
        else:
          data = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
        yield (str(doc_id) if doc_id is not None else f"{rel}:{row}"), data
        row += 1


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
  files = _walk_files(root, unreadable=unreadable)
  if not files and not unreadable:
    _check_nonempty(files, root, "files")
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
    record = src[i]
    if feature not in record:
      raise UserError(
        f"TFDS dataset {name!r} has no feature {feature!r} (features: {', '.join(sorted(record))}); "
        f"fix: write --source=tfds:{name}:FEATURE"
      )
    value = record[feature]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
      value = value.item()
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
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


def iter_documents(spec: SourceSpec | str, *, tfds_data_dir: str | None = None) -> Iterator[Document]:
  """The training-corpus documents of a source, lazily and in a fixed order."""
  if isinstance(spec, str):
    spec = parse_source(spec)
  if spec.kind == "fineweb_edu":
    return iter_fineweb_edu(spec.path)
  if spec.kind == "wikitext103":
    return iter_wikitext103(spec.path)
  if spec.kind == "textdir":
    return iter_textdir(spec.path)
  if spec.kind == "tfds":
    return iter_tfds(spec.path, spec.feature, tfds_data_dir)
  return iter_pystdlib()
