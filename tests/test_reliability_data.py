"""Issue 43's data items: folders read once, declared charsets, dictionary columns, one id rule,
one registry of source formats, and the summary's counts of what a source passed over."""

import functools
import gzip
import io
import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from soma_jax.data import formats, prepare, sources, web
from soma_jax.errors import UserError
from tests.conftest import data_make_doc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"test_docs": 4, "ensemble_val_docs": 2, "min_df": 2, "svd_dims": 8, "val_fraction": 0.05}


def _docs(source, **kw):
  return list(sources.iter_documents(source, **kw))


def _read(source, **kw):
  """The documents of a source, without the Skipped entries."""
  return [(i, d) for i, d in _docs(source, **kw) if not isinstance(d, sources.Skipped)]


def _texts(folder, n, seed=0):
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  for i in range(n):
    (folder / f"doc{i:02d}.txt").write_text(data_make_doc(["cooking", "astronomy"][i % 2], rng, 300))


# ------------------------------------------------------------------ item 2: folders read once

def test_textdir_folder_and_two_symlinks_to_it_is_read_once(tmp_path):
  _texts(tmp_path / "real", 16)
  os.symlink(tmp_path / "real", tmp_path / "link1")
  os.symlink(tmp_path / "real", tmp_path / "link2")
  docs = _read(f"textdir:{tmp_path}")
  assert len(docs) == 16, [i for i, _ in docs]  # was 48: each file once per path to it


def test_symlinked_folder_sorting_before_its_target_is_read_once(tmp_path):
  _texts(tmp_path / "z_real", 6)
  os.symlink(tmp_path / "z_real", tmp_path / "a_link")
  os.symlink(tmp_path / "z_real" / "doc00.txt", tmp_path / "z_real" / "again.txt")  # a file linked twice
  os.link(tmp_path / "z_real" / "doc01.txt", tmp_path / "z_real" / "hard.txt")  # and hard-linked
  docs = _read(f"textdir:{tmp_path}")
  assert len(docs) == 6 and len({d for _, d in docs}) == 6  # was 16


def _one_file(kind, folder):
  folder.mkdir(parents=True)
  if kind == "jsonl":
    (folder / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
  elif kind == "parquet":
    pq.write_table(pa.table({"text": ["one", "two"]}), folder / "a.parquet")
  else:
    _warc(folder / "a.warc.gz", [("http://e.org/1", "response", _page("one"), "200 OK", "text/html")])


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "warc"])
def test_every_folder_source_reads_a_linked_folder_once(tmp_path, kind):
  _one_file(kind, tmp_path / "z")
  os.symlink(tmp_path / "z", tmp_path / "a")
  os.symlink(tmp_path / "z", tmp_path / "z" / "loop")
  once = _read(f"{kind}:{tmp_path / 'z'}")
  assert len(_read(f"{kind}:{tmp_path}")) == len(once) > 0


def test_prepare_of_linked_copies_keeps_a_test_set(tmp_path):
  _texts(tmp_path / "src" / "real", 40)
  os.symlink(tmp_path / "src" / "real", tmp_path / "src" / "a_link")
  m = prepare.prepare(f"textdir:{tmp_path / 'src'}", 2, str(tmp_path / "d"), **SMALL)
  assert m["documents"]["nonempty"] == 40 and m["test_windows"] > 0  # was 80 documents, 0 test windows


# ------------------------------------------------------- item 15: a corpus of copies, said so

def test_empty_test_set_of_duplicates_says_they_are_copies(tmp_path):
  _texts(tmp_path / "a", 30)
  _texts(tmp_path / "b", 30)  # the same texts again, under other names
  m = prepare.prepare(f"textdir:{tmp_path}", 2, str(tmp_path / "d"), **SMALL)
  assert m["test_windows"] == 0
  note = next(n for n in m["notes"] if n.startswith("the test set is empty"))
  assert "copies of" in note and "fix: remove the duplicate files" in note and "more --test_docs" not in note, note


# --------------------------------------------------------------- item 8: declared charsets

def _page(body: str) -> bytes:
  para = f"{body}. " + "A sentence of ordinary prose about a garden and its water. " * 6
  return f"<html><head><title>t</title></head><body><main><h1>Heading</h1><p>{para}</p></main></body></html>".encode()


def _warc(path, entries):
  with open(path, "wb") as f:
    writer = WARCWriter(f, gzip=str(path).endswith(".gz"))
    for uri, kind, payload, status, ctype in entries:
      headers = StatusAndHeaders(status, [("Content-Type", ctype)], protocol="HTTP/1.1") if status else None
      writer.write_record(writer.create_warc_record(uri, kind, payload=io.BytesIO(payload), http_headers=headers,
                                                    warc_content_type=None if status else ctype))


def _latin1_page(words: str) -> bytes:
  return _page(words).decode().encode("iso-8859-1")


