#!/usr/bin/env bash
# variance_trained.sh OUT STUDY: a variance study (size=trained: T = 1024, sparse probes) on
# the weights of a trained SOMA N = 8, trained first into ${TRAINED:-runs/trained_n8} by
# scripts/train_ensemble.py (reused when already there). Writes OUT/STUDY.{json,csv,png}.
set -euo pipefail
OUT=$1
STUDY=$2
PY=${PY:-.venv/bin/python}
TRAINED=${TRAINED:-runs/trained_n8}
$PY -m scripts.train_ensemble --out="$TRAINED"
$PY experiments/variance.py --config="experiments/configs/variance.py:$STUDY,size=trained" \
  --x64 --workdir="$TRAINED/ensemble" --out="$OUT"
