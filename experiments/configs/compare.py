"""The paper's comparisons (SPEC 9) at small scale, by SPEC 9.6: equal-update seeds continued
with their optimizer state, budgets the machine's load cannot move, the compared phase's gains.

  python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7

Arguments: study (table4: SPEC 9.1, the allocation rows and two controls; table7: SPEC 9.2,
SOMA N = 2 against the monolith with equal tuning) and size (cpu: 5 optimisation seeds,
1,000-update seeds; tiny: tests). Budgets at size=cpu: table7 in updates (1,000 per
configuration: the two architectures do equal operations per update), table4 in SPEC 7's
operations (1.6e12 per row and seed, on a CPU and a GPU alike: its rows differ in cost per
update); at size=tiny both in updates (3). A budget the 10,000,000-update step cap would cut
off is refused before anything trains. Every method is a complete training config from
its own config file (soma.py, eggroll.py, bptt.py, seed.py), so any field can be changed,
e.g. --config.methods.bptt.opt.lr=1e-3 or --config.budget=2000.

CPU scale: SOMA N = 2 experts of width 32 with their own delta-rule heads, n_pert = 4 on
B = 4 windows of T = 256 bytes per expert per update; the monolith of the same total size
is width 47. T = 256 < 1024, so the evaluation routes on the first 64 bytes of each
257-byte piece of a 1,025-byte window and scores the next 192 targets (the paper: 256 and
768 on the whole window); both are printed with every table.
"""

import os
import re

import ml_collections

from soma_jax.config import load_config_file, parse_arg
from soma_jax.errors import UserError
from soma_jax.studies.compare import STUDIES  # the one list of compare.py's studies


def _method(file: str, arg: str) -> ml_collections.ConfigDict:
  """get_config(arg) of a sibling config file (soma.py, bptt.py, eggroll.py, seed.py)."""
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), file), arg)


def _scale(c: ml_collections.ConfigDict, size: str, lr: float, mult: int = 1
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


def _table4_rows(c: ml_collections.ConfigDict, size: str, lr: float, mono) -> None:
  """Table 4's rows beside SOMA: monoliths at 1x / 4x / 16x, EGGROLL, BPTT, two controls."""
  cpu = size == "cpu"
  k = c.methods.soma_n2.spsa.n_pert
  for mult, paper in ((1, 64), (4, 256), (16, 1024)):
    name = f"mono_k{k * mult}"
    c.methods[name] = mono(mult)
    c.rows[name] = f"monolithic SPSA, {mult}x SOMA's directions on SOMA's batch (paper: {paper})"
    c.start[name] = "monolith"
  egg = _method("eggroll.py", f"n=1,size={size}")
  egg.opt.lr = 0.01  # ES on a GRU: larger steps (the paper's recorded lr alpha = 0.01)
  if cpu:
    egg.eggroll.update(pop=32, pop_chunk=32)  # 128 members ran 1 update/s here
    # sigma 2^-3: what the recorded run (docs/results/compare_table4_cpu.json) took from
    # eggroll.py's cpu preset before its sweep (population 8,192, not 32) moved it to 0.25
    egg.eggroll.sigma = 2**-3
    egg.spsa.batch, egg.data.seq_len = 4, 256  # SOMA's windows
    egg.data.val_windows = 16
  c.methods.eggroll = egg
  c.rows.eggroll = "EGGROLL: 6-layer GRU, untied head, rank-1 ES (paper: pop 2^20, B 256)"
  c.start.eggroll = "gru"
  bptt = _method("bptt.py", f"n=1,size={size}")
  if cpu:
    bptt.model.shared_head = False
    bptt.spsa.batch, bptt.data.seq_len, bptt.data.val_windows = 4, 256, 16
  c.methods.bptt = bptt  # backprop + Adam at bptt.py's lr, one model of the total size
  c.rows.bptt = "BPTT: one LSTM of the same size, backprop + Adam"
  c.start.bptt = "monolith"
  c.methods.head_only = _scale(_method("soma.py", f"n=2,size={size}"), size, lr)
  c.methods.head_only.method = "head_only"  # bodies frozen, the delta rule on each head
  c.rows.head_only = "control: SOMA N = 2 with frozen bodies, only the delta-rule heads train"
  c.start.head_only = "soma_expert"
  c.methods.soma_n2_summed = _scale(_method("soma.py", f"n=2,size={size}"), size, lr)
  c.methods.soma_n2_summed.method = "soma_summed"  # the N losses summed before each difference
  c.rows.soma_n2_summed = "control: SOMA N = 2 with the N losses summed before each difference"
  c.start.soma_n2_summed = "soma_expert"


def _plan(c: ml_collections.ConfigDict, cpu: bool) -> None:
  """Seeds, budgets, tuning grids and statistics of the study (SPEC 9.6)."""
  c.seeds = 5 if cpu else 2  # optimisation seeds: they change the batches and the directions
  c.first_seed = 0  # seeds first_seed .. first_seed + seeds - 1; seed s also seeds its bootstrap
  # The budget of each row (table4) or configuration (table7) and seed, in budget_unit:
  # "updates" (where the compared methods do equal operations per update, table7's pair),
  # "ops" (SPEC 7's training operations: table4 at size=cpu, since two busy processes moved
  # a 40 s cpu_seconds budget by -12.8% and device_seconds by -53.5%:
  # docs/results/budget_load.json), "cpu_seconds" (the process's CPU time in training
  # updates), "device_seconds" (SPEC 7), or "auto" (cpu_seconds on a CPU, device_seconds
  # elsewhere). Never wall time (SPEC 9.6).
  c.budget_unit = "updates" if c.study == "table7" or not cpu else "ops"
  # table4's 1.6e12 ops: 1,193 of SOMA N = 2's updates, 75 of the monolith's with 64 directions.
  # Refused where protocol.MAX_UPDATES (10,000,000 steps) would end a run first: in updates or
  # ops exactly; in seconds above 10,000,000 updates at 1 s each (protocol.SLOW_UPDATE_SECONDS).
  c.budget = float((1000 if c.study == "table7" else 1.6e12) if cpu else 3)
  # table7 in updates: ops per update may differ by this fraction (tiny's widths are 4% apart)
  c.ops_tolerance = 0.02 if cpu else 0.05
  c.seed_updates = 1000 if cpu else 3  # every seed run's updates (SPEC 3.4: about 1,000)
  c.seed_run_seed = 1000  # the seed runs' data and direction seed: no optimisation seed
  c.curve_points = 4  # checkpoints after each quarter of the budget, scored for the curve
  c.match_params = True  # every other method's width matches `reference`'s total params
  c.reference = "soma_n2"  # the method others are sized to and differences are taken from
  c.bootstrap_draws = 10_000 if cpu else 200  # paired document bootstrap draws
  c.base_lr = 0.0025  # every method's lr and initial eps; table7's grids are multiples of it
  # table7 stage 1: lr = f x base_lr at eps = base_lr; while the best lr is at an edge, one
  # more factor of 2 past it, at most lr_extend times (an lr still at the edge is flagged)
  c.lr_factors = (0.25, 0.5, 1.0, 2.0, 4.0) if cpu else (0.5, 1.0, 2.0)
  c.lr_extend = 2 if cpu else 1
  c.eps_factors = (0.5, 1.0, 2.0)  # table7 stage 2: eps = f x base_lr at the selected lr
  # ... grown past an edge as the lr grid, at most this many times (0 at size=cpu: the
  # recorded Table 7 and ladder runs did not grow it; eps sat at an edge in 8 of 10 searches)
  c.eps_extend = 0 if cpu else 1


def get_config(arg: str | None = None):
  if _ladder_asked(arg):  # study=ladder takes its own arguments (seeds=, rungs=): _ladder
    return _ladder(arg)
  asked = re.search(r"study=(\w+)", (arg or "").replace(" ", ""))
  if asked and asked[1] in _OWN_CONFIG:  # a study with a config function of its own
    return _OWN_CONFIG[asked[1]](arg)
  a = parse_arg(arg, study="table4", size="cpu")
  if a["study"] not in STUDIES or a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study={a['study']},size={a['size']}: use study="
                    f"{' or '.join(STUDIES)} and size=cpu or tiny")
  size, cpu = a["size"], a["size"] == "cpu"
  c = ml_collections.ConfigDict()
  c.study = a["study"]  # table4 (SPEC 9.1) or table7 (SPEC 9.2)
  c.data_dir = ""  # a prepared data dir with 2 shards; "" = prepare pystdlib under OUT/data
  _plan(c, cpu)
  c.eval = ml_collections.ConfigDict()
  c.eval.route_bytes = 64 if cpu else 8  # the router sees this many leading bytes
  c.eval.score_bytes = 192 if cpu else 24  # the loss is over the next this many targets
  # The first this many 1,025-byte windows of each split (0 = all), each cut into pieces.
  c.eval.val_windows = 128 if cpu else 4  # ensemble validation: selection and curves
  c.eval.test_windows = 0 if cpu else 4  # test

  lr = c.base_lr
  soma = _scale(_method("soma.py", f"n=2,size={size}"), size, lr)
  k = soma.spsa.n_pert
  mono = lambda mult: _scale(_method("soma.py", f"mono={k * mult},size={size}"), size, lr, mult)
  c.methods = ml_collections.ConfigDict()
  c.rows = ml_collections.ConfigDict()  # what each row stands for in the paper's table
  c.start = ml_collections.ConfigDict()  # the seed run each method starts from
  c.methods.soma_n2 = soma
  c.rows.soma_n2 = "SOMA N = 2, own delta-rule heads (paper: width 361, n_pert 64, B 64)"
  c.start.soma_n2 = "soma_expert"
  if c.study == "table7":
    c.methods.mono = mono(1)
    c.rows.mono = "monolith of the same total size, SOMA's directions and batch (paper: width 509)"
    c.start.mono = "monolith"
  else:
    _table4_rows(c, size, lr, mono)
  c.order = tuple(n for n in ("soma_n2", "mono", "mono_k4", "mono_k16", "mono_k64", "eggroll",
                              "bptt", "head_only", "soma_n2_summed") if n in c.methods)  # rows
  # Controls run the reference's number of updates in each seed, not the time budget.
  c.match_updates = ml_collections.ConfigDict(
      {"head_only": "soma_n2", "soma_n2_summed": "soma_n2"} if c.study == "table4" else {})
  # Methods that take their seed's parameters only, with fresh Adam moments, plateau state and
  # step counter: BPTT, whose gradients are about d / n times smaller per coordinate than
  # SPSA's estimates, so the SPSA seed's second moments would damp its first updates ~100x.
  c.fresh_optimizer = tuple(n for n in ("bptt",) if n in c.methods) if c.study == "table4" else ()
  c.seed_runs = _seed_runs(c, size, lr)
  return c


