#!/usr/bin/env bash
# One study on a lent GPU in one command of the device tool (docs/benchmarks.md, "Studies on
# a lent GPU"):
#   bash scripts/device_study.sh NAME CONFIG_ARG K LIMIT
# runs `experiments/compare.py --config=experiments/configs/compare.py:CONFIG_ARG
# --out=runs/dev/NAME --executor=processes:K` (K worker processes sharing the GPU), every row
# and seed run at precision `highest` (float32 dots as on a CPU: TF32 moves the SPSA
# coefficients by about 1%), stopped at LIMIT seconds (the same command resumes it), then packs
# the study's results, figures, log and every run's summary and metrics into $OUT/NAME.tgz.
# A data dir prepared beforehand under runs/dev/NAME/data is used as it is (carry it).
set -uo pipefail
NAME=$1; ARG=$2; K=$3; LIMIT=$4
PY=${PY:-python3}
OUT=$(realpath -m "${OUT:-dev_out}")
DIR=runs/dev/$NAME
mkdir -p "$OUT" "$DIR"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
PREC=$($PY -c "
from experiments.configs import compare
c = compare.get_config('$ARG')
print(' '.join(f'--config.{g}.{k}.precision=highest' for g in ('methods', 'seed_runs')
               for k in c[g] if hasattr(c[g][k], 'keys')))")
{ echo "[$(date +%T)] $NAME: $ARG, processes:$K, limit ${LIMIT}s"
  $PY -c 'import jax; print(jax.devices(), jax.__version__)'
  nproc; uptime; } >> "$DIR/device.log" 2>&1
timeout --signal=INT "$LIMIT" $PY experiments/compare.py \
  --config=experiments/configs/compare.py:$ARG $PREC --out="$DIR" --executor=processes:$K \
  >> "$DIR/device.log" 2>&1
echo "[$(date +%T)] exit $?; $(uptime)" >> "$DIR/device.log"
cd runs/dev && find "$NAME" -maxdepth 1 -type f | sort > /tmp/pack.txt
find "$NAME" -mindepth 2 \( -name "*.png" -o -name summary.json -o -name metrics.jsonl -o -name config.json \
  -o -path "*checkpoint_scores*" -o -name "*.log" \) -type f >> /tmp/pack.txt
tar -czf "$OUT/$NAME.tgz" -T /tmp/pack.txt
tail -5 "$NAME/device.log"
