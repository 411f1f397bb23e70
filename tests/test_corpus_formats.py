"""Corpora as they come: JSON Lines (plain, gzip, zstd), parquet, save_to_disk folders, HTML
pages and WARC archives, each built here in its real on-disk format."""

import gzip
import io
import json
import os
import subprocess
import sys
import tracemalloc
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from soma_jax.data import documents, prepare, sources
from soma_jax.errors import UserError
from tests.conftest import DATA_DOMAINS, data_make_doc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"test_docs": 5, "ensemble_val_docs": 3, "min_df": 2, "svd_dims": 16, "val_fraction": 0.05}


def _docs(source, **kw):
  return list(sources.iter_documents(source, **kw))


# ---------------------------------------------------------------------------- JSON Lines

def _records(n):
  return [{"id": f"r{i}", "meta": {"body": f"nested body {i} é", "lang": "en"}, "text": f"top text {i}"} for i in range(n)]


def _jsonl(records_, blank_last=True):
  return ("\n".join(json.dumps(r, ensure_ascii=False) for r in records_) + ("\n\n" if blank_last else "\n")).encode()


def _write_jsonl_formats(folder, recs):
  """The same records as a.jsonl, b.jsonl.gz and c.jsonl.zst (two zstd frames)."""
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "a.jsonl").write_bytes(_jsonl(recs))
  (folder / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(recs)))
  half = len(recs) // 2
  zc = zstandard.ZstdCompressor()
  (folder / "c.jsonl.zst").write_bytes(zc.compress(_jsonl(recs[:half], False)) + zc.compress(_jsonl(recs[half:], False)))
  (folder / "notes.txt").write_text("not a jsonl file: skipped and counted")


def test_jsonl_plain_gz_zst_nested_fields_and_ids(tmp_path):
  recs = _records(7)
  _write_jsonl_formats(tmp_path, recs)
  *docs, passed = _docs(f"jsonl:{tmp_path}")
  assert [d for _, d in docs] == [r["text"].encode() for r in recs] * 3
  assert passed == ("notes.txt", documents.Skipped("not named *.jsonl, *.jsonl.gz or *.jsonl.zst"))  # counted
  assert [i for i, _ in docs[:2]] == ["a.jsonl:1", "a.jsonl:2"] and docs[7][0] == "b.jsonl.gz:1"
  assert docs[-1][0] == "c.jsonl.zst:7"  # line numbers run on across zstd frames
  nested = _docs(f"jsonl:{tmp_path / 'c.jsonl.zst'}:meta.body:id")
  assert nested == [(r["id"], r["meta"]["body"].encode()) for r in recs]


def test_jsonl_dotted_key_wins_and_null_is_empty(tmp_path):
  (tmp_path / "x.jsonl").write_text('{"a.b": "literal", "a": {"b": "nested"}}\n{"a.b": null}\n')
  assert [d for _, d in _docs(f"jsonl:{tmp_path}:a.b")] == [b"literal", b""]


@pytest.mark.parametrize(
  "lines,source_tail,match",
  [
    ('{"text": "ok"}\n{"text": "cut\n', "", r"x.jsonl' line 2 does not parse"),
    ('{"text": "ok"}\n{"body": "b"}\n', "", r"line 2 has no field 'text' \(fields there: 'body'\)"),
    ('{"meta": {"x": 1}}\n', ":meta.body", r"line 1 has no field 'body' in 'meta'"),
    ('{"text": 5}\n', "", r"line 1 has 'text' as a number, not a string"),
    ('{"text": ["a"]}\n', "", r"has 'text' as an array"),
    ('["text"]\n', "", r"line 1 is an array, not an object"),
    ('{"text": "t", "id": [1]}\n', ":text:id", r"has the id 'id' as an array"),
  ],
)
def test_jsonl_bad_records_are_one_line(tmp_path, lines, source_tail, match):
  (tmp_path / "x.jsonl").write_text(lines)
  with pytest.raises(UserError, match=match) as e:
    _docs(f"jsonl:{tmp_path}{source_tail}")
  assert "\n" not in str(e.value) and "fix:" in str(e.value) and "--on_bad_record=skip" in str(e.value)


