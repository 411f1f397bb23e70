"""The shape of the code (issue 20): no import cycle inside soma_jax (imports inside functions
count), no function over 60 lines in soma_jax/, experiments/, benchmarks/ or scripts/, a
method's name read only in soma_jax/methods/, a model's pytree keys tested only where the
model defines them, no sys.path edits in benchmarks/, scripts/ or tests/. Each test reads the source with `ast`; nothing is imported or run."""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 60


def _sources(*folders: str) -> dict[str, ast.Module]:
  out = {}
  for folder in folders:
    for where, _, names in os.walk(os.path.join(ROOT, folder)):
      for name in sorted(names):
        if name.endswith(".py"):
          path = os.path.join(where, name)
          with open(path, encoding="utf-8") as f:
            out[os.path.relpath(path, ROOT)] = ast.parse(f.read(), path)
  return out


def _module_name(path: str) -> str:
  parts = path[:-3].split(os.sep)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
  """soma_jax module -> the soma_jax modules it imports, wherever the import statement is.

  `from pkg import name` names the module pkg.name when that is a module, else pkg. A
  submodule's import does not count as importing its parent package (Python initialises
  the parent first, but the parent's own imports are its own edges)."""
  modules = {_module_name(p) for p in trees}
  graph = {}
  for path, tree in trees.items():
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        edges |= {a.name for a in node.names if a.name in modules}
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for a in node.names:
          full = f"{node.module}.{a.name}"
          edges.add(full if full in modules else node.module)
    graph[_module_name(path)] = {e for e in edges if e in modules} - {_module_name(path)}
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle as [a, b, ..., a], or None (depth-first search)."""
  state, stack = {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for n in sorted(graph.get(m, ())):
      if state.get(n) == "open":
        return stack[stack.index(n):] + [n]
      if n not in state:
        found = visit(n)
        if found:
          return found
    stack.pop()
    state[m] = "done"
    return None

  for m in sorted(graph):
    if m not in state:
      found = visit(m)
      if found:
        return found
  return None


def test_soma_jax_has_no_import_cycle():
  graph = import_graph(_sources("soma_jax"))
  assert "soma_jax.methods" in graph and graph["soma_jax.plan"] >= {"soma_jax.methods"}
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_made_by_an_import_inside_a_function():
  trees = _sources("soma_jax")
  planted = ast.parse("def f():\n  from soma_jax import train\n")  # train imports methods
  trees[os.path.join("soma_jax", "methods", "base.py")].body.extend(planted.body)
  cycle = find_cycle(import_graph(trees))
  assert cycle is not None and {"soma_jax.methods.base", "soma_jax.train"} <= set(cycle)


def long_functions(trees: dict[str, ast.Module]) -> list[str]:
  return [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
          for path, tree in trees.items() for node in ast.walk(tree)
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_over_60_lines():
  assert long_functions(_sources("soma_jax", "experiments", "benchmarks", "scripts")) == []


def test_the_length_check_sees_a_long_function():
  body = "\n".join(f"  x{i} = {i}" for i in range(MAX_LINES))
  assert long_functions({"x.py": ast.parse(f"def f():\n{body}\n")}) == ["x.py:1 f (61 lines)"]


NAME_TEST = re.compile(r"\bmethod\s*(==|!=|\bin\b|\bnot in\b)|\.method\.startswith\(")
PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend|remove)\(|sys\.path\s*(\+?=|\[)")
# A parameter key of a model's pytree tested for (membership or equality): only the files
# that define those pytrees (MODEL_FILES) may look their own keys up.
KEYS = r"(layers|blocks|embed|head|in_proj|out_proj|lstm|mlp|w_h|w_x|u_h|mixer|scale|ln\w*)"
KEY_SNIFF = re.compile(rf"""["']{KEYS}["']\s+(not\s+)?in\s+\w|\bkey\W.*==\s*["']{KEYS}["']""")
MODEL_FILES = tuple(os.path.join("soma_jax", f) for f in ("model.py", "gru.py", "layers.py"))


