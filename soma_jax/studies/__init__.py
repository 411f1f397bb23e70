"""Studies built on the library: each trains or measures with soma_jax and writes JSON, CSV and
figures. Nothing in soma_jax's core imports from here.

  compare      the paper's comparisons (SPEC 9): study=table4 (allocation at an equal CPU
               or device-time budget) and study=table7 (equal updates, equal tuning), on
               `protocol` (seeds continued, budget units, evaluation span, gains and their
               intervals); table4.py and table7.py hold each protocol
  independent  independent per-expert losses against one summed loss (App. J, Figure 4)
  report       loss curves and final numbers of one or more runs
  variance     the SPEC 5 variance studies (measured against `soma_jax.variance_theory`)
"""
