"""Record sources: one record of a JSON Lines file, a parquet table or a saved Hugging Face
dataset is one document, read as a stream (a line, or 1,024 rows, at a time).

  jsonl:PATH[:FIELD[:ID]]     *.jsonl, *.jsonl.gz, *.jsonl.zst files (a file or a folder of them)
  parquet:PATH[:COLUMN[:ID]]  *.parquet files, one row group at a time
  hf_disk:FOLDER[:COLUMN[:ID]] a folder written by `datasets.save_to_disk` (its data-*.arrow
                              files, Arrow streaming format, memory-mapped; no network)

FIELD / COLUMN defaults to `text`; a dotted name (`meta.body`) reaches into nested objects or
struct columns. ID, when named, gives each document its id for the held-out overlap screen
(`doc_id`: a string or an integer, in every record source); otherwise the id is FILE:LINE
(jsonl) or FILE:ROW. A null text is a zero-length document (skipped and counted); a record
with no such field, a text that is not a string or an id that is neither a string nor an
integer, is an error, or with `on_bad_record="skip"` a Skipped("bad record"), like a JSON line
that does not parse. A dictionary-encoded column (a pandas categorical) is read as its values.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

from soma_jax.data import documents
from soma_jax.data.documents import Entry, Skipped, files_at
from soma_jax.errors import UserError

ROWS_PER_SLICE = 1024  # rows turned into Python objects at a time (parquet, hf_disk)
_BAD = Skipped("bad record")
_ZST_CHUNK = 1 << 16  # compressed bytes fed at a time: what is held decompressed is this times the ratio
_LINE_CHUNK = 1 << 20


def _skip_hint(on_bad_record: str) -> str:
  return "" if on_bad_record == "skip" else ", or pass --on_bad_record=skip to count and skip such records"


def _keys(d: dict) -> str:
  keys = list(d)
  return ", ".join(repr(k) for k in keys[:10]) + (", ..." if len(keys) > 10 else "") or "none"


def json_type(value: Any) -> str:
  """A JSON value's kind in JSON's words: object, array, string, number, boolean, null."""
  kinds = ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"), (int | float, "a number"))
  return next((name for t, name in kinds if isinstance(value, t)), "null" if value is None else type(value).__name__)


def get_field(record: Any, field: str) -> tuple[bool, Any, str]:
  """(found, value, why not) of a dotted field in nested dicts; an exact key wins over a dotted
  path. `why` reads after "line N": "has no field 'x' (fields there: ...)"."""
  if isinstance(record, dict) and field in record:
    return True, record[field], ""
  node, parts = record, field.split(".")
  for i, part in enumerate(parts):
    where = ".".join(parts[:i])
    if not isinstance(node, dict):
      return False, None, f"has {where!r} as {json_type(node)}, not an object with {part!r}"
    if part not in node:
      return False, None, f"has no field {part!r}{f' in {where!r}' if where else ''} (fields there: {_keys(node)})"
    node = node[part]
  return True, node, ""


def _text_bytes(value: Any) -> bytes | None:
  """The document bytes of a field's value; None if it is not a string (null is empty)."""
  if value is None:
    return b""
  if isinstance(value, str):
    return value.encode("utf-8", errors="surrogatepass")
  if isinstance(value, bytes):
    return value
  return None


def doc_id(value: Any) -> str | None:
  """A record's id as text, the one rule of every record source: a string, or an integer (not a
  boolean); None for anything else (a float, a boolean, null, an array, an object)."""
  if isinstance(value, bool) or not isinstance(value, str | int):
    return None
  return str(value)


def bad_id(where: str, id_field: str, value: Any) -> str:
  """The error of an id that `doc_id` refuses, naming the field."""
  kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"))
  kind = next((name for t, name in kinds if isinstance(value, t)), None) or json_type(value)
  return (f"{where} has the id {id_field!r} as {kind}, not a string or integer; "
          "fix: name an id field every record has, or leave the id out")


# ---------------------------------------------------------------------------- JSON Lines

