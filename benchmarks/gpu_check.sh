#!/usr/bin/env bash
# Everything a lent GPU is for, in a few prepared runs (the device tool lends an H200 for
# 15 minutes in all, the machine's start included). `bash benchmarks/gpu_check.sh MODE`:
#   bench   (about 7 min at most; each part capped) the 4096 matmul's rate at each precision,
#           the issue's rows N = 2 and N = 16 at n_pert 64 with spsa.forward direct, split
#           and split_recurrence, N = 1 and N = 8 at n_pert 16 direct and split (each row's
#           fraction of the matmul rate beside it), then the SPSA coefficients of every
#           precision x forward against highest/direct at the N = 2 shape (the 2% target).
#   profile (about 3 min at most) where the step's time goes at N = 2 and N = 16, direct and
#           split: kernels ranked, op classes, whether the dots run as TF32 GEMMs.
#   tests   the test suite (not slow) on the GPU and the notebook's GPU path, side by side.
#   all     bench, then tests; sweep: time_block / unroll / signs variants, then the tests.
#   lease   (about 9 min) bench's N = 2 / N = 16 rows at each forward, the A/B of XLA's
#           whole-loop CUDA graphs (+WHILE, with and without unrolled loops), a profile
#           for the TF32 check and the CPU studies' shapes (N = 2 width 32, n_pert 4, B 4,
#           T 256); then `TEST_LIMIT=150 ... tests` in a second run.
# For a 15-minute lease: one run of `bench` (timeout 480 s), then `profile` and
# `TEST_LIMIT=150 ... tests` in a second (timeout 400 s), each with BUNDLE=1. Logs and
# JSON go to $OUT (the markdown tables are in the logs and follow from the JSON); every
# paper_shapes JSON is rewritten after each row, so a part stopped at its cap keeps its rows.
# Dry run on a CPU first: QUICK=1 OUT=/tmp/gc bash benchmarks/gpu_check.sh
set -uo pipefail
WHAT=${1:-all}
OUT=${OUT:-gpu_out}
PY=${PY:-python3}
QUICK=${QUICK:-0}
# The device tool returns at most 8 files from $OUT: with BUNDLE=1 everything is written
# to a work folder and packed into $OUT/gpu_check_<mode>.tgz at exit (check.log beside it).
if [ "${BUNDLE:-0}" = 1 ]; then
  DEST=$OUT; OUT=$(mktemp -d); mkdir -p "$DEST"
  trap 'tar -czf "$DEST/gpu_check_$WHAT.tgz" -C "$OUT" . && cp "$OUT/check.log" "$DEST/check_$WHAT.log"' EXIT
fi
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

if [ "$QUICK" = 1 ]; then  # every part below at tiny sizes, on whatever device is here
  part paper_shapes_64 300 $PY -m benchmarks.paper_shapes --rows=n16 --n_pert=2 --reps=1 \
    --forward=direct,split,split_recurrence --matmul_rate \
    --json "$OUT/paper_shapes_64.json" --md "$OUT/paper_shapes_64.md"
  part coefficients 300 $PY -m benchmarks.coefficients --n_pert=4 \
    --config=experiments/configs/soma.py:n=2,size=tiny --json "$OUT/coefficients.json"
  part spsa_step 300 $PY -m benchmarks.spsa_step \
    --config=experiments/configs/soma.py:n=2,size=tiny --reps=2 --json "$OUT/spsa_step.json"
  part pytest 300 $PY -m pytest -q -x -p no:cacheprovider tests/test_memory.py -k algorithm
  part profile_n2_split 120 $PY -m benchmarks.profile_step --steps=1 --top=10 \
    --config=experiments/configs/soma.py:n=2,size=tiny --config.spsa.forward=split \
    --json "$OUT/profile_n2_split.json"
  exit 0
fi

# Several JAX processes share the GPU below (pytest workers and the notebook): without this
# each one would try to take 75% of its memory at start-up (the Makefile exports it too).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Compiled programs persist across the processes below (a rerun compiles nothing twice).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  # The issue's two target rows, n_pert 64 in one chunk, each forward; the matmul rate at
  # each precision first (rows at default report their fraction of it).
  part paper_shapes_64 270 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=2 \
    --forward=direct,split,split_recurrence --precision=default --matmul_rate \
    --row_timeout=60 --json "$OUT/paper_shapes_64.json"
  part paper_shapes_16 110 $PY -m benchmarks.paper_shapes --rows=n1,n8 --n_pert=16 --reps=2 \
    --forward=direct,split --matmul_rate --row_timeout=45 \
    --json "$OUT/paper_shapes_16.json"
  # Every precision x forward against highest/direct at the N = 2 shape, 8 directions.
  part coefficients 80 $PY -m benchmarks.coefficients --n_pert=8 \
    --config=experiments/configs/soma.py:n=2,size=paper --json "$OUT/coefficients.json"
