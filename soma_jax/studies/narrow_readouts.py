"""study=narrow's readouts (SPEC 9.8): end-loss contrasts at declared budgets with seeds and
documents in their intervals, their slope against log2 budget, the verdict rule, and the
mechanism (SOMA's per-update edge D(u) against the single model's gain per doubling G(u)).

Every function takes per-seed records of `narrow.py` (`per_seed`: {seed, val_curve, test,
_test_w, experts_alone}) and returns plain dicts for results.json; none trains or scores.
`read` gathers them as the config declared.
"""

from __future__ import annotations

import math

import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.studies import planning, statistics


def contrast(rows: dict, b: str, a: str, fraction: float, doc_ids: np.ndarray, draws: int,
             kind: str = "seeds_own_starts") -> dict:
  """b's test end loss minus a's at one declared budget `fraction`, per seed and across seeds:
  the t interval over seeds widened by the test documents' bootstrap variance of the seed mean
  (`statistics.difference_effect`), and the seeds-only t interval beside it. `kind`: what the
  seeds' interval holds (`planning.interval_kind`), recorded as `interval`."""
  key = fraction_key(fraction)
  pairs = list(zip(rows[b]["per_seed"], rows[a]["per_seed"], strict=True))
  diff_SxN = np.stack([np.asarray(y["_test_w"][key], np.float64)
                       - np.asarray(x["_test_w"][key], np.float64) for y, x in pairs])
  values = [float(d.mean()) for d in diff_SxN]
  return {"budget_fraction": fraction, "interval": f"{kind} + test documents",
          **statistics.difference_effect(values, diff_SxN, doc_ids, draws,
                                         int(pairs[0][1]["seed"])),
          "seeds_only_ci95": statistics.t_interval(values)["ci95"]}


def fraction_key(fraction: float) -> str:
  """A declared budget's key in results.json ('0.0625')."""
  return f"{fraction:.6g}"


def slope(by_fraction: list[dict], ops_budget: float, kind: str = "seeds_own_starts") -> dict:
  """The least-squares slope of a contrast against log2 of the budget in operations, per seed
  over its declared budgets, and the t interval over the per-seed slopes (seeds only); its
  `trend`: grows / shrinks where the interval excludes zero, else a null with its bound."""
  x = np.log2([c["budget_fraction"] * ops_budget for c in by_fraction])
  y_SxF = np.array([c["per_seed"] for c in by_fraction], np.float64).T
  per_seed = [float(np.polyfit(x, y, 1)[0]) for y in y_SxF]
  stat = statistics.t_interval(per_seed)
  lo, hi = stat["ci95"] or (None, None)
  trend = ("grows" if lo is not None and lo > 0 else "shrinks" if hi is not None and hi < 0
           else "no measurable trend" + ("" if lo is None else
                                         f", within +-{max(abs(lo), abs(hi)):.3g} per doubling"))
  return {**stat, "interval": kind, "trend": trend, "per_seed": per_seed,
          "budget_fractions": [c["budget_fraction"] for c in by_fraction],
          "unit": "nats/byte per doubling of the budget",
          "how": "per seed the least-squares slope over the declared budgets; t interval over "
                 "the per-seed slopes (seeds, starts included; the documents' noise is not in it)"}


def verdict(stat: dict) -> dict:
  """SPEC 9.8's rule on a primary interval in the paper's direction (> 0: SOMA lower):
  reproduces / contradicts when it excludes zero, else unresolved, a null with its bound."""
  ci = stat.get("ci95")
  if ci is None:
    return {"verdict": "unresolved", "why": "one seed: no interval"}
  lo, hi = ci
  if lo > 0:
    return {"verdict": "reproduces", "why": "the interval excludes zero in the paper's direction"}
  if hi < 0:
    return {"verdict": "contradicts", "why": "the interval excludes zero the other way"}
  bound = max(abs(lo), abs(hi))
  return {"verdict": "unresolved", "bound": bound,
          "why": f"no measurable difference, within +-{bound:.3g} (the interval holds zero)"}


def read(n, plan: planning.StudyPlan, rows: dict, test: eval_lib.TestSet, ops: float) -> dict:
  """Primary and secondary readouts as `n` (`narrow.Narrow`) declares them, the primary first
  in their declared order; `ops`: the budget in operations (the slopes' x)."""
  primary, secondary = {}, {"contrasts": {}, "slopes": {}}
  kind = planning.interval_kind(plan)["kind"]
  for name in [*n.primary, *(c for c in n.contrasts if c not in n.primary)]:
    b, a = n.contrasts[name]
    common = [f for f in n.declared(a) if f in n.declared(b)]
    at = [contrast(rows, b, a, f, test.doc_ids, plan.bootstrap_draws, kind) for f in common]
    per = {fraction_key(c["budget_fraction"]): c for c in at}
    trend = slope(at, ops, kind) if len(at) > 1 else None
    if name in n.primary:
      primary[name] = {"b": b, "a": a, "end_loss_difference": {
          k: {**c, **verdict(c)} for k, c in per.items()}}
    else:
      secondary["contrasts"][name] = {"b": b, "a": a, "end_loss_difference": per}
    if trend is not None and name in n.primary_slopes:
      primary.setdefault(name, {"b": b, "a": a})["slope"] = {**trend, **verdict(trend)}
    elif trend is not None:
      secondary["slopes"][name] = trend
  b, a = n.mechanism
  secondary["mechanism"] = mechanism(rows, b, a)
  if "experts_alone" in rows[a]["per_seed"][0]:
    secondary["experts_alone"] = experts_alone(rows, a, b)
  same = [k for k, pair in n.contrasts.items() if pair == (b, a) and k in primary]
  last = primary[same[0]].get("end_loss_difference", {}) if same else {}
  mech = secondary["mechanism"]["points"]
  if last and mech:
    end = last[max(last, key=float)]["mean"]
    secondary["mechanism"]["agrees_with_primary"] = bool(
        np.sign(mech[-1]["D_minus_G"]["mean"]) == np.sign(end))
  return {"primary": primary, "secondary": secondary}


