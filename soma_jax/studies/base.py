"""The `Study` interface: a study's settings and hooks as bound functions (after optax's
`GradientTransformation` and soma_jax.methods' `Method`), run by one driver (`driver.run`).

A study says which runs it trains (`stages`), what it measures of them (`measure`, pure) and
how it shows them (`table`, `plot`, `paper_rows`); the driver owns everything else: the start,
the plan's checks, sizing, the data sets, the seed runs, each stage through the executor,
results.json and table.md. `compare.STUDIES` maps each Study's `name` to it, in one place.

  config(arg)              the study's ConfigDict (compare.py:study=NAME,size=...,KEY=VALUE)
  check(plan, config)      the study's own fields checked before anything trains: its typed
                           grid (config stays at this door; everything below holds the grid)
  stages(grid, setup)      a generator: yields each stage's runs [(RunSpec, workdir, what)],
                           receives their wall seconds once trained (the driver trains each
                           stage by the executor), reads their curves, and returns what it
                           gathered; a multi-stage study (Table 7's lr-then-eps search)
                           decides its next stage from the last one's curves
  data(grid, plan, specs, out)     its data dirs and sets per N (None: one data dir)
  setup(grid, plan, out, executor) its own setup, where it reads another study's runs (None:
                           the driver's: sizing, data, seed runs)
  measure(grid, setup, gathered)   the study's own results.json fields and its `budget`
                           fields (pure: no run is trained or read)
  table(payload)           table.md
  plot(payload, out)       its figures, before results.json is written (None: none)
  paper_rows               its rows of the paper table (`paper.StudyRow`: each reads the
                           study's committed JSON and is bound to the study's name by
                           `paper_rows.ROWS`, which gives it its command; (): none)
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.studies import paper, planning

Job = tuple[spec_lib.RunSpec, str, str]  # a run to train: (its spec, its folder, what it is)
Stages = Generator[list[Job], list[float], Any]


class Data(NamedTuple):
  """A study's data dirs and evaluation sets per N (`driver.one_dir`, or a study's `data`)."""
  dirs: dict[int, str]  # {N: data dir}
  sets: dict[int, tuple[eval_lib.TestSet, eval_lib.TestSet]]  # {N: (validation, test)}
  main: int  # the N whose dir and sets results.json records
  seeds: int  # the N the seed runs train and are scored on
  extra: Any = None  # what else a study's `data` prepared before anything trains


class Setup(NamedTuple):
  """What the driver prepared before a study's stages (`driver.setup`)."""
  plan: planning.StudyPlan
  methods: dict  # {name: its training config, sized (`planning.sized`)}, the reference first
  specs: dict[str, spec_lib.RunSpec]  # each method resolved at the first seed
  ops: dict[str, int]  # each method's operations per update
  data_dir: str  # data.dirs[data.main]
  scored: tuple[eval_lib.TestSet, eval_lib.TestSet]  # data.sets[data.main]: (validation, test)
  seeds: dict[str, dict]  # each seed run's record (`training.train_seeds`)
  out: str
  data: Data


def any_ops(grid: Any, plan: planning.StudyPlan) -> float:
  """The ops tolerance of a study whose rows may differ in cost per update (every one)."""
  del grid, plan
  return 1.0


def plan_ops(grid: Any, plan: planning.StudyPlan) -> float:
  """The ops tolerance of the study's plan (config.ops_tolerance)."""
  del grid
  return plan.ops_tolerance


class Study(NamedTuple):
  """One study with its hooks bound (the module docstring), run by the driver."""
  name: str  # config.study and results.json's `study`: the one place a study's name is written
  spec: str  # what results.json's `spec` records: the SPEC section it reproduces
  config: Callable[[str | None], Any]
  table: Callable[[dict], str]
  check: Callable[..., Any] | None = None
  stages: Callable[..., Stages] | None = None
  measure: Callable[..., dict] | None = None
  # The ops tolerance of the methods' costs per update (`planning.check_equal_ops`).
  ops_tolerance: Callable[[Any, planning.StudyPlan], float] = plan_ops
  # Its data per N (grid, plan, specs, out) -> Data; None: one data dir (`driver.one_dir`).
  data: Callable[..., Data] | None = None
  # Its own setup (grid, plan, out, executor) -> Setup, for a study that may read another
  # study's finished runs instead of training (fig17); None: the driver's (`driver.setup`).
  setup: Callable[..., Setup] | None = None
  plot: Callable[[dict, str], None] | None = None
  # Its rows of the paper table (docs/reproducing.md), readers of its committed JSON.
  paper_rows: tuple[paper.StudyRow, ...] = ()
  # False: a study without the shared plan (methods, seed runs, budget: `planning.check_plan`;
  # table8): its `check` gets plan None and reads its own fields, its own `setup` gives a
  # Setup without plan, and its `measure` every results.json field beyond `results.common`.
  planned: bool = True