def _lines(folders, skip=()):
  for path in _sources(*folders):
    if path.startswith(skip):
      continue
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        yield path, i, line


FOLDERS = ("soma_jax", "experiments", "benchmarks", "scripts")


@pytest.mark.parametrize("pattern,what,skip", [
    (NAME_TEST, "a method name tested", (os.path.join("soma_jax", "methods") + os.sep,)),
    (KEY_SNIFF, "a pytree key sniffed", (os.path.join("soma_jax", "methods") + os.sep,)
     + MODEL_FILES)])
def test_method_names_are_read_only_in_the_registry(pattern, what, skip):
  found = [f"{p}:{i}: {line.strip()}" for p, i, line in _lines(FOLDERS, skip=skip)
           if pattern.search(line.split("#", 1)[0])]
  assert found == [], f"{what} outside {', '.join(skip)}: {found}"


def test_the_name_checks_match_what_they_forbid():
  assert NAME_TEST.search('if c.method == "soma":') and NAME_TEST.search("c.method in (a, b)")
  assert KEY_SNIFF.search('if "layers" in body:') and not NAME_TEST.search("c.method = x")
  for sniff in ('linear(x, body["in_proj"]) if "in_proj" in body else x',
                'getattr(path[-1], "key", None) == "w_h"', 'if "w_h" not in p:'):
    assert KEY_SNIFF.search(sniff), sniff
  assert not KEY_SNIFF.search('body["blocks"][0]["lstm"]') and not KEY_SNIFF.search('== "soma"')


