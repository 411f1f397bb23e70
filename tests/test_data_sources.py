"""Document readers for each SOURCE, in the real on-disk formats."""

import gzip
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from soma_jax.data import sources
from soma_jax.errors import UserError


def _fineweb_table(texts: list[str]) -> pa.Table:
  """A table with the published FineWeb-Edu schema."""
  n = len(texts)
  return pa.table(
    {
      "text": pa.array(texts, pa.string()),
      "id": pa.array([f"<urn:uuid:{i:08d}>" for i in range(n)], pa.string()),
      "dump": pa.array(["CC-MAIN-2024-10"] * n, pa.string()),
      "url": pa.array([f"https://example.org/{i}" for i in range(n)], pa.string()),
      "file_path": pa.array(["s3://x.warc.gz"] * n, pa.string()),
      "language": pa.array(["en"] * n, pa.string()),
      "language_score": pa.array([0.9] * n, pa.float64()),
      "token_count": pa.array([len(t) // 4 for t in texts], pa.int64()),
      "score": pa.array([3.1] * n, pa.float64()),
      "int_score": pa.array([3] * n, pa.int64()),
    }
  )


def test_fineweb_edu_row_groups(tmp_path):
  texts = [f"document {i} héllo " * (i + 1) for i in range(25)]
  pq.write_table(_fineweb_table(texts[:20]), tmp_path / "000_00000.parquet", row_group_size=7)
  pq.write_table(_fineweb_table(texts[20:]), tmp_path / "000_00001.parquet", row_group_size=7)
  assert pq.ParquetFile(tmp_path / "000_00000.parquet").num_row_groups == 3
  docs = list(sources.iter_documents(f"fineweb_edu:{tmp_path}"))
  assert [d for _, d in docs] == [t.encode() for t in texts]
  assert docs[0][0] == "<urn:uuid:00000000>"


def test_fineweb_edu_without_text_column(tmp_path):
  pq.write_table(pa.table({"content": ["a", "b"]}), tmp_path / "x.parquet")
  with pytest.raises(UserError, match="no 'text' column"):
    list(sources.iter_documents(f"fineweb_edu:{tmp_path}"))


def test_fineweb_edu_truncated(tmp_path):
  pq.write_table(_fineweb_table(["some text"] * 50), tmp_path / "x.parquet")
  data = (tmp_path / "x.parquet").read_bytes()
  (tmp_path / "x.parquet").write_bytes(data[: len(data) // 2])
  with pytest.raises(UserError, match="truncated"):
    list(sources.iter_documents(f"fineweb_edu:{tmp_path}"))


def test_fineweb_edu_no_files(tmp_path):
  with pytest.raises(UserError, match="parquet"):
    list(sources.iter_documents(f"fineweb_edu:{tmp_path}"))


def test_wikitext103_documents(tmp_path):
  raw = b" \n = First = \n \n Body one . \n = = Sub = = \n More . \n = Second = \n Body two . \n"
  (tmp_path / "wiki.train.raw").write_bytes(raw)
  docs = list(sources.iter_documents(f"wikitext103:{tmp_path}"))
  assert [d for _, d in docs] == [
    b" = First = \n \n Body one . \n = = Sub = = \n More . \n",
    b" = Second = \n Body two . \n",
  ]
  assert docs[0][0].endswith("First")


def test_wikitext103_missing_file(tmp_path):
  with pytest.raises(UserError, match="wiki.train.raw"):
    list(sources.iter_documents(f"wikitext103:{tmp_path}"))


def test_textdir_with_gzip_and_sorted_order(tmp_path):
  os.makedirs(tmp_path / "b")
  (tmp_path / "b" / "z.txt").write_bytes(b"zzz \xff raw")
  (tmp_path / "a.txt").write_bytes(b"aaa")
  with gzip.open(tmp_path / "b" / "c.txt.gz", "wb") as f:
    f.write(b"compressed text")
  (tmp_path / "empty.txt").write_bytes(b"")
  docs = list(sources.iter_documents(f"textdir:{tmp_path}"))
  assert docs == [("a.txt", b"aaa"), ("b/c.txt.gz", b"compressed text"), ("b/z.txt", b"zzz \xff raw"), ("empty.txt", b"")]


def test_textdir_truncated_gzip(tmp_path):
  data = gzip.compress(b"hello world " * 1000)
  (tmp_path / "x.gz").write_bytes(data[: len(data) // 2])
  with pytest.raises(UserError, match="truncated"):
    list(sources.iter_documents(f"textdir:{tmp_path}"))


def test_tfds_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  texts = [f"mock document {i}".encode() for i in range(5)]

  def as_data_source(*args, **kwargs):
    del args, kwargs
    return [{"text": np.array(t, dtype=object)} for t in texts]

  with tfds.testing.mock_data(num_examples=5, as_data_source_fn=as_data_source):
    docs = list(sources.iter_documents("tfds:lm1b", tfds_data_dir=str(tmp_path)))
  assert [d for _, d in docs] == texts
  assert docs[0][0] == "lm1b/train/0"


def test_pystdlib_files():
  files = sources.pystdlib_files()
  assert files == sorted(files) and len(files) > 100
  assert all(f.endswith(".py") for f in files)
  parts = {p for f in files for p in f.split(os.sep)[:-1]}
  assert not parts & {"test", "tests", "site-packages"}
  assert "os.py" in files


@pytest.mark.parametrize(
  "source,match",
  [("bogus:x", "unknown --source"), ("textdir:", "has no path"), ("textdir:/no/such/dir", "does not exist"), ("", "unknown")],
)
def test_parse_source_errors(source, match):
  with pytest.raises(UserError, match=match):
    sources.parse_source(source)


def test_parse_source_tfds_feature():
  spec = sources.parse_source("tfds:wiki40b:content")
  assert (spec.kind, spec.path, spec.feature) == ("tfds", "wiki40b", "content")
  assert str(sources.parse_source("pystdlib")) == "pystdlib"
