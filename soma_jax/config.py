"""The shared ConfigDict every experiment config starts from, size presets, validation.

Config files in `experiments/configs/` call `base_config(...)` and change what their
experiment needs; fields are documented here once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_collections

from soma_jax import budget, layers, memory
from soma_jax.errors import UserError, need
from soma_jax.sizing import PAPER_WIDTH

SIZES = ("tiny", "cpu", "paper")
SIGNS = ("auto", "together", "apart")  # spsa.signs
# Directions per expert per update (spsa.n_pert x spsa.accum) that `validate` accepts: 16,384
# times the paper's 64. One update evaluates 2 x that many forward passes of every expert
# (about 46 minutes at size=tiny on 2 CPU cores, 1e5 directions taking 44 s there), and a
# step of 1e9 ran out of host memory inside its first update instead of finishing.
MAX_DIRECTIONS = 2**20
BUDGET_UNITS = budget.BUDGET_UNITS  # budget_unit (what each counts: budget.COUNTERS)


def parse_arg(arg: str | None, **defaults) -> dict:
  """'n=8,size=tiny' -> {'n': 8, 'size': 'tiny'}, typed like the defaults."""
  out = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    if "=" not in item:
      raise UserError(f"config argument {item!r} is not key=value; e.g. soma.py:n=4,size=cpu")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in defaults:
      raise UserError(f"unknown config argument {key!r}; known: {', '.join(sorted(defaults))}")
    kind = type(defaults[key])
    try:
      out[key] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
    except ValueError as e:
      raise UserError(f"config argument {key}={value!r} is not a {kind.__name__}") from e
  return out


def base_config(n: int = 4, size: str = "cpu") -> ml_collections.ConfigDict:
  """A complete training config for N experts at a size preset."""
  if size not in SIZES:
    raise UserError(f"size={size!r} is not a preset; use one of {', '.join(SIZES)}")
  if n < 1:
    raise UserError(f"n={n} experts; n must be >= 1")
  c = ml_collections.ConfigDict({**_run_fields(n), **_learning_fields(), **_io_fields()})
  c.update_from_flattened_dict(PRESETS[size] if size != "paper" else _paper_preset(n))
  return c


def _run_fields(n: int) -> ml_collections.ConfigDict:
  """The run's top-level fields: method, experts, seed, length, cadences, precision."""
  c = ml_collections.ConfigDict()
  # A name in soma_jax.methods.METHODS: soma | bptt | eggroll (the GRU of SPEC 6) |
  # eggroll_lstm (ES on this body) | head_only | soma_summed (the controls of SPEC 9) |
  # soma15 (SOMA with 1.5-SPSA's curvature-scaled estimate: config.spsa15, docs/spsa15.md)
  c.method = "soma"
  c.n_experts = n  # N: experts, each with its own data shard, loss and Adam state
  c.experts = ""  # "" = all; "a:b" trains experts a..b-1 only, as an independent job
  c.seed = 0  # base key of every probe: (seed, step, expert, accum, direction)
  c.steps = 200  # the step to train to (with a budget: the most it may reach)
  # Stop after the update at which this run's training reaches `budget` (0 = none), counted in
  # budget_unit: "updates" (this run's, since its start or warm start), "ops" (SPEC 7's
  # training operations of this run: updates x the method's ops per update), "cpu_seconds" (the
  # process's CPU time, all threads, of training updates) or "device_seconds" (SPEC 7:
  # host_devices.CHARGE_RULE, core-seconds on a CPU). Evaluation, checkpoints and compilation
  # are never counted.
  c.budget = 0.0
  c.budget_unit = "device_seconds"
  c.budget_checkpoints = 4  # with a budget: checkpoints after 1/k, 2/k, ... k/k of it
  c.log_every = 10  # metrics.jsonl / TensorBoard / console cadence (updates)
  c.eval_every = 50  # expert validation on each expert's 1% split; drives the plateau rule
  c.ensemble_eval_every = 0  # routed ensemble validation cadence (0 = at the end only, -1 = never)
  c.ckpt_every = 50  # checkpoint cadence (also on SIGTERM / SIGINT)
  # The explicit dot algorithm of every matmul of the training step (memory.DOT_ALGORITHMS):
  # on a GPU default = TF32 (SPSA coefficients within 1.2% of full f32 at eps 1e-3,
  # measured on an H200 before the algorithm was explicit), high = 3 TF32 passes, highest =
  # full f32 (1.5x slower there); on a CPU all three are f32. Evaluation is always f32.
  c.precision = "default"
  # A seed workdir (SPEC 3.4): its body and E into every expert, or, a seed of this run's N,
  # its expert e's into expert e (any other N is refused).
  c.init_from = ""
  # With init_from: also carry the seed's Adam moments, plateau state (lr and eps set to this
  # config's) and step counter, so the run continues the seed (SPEC 9.6); steps counts on.
  c.init_state = False
  # With init_from: start from a seed trained on other data (its config_history.jsonl records
  # another data manifest than data.dir's: another corpus, or the data re-prepared since).
  c.init_from_other_data = False
  # On resume, config fields allowed to differ from the saved run on purpose, e.g.
  # "opt.lr,spsa.n_pert" (recorded in config_history.jsonl; shape fields never change).
  c.resume_overrides = ""
  return c


