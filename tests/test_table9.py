"""study=table9 (the paper's Table 9): Table 4's four rows, each final checkpoint chosen before
any external score, scored frozen on WikiText-103 raw files (a fixture in their real format)
and on an external SOURCE; windows counted, fields refused."""

import json
import os

import numpy as np
import pytest

from soma_jax import evaluate as eval_lib
from soma_jax import runs
from soma_jax.data import pipeline
from soma_jax.data import windows as windows_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError
from soma_jax.studies import driver, external_corpus, scores, table9
from tests import committed
from tests.test_compare import load_config

WORDS = ("the river valley was settled by farmers who built a stone bridge over the ford in "
         "the early years of the century and later a railway station").split()
# article byte lengths (heading row included): under one window, exactly one, one window with
# 767 bytes to spare, two, several
VALID_LENGTHS = (1024, 1025, 1792, 1793, 4000, 2600, 600)
TEST_LENGTHS = (3000, 1100, 500, 2000)
# textdir files: (name, bytes or a length of text); None: a copy of the first file
SOURCE_FILES = (("a00.txt", 3000), ("a01.txt", 500), ("a02.txt", 1025), ("a03.txt", None),
                ("a04.bin", b"\0\1\2binary" * 500), ("a05.txt", b""), ("a06.txt", 2000),
                ("a07.txt", 4000), ("a08.txt", 1800))


def expected_windows(length: int) -> int:
  """1,025-byte windows at offsets 0, 768, 1536, ... that fit inside `length` bytes."""
  return len(range(0, length - 1025 + 1, 768)) if length >= 1025 else 0


def text_of(length: int, rng: np.random.Generator, first: str = "") -> bytes:
  """`length` bytes of WikiText-like lines (" word word ... \\n"), ending in a newline."""
  text = first
  while len(text) < length:
    text += " " + " ".join(rng.choice(WORDS, 12)) + " . \n"
  return (text[:length - 1] + "\n").encode()


def article(i: int, length: int, rng: np.random.Generator) -> bytes:
  """One article of exactly `length` bytes: its ` = Title = ` row, a blank row, a subheading."""
  return text_of(length, rng, f" = Article {i} = \n \n = = Early life = = \n \n")


def write_wikitext(folder: str) -> dict[str, list[bytes]]:
  rng, out = np.random.default_rng(0), {}
  for split, name, lengths in (("validation", "wiki.valid.raw", VALID_LENGTHS),
                               ("test", "wiki.test.raw", TEST_LENGTHS)):
    out[split] = [article(i, n, rng) for i, n in enumerate(lengths)]
    with open(os.path.join(folder, name), "wb") as f:
      f.write(b" \n" + b"".join(out[split]))  # the published files open with a blank row
  return out


def write_textdir(folder: str) -> dict[str, bytes]:
  rng, out = np.random.default_rng(1), {}
  for name, what in SOURCE_FILES:
    data = out["a00.txt"] if what is None else (what if isinstance(what, bytes)
                                               else text_of(what, rng))
    out[name] = data
    with open(os.path.join(folder, name), "wb") as f:
      f.write(data)
  return out


def windows_of(docs: list[bytes]) -> np.ndarray:
  """Every complete 1,025-byte window at offsets 0, 768, ... of each document, in order."""
  rows = [np.frombuffer(d[o:o + 1025], np.uint8) for d in docs for o in range(0, len(d), 768)
          if len(d) - o >= 1025]
  return np.stack(rows)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  wiki = tmp_path_factory.mktemp("wikitext")
  texts = tmp_path_factory.mktemp("external")
  return str(wiki), write_wikitext(str(wiki)), str(texts), write_textdir(str(texts))


@pytest.fixture(scope="module")
def studied(tmp_path_factory, data_two_shards, corpora):
  """The study on WikiText, then again into the same folder (the runs resumed, done) on the
  external textdir."""
  wiki, _, texts, _ = corpora
  config = load_config("compare", "study=table9,size=tiny")
  config.data_dir, config.bootstrap_draws, config.wikitext = data_two_shards, 50, wiki
  out = str(tmp_path_factory.mktemp("table9") / "out")
  on_wiki = driver.run(table9.STUDY, config, out, "python experiments/compare.py --test")
  wiki_md = open(os.path.join(out, "table.md")).read()
  config.wikitext, config.external = "", f"textdir:{texts}"
  on_texts = driver.run(table9.STUDY, config, out, "python experiments/compare.py --test")
  return config, out, on_wiki, wiki_md, on_texts