class _ZstdStream(io.RawIOBase):
  """A zstd file decompressed as a stream (frames one after another); ends with a UserError,
  not silently, when the file stops inside a frame (`zstandard`'s own readers do not tell)."""

  def __init__(self, f, full: str):
    import zstandard

    self._f, self._full, self._zstd = f, full, zstandard
    self._d = zstandard.ZstdDecompressor().decompressobj()
    self._pending, self._pos, self._in_frame = b"", 0, False

  def readable(self) -> bool:
    return True

  def close(self) -> None:
    self._f.close()
    super().close()

  def readinto(self, b) -> int:
    while self._pos == len(self._pending):
      chunk = self._f.read(_ZST_CHUNK)
      if not chunk:
        if self._in_frame:
          raise UserError(f"zstd file {self._full!r} is truncated (it ends inside a frame); fix: re-create or remove it")
        return 0
      self._feed(chunk)
    n = min(len(b), len(self._pending) - self._pos)
    b[:n] = self._pending[self._pos : self._pos + n]
    self._pos += n
    return n

  def _feed(self, chunk: bytes) -> None:
    out = []
    while chunk:
      try:
        out.append(self._d.decompress(chunk))
      except self._zstd.ZstdError as e:
        raise UserError(f"zstd file {self._full!r} is corrupt ({e}); fix: re-create or remove it") from None
      self._in_frame = not self._d.eof
      chunk = self._d.unused_data if self._d.eof else b""
      if self._d.eof:
        self._d = self._zstd.ZstdDecompressor().decompressobj()
    self._pending, self._pos = b"".join(out), 0


def _open_jsonl(full: str):
  """A binary line-readable stream of the file, decompressed by its suffix."""
  if full.endswith(".gz"):
    return gzip.open(full, "rb")
  if full.endswith(".zst"):
    try:
      import zstandard  # noqa: F401
    except ImportError:
      raise UserError(f"{full!r} is zstd-compressed and zstandard is not installed; fix: pip install -e .") from None
    return io.BufferedReader(_ZstdStream(open(full, "rb"), full), _LINE_CHUNK)
  return open(full, "rb")


def _lines(f, cap: int) -> Iterator[tuple[int, bytes | None]]:
  """(line number, line) of a stream; a line over `cap` bytes is None, never held whole."""
  n = 0
  while True:
    line = f.readline(cap + 1)
    if not line:
      return
    n += 1
    if len(line) > cap and not line.endswith(b"\n"):
      while (rest := f.readline(_LINE_CHUNK)) and not rest.endswith(b"\n"):
        pass
      yield n, None
    else:
      yield n, line


def _jsonl_record(full: str, n: int, line: bytes, field: str, id_field: str | None) -> tuple[str | None, bytes]:
  """(id or None, document bytes) of one line; raises _Bad naming what is wrong."""
  try:
    record = json.loads(line)
  except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
    why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
    raise _Bad(f"JSON Lines file {full!r} line {n} does not parse ({why}); fix: repair or remove the line") from None
  where = f"JSON Lines file {full!r} line {n}"
  if not isinstance(record, dict):
    raise _Bad(f"{where} is {json_type(record)}, not an object; fix: write one JSON object a line")
  found, value, why = get_field(record, field)
  if not found:
    raise _Bad(f"{where} {why}; fix: name the text field, --source=jsonl:PATH:FIELD (dotted for nested)")
  data = _text_bytes(value)
  if data is None:
    raise _Bad(f"{where} has {field!r} as {json_type(value)}, not a string; fix: name the field that holds the text")
  the_id = None
  if id_field:
    found, value, why = get_field(record, id_field)
    if not found:
      raise _Bad(f"{where} {why}; fix: name an id field every record has, or leave the id out")
    the_id = doc_id(value)
    if the_id is None:
      raise _Bad(bad_id(where, id_field, value))
  return the_id, data


class _Bad(Exception):
  """A record that cannot be used: a UserError, or counted and skipped."""