def _seed_runs(c: ml_collections.ConfigDict, size: str, lr: float) -> ml_collections.ConfigDict:
  """Seed runs (SPEC 3.4 step 1): one per architecture, each for seed_updates updates; their
  width comes from the methods that start from them."""
  seed = _scale(_method("seed.py", f"size={size}"), size, lr)
  seed.opt.weight_decay = 0.0
  runs = ml_collections.ConfigDict()
  runs.soma_expert = seed  # N = 1 at the width of one SOMA expert
  runs.monolith = ml_collections.ConfigDict(seed.to_dict())  # at the monolith's width
  if c.study == "table4":
    runs.gru = ml_collections.ConfigDict(c.methods.eggroll.to_dict())  # EGGROLL's GRU
  return runs


# ------------------------------------------------------------------------- the width ladder


def _ladder_asked(arg: str | None) -> bool:
  return "study=ladder" in (arg or "").replace(" ", "")


def _ladder(arg: str | None) -> ml_collections.ConfigDict:
  """study=ladder (SPEC 9.7, soma_jax/studies/ladder.py): Table 7's config (its seeds, budget,
  grid and scoring) run at each rung, SOMA N = 2 experts of width w against the monolith of
  equal total parameters, with the summed-loss control at SOMA's selected settings.

    python experiments/compare.py --config=experiments/configs/compare.py:study=ladder,size=cpu --out=runs/ladder
    ...:study=ladder,size=cpu,rungs=16/32/64,seeds=3   (the first pass; rungs split by /)
  """
  a = parse_arg(arg, study="ladder", size="cpu", seeds=0, rungs="")
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=ladder,size={a['size']}: use size=cpu or tiny")
  cpu = a["size"] == "cpu"
  c = get_config(f"study=table7,size={a['size']}")
  c.study = "ladder"
  # SOMA's expert widths, one rung each (the monolith's width is matched at each rung)
  c.rungs = a["rungs"] or ("16/32/64/128" if cpu else "4/8")
  c.seeds = a["seeds"] or (3 if cpu else 2)
  if cpu:  # to fit the first pass's 3 rungs in about an hour: Table 7's lr grid without its
    # 4x point (never selected there: SOMA took 1x in 5 of 5 seeds, the monolith 0.25x or
    # 0.5x; an edge choice still grows it twice, to 4x and 8x or 0.125x and 0.0625x), and no
    # eps stage: in Table 7's 10 searches (docs/results/table7_cpu.json) eps 0.5x..2x moved
    # the selected run's validation loss by 0.0026 at most, the lr grid by 0.068 to 0.159
    c.lr_factors = (0.25, 0.5, 1.0, 2.0)
    c.eps_factors = (1.0,)
  summed = ml_collections.ConfigDict(c.methods.soma_n2.to_dict())
  summed.method = "soma_summed"  # every expert's estimate from the N losses summed
  c.methods.soma_n2_summed = summed
  c.rows.soma_n2_summed = "control: SOMA N = 2 with the N losses summed before each difference"
  c.start.soma_n2_summed = "soma_expert"
  c.order = ("soma_n2", "mono", "soma_n2_summed")
  c.control = "soma_n2_summed"  # run at SOMA's selected lr / eps for SOMA's updates, per seed
  c.mechanism = ml_collections.ConfigDict()  # rho and r at each rung's start (soma_jax.descent)
  c.mechanism.rho_by = "line_search"  # rho by line_search (forward only) or hvp
  c.mechanism.batches = 4 if cpu else 1  # expert-validation batches per expert (B x A windows)
  c.mechanism.repeats = 16 if cpu else 2  # SPSA estimates per batch (update steps 0..R-1)
  c.mechanism.hutchinson = 16 if cpu else 1  # Hutchinson vectors per batch for tr(H)
  c.mechanism.seed = 0  # the probes' base key of the measurement
  return c