def _learning_fields() -> ml_collections.ConfigDict:
  """config.model, config.spsa, config.spsa15 and config.opt."""
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict()
  c.model.d_t = 64  # body width
  c.model.d_e = 32  # byte-embedding width d_E
  c.model.depth = 2  # residual blocks D
  c.model.shared_head = False  # True: one frozen E shared by all experts (width-32 SOMA)

  c.spsa = ml_collections.ConfigDict()
  c.spsa.n_pert = 16  # directions per batch
  c.spsa.batch = 8  # B: sequences per accumulation batch
  c.spsa.accum = 1  # A: batches per update, each with fresh directions
  c.spsa.eps = 1e-3  # initial perturbation scale (halved with lr on a plateau)
  c.spsa.probe = "sparse"  # sparse | rademacher | gaussian
  # Directions evaluated at once (memory ~ chunk, not n_pert): "auto" = the largest
  # divisor of n_pert whose compiled step fits the GPU, or on a CPU the chunk giving
  # about 8 rows (perturbed copies x B) per iteration (memory.cpu_chunk); or an integer.
  c.spsa.pert_chunk = ml_collections.FieldReference("auto", field_type=object)
  c.spsa.time_block = 64  # positions per block of the streamed SPSA loss (memory ~ this)
  c.spsa.unroll = 1  # LSTM steps per loop iteration in that loss (speed only, same math)
  # The two signs of a direction: "together" (one vmapped pass, 2 C copies per expert per
  # iteration), "apart" (theta + eps z, then theta - eps z: C copies at a time) or "auto"
  # (apart on a CPU, together elsewhere). Speed only: equal to float32 rounding.
  c.spsa.signs = "auto"
  # How each perturbed copy applies theta + s eps z: "direct" (its own weights), "split"
  # (x theta + s eps (x z) for every matrix: one matmul of all copies' rows against the
  # unperturbed theta, and the probe in bf16, read once per +- pair) or "split_recurrence"
  # (only the recurrent w_h). Speed only: coefficients equal to float32 rounding.
  c.spsa.forward = "direct"

  # method=soma15: direction j's coefficient divided by
  # curv_j = max((|L+_j - 2 L0 + L-_j| / eps^2) ** alpha, lam), L0 a clean forward per batch.
  c.spsa15 = ml_collections.ConfigDict()
  c.spsa15.alpha = 0.1  # curvature exponent (>= 0; 0 with lam = 1 is plain SPSA)
  c.spsa15.lam = 1.0  # lambda: the floor of curv_j (> 0)

  c.opt = ml_collections.ConfigDict()
  c.opt.lr = 1e-3  # initial Adam learning rate (per expert, plateau-scheduled)
  c.opt.weight_decay = 0.0  # coupled: lambda * theta added to g_hat before the moments
  c.opt.train_head = True  # delta-rule update of each expert's own E (needs shared_head=False)
  c.opt.patience = 1000  # updates without improvement before halving lr and eps
  c.opt.floor = 1e-5  # lr / eps never decay below this
  return c


