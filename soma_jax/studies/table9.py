"""The paper's Table 9 (frozen next-byte evaluation on WikiText-103, scaled down by SPEC 9.6):
Table 4's SOMA and monolith rows, their checkpoints chosen first, scored on a corpus nobody
trained on.

Rows: Table 4's own (`table4.rows_stages`; compare.py's study=table4 config with its other rows
removed): SOMA N = 2 and the monolith of the same total size with 1x, 4x and 16x SOMA's
directions on SOMA's batch (the paper's 64 / 256 / 1,024 against SOMA's 64), each continuing
its architecture's seed run, every row on the same budget (SPEC 7's operations at size=cpu).
Each row's checkpoint is chosen before any external score exists: the final checkpoint of its
budget (the newest step in its folder), written to OUT/selection.json before the first
external window is scored. The external corpus (`external_corpus.py`):
- `wikitext`: a WikiText-103 raw folder (wiki.valid.raw, wiki.test.raw) by SPEC 4: split at
  top-level heading rows (` = Title = `), 1,025-byte windows advancing by 768 bytes within an
  article, incomplete final windows dropped (`windows.wikitext103_windows`);
- else `external`: any SOURCE prepare_data.py reads (`sources.FORMATS`; size=cpu's default is
  this machine's Linux man pages, section 7), its text documents (empty, binary and exact
  duplicates dropped) cut into the same windows within each document; the documents with a
  window alternate, in the reader's fixed order, validation (even) and test (odd).
`external_eval.val_windows` / `test_windows` of a split's windows (0: all) are taken spread over
its documents (`pipeline.spread_windows`) and scored as the study scores its own ensemble
validation: each window cut into pieces of route + score + 1 bytes (`evaluate.cut_windows`),
each piece routed by the experts' router on its first `route` bytes to the top min(4, N).
Reported: per row and seed the external validation and test loss with document-bootstrap 95%
intervals; the mean across seeds; each monolith minus SOMA per seed (paired bootstrap) and
across seeds (t interval, and widened by the documents' variance); the in-domain validation and
test loss of the same checkpoints; both rankings, so the reader sees whether the ranking
transfers (`table9_readouts.py`). results.json `paper` holds the paper's Table 9 and its
Table 4's in-domain test.
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import numpy as np

from soma_jax import runs
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  driver,
  planning,
  recipes,
  results,
  scores,
  table4,
  table4_report,
  training,
)
from soma_jax.studies.external_corpus import (
  HALVES,
  Corpus,
  ExternalSet,
  check_corpus,
  check_not_trained_on,
  external_sets,
)
from soma_jax.studies.table9_readouts import PAPER, PAPER_ROWS, readout

SELECTION_FILE = "selection.json"  # the chosen checkpoints, written before external scoring
FIELDS = {
    "wikitext": ("a string (a WikiText-103 raw folder, or '')", lambda v: isinstance(v, str)),
    "external": ("a string (a SOURCE, or '')", lambda v: isinstance(v, str)),
    "external_eval.val_windows": planning.whole(0),
    "external_eval.test_windows": planning.whole(0),
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table9 (the paper's Table 9): Table 4's SOMA and monolith rows (its config, seed
  runs, budget and scoring), each row's final checkpoint chosen first, then scored frozen on
  a corpus nobody trained on.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table9,size=cpu --out=runs/table9
    ... --config.wikitext=FOLDER   (WikiText-103 raw: wiki.valid.raw, wiki.test.raw)
  """
  a = recipes.args(arg, seeds=0)
  cpu = a["size"] == "cpu"
  # the paper's four rows only: no controls, no search
  c = recipes.allocation(a["study"], a["size"], search=False, controls=False)
  c.seeds = a["seeds"] or 2  # table4 runs 5; two fit about 15 minutes here with the scoring
  # The external corpus: a WikiText-103 raw folder (SPEC 4's protocol) when set, else any
  # SOURCE prepare_data.py reads, its documents alternating validation / test. The default:
  # this machine's Linux man pages of section 7 (9.5 MB of overviews and SQL references in
  # troff), which no study trains on.
  c.wikitext = ""
  c.external = "textdir:/usr/share/man/man7"
  c.external_eval = ml_collections.ConfigDict()
  # The first this many 1,025-byte windows of each external split (0 = all), spread over its
  # documents, each cut into the study's pieces (eval.route_bytes + eval.score_bytes + 1)
  c.external_eval.val_windows = 512 if cpu else 0
  c.external_eval.test_windows = 512 if cpu else 0
  return c