# ----------------------------------------------------------------------------- mechanism


def _curve(record: dict) -> tuple[np.ndarray, np.ndarray]:
  """(updates, validation loss) of a run's checkpoints after its start."""
  pts = [p for p in record["val_curve"] if p["update"] > 0]
  return (np.array([p["update"] for p in pts], np.float64),
          np.array([p["loss"] for p in pts], np.float64))


def _at(curve: tuple[np.ndarray, np.ndarray], u: float) -> float | None:
  """The curve's loss at update u, linear in log2 updates between checkpoints (None outside)."""
  us, loss = curve
  if not us[0] <= u <= us[-1]:
    return None
  return float(np.interp(math.log2(u), np.log2(us), loss))


def mechanism(rows: dict, b: str, a: str) -> dict:
  """At each of a's checkpoint updates u where b's curve covers u and 2u: D(u) = b(u) - a(u)
  (a's per-update edge, equal updates) and G(u) = b(u) - b(2u) (b's gain per doubling), on
  validation, per seed and across seeds (t intervals). D - G = b(2u) - a(u): at N = 2
  against N = 1 of its width, the equal-operations gap. `crossing`: the u where the seed mean
  of D - G changes sign (linear in log2 u), None where it does not."""
  points = []
  for ra, rb in zip(rows[a]["per_seed"], rows[b]["per_seed"], strict=True):
    ca, cb = _curve(ra), _curve(rb)
    for u, la in zip(*ca, strict=True):
      lb, lb2 = _at(cb, u), _at(cb, 2 * u)
      if lb is not None and lb2 is not None:
        points.append((float(u), lb - la, lb - lb2))
  table = []
  for u in sorted({p[0] for p in points}):
    got = [p for p in points if p[0] == u]
    if len(got) != len(rows[a]["per_seed"]):
      continue  # a seed whose curve does not reach u and 2u there
    d, g = [p[1] for p in got], [p[2] for p in got]
    table.append({"update": u, "D": statistics.t_interval(d), "G": statistics.t_interval(g),
                  "D_minus_G": statistics.t_interval([x - y for x, y in zip(d, g, strict=True)])})
  return {"a": a, "b": b, "points": table, "crossing_update": crossing(table),
          "interval": "t over seeds, validation (no documents' noise)",
          "how": f"D(u) = {b}(u) - {a}(u) at equal updates, G(u) = {b}(u) - {b}(2u), on the "
                 "validation curves (linear in log2 updates between checkpoints); D - G = "
                 f"{b}(2u) - {a}(u); t intervals over seeds"}


def crossing(table: list[dict]) -> float | None:
  """The update where the seed mean of D - G first changes sign (log2-linear), else None."""
  for p, q in zip(table, table[1:], strict=False):
    x, y = p["D_minus_G"]["mean"], q["D_minus_G"]["mean"]
    if x == 0:
      return p["update"]
    if x * y < 0:
      t = x / (x - y)
      return float(2 ** (math.log2(p["update"]) + t * (math.log2(q["update"])
                                                        - math.log2(p["update"]))))
  return None


def experts_alone(rows: dict, soma: str, one: str) -> list[dict]:
  """At each of SOMA's checkpoints u: the mixture's validation loss, each expert's alone
  (scored on every window), the ensemble gain (experts' mean alone minus the mixture) and
  the per-expert progress edge (one(u) minus the experts' mean alone), t intervals over
  seeds; the two add up to D(u) = one(u) - soma(u)."""
  out = []
  seeds = list(zip(rows[soma]["per_seed"], rows[one]["per_seed"], strict=True))
  for i, point in enumerate(seeds[0][0]["experts_alone"]):
    mix, alone, gain, edge = [], [], [], []
    for rs, ro in seeds:
      p = rs["experts_alone"][i]
      lo = _at(_curve(ro), p["update"]) if p["update"] > 0 else None
      mix.append(p["mixture"])
      alone.append(float(np.mean(p["experts"])))
      gain.append(alone[-1] - mix[-1])
      if lo is not None:
        edge.append(lo - alone[-1])
    out.append({"update": point["update"], "mixture": statistics.t_interval(mix),
                "experts_alone_mean": statistics.t_interval(alone),
                "each_expert": [statistics.across_seeds([s[0]["experts_alone"][i]["experts"][e]
                                                       for s in seeds])
                                for e in range(len(point["experts"]))],
                "ensemble_gain": statistics.t_interval(gain),
                "per_expert_edge": statistics.t_interval(edge) if len(edge) == len(seeds)
                else None})
  return out
