"""Write report.md, loss_curves.png and report.json for one or more runs on one data dir.

  python experiments/report.py --data_dir=DATA --out=OUT seed=runs/seed soma=runs/soma
"""


from absl import flags

from soma_jax import cli
from soma_jax.errors import UserError
from soma_jax.studies import report

_DATA = flags.DEFINE_string("data_dir", None, "prepared data dir the runs trained on")
_OUT = cli.output_flag("out", None, "folder for report.md / loss_curves.png / report.json", kind="folder")
flags.mark_flags_as_required(["data_dir", "out"])


def main(argv):
  runs = {}
  for item in argv[1:]:
    if "=" not in item:
      raise UserError(f"{item!r} is not NAME=WORKDIR; e.g. soma=runs/soma")
    name, workdir = item.split("=", 1)
    runs[name] = workdir
  if not runs:
    raise UserError("no runs given; pass NAME=WORKDIR arguments")
  report.write_report(cli.workdir_flag(_OUT.value, "--out"), runs, _DATA.value)
  print(f"wrote {_OUT.value}/report.md, loss_curves.png, report.json")


if __name__ == "__main__":
  cli.run(main, positional=True)