def _io_fields() -> ml_collections.ConfigDict:
  """config.data, config.mesh, config.ckpt, config.checkpoint_eval and config.eggroll."""
  c = ml_collections.ConfigDict()
  c.data = ml_collections.ConfigDict()
  c.data.dir = ""  # a folder written by experiments/prepare_data.py
  c.data.seq_len = 256  # T: targets per window (must divide 1024)
  c.data.val_windows = 64  # expert-validation windows per expert per evaluation

  # Both "auto" (the default): on a CPU, one host device per usable core (entry points set
  # that up) with experts over the devices (FSO) when they divide N, else the directions
  # (DDPP), else both; on a GPU one device. Integers choose the layout; one of them "auto"
  # takes the devices the other leaves (parallel.resolve_layout).
  c.mesh = ml_collections.ConfigDict()
  c.mesh.expert = "auto"  # devices along the expert axis (FSO): N / E experts per device
  c.mesh.pert = "auto"  # devices along the direction axis (DDPP): one all-reduce per update

  c.ckpt = ml_collections.ConfigDict()
  c.ckpt.keep = 3  # newest checkpoints kept

  # An evaluation set scored from the state in memory right after every checkpoint saved
  # (the routed top-min(4, N) mixture of `evaluate.TestSet`, its per-window losses written
  # to WORKDIR/checkpoint_scores/; timed apart as eval_seconds), so a study reads them
  # instead of restoring each checkpoint (`checkpoint_scores`). split "" = none (off); else
  # ensemble_val or test of `data_dir` ("" = data.dir): its first `max_windows` 1,025-byte
  # windows spread over documents (0 = all), routed on `route` bytes, `score` targets scored.
  c.checkpoint_eval = ml_collections.ConfigDict()
  c.checkpoint_eval.split = ""
  c.checkpoint_eval.data_dir = ""
  c.checkpoint_eval.max_windows = 0
  c.checkpoint_eval.route = 256
  c.checkpoint_eval.score = 768

  c.eggroll = ml_collections.ConfigDict()
  c.eggroll.pop = 256  # population (antithetic pairs count twice)
  c.eggroll.rank = 1
  c.eggroll.sigma = 1e-2
  c.eggroll.pop_chunk = 64
  # method=eggroll: bytes each antithetic pair reads from its own stream per update (the
  # members' GRU states carry on between updates); eggroll_lstm reads the shared batch.
  c.eggroll.segment = 100
  return c


# Each size preset: the fields it changes ({dotted name: value}); paper's depend on N.
PRESETS = {
    "cpu": {  # demo scale on 2 cores: minutes
        "opt.lr": 3e-3,  # a short run needs a larger step than the paper's 1e-3 (measured)
        "spsa.batch": 2,  # T = 1024 covers the scored targets 257..1024; B * T as at 8 x 256
        # 2 cores: the fastest step at N = 1, 2, 4 and 8 used 256 rather than 128
        # (docs/results/step_sweep_cpu_n*.json)
        "spsa.time_block": 256,
        "data.seq_len": 1024, "data.val_windows": 16,
    },
    "tiny": {  # unit tests: seconds
        "model.d_t": 8, "model.d_e": 8,
        "spsa.n_pert": 4, "spsa.batch": 2, "spsa.pert_chunk": 4,
        "data.seq_len": 32, "data.val_windows": 4,
        "steps": 6, "log_every": 2, "eval_every": 3, "ckpt_every": 3,
        # Full float32 on a GPU too, as the tests' process default (tests/conftest.py): the
        # step's precision is an explicit algorithm now, which would otherwise be TF32 there.
        "precision": "highest",
        "eggroll.pop": 8, "eggroll.pop_chunk": 4, "eggroll.segment": 16,
    },
}


def _paper_preset(n: int) -> dict[str, Any]:
  """SPEC settings for N experts: T = 1024, n_pert = B = 64, lr = eps = 1e-3."""
  d_t = PAPER_WIDTH.get(n, 32)
  wide = d_t != 32
  return {
      "model.d_t": d_t, "model.shared_head": not wide,
      "opt.train_head": wide, "opt.weight_decay": 1e-4 if wide else 0.0,
      # the wide controls (N = 1, 2, 8, monoliths) start at lr = eps = 0.0025
      **({"opt.lr": 0.0025, "spsa.eps": 0.0025} if wide else {}),
      # Measured on an H200 at n_pert 64 in one chunk: width 361 runs alike at time_block 16
      # and 64 (2.34 vs 2.33 s, 10.9 vs 23.4 GB planned), so wide presets take 16 (64
      # directions fit a 16 GB GPU); width 32 at N = 16 is 1.20x faster at 64 (0.79 vs 0.95 s).
      "spsa.n_pert": 64, "spsa.batch": 64, "spsa.time_block": 16 if wide else 64,
      "data.seq_len": 1024, "data.val_windows": 256,
      "steps": 100_000, "log_every": 50, "eval_every": 500, "ckpt_every": 1000,
      "eggroll.pop": 2**20, "eggroll.pop_chunk": 4096,
  }