# ------------------------------------------------------------------------- the decomposition


def _decompose(arg: str | None) -> ml_collections.ConfigDict:
  """study=decompose (SPEC 9.8, soma_jax/studies/decompose.py): where SOMA's lead comes from.
  Table 7's seeds, scoring and statistics; every row at the operations of `budget` of SOMA's
  updates, each with its own lr grid (no eps stage), selection on validation.

    python experiments/compare.py --config=experiments/configs/compare.py:study=decompose,size=cpu --out=runs/decompose
    ...:study=decompose,size=cpu,seeds=5   (the headline's seed count)
  """
  a = parse_arg(arg, study="decompose", size="cpu", seeds=0)
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=decompose,size={a['size']}: use size=cpu or tiny")
  size, cpu = a["size"], a["size"] == "cpu"
  c = get_config(f"study=table7,size={size}")
  c.study = "decompose"
  c.seeds = a["seeds"] or (3 if cpu else 2)
  # One lr grid per row around its own centre (row_base_lr, else base_lr), grown past an
  # edge at most lr_extend times; eps stays at base_lr (Table 7's eps stage moved the selected
  # validation loss by 0.0026 at most, its lr grid by 0.068 to 0.159).
  c.lr_factors = (0.5, 1.0, 2.0)
  c.lr_extend = 2 if cpu else 0  # tiny: the grid alone (the tests check rows, not the search)
  c.eps_factors, c.eps_extend = (1.0,), 0
  lr = c.base_lr
  soma = c.methods.soma_n2
  rows = {"soma": (soma, "SOMA N = 2 by SPSA, semantic shards", "soma_expert"),
          "mono": (c.methods.mono, "the monolith of the same total size by SPSA", "monolith")}
  summed = ml_collections.ConfigDict(soma.to_dict())
  summed.method = "soma_summed"
  rows["soma_summed"] = (summed, "SOMA N = 2 with the N losses summed before each difference",
                         "soma_expert")
  random = ml_collections.ConfigDict(soma.to_dict())
  # Its seed trained on the semantic dir: the same windows (only the shard labels differ,
  # prepare --assignment=random), so its manifest's hash differs but the seed is the same start.
  random.init_from_other_data = True
  rows["soma_random"] = (random, "SOMA N = 2 on random shards of the semantic shards' sizes",
                         "soma_expert")
  rows["one_expert"] = (_scale(_method("soma.py", f"n=1,size={size}"), size, lr),
                        "one expert of SOMA's width on all the data (N = 1)", "soma_expert")
  for name, n, seed in (("soma_bptt", 2, "soma_expert"), ("mono_bptt", 1, "monolith")):
    bptt = _scale(_method("bptt.py", f"n={n},size={size}"), size, lr)
    bptt.method = "bptt"
    what = "SOMA N = 2" if n == 2 else "the monolith"
    rows[name] = (bptt, f"{what} by backprop, fresh Adam", seed)
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for name, (cfg, what, seed) in rows.items():
    c.methods[name], c.rows[name], c.start[name] = cfg, what, seed
  c.reference = "soma"
  c.order = tuple(rows)
  c.keep_width = ("one_expert",)  # at SOMA's expert width; the others match SOMA's params
  c.fresh_optimizer = ("soma_bptt", "mono_bptt")  # the SPSA seed's parameters, fresh Adam
  c.row_base_lr = ml_collections.ConfigDict({"soma_bptt": 3e-3, "mono_bptt": 3e-3})  # bptt.py's
  c.row_data = ml_collections.ConfigDict({"soma_random": "random"})  # else the semantic shards
  c.data_dir_random = ""  # prepared with --assignment=random; "" = the built-in one under OUT
  c.effects = ml_collections.ConfigDict({  # name: (a, b), read as a against b
      "sharding_spsa": ("soma", "mono"), "sharding_bptt": ("soma_bptt", "mono_bptt"),
      "semantic_vs_random": ("soma", "soma_random"),
      "independent_vs_summed": ("soma", "soma_summed"),
      "sharding_at_width": ("soma", "one_expert"), "narrow_vs_wide": ("one_expert", "mono")})
  # name: (effect 1, effect 2), effect 1 minus effect 2: the zero-order-specific part
  c.interactions = ml_collections.ConfigDict({"interaction": ("sharding_spsa", "sharding_bptt")})
  return c


# ------------------------------------------------------------------------- 1.5-SPSA