fi
if [ "$WHAT" = lease ]; then  # one 15-minute lease's measurements in one run (about 9 min)
  # 1. The issue's rows at each forward, with the matmul rate for their fractions.
  part paper_shapes_64 270 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=2 \
    --forward=direct,split,split_recurrence --matmul_rate --row_timeout=60 \
    --json "$OUT/paper_shapes_64.json" --md "$OUT/paper_shapes_64.md"
  # 2. XLA's whole-loop CUDA graphs against today's flags (step 1), at the preset's forward.
  #    Each variant is first tried on a one-op program: a flag this jaxlib rejects skips the
  #    variant (logged) instead of costing the run.
  for v in cmdbuf_while:--xla_gpu_enable_command_buffer=+WHILE \
      "cmdbuf_while_unroll:--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_command_buffer_unroll_loops=true"; do
    name=${v%%:*}; xf=${v#*:}
    if XLA_FLAGS="$xf" timeout 60 $PY -c 'import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()' \
        > "$OUT/probe_$name.log" 2>&1; then
      XLA_FLAGS="$xf" part "$name" 110 $PY -m benchmarks.paper_shapes --rows=n2,n16 --reps=2 \
        --row_timeout=50 --json "$OUT/$name.json" --md "$OUT/$name.md"
    else
      log "skip $name: XLA_FLAGS='$xf' rejected ($(tail -1 "$OUT/probe_$name.log"))"
    fi
  done
  # 3. Do the float32 dots run as TF32 GEMMs at the preset's precision (default)?
  part profile_n2_direct 50 $PY -m benchmarks.profile_step --steps=1 --top=40 \
    --config=experiments/configs/soma.py:n=2,size=paper --json "$OUT/profile_n2_direct.json"
  # 4. The CPU studies' shapes (n_pert 4, B 4, T 256, own heads, widths 32 / 32 / 47).
  for s in "study_soma_n2:n=2:32" "study_one_expert:n=1:32" "study_mono_w47:n=1:47"; do
    IFS=: read -r name arg width <<< "$s"
    part "$name" 45 $PY -m benchmarks.spsa_step --step_only --reps=5 \
      --config=experiments/configs/soma.py:$arg,size=cpu --config.model.d_t=$width \
      --config.model.shared_head=False --config.spsa.n_pert=4 --config.spsa.batch=4 \
      --config.data.seq_len=256 --config.spsa.time_block=256 --json "$OUT/$name.json"
  done
  exit 0
fi
if [ "$WHAT" = sweep ]; then  # the streamed loss's speed knobs at the issue's two rows
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
    for f in direct split; do
      part "profile_n${n}_$f" 45 $PY -m benchmarks.profile_step --steps=1 --top=60 \
        --config=experiments/configs/soma.py:n=$n,size=paper --config.spsa.forward=$f \
        --json "$OUT/profile_n${n}_$f.json"
    done
  done
  exit 0
fi
[ "$WHAT" = bench ] && exit 0
# Tests and the notebook share the GPU: timings from here on are not benchmarks.
# -v names each result as it happens: a run stopped at its cap still names its failures
# (with -q, the 2026-12-04 lease's 28 failures went unnamed: its summary never came).
part pytest ${TEST_LIMIT:-190} $PY -m pytest -v -m "not slow" -n 6 -p no:cacheprovider tests \
  --ignore=tests/test_notebook.py &
part notebook ${TEST_LIMIT:-190} $PY -m scripts.run_notebook notebooks/quickstart.ipynb --param SIZE=gpu --param STEPS=${NB_STEPS:-0} \
  --timings "$OUT/notebook_timings.json" &
wait
grep -E "(FAILED|ERROR) tests/" "$OUT/pytest.log" | sort -u >> "$OUT/check.log"
tail -3 "$OUT/pytest.log" | tee -a "$OUT/check.log"
