#!/usr/bin/env bash
# make demo: prepare the built-in corpus, train the seed and a SOMA ensemble warm-started
# from it, evaluate both on the held-out test windows, and write OUT/report.md.
set -euo pipefail
OUT=${1:-demo_out}
PY=${PY:-.venv/bin/python}
N=${DEMO_N:-2}
SEED_STEPS=${DEMO_SEED_STEPS:-150}
SOMA_STEPS=${DEMO_SOMA_STEPS:-150}
mkdir -p "$OUT"
t0=$(date +%s)
say() { echo; echo "== [$(( $(date +%s) - t0 ))s] $*"; }
quiet() { grep --line-buffered -v -E "^[IW][0-9]{4} " || true; }  # absl info lines; progress stays

say "1/4 prepare the default corpus (Python's standard library) into $N expert shards"
if [ ! -f "$OUT/data/manifest.json" ]; then
  $PY experiments/prepare_data.py --source=pystdlib --num_clusters="$N" --out="$OUT/data" 2>&1 | quiet
fi

say "2/4 seed: one expert on all shards, SPSA body + delta-rule head ($SEED_STEPS updates)"
$PY experiments/train.py --config=experiments/configs/seed.py:size=cpu \
  --config.data.dir="$OUT/data" --config.steps="$SEED_STEPS" --workdir="$OUT/seed" 2>&1 | quiet

say "3/4 SOMA: $N experts copy the seed, each trains on its own shard ($SOMA_STEPS updates)"
$PY experiments/train.py --config=experiments/configs/soma.py:n=$N,size=cpu \
  --config.data.dir="$OUT/data" --config.init_from="$OUT/seed" --config.steps="$SOMA_STEPS" \
  --workdir="$OUT/soma" 2>&1 | quiet

say "4/4 evaluate on the held-out test windows and write the report"
$PY experiments/report.py --data_dir="$OUT/data" --out="$OUT" seed="$OUT/seed" \
  soma_n$N="$OUT/soma" 2>&1 | quiet
say "done: $OUT/report.md and $OUT/loss_curves.png"
cat "$OUT/report.md"