def _spsa15(arg: str | None) -> ml_collections.ConfigDict:
  """study=spsa15 (issue 56, soma_jax/studies/spsa15.py, docs/spsa15.md): SOMA N = 2 and the
  monolith of the same total size, each by SPSA and by 1.5-SPSA (method=soma15), every row at
  the operations of `budget` of SOMA's updates from its own seed run, each on its own lr grid
  (no eps stage); alpha in `alphas` chosen per 1.5-SPSA row on seed `alpha_seed`, then fixed.

    python experiments/compare.py --config=experiments/configs/compare.py:study=spsa15,size=cpu --out=runs/spsa15
  """
  a = parse_arg(arg, study="spsa15", size="cpu", seeds=0)
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=spsa15,size={a['size']}: use size=cpu or tiny")
  cpu = a["size"] == "cpu"
  c = get_config(f"study=table7,size={a['size']}")
  c.study = "spsa15"
  c.seeds = a["seeds"] or (5 if cpu else 2)
  c.lr_factors = (0.5, 1.0, 2.0)  # one grid per row and seed around base_lr, grown past an
  c.lr_extend = 2 if cpu else 0  # edge at most lr_extend times (tiny: the grid alone)
  c.eps_factors, c.eps_extend = (1.0,), 0
  rows = {"soma": (c.methods.soma_n2, "SOMA N = 2 by SPSA", "soma_expert"),
          "mono": (c.methods.mono, "the monolith of the same total size by SPSA", "monolith")}
  for name, (cfg, what, seed) in list(rows.items()):
    curved = ml_collections.ConfigDict(cfg.to_dict())
    curved.method = "soma15"  # the same run with 1.5-SPSA's estimate (spsa15.alpha, .lam)
    rows[name + "15"] = (curved, what.replace("by SPSA", "by 1.5-SPSA"), seed)
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for name, (cfg, what, seed) in rows.items():
    c.methods[name], c.rows[name], c.start[name] = cfg, what, seed
  c.reference, c.order = "soma", tuple(rows)
  c.keep_width, c.fresh_optimizer = (), ()
  c.row_base_lr, c.row_data = ml_collections.ConfigDict(), ml_collections.ConfigDict()
  c.data_dir_random = ""
  c.alphas = (0.1, 0.3)  # 1.5-SPSA's exponent, chosen per row on alpha_seed by validation
  c.alpha_seed = c.first_seed
  c.alpha_rows = ("soma15", "mono15")
  c.effects = ml_collections.ConfigDict({  # name: (a, b), read as a against b
      "spsa15_on_soma": ("soma15", "soma"), "spsa15_on_mono": ("mono15", "mono"),
      "sharding_spsa": ("soma", "mono"), "sharding_spsa15": ("soma15", "mono15")})
  # effect 1 minus effect 2: > 0 where 1.5-SPSA helps the monolith more than SOMA
  c.interactions = ml_collections.ConfigDict(
      {"helps_mono_more": ("spsa15_on_mono", "spsa15_on_soma")})
  # The primary readouts, declared before anything trains: test end loss at the budget of
  # these effects / interactions (does it help SOMA; the monolith more; SOMA's sign under it)
  c.primary = ("spsa15_on_soma", "helps_mono_more", "sharding_spsa15")
  # Does SOMA against the monolith keep its sign from SPSA to 1.5-SPSA (both intervals)?
  c.sign_kept = ("sharding_spsa", "sharding_spsa15")
  return c


# ------------------------------------------------------------------------- Table 6


def _paper_study(arg: str | None, study: str):
  """The shared start of the paper-item studies: Table 7's config at `size` (its seeds,
  scoring and statistics) without its lr / eps search; (config, size, cpu, seeds= or 0)."""
  a = parse_arg(arg, study=study, size="cpu", seeds=0)
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study={study},size={a['size']}: use size=cpu or tiny")
  c = get_config(f"study=table7,size={a['size']}")
  c.study = study
  for unused in ("lr_factors", "lr_extend", "eps_factors", "eps_extend"):  # no search here
    del c[unused]
  return c, a["size"], a["size"] == "cpu", a["seeds"]


def _table6(arg: str | None) -> ml_collections.ConfigDict:
  """study=table6 (the paper's Table 6, soma_jax/studies/table6.py): Table 7's pair, seeds,
  budget and scoring at the paper's five (lr, initial eps) cells, no search.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table6,size=cpu --out=runs/table6
  """
  c, _, cpu, seeds = _paper_study(arg, "table6")
  c.seeds = seeds or (3 if cpu else 2)  # the paper's three
  c.curve_points = 1  # each cell's final checkpoint is all the table reads
  # (lr factor, initial eps factor) of base_lr: the paper's cells over its base 0.0025, which
  # is this project's CPU base_lr too (0.00125 / 0.0025, 0.0025 / 0.0025, 0.005 / 0.0025,
  # 0.00125 / 0.00125, 0.00125 / 0.005)
  c.cells = ((0.5, 1.0), (1.0, 1.0), (2.0, 1.0), (0.5, 0.5), (0.5, 2.0))
  return c


# ------------------------------------------------------------------------- Figures 7 and 8


def _fig7(arg: str | None) -> ml_collections.ConfigDict:
  """study=fig7 (the paper's Figures 7 and 8, soma_jax/studies/fig7.py): SOMA with
  fixed-width experts as N, n_pert and B grow, every setting continuing one seed run.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig7,size=cpu --out=runs/fig7
  """
  c, size, cpu, seeds = _paper_study(arg, "fig7")
  # The paper's figure shows one run per setting; two seeds here, at 300 updates per setting
  # to fit about 45 min on 2 cores (its costliest settings, n_pert 64 and B 64 at N = 8, run
  # 16x the base's operations per update).
  c.seeds = seeds or 2
  c.budget = 300.0 if cpu else 3.0  # updates per setting and seed
  c.curve_points = 5 if cpu else 2  # checkpoints along each curve
  c.ops_tolerance = 1.0  # the settings differ in cost per update: that is the sweep
  c.match_params = False  # fixed-width experts: more experts, more parameters
  c.source = "pystdlib"  # each N's data dir is this corpus prepared into N shards under OUT
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  lr = c.base_lr
  base = lambda n: _scale(_method("soma.py", f"n={n},size={size}"), size, lr)
  n_list = (1, 2, 8, 32) if cpu else (1, 2, 4)  # the paper's 1, 2, 8, 32, 256
  panel_n = 8 if cpu else 2  # the n_pert and batch panels' N (the paper's 8)
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for n in n_list:
    _add(c, f"n{n}", base(n), f"SOMA N = {n}, fixed-width experts")
  mults = (0.25, 1, 4, 16) if cpu else (0.5, 1, 2)  # of the base: the paper's 16 ... 1,024 / 64
  c.panels = ml_collections.ConfigDict({"experts": tuple(f"n{n}" for n in n_list),
                                        **_fig7_allocations(c, lambda: base(panel_n), mults)})
  c.reference = f"n{panel_n}"
  c.order = tuple(c.methods.keys())
  seed = c.seed_runs.soma_expert
  del c["seed_runs"]
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": seed})
  return c


