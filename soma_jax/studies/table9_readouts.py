"""Table 9's readouts (`table9.py`), pure statistics over the scored checkpoints: each row per
seed with document-bootstrap intervals, across seeds, minus the reference, both rankings; and
the paper's Table 9 they are read against; and its row of the paper table, read from the
committed results.json (PAPER_ROWS).
"""

from __future__ import annotations

import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.studies import paper, planning, statistics
from soma_jax.studies.external_corpus import HALVES
from soma_jax.studies.verdict import Interval, from_stat

# The paper's Table 9 (../shared/paper/figures-and-tables.txt), nats/byte on WikiText-103
# raw, and beside it the same checkpoints' in-domain test loss from its Table 4 (FineWeb-Edu
# test, three significant figures).
PAPER = {
    "item": "Table 9",
    "caption": "Frozen next-byte evaluation on WikiText-103 for approximately 8.44M-parameter "
               "models near 150 aggregate training GPU-hours. Training compute uses each "
               "checkpoint's recorded RTX 5090 accounting. Models and checkpoints are selected "
               "before observing WikiText scores.",
    "rows": {
        "soma_n2_npert64": {"label": "SOMA N = 2, n_pert = 64", "gpu_hours": 150,
                            "validation": 2.047, "test": 2.066},
        "monolith_npert64": {"label": "Monolithic SPSA, n_pert = 64", "gpu_hours": 152,
                             "validation": 2.240, "test": 2.254},
        "monolith_npert256": {"label": "Monolithic SPSA, n_pert = 256", "gpu_hours": 150,
                              "validation": 2.348, "test": 2.363},
        "monolith_npert1024": {"label": "Monolithic SPSA, n_pert = 1024", "gpu_hours": 148,
                               "validation": 2.271, "test": 2.290},
    },
    "in_domain_test": {"from": "Table 4 (FineWeb-Edu test)", "soma_n2_npert64": 1.76,
                       "monolith_npert64": 2.00, "monolith_npert256": 2.11,
                       "monolith_npert1024": 2.00},
    "soma_n_pert": 64,  # SOMA's directions per update; the monoliths' 1x / 4x / 16x of it
}


def _with_ci(losses_n: np.ndarray, doc_ids_n: np.ndarray, draws: int, seed: int) -> dict:
  lo, hi = eval_lib.bootstrap_ci(np.asarray(losses_n, np.float64)[:, None], doc_ids_n, draws,
                                 seed)
  return {"mean": float(np.mean(losses_n)), "ci95": [float(lo[0]), float(hi[0])]}


def per_seed(seed: int, name: str, ref: str, rows: dict, chosen: dict, scores: dict,
             ext: tuple, draws: int) -> dict:
  """One row at one seed: its chosen step, external losses with document-bootstrap CIs, the
  row minus the reference (paired), and its in-domain losses at the same checkpoint."""
  r, mine, theirs = rows[(seed, name)], scores[(seed, name)], scores[(seed, ref)]
  out = {"seed": seed, "checkpoint_step": chosen[(seed, name)]["step"],
         "updates": r["updates"], "ops": r["ops"],
         "in_domain": {"validation": r["end_loss"]["validation"], "test": r["end_loss"]["test"]}}
  for split, s in zip(HALVES, ext, strict=True):
    out[split] = _with_ci(mine[split], s.doc_ids, draws, seed)
    if name != ref:
      out.setdefault("minus_ref", {})[split] = statistics.paired(theirs[split], mine[split],
                                                               s.doc_ids, draws, seed)
  if name != ref:
    out["minus_ref"]["in_domain_test"] = (r["end_loss"]["test"]
                                          - rows[(seed, ref)]["end_loss"]["test"])
  return out


def minus_ref(name: str, ref: str, seeds: tuple, per: list[dict], scores: dict, ext: tuple,
              draws: int) -> dict:
  """The row minus the reference across seeds: a t interval per split (external validation,
  test, in-domain test); on external test also widened by the documents' variance."""
  out = {split: statistics.t_interval([q["minus_ref"][split]["diff"] for q in per])
         for split in HALVES}
  diff_SxN = np.stack([scores[(s, name)]["test"] - scores[(s, ref)]["test"] for s in seeds])
  both = statistics.widened_t_interval(
      list(diff_SxN.mean(axis=1)), statistics.document_variance(diff_SxN, ext[1].doc_ids, draws,
                                                              seeds[0]))
  out["test"]["seeds_and_documents"] = {"ci95": both["ci95"], "document_sd": both["document_sd"]}
  out["in_domain_test"] = statistics.t_interval([q["minus_ref"]["in_domain_test"] for q in per])
  return out