def test_the_cpu_config_is_table4s_four_rows():
  config = load_config("compare", "study=table9,size=cpu")
  t4 = load_config("compare", "study=table4,size=cpu")
  assert list(config.order) == ["soma_n2", "mono_k4", "mono_k16", "mono_k64"]
  for name in config.order:
    assert config.methods[name].to_dict() == t4.methods[name].to_dict()
    assert config.start[name] == t4.start[name]
  assert (config.budget, config.budget_unit) == (t4.budget, t4.budget_unit) == (1.6e12, "ops")
  assert config.eval.to_dict() == t4.eval.to_dict() and config.seeds == 2
  assert set(config.seed_runs) == {"soma_expert", "monolith"}
  assert (config.wikitext, config.external) == ("", "textdir:/usr/share/man/man7")


def test_wikitext_windows_advance_768_within_an_article_and_drop_the_incomplete(corpora):
  wiki, articles, _, _ = corpora
  splits = external_corpus.wikitext_splits(wiki)
  for split, lengths in (("validation", VALID_LENGTHS), ("test", TEST_LENGTHS)):
    windows, ids = splits[split]
    assert windows.shape == (sum(map(expected_windows, lengths)), 1025)
    assert np.array_equal(windows, windows_of(articles[split]))  # no window crosses an article
    per_article = [int(np.sum(ids == i)) for i in np.unique(ids)]
    assert per_article == [expected_windows(n) for n in lengths if expected_windows(n)]


def test_an_external_source_alternates_its_documents_with_a_window(corpora):
  _, _, texts, files = corpora
  splits = external_corpus.source_splits(f"textdir:{texts}")
  # a01 (short), a03 (a copy of a00), a04 (binary), a05 (empty) dropped: a00 a02 a06 a07 a08
  halves = {"validation": ["a00.txt", "a06.txt", "a08.txt"], "test": ["a02.txt", "a07.txt"]}
  for half, names in halves.items():
    windows, ids = splits[half]
    assert np.array_equal(windows, windows_of([files[n] for n in names]))
    assert np.unique(ids).size == len(names)


def test_results_say_which_corpus_and_count_its_windows(studied):
  config, _, on_wiki, _, on_texts = studied
  pieces = 1024 // (config.eval.route_bytes + config.eval.score_bytes)
  for p, kind, counts in (
      (on_wiki, "wikitext103", {"val": VALID_LENGTHS, "test": TEST_LENGTHS}),
      (on_texts, "source", {"val": (3000, 2000, 1800), "test": (1025, 4000)})):
    assert p["corpus"]["kind"] == kind and p["study"] == "table9"
    x = p["external_eval"]
    for split, lengths in counts.items():
      assert x[f"{split}_windows_scored"] == sum(map(expected_windows, lengths))
      assert x[f"{split}_windows"] == x[f"{split}_windows_scored"] * pieces
      assert x[f"{split}_documents"] == sum(expected_windows(n) > 0 for n in lengths)
    assert p["trained_on"] == pipeline.load_manifest(config.data_dir)["source"]
  assert on_texts["corpus"]["name"] == config.external


def test_checkpoints_are_chosen_first_and_scored_as_chosen(studied, corpora):
  config, out, on_wiki, _, _ = studied
  with open(os.path.join(out, table9.SELECTION_FILE)) as f:
    chosen = json.load(f)["chosen"]
  assert len(chosen) == len(config.order) * config.seeds
  for c in chosen:
    steps = scores.checkpoints(os.path.join(out, c["workdir"]))
    assert len(steps) >= 2 and c["step"] == steps[-1]  # a choice among several: the newest
    rows = on_wiki["measured"]["rows"][c["row"]]["per_seed"]
    assert [q["checkpoint_step"] for q in rows if q["seed"] == c["seed"]] == [c["step"]]
  # the chosen SOMA checkpoint re-scored here, independently, on wiki.test.raw
  c = next(c for c in chosen if c["row"] == "soma_n2")
  _, state, _, spec = runs.restore_state(os.path.join(out, c["workdir"]), step=c["step"])
  windows, _ = windows_lib.wikitext103_windows(os.path.join(corpora[0], "wiki.test.raw"))
  route, span = config.eval.route_bytes, config.eval.route_bytes + config.eval.score_bytes
  pieces = np.stack([windows[:, o:o + span + 1] for o in range(0, 1024, span)], axis=1)
  pieces = pieces.reshape(-1, span + 1)
  router = Router.load(os.path.join(config.data_dir, "router.npz"))
  routes = router.route_to(pieces[:, :route], min(4, spec.n_experts), spec.n_experts)
  lp = eval_lib.routed_logprobs(state.body, state.head, pieces, routes, spec.shared_head,
                                first=route + 1, logits_fn=spec.method.logits)
  mine = [q for q in on_wiki["measured"]["rows"]["soma_n2"]["per_seed"] if q["seed"] == c["seed"]]
  assert eval_lib.mixture_nats(lp).mean() == pytest.approx(mine[0]["test"]["mean"], abs=1e-9)