def _add(c: ml_collections.ConfigDict, name: str, cfg: ml_collections.ConfigDict, what: str) -> None:
  c.methods[name], c.rows[name], c.start[name] = cfg, what, "soma_expert"


def _fig7_allocations(c: ml_collections.ConfigDict, base, mults: tuple) -> dict:
  """Figure 7's n_pert and batch panels at N = the base's: each multiple of the base n_pert
  and B (the base itself is the experts panel's run at that N); B above the base by
  accumulated batches of the base B, each with its own directions (`spsa.accum`)."""
  ref = base()
  n, k, b = ref.n_experts, ref.spsa.n_pert, ref.spsa.batch  # the paper's 8, 64 and 64
  panels = {"n_pert": [], "batch": []}
  for m in mults:
    if m == 1:
      panels["n_pert"].append(f"n{n}")
      panels["batch"].append(f"n{n}")
      continue
    cfg = base()
    cfg.spsa.n_pert = max(1, int(k * m))
    _add(c, f"npert{cfg.spsa.n_pert}", cfg, f"SOMA N = {n}, n_pert {cfg.spsa.n_pert}")
    panels["n_pert"].append(f"npert{cfg.spsa.n_pert}")
    cfg = base()
    if m < 1:
      cfg.spsa.batch = max(1, int(b * m))
    else:
      cfg.spsa.accum = int(m)
    eff = cfg.spsa.batch * cfg.spsa.accum
    _add(c, f"b{eff}", cfg, f"SOMA N = {n}, B {eff}" + (
        f" ({cfg.spsa.accum} accumulated batches of {b})" if m > 1 else ""))
    panels["batch"].append(f"b{eff}")
  return {k: tuple(v) for k, v in panels.items()}


# ------------------------------------------------------------------------- Table 3


def _table3(arg: str | None) -> ml_collections.ConfigDict:
  """study=table3 (the paper's Table 3, soma_jax/studies/table3.py): Figure 7's largest N
  and one expert alone, each seed's checkpoint accounted by the paper's conventions.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table3,size=cpu --out=runs/table3
    ... --config.runs_from=runs/fig7   (a finished study=fig7: read its runs, train nothing)
  """
  size = parse_arg(arg, study="table3", size="cpu", seeds=0)["size"]
  if size not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=table3,size={size}: use size=cpu or tiny")
  c = _fig7(arg)
  n_max = max(m.n_experts for m in c.methods.values())
  keep = ("n1", f"n{n_max}")  # the solo and the checkpoint accounted (the paper's N = 256)
  for name in [n for n in c.methods if n not in keep]:
    for field in ("methods", "rows", "start"):
      del c[field][name]
  c.study = "table3"
  c.panels = ml_collections.ConfigDict({"experts": keep})
  c.reference = keep[0]
  c.order = keep
  c.solo, c.ensemble = keep  # one expert alone (its step gives the fixed rate), the checkpoint
  c.runs_from = ""  # a finished study=fig7 --out with these settings; "" = train them here
  return c


# ------------------------------------------------------------------------- Table 5


def _table5(arg: str | None) -> ml_collections.ConfigDict:
  """study=table5 (the paper's Table 5, soma_jax/studies/table5.py): SOMA and BPTT at each N
  of n_list, equal total size, each N's rows from one seed run of its width.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table5,size=cpu --out=runs/table5
  """
  c, size, cpu, seeds = _paper_study(arg, "table5")
  c.seeds = seeds or (3 if cpu else 2)
  # Every row's total size is the largest N's at the experts' width (SOMA N = 8 of width 32:
  # 329,920 parameters at size=cpu; at the comparisons' 82k, N = 8 would be width 7 and its
  # heads 80% of it), and every row runs the operations of `budget` updates of that SOMA row;
  # the paper's three GPU-hour budgets are read as fractions of it.
  c.budget = 500.0 if cpu else 3.0
  c.budget_fractions = (0.5, 0.75, 1.0)  # the paper's 50 / 75 / 100 GPU-hours
  c.source = "pystdlib"  # each N's data dir is this corpus prepared into N shards under OUT
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  lr = c.base_lr
  seed = c.seed_runs.soma_expert
  c.methods, c.rows, c.start, c.seed_runs = (ml_collections.ConfigDict() for _ in range(4))
  n_list = (1, 2, 8) if cpu else (1, 2, 3)  # the paper's 1, 2, 8
  for n in n_list:
    c.seed_runs[f"seed_n{n}"] = ml_collections.ConfigDict(seed.to_dict())  # at N's width
    c.methods[f"soma_n{n}"] = _scale(_method("soma.py", f"n={n},size={size}"), size, lr)
    bptt = _scale(_method("bptt.py", f"n={n},size={size}"), size, lr)
    bptt.method, bptt.opt.lr = "bptt", 3e-3  # bptt.py's lr
    c.methods[f"bptt_n{n}"] = bptt
    for kind, what in (("soma", "SOMA (SPSA)"), ("bptt", "BPTT (backprop + Adam, fresh)")):
      c.rows[f"{kind}_n{n}"] = f"{what}, N = {n}, each expert on its shard"
      c.start[f"{kind}_n{n}"] = f"seed_n{n}"
  c.reference = f"soma_n{n_list[-1]}"  # every row's params match it; the budget: its updates
  c.order = tuple(c.methods.keys())
  c.fresh_optimizer = tuple(n for n in c.methods if n.startswith("bptt"))
  return c


# ------------------------------------------------------------------------- Figure 13