def readout(plan: planning.StudyPlan, names: list[str], rows: dict, chosen: dict,
            scores: dict, ext: tuple, ext_starts: dict) -> dict:
  """Per row: per seed, the means across seeds (t intervals), the row minus the reference;
  the rankings on external and in-domain test, ours and the paper's."""
  ref, draws, out = plan.reference, plan.bootstrap_draws, {}
  for name in names:
    per = [per_seed(s, name, ref, rows, chosen, scores, ext, draws) for s in plan.seeds]
    out[name] = {
        "per_seed": per,
        "external_start": {k: float(v.mean()) for k, v in ext_starts[name].items()},
        **{split: statistics.t_interval([q[split]["mean"] for q in per]) for split in HALVES},
        "in_domain": {split: statistics.t_interval([q["in_domain"][split] for q in per])
                      for split in HALVES}}
    if name != ref:
      out[name]["minus_ref"] = minus_ref(name, ref, plan.seeds, per, scores, ext, draws)
  return {"rows": out, "rankings": rankings(out)}


def rankings(rows: dict) -> dict:
  """Rows from lowest to highest seed-mean test loss, external and in-domain, and whether the
  external order is the in-domain order; the paper's two orders beside them."""
  ext = sorted(rows, key=lambda n: rows[n]["test"]["mean"])
  dom = sorted(rows, key=lambda n: rows[n]["in_domain"]["test"]["mean"])
  paper_ext = sorted(PAPER["rows"], key=lambda k: PAPER["rows"][k]["test"])
  paper_dom = sorted(PAPER["rows"], key=lambda k: PAPER["in_domain_test"][k])
  return {"external_test": ext, "in_domain_test": dom, "same_order": ext == dom,
          "same_best": ext[0] == dom[0], "paper_external_test": paper_ext,
          "paper_in_domain_test": paper_dom,
          "how": "seed means of each row's test loss, lowest first; the paper's in-domain "
                 "order from Table 4 (monolith 64 and 1,024 tie at 2.00 there)"}


# ------------------------------------------------------------------ the paper table's row

def primary_table9(d: dict) -> tuple[Interval, ...]:
  rows = d["measured"]["rows"]
  return tuple(from_stat(f"{n} − SOMA", r["minus_ref"]["test"]) for n, r in rows.items()
               if "minus_ref" in r)


TABLE9_PAPER_ORDER = ["soma_n2", "mono_k4", "mono_k64", "mono_k16"]  # the paper's, our names


def _resolved(ivs: tuple[Interval, ...]) -> list[str]:
  """The intervals that exclude their null."""
  return [iv.name for iv in ivs if not iv.lo <= iv.null <= iv.hi]


def ours_table9(d: dict) -> str:
  r = d["measured"]
  ranks = r["rankings"]
  order = lambda k: (f"{' < '.join(ranks[k])} ("
                     + ("" if ranks[k] == TABLE9_PAPER_ORDER else "not ") + "the paper's")
  ivs = primary_table9(d)
  clear = _resolved(ivs)
  return ("man pages (section 7) test: " + ", ".join(
      f"{n} {v['test']['mean']:.3f}" for n, v in r["rows"].items())
      + f"; seed means in order {order('external_test')} WikiText-103 order: SOMA, then 64, "
      f"1,024 and 256 directions); in-domain {order('in_domain_test')} Table 4 order: SOMA, then "
      "64 and 1,024 tied, 256 last); monolith − SOMA: " + paper.shown(ivs)
      + f" ({len(d['seeds'])} seeds, seeds and documents; {len(clear)} of {len(ivs)} exclude "
      f"zero: {', '.join(clear)})")


def brief_table9(d: dict) -> str:
  first = d["measured"]["rankings"]["external_test"][0] == "soma_n2"
  clear = _resolved(primary_table9(d))
  return (f"SOMA {'lowest' if first else 'not lowest'} in seed means; resolved: "
          + (", ".join(clear) if clear else "no difference"))


PAPER_ROWS = (paper.StudyRow(
    "Table 9", "frozen evaluation on an external corpus", ours_table9, "WikiText-103 test: SOMA "
    "N = 2 2.066; monoliths 2.254 / 2.363 / 2.290 (64 / 256 / 1,024 directions)", "no "
    "WikiText-103 copy here (--config.wikitext=FOLDER reads one): Linux man pages, section 7; "
    "Table 4's CPU rows (mono_k4 / k16 / k64 for the paper's 64 / 256 / 1,024 directions), 2 "
    "seeds", primary_table9, brief=brief_table9, paper_brief="SOMA lowest"),)