def iter_jsonl(path: str, field: str = "text", id_field: str | None = None,
               on_bad_record: str = "fail") -> Iterator[Entry]:
  """Every JSON line of the *.jsonl[.gz|.zst] files at `path`, one document each; then a
  Skipped entry for each file of another name, and each folder that could not be listed."""
  files, passed = files_at(path, (".jsonl", ".jsonl.gz", ".jsonl.zst"))
  for rel, full in files:
    try:
      with _open_jsonl(full) as f:
        for n, line in _lines(f, documents.MAX_DOCUMENT_BYTES):
          if line is None:
            yield f"{rel}:{n}", Skipped("over the size cap")
            continue
          if not line.strip():
            continue
          try:
            the_id, data = _jsonl_record(full, n, line, field, id_field)
          except _Bad as e:
            if on_bad_record != "skip":
              raise UserError(f"{e}{_skip_hint(on_bad_record)}") from None
            yield f"{rel}:{n}", _BAD
            continue
          yield the_id or f"{rel}:{n}", data
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
      raise UserError(f"gzip file {full!r} is truncated or corrupt ({e}); fix: re-create or remove it") from None
    except OSError as e:
      raise UserError(f"cannot read {full!r} ({e}); fix: check the file's permissions") from None
  yield from passed


# ------------------------------------------------------------------- parquet and Arrow

def _column_type(schema, field: str):
  """The Arrow type of a dotted column (struct fields), or None if the schema lacks it."""
  import pyarrow as pa

  if field in schema.names:
    return schema.field(field).type
  top, *rest = field.split(".")
  if top not in schema.names:
    return None
  typ = schema.field(top).type
  for part in rest:
    if not pa.types.is_struct(typ) or typ.get_field_index(part) < 0:
      return None
    typ = typ.field(part).type
  return typ


def _top(schema, field: str) -> str:
  return field if field in schema.names else field.split(".")[0]


def check_columns(schema, what: str, full: str, field: str, id_field: str | None, fix: str) -> list[str]:
  """The top-level columns to read for `field` (and `id_field`); a UserError if one is missing
  or the text is not a string column."""
  import pyarrow as pa

  typ = _column_type(schema, field)
  if typ is None:
    raise UserError(f"{what} {full!r} has no {field!r} column (columns: {', '.join(schema.names)}); fix: {fix}")
  values = typ.value_type if pa.types.is_dictionary(typ) else typ  # a pandas categorical: its values
  if not (pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values)
          or pa.types.is_binary(values) or pa.types.is_large_binary(values)):
    raise UserError(f"{what} {full!r}: column {field!r} holds {typ}, not strings; fix: {fix}")
  cols = [_top(schema, field)]
  if id_field:
    if _column_type(schema, id_field) is None:
      raise UserError(f"{what} {full!r} has no id column {id_field!r} (columns: {', '.join(schema.names)}); "
                      "fix: name an id column it has, or leave the id out")
    cols.append(_top(schema, id_field))
  return list(dict.fromkeys(cols))


def _column_values(table, field: str) -> list:
  """A dotted column of a table or record batch as a Python list."""
  names = table.schema.names
  if field in names:
    return table.column(field).to_pylist()
  top, *rest = field.split(".")
  values = table.column(top).to_pylist()
  for part in rest:
    values = [v.get(part) if isinstance(v, dict) else None for v in values]
  return values


def iter_rows(table, where: str, rel: str, first_row: int, field: str, id_field: str | None,
              on_bad_record: str = "fail") -> Iterator[Entry]:
  """The documents of a table's rows, ROWS_PER_SLICE rows at a time; ids FILE:ROW unless named
  (`doc_id`'s rule: a row whose id breaks it is an error, or Skipped with on_bad_record="skip")."""
  for start in range(0, table.num_rows, ROWS_PER_SLICE):
    part = table.slice(start, ROWS_PER_SLICE)
    texts = _column_values(part, field)
    ids = _column_values(part, id_field) if id_field else [None] * len(texts)
    for j, (text, value) in enumerate(zip(texts, ids, strict=True)):
      row = first_row + start + j
      the_id = doc_id(value) if id_field else f"{rel}:{row}"
      if the_id is None:
        if on_bad_record != "skip":
          raise UserError(bad_id(f"{where} row {row}", id_field, value) + _skip_hint(on_bad_record))
        yield f"{rel}:{row}", _BAD
        continue
      yield the_id, _text_bytes(text)