def _fig13(arg: str | None) -> ml_collections.ConfigDict:
  """study=fig13 (the paper's Figure 13 with Tables 10 and 11, soma_jax/studies/fig13.py):
  SOMA N = 8 of width 32 at n_pert x B = 256 split three ways, from one seed run.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig13,size=cpu --out=runs/fig13
  """
  c, size, cpu, seeds = _paper_study(arg, "fig13")
  c.seeds = seeds or 2  # the paper's two paired seeds
  # 256 updates per allocation (the paper: 512 further updates): each does 16x the N = 8
  # base's operations per update, about 1 s here
  c.budget = 256.0 if cpu else 3.0
  c.curve_points = 4
  c.match_params = False
  c.table10_fractions = (0.25, 0.5, 1.0)  # of the final operations (the paper: 2, 4, 8e18)
  c.source = "pystdlib"
  c.prepare = ml_collections.ConfigDict()
  n = 8 if cpu else 2
  # (n_pert, windows per batch, accumulated batches): the paper's (64, 1024), (256, 256),
  # (1024, 64) over 16, here n_pert x B = 256 (tiny: 8); B above the base by accumulation
  splits = ((4, 4, 16), (16, 4, 4), (64, 4, 1)) if cpu else ((2, 2, 2), (4, 2, 1), (8, 1, 1))
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for k, b, acc in splits:
    cfg = _scale(_method("soma.py", f"n={n},size={size}"), size, c.base_lr)
    cfg.spsa.update(n_pert=k, batch=b, accum=acc)
    _add(c, f"npert{k}_b{b * acc}", cfg, f"SOMA N = {n}, n_pert {k}, B {b * acc}"
         + (f" ({acc} accumulated batches of {b})" if acc > 1 else ""))
  c.allocations = tuple(f"npert{k}_b{b * acc}" for k, b, acc in splits)  # n_pert growing
  c.order = c.allocations
  c.reference = c.allocations[0]
  del c.seed_runs["monolith"]
  return c


# ------------------------------------------------------------------------- Figure 9


def _fig9(arg: str | None) -> ml_collections.ConfigDict:
  """study=fig9 (the paper's Figure 9, soma_jax/studies/fig9.py): ablations of SOMA N = 2 at
  width 32 (Table 7's soma_n2): semantic vs random shards, warm vs cold start, and the head
  (own delta-rule heads, the seed's head frozen and shared, a frozen random head).

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig9,size=cpu --out=runs/fig9
  """
  c, size, cpu, seeds = _paper_study(arg, "fig9")
  c.seeds = seeds or (3 if cpu else 2)  # the paper's three
  # 5 conditions x 3 seeds x 1,000 updates of N = 2 (about 40-60 updates/s on 2 cores) and two
  # 1,000-update seed runs: about 9 minutes with the data preparation
  c.budget = 1000.0 if cpu else 4.0  # updates per condition and seed
  c.curve_points = 4 if cpu else 2  # checkpoints scored: the figure's shown steps
  c.match_params = False  # one width: an ablation changes one factor, not the size
  c.source = "pystdlib"  # the semantic, random and N = 1 data dirs: this corpus under OUT
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  c.data_dir_random = ""  # prepared with --assignment=random; "" = source's under OUT
  soma = c.methods.soma_n2  # own delta-rule heads (SPEC 3.2), this project's CPU default
  copy = lambda: ml_collections.ConfigDict(soma.to_dict())
  shared = copy()
  shared.model.shared_head, shared.opt.train_head = True, False  # SPEC 3.4's width-32 recipe
  rows = {"soma": (soma, "semantic shards, warm, own delta-rule heads (the default)",
                   "soma_expert"),
          "random_shards": (copy(), "random shards of the semantic sizes", "soma_expert"),
          "cold": (copy(), "a fresh init (cold start), the same updates", None),
          "shared_head": (shared, "the seed's head frozen and shared", "soma_expert"),
          "random_head": (ml_collections.ConfigDict(shared.to_dict()),
                          "a random head, never trained, frozen and shared", "random_head")}
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for name, (cfg, what, seed) in rows.items():
    c.methods[name], c.rows[name] = cfg, what
    if seed:
      c.start[name] = seed
  c.reference = "soma"
  c.order = tuple(rows)
  c.cold = ("cold",)  # conditions from a fresh init (protocol.budgeted(start=None))
  c.row_data = ml_collections.ConfigDict({"random_shards": "random"})  # else semantic
  c.panels = ml_collections.ConfigDict({"shards": ("soma", "random_shards"),
                                        "start": ("soma", "cold"),
                                        "head": ("soma", "shared_head", "random_head")})
  # name: (a, b, ...): a's final loss minus the better of b, ... (the paper's +0.029 is
  # delta_minus_shared)
  c.contrasts = ml_collections.ConfigDict({
      "random_minus_semantic": ("random_shards", "soma"), "cold_minus_warm": ("cold", "soma"),
      "delta_minus_shared": ("soma", "shared_head"),
      "random_head_minus_best": ("random_head", "soma", "shared_head")})
  seed = c.seed_runs.soma_expert  # N = 1 at the experts' width, its own delta-rule head
  never = ml_collections.ConfigDict(seed.to_dict())
  never.model.shared_head, never.opt.train_head = True, False  # its head stays the random init
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": seed, "random_head": never})
  return c


# ------------------------------------------------------------------------- Figure 15


def _fig15(arg: str | None) -> ml_collections.ConfigDict:
  """study=fig15 (the paper's Figure 15 with Tables 12 and 13, soma_jax/studies/fig15.py): the
  monolith and SOMA at growing N of about equal total size, each continuing its width's seed
  run for one operations budget; test loss, complete warm inference and its cost per token.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig15,size=cpu --out=runs/fig15
  """
  c, size, cpu, seeds = _paper_study(arg, "fig15")
  c.seeds = seeds or 1  # the paper: one trained model per setting, bars over test documents
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
  c.source = "pystdlib"  # each N's data dir is this corpus prepared into N shards under OUT
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
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
    c.methods[name] = _scale(_method("soma.py", f"n={n},size={size}"), size, lr)
    c.rows[name] = ("monolithic SPSA" if n == 1 else f"SOMA N = {n}") + ", equal total size"
    c.start[name] = f"seed_{name}"
  widest = c.methods[f"soma_n{n_list[-1]}"]  # width d_E: one head, the seed's, frozen, shared
  widest.model.shared_head, widest.opt.train_head = True, False
  widest.opt.weight_decay = 0.0  # the paper's width-32 recipe (wide controls: 1e-4)
  c.reference = f"soma_n{n_list[-1]}"  # every row's params match it; the budget: its updates
  c.order = tuple("mono" if n == 1 else f"soma_n{n}" for n in n_list)  # rows, growing N
  return c


# ------------------------------------------------------------------------- Figures 16 and 17