@pytest.mark.parametrize("ctype", ["text/html; charset=iso-8859-1", 'text/html; Charset="ISO-8859-1"',
                                   "text/html;charset=windows-1252"])
def test_warc_page_is_decoded_by_its_http_charset(tmp_path, ctype):
  words = "naïve, déjà vu, façade, señor"
  _warc(tmp_path / "c.warc", [("http://e.org/1", "response", _latin1_page(words), "200 OK", ctype)])
  [(_, text)] = _docs(f"warc:{tmp_path / 'c.warc'}")
  assert words.encode() in text, text


def test_warc_charset_absent_or_unknown_falls_back_to_utf8(tmp_path):
  words = "naïve, déjà vu, façade, señor"
  _warc(tmp_path / "c.warc", [("http://e.org/1", "response", _page(words), "200 OK", "text/html"),
                              ("http://e.org/2", "response", _page(words), "200 OK", "text/html; charset=no-such")])
  assert [words.encode() in text for _, text in _docs(f"warc:{tmp_path / 'c.warc'}")] == [True, True]


def test_html_file_is_decoded_by_its_meta_charset(tmp_path):
  words = "naïve, déjà vu, façade, señor"
  page = _latin1_page(words).replace(b"<head>", b'<head><meta charset="iso-8859-1">')
  (tmp_path / "a.html").write_bytes(page)
  [(_, text)] = _docs(f"textdir:{tmp_path}", extract="auto")
  assert words.encode() in text, text


# ----------------------------------------------------- item 14: dictionary-encoded columns

def test_parquet_dictionary_text_and_id_columns_are_read(tmp_path):
  texts = ["first row", "second row", "first row"]
  table = pa.table({"text": pa.array(texts).dictionary_encode(), "id": pa.array(["a", "b", "c"]).dictionary_encode()})
  pq.write_table(table, tmp_path / "cat.parquet")
  assert pa.types.is_dictionary(pq.ParquetFile(tmp_path / "cat.parquet").schema_arrow.field("text").type)
  assert _docs(f"parquet:{tmp_path}:text:id") == [("a", b"first row"), ("b", b"second row"), ("c", b"first row")]


