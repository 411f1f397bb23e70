"""prepare_data: shards, balance, determinism, held-out screening and bad input."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from soma_jax.data import clustering, pipeline, prepare
from soma_jax.data import router as router_lib
from soma_jax.errors import UserError
from tests.conftest import DATA_DOMAINS, data_make_doc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"test_docs": 6, "ensemble_val_docs": 3, "min_df": 2, "svd_dims": 16, "val_fraction": 0.05}


def test_manifest_and_files(data_prepared):
  m = pipeline.check_data_dir(data_prepared, 3)
  for key in ("version", "num_clusters", "seed", "source", "settings", "shards", "ensemble_val_windows",
              "test_windows", "top_terms", "files", "min_df_used", "exclusions"):
    assert key in m, key
  assert m["settings"]["num_clusters"] == 3 and m["settings"]["min_df"] == 2
  sizes = [s["windows"] for s in m["shards"]]
  assert m["assignment"]["windows_per_shard"] == m["cluster_balance"]["sizes"] == sizes
  assert sum(sizes) == m["training_windows"]
  for s in m["shards"]:
    train = np.load(f"{data_prepared}/experts/{s['expert']:04d}/train.npy", mmap_mode="r")
    val = np.load(f"{data_prepared}/experts/{s['expert']:04d}/val.npy", mmap_mode="r")
    assert train.shape == (s["train_windows"], 1025) and val.shape == (s["val_windows"], 1025)
    assert train.dtype == val.dtype == np.uint8 and s["val_windows"] >= 1
    assert s["train_bytes"] == train.size
  for rel, digest in m["files"].items():
    with open(os.path.join(data_prepared, rel), "rb") as f:
      assert hashlib.sha256(f.read()).hexdigest() == digest, rel
  assert "router.npz" in m["files"] and "manifest.json" not in m["files"]
  assert m["test_windows"] == m["test_docs"] == 6
  assert m["ensemble_val_docs"] == 3 and m["ensemble_val_windows"] >= 3
  assert not [p for p in os.listdir(os.path.dirname(data_prepared)) if ".tmp-" in p]


def test_training_windows_are_raw_corpus_bytes(data_prepared, data_textdir):
  corpus = b"".join(open(os.path.join(dp, f), "rb").read() for dp, _, fs in os.walk(data_textdir) for f in fs)
  train = np.load(f"{data_prepared}/experts/0000/train.npy")
  for row in train[:5]:
    assert row.tobytes() in corpus


def test_clusters_separate_domains(data_prepared):
  m = pipeline.load_manifest(data_prepared)
  domain_of = {w: d for d, words in DATA_DOMAINS.items() for w in words.split()}
  seen = []
  for terms in m["top_terms"]:
    domains = {domain_of.get(t) for t in terms[:5]}
    assert len(domains) == 1 and None not in domains, terms
    seen.append(domains.pop())
  assert sorted(seen) == sorted(DATA_DOMAINS)
  router = router_lib.Router.load(f"{data_prepared}/router.npz")
  rng = np.random.default_rng(5)
  for domain, expected in zip(seen, range(3), strict=True):
    prefixes = [data_make_doc(domain, rng, 60).encode() for _ in range(5)]
    assert router.route(prefixes, 1)[:, 0].tolist() == [expected] * 5


def test_rerun_reproduces_bytes(data_prepared, data_textdir, tmp_path):
  m2 = prepare.prepare(f"textdir:{data_textdir}", 3, str(tmp_path / "again"), **SMALL)
  with open(f"{data_prepared}/manifest.json") as f:
    m1 = json.load(f)
  assert m1["files"] == m2["files"]
  with open(f"{data_prepared}/manifest.json", "rb") as f1, open(tmp_path / "again" / "manifest.json", "rb") as f2:
    assert f1.read() == f2.read()


def test_heldout_screening(tmp_path):
  rng = np.random.default_rng(0)
  src = tmp_path / "src"
  src.mkdir()
  for i in range(40):
    text = data_make_doc(list(DATA_DOMAINS)[i % 3], rng, 400)
    (src / f"d{i:02d}.txt").write_text(text)
    if i < 20:  # a normalised copy: other case and whitespace
      (src / f"d{i:02d}_copy.txt").write_text("  " + text.upper().replace(" ", "\t "))
  m = prepare.prepare(f"textdir:{src}", 2, str(tmp_path / "out"), **{**SMALL, "test_docs": 5})
  with open(tmp_path / "out" / "heldout_docs.json") as f:
    held = json.load(f)
  assert held["test"] and not [d for d in held["test"] + held["ensemble_val"] if int(d[1:3]) < 20]
  assert m["exclusions"]["count"] > 0
  assert all("normalised" in e["reason"] for e in m["exclusions"]["listed"])


def test_fineweb_and_wikitext_sources(tmp_path):
  rng = np.random.default_rng(0)
  texts = [data_make_doc(list(DATA_DOMAINS)[i % 3], rng, 400) for i in range(40)]
  (tmp_path / "fw").mkdir()
  table = pa.table({"text": texts, "id": [f"<urn:{i}>" for i in range(40)], "url": ["u"] * 40})
  pq.write_table(table, tmp_path / "fw" / "000_00000.parquet", row_group_size=8)
  m = prepare.prepare(f"fineweb_edu:{tmp_path / 'fw'}", 2, str(tmp_path / "o1"), **SMALL)
  assert m["num_clusters"] == 2 and m["documents"]["nonempty"] == 40
  (tmp_path / "wt").mkdir()
  raw = "".join(f" = Article {i} = \n \n {t}" for i, t in enumerate(texts))
  (tmp_path / "wt" / "wiki.train.raw").write_text(raw)
  m = prepare.prepare(f"wikitext103:{tmp_path / 'wt'}", 2, str(tmp_path / "o2"), **SMALL)
  assert m["documents"]["nonempty"] == 40


def _write_docs(folder, docs):
  folder.mkdir(parents=True, exist_ok=True)
  for i, d in enumerate(docs):
    (folder / f"{i}.txt").write_bytes(d)


@pytest.mark.parametrize(
  "case,match",
  [
    ("zero_length", "zero-length"),
    ("tiny", "too few for 4 clusters"),
    ("num_clusters", "must be at least 1"),
    ("missing", "does not exist"),
    ("no_text_column", "no 'text' column"),
  ],
)
def test_bad_input_keeps_existing_dir(tmp_path, case, match):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("precious")  # a data dir's own file, listed in its manifest
  (out / "manifest.json").write_text('{"version": 1, "files": {"keep.txt": "0"}}')
  src, k = tmp_path / "src", 4
  if case == "zero_length":
    _write_docs(src, [b"", b""])
  elif case == "tiny":
    _write_docs(src, [b"word " * 500])
  elif case == "num_clusters":
    _write_docs(src, [b"word " * 500])
    k = 0
  elif case == "no_text_column":
    src.mkdir()
    pq.write_table(pa.table({"body": ["x" * 5000]}), src / "a.parquet")
  kind = "fineweb_edu" if case == "no_text_column" else "textdir"
  path = src if case != "missing" else tmp_path / "nowhere"
  with pytest.raises(UserError, match=match):
    prepare.prepare(f"{kind}:{path}", k, str(out), **SMALL)
  assert sorted(os.listdir(out)) == ["keep.txt", "manifest.json"]
  assert (out / "keep.txt").read_text() == "precious"
  assert sorted(os.listdir(tmp_path)) == sorted(["out"] + (["src"] if case != "missing" else []))


def test_refuses_foreign_nonempty_out(tmp_path, data_textdir):
  (tmp_path / "home").mkdir()
  (tmp_path / "home" / "thesis.tex").write_text("x")
  with pytest.raises(UserError, match="not a prepared data dir"):
    prepare.prepare(f"textdir:{data_textdir}", 2, str(tmp_path / "home"), **SMALL)


def test_cli_error_is_one_line_exit_2(tmp_path):
  with open(tmp_path / "x.gz", "wb") as f:
    f.write(b"\x1f\x8b\x08\x00" + b"\x00" * 20)
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"), f"--source=textdir:{tmp_path}",
     "--num_clusters=2", f"--out={tmp_path / 'out'}"],
    capture_output=True, text=True, cwd=ROOT, timeout=120,
  )
  assert proc.returncode == 2, proc.stderr
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error:") and "gzip" in lines[0] and "fix:" in lines[0]
  assert not (tmp_path / "out").exists()


def test_every_window_is_in_its_nearest_centroids_shard(data_prepared):
  """Balance shapes the fit only: each window sits at the nearest centroid of its own features."""
  m = pipeline.load_manifest(data_prepared)
  router = router_lib.Router.load(f"{data_prepared}/router.npz")
  at_nearest, total, own_sim = 0, 0, 0.0
  for e in range(m["num_clusters"]):
    for split in ("train", "val"):
      w = np.load(f"{data_prepared}/experts/{e:04d}/{split}.npy")
      sims = router.featurizer.transform(clustering.decode(w[:, :1024])) @ router.centroids.T
      at_nearest += int(np.sum(sims[:, e] >= sims.max(axis=1) - 1e-5))
      own_sim += float(sims[:, e].sum())
      total += len(w)
  assert total == m["training_windows"] and at_nearest == total, (at_nearest, total)
  # The manifest's figure is the mean similarity of each window to its own shard's centroid.
  assert m["assignment"]["mean_similarity"] == pytest.approx(own_sim / total, rel=1e-4)


def _mixed_textdir(root, n_binary):
  rng = np.random.default_rng(1)
  for i in range(24):
    (root / "text").mkdir(parents=True, exist_ok=True)
    (root / "text" / f"d{i}.txt").write_text(data_make_doc(list(DATA_DOMAINS)[i % 3], rng, 400))
  (root / "lib").mkdir(parents=True, exist_ok=True)
  for i in range(n_binary):
    elf = b"\x7fELF\x02\x01\x01\x00" + rng.integers(0, 256, 6000, dtype=np.uint8).tobytes()
    (root / "lib" / f"lib{i}.so").write_bytes(elf)
    noise = rng.integers(128, 256, 6000, dtype=np.uint8).tobytes()  # no NUL, invalid UTF-8
    (root / "lib" / f"blob{i}.bin").write_bytes(noise)


def test_binaries_in_textdir_are_skipped_and_counted(tmp_path):
  _mixed_textdir(tmp_path / "src", 3)
  m = prepare.prepare(f"textdir:{tmp_path / 'src'}", 2, str(tmp_path / "out"), **SMALL)
  assert m["documents"]["not_text_skipped"] == 6 and m["documents"]["nonempty"] == 24
  for e in range(2):
    w = np.load(tmp_path / "out" / "experts" / f"{e:04d}" / "train.npy")
    assert not (w == 0).any()  # no NUL byte of the binaries reached training
  assert "skipped 6 not text" in prepare.summary(m, "OUT", 1.0)
  only_binaries = tmp_path / "bin"
  (only_binaries / "lib").mkdir(parents=True)
  (only_binaries / "lib" / "x.so").write_bytes(b"\x7fELF\x00" * 100)
  with pytest.raises(UserError, match="1 not text"):
    prepare.prepare(f"textdir:{only_binaries}", 2, str(tmp_path / "out2"), **SMALL)


def test_cli_prints_summary_and_warns_on_empty_eval_sets(tmp_path, data_textdir):
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"), f"--source=textdir:{data_textdir}",
     "--num_clusters=2", f"--out={tmp_path / 'out'}", "--test_docs=0", "--ensemble_val_docs=3", "--min_df=2",
     "--svd_dims=8"],
    capture_output=True, text=True, cwd=ROOT, timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert "90 documents read" in proc.stdout and "0 test windows" in proc.stdout, proc.stdout
  warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and "test set is empty" in warnings[0], proc.stderr


def test_out_under_a_file_is_one_line(tmp_path):
  (tmp_path / "FILE").write_text("x")
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"), "--source=pystdlib",
     f"--out={tmp_path / 'FILE' / 'sub'}"],
    capture_output=True, text=True, cwd=ROOT, timeout=120,
  )
  assert proc.returncode == 2
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "is a file, not a folder" in lines[0] and "fix: create" not in lines[0], lines