def _int(lo: int, hi: int | None = None) -> tuple[str, Callable[[Any], bool]]:
  text = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
  return text, lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo
                          and (hi is None or v <= hi))


def _real(lo: float, strict: bool) -> tuple[str, Callable[[Any], bool]]:
  text = f"a finite number {'>' if strict else '>='} {lo:g}"
  return text, lambda v: (isinstance(v, int | float) and not isinstance(v, bool)
                          and math.isfinite(v) and (v > lo if strict else v >= lo))


def _one_of(*choices: Any) -> tuple[str, Callable[[Any], bool]]:
  return "one of " + ", ".join(map(str, choices)), lambda v: v in choices


def _auto_or_int(lo: int) -> tuple[str, Callable[[Any], bool]]:
  text, ok = _int(lo)
  return f"auto or {text}", lambda v: v == "auto" or ok(v) or (
      isinstance(v, str) and v.strip().isdigit() and ok(int(v)))


_BOOL = ("True or False", lambda v: isinstance(v, bool))
_STR = ("a string", lambda v: isinstance(v, str))

# Every field of `base_config` and the values that give a meaningful run: `validate` refuses
# anything else before the first update (a non-finite lr trained nothing and said "done";
# ckpt.keep=0 kept no checkpoint). tests/test_config_ranges.py checks every field is here.
FIELD_RANGES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "method": _STR, "experts": _STR, "init_from": _STR, "resume_overrides": _STR,
    "n_experts": _int(1), "seed": _int(0), "steps": _int(1),
    "budget": _real(0, strict=False), "budget_unit": _one_of(*BUDGET_UNITS),
    "budget_checkpoints": _int(1), "log_every": _int(1), "eval_every": _int(1),
    # optional (no base_config field): the checkpoints' fractions of the budget, growing
    # strictly within (0, 1] and ending at 1 (a study's log-spaced curve), in place of
    # budget_checkpoints' 1/k, 2/k, ...
    "budget_marks": ("a tuple of fractions growing strictly within (0, 1], the last 1",
                     lambda v: isinstance(v, tuple | list) and len(v) > 0 and all(
                         isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                     and list(v) == sorted(set(v)) and 0 < v[0] and v[-1] == 1),
    "ensemble_eval_every": _int(-1), "ckpt_every": _int(1),
    "precision": _one_of(*memory.PRECISIONS), "init_state": _BOOL,
    "init_from_other_data": _BOOL,
    "model.d_t": _int(1), "model.d_e": _int(1), "model.depth": _int(1),
    "model.shared_head": _BOOL,
    "spsa.n_pert": _int(1), "spsa.batch": _int(1), "spsa.accum": _int(1),
    "spsa.eps": _real(0, strict=True), "spsa.probe": _one_of("sparse", "rademacher", "gaussian"),
    "spsa.pert_chunk": _auto_or_int(1), "spsa.time_block": _int(1), "spsa.unroll": _int(1),
    "spsa.signs": _one_of(*SIGNS), "spsa.forward": _one_of(*layers.FORWARDS),
    "spsa15.alpha": _real(0, strict=False), "spsa15.lam": _real(0, strict=True),
    "opt.lr": _real(0, strict=True), "opt.weight_decay": _real(0, strict=False),
    "opt.train_head": _BOOL, "opt.patience": _int(1), "opt.floor": _real(0, strict=True),
    "data.dir": _STR, "data.seq_len": ("a divisor of 1024 (e.g. 256 or 1024)",
                     lambda v: type(v) is int and v >= 1 and 1024 % v == 0),
    "data.val_windows": _int(1),
    "mesh.expert": _auto_or_int(1), "mesh.pert": _auto_or_int(1),
    "ckpt.keep": _int(1),
    "checkpoint_eval.split": _one_of("", "ensemble_val", "test"),
    "checkpoint_eval.data_dir": _STR, "checkpoint_eval.max_windows": _int(0),
    "checkpoint_eval.route": _int(1), "checkpoint_eval.score": _int(1),
    "eggroll.pop": _int(2), "eggroll.rank": _int(1), "eggroll.sigma": _real(0, strict=True),
    "eggroll.pop_chunk": _int(1), "eggroll.segment": _int(1, 1024),
}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}: a config's fields by dotted name (`c.to_dict()`)."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def validate(c: ml_collections.ConfigDict) -> None:
  """Raise a UserError naming the field and the fix for any impossible setting.

  Every field of `c` named in FIELD_RANGES is checked against it (fields a config lacks are
  not); then the checks across fields. `methods.validate` adds the method's own.
  """
  for key, value in flatten(c.to_dict()).items():
    if key in FIELD_RANGES:
      text, ok = FIELD_RANGES[key]
      need(ok(value), f"{key}={value!r} is out of range: it must be {text}; fix: "
           f"--config.{key}=VALUE in that range")
  s = c.spsa
  chunk = pert_chunk(s.pert_chunk)
  need(chunk == "auto" or s.n_pert % min(chunk, s.n_pert) == 0,
       f"spsa.pert_chunk={s.pert_chunk} must divide spsa.n_pert={s.n_pert} (or be auto)")
  directions = s.n_pert * s.get("accum", 1)
  need(directions <= MAX_DIRECTIONS,
       f"spsa.n_pert={s.n_pert:,} x spsa.accum={s.get('accum', 1)} = {directions:,} directions per "
       f"update is more than {MAX_DIRECTIONS:,} (the paper uses 64; each direction is two "
       "forward passes of every expert, so the first update would not finish); fix: "
       f"--config.spsa.n_pert={min(s.n_pert, MAX_DIRECTIONS)} or fewer")
  need(not (c.model.shared_head and c.opt.train_head),
       "opt.train_head=True needs model.shared_head=False (a shared head stays frozen)")
  expert_range(c.experts, c.n_experts)
  _check_checkpoint_eval(c)