@dataclasses.dataclass(frozen=True)
class Study:
  plan: planning.StudyPlan
  corpus: Corpus
  methods: dict  # {name: its training config}, the reference first (`planning.sized`)


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Study:
  """Every field and run before anything trains: the external corpus, and the rows (the
  reference SOMA with N >= 2, every other row a monolith, no controls)."""
  planning.check_fields(config, FIELDS)
  corpus = check_corpus(config.wikitext, config.external, config.external_eval.val_windows,
                        config.external_eval.test_windows)
  if plan.match_updates or plan.fresh_optimizer:
    raise UserError("table9 scores Table 4's budget rows only (no controls, no fresh optimizer); "
                    "fix: --config.match_updates='{}' --config.fresh_optimizer='()'")
  methods = planning.sized(config)
  for name, cfg in methods.items():
    n = planning.resolved(cfg, f"methods.{name}.").n_experts
    if (name == plan.reference) != (n > 1):
      raise UserError(f"methods.{name}.n_experts={n}: table9 compares SOMA (the reference "
                      f"{plan.reference!r}, N >= 2) with monoliths (N = 1); fix: "
                      f"--config.methods.{name}.n_experts={2 if name == plan.reference else 1}")
  return Study(plan, corpus, methods)


# ----------------------------------------------------------------------------- the study


def data(study: Study, plan: planning.StudyPlan, specs: dict, out: str) -> base.Data:
  """The one data dir and its sets (`driver.one_dir`), the external corpus refused where the
  rows train on it, and its sets read (not scored) before anything trains: extra =
  (trained_on, (external validation, external test))."""
  d = driver.one_dir(plan, specs, out)
  trained_on = check_not_trained_on(study.corpus, d.dirs[d.main])
  return d._replace(extra=(trained_on, external_sets(study.corpus, d.dirs[d.main], plan.eval)))


def stages(study: Study, ready: base.Setup) -> base.Stages:
  """Table 4's rows at every seed (`table4.rows_stages`), each row's final checkpoint chosen
  (selection.json) before any external window is scored, then scored on the external
  corpus."""
  plan, (val, test), seeds, out = ready.plan, ready.scored, ready.seeds, ready.out
  ext = ready.data.extra[1]
  starts, described, firsts = {}, {}, {}
  for n, cfg in study.methods.items():
    first = training.budgeted(cfg, ready.data_dir, plan.seeds[0], seeds[plan.start[n]],
                              plan.unit, 1, 1)
    starts[n], firsts[n] = scores.start_losses(first, {"validation": val, "test": test}), first
    described[n] = table4.describe(n, first, plan, seeds[plan.start[n]],
                                   training.layout_of(first))
    described[n].update(n_pert=first.config.spsa.n_pert,
                        paper_row=paper_row(n, ready.specs, plan.reference))
  rows, _ = yield from table4.rows_stages(plan, study.methods, (ready.data_dir, out), seeds,
                                          starts, (val, test))
  chosen = select(rows, out)  # before any external score
  external = {key: external_losses(os.path.join(out, c["workdir"]), c["step"], ext)
              for key, c in chosen.items()}
  ext_starts = {n: scores.start_losses(f, dict(zip(HALVES, ext, strict=True)))
                for n, f in firsts.items()}
  for (_, name), r in rows.items():
    described[name]["per_seed"].append(r)
  return described, rows, chosen, external, ext_starts


def measure(study: Study, ready: base.Setup, gathered: tuple) -> dict:
  """Each row on the external corpus against the reference (`readout`), the corpus, the
  selection."""
  described, rows, chosen, external, ext_starts = gathered
  plan, (trained_on, ext) = ready.plan, ready.data.extra
  return {"budget": {"unit": plan.unit, "per": "row and seed", "seed_updates": plan.seed_updates},
          "paper": PAPER, "trained_on": trained_on,
          "corpus": {"kind": study.corpus.kind, "name": study.corpus.name,
                     "split": SPLIT_RULE[study.corpus.kind]},
          "external_eval": datasets.describe_span(*ext), "methods": described,
          "selection": {"rule": SELECTION_RULE, "file": SELECTION_FILE,
                        "chosen": {f"{n} (seed {s})": c for (s, n), c in chosen.items()}},
          "measured": readout(plan, list(study.methods), rows, chosen, external, ext,
                              ext_starts),
          "interpretation": INTERPRETATION}


