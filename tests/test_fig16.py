"""study=fig16 (the paper's Figure 16): top-k routing, k = 1 .. N, on saved ensembles that
continue one seed run; the k = N mixture and the k = 1 expert checked against an independent
numpy computation from the saved experts."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from soma_jax import evaluate as eval_lib
from soma_jax import runs
from soma_jax.errors import UserError
from soma_jax.studies import driver, fig16
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


def tiny_config(study: str = "fig16", textdir: str = "", seeds: int = 2):
  config = load_config("compare", f"study={study},size=tiny")
  config.source = f"textdir:{textdir}"
  config.prepare.update(PREPARE)
  config.seeds = seeds
  config.bootstrap_draws = 50
  for name in config.ensembles:  # steps large enough that 3 updates set the experts apart
    config.methods[name].opt.lr = config.methods[name].spsa.eps = 0.05
  return config


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_textdir):
  config = tiny_config(textdir=data_textdir)
  out = str(tmp_path_factory.mktemp("fig16") / "out")
  return config, out, driver.run(fig16.STUDY, config, out, "python experiments/compare.py --test")


def val_set(config, out: str, n: int) -> eval_lib.TestSet:
  e = config.eval
  return eval_lib.TestSet(os.path.join(out, f"data_n{n}"), e.val_windows, "ensemble_val",
                          e.route_bytes, e.score_bytes)


def expert_logprobs(workdir: str, val: eval_lib.TestSet) -> np.ndarray:
  """log p_e(y) of every expert at every scored target, [N, windows, score] float64: each
  expert's logits from the saved parameters, normalised here (not evaluate.py's code)."""
  body, head, method = runs.restore_params(workdir)
  shared = runs.read_spec(workdir).shared_head
  x = val.windows
  out = []
  for e in range(jax.tree.leaves(body)[0].shape[0]):
    b = jax.tree.map(lambda a, e=e: a[e], body)
    logits = np.asarray(method.logits(b, head if shared else head[e], jnp.asarray(x[:, :-1])),
                        np.float64)
    lp = logits - logsumexp(logits, axis=-1, keepdims=True)
    out.append(np.take_along_axis(lp, x[:, 1:, None].astype(np.int64), -1)[..., 0][:, val.route:])
  return np.stack(out)


def test_the_cpu_ensembles_are_the_papers_at_this_scale():
  config = load_config("compare", "study=fig16,size=cpu")
  ens = driver.checked(fig16.STUDY, config)[1]
  assert ens.ns == (8, 32) and ens.mark_k == 4 and ens.plan.seeds == (0, 1)
  assert {config.methods[n].model.d_t for n in ens.names} == {32}
  assert ens.plan.budget == 500 and ens.plan.unit == "updates"


@pytest.mark.parametrize("field, value, match", [
    ("mark_k", 0, "mark_k"), ("ensembles", ("n6", "n2"), "growing"),
    ("ensembles", ("n2", "nope"), "ensembles="), ("match_params", True, "match_params"),
])
def test_bad_fields_are_refused(field, value, match):
  config = load_config("compare", "study=fig16,size=tiny")
  config[field] = value
  with pytest.raises(UserError, match=match):
    driver.checked(fig16.STUDY, config)[1]


def test_other_widths_are_refused():
  config = load_config("compare", "study=fig16,size=tiny")
  config.methods.n6.model.d_t = 16
  with pytest.raises(UserError, match="one width"):
    driver.checked(fig16.STUDY, config)[1]


def test_every_ensemble_sweeps_k_after_its_budget(swept):
  config, out, p = swept
  ens = p["measured"]["ensembles"]
  assert list(ens) == list(config.ensembles)
  for name, r in ens.items():
    n = config.methods[name].n_experts
    assert r["n_experts"] == n and r["ks"] == list(range(1, n + 1))
    assert [q["seed"] for q in r["per_seed"]] == p["seeds"]
    per = np.array([[x["nats_per_byte"] for x in q["k_sweep"]] for q in r["per_seed"]])
    assert r["loss"] == pytest.approx(per.mean(axis=0).tolist(), abs=1e-12)
    for q in r["per_seed"]:
      assert q["updates"] == int(config.budget)
      assert [x["k"] for x in q["k_sweep"]] == r["ks"]
      assert all(x["ci95"][0] <= x["ci95"][1] for x in q["k_sweep"])
      assert os.path.isfile(os.path.join(out, "k_sweep", f"{name}_seed{q['seed']}.csv"))
  assert os.path.getsize(os.path.join(out, "fig16.png")) > 1000
  assert p["paper"]["item"] == "Figure 16" and p["paper"]["n_experts"] == [8, 256]
  assert "k = 4" in open(os.path.join(out, "table.md")).read()


def test_k_n_is_the_average_of_all_experts_and_k_1_the_top_expert(swept):
  config, out, p = swept
  for r in p["measured"]["ensembles"].values():
    n = r["n_experts"]
    val = val_set(config, out, n)
    for q in r["per_seed"]:
      lp_NxWxT = expert_logprobs(os.path.join(out, q["workdir"]), val)
      every = -(logsumexp(lp_NxWxT, axis=0) - np.log(n)).mean()
      top = val.router.route(val.windows[:, :val.route], 1)[:, 0]
      own = -lp_NxWxT[top, np.arange(top.size)].mean()
      assert q["k_sweep"][-1]["nats_per_byte"] == pytest.approx(every, abs=1e-6)
      assert q["k_sweep"][0]["nats_per_byte"] == pytest.approx(own, abs=1e-6)
      # the two readings differ (by 7.6e-4 to 2.1e-2 here, agreement within 6e-9): the
      # check can tell the mixture from one expert
      assert abs(every - own) > 1e-4


def test_the_gain_captured_at_the_mark(swept):
  config, _, p = swept
  for r in p["measured"]["ensembles"].values():
    loss, mark = r["loss"], r["mark_k"]
    assert mark == config.mark_k <= r["n_experts"]
    want = (loss[0] - loss[mark - 1]) / (loss[0] - loss[-1]) if loss[0] > loss[-1] else None
    assert r["fraction_captured_at_mark"] == pytest.approx(want)
  assert fig16.captured([2.0, 1.5, 1.2, 1.1, 1.0], 4) == pytest.approx(0.9)
  assert fig16.captured([2.0, 2.0, 2.1], 2) is None
