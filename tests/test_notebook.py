"""notebooks/quickstart.ipynb runs top to bottom at the tiny size (nbclient, and the plain runner)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig

import nbformat
import pytest

from scripts import run_notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _code_cells(nb) -> list:
  return [c for c in nb.cells if c.cell_type == "code"]


def test_committed_notebook_has_no_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  dirty = [i for i, c in enumerate(_code_cells(nb)) if c.outputs or c.execution_count]
  assert not dirty, f"code cells {dirty} carry outputs; clear them before committing"


def test_cells_are_plain_python_with_one_parameters_cell():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  for i, cell in enumerate(_code_cells(nb)):
    magic = [ln for ln in cell.source.splitlines() if ln.lstrip().startswith(("!", "%"))]
    assert not magic, f"cell {i} uses IPython syntax {magic}; the runner executes plain Python"
    compile(cell.source, f"cell {i}", "exec")
  params = [c for c in _code_cells(nb) if "parameters" in c.metadata.get("tags", [])]
  assert len(params) == 1
  assert {"SIZE", "CORPUS", "WORK", "REPO_URL"} <= run_notebook.assigned_names(params[0].source)


def _outputs_text(nb) -> str:
  parts = []
  for cell in _code_cells(nb):
    for out in cell.outputs:
      parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
  return "".join(parts)


def _kernel_of_this_python(root, monkeypatch) -> str:
  """A kernelspec that runs this interpreter (a user's own `python3` kernel may be another)."""
  spec = root / "kernels" / "soma-test"
  spec.mkdir(parents=True)
  argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
  (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "soma-test",
                                                "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(root))
  return "soma-test"


def test_notebook_runs_at_tiny_size(tmp_path, monkeypatch):
  from nbclient import NotebookClient

  nb = nbformat.read(NOTEBOOK, as_version=4)
  where = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
  work = tmp_path / "work"
  nb.cells.insert(where + 1, nbformat.v4.new_code_cell(
      f"SIZE = 'tiny'\nWORK = {str(work)!r}", metadata={"tags": ["injected-parameters"]}))
  kernel = _kernel_of_this_python(tmp_path / "jupyter", monkeypatch)
  NotebookClient(nb, timeout=600, kernel_name=kernel,
                 resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on any error
  text = _outputs_text(nb)
  assert "nothing to install" in text
  assert "test: " in text and "95% CI" in text
  images = sum("image/png" in out.get("data", {}) for c in _code_cells(nb) for out in c.outputs)
  assert images == 2, "the loss curves and the variance figure are shown inline"
  runs = work / "runs" / "pystdlib_n2_tiny"
  for path in ("seed/summary.json", "soma_n2/summary.json", "report/report.md",
               "report/loss_curves.png", "variance/shared_vs_separate.png"):
    assert (runs / path).is_file(), path
  # The printed test loss is the SOMA run's routed loss as the report computes it, not the seed's.
  printed = float(re.search(r"test: (\d+\.\d+) nats/byte", text).group(1))
  losses = json.loads((runs / "report" / "report.json").read_text())["runs"]
  assert printed == pytest.approx(losses["soma_n2"]["test_nats_per_byte"], abs=6e-4)
  assert printed != pytest.approx(losses["seed"]["test_nats_per_byte"], abs=6e-4)


def _write_notebook(path, sources: list[str], params_at: int = 0) -> str:
  cells = [nbformat.v4.new_code_cell(s) for s in sources]
  cells[params_at].metadata["tags"] = ["parameters"]
  nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
  return str(path)


def test_runner_injects_parameters_and_times_every_cell(tmp_path, capsys):
  nb = _write_notebook(tmp_path / "a.ipynb", [
      "SIZE = 'auto'\nN = 1", "assert SIZE == 'gpu' and N == 4, (SIZE, N)", "print('done', N)"])
  timings = tmp_path / "t.json"
  assert run_notebook.main([nb, "--param", "SIZE=gpu", "--param", "N=4",
                            "--timings", str(timings)]) == 0
  record = json.loads(timings.read_text())
  assert record["status"] == "ok" and record["params"] == {"SIZE": "gpu", "N": 4}
  assert [c["cell"] for c in record["cells"]] == [0, 1, 2]
  assert all(c["seconds"] >= 0 and c["cpu_seconds"] >= 0 for c in record["cells"])
  assert 0 < sum(c["seconds"] for c in record["cells"]) <= record["total_seconds"]
  assert record["command"].endswith("--param SIZE=gpu --param N=4 --timings " + str(timings))
  assert "done 4" in capsys.readouterr().out


def test_runner_stops_at_the_first_failing_cell(tmp_path):
  nb = _write_notebook(tmp_path / "b.ipynb", ["X = 1", "raise SystemExit('boom')", "X = 2"])
  timings = tmp_path / "t.json"
  assert run_notebook.main([nb, "--timings", str(timings)]) == 1
  record = json.loads(timings.read_text())
  assert record["status"] == "error" and record["failed_cell"] == 1
  assert len(record["cells"]) == 2


def test_runner_rejects_unknown_parameters_and_missing_files(tmp_path, capsys):
  nb = _write_notebook(tmp_path / "c.ipynb", ["SIZE = 'auto'", "pass"])
  assert run_notebook.main([nb, "--param", "SIZES=tiny"]) == 2
  assert "SIZES" in capsys.readouterr().err
  assert run_notebook.main([str(tmp_path / "missing.ipynb")]) == 2
  assert run_notebook.main([nb, "--param", "SIZE"]) == 2


@pytest.mark.slow
def test_runner_runs_the_quickstart_from_a_clone_that_is_not_installed(tmp_path):
  """The GPU machine's case: dependencies on PYTHONPATH, soma_jax only in the working tree."""
  timings = tmp_path / "timings.json"
  env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}  # -S: no editable finder
  proc = subprocess.run(
      [sys.executable, "-S", "-m", "scripts.run_notebook", NOTEBOOK, "--param", "SIZE=tiny", "--param",
       f"WORK={tmp_path / 'work'}", "--timings", str(timings)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = json.loads(timings.read_text())
  assert record["status"] == "ok"
  assert len(record["cells"]) == len(_code_cells(nbformat.read(NOTEBOOK, as_version=4)))
  assert "soma_jax is importable; nothing to install" in proc.stdout
  assert "figure: " in proc.stdout  # no IPython shell: figures are named, not displayed
