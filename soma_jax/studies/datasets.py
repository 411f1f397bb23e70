"""A study's data: its data dirs (checked, or prepared under --out) and its evaluation sets
on the study's route / score span."""

from __future__ import annotations

import inspect
import os
import re

import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.studies import planning


def check_data(data_dir: str, n_experts: int, field: str | None = "data_dir") -> dict:
  """`pipeline.check_data_dir`, its refusal re-worded for compare.py: the study's config
  `field` that named the folder (None: a folder the study prepared under --out itself); the
  data dir's manifest."""
  try:
    return pipeline.check_data_dir(data_dir, n_experts)
  except UserError as e:
    why = str(e).split("; fix:")[0]
    fix = (f"--config.{field}= a data dir prepared for N = {n_experts} experts "
           f"(prepare_data.py --num_clusters={n_experts}), or --config.{field}= (empty: the "
           "built-in corpus, prepared under --out)" if field else
           "another --out (this folder was prepared there by an earlier study)")
    raise UserError(f"{why}; fix: {fix}") from None


def prepare_data(source: str, n_experts: int, folder: str, settings: dict | None = None,
                 field: str = "source", **more) -> None:
  """`prepare.prepare` for a study: its refusal re-worded for compare.py (prepare_data.py's
  --source as the study's config `field`, its other flags as --config.prepare.NAME)."""
  from soma_jax.data import prepare

  settings = dict(settings or {})
  try:
    prepare.prepare(source, n_experts, folder, **settings, **more)
  except UserError as e:
    message = re.sub(r"--source\b", f"--config.{field}", str(e))
    names = "|".join(k for k in inspect.signature(prepare.prepare).parameters
                     if k not in ("source", "num_clusters", "out"))
    message = re.sub(rf"--({names})\b", r"--config.prepare.\1", message)
    raise UserError(message) from None


def ensure_data(data_dir: str, out: str, n_experts: int) -> str:
  """`data_dir` (a study's data_dir field), or the built-in pystdlib corpus prepared under
  OUT/data when it is ""."""
  if data_dir:
    check_data(data_dir, n_experts)
    return data_dir
  data_dir = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
    prepare_data("pystdlib", n_experts, data_dir)
  return data_dir


def prepared_dirs(source: str, settings: dict, ns: list[int], out: str) -> dict[int, str]:
  """{N: OUT/data_nN}, each prepared from corpus `source` into N shards when missing
  (`settings`: prepare.prepare's keyword settings), for studies whose rows differ in N."""
  dirs = {}
  for n in sorted(set(ns)):
    d = os.path.join(out, f"data_n{n}")
    if not os.path.isfile(os.path.join(d, "manifest.json")):
      prepare_data(source, n, d, settings)
    dirs[n] = d
  return dirs


def per_n_sets(span: planning.EvalSpan, specs: dict[str, spec_lib.RunSpec], source: str,
               settings: dict, out: str) -> tuple[dict[int, str], dict]:
  """For the studies whose rows differ in N: ({N: data dir}, {N: (validation, test)}) for
  every N of `specs` and N = 1 (the seed runs' data), prepared from `source` under OUT, each
  scored on `span`, all holding the same held-out windows (`same_windows`)."""
  dirs = prepared_dirs(source, settings, [s.n_experts for s in specs.values()] + [1], out)
  scored = {n: eval_sets(span, d, [s.seq_len for s in specs.values()]) for n, d in dirs.items()}
  same_windows(scored)
  return dirs, scored


def same_windows(scored: dict) -> None:
  """Every N's data dir ({N: (validation, test)}) holds the same ensemble-validation windows,
  else curves of different N would be scored on different text."""
  ref_n = min(scored)
  ref = scored[ref_n][0].windows
  for n, (val, _) in scored.items():
    if val.windows.shape != ref.shape or not np.array_equal(val.windows, ref):
      raise UserError(f"data_n{n} holds other ensemble-validation windows than data_n{ref_n}: "
                      "the same corpus and prepare settings give the same held-out documents, "
                      "so these were prepared from other ones (the runs trained on them are "
                      "kept); fix: another --out, or --config.source and --config.prepare as "
                      "they were when that folder was prepared")


def eval_sets(span: planning.EvalSpan, data_dir: str, seq_lens: list[int]):
  """(ensemble-validation set, test set) on the study's route / score span."""
  route, score = span.route, span.score
  if route + score > min(seq_lens):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} exceeds the "
                    f"trained context T = {min(seq_lens)}: scored targets must lie inside it; "
                    f"fix: route + score <= {min(seq_lens)} (e.g. 64 + 192 at T = 256)")
  if 1024 % (route + score):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} must divide 1024")
  val = eval_lib.TestSet(data_dir, span.val_windows, "ensemble_val", route, score)
  test = eval_lib.TestSet(data_dir, span.test_windows, "test", route, score)
  return val, test


def check_random(path: str, n_experts: int, field: str | None) -> str:
  """A random-shard data dir: N shards (`check_data`, `field` as there) prepared with
  --assignment=random."""
  kind = check_data(path, n_experts, field).get("assignment", {})
  if not (isinstance(kind, dict) and kind.get("kind") == "random"):
    raise UserError(f"data_dir_random={path!r} was not prepared with --assignment=random; fix: "
                    "prepare it so, from the same corpus and settings as the semantic shards")
  return path


def random_sets(span: planning.EvalSpan, path: str, seq_lens: list[int],
                semantic: tuple[eval_lib.TestSet, eval_lib.TestSet]):
  """(validation, test) of the random-shard data dir `path`, checked to hold the windows of
  `semantic`'s: only the shard labels differ, so its rows are scored on the same text."""
  sets = eval_sets(span, path, seq_lens)
  for what, a, b in zip(("validation", "test"), semantic, sets, strict=True):
    if a.windows.shape != b.windows.shape or not np.array_equal(a.windows, b.windows):
      raise UserError(f"the random-shard data's {what} windows differ from the semantic "
                      "shards': the rows would be scored on other text; fix: prepare "
                      "data_dir_random from the same corpus and settings (only --assignment "
                      "differs)")
  return sets


def describe_span(val: eval_lib.TestSet, test: eval_lib.TestSet) -> dict:
  """The evaluation span and sets: *_windows count the scored pieces, *_windows_scored the
  1,025-byte windows they are cut from, *_documents the documents those come from of the
  split's *_documents_available (`pipeline.spread_windows` spreads them)."""
  return {"route_bytes": test.route, "score_bytes": test.score,
          "window_bytes": test.route + test.score + 1,
          "windows_per_1025_byte_window": 1024 // (test.route + test.score),
          "val_windows": int(val.windows.shape[0]), "test_windows": int(test.windows.shape[0]),
          "test_documents": int(np.unique(test.doc_ids).size),
          "val_documents": int(np.unique(val.doc_ids).size),
          "val_documents_available": val.documents_available,
          "val_windows_scored": val.windows_scored,
          "test_documents_available": test.documents_available,
          "test_windows_scored": test.windows_scored}
