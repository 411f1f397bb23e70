"""The paper's Figure 15 with Tables 12 and 13 (scaled down by SPEC 9.6): test loss against
inference cost for models of about equal total size, the monolith and SOMA at growing N.

Rows (`methods`, one per N, all zero-order): the monolith (N = 1) and SOMA N = 2, 8, ... whose
total parameters match the reference's (`match_params`; the reference is the largest N, width-32
experts sharing one frozen head as the paper's N = 256), each within `params_tolerance` of it,
checked before anything trains. Each row continues its width's equal-update seed run with its
state (N = 1 at the row's width on the one-shard data dir), trains on the corpus (`source`)
prepared into N shards under OUT/data_nN, and runs the operations of `budget` reference updates
(SPEC 7's count: one operations budget for every row, as table5). Then per row:
- Table 13: parameters, updates, training wall seconds and device-seconds (the seeds' apart),
  and the test loss of the routed top-min(4, N) mixture with its 95% document-bootstrap
  interval (per-window losses averaged over the optimisation seeds: one by default, as the
  paper's one run per setting);
- Table 12: complete warm inference of the first seed's model at each batch of
  `inference.batches` (`soma_jax.inference`: routing included where N > 1, compilation and
  warm-up excluded, the median of `inference.repeats`), at its fastest batch (the argmax of
  measured throughput): throughput in scored tokens/s, batch latency and peak memory;
- Figure 15 (fig15.png): test loss against inference operations per token (min(4, N) F_N,
  routing excluded) and against measured throughput, bars the 95% intervals.
Requests are the test split's evaluation pieces of route + score + 1 bytes, each counting its
`score` targets (the paper: 1,024-byte requests, 768 scored). Timings are this machine's: its
platform and the load average before and after the timing stage are recorded beside them.
The paper's numbers, and ours beside them in table.md and fig15.png: `fig15_report.py`.
"""

from __future__ import annotations

import dataclasses
import os
import platform

import jax
import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import inference, runs
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  driver,
  planning,
  recipes,
  report,
  scores,
  seeded,
  statistics,
  training,
)
from soma_jax.studies.fig15_report import PAPER, PAPER_ROWS, plot, table

PAPER_NS = (1, 2, 8, 256)  # the paper's rows; our largest N stands for its N = 256