def iter_parquet(path: str, field: str = "text", id_field: str | None = None, on_bad_record: str = "fail", *,
                 id_if_present: bool = False, fix: str | None = None) -> Iterator[Entry]:
  """Rows of the *.parquet file(s) at `path`, one row group at a time; then a Skipped entry for
  each file of another name. With `id_if_present`, `id_field` is used only where the file has
  it (FineWeb-Edu's optional `id`)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  fix = fix or "name the text column: --source=parquet:PATH:COLUMN"
  files, passed = files_at(path, (".parquet",))
  for rel, full in files:
    try:
      pf = pq.ParquetFile(full)
    except (pa.ArrowException, OSError) as e:
      raise UserError(f"parquet file {full!r} is unreadable or truncated ({e}); fix: re-download or remove it") from None
    ids = id_field
    if id_if_present and id_field and _column_type(pf.schema_arrow, id_field) is None:
      ids = None
    cols = check_columns(pf.schema_arrow, "parquet file", full, field, ids, fix)
    row = 0
    for g in range(pf.num_row_groups):
      try:
        table = pf.read_row_group(g, columns=cols)
      except (pa.ArrowException, OSError) as e:
        raise UserError(
          f"parquet file {full!r} row group {g} is unreadable or truncated ({e}); fix: re-download or remove it"
        ) from None
      yield from iter_rows(table, f"parquet file {full!r}", rel, row, field, ids, on_bad_record)
      row += table.num_rows
  yield from passed


def hf_disk_files(folder: str) -> list[str]:
  """The data files of a `save_to_disk` folder, in order (a DatasetDict: its train split)."""
  state = os.path.join(folder, "state.json")
  if not os.path.isfile(state):
    splits_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(splits_file):
      splits = _read_json(splits_file).get("splits", [])
      if "train" in splits:
        return hf_disk_files(os.path.join(folder, "train"))
      raise UserError(f"{folder!r} is a saved DatasetDict without a train split (splits: {', '.join(map(str, splits))}); "
                      "fix: point --source=hf_disk: at one split's folder, FOLDER/SPLIT")
    raise UserError(f"{folder!r} has no state.json, so it is not a folder written by datasets' save_to_disk; "
                    "fix: point --source=hf_disk: at the folder save_to_disk wrote")
  entries = _read_json(state).get("_data_files")
  if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries):
    raise UserError(f"{state!r} lists no _data_files; fix: save the dataset again with save_to_disk")
  return [os.path.join(folder, e["filename"]) for e in entries]


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {path!r} ({e}); fix: save the dataset again with save_to_disk") from None
  if not isinstance(value, dict):
    raise UserError(f"{path!r} is not a JSON object; fix: save the dataset again with save_to_disk")
  return value


def iter_hf_disk(folder: str, field: str = "text", id_field: str | None = None,
                 on_bad_record: str = "fail") -> Iterator[Entry]:
  """Rows of a saved Hugging Face dataset, one Arrow record batch at a time (memory-mapped)."""
  import pyarrow as pa

  fix = "name the text column: --source=hf_disk:FOLDER:COLUMN"
  for full in hf_disk_files(folder):
    rel, row = os.path.relpath(full, folder), 0
    try:
      with pa.memory_map(full) as source:
        reader = pa.ipc.open_stream(source)
        check_columns(reader.schema, "Arrow file", full, field, id_field, fix)
        for batch in reader:
          yield from iter_rows(batch, f"Arrow file {full!r}", rel, row, field, id_field, on_bad_record)
          row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
      raise UserError(f"Arrow file {full!r} is unreadable or truncated ({e}); fix: save the dataset again") from None