def _ensembles(arg: str | None, study: str) -> tuple[ml_collections.ConfigDict, bool]:
  """study=fig16 (the paper's Figure 16, soma_jax/studies/fig16.py): top-k routing, k = 1..N,
  on saved SOMA ensembles of fixed-width experts (Figure 7's experts panel), each continuing
  one seed run; also fig17's ensembles. (config, cpu)

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig16,size=cpu --out=runs/fig16
  """
  c, size, cpu, seeds = _paper_study(arg, study)
  c.seeds = seeds or 2  # the paper's figure shows one ensemble per N
  # 500 updates per ensemble and seed (the paper: 4M; 1,000 would not fit 12 min): N = 8 ran
  # 5.9 updates/s and N = 32 2.9 on 2 cores (docs/results/fig7_cpu.json), so 2 seeds x
  # (85 + 175) s of training: about 11-12 min with the seed run, the three data dirs' preparation
  # and the k sweeps
  c.budget = 500.0 if cpu else 3.0
  c.curve_points = 1  # the final checkpoint is the saved ensemble the figure scores
  c.ops_tolerance = 1.0  # the ensembles differ in cost per update (N)
  c.match_params = False  # fixed-width experts: more experts, more parameters
  c.source = "pystdlib"  # each N's data dir is this corpus prepared into N shards under OUT
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  # the figure's dashed line (the paper's top-4 routing), in 1..N of every ensemble
  c.mark_k = 4 if cpu else 2
  n_list = (8, 32) if cpu else (2, 6)  # the paper's 8 and 256
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for n in n_list:
    _add(c, f"n{n}", _scale(_method("soma.py", f"n={n},size={size}"), size, c.base_lr),
         f"SOMA N = {n}, fixed-width experts")
  c.ensembles = tuple(f"n{n}" for n in n_list)  # N growing
  c.reference = c.ensembles[0]
  c.order = c.ensembles
  seed = c.seed_runs.soma_expert
  del c["seed_runs"]
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": seed})
  return c, cpu


def _fig17(arg: str | None) -> ml_collections.ConfigDict:
  """study=fig17 (the paper's Figure 17, soma_jax/studies/fig17.py): every pair of experts of
  Figure 16's ensembles averaged, loss reduction against error similarity.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig17,size=cpu --out=runs/fig17 \
        --config.ensembles_from=runs/fig16
  """
  c, cpu = _ensembles(arg, "fig17")
  c.ensembles_from = ""  # a finished study=fig16 --out with these settings; "" = train here
  c.bins = 10 if cpu else 2  # equal-count bins of each ensemble's pairs (the paper: ~25)
  return c


# ------------------------------------------------------------------------- Table 8


def _table8(arg: str | None) -> ml_collections.ConfigDict:
  """study=table8 (the paper's Table 8, soma_jax/studies/table8.py): the experts variance
  study's jax.grad references (Figure 10, left) against an independent batch of the same
  size, per N, at init and after training; what each variance value changes by.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table8,size=cpu --out=runs/table8
  """
  a = parse_arg(arg, study="table8", size="cpu")
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=table8,size={a['size']}: use size=cpu or tiny")
  c = ml_collections.ConfigDict()
  c.study = "table8"
  c.size = a["size"]  # the variance config's preset below
  # The experts study as experiments/configs/variance.py:experts has it at this size (cpu:
  # N = 1, 2, 8, 32 at about 2M parameters, fixed batch B = 4 windows of T = 64, sparse
  # probes, n_pert 16, 8 repeats; its trained_dir names trained runs, "" = train them here).
  c.variance = _method("variance.py", f"experts,size={a['size']}")
  # Updates of each N's run by the study's train_run recipe (n_pert 4, B 4, T = 256 at cpu)
  # where variance.trained_dir is "": the paper measured at 10,000; about 1 s per update per
  # N here at 2M parameters (the recipe's own 1,000 would take over an hour)
  c.train_updates = 40 if a["size"] == "cpu" else 3
  c.x64 = False  # measure in float64 (about 2x the measurement's time)
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  return c


# ------------------------------------------------------------------------- Table 9


def _table9(arg: str | None) -> ml_collections.ConfigDict:
  """study=table9 (the paper's Table 9, soma_jax/studies/table9.py): Table 4's SOMA and
  monolith rows (its config, seed runs, budget and scoring), each row's final checkpoint
  chosen first, then scored frozen on a corpus nobody trained on.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table9,size=cpu --out=runs/table9
    ... --config.wikitext=FOLDER   (WikiText-103 raw: wiki.valid.raw, wiki.test.raw)
  """
  a = parse_arg(arg, study="table9", size="cpu", seeds=0)
  if a["size"] not in ("cpu", "tiny"):
    raise UserError(f"compare.py:study=table9,size={a['size']}: use size=cpu or tiny")
  cpu = a["size"] == "cpu"
  c = get_config(f"study=table4,size={a['size']}")
  c.study = "table9"
  c.seeds = a["seeds"] or 2  # table4 runs 5; two fit about 15 minutes here with the scoring
  for name in ("eggroll", "bptt", "head_only", "soma_n2_summed"):  # the paper's four rows only
    del c.methods[name], c.rows[name], c.start[name]
  del c.seed_runs["gru"]
  for unused in ("lr_factors", "lr_extend", "eps_factors", "eps_extend"):  # no search here
    del c[unused]
  c.order = tuple(n for n in c.order if n in c.methods)
  c.match_updates = ml_collections.ConfigDict()  # no controls
  c.fresh_optimizer = ()
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


# ------------------------------------------------------------------------- sharding or narrow