INTERPRETATION = (
    "The paper's rows near 150 GPU-hours each are Table 4's rows here on one equal budget per "
    "row (SPEC 7's operations at size=cpu); its 8.44M-parameter models are Table 4's CPU rows "
    "(SOMA N = 2 of width 32, monoliths of the same total size at 1x / 4x / 16x SOMA's "
    "directions for its 64 / 256 / 1,024); its checkpoints, selected before WikiText, are "
    "each row's final checkpoint; its validation and test columns are wiki.valid.raw and "
    "wiki.test.raw, or where no WikiText copy is at hand the two document halves of another "
    "corpus none of the rows trained on; the models train on T = 256 < 1,024, so each window "
    "is scored in pieces as the study's own ensemble validation is (the paper scores whole "
    "1,025-byte windows).")
SELECTION_RULE = ("each row's final checkpoint at its budget (the newest step in its folder), "
                  "fixed before any external window is scored and written to selection.json "
                  "first")
SPLIT_RULE = {
    "wikitext103": "wiki.valid.raw (validation) and wiki.test.raw (test), articles split at "
                   "top-level heading rows",
    "source": "documents with a complete window alternate in the reader's order: even "
              "positions validation, odd test",
}


def paper_row(name: str, specs: dict, ref: str) -> str | None:
  """The paper's row a row stands for: SOMA N = 2, or the monolith at the same multiple of
  SOMA's directions (1x, 4x, 16x: the paper's 64, 256, 1,024); None for another."""
  k = PAPER["soma_n_pert"]
  if name == ref:
    return f"soma_n2_npert{k}" if specs[name].n_experts == 2 else None
  mult = specs[name].config.spsa.n_pert / specs[ref].config.spsa.n_pert
  key = f"monolith_npert{mult * k:g}"
  return key if key in PAPER["rows"] else None


def select(rows: dict, out: str) -> dict:
  """{(seed, row): the chosen checkpoint}: the newest step in each row's folder, the step its
  in-domain scores read; written to OUT/selection.json before anything external is scored."""
  chosen = {}
  for (seed, name), r in rows.items():
    step = scores.checkpoints(os.path.join(out, r["workdir"]))[-1]
    if step != r["step"]:
      raise UserError(f"{r['workdir']}: newest checkpoint {step} but the run ended at "
                      f"{r['step']} (a checkpoint saved after its summary; both are kept); fix: "
                      "rerun the same command, or another --out")
    chosen[(seed, name)] = {"seed": seed, "row": name, "workdir": r["workdir"], "step": step,
                            "updates": r["updates"], "ops": r["ops"]}
  with open(os.path.join(out, SELECTION_FILE), "w") as f:
    json.dump({"rule": SELECTION_RULE, "chosen": list(chosen.values())}, f, indent=1)
  return chosen


def external_losses(workdir: str, step: int, ext: tuple[ExternalSet, ExternalSet]
                    ) -> dict[str, np.ndarray]:
  """Per-piece losses of a run's checkpoint at `step` on the external validation and test."""
  _, state, _, spec = runs.restore_state(workdir, step=step)
  return {split: s.losses(state.body, state.head, spec.n_experts, spec.shared_head,
                          spec.method.logits) for split, s in zip(HALVES, ext, strict=True)}


# ----------------------------------------------------------------------------- the table


def _paper_cells(key: str | None) -> str:
  if key is None:
    return "- | - | - | -"
  q = PAPER["rows"][key]
  return (f"{q['gpu_hours']} | {q['validation']:.3f} | {q['test']:.3f} | "
          f"{PAPER['in_domain_test'][key]:.2f}")


def _line(name: str, p: dict) -> str:
  d, m = p["methods"][name], p["measured"]["rows"][name]
  g = m.get("minus_ref")
  both = "" if g is None or g["test"]["seeds_and_documents"]["ci95"] is None else (
      " / [{:+.3f}, {:+.3f}]".format(*g["test"]["seeds_and_documents"]["ci95"]))
  steps = sorted({q["checkpoint_step"] for q in m["per_seed"]})
  label = "" if d["paper_row"] is None else f" ({PAPER['rows'][d['paper_row']]['label']})"
  return (f"| {name}{label} | {d['n_experts']} | {d['d_t']} | {table4_report.fmt(d['params'])} | "
          f"{d['n_pert']} | {np.mean([q['updates'] for q in m['per_seed']]):.0f} | "
          f"{'/'.join(map(str, steps))} | {results.pm(m['validation'])} | "
          f"{results.pm(m['test'])} | " + ("-" if g is None else results.ci(g["test"]) + both)
          + f" | {results.pm(m['in_domain']['test'])} | "
          + ("-" if g is None else results.ci(g["in_domain_test"]))
          + f" | {_paper_cells(d['paper_row'])} |")


