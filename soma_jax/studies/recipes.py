"""The configs the studies share (SPEC 9.6), each study's own `config(arg)` built on them: the
training recipes of experiments/configs/ (soma.py, bptt.py, eggroll.py, seed.py) at the
comparisons' CPU scale, the seeds, budgets, grids and statistics every comparison sets, and
the two bases every comparison starts from (`pair`: Table 7's SOMA N = 2 against the
monolith; `allocation`: Table 4's rows).

CPU scale: SOMA N = 2 experts of width 32 with their own delta-rule heads, n_pert = 4 on
B = 4 windows of T = 256 bytes per expert per update; the monolith of the same total size
is width 47. T = 256 < 1024, so the evaluation routes on the first 64 bytes of each
257-byte piece of a 1,025-byte window and scores the next 192 targets (the paper: 256 and
768 on the whole window); both are printed with every table. Every method is a complete
training config from its own config file, so any field can be changed, e.g.
--config.methods.bptt.opt.lr=1e-3 or --config.budget=2000.
"""

from __future__ import annotations

import os

import ml_collections

from soma_jax.config import load_config_file, parse_arg
from soma_jax.errors import UserError

# experiments/configs/, where the training recipes live (read by path: the library imports
# nothing from experiments/)
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "experiments", "configs")
SIZES = ("cpu", "tiny")


def method(file: str, arg: str) -> ml_collections.ConfigDict:
  """get_config(arg) of a training recipe in experiments/configs/ (soma.py, bptt.py, ...)."""
  return load_config_file(os.path.join(CONFIGS, file), arg)


def args(arg: str | None, **defaults) -> dict:
  """A study's config arguments (study=NAME,size=cpu|tiny and its own `defaults`), the size
  checked."""
  a = parse_arg(arg, study="", size="cpu", **defaults)
  if a["size"] not in SIZES:
    raise UserError(f"compare.py:study={a['study']},size={a['size']}: use size=cpu or tiny")
  return a


def scale(c: ml_collections.ConfigDict, size: str, lr: float, mult: int = 1
          ) -> ml_collections.ConfigDict:
  """The study's shared scale: T, B, heads and Adam settings of an LSTM method, and `mult`
  times SOMA's n_pert directions per update."""
  if size == "cpu":
    c.model.update(d_t=32, shared_head=False)  # width of SOMA's experts (others: matched)
    c.spsa.update(n_pert=4 * mult, batch=4, time_block=256)
    c.data.update(seq_len=256, val_windows=16)
  c.opt.update(lr=lr, weight_decay=1e-4)  # the paper's wide controls' coupled decay
  c.spsa.eps = lr  # eps tied to lr, as the paper's wide controls start
  c.opt.train_head = True  # every LSTM here has its own delta-rule head (SPEC 3.2)
  c.update(log_every=100, eval_every=250)
  return c


def recipe(file: str, arg: str, size: str, lr: float, mult: int = 1) -> ml_collections.ConfigDict:
  """A training recipe at the study's scale: `scale(method(file, arg), ...)`."""
  return scale(method(file, arg), size, lr, mult)