def test_jsonl_skip_counts_bad_records(tmp_path):
  (tmp_path / "x.jsonl").write_text('{"text": "one"}\n{oops\n{"text": 3}\n{"other": 1}\n{"text": "two"}\n')
  docs = _docs(f"jsonl:{tmp_path}", on_bad_record="skip")
  assert docs == [("x.jsonl:1", b"one"), ("x.jsonl:2", sources.Skipped("bad record")),
                  ("x.jsonl:3", sources.Skipped("bad record")), ("x.jsonl:4", sources.Skipped("bad record")),
                  ("x.jsonl:5", b"two")]


def test_jsonl_line_over_the_cap_is_skipped_unread(tmp_path, monkeypatch):
  monkeypatch.setattr(documents, "MAX_DOCUMENT_BYTES", 100)
  (tmp_path / "x.jsonl").write_text(json.dumps({"text": "y" * 5000}) + "\n" + '{"text": "short"}\n')
  assert _docs(f"jsonl:{tmp_path}") == [("x.jsonl:1", sources.Skipped("over the size cap")), ("x.jsonl:2", b"short")]


@pytest.mark.parametrize("suffix,match", [(".jsonl.zst", "zstd file .* is truncated"), (".jsonl.gz", "gzip file .* is truncated")])
def test_jsonl_truncated_compression(tmp_path, suffix, match):
  raw = _jsonl(_records(3000))
  packed = zstandard.ZstdCompressor().compress(raw) if suffix.endswith("zst") else gzip.compress(raw)
  (tmp_path / f"x{suffix}").write_bytes(packed[: len(packed) // 2])
  with pytest.raises(UserError, match=match):
    _docs(f"jsonl:{tmp_path}")


def test_jsonl_corrupt_zstd_and_empty_folder(tmp_path):
  (tmp_path / "x.jsonl.zst").write_bytes(b"this is not zstd at all")
  with pytest.raises(UserError, match="zstd file .* is corrupt"):
    _docs(f"jsonl:{tmp_path}")
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match=r"no \*.jsonl"):
    _docs(f"jsonl:{tmp_path / 'empty'}")


def test_jsonl_zst_memory_is_bounded_by_the_stream(tmp_path):
  """24 MB of JSON lines, read while Python holds at most a few MiB (a line and the buffers)."""
  words = np.array("the of soil garden root leaf water light seed grow river stone cloud".split())
  rng = np.random.default_rng(0)
  zc = zstandard.ZstdCompressor(level=1).compressobj()
  with open(tmp_path / "big.jsonl.zst", "wb") as f:
    for _ in range(24):
      lines = [json.dumps({"text": " ".join(rng.choice(words, 170))}) for _ in range(1000)]
      f.write(zc.compress(("\n".join(lines) + "\n").encode()))
    f.write(zc.flush())
  tracemalloc.start()
  n, total = 0, 0
  for _, data in sources.iter_documents(f"jsonl:{tmp_path}"):
    n, total = n + 1, total + len(data)
  peak = tracemalloc.get_traced_memory()[1]
  tracemalloc.stop()
  assert n == 24_000 and total > 20e6
  assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while reading {total / 1e6:.0f} MB"


# ------------------------------------------------------------------------------ parquet

def _two_column_table(n):
  return pa.table({
    "title": [f"Title {i}" for i in range(n)],
    "body": [f"Body of row {i}" if i != 3 else None for i in range(n)],
    "doc_id": [f"d{i:03d}" for i in range(n)],
    "n": list(range(n)),
    "meta": [{"summary": f"summary {i}", "year": 2000 + i} for i in range(n)],
  })


def test_parquet_two_text_columns_row_groups_and_ids(tmp_path):
  pq.write_table(_two_column_table(10), tmp_path / "part-0.parquet", row_group_size=3)
  pq.write_table(_two_column_table(4), tmp_path / "part-1.parquet")
  assert pq.ParquetFile(tmp_path / "part-0.parquet").num_row_groups == 4
  bodies = _docs(f"parquet:{tmp_path}:body")
  assert len(bodies) == 14 and bodies[3] == ("part-0.parquet:3", b"") and bodies[9] == ("part-0.parquet:9", b"Body of row 9")
  assert bodies[10][0] == "part-1.parquet:0"
  titles = _docs(f"parquet:{tmp_path / 'part-0.parquet'}:title:doc_id")
  assert titles[:2] == [("d000", b"Title 0"), ("d001", b"Title 1")] and len(titles) == 10
  assert _docs(f"parquet:{tmp_path / 'part-1.parquet'}:meta.summary:meta.year")[1] == ("2001", b"summary 1")


@pytest.mark.parametrize(
  "tail,match",
  [("", r"has no 'text' column \(columns: title, body, doc_id, n, meta\)"),
   (":n", "column 'n' holds int64, not strings"),
   (":meta.nope", "has no 'meta.nope' column"),
   (":body:nope", "has no id column 'nope'")],
)
def test_parquet_column_errors(tmp_path, tail, match):
  pq.write_table(_two_column_table(3), tmp_path / "x.parquet")
  with pytest.raises(UserError, match=match):
    _docs(f"parquet:{tmp_path}{tail}")


def test_parquet_truncated(tmp_path):
  pq.write_table(_two_column_table(200), tmp_path / "x.parquet")
  data = (tmp_path / "x.parquet").read_bytes()
  (tmp_path / "x.parquet").write_bytes(data[: len(data) // 2])
  with pytest.raises(UserError, match="unreadable or truncated"):
    _docs(f"parquet:{tmp_path}:body")


# ---------------------------------------------------------------- save_to_disk folders

def save_to_disk(folder, table, shards=1, batch_rows=4):
  """What `datasets.Dataset.save_to_disk` (datasets 5.2) writes: data-0000k-of-0000n.arrow in
  Arrow's streaming format (record batches of `batch_rows`), dataset_info.json and state.json
  listing the data files."""
  folder.mkdir(parents=True)
  names = [f"data-{k:05d}-of-{shards:05d}.arrow" for k in range(shards)]
  per = -(-table.num_rows // shards)
  for k, name in enumerate(names):
    part = table.slice(k * per, per)
    with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
      for batch in part.to_batches(max_chunksize=batch_rows):
        writer.write_batch(batch)
  (folder / "dataset_info.json").write_text(json.dumps({"citation": "", "description": "", "features": {}}))
  state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "0123456789abcdef",
           "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None}
  (folder / "state.json").write_text(json.dumps(state, indent=2))


def test_hf_disk_dataset_and_dataset_dict(tmp_path):
  save_to_disk(tmp_path / "ds", _two_column_table(10), shards=2)
  docs = _docs(f"hf_disk:{tmp_path / 'ds'}:title")
  assert [d for _, d in docs] == [f"Title {i}".encode() for i in range(10)]
  assert docs[0][0] == "data-00000-of-00002.arrow:0" and docs[5][0] == "data-00001-of-00002.arrow:0"
  assert _docs(f"hf_disk:{tmp_path / 'ds'}:meta.summary:doc_id")[9] == ("d009", b"summary 9")
  (tmp_path / "dd").mkdir()
  (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
  save_to_disk(tmp_path / "dd" / "train", _two_column_table(3))
  save_to_disk(tmp_path / "dd" / "test", _two_column_table(1))
  assert len(_docs(f"hf_disk:{tmp_path / 'dd'}:body")) == 3  # a DatasetDict: its train split


def test_hf_disk_errors(tmp_path):
  save_to_disk(tmp_path / "ds", _two_column_table(3))
  with pytest.raises(UserError, match="has no 'text' column"):
    _docs(f"hf_disk:{tmp_path / 'ds'}")
  with pytest.raises(UserError, match="no state.json"):
    _docs(f"hf_disk:{tmp_path}")
  (tmp_path / "dd").mkdir()
  (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["validation"]}')
  with pytest.raises(UserError, match=r"without a train split \(splits: validation\)"):
    _docs(f"hf_disk:{tmp_path / 'dd'}")
  arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
  arrow.write_bytes(arrow.read_bytes()[:-100])
  with pytest.raises(UserError, match="unreadable or truncated"):
    _docs(f"hf_disk:{tmp_path / 'ds'}:body")


def test_hf_disk_memory_is_bounded_by_the_stream(tmp_path):
  texts = pa.array(["word " * 400] * 12_000)  # 24 MB of text in one record batch
  save_to_disk(tmp_path / "ds", pa.table({"text": texts}), batch_rows=12_000)
  tracemalloc.start()
  n = sum(1 for _ in sources.iter_documents(f"hf_disk:{tmp_path / 'ds'}"))
  peak = tracemalloc.get_traced_memory()[1]
  tracemalloc.stop()
  assert n == 12_000 and peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


# -------------------------------------------------------------------- HTML and WARC

def _page(i, words=60):
  body = " ".join(f"Paragraph {i} sentence {k} about soil, roots and garden water." for k in range(words // 8))
  return (f"<!DOCTYPE html><html><head><title>Page {i}</title><style>td {{color: red}}</style></head><body>"
          f"<nav><ul><li><a href='/'>Home</a></li><li>Index</li></ul></nav><main><h1>Heading {i}</h1>"
          f"<p>{body}</p><dl><dt>term</dt><dd>A definition of the term for page {i}.</dd></dl></main>"
          "<footer>Copyright</footer></body></html>").encode()


def test_extract_auto_html_in_textdir(tmp_path):
  (tmp_path / "a.html").write_bytes(_page(0))
  (tmp_path / "b.htm.gz").write_bytes(gzip.compress(_page(1)))
  fragment = b"<p>" + b"a text file keeps its bytes unless every document is HTML. " * 8 + b"</p>"
  (tmp_path / "c.txt").write_bytes(fragment)
  (tmp_path / "d.html").write_bytes(b"<html><head><title>no body</title></head><body></body></html>")
  counts = Counter()
  docs = dict(_docs(f"textdir:{tmp_path}", extract="auto", counts=counts))
  assert counts["html_extracted"] == 3
  assert docs["c.txt"] == fragment
  assert docs["d.html"] == sources.Skipped("empty after extraction")
  for name in ("a.html", "b.htm.gz"):
    text = docs[name].decode()
    assert "Heading" in text and "sentence 1 about soil" in text and "definition of the term" in text
    assert "<" not in text and "Home" not in text and "color" not in text, text
  assert dict(_docs(f"textdir:{tmp_path}"))["a.html"] == _page(0)  # --extract=none: bytes as they are
  assert dict(_docs(f"textdir:{tmp_path}", extract="html"))["c.txt"] == fragment[3:-5].strip()


def _warc(path, entries, gz=True):
  with open(path, "wb") as f:
    writer = WARCWriter(f, gzip=gz)
    for uri, kind, payload, status, ctype in entries:
      headers = StatusAndHeaders(status, [("Content-Type", ctype)], protocol="HTTP/1.1") if status else None
      writer.write_record(writer.create_warc_record(uri, kind, payload=io.BytesIO(payload), http_headers=headers,
                                                    warc_content_type=None if status else ctype))


CRAWL = [
  ("http://example.org/0", "response", _page(0), "200 OK", "text/html; charset=utf-8"),
  ("http://example.org/0", "request", b"GET /0 HTTP/1.1\r\nHost: example.org\r\n\r\n", None, None),
  ("http://example.org/logo.png", "response", b"\x89PNG\r\n\x1a\n", "200 OK", "image/png"),
  ("http://example.org/gone", "response", _page(9), "404 Not Found", "text/html"),
  ("dns:example.org", "response", b"20240101 example.org. 300 IN A 192.0.2.1", None, "text/dns"),
  ("http://example.org/blank", "response", b"<html><body></body></html>", "200 OK", "text/html"),
  ("https://example.org/1", "response", _page(1), "200 OK", "application/xhtml+xml"),
]


def test_warc_gz_html_responses_extracted(tmp_path):
  _warc(tmp_path / "crawl.warc.gz", CRAWL)
  counts = Counter()
  docs = _docs(f"warc:{tmp_path / 'crawl.warc.gz'}", counts=counts)
  assert [i for i, _ in docs] == ["http://example.org/0", "http://example.org/logo.png", "http://example.org/gone",
                                  "http://example.org/blank", "https://example.org/1"]
  assert [d for _, d in docs[1:4]] == [sources.Skipped("not HTML"), sources.Skipped("HTTP status not 2xx"),
                                      sources.Skipped("empty after extraction")]
  assert counts["html_extracted"] == 3
  for _, text in (docs[0], docs[4]):
    assert b"Heading" in text and b"garden water" in text and b"<" not in text


def _non_http_warc(path):
  body = b"a response record whose payload is no HTTP message"
  path.write_bytes(b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://example.org/x\r\n"
                   b"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000001>\r\n"
                   b"Content-Type: application/http; msgtype=response\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body + b"\r\n\r\n")


def test_warc_errors(tmp_path):
  _non_http_warc(tmp_path / "x.warc")
  with pytest.raises(UserError, match=r"record 1 \(http://example.org/x\) is a response that is not HTTP"):
    _docs(f"warc:{tmp_path / 'x.warc'}")
  assert _docs(f"warc:{tmp_path / 'x.warc'}", on_bad_record="skip") == [("http://example.org/x", sources.Skipped("bad record"))]
  (tmp_path / "y.warc").write_bytes(b"<html>a page, not an archive</html>")
  with pytest.raises(UserError, match="is not a WARC file"):
    _docs(f"warc:{tmp_path / 'y.warc'}")
  _warc(tmp_path / "z.warc.gz", CRAWL)
  data = (tmp_path / "z.warc.gz").read_bytes()
  (tmp_path / "z.warc.gz").write_bytes(data[: len(data) - 50])
  with pytest.raises(UserError, match="is truncated or corrupt"):
    _docs(f"warc:{tmp_path / 'z.warc.gz'}")


@pytest.mark.parametrize("cut", [0.3, 0.55, 0.8, 0.99])
def test_warc_uncompressed_cut_anywhere_is_an_error(tmp_path, cut):
  _warc(tmp_path / "c.warc", CRAWL, gz=False)
  data = (tmp_path / "c.warc").read_bytes()
  (tmp_path / "c.warc").write_bytes(data[: int(len(data) * cut)])
  with pytest.raises(UserError, match="truncated|cut off|cut-off"):
    _docs(f"warc:{tmp_path / 'c.warc'}")


def test_missing_web_extra_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "trafilatura", None)  # import trafilatura raises ImportError
  (tmp_path / "a.html").write_bytes(_page(0))
  with pytest.raises(UserError, match=r'HTML needs trafilatura, which is not installed; fix: pip install -e "\.\[web\]"'):
    _docs(f"textdir:{tmp_path}", extract="auto")
  monkeypatch.undo()
  monkeypatch.setitem(sys.modules, "warcio", None)
  with pytest.raises(UserError, match=r'reading WARC archives needs warcio.*pip install -e "\.\[web\]"'):
    _docs(f"warc:{tmp_path}")


# ------------------------------------------------------------------ parsing and prepare

def test_parse_record_sources(tmp_path):
  (tmp_path / "a:b").mkdir()  # a folder whose name holds a colon
  spec = sources.parse_source(f"jsonl:{tmp_path / 'a:b'}:meta.body:id")
  assert (spec.path, spec.feature, spec.id_field) == (str(tmp_path / "a:b"), "meta.body", "id")
  assert str(spec) == f"jsonl:{tmp_path / 'a:b'}:meta.body:id"
  assert str(sources.parse_source(f"parquet:{tmp_path}")) == f"parquet:{tmp_path}:text"
  with pytest.raises(UserError, match="at most a text field and an id field"):
    sources.parse_source(f"jsonl:{tmp_path}:a:b:c")
  with pytest.raises(UserError, match="does not exist"):
    sources.parse_source(f"jsonl:{tmp_path / 'nowhere.jsonl'}")
  with pytest.raises(UserError, match="--extract='xml' is not one of none, html, auto"):
    sources.check_options("xml", "fail")


def test_prepare_end_to_end_from_jsonl(tmp_path):
  rng = np.random.default_rng(0)
  lines = [json.dumps({"doc": {"body": data_make_doc(list(DATA_DOMAINS)[i % 3], rng, 400)}, "uid": f"u{i}"})
           for i in range(60)]
  lines.insert(10, "{not json")
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("\n".join(lines).encode()))
  source = f"jsonl:{tmp_path / 'src'}:doc.body:uid"
  with pytest.raises(UserError, match=r"c.jsonl.zst' line 11 does not parse"):
    prepare.prepare(source, 2, str(tmp_path / "out"), **SMALL)
  m = prepare.prepare(source, 2, str(tmp_path / "out"), on_bad_record="skip", **SMALL)
  assert m["documents"]["nonempty"] == 60 and m["documents"]["skipped"]["bad record"]["names"] == ["c.jsonl.zst:11"]
  assert m["settings"]["on_bad_record"] == "skip" and m["source"] == source
  held = json.loads((tmp_path / "out" / "heldout_docs.json").read_text())
  assert len(held["test"]) == 5 and all(h.startswith("u") for h in held["test"] + held["ensemble_val"])
  assert "skipped 1 bad record (c.jsonl.zst:11)" in prepare.summary(m, "OUT", 1.0)


def test_cli_extracts_html_and_says_so(tmp_path):
  src = tmp_path / "site"
  src.mkdir()
  rng = np.random.default_rng(1)
  for i in range(30):
    words = data_make_doc(list(DATA_DOMAINS)[i % 3], rng, 300)
    (src / f"p{i:02d}.html").write_text(f"<html><body><nav>Home Index</nav><article><p>{words}</p></article></body></html>")
  (src / "empty.html").write_text("<html><body></body></html>")
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"), f"--source=textdir:{src}", "--extract=auto",
     "--num_clusters=2", f"--out={tmp_path / 'out'}", "--test_docs=3", "--ensemble_val_docs=2", "--min_df=2", "--svd_dims=8"],
    capture_output=True, text=True, cwd=ROOT, timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert "30 documents read" in proc.stdout and "main text extracted from 31 HTML pages" in proc.stdout, proc.stdout
  assert "skipped 1 empty after extraction (empty.html)" in proc.stdout, proc.stdout
  assert "trafilatura" not in proc.stderr and "discarding" not in proc.stderr, proc.stderr  # counted, not logged
  train = np.load(tmp_path / "out" / "experts" / "0000" / "train.npy")
  assert b"<" not in train.tobytes() and b"Home Index" not in train.tobytes()


def test_cli_bad_json_line_is_one_line_exit_2(tmp_path):
  (tmp_path / "x.jsonl").write_text('{"text": "fine"}\n{"text": \n')
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"), f"--source=jsonl:{tmp_path}",
     "--num_clusters=2", f"--out={tmp_path / 'out'}"],
    capture_output=True, text=True, cwd=ROOT, timeout=120,
  )
  assert proc.returncode == 2, proc.stderr
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "x.jsonl' line 2 does not parse" in lines[0] and "--on_bad_record=skip" in lines[0], lines