def _check_checkpoint_eval(c: ml_collections.ConfigDict) -> None:
  """checkpoint_eval (when on): pieces inside the trained context that tile a 1,025-byte
  window, scored by a job holding every expert (the mixture routes over all N)."""
  e = c.get("checkpoint_eval")
  if e is None or not e.split:
    return
  span, t = e.route + e.score, c.data.seq_len
  need(span <= t and 1024 % span == 0,
       f"checkpoint_eval.route + checkpoint_eval.score = {e.route} + {e.score} must divide 1024 "
       f"and be <= data.seq_len = {t}; fix: --config.checkpoint_eval.score={t - min(e.route, t // 4)}"
       f" --config.checkpoint_eval.route={min(e.route, t // 4)}")
  need(not c.experts, f"checkpoint_eval needs the whole run, not experts={c.experts!r} (the "
       "mixture routes over all N experts); fix: --config.checkpoint_eval.split=''")


def pert_chunk(v: object) -> int | str:
  """spsa.pert_chunk as "auto" or a positive int (command lines may give "16")."""
  if isinstance(v, str) and v.strip().isdigit():
    v = int(v)
  if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
    return v
  raise UserError(f"spsa.pert_chunk={v!r} must be auto or a positive integer dividing n_pert")


def expert_range(experts: str, n_experts: int) -> tuple[int, int]:
  """The [start, stop) experts a job trains, from config.experts ('' or 'a:b')."""
  if not experts:
    return 0, n_experts
  try:
    a, b = (int(x) for x in str(experts).split(":"))
  except ValueError as e:
    raise UserError(f"experts={experts!r} must look like 'a:b', e.g. 0:4") from e
  if not 0 <= a < b <= n_experts:
    raise UserError(f"experts={experts!r} is out of range for n_experts={n_experts}; "
                    f"use a:b with 0 <= a < b <= {n_experts}")
  return a, b


def load_config_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file given by path (one config may build on another)."""
  import importlib.util
  import os

  name = "_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