def table(p: dict) -> str:
  """Markdown: the paper's Table 9 beside ours, per-seed values, both rankings."""
  ref, ev, x, b = p["reference"], p["eval"], p["external_eval"], p["budget"]
  lines = [
      f"Table 9 protocol at this scale, scored on **{p['corpus']['name']}** ({p['corpus']['split']}; "
      f"the rows train on {p['trained_on']}). Table 4's rows, {b['amount']:g} {b['unit']} per row "
      f"and seed from their seed runs ({b['seed_updates']} updates), seeds {p['seeds']}; "
      f"checkpoints: {p['selection']['rule']}. External windows: {x['val_windows_scored']} "
      f"validation windows of 1,025 bytes from {x['val_documents']} documents (of "
      f"{x['val_documents_available']}), {x['test_windows_scored']} test windows from "
      f"{x['test_documents']} (of {x['test_documents_available']}), advancing 768 bytes within a "
      f"document. Scored as this study scores its own ensemble validation (the models train on "
      f"T = {ev['route_bytes'] + ev['score_bytes']} bytes): each window cut into "
      f"{x['windows_per_1025_byte_window']} pieces of {x['window_bytes']} bytes, each piece "
      f"routed on its first {x['route_bytes']} bytes (top min(4, N)) and scored on the next "
      f"{x['score_bytes']} targets; the paper routes on bytes 0..255 and scores targets "
      "257..1024 of the whole window. Intervals: 95% document bootstrap per seed; across seeds "
      "mean ± sd and 95% t intervals (after ' / ': widened by the documents' variance).", "",
      *results.head(f"| row | N | d_t | params | n_pert | updates | step | external validation "
                    f"| external test | test − {ref} | in-domain test | in-domain − {ref} | "
                    "paper GPU-h | paper validation | paper test | paper in-domain test "
                    "(Table 4) |")]
  lines += [_line(n, p) for n in p["measured"]["rows"]]
  r = p["measured"]["rankings"]
  ours = {d["paper_row"]: n for n, d in p["methods"].items() if d["paper_row"] is not None}
  like = lambda k: ("the paper's" if r[k] == [ours.get(q, q) for q in r[f"paper_{k}"]]
                    else "not the paper's")
  lines += ["", f"Ranking on external test (ours, seed means): {' < '.join(r['external_test'])}"
            f" ({like('external_test')}); on in-domain test: {' < '.join(r['in_domain_test'])} "
            f"({like('in_domain_test')}); our two orders alike: {r['same_order']}, the same row "
            f"lowest on both: {r['same_best']}. Paper: WikiText-103 test "
            f"{' < '.join(r['paper_external_test'])}; in-domain (Table 4) "
            f"{' < '.join(r['paper_in_domain_test'])}. An order of seed means resolves a pair only "
            f"where its interval above excludes zero.", "",
            "Per seed: external test [95% document bootstrap], minus the reference [paired 95%], "
            "in-domain test.", "",
            *results.head(f"| row | seed | step | external validation | external test | "
                          f"test − {ref} | in-domain test |")]
  for name, m in p["measured"]["rows"].items():
    for q in m["per_seed"]:
      d = q.get("minus_ref", {}).get("test")
      lines.append(f"| {name} | {q['seed']} | {q['checkpoint_step']} | "
                   f"{_ci_cell(q['validation'])} | {_ci_cell(q['test'])} | "
                   + ("-" if d is None else f"{d['diff']:+.4f} [{d['ci95'][0]:+.4f}, "
                      f"{d['ci95'][1]:+.4f}]") + f" | {q['in_domain']['test']:.4f} |")
  lines += ["", "External loss of each row's start (its seed run's parameters): " + "; ".join(
      f"{n} validation {m['external_start']['validation']:.4f}, test "
      f"{m['external_start']['test']:.4f}" for n, m in p["measured"]["rows"].items()) + ".", "",
            "How the paper's item maps here: " + p["interpretation"]]
  return "\n".join(lines) + "\n"


def _ci_cell(v: dict) -> str:
  return f"{v['mean']:.4f} [{v['ci95'][0]:.4f}, {v['ci95'][1]:.4f}]"


STUDY = base.Study(name="table9",
                   spec="paper Table 9 (frozen external evaluation of Table 4's rows), scaled "
                        "down by SPEC 9.6", config=config, check=check, stages=stages,
                   measure=measure, table=table, data=data, ops_tolerance=base.any_ops,
                   paper_rows=PAPER_ROWS)
