r"""Turns a corpus into N expert shards, evaluation sets and a router.

  python experiments/prepare_data.py --source=pystdlib --num_clusters=4 --out=/tmp/soma_data
  python experiments/prepare_data.py --source=fineweb_edu:/data/fineweb-edu/sample/100BT \
      --num_clusters=256 --out=/data/soma_fwe
  python experiments/prepare_data.py --source=jsonl:/data/c4/en:text --num_clusters=64 --out=/data/soma_c4
  python experiments/prepare_data.py --source=textdir:/data/manual --extract=auto --out=/data/soma_manual

SOURCE is one of the forms in soma_jax.data.sources.FORMATS (`--help` lists them;
docs/data.md). Bad input prints one line and exits with code 2; an existing --out is only
replaced when the new data dir is complete.
"""

from __future__ import annotations

import sys
import time

from absl import flags, logging

from soma_jax import cli
from soma_jax.data import prepare, sources, web

_SOURCE = flags.DEFINE_string("source", "pystdlib", f"Corpus, one of: {sources.usages(reads=True)}.")
_NUM_CLUSTERS = flags.DEFINE_integer("num_clusters", 8, "Number of clusters = experts N.")
_OUT = cli.output_flag("out", None, "Output data dir (written to a temporary folder, then renamed).", kind="folder")
flags.mark_flag_as_required("out")
_FIT_SAMPLE = flags.DEFINE_integer("fit_sample", 400_000, "Windows sampled to fit tf-idf, SVD and k-means.")
_VAL_FRACTION = flags.DEFINE_float("val_fraction", 0.01, "Expert-validation fraction of each shard (>= 1 window).")
_ENSEMBLE_VAL_DOCS = flags.DEFINE_integer("ensemble_val_docs", 202, "Held-out documents for ensemble validation.")
_TEST_DOCS = flags.DEFINE_integer("test_docs", 4096, "Held-out test documents (one window each).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for sampling, held-out selection, SVD and k-means.")
_MAX_BYTES = flags.DEFINE_integer("max_bytes", None, "Stop reading the corpus after this many bytes.")
_MIN_DF = flags.DEFINE_integer("min_df", 5, "tf-idf min_df (scaled down only for corpora too small for it).")
_MAX_FEATURES = flags.DEFINE_integer("max_features", 50_000, "tf-idf vocabulary size.")
_SVD_DIMS = flags.DEFINE_integer("svd_dims", 128, "Truncated SVD dimensions.")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "data_dir for --source=tfds:NAME.")
_EXTRACT = flags.DEFINE_enum(
  "extract", "none", list(sources.EXTRACT), "Main text of HTML (needs .[web]): html = every document, "
  f"auto = textdir's {' '.join('*' + s for s in web.HTML_SUFFIXES)} files; warc: sources are always extracted.")
_ON_BAD_RECORD = flags.DEFINE_enum(
  "on_bad_record", "fail", list(sources.ON_BAD_RECORD), "A JSON line that does not parse, a record without the field or "
  "not a string, an id neither a string nor an integer, a WARC response that is not HTTP: fail (one line, exit 2) "
  "or skip and count.")
_ASSIGNMENT = flags.DEFINE_enum(
  "assignment", "nearest", list(prepare.ASSIGNMENTS), "nearest: each training window in the shard of its nearest "
  "centroid (SPEC 4); random: the semantic-vs-random control, those shard labels permuted with --assignment_seed "
  "(same shard sizes, same held-out documents, router centroids of the random shards).")
_ASSIGNMENT_SEED = flags.DEFINE_integer("assignment_seed", 0, "Seed of the --assignment=random permutation.")


def main(argv):
  del argv
  t0 = time.time()
  manifest = prepare.prepare(
    _SOURCE.value,
    _NUM_CLUSTERS.value,
    _OUT.value,
    fit_sample=_FIT_SAMPLE.value,
    val_fraction=_VAL_FRACTION.value,
    ensemble_val_docs=_ENSEMBLE_VAL_DOCS.value,
    test_docs=_TEST_DOCS.value,
    seed=_SEED.value,
    max_bytes=_MAX_BYTES.value,
    min_df=_MIN_DF.value,
    max_features=_MAX_FEATURES.value,
    svd_dims=_SVD_DIMS.value,
    tfds_data_dir=_TFDS_DATA_DIR.value,
    extract=_EXTRACT.value,
    on_bad_record=_ON_BAD_RECORD.value,
    assignment=_ASSIGNMENT.value,
    assignment_seed=_ASSIGNMENT_SEED.value,
  )
  print(prepare.summary(manifest, _OUT.value, time.time() - t0))
  for e, terms in enumerate(manifest["top_terms"]):
    logging.info("cluster %d: %s", e, " ".join(terms))
  for note in manifest["notes"]:
    print(f"{'warning' if 'is empty' in note else 'note'}: {note}", file=sys.stderr)

if __name__ == "__main__":
  cli.run(main)