def _narrow(arg: str | None) -> ml_collections.ConfigDict:
  """study=narrow (SPEC 9.8, soma_jax/studies/narrow.py): SOMA N = 2 x width 32 against one
  width-32 expert on all the data and the width-47 monolith as the budget grows to 16x
  decompose's compared phase, every optimisation seed with its own seed runs; backprop rows
  at 1x as a capacity reference. Readouts declared here, before anything trains.

    python experiments/compare.py --config=experiments/configs/compare.py:study=narrow,size=cpu --out=runs/narrow
    python experiments/compare.py --config=experiments/configs/compare.py:study=narrow,size=cpu,corpus=man --out=runs/narrow_man
    ...:study=narrow,size=cpu,width=16   (a narrower rung: 2 x 16 against 1 x 16 and the monolith
                                          matched in parameters, width 28)
  """
  a = parse_arg(arg, study="narrow", size="cpu", seeds=0, corpus="builtin", width=0)
  if a["size"] not in ("cpu", "tiny") or a["corpus"] not in ("builtin", "man"):
    raise UserError(f"compare.py:study=narrow,size={a['size']},corpus={a['corpus']}: use "
                    "size=cpu or tiny and corpus=builtin or man")
  size, cpu = a["size"], a["size"] == "cpu"
  c = get_config(f"study=table7,size={size}")
  c.study = "narrow"
  c.seeds = a["seeds"] or (5 if cpu else 2)
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # The corpus: "builtin" (pystdlib, prepared under OUT/data) or "man" (this machine's man
  # pages of man_sections under man_root, linked under OUT/man and prepared into OUT/data, as
  # decompose_man's); data_dir, when set, is used as it is.
  c.corpus = a["corpus"]
  c.man_root = "/usr/share/man"
  c.man_sections = (2, 3, 5, 7, 8)
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  # The budget: `budget` of SOMA's updates in operations per row and seed (16x decompose's
  # 1,000: 2.15e13 ops after the seed at size=cpu; one_expert runs twice SOMA's updates).
  # Cost on 2 idle cores (SOMA 0.0158 s, one_expert 0.0092 s, mono 0.0163 s per update, the
  # backprop rows about 0.011 / 0.006 / 0.011): per seed 808 s of SPSA updates and 75 s of
  # backprop, the grid 660 s, the seed runs 130 s: about 87 min of updates, 1.7 h with
  # compilation and scoring per corpus (the man pages' preparation adds a few minutes)
  c.budget = 16000.0 if cpu else 16.0
  # Checkpoints, scored on validation inside the run: log-spaced fractions of each row's
  # budget (powers of 2, so one_expert's update u and 2u and SOMA's u fall on checkpoints)
  c.curve_fractions = tuple(2.0 ** -k for k in range(8 if cpu else 4, -1, -1))
  # Declared before anything trains: the budgets each row's test loss is scored at, once
  c.test_fractions = (1 / 16, 1 / 4, 1 / 2, 1.0)
  # lr: a grid of lr_factors around each row's centre on the first seed at select_fraction
  # of its budget, selected on validation, then fixed for every seed (eps at the centre)
  c.lr_factors, c.lr_extend = (0.5, 1.0, 2.0), 0
  c.eps_factors, c.eps_extend = (1.0,), 0
  c.select_fraction = 0.25
  _narrow_rows(c, size, a["width"])
  # lr grid centres: decompose's selections at size=cpu (docs/results/decompose_cpu.json)
  c.row_base_lr = ml_collections.ConfigDict({
      "soma": 0.0025, "one_expert": 0.00125, "mono": 0.000625,
      "soma_bptt": 0.006, "one_expert_bptt": 0.006, "mono_bptt": 0.003})
  # each row's budget as a fraction of `budget`: the backprop rows at 1x (decompose's)
  c.row_fraction = ml_collections.ConfigDict(
      {"soma_bptt": 1 / 16, "one_expert_bptt": 1 / 16, "mono_bptt": 1 / 16})
  _narrow_readouts(c)
  return c


def _narrow_readouts(c: ml_collections.ConfigDict) -> None:
  """study=narrow's readouts, declared before the run (SPEC 9.8)."""
  # Readouts, declared before the run. contrasts: name -> (b, a), b's test end loss minus
  # a's at each test fraction (> 0: a lower, the paper's direction for a = soma)
  c.contrasts = ml_collections.ConfigDict({
      "one_expert_minus_soma": ("one_expert", "soma"), "mono_minus_soma": ("mono", "soma"),
      "one_expert_bptt_minus_soma_bptt": ("one_expert_bptt", "soma_bptt"),
      "mono_bptt_minus_soma_bptt": ("mono_bptt", "soma_bptt")})
  # primary: the contrasts whose end-loss differences carry a verdict (SPEC 9.8), and those
  # whose slope against log2 budget does; every other readout is secondary
  c.primary = ("one_expert_minus_soma", "mono_minus_soma")
  c.primary_slopes = ("one_expert_minus_soma",)
  c.mechanism = ("one_expert", "soma")  # D(u) = one_expert(u) - soma(u), G(u) = one(u) - one(2u)


def _narrow_rows(c: ml_collections.ConfigDict, size: str, width: int) -> None:
  """study=narrow's rows: SOMA, one expert of its width and the monolith by SPSA, and the
  same three by backprop with fresh Adam (the capacity reference); SOMA's expert width
  `width` (0: the size's), the monoliths matched in parameters."""
  lr = c.base_lr
  one = _scale(_method("soma.py", f"n=1,size={size}"), size, lr)
  rows = {"soma": (c.methods.soma_n2, "SOMA N = 2 by SPSA", "soma_expert"),
          "one_expert": (one, "one expert of SOMA's width on all the data (N = 1) by SPSA, "
                         "continuing SOMA's seed run", "soma_expert"),
          "mono": (c.methods.mono, "the monolith of SOMA's total size by SPSA", "monolith")}
  for name, n, seed, what in (
      ("soma_bptt", 2, "soma_expert", "SOMA N = 2"),
      ("one_expert_bptt", 1, "soma_expert", "one expert of SOMA's width (N = 1)"),
      ("mono_bptt", 1, "monolith", "the monolith")):
    bptt = _scale(_method("bptt.py", f"n={n},size={size}"), size, lr)
    bptt.method = "bptt"
    rows[name] = (bptt, f"{what} by backprop, fresh Adam", seed)
  c.methods, c.rows, c.start = (ml_collections.ConfigDict() for _ in range(3))
  for name, (cfg, what, seed) in rows.items():
    c.methods[name], c.rows[name], c.start[name] = cfg, what, seed
    if width and seed == "soma_expert":
      cfg.model.d_t = width
  c.reference = "soma"
  c.order = tuple(rows)
  c.keep_width = ("one_expert", "one_expert_bptt")  # width 32; the others match SOMA's params
  c.fresh_optimizer = ("soma_bptt", "one_expert_bptt", "mono_bptt")


# study -> its config function, for every study but table4, table7 (get_config's own) and
# the ladder (its own arguments)
_OWN_CONFIG = {
    "decompose": _decompose, "table6": _table6, "fig7": _fig7, "table5": _table5,
    "fig13": _fig13, "fig16": lambda arg: _ensembles(arg, "fig16")[0], "fig17": _fig17,
    "fig15": _fig15, "table8": _table8, "fig9": _fig9, "table9": _table9, "table3": _table3,
    "narrow": _narrow,
    "spsa15": _spsa15,
}
