"""The paper's figures and tables against ours: one row per item (the paper's Figures 7-17 and
Tables 1-13, and the main-text items reproduced here), with its command, our CPU-scale cell read
from the committed JSON, the paper's value transcribed from its text, what differs, and a
verdict computed from the row's primary intervals by SPEC 9.8's rule (`verdict.py`). A row
without a primary interval (a setting, a count, one seed) says why and carries no verdict; a
row whose protocol differs in a way that decides the reading says which.

Each compare.py study carries its own rows (`base.Study.paper_rows`, bound to its registered
name by `paper.StudyRow.bind`); the rows below are those no study runs (Figure 4, the variance
studies, the scaling benchmark, the settings and the counts). ROWS is both, in the paper's
order. `scripts/paper_table.py` renders ROWS into README (compact) and docs/reproducing.md
(full).
"""

from __future__ import annotations

import math

from soma_jax.studies import compare
from soma_jax.studies.paper import Row, load, show
from soma_jax.studies.verdict import Interval, t_interval


def figure4_primary() -> tuple[Interval, ...]:
  s = load("independent_vs_summed_cpu")["results"]["summary"]
  mean, lo, hi = t_interval(s["diff_per_seed"])
  return (Interval("summed − independent", mean, lo, hi, how="t over seeds"),)


def figure4() -> str:
  s = load("independent_vs_summed_cpu")["results"]["summary"]
  (iv,) = figure4_primary()
  return (f"summed − independent test loss {show(iv)} (t over {s['num_seeds']} seeds; sd "
          f"{s['diff_std']:.3f}; {s['updates']} updates)")


def _ratio(name: str, ratio: float, log_se: float, how: str) -> Interval:
  """A ratio's 95% interval from the standard error of its log (null 1)."""
  return Interval(name, ratio, ratio * math.exp(-1.96 * log_se), ratio * math.exp(1.96 * log_se),
                  null=1.0, how=how)


def figure10_primary() -> tuple[Interval, ...]:
  r = load("variance_experts_trained")["results"]
  first, last = r["variance_by_n"][0], r["variance_by_n"][-1]
  se = math.hypot(first["se"] / first["measured"], last["se"] / last["measured"])
  return (_ratio(f"variance N = {first['n']} / N = {last['n']}", r["first_over_last"], se,
                 "normal on the log, from the two SEs"),)


def figure10() -> str:
  r = load("variance_experts_trained")["results"]
  n = load("variance_trained_n_pert")["results"]
  (iv,) = figure10_primary()
  return (f"N = 8 {r['first_over_last']:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] lower than N = 1 "
          f"(predicted {r['predicted_first_over_last']:.2f}x); n_pert log-log slope "
          f"{n['slope_loglog']:.3f}")


def figure11_primary() -> tuple[Interval, ...]:
  r = load("variance_trained_shared_vs_separate")["results"]
  x, se = r["ratio_separate_vs_shared"], r["ratio_separate_vs_shared_se"]
  return (Interval("error summed / separate", x, x - 1.96 * se, x + 1.96 * se, null=1.0,
                   how="normal, +-1.96 SE over repeats"),)


def figure11() -> str:
  r = load("variance_trained_shared_vs_separate")["results"]
  return (f"separate losses {r['ratio_separate_vs_shared']:.2f} ± "
          f"{r['ratio_separate_vs_shared_se']:.2f}x (SE) lower error than one summed loss at N = 4 "
          f"(predicted {1 / r['predicted_separate_over_shared']:.2f}x)")


def figure12() -> str:
  runs = load("scaling")["results"]["runs"]
  return (f"FSO: {max(r['devices'] for r in runs)} devices, "
          f"{sum(r['collectives']['total'] for r in runs)} collectives in the compiled steps")


def table1() -> str:
  e = load("table7_cpu_seeds1")["eval"]
  return (f"route {e['route_bytes']} / score {e['score_bytes']} bytes of T = 256 pieces; "
          f"{e['val_windows_scored']} validation windows from {e['val_documents']} documents, "
          f"{e['test_windows_scored']} test windows from {e['test_documents']}")


def table1_brief() -> str:
  return "{val_windows_scored} validation windows, {test_windows_scored} test".format(
      **load("table7_cpu_seeds1")["eval"])


def table2() -> str:
  rows = load("sizing")["results"]
  return "; ".join(f"N = {r['n']}: width {r['d_t']}, {r['ensemble_params'] / 1e6:.2f}M"
                   for r in rows)


# The rows whose command is not a compare.py study.
OTHER_ROWS = [
    Row("Figure 4", "independent against summed expert losses", "python experiments/"
        "independent_vs_summed.py --config=experiments/configs/independent_vs_summed.py:cpu",
        figure4, "0.035 (0.0362, 0.0339, 0.0353)", "width 32, 49 test documents (paper 4,096)",
        ("independent_vs_summed_cpu",), figure4_primary, paper_brief="+0.035, 3 seeds"),
    Row("Figure 10", "estimator variance against N and n_pert", "python experiments/"
        "variance.py --config=experiments/configs/variance.py:experts,size=trained",
        figure10, "N = 256 118x lower than N = 1; doubling n_pert halves it", "500k params, "
        "N up to 8", ("variance_experts_trained", "variance_trained_n_pert"), figure10_primary,
        paper_brief="118x at N = 256"),
    Row("Figure 11", "separate against shared losses at equal work", "python experiments/"
        "variance.py --config=experiments/configs/variance.py:shared_vs_separate,size=trained",
        figure11, "4.02x (predicted 4.00x)", "trained width-32 N = 8 after 2,000 updates",
        ("variance_trained_shared_vs_separate",), figure11_primary, paper_brief="4.02x"),
    Row("Figure 12", "DDPP (directions over devices) and FSO (experts over devices)",
        "python -m benchmarks.scaling", figure12, "a diagram: FSO exchanges no per-step "
        "updates", "fake CPU devices on 2 cores", ("scaling",), brief=figure12,
        paper_brief="a diagram", no_verdict="a diagram; a count of collectives"),
    Row("Table 1", "settings and evaluation sets", "python -m scripts.study_settings", table1,
        "T = 1,024; route 256 / score 768; 976 validation windows from 202 documents, 4,096 "
        "test windows", "T = 256 pieces of each 1,025-byte window", ("table7_cpu_seeds1",),
        brief=table1_brief, paper_brief="976 / 4,096 windows", no_verdict="settings"),
    Row("Table 2", "parameter counts", "python -m soma_jax.sizing --table", table2,
        "509 / 361 / 181 / 32: 8.33M / 8.41M / 8.55M / 8.44M", "none: the same counts",
        ("sizing",), brief="the same counts", paper_brief="8.33M-8.55M",
        no_verdict="counts, computed"),
]


def paper_order(row: Row) -> tuple[bool, int]:
  """Figures before tables, each by its number (a row's first item): the paper's order."""
  kind, number = row.item.split(",")[0].split()
  return kind == "Table", int(number)


def study_rows() -> list[Row]:
  """Every registered study's rows, bound to its name in compare.STUDIES."""
  return [r.bind(name) for name, study in compare.STUDIES.items() for r in study.paper_rows]


ROWS = sorted(OTHER_ROWS + study_rows(), key=paper_order)
