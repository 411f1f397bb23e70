#!/usr/bin/env bash
# variance_trained.sh OUT STUDY: a variance study at size=trained (T = 1024, sparse probes) on
# trained weights, trained first when not there yet (a finished run is reused); writes
# OUT/STUDY.{json,csv,png}.
#   shared_vs_separate, n_pert: the trained SOMA N = 8 of scripts/train_ensemble.py in
#     ${TRAINED:-runs/trained_n8}.
#   experts, reference: one trained SOMA run per N of the study's n_list, at one total size,
#     by scripts/train_sizes.py in ${TRAINED_SIZES:-runs/trained_sizes} (both studies share it).
set -euo pipefail
OUT=$1
STUDY=$2
PY=${PY:-.venv/bin/python}
CONFIG="experiments/configs/variance.py:$STUDY,size=trained"
case "$STUDY" in
  experts|reference)
    TRAINED_SIZES=${TRAINED_SIZES:-runs/trained_sizes}
    $PY -m scripts.train_sizes --config="$CONFIG" --out="$TRAINED_SIZES"
    $PY experiments/variance.py --config="$CONFIG" --x64 \
      --config.trained_dir="$TRAINED_SIZES" --out="$OUT"
    ;;
  *)
    TRAINED=${TRAINED:-runs/trained_n8}
    $PY -m scripts.train_ensemble --out="$TRAINED"
    $PY experiments/variance.py --config="$CONFIG" --x64 --workdir="$TRAINED/ensemble" --out="$OUT"
    ;;
esac
