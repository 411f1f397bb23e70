"""Assemble one ensemble workdir from independent jobs that each trained a slice of experts.

Jobs launched with `--config.experts=a:b` share nothing while training (FSO across
machines with no coupling at all). Merging checks they are slices of one run (same
config apart from `experts`, the same prepared data, same step, the same frozen head)
and writes a workdir that `evaluate.py` (or further training) reads like any other.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import config as config_lib
from soma_jax import metrics as metrics_lib
from soma_jax import runs
from soma_jax.errors import UserError

# Cumulative counters of each job (`budget.COUNTERS`): summed over jobs (ops, seconds), or
# every job's own (updates: the jobs update side by side; one job's count is the run's).
TOTALS = tuple(budget_lib.COUNTERS)


def _combine(key: str, values: list):
  """One counter of the merged run from the jobs' `values`."""
  return max(values) if budget_lib.COUNTERS[key].merged == "same" else sum(values)


def merge(workdirs: list[str], out: str) -> dict:
  """Concatenate the jobs' experts in expert order into a new workdir `out`."""
  if not workdirs:
    raise UserError("no workdirs given; fix: pass the workdirs of the experts=a:b jobs")
  if os.path.exists(os.path.join(out, ckpt_lib.CONFIG_FILE)):
    raise UserError(f"{out!r} already holds a run; fix: choose a new --out")
  with ckpt_lib.WorkdirLock(out, "--out"):  # checks --out is writable before any work
    return _merge_into(workdirs, out)


def _merge_into(workdirs: list[str], out: str) -> dict:
  jobs = []
  for w in workdirs:
    c = ckpt_lib.read_config(w)
    a, b = config_lib.expert_range(c.experts, c.n_experts)
    jobs.append((a, b, w, c))
  jobs.sort(key=lambda j: j[0])
  ref = jobs[0][3]
  _check_slices(jobs)
  ckpt_lib.check_data(jobs[0][2], ref.data.dir, files=(), required=False)  # if here: unchanged
  covered = [e for a, b, _, _ in jobs for e in range(a, b)]
  if covered != list(range(ref.n_experts)):
    raise UserError(f"the jobs cover experts {covered}, not 0..{ref.n_experts - 1} once each; "
                    "fix: pass one workdir per slice, slices tiling all experts")

  restored = [runs.restore_state(w)[:3] for _, _, w, _ in jobs]
  steps = {step for step, _, _ in restored}
  if len(steps) != 1:
    raise UserError(f"the jobs are at different steps {sorted(steps)}; fix: train every job "
                    "to the same step (re-run them with the same --config.steps)")
  states = [s for _, s, _ in restored]
  shared = ref.model.shared_head
  if shared and not all(np.array_equal(states[0].head, s.head) for s in states):
    raise UserError("the jobs' shared heads differ; fix: start every job from the same seed")

  def cat(*xs):
    return jnp.concatenate(xs, axis=0)

  # carry: the GRU EGGROLL's per-expert stream states ([n, pop, depth, d]), () otherwise.
  per_expert = lambda s: (s.body, s.opt, s.head_opt, s.sched, s.skipped, s.carry) + (
      () if shared else (s.head,))
  merged = jax.tree.map(cat, *[per_expert(s) for s in states])
  body, opt, head_opt, sched, skipped, carry = merged[:6]
  head = states[0].head if shared else merged[6]
  state = states[0].replace(body=body, opt=opt, head_opt=head_opt, sched=sched,
                            skipped=skipped, head=head, carry=carry)

  full = ml_collections.ConfigDict(ref.to_dict())
  full.experts = ""
  ckpt_lib.write_config(out, full)
  data_state = dict(restored[0][2])
  it = dict(data_state["iterator"])
  it["experts"] = covered
  data_state = {"iterator": it, **{k: _combine(k, [d[k] for _, _, d in restored])
                                   for k in TOTALS if all(k in d for _, _, d in restored)}}
  step = steps.pop()
  ckpt = ckpt_lib.Checkpointer(out)
  ckpt.save(step, state, data_state)
  ckpt.close()
  _merge_metrics([w for _, _, w, _ in jobs], out)
  ckpt_lib.record_start(out, step, {}, [],  # the data hash the tools check the merged run by
                        ckpt_lib.last_history(jobs[0][2]).get("data_manifest_sha256"))
  return {"out": out, "step": step, "experts": len(covered), "jobs": len(jobs)}


def _check_slices(jobs: list[tuple]) -> None:
  """Slices may differ where a resume may (run length, log / eval / checkpoint cadence,
  precision, device layout, speed knobs), not in anything that changes the experiment; and
  each trained on the same prepared data: the manifest hash it recorded at its start (its
  data dir, one path for all since data.dir is not resumable, may have been re-prepared
  between the jobs)."""
  ref_w, ref = jobs[0][2], jobs[0][3]
  data = ckpt_lib.last_history(ref_w).get("data_manifest_sha256")
  for _, _, w, c in jobs:
    diff = [k for k in ckpt_lib.config_changes(ref, c)
            if not ckpt_lib.under(k, ("experts",) + ckpt_lib.RESUMABLE_KEYS)]
    if diff:
      raise UserError(f"{w!r} has a different config ({', '.join(diff)}) from "
                      f"{ref_w!r}; fix: merge only slices of one run")
    sha = ckpt_lib.last_history(w).get("data_manifest_sha256")
    if None not in (data, sha) and sha != data:
      raise UserError(f"{w!r} trained on other data than {ref_w!r} (another manifest.json in "
                      f"{c.data.dir!r}: re-prepared between the jobs); fix: merge jobs that "
                      "trained on the same prepared data")


def _merge_metrics(workdirs: list[str], out: str) -> None:
  """One metrics.jsonl: per-expert lists concatenated, totals summed, per step."""
  per_job = [{r["step"]: r for r in metrics_lib.read_metrics(w)} for w in workdirs]
  common = sorted(set.intersection(*(set(r) for r in per_job))) if per_job else []
  with open(os.path.join(out, metrics_lib.METRICS_FILE), "w") as f:
    for step in common:
      rows = [r[step] for r in per_job]
      rec = {"step": step}
      for key in rows[0]:
        vals = [row.get(key) for row in rows]
        if any(v is None for v in vals) or key == "step":
          continue
        if isinstance(vals[0], list):
          rec[key] = [x for v in vals for x in v]
        elif key in TOTALS:
          rec[key] = _combine(key, vals)
        elif key == "tokens_per_second":
          rec[key] = sum(vals)
        elif key == "step_seconds":
          rec[key] = max(vals)
      f.write(json.dumps(rec, sort_keys=True) + "\n")
