#!/usr/bin/env bash
# Everything a lent GPU is for, in one run (the device tool lends an H200 for 15 min):
#   1. the paper-shape table: the rows at n_pert 64, the rest at 16 (GPU to itself);
#   2. the SOMA step against its ideals at the cpu preset (efficiency, roofline, loop);
#   3. the test suite on the GPU and the notebook's GPU path, side by side.
# Each part has its own time limit, so one slow part cannot starve the others. Logs and
# JSON go to $OUT. `bash benchmarks/gpu_check.sh [all|bench|tests|sweep|profile]` (default
# all; sweep = the time_block / unroll / signs variants of the two target rows, then the tests;
# profile = where the step's time goes at the two target rows, kernels ranked).
# Dry run on a CPU first: QUICK=1 OUT=/tmp/gc bash benchmarks/gpu_check.sh
set -uo pipefail
WHAT=${1:-all}
OUT=${OUT:-gpu_out}
PY=${PY:-python3}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/check.log"; }
part() {  # part NAME SECONDS CMD...: run with a limit, log its status
  local name=$1 limit=$2; shift 2
  log "start $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  log "end $name: exit $?"
}

log "devices: $($PY -c 'import jax; print(jax.devices(), jax.__version__)' 2>&1 | tail -1)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/check.log" 2>&1

if [ "$QUICK" = 1 ]; then
  part paper_shapes_64 300 $PY -m benchmarks.paper_shapes --rows=n16 --n_pert=2 --reps=1 \
    --json "$OUT/paper_shapes_64.json" --md "$OUT/paper_shapes_64.md"
  part spsa_step 300 $PY -m benchmarks.spsa_step \
    --config=experiments/configs/soma.py:n=2,size=tiny --reps=2 --json "$OUT/spsa_step.json"
  part pytest 300 $PY -m pytest -q -x -p no:cacheprovider tests/test_memory.py
  part profile_n2 120 $PY -m benchmarks.profile_step --steps=1 --top=10 \
    --config=experiments/configs/soma.py:n=2,size=tiny --json "$OUT/profile_n2.json"
  exit 0
fi

# Several JAX processes share the GPU below (pytest workers and the notebook): without this
# each one would try to take 75% of its memory at start-up (the Makefile exports it too).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Compiled programs persist across the processes below (a rerun compiles nothing twice).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  part paper_shapes_64 270 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=3 \
    --row_timeout=135 --json "$OUT/paper_shapes_64.json" --md "$OUT/paper_shapes_64.md"
  part paper_shapes_16 165 $PY -m benchmarks.paper_shapes --rows=n1,n8,n256 --n_pert=16 \
    --reps=2 --row_timeout=55 --json "$OUT/paper_shapes_16.json" --md "$OUT/paper_shapes_16.md"
  part spsa_step 75 $PY -m benchmarks.spsa_step \
    --config=experiments/configs/soma.py:n=4,size=cpu --reps=3 --json "$OUT/spsa_step.json"
fi
if [ "$WHAT" = sweep ]; then  # the streamed loss's speed knobs at the two rows
  for v in "64 1" "16 8"; do
    set -- $v
    part "sweep_tb$1_u$2" 150 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=3 \
      --time_block="$1" --unroll="$2" --row_timeout=75 --json "$OUT/sweep_tb$1_u$2.json" \
      --md "$OUT/sweep_tb$1_u$2.md"
  done
  # spsa.signs=apart (+ then -; a CPU's default); the GPU's default, together, at the same
  # settings is `bench`'s paper_shapes_64.json (run `bench` first).
  part sweep_signs_apart 170 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=3 \
    --signs=apart --row_timeout=75 --json "$OUT/sweep_signs_apart.json" \
    --md "$OUT/sweep_signs_apart.md"
fi
if [ "$WHAT" = profile ]; then  # one step each, n_pert 64 in one chunk, the presets' blocks
  for n in 2 16; do
    part "profile_n$n" 200 $PY -m benchmarks.profile_step --steps=1 --top=60 \
      --config=experiments/configs/soma.py:n=$n,size=paper --json "$OUT/profile_n$n.json"
  done
  exit 0
fi
[ "$WHAT" = bench ] && exit 0
# Tests and the notebook share the GPU: timings from here on are not benchmarks.
part pytest ${TEST_LIMIT:-190} $PY -m pytest -q -m "not slow" -n 6 -p no:cacheprovider tests \
  --ignore=tests/test_notebook.py &
part notebook ${TEST_LIMIT:-190} $PY -m scripts.run_notebook notebooks/quickstart.ipynb --param SIZE=gpu --param STEPS=${NB_STEPS:-0} \
  --timings "$OUT/notebook_timings.json" &
wait
tail -3 "$OUT/pytest.log" | tee -a "$OUT/check.log"
