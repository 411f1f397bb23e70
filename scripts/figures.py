r"""Regenerates the measured figures and numbers (README's headline, the docs/ pages) into docs/.

  python -m scripts.figures            # the cheap figures (each JSON's wall_s: minutes)
  python -m scripts.figures all        # every figure, including hour-long training runs
  python -m scripts.figures eggroll variance_tiny_n_pert   # named figures only

Each figure runs its command in a fresh process, then writes docs/results/NAME.json:

  {"name", "command", "wall_s", "platform", "loadavg_before", "loadavg_after",
   "results": <the command's JSON output>}

and copies its plot (if it makes one) to the docs/ path the pages link. The pages' numbers are
these files' numbers; tests/test_readme_figures.py checks that every number in README's
headline and the measured docs/ pages appears in a committed JSON that its section names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from soma_jax.errors import check_output_args
from soma_jax.studies import table4, table7

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Figure:
  """One command and where its JSON (and plot) land; paths may use {out}, a scratch folder."""

  args: tuple[str, ...]  # python arguments, relative to the repository root
  json: str  # the command's JSON output
  png: str | None = None  # the command's plot, copied to docs/NAME.png unless `dest` is set
  dest: str | None = None  # docs/ path README links for the plot
  cheap: bool = True  # run by a plain `make figures`


def _variance(study: str, size: str) -> Figure:
  cfg = f"experiments/configs/variance.py:{study}" + (",size=tiny" if size == "tiny" else "")
  return Figure(("experiments/variance.py", f"--config={cfg}", "--x64", "--out={out}"),
                json=f"{{out}}/{study}.json", png=f"{{out}}/{study}.png",
                cheap=size == "tiny")


def _variance_trained(study: str) -> Figure:
  """A variance study at size=trained (scripts/variance_trained.sh trains its weights first)."""
  return Figure(("scripts/variance_trained.sh", "{out}", study), json=f"{{out}}/{study}.json",
                png=f"{{out}}/{study}.png", cheap=False)


FIGURES = {
    "demo": Figure(("scripts/demo.sh", "{out}"), json="{out}/report.json",
                   png="{out}/loss_curves.png", dest="docs/demo_loss_curves.png", cheap=False),
    "variance_tiny_shared_vs_separate": _variance("shared_vs_separate", "tiny"),
    "variance_tiny_n_pert": _variance("n_pert", "tiny"),
    "eggroll": Figure(("-m", "benchmarks.eggroll", "--d=128", "--depth=6", "--rank=1", "--pop=32",
                       "--batch=8", "--seq_len=128", "--reps=7", "--json={out}/eggroll.json"),
                      json="{out}/eggroll.json"),
    "input_pipeline": Figure(("-m", "benchmarks.input_pipeline", "--n=2", "--batch=8",
                              "--seq_len=256", "--seconds=5", "--json={out}/input.json"),
                             json="{out}/input.json"),
    "scaling": Figure(("-m", "benchmarks.scaling", "--devices=1,2,4", "--experts_per_device=2",
                       "--json={out}/scaling.json"), json="{out}/scaling.json"),
    "variance_n_pert": _variance("n_pert", "cpu"),  # fresh init, T = 64
    # On the weights of a trained SOMA N = 8 (scripts/train_ensemble.py), T = 1024, sparse.
    **{f"variance_trained_{study}": _variance_trained(study)
       for study in ("shared_vs_separate", "n_pert")},
    # One trained SOMA run per N at one total size (scripts/train_sizes.py), T = 1024, sparse.
    **{f"variance_{study}_trained": _variance_trained(study) for study in ("experts", "reference")},
    "variance_experts": _variance("experts", "cpu"),  # sparse probes, about 2M parameters
    "variance_reference": _variance("reference", "cpu"),  # BPTT reference on disjoint windows
    # The paper's Table 4 and Table 7 protocols (SPEC 9) at CPU scale: about 20 min each.
    **{f"compare_{study}_cpu": Figure(
        ("experiments/compare.py", f"--config=experiments/configs/compare.py:study={study},size=cpu",
         "--out={out}"), json="{out}/results.json", cheap=False)
       for study in (table4.STUDY.name, table7.STUDY.name)},
    "independent_vs_summed_cpu": Figure(
        ("experiments/independent_vs_summed.py",
         "--config=experiments/configs/independent_vs_summed.py:cpu", "--out={out}"),
        json="{out}/results.json", png="{out}/figure4.png",
        dest="docs/independent_vs_summed_cpu.png", cheap=False),
    "bench": Figure(("-m", "benchmarks.spsa_step", "--config=experiments/configs/soma.py:n=4,size=cpu",
                     "--json={out}/spsa_step.json"), json="{out}/spsa_step.json", cheap=False),
    # Needs PyTorch (pip install -e ".[bench]"): the SOMA step against nn.LSTM + MeZO.
    "torch_mezo": Figure(("-m", "benchmarks.torch_mezo", "--json={out}/torch_mezo.json"),
                         json="{out}/torch_mezo.json", cheap=False),
    "torch_mezo_time_block_256": Figure(
        ("-m", "benchmarks.torch_mezo", "--time_block=256", "--json={out}/torch_mezo.json"),
        json="{out}/torch_mezo.json", cheap=False),
    # The CPU's chunk rule (memory.cpu_chunk) and the cpu preset's time block come from these.
    **{f"step_sweep_cpu_n{n}": Figure(
        ("-m", "benchmarks.step_sweep", f"--config=experiments/configs/soma.py:n={n},size=cpu",
         "--pert_chunk=1,2,4", "--time_block=128,256", "--signs=together,apart",
         "--json={out}/sweep.json"),
        json="{out}/sweep.json", cheap=False)
       for n in (1, 2, 4, 8)},
    "bench_repeats": Figure(("-m", "scripts.bench_repeats", "--runs=3", "--json={out}/repeats.json"),
                            json="{out}/repeats.json", cheap=False),
    "merge_rounding_cpu": Figure(("-m", "scripts.merge_rounding", "--json={out}/merge.json"),
                                 json="{out}/merge.json"),
    # XLA's plan at the paper's shapes, compiled on the CPU (what fits a 16 GB GPU).
    **{f"plan_paper_n{n}": Figure(
        ("-m", "benchmarks.plan_memory", f"--config=experiments/configs/soma.py:n={n},size=paper",
         "--pert_chunk=16,32,64", "--signs=together,apart", "--json={out}/plan.json"),
        json="{out}/plan.json")
       for n in (2, 16)},
}


def command_line(fig: Figure) -> str:
  """The command as a user types it, with OUT for the scratch folder."""
  return " ".join(_launcher(fig) + [shlex.quote(a.replace("{out}", "OUT")) for a in fig.args])


def _launcher(fig: Figure) -> list[str]:
  return ["bash"] if fig.args[0].endswith(".sh") else ["python"]


def run(name: str, fig: Figure, docs: str) -> dict:
  """Runs one figure's command; writes docs/results/NAME.json (and its plot); returns it."""
  with tempfile.TemporaryDirectory() as out:
    args = [a.replace("{out}", out) for a in fig.args]
    print(f"[figures] {name}: {command_line(fig)}", flush=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    launcher = [sys.executable] if _launcher(fig) == ["python"] else ["bash"]
    env = dict(os.environ, PYTHONPATH=ROOT, PY=sys.executable)
    proc = subprocess.run([*launcher, *args], cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
      raise SystemExit(f"[figures] {name} failed with exit code {proc.returncode}")
    with open(fig.json.replace("{out}", out)) as f:
      # Paths inside the results name the scratch folder OUT and the checkout ".".
      results = json.loads(f.read().replace(out, "OUT").replace(ROOT, "."))
    record = {"name": name, "command": command_line(fig), "wall_s": round(wall, 1),
              "platform": f"{platform.machine()}, {os.cpu_count()} CPUs",
              # 1, 5 and 15 min load averages as the command started and ended (shared cores)
              "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()],
              "results": results}
    os.makedirs(os.path.join(docs, "results"), exist_ok=True)
    with open(os.path.join(docs, "results", f"{name}.json"), "w") as f:
      json.dump(record, f, indent=1, default=float)
      f.write("\n")
    if fig.png:
      dest = fig.dest or os.path.join("docs", f"{name}.png")
      shutil.copyfile(fig.png.replace("{out}", out), os.path.join(docs, os.path.relpath(dest, "docs")))
  print(f"[figures] {name}: {wall:.0f} s", flush=True)
  return record


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("names", nargs="*",
                      help=f"'all' or figure names: {', '.join(FIGURES)} (default: the cheap ones)")
  parser.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="output folder")
  args = parser.parse_args()
  check_output_args(parser, args, docs="folder")
  if args.names == ["all"]:
    names = list(FIGURES)
  elif args.names:
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
      print(f"error: unknown figure {unknown[0]!r}; fix: use 'all' or one of {', '.join(FIGURES)}",
            file=sys.stderr)
      sys.exit(2)
    names = args.names
  else:
    names = [n for n, f in FIGURES.items() if f.cheap]
  for name in names:
    run(name, FIGURES[name], args.docs)


if __name__ == "__main__":
  main()