def test_arrow_dictionary_column_is_read(tmp_path):
  table = pa.table({"text": pa.array(["x one", "y two"]).dictionary_encode()})
  with pa.OSFile(str(tmp_path / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
    w.write_table(table)
  (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
  assert [d for _, d in _docs(f"hf_disk:{tmp_path}")] == [b"x one", b"y two"]


def test_dictionary_of_integers_is_still_refused(tmp_path):
  pq.write_table(pa.table({"text": pa.array([1, 2, 1]).dictionary_encode()}), tmp_path / "n.parquet")
  with pytest.raises(UserError, match="column 'text' holds .*int64.*, not strings"):
    _docs(f"parquet:{tmp_path}")


# ------------------------------------------------------------------- one rule for ids

@pytest.mark.parametrize("value,ok", [("u1", True), (7, True), (1.5, False), (True, False), (None, False),
                                      ([1], False), ({"a": 1}, False)])
def test_ids_follow_one_rule_in_jsonl_and_parquet(tmp_path, value, ok):
  (tmp_path / "j").mkdir()
  (tmp_path / "j" / "a.jsonl").write_text(json.dumps({"text": "t", "k": value}) + "\n")
  (tmp_path / "p").mkdir()
  pq.write_table(pa.table({"text": ["t"], "k": [value]}), tmp_path / "p" / "a.parquet")
  for kind in ("jsonl", "parquet"):
    source = f"{kind}:{tmp_path / kind[0]}:text:k"
    if ok:
      assert _docs(source) == [(str(value), b"t")], kind
    else:
      with pytest.raises(UserError, match=r"has the id 'k' as .*, not a string or integer; fix: name an id"):
        _docs(source)
      assert _docs(source, on_bad_record="skip") == [(mock_id(kind), sources.Skipped("bad record"))]


def mock_id(kind):
  return "a.jsonl:1" if kind == "jsonl" else "a.parquet:0"


def test_id_rule_is_one_function():
  assert formats.doc_id(3) == "3" and formats.doc_id("x") == "x"
  assert formats.doc_id(2.0) is formats.doc_id(False) is formats.doc_id(None) is None


# --------------------------------------------- what a folder source passed over, counted

def test_folder_sources_count_files_of_other_extensions(tmp_path):
  (tmp_path / "j").mkdir()
  for name in ("a.jsonl", "b.ndjson", "c.JSONL", "d.json"):
    (tmp_path / "j" / name).write_text('{"text": "t"}\n')
  (tmp_path / "j" / ".hidden.ndjson").write_text("hidden files are not counted")
  docs = _docs(f"jsonl:{tmp_path / 'j'}")
  skipped = [(i, d.reason) for i, d in docs if isinstance(d, sources.Skipped)]
  assert [i for i, _ in skipped] == ["b.ndjson", "c.JSONL", "d.json"]
  assert all(r.startswith("not named *.jsonl") for _, r in skipped), skipped
  (tmp_path / "p").mkdir()
  pq.write_table(pa.table({"text": ["t"]}), tmp_path / "p" / "a.PARQUET")
  pq.write_table(pa.table({"text": ["t"]}), tmp_path / "p" / "b.parquet")
  assert [i for i, d in _docs(f"parquet:{tmp_path / 'p'}") if isinstance(d, sources.Skipped)] == ["a.PARQUET"]


def test_warc_revisit_and_resource_records_are_counted(tmp_path):
  _warc(tmp_path / "c.warc.gz", [
    ("http://e.org/1", "response", _page("a page"), "200 OK", "text/html"),
    ("http://e.org/1", "revisit", b"", None, "application/http; msgtype=response"),
    ("http://e.org/f.html", "resource", _page("a file"), None, "text/html"),
    ("http://e.org/1", "request", b"GET / HTTP/1.1\r\n\r\n", None, "application/http; msgtype=request"),
  ])
  docs = _docs(f"warc:{tmp_path}")
  assert [(i, d) for i, d in docs if isinstance(d, sources.Skipped)] == [
    ("http://e.org/1", sources.Skipped("WARC revisit record")),
    ("http://e.org/f.html", sources.Skipped("WARC resource record"))]


def test_summary_names_the_files_skipped_by_extension(tmp_path):
  rng = np.random.default_rng(0)
  lines = [json.dumps({"text": data_make_doc(["cooking", "finance"][i % 2], rng, 300)}) for i in range(40)]
  (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
  (tmp_path / "b.ndjson").write_text("\n".join(lines) + "\n")
  m = prepare.prepare(f"jsonl:{tmp_path}", 2, str(tmp_path / "d"), **SMALL)
  assert "skipped 1 not named *.jsonl, *.jsonl.gz or *.jsonl.zst (b.ndjson)" in prepare.summary(m, "d", 1.0)


def test_extract_auto_takes_every_html_suffix_and_the_data_page_says_which(tmp_path):
  names = [f"p{i}{suffix}" for i, suffix in enumerate(web.HTML_SUFFIXES)]
  for name in names:
    data = _page(f"page {name}")
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
  (tmp_path / "UPPER.HTML").write_bytes(_page("upper"))
  docs = dict(_docs(f"textdir:{tmp_path}", extract="auto"))
  assert all(not d.startswith(b"<") and b"Heading" in d for d in docs.values()), docs
  readme = open(os.path.join(ROOT, "docs", "data.md")).read()
  bullet = readme.split("**HTML becomes text.**", 1)[1].split("\n- ", 1)[0]
  assert all(f"`*{s}`" in bullet for s in web.HTML_SUFFIXES), bullet
  assert all(s in _prepare_help() for s in web.HTML_SUFFIXES)


# ------------------------------------------------------------- one registry of formats

def test_one_registry_lists_the_source_formats_everywhere():
  usages = [f.usage for f in sources.FORMATS.values()]
  assert [u.split(":")[0] for u in usages] == list(sources.FORMATS) and len(usages) == 9
  with pytest.raises(UserError) as e:
    sources.parse_source("bogus:x")
  assert all(u in str(e.value) for u in usages)
  assert all(u in _prepare_help() for u in usages)
  readme = open(os.path.join(ROOT, "docs", "data.md")).read()
  table = [u for u in re.findall(r"^\| `([^`]+)` \|", readme, re.M) if u.split(":")[0] in sources.FORMATS]
  assert sorted(table) == sorted(usages), table


def test_every_registered_format_reads_through_the_registry(tmp_path):
  (tmp_path / "x.jsonl").write_text('{"text": "t"}\n')
  spec = sources.parse_source(f"jsonl:{tmp_path}")
  assert list(sources.FORMATS["jsonl"].read(spec, sources.ReadOptions())) == [("x.jsonl:1", b"t")]


def test_build_md_data_section_names_every_source_and_option():
  build = open(os.path.join(ROOT, "BUILD.md")).read()
  data = build.split("## Data", 1)[1].split("\n## ", 1)[0]
  for name in [f.usage for f in sources.FORMATS.values()] + ["--extract", "--on_bad_record"]:
    assert name in data, name
  with pytest.raises(UserError):
    sources.parse_source("jsonl")


@functools.cache
def _prepare_help() -> str:
  """prepare_data.py's --help text, from its own process (importing it here would define
  its absl flags twice beside another entry point's); started once for the file's tests."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, os.path.join(root, "experiments", "prepare_data.py"),
                         "--helpfull"], capture_output=True, text=True, cwd=root)
  return " ".join((proc.stdout + proc.stderr).split())