def test_measured_per_row_and_seed_with_differences_to_soma(studied):
  config, _, _, _, p = studied
  rows, ref = p["measured"]["rows"], p["reference"]
  assert list(rows) == list(config.order) and ref == "soma_n2"
  for name, m in rows.items():
    per = m["per_seed"]
    assert [q["seed"] for q in per] == p["seeds"]
    in_domain = [r["test_nats_per_byte"] for r in p["methods"][name]["per_seed"]]
    assert [q["in_domain"]["test"] for q in per] == pytest.approx(in_domain)
    for split in ("validation", "test"):
      assert m[split]["mean"] == pytest.approx(np.mean([q[split]["mean"] for q in per]))
      for q in per:
        lo, hi = q[split]["ci95"]
        assert lo <= q[split]["mean"] <= hi
    if name == ref:
      assert "minus_ref" not in m
      continue
    for q, s in zip(per, rows[ref]["per_seed"], strict=True):
      assert q["minus_ref"]["test"]["diff"] == pytest.approx(q["test"]["mean"] - s["test"]["mean"])
      assert q["minus_ref"]["in_domain_test"] == pytest.approx(
          q["in_domain"]["test"] - s["in_domain"]["test"])
    assert m["minus_ref"]["test"]["mean"] == pytest.approx(
        np.mean([q["minus_ref"]["test"]["diff"] for q in per]))
  r = p["measured"]["rankings"]
  assert r["external_test"] == sorted(rows, key=lambda n: rows[n]["test"]["mean"])
  assert r["same_order"] == (r["external_test"] == r["in_domain_test"])


def test_the_papers_table_beside_ours(studied):
  _, out, on_wiki, wiki_md, on_texts = studied
  assert on_wiki["paper"]["rows"]["soma_n2_npert64"]["test"] == 2.066
  assert [on_texts["methods"][n]["paper_row"] for n in on_texts["measured"]["rows"]] == [
      "soma_n2_npert64", "monolith_npert64", "monolith_npert256", "monolith_npert1024"]
  assert "| 150 | 2.047 | 2.066 | 1.76 |" in wiki_md and "wikitext103:" in wiki_md
  md = open(os.path.join(out, "table.md")).read()
  assert "| 148 | 2.271 | 2.290 | 2.00 |" in md and on_texts["corpus"]["name"] in md
  assert "pieces of" in md


@pytest.mark.parametrize("field, value, match", [
    ("external_eval.val_windows", -1, "external_eval.val_windows"),
    ("wikitext", "/no/such/wikitext", "wiki.valid.raw"),
    ("external", "textdir:/no/such/man7", "--config.external"),
    ("external", "nosuchkind:/tmp", "--config.external"),
    ("external", "", "external=''"),
    ("methods.mono_k4.n_experts", 2, "n_experts"),
])
def test_bad_fields_are_refused(field, value, match):
  config = load_config("compare", "study=table9,size=tiny")
  config.external = "pystdlib"  # on every machine; the training-corpus check comes later
  *parents, key = field.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[key] = value
  with pytest.raises(UserError, match=match):
    driver.checked(table9.STUDY, config)


def test_a_wikitext_folder_without_its_test_file_is_refused(tmp_path):
  (tmp_path / "wiki.valid.raw").write_bytes(b" = A = \n")
  with pytest.raises(UserError, match="wiki.test.raw"):
    external_corpus.check_corpus(str(tmp_path), "", 0, 0)


def test_the_training_corpus_is_refused_before_anything_trains(tmp_path, data_two_shards,
                                                                data_textdir):
  config = load_config("compare", "study=table9,size=tiny")
  config.data_dir, config.external = data_two_shards, f"textdir:{data_textdir}"
  with pytest.raises(UserError, match="the one the rows train on"):
    driver.run(table9.STUDY, config, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out" / "seeds")


def test_committed_table_is_its_json_rendered():
  """docs/results/table9_cpu.md is table9.table of its JSON (regenerated, never hand-edited),
  and its ranking sentence says which order is the paper's."""
  p, md = committed.result("table9_cpu")
  assert md == table9.table(p)
  assert "mono_k16 (the paper's); on in-domain" in md
  assert "mono_k64 (not the paper's); our two orders alike: False" in md