def copy(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(c.to_dict())


def plan(cpu: bool, unit: str, budget: float, search: bool) -> dict:
  """The study's seeds, budgets, tuning grids (`search`: Table 7's lr-then-eps grid) and
  statistics (SPEC 9.6), as fields."""
  return {
      "seeds": 5 if cpu else 2,  # optimisation seeds: they change the batches and the directions
      # seeds first_seed .. first_seed + seeds - 1; seed s also seeds its bootstrap
      "first_seed": 0,
      # The budget of each row (table4) or configuration (table7) and seed, in budget_unit:
      # "updates" (where the compared methods do equal operations per update, table7's pair),
      # "ops" (SPEC 7's training operations: table4 at size=cpu, since two busy processes moved
      # a 40 s cpu_seconds budget by -12.8% and device_seconds by -53.5%:
      # docs/results/budget_load.json), "cpu_seconds" (the process's CPU time in training
      # updates), "device_seconds" (SPEC 7), or "auto" (cpu_seconds on a CPU, device_seconds
      # elsewhere). Never wall time (SPEC 9.6).
      "budget_unit": unit if cpu else "updates",
      # table4's 1.6e12 ops: 1,193 of SOMA N = 2's updates, 75 of the monolith's with 64
      # directions. Refused where planning.MAX_UPDATES (10,000,000 steps) would end a run
      # first: in updates or ops exactly; in seconds above 10,000,000 updates at 1 s each
      # (planning.SLOW_UPDATE_SECONDS).
      "budget": float(budget if cpu else 3),
      # table7 in updates: ops per update may differ by this fraction (tiny's widths are 4% apart)
      "ops_tolerance": 0.02 if cpu else 0.05,
      "seed_updates": 1000 if cpu else 3,  # every seed run's updates (SPEC 3.4: about 1,000)
      "seed_run_seed": 1000,  # the seed runs' data and direction seed: no optimisation seed
      "curve_points": 4,  # checkpoints after each quarter of the budget, scored for the curve
      "match_params": True,  # every other method's width matches `reference`'s total params
      "reference": "soma_n2",  # the method others are sized to and differences are taken from
      "bootstrap_draws": 10_000 if cpu else 200,  # paired document bootstrap draws
      "base_lr": 0.0025,  # every method's lr and initial eps; table7's grids are multiples of it
      **(grid(cpu) if search else {}),
  }


def grid(cpu: bool) -> dict:
  """Table 7's lr-then-eps search (`table7.Grid`), as fields."""
  return {
      # stage 1: lr = f x base_lr at eps = base_lr; while the best lr is at an edge, one more
      # factor of 2 past it, at most lr_extend times (an lr still at the edge is flagged)
      "lr_factors": (0.25, 0.5, 1.0, 2.0, 4.0) if cpu else (0.5, 1.0, 2.0),
      "lr_extend": 2 if cpu else 1,
      "eps_factors": (0.5, 1.0, 2.0),  # stage 2: eps = f x base_lr at the selected lr
      # ... grown past an edge as the lr grid, at most this many times (0 at size=cpu: the
      # recorded Table 7 and ladder runs did not grow it; eps sat at an edge in 8 of 10
      # searches)
      "eps_extend": 0 if cpu else 1,
  }


def _base(study: str, size: str, unit: str, budget: float, search: bool
          ) -> ml_collections.ConfigDict:
  """Every comparison's fields and its reference row, SOMA N = 2 (`soma_n2`)."""
  cpu = size == "cpu"
  c = ml_collections.ConfigDict()
  c.study = study
  c.data_dir = ""  # a prepared data dir with 2 shards; "" = prepare pystdlib under OUT/data
  c.update(plan(cpu, unit, budget, search))
  c.eval = ml_collections.ConfigDict()
  c.eval.route_bytes = 64 if cpu else 8  # the router sees this many leading bytes
  c.eval.score_bytes = 192 if cpu else 24  # the loss is over the next this many targets
  # The first this many 1,025-byte windows of each split (0 = all), each cut into pieces.
  c.eval.val_windows = 128 if cpu else 4  # ensemble validation: selection and curves
  c.eval.test_windows = 0 if cpu else 4  # test
  c.methods = ml_collections.ConfigDict()
  c.rows = ml_collections.ConfigDict()  # what each row stands for in the paper's table
  c.start = ml_collections.ConfigDict()  # the seed run each method starts from
  c.methods.soma_n2 = recipe("soma.py", f"n=2,size={size}", size, c.base_lr)
  c.rows.soma_n2 = "SOMA N = 2, own delta-rule heads (paper: width 361, n_pert 64, B 64)"
  c.start.soma_n2 = "soma_expert"
  return c


def mono(size: str, lr: float, k: int, mult: int) -> ml_collections.ConfigDict:
  """The monolith with `mult` times SOMA's k directions per update."""
  return recipe("soma.py", f"mono={k * mult},size={size}", size, lr, mult)


def _finish(c: ml_collections.ConfigDict, size: str, match: dict, fresh: tuple,
            gru: bool) -> ml_collections.ConfigDict:
  c.order = tuple(n for n in ("soma_n2", "mono", "mono_k4", "mono_k16", "mono_k64", "eggroll",
                              "bptt", "head_only", "soma_n2_summed") if n in c.methods)  # rows
  # Controls run the reference's number of updates in each seed, not the time budget.
  c.match_updates = ml_collections.ConfigDict(match)
  # Methods that take their seed's parameters only, with fresh Adam moments, plateau state and
  # step counter: BPTT, whose gradients are about d / n times smaller per coordinate than
  # SPSA's estimates, so the SPSA seed's second moments would damp its first updates ~100x.
  c.fresh_optimizer = fresh
  c.seed_runs = seed_runs(size, c.base_lr, gru)
  return c


def pair(study: str, size: str, search: bool = True) -> ml_collections.ConfigDict:
  """Table 7's comparison (SPEC 9.2): SOMA N = 2 against the monolith of the same total size,
  budget in updates (1,000 per configuration at size=cpu: equal operations per update)."""
  c = _base(study, size, "updates", 1000, search)
  c.methods.mono = mono(size, c.base_lr, c.methods.soma_n2.spsa.n_pert, 1)
  c.rows.mono = "monolith of the same total size, SOMA's directions and batch (paper: width 509)"
  c.start.mono = "monolith"
  return _finish(c, size, {}, (), gru=False)


def allocation(study: str, size: str, search: bool = True, controls: bool = True
               ) -> ml_collections.ConfigDict:
  """Table 4's rows (SPEC 9.1) in SPEC 7's operations (1.6e12 per row and seed at size=cpu):
  SOMA N = 2, monoliths at 1x / 4x / 16x SOMA's directions, and with `controls` EGGROLL, BPTT
  and the head-only and summed-loss controls."""
  c = _base(study, size, "ops", 1.6e12, search)
  lr, k = c.base_lr, c.methods.soma_n2.spsa.n_pert
  table = {f"mono_k{k * mult}": (mono(size, lr, k, mult), f"monolithic SPSA, {mult}x SOMA's "
                                 f"directions on SOMA's batch (paper: {paper})", "monolith")
           for mult, paper in ((1, 64), (4, 256), (16, 1024))}
  if controls:
    table |= _controls(size, lr)
  for name, (cfg, what, seed) in table.items():
    c.methods[name], c.rows[name], c.start[name] = cfg, what, seed
  if not controls:
    return _finish(c, size, {}, (), gru=False)
  return _finish(c, size, {"head_only": "soma_n2", "soma_n2_summed": "soma_n2"}, ("bptt",),
                 gru=True)


def eggroll(size: str) -> ml_collections.ConfigDict:
  """Table 4's EGGROLL row at the study's scale (its GRU seed run is the same recipe)."""
  egg = method("eggroll.py", f"n=1,size={size}")
  egg.opt.lr = 0.01  # ES on a GRU: larger steps (the paper's recorded lr alpha = 0.01)
  if size == "cpu":
    egg.eggroll.update(pop=32, pop_chunk=32)  # 128 members ran 1 update/s here
    # sigma 2^-3: what the recorded run (docs/results/compare_table4_cpu.json) took from
    # eggroll.py's cpu preset before its sweep (population 8,192, not 32) moved it to 0.25
    egg.eggroll.sigma = 2**-3
    egg.spsa.batch, egg.data.seq_len = 4, 256  # SOMA's windows
    egg.data.val_windows = 16
  return egg


def _controls(size: str, lr: float) -> dict:
  """Table 4's rows beside SOMA and the monoliths: EGGROLL, BPTT, two controls, as
  {name: (training config, what it is, the seed run it starts from)}."""
  cpu = size == "cpu"
  egg = eggroll(size)
  bptt = method("bptt.py", f"n=1,size={size}")  # backprop + Adam at bptt.py's lr
  if cpu:
    bptt.model.shared_head = False
    bptt.spsa.batch, bptt.data.seq_len, bptt.data.val_windows = 4, 256, 16
  head_only = recipe("soma.py", f"n=2,size={size}", size, lr)
  head_only.method = "head_only"  # bodies frozen, the delta rule on each head
  summed = recipe("soma.py", f"n=2,size={size}", size, lr)
  summed.method = "soma_summed"  # the N losses summed before each difference
  return {
      "eggroll": (egg, "EGGROLL: 6-layer GRU, untied head, rank-1 ES (paper: pop 2^20, B 256)",
                  "gru"),
      "bptt": (bptt, "BPTT: one LSTM of the same size, backprop + Adam", "monolith"),
      "head_only": (head_only, "control: SOMA N = 2 with frozen bodies, only the delta-rule "
                    "heads train", "soma_expert"),
      "soma_n2_summed": (summed, "control: SOMA N = 2 with the N losses summed before each "
                         "difference", "soma_expert"),
  }


def seed_run(size: str, lr: float) -> ml_collections.ConfigDict:
  """A seed run (SPEC 3.4 step 1) at the study's scale; its width comes from the methods
  that start from it."""
  seed = recipe("seed.py", f"size={size}", size, lr)
  seed.opt.weight_decay = 0.0
  return seed


def seed_runs(size: str, lr: float, gru: bool = False) -> ml_collections.ConfigDict:
  """Seed runs (SPEC 3.4 step 1): one per architecture, each for seed_updates updates; their
  width comes from the methods that start from them (`gru`: EGGROLL's GRU, Table 4's)."""
  seed = seed_run(size, lr)
  runs = ml_collections.ConfigDict()
  runs.soma_expert = seed  # N = 1 at the width of one SOMA expert
  runs.monolith = copy(seed)  # at the monolith's width
  if gru:
    runs.gru = copy(eggroll(size))  # EGGROLL's recipe (`eggroll`)
  return runs


def rows(c: ml_collections.ConfigDict, table: dict) -> ml_collections.ConfigDict:
  """c.methods, c.rows and c.start from {name: (training config, what it is, seed run)}; c."""
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for name, (cfg, what, seed) in table.items():
    c.methods[name], c.rows[name], c.start[name] = cfg, what, seed
  return c


def paper_study(arg: str | None, **defaults) -> tuple[ml_collections.ConfigDict, dict]:
  """The shared start of the paper-item studies: Table 7's pair at the argument's size (its
  seeds, scoring and statistics) without its lr / eps search; (config, arguments)."""
  a = args(arg, seeds=0, **defaults)
  return pair(a["study"], a["size"], search=False), a


def corpus(source: str = "pystdlib") -> ml_collections.ConfigDict:
  """The corpus fields of a study whose rows differ in N (`c.update(corpus())`): `source`, the
  corpus each N's data dir is prepared from under OUT, and `prepare`, prepare.prepare's keyword
  settings (tests)."""
  return ml_collections.ConfigDict({"source": source, "prepare": ml_collections.ConfigDict()})


def settings(section) -> dict:
  """A config section (e.g. `config.get("prepare")`) as a plain dict; None as {}."""
  return dict((section or {}).items())