def study_names_written(trees: dict[str, ast.Module], names: list[str]) -> list[str]:
  """Where a string of code (not a docstring, not a Study's own `name=`) is a study's name or
  says `study=NAME` or `runs/NAME`: the places a renamed study would be missed."""
  said = re.compile(rf"^({'|'.join(names)})$|\b(study=|runs/)({'|'.join(names)})(?![a-z0-9])")
  found = []
  for path, tree in trees.items():
    skip = set()
    for node in ast.walk(tree):
      body = getattr(node, "body", None)
      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body and isinstance(
          body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.add(id(body[0].value))  # a docstring: its commands are for readers
      if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Study":
        skip |= {id(k.value) for k in node.keywords if k.arg == "name"}
    found += [f"{path}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
              and said.search(n.value)]
  return found


def test_a_study_name_is_written_only_in_its_study():
  """Renaming a study is one edit (`base.Study.name`): code reads the name from its Study."""
  from soma_jax.studies import compare

  assert study_names_written(_sources(*FOLDERS), list(compare.STUDIES)) == []


def test_the_study_name_check_sees_one():
  tree = ast.parse('"""study=fig7 in a docstring."""\nS = base.Study(name="fig7")\n'
                   'def f():\n  return g(c, "fig7"), f"study=fig7,size={s}", "runs/fig7_cpu"\n')
  assert sorted(f.split(" ", 1)[1] for f in study_names_written({"x.py": tree}, ["fig7"])) == [
      "'fig7'", "'runs/fig7_cpu'", "'study=fig7,size='"]


def test_no_sys_path_edits_in_benchmarks_scripts_or_tests():
  found = [f"{p}:{i}" for p, i, line in
           _lines(("benchmarks", "scripts", "tests"), skip=(os.path.join("tests", "test_structure.py"),))
           if PATH_EDIT.search(line)]
  assert found == []
  assert PATH_EDIT.search("sys.path.insert(0, ROOT)") and not PATH_EDIT.search("on `sys.path`")


# ------------------------------------------------------------------- bind at resolve (issue 38)

CONFIG_NAMES = {"c", "config", "run_cfg", "seed_c", "rc", "vc"}
# Where a raw ConfigDict may still be a parameter: building and validating configs, the
# resolver and each method's `make`, config.json's own I/O, and the entry points that resolve.
# The studies build configs (their config space) and resolve each one where they build it.
RAW_CONFIG_ALLOWED = {
    "soma_jax/config.py": None, "soma_jax/checkpoint.py": None, "soma_jax/records.py": None,
    "soma_jax/cli.py": None, "soma_jax/merge.py": None,
    "soma_jax/spec.py": {"resolve"}, "soma_jax/train.py": {"run"},
    "soma_jax/methods/lstm.py": {"settings"},
    "soma_jax/methods/eggroll.py": {"make", "es_config", "check_gru_generation"},
}


def _takes_raw_config(fn: ast.FunctionDef) -> bool:
  args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
  for a in args:
    note = ast.unparse(a.annotation) if a.annotation is not None else ""
    if "ConfigDict" in note or (a.arg in CONFIG_NAMES and not note):
      return True
  return False


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
  """A module's top-level functions and its classes' methods."""
  return [n for n in tree.body if isinstance(n, ast.FunctionDef)] + [
      m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
      if isinstance(m, ast.FunctionDef)]


def raw_config_functions(trees: dict[str, ast.Module]) -> list[str]:
  """Top-level functions and methods below the resolver that take a raw config."""
  found = []
  for path, tree in trees.items():
    rel = path.replace(os.sep, "/")
    allowed = RAW_CONFIG_ALLOWED.get(rel, set())
    if allowed is None or rel.startswith("soma_jax/studies/"):
      continue
    if rel.startswith("soma_jax/methods/") and rel not in RAW_CONFIG_ALLOWED:
      allowed = {"make"}
    nodes = _functions(tree)
    found += [f"{rel}:{n.lineno} {n.name}" for n in nodes
              if n.name not in allowed and _takes_raw_config(n)]
  return found


def test_no_function_below_the_resolver_takes_a_raw_config():
  """A config is read once, by `spec.resolve` and each method's `make`: everything below
  holds the RunSpec, the Method or their fields."""
  assert raw_config_functions(_sources("soma_jax")) == []


def test_the_raw_config_check_sees_one():
  tree = {"soma_jax/spec.py": ast.parse(
      "def place(spec, c: ml_collections.ConfigDict):\n  pass\ndef f(c):\n  pass\n"
      "def g(c: jax.Array):\n  pass\ndef resolve(c):\n  pass\n")}
  assert raw_config_functions(tree) == ["soma_jax/spec.py:1 place", "soma_jax/spec.py:3 f"]


# In soma_jax/studies/ one rule, no list of doors: a raw config is taken by the driver, by a
# study's config and checks, and by the builders of configs and specs (`_at_a_study_door`);
# everything below holds its typed spec (planning.StudyPlan, table7.Grid, ladder.LadderSpec,
# decompose.Rows, narrow.Narrow, spsa15.Alphas, independent.Settings,
# variance_settings.VarianceSpec, spec.RunSpec).
DRIVER = ("driver.py", "compare.py")  # the one driver and its registry's door (`compare.run`)
BUILT = re.compile(r"\bConfigDict\b|\bRunSpec\b|\bVarianceSpec\b")  # what a builder returns


def _at_a_study_door(rel: str, fn: ast.FunctionDef) -> bool:
  """The one rule: the driver (DRIVER), a study's config (`config(arg)` and its `_config_*`
  helpers) and its checks (`check(plan, config)` and `check_*`, which read the config once
  into the study's typed grid), and a builder: a function that returns a config or a
  resolved spec (recipes, `planning.sized`, `training.budgeted`, `variance_spec`)."""
  returns = ast.unparse(fn.returns) if fn.returns is not None else ""
  return (os.path.basename(rel) in DRIVER or fn.name in ("config", "check")
          or fn.name.startswith(("_config_", "check_")) or bool(BUILT.search(returns)))


def study_raw_config_functions(trees: dict[str, ast.Module]) -> list[str]:
  """Functions of soma_jax/studies/ that take a raw config and are not at a study's door."""
  found = []
  for path, tree in trees.items():
    rel = path.replace(os.sep, "/")
    if rel.startswith("soma_jax/studies/"):
      found += [f"{rel}:{n.lineno} {n.name}" for n in _functions(tree)
                if _takes_raw_config(n) and not _at_a_study_door(rel, n)]
  return found


def test_studies_take_a_raw_config_only_at_their_doors():
  """Issue 38, 51: in soma_jax/studies/ a raw config is taken only by the driver, a study's
  config and checks, and a builder of configs or specs (`_at_a_study_door`)."""
  assert study_raw_config_functions(_sources("soma_jax")) == []


def test_the_study_door_check_sees_one():
  """A study's check, a builder and the driver pass; a study's `run` and a helper that
  returns no config do not."""
  tree = {"soma_jax/studies/independent.py": ast.parse(
      "def check(config):\n  pass\ndef run(config):\n  pass\n"
      "def sizes(ls, width):\n  pass\n"
      "def rung(config, width) -> ml_collections.ConfigDict:\n  pass\n"
      "def spec(c) -> spec_lib.RunSpec:\n  pass\ndef summary(c) -> dict:\n  pass\n"),
      "soma_jax/studies/driver.py": ast.parse("def run(study, config):\n  pass\n")}
  assert study_raw_config_functions(tree) == ["soma_jax/studies/independent.py:3 run",
                                              "soma_jax/studies/independent.py:11 summary"]


# Issue 51: functions of soma_jax/, experiments/, benchmarks/ and scripts/ that take a raw
# config, doors included (70 before issue 51's refactor, 59 after it).
RAW_CONFIG_CEILING = 60


def raw_config_takers(trees: dict[str, ast.Module]) -> list[str]:
  """Every top-level function and method that takes a raw config, doors included."""
  return [f"{path}:{n.lineno} {n.name}" for path, tree in trees.items()
          for n in _functions(tree) if _takes_raw_config(n)]


def test_at_most_the_ceiling_of_functions_take_a_raw_config():
  """A config is read at the doors (the driver, each study's config and check, spec.resolve,
  each method's make, config builders, config.json I/O) and nowhere else: their count stays
  at most RAW_CONFIG_CEILING."""
  found = raw_config_takers(_sources("soma_jax", "experiments", "benchmarks", "scripts"))
  assert len(found) <= RAW_CONFIG_CEILING, (
      f"{len(found)} functions take a raw config (at most {RAW_CONFIG_CEILING}); pass the "
      "RunSpec, a study's typed grid or their fields below the doors:\n" + "\n".join(found))


def test_the_ceiling_count_sees_each_taker():
  tree = {"x.py": ast.parse("def f(c):\n  pass\nclass K:\n  def g(self, config):\n    pass\n"
                            "def h(spec: RunSpec):\n  pass\n")}
  assert raw_config_takers(tree) == ["x.py:1 f", "x.py:4 g"]


METHOD_API = {"Method", "Seed", "MAKERS", "make"}  # what soma_jax.methods offers outside it


def method_module_imports(trees: dict[str, ast.Module]) -> list[str]:
  """Imports of one method's module (`from soma_jax.methods import soma`, ...) outside
  soma_jax/methods/: a method is reached through its resolved spec."""
  found = []
  for path, tree in trees.items():
    if path.startswith(os.path.join("soma_jax", "methods") + os.sep):
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module == "soma_jax.methods":
        found += [f"{path}:{node.lineno} {a.name}" for a in node.names if a.name not in METHOD_API]
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("soma_jax.methods."):
        found.append(f"{path}:{node.lineno} {node.module}")
      elif isinstance(node, ast.Import):
        found += [f"{path}:{node.lineno} {a.name}" for a in node.names
                  if a.name.startswith("soma_jax.methods.")]
  return found


def test_no_method_module_imported_outside_methods():
  assert method_module_imports(_sources(*FOLDERS)) == []


def test_the_method_import_check_sees_one():
  tree = ast.parse("from soma_jax.methods import Method, soma\nimport soma_jax.methods.lstm\n"
                   "from soma_jax.methods.base import Seed\n")
  assert method_module_imports({"x.py": tree}) == [
      "x.py:1 soma", "x.py:2 soma_jax.methods.lstm", "x.py:3 soma_jax.methods.base"]