FIELDS = {"params_tolerance": planning.positive(strict=False),
          "inference.repeats": planning.whole(1)}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig15 (the paper's Figure 15 with Tables 12 and 13): the monolith and SOMA at
  growing N of about equal total size, each continuing its width's seed run for one
  operations budget; test loss, complete warm inference and its cost per token.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig15,size=cpu --out=runs/fig15
  """
  c, a = recipes.paper_study(arg)
  size, cpu = a["size"], a["size"] == "cpu"
  c.seeds = a["seeds"] or 1  # the paper: one trained model per setting, bars over test documents
  # Every row's total size is the largest N's: SOMA N = 32 of width 32 sharing one frozen head
  # (the paper's N = 256 recipe), 1,061,888 parameters at size=cpu (the monolith is width 180,
  # N = 2 width 127, N = 8 width 61, each with its own delta-rule heads); every row runs the
  # operations of `budget` updates of the N = 32 row (150-188 updates each). At ~100 GFLOP/s,
  # the recorded table5 seeds trained at on 2 idle cores (60 under load): seeds 2.9e13 ops,
  # about 5 min (width 180's 1,000 updates 3 of them), rows 1.3e13, about 2 min, data,
  # compilation, scoring and timing about 3 min: about 10 min (15 at 60 GFLOP/s).
  c.budget = 150.0 if cpu else 3.0
  c.curve_points = 1  # each row's end is what the figure reads (start and end on validation)
  c.params_tolerance = 0.02 if cpu else 0.1  # |params - reference's| / reference's (tiny: 5.2%)
  c.update(recipes.corpus())
  c.inference = ml_collections.ConfigDict()  # complete warm inference (soma_jax/inference.py)
  c.inference.batches = (8, 32, 128) if cpu else (2, 8)  # requests per batch; the fastest wins
  c.inference.repeats = 7  # timed batches after the warm-up; medians (the paper's seven)
  lr = c.base_lr
  seed = c.seed_runs.soma_expert
  c.methods, c.rows, c.start, c.seed_runs = (ml_collections.ConfigDict() for _ in range(4))
  n_list = (1, 2, 8, 32) if cpu else (1, 2, 6)  # the paper's 1, 2, 8, 256 (tiny: 6 > 4)
  for n in n_list:
    name = "mono" if n == 1 else f"soma_n{n}"
    c.seed_runs[f"seed_{name}"] = ml_collections.ConfigDict(seed.to_dict())  # at its width
    c.methods[name] = recipes.recipe("soma.py", f"n={n},size={size}", size, lr)
    c.rows[name] = ("monolithic SPSA" if n == 1 else f"SOMA N = {n}") + ", equal total size"
    c.start[name] = f"seed_{name}"
  widest = c.methods[f"soma_n{n_list[-1]}"]  # width d_E: one head, the seed's, frozen, shared
  widest.model.shared_head, widest.opt.train_head = True, False
  widest.opt.weight_decay = 0.0  # the paper's width-32 recipe (wide controls: 1e-4)
  c.reference = f"soma_n{n_list[-1]}"  # every row's params match it; the budget: its updates
  c.order = tuple("mono" if n == 1 else f"soma_n{n}" for n in n_list)  # rows, growing N
  return c


@dataclasses.dataclass(frozen=True)
class Rows:
  """The study's own fields (`check`): the plan, each row's sized config and N, the timed
  batches and repetitions, the corpus."""
  plan: planning.StudyPlan
  methods: dict  # {name: training config at its matched width}, by growing N
  n_experts: dict  # {name: N}
  batches: tuple[int, ...]
  repeats: int
  source: str
  prepare: dict


def check_batches(batches: object) -> tuple[int, ...]:
  """inference.batches: whole numbers >= 1, growing strictly."""
  ok = (isinstance(batches, tuple | list) and len(batches) > 0
        and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in batches)
        and list(batches) == sorted(set(batches)))
  if not ok:
    raise UserError(f"inference.batches={batches!r} must be requests per batch, whole numbers "
                    ">= 1 growing strictly; fix: --config.inference.batches='(8, 32, 128)'")
  return tuple(batches)


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Rows:
  """The fields, one zero-order row per N, every row's total parameters within
  `params_tolerance` of the reference's after sizing."""
  planning.check_fields(config, FIELDS)
  if plan.unit != "updates" or not config.match_params:
    raise UserError(f"{STUDY.name}'s rows are of equal total size and run the operations of "
                    "`budget` reference updates; fix: --config.budget_unit=updates "
                    "--config.match_params=True")
  batches = check_batches(config.inference.batches)
  planning.check_source(config)
  methods = planning.sized(config)
  specs = {name: planning.resolved(c, f"methods.{name}.") for name, c in methods.items()}
  for name, spec in specs.items():
    gradient = spec.method.describe["gradient"]
    if gradient != "zero-order":
      raise UserError(f"methods.{name}: its gradient is {gradient!r}; fig15 compares the "
                      "zero-order rows (the monolith and SOMA)")
  by_n = sorted(specs.items(), key=lambda item: item[1].n_experts)
  ns = {name: spec.n_experts for name, spec in by_n}
  if len(set(ns.values())) != len(ns):
    raise UserError(f"methods must hold one row per N; have {ns}")
  check_sizes({n: s.method.ensemble_params for n, s in specs.items()}, plan.reference,
              config.params_tolerance)
  return Rows(plan, {name: methods[name] for name in ns}, ns, batches,  # rows by growing N
              config.inference.repeats, config.source, recipes.settings(config.get("prepare")))


def check_sizes(params: dict, reference: str, tolerance: float) -> None:
  """Every row's total parameters within `tolerance` (a fraction) of the reference's."""
  target = params[reference]
  far = {n: p for n, p in params.items() if abs(p - target) > tolerance * target}
  if far:
    raise UserError(f"rows {', '.join(f'{n} ({p:,})' for n, p in far.items())} differ from "
                    f"{reference}'s {target:,} parameters by more than params_tolerance="
                    f"{tolerance:g}; fix: --config.params_tolerance= a larger fraction, or "
                    "widths whose sizes match")


def stages(rows: Rows, ready: base.Setup) -> base.Stages:
  """Every row at every seed (one stage), each at the operations of `budget` reference
  updates; each row's test losses, then the timed inference of the first seed's models."""
  plan, seeds, out, sets = ready.plan, ready.seeds, ready.out, ready.data.sets
  ops_budget = plan.budget * ready.specs[plan.reference].total_ops_per_update
  planned = seeded.every_seed(ready, rows.methods, "ops", ops_budget)
  ran = yield from seeded.trained(planned, out)
  measured = {"rows": {}}
  for name in rows.methods:
    val, test = sets[rows.n_experts[name]]
    measured["rows"][name] = trained_row(plan, [r for r in ran if r.name == name],
                                         seeds[plan.start[name]], val, test, out)
  measured["inference"] = timed_rows(rows, {n: seeded.workdir(out, plan.seeds[0], n)
                                            for n in rows.methods},
                                     sets)
  return measured, ops_budget


def measure(rows: Rows, ready: base.Setup, gathered: tuple) -> dict:
  """The trained rows and their inference (measured in `stages`), the paper's rows beside."""
  measured, ops_budget = gathered
  plan = ready.plan
  measured["paper_rows"] = paper_rows(rows.n_experts)
  return {"budget": {"unit": "ops", "amount": ops_budget, "per": "row and seed",
                     "reference_updates": plan.budget, "seed_updates": plan.seed_updates},
          "paper": PAPER, "measured": measured,
          "how": "test: each row's routed top-min(4, N) mixture on its own data dir's router "
                 "(the same held-out documents for every N), per-window losses averaged over "
                 "seeds, 95% document bootstrap; inference: soma_jax.inference on the first "
                 "seed's model"}


def trained_row(plan: planning.StudyPlan, ran: list[seeded.Run], start: dict,
                val: eval_lib.TestSet, test: eval_lib.TestSet, out: str) -> dict:
  """One row after training (`ran`: its run at each seed): its size and costs, each seed's
  validation curve, updates and seconds, and the test loss of the seed-mean per-window losses
  with its 95% document-bootstrap interval (and at the start)."""
  spec = ran[0].spec
  first = training.start_step(spec, start)
  begin = scores.start_losses(spec, {"validation": val, "test": test})
  per_seed, ends = [], []
  for run in ran:
    points, _ = seeded.curve(run, start, val, begin["validation"].mean())
    ends.append(scores.final_losses(run.workdir, run.spec, test))
    per_seed.append(seeded.record(run, out, curve=points,
                                  **scores.summary(run.workdir, run.spec, first),
                                  test_nats_per_byte=float(ends[-1].mean())))
  draws, boot_seed = plan.bootstrap_draws, plan.seeds[0]
  c = spec.config
  return {"n_experts": spec.n_experts, "d_t": c.model.d_t, "shared_head": spec.shared_head,
          "train_head": c.opt.train_head, "method": spec.method.name,
          "params": spec.method.ensemble_params, "flops_per_token": spec.method.flops_per_token,
          "ops_per_update": spec.total_ops_per_update, "lr": spec.lr, "eps": spec.eps,
          "start": training.start_of(start), "per_seed": per_seed,
          "updates": statistics.across_seeds([q["updates"] for q in per_seed]),
          **{k: statistics.across_seeds([q[k] for q in per_seed])
             for k in ("update_seconds", "device_seconds", "cpu_seconds")},
          "start_test": eval_lib.summary(begin["test"], test.doc_ids, draws, boot_seed),
          "test": eval_lib.summary(np.mean(ends, axis=0), test.doc_ids, draws, boot_seed),
          "test_sd_across_seeds": statistics.across_seeds(
              [q["test_nats_per_byte"] for q in per_seed])["sd"]}


def timed_rows(rows: Rows, workdirs: dict, scored: dict) -> dict:
  """Each row's complete warm inference (`inference.time_batches`) on its test requests, one
  row after another in this process, with the machine and its load around the stage."""
  load = list(os.getloadavg())
  timed = {}
  for name, workdir in workdirs.items():
    test = scored[rows.n_experts[name]][1]
    body, head, method = runs.restore_params(workdir)
    model = inference.Ensemble(body, head, rows.n_experts[name], method.model.shared_head,
                               method.logits, test.router, method.flops_per_token)
    print(f"[fig15] timing {name}: batches {rows.batches}, {rows.repeats} repeats", flush=True)
    timed[name] = inference.time_batches(model, test.windows, test.route, rows.batches,
                                         rows.repeats)
  return {"rows": timed, "load_average": {"start": load, "end": list(os.getloadavg())},
          "machine": {"platform": platform.platform(), "processor": platform.processor(),
                      "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
                      "devices": [str(d) for d in jax.devices()]},
          "tokens": "scored targets per request (route + score + 1 bytes, `score` counted)",
          "peak": "planned_peak_bytes: XLA's plan of the largest scoring program plus the "
                  "host mixture arrays; rss_peak_rise_bytes and device_peak_bytes_in_use as "
                  "measured (soma_jax.inference)"}


def paper_rows(n_experts: dict) -> dict:
  """{row: the paper's N it stands for}: the same N, else the largest N for the paper's
  N = 256; rows with neither are absent."""
  largest = max(n_experts, key=n_experts.get)
  out = {}
  for name, n in n_experts.items():
    if n in PAPER_NS:
      out[name] = n
    elif name == largest and PAPER_NS[-1] not in n_experts.values():
      out[name] = PAPER_NS[-1]
  return out


STUDY = base.Study(name="fig15",
                   spec="paper Figure 15 with Tables 12 and 13 (equal-size inference), scaled "
                        "down by SPEC 9.6", config=config, check=check, stages=stages,
                   measure=measure, table=table, data=driver.per_n(),
                   plot=report.png(plot, "fig15.png"), ops_tolerance=base.any_ops,
                   paper_rows=PAPER_ROWS)
