"""Turns a corpus into N expert shards, evaluation sets and a router (SPEC 4).

`prepare(source, num_clusters, out)` writes into a temporary folder next to
`out` and renames it into place only when everything succeeded, so a failed run
never touches an existing `out`. The same arguments give the same bytes.

`assignment="nearest"` (the default, SPEC 4) puts each training window in the shard of its
nearest centroid. `assignment="random"` is the semantic-vs-random sharding control: the same
clustering and nearest assignment are computed, then that label vector over the training
windows is permuted with `assignment_seed`, so every shard keeps the size the semantic
assignment gave it but holds windows drawn at random. Its router routes to the centroids of
the random shards (each shard's normalised mean clustering feature), not to the semantic
centroids, whose experts would not have been trained on the text routed to them. The
held-out documents and their windows do not depend on `assignment`.

Layout of `out`:
  manifest.json                  sizes, balance, top terms, SHA-256 of every file, settings
  router.npz                     the fitted router (soma_jax.data.router)
  experts/{e:04d}/train.npy      uint8 [n, 1025] training windows of cluster e
  experts/{e:04d}/val.npy        uint8 [n, 1025] expert-validation windows (val_fraction, >= 1)
  ensemble_val.npy, ensemble_val_docs.npy   eval windows (stride 768) of held-out docs + doc index
  test.npy, test_docs.npy        one 1,025-byte window per held-out test doc + doc index
  heldout_docs.json              source ids of the test and ensemble-validation documents
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
import unicodedata
import zipfile

import numpy as np
import scipy.sparse as sp
from absl import logging

from soma_jax.data import clustering, sources, windows
from soma_jax.data import router as router_lib
from soma_jax.data.pipeline import MANIFEST_VERSION, sha256_file
from soma_jax.errors import UserError, writable_dir

HELDOUT_CAP = 0.1  # test and ensemble-val each take at most this fraction of the documents
_TRANSFORM_BATCH = 8192
_MAX_LISTED_EXCLUSIONS = 1000
_WS = re.compile(r"\s+")
ASSIGNMENTS = ("nearest", "random")  # prepare's `assignment` values (--assignment)


def normalise_text(data: bytes) -> str:
  """NFKC + casefold + whitespace collapse, used to find near-copies of documents."""
  text = unicodedata.normalize("NFKC", data.decode("utf-8", errors="ignore")).casefold()
  return _WS.sub(" ", text).strip()


def _digest(data: bytes | str) -> bytes:
  if isinstance(data, str):
    data = data.encode("utf-8", errors="surrogatepass")
  return hashlib.sha256(data).digest()[:16]


class _Corpus:
  """Documents spooled to one file, with per-document metadata."""

  def __init__(self, path: str):
    self.path = path
    self.ids: list[str] = []
    self.offsets: list[int] = []
    self.lengths: list[int] = []
    self.exact: list[bytes] = []
    self.normal: list[bytes] = []
    self.empty = 0  # zero-length documents skipped
    self.not_text = 0  # binary documents skipped (NUL bytes or mostly invalid UTF-8)
    self.skipped: dict[str, list[str]] = {}  # sources.Skipped reason -> the ids skipped
    self.counts: collections.Counter = collections.Counter()  # the source's own counts (html_extracted)
    self.data: np.ndarray | None = None

  def doc(self, i: int) -> bytes:
    return self.data[self.offsets[i] : self.offsets[i] + self.lengths[i]].tobytes()


def _read_corpus(spec: sources.SourceSpec, path: str, max_bytes: int | None, tfds_data_dir: str | None,
                 extract: str = "none", on_bad_record: str = "fail", exclude: str | None = None) -> _Corpus:
  """Pass over the source: spool nonempty documents to disk and fingerprint them; documents
  under `exclude` (--out inside the source folder) are skipped, by name."""
  corpus = _Corpus(path)
  total = 0
  docs = sources.iter_documents(spec, tfds_data_dir=tfds_data_dir, extract=extract, on_bad_record=on_bad_record,
                                counts=corpus.counts)
  with open(path, "wb") as f:
    for doc_id, data in docs:
      if exclude and (doc_id == exclude or doc_id.startswith(exclude + "/")):
        data = sources.Skipped("inside --out")
      if isinstance(data, sources.Skipped):
        corpus.skipped.setdefault(data.reason, []).append(doc_id)
        continue
      if not data:
        corpus.empty += 1
        continue
      if not sources.is_text(data):
        corpus.not_text += 1
        continue
      corpus.ids.append(doc_id)
      corpus.offsets.append(total)
      corpus.lengths.append(len(data))
      corpus.exact.append(_digest(data))
      corpus.normal.append(_digest(normalise_text(data)))
      f.write(data)
      total += len(data)
      if max_bytes and total >= max_bytes:
        break
  if not corpus.ids:
    skipped = [f"{n} {why}" for n, why in ((corpus.empty, "zero-length"), (corpus.not_text, "not text (binary)")) if n]
    skipped += [_named(why, ids, len(ids)) for why, ids in corpus.skipped.items()]
    what = f" ({', '.join(skipped)} documents skipped)" if skipped else ""
    raise UserError(f"source {spec} has no nonempty text documents{what}; fix: point --source at a corpus with text")
  corpus.data = np.memmap(path, np.uint8, mode="r", shape=(total,)) if total else np.zeros(0, np.uint8)
  return corpus


def _select_heldout(
  corpus: _Corpus, n_test: int, n_ens: int, seed: int
) -> tuple[list[int], list[int], list[dict], int, int]:
  """Picks test and ensemble-val documents, screening out copies of other documents.

  A candidate is excluded (and stays in training) when another document has the
  same id, the same bytes, or the same normalised text. Each split also keeps
  its documents' bytes within HELDOUT_CAP of the corpus, so a few very long
  documents cannot empty the training set; a candidate over budget is skipped.
  Returns (test, ensemble_val, listed exclusions, excluded count, skipped count).
  """
  keys = collections.Counter()
  for i in range(len(corpus.ids)):
    keys[("id", corpus.ids[i])] += 1
    keys[("exact", corpus.exact[i])] += 1
    keys[("normalised", corpus.normal[i])] += 1
  budget = HELDOUT_CAP * sum(corpus.lengths)
  eligible = [i for i, n in enumerate(corpus.lengths) if n >= windows.WINDOW_BYTES]
  order = np.random.default_rng([seed, 1]).permutation(len(eligible))
  splits: list[list[int]] = [[], []]
  wanted, used = [n_test, n_ens], [0, 0]
  exclusions, excluded, skipped = [], 0, 0
  for j in order:
    if len(splits[0]) >= wanted[0] and len(splits[1]) >= wanted[1]:
      break
    i = eligible[j]
    reasons = [
      name
      for name, key in (("id", corpus.ids[i]), ("exact", corpus.exact[i]), ("normalised", corpus.normal[i]))
      if keys[(name, key)] > 1
    ]
    if reasons:
      excluded += 1
      if len(exclusions) < _MAX_LISTED_EXCLUSIONS:
        exclusions.append({"doc_id": corpus.ids[i], "reason": "duplicate " + "+".join(reasons) + " of a training document"})
      continue
    room = [s for s in (0, 1) if len(splits[s]) < wanted[s] and used[s] + corpus.lengths[i] <= budget]
    if not room:
      skipped += 1
      continue
    splits[room[0]].append(i)
    used[room[0]] += corpus.lengths[i]
  return sorted(splits[0]), sorted(splits[1]), exclusions, excluded, skipped


def _check_out(out: str) -> str:
  """`out` absolute; an existing non-empty `out` must hold exactly what prepare wrote there
  (its manifest's files), since all of it is replaced: anything else is refused."""
  out = os.path.abspath(os.path.expanduser(out))
  if os.path.exists(out):
    if not os.path.isdir(out):
      raise UserError(f"--out={out!r} exists and is not a folder; fix: choose another --out")
    if os.listdir(out):
      foreign = _foreign_files(out)
      if foreign is None:
        raise UserError(
          f"--out={out!r} is a non-empty folder that is not a prepared data dir; fix: choose an empty or new --out"
        )
      if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UserError(
          f"--out={out!r} is a prepared data dir that also holds files prepare did not write ({shown}), "
          "which replacing it would delete; fix: move them elsewhere or choose another --out"
        )
  writable_dir(os.path.dirname(out), "--out")  # made if missing; written before any work
  return out


def _foreign_files(out: str) -> list[str] | None:
  """Paths under `out` that its manifest does not list; None if `out` has no prepare manifest."""
  try:
    with open(os.path.join(out, "manifest.json")) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "version" not in manifest:
    return None
  ours = set(manifest["files"]) | {"manifest.json"}
  our_dirs = {"/".join(rel.split("/")[:i]) for rel in ours for i in range(1, rel.count("/") + 1)}
  foreign = []
  for dirpath, dirnames, filenames in os.walk(out):
    base = os.path.relpath(dirpath, out).replace(os.sep, "/")
    prefix = "" if base == "." else base + "/"
    foreign += [prefix + d + "/" for d in dirnames if prefix + d not in our_dirs]
    foreign += [prefix + f for f in filenames if prefix + f not in ours]
    dirnames[:] = [d for d in dirnames if prefix + d in our_dirs]  # a foreign folder is named once
  return sorted(foreign)


def _save(path: str, array: np.ndarray) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def _check_settings(settings: dict) -> None:
  """UserError naming the first impossible setting of `prepare`."""
  num_clusters, val_fraction = settings["num_clusters"], settings["val_fraction"]
  if num_clusters < 1:
    raise UserError(f"--num_clusters={num_clusters} must be at least 1; fix: pass --num_clusters=N with N >= 1")
  for name in ("fit_sample", "min_df", "max_features", "svd_dims"):
    if settings[name] < 1:
      raise UserError(f"--{name}={settings[name]} must be at least 1; fix: pass a positive value")
  if not 0.0 < val_fraction < 1.0:
    raise UserError(f"--val_fraction={val_fraction} must be in (0, 1); fix: pass e.g. 0.01")
  if settings["ensemble_val_docs"] < 0 or settings["test_docs"] < 0:
    raise UserError("--ensemble_val_docs and --test_docs must be >= 0; fix: pass non-negative counts")
  max_bytes = settings["max_bytes"]
  if max_bytes is not None and max_bytes < 1:
    raise UserError(f"--max_bytes={max_bytes} must be positive; fix: omit it or pass a byte count")
  _check_seed("seed", settings["seed"])


MAX_SEED = 2**32 - 1  # numpy's and scikit-learn's seeds: 0 .. 2**32 - 1


def _check_seed(name: str, seed: object) -> None:
  """UserError unless --`name` is an integer in 0..MAX_SEED (the sampling, SVD and k-means seeds)."""
  if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
    raise UserError(f"--{name}={seed!r} must be an integer in 0..{MAX_SEED}; fix: pass e.g. --{name}=0")


def _check_assignment(assignment: str, assignment_seed: int) -> None:
  """UserError for an --assignment value that is not one of ASSIGNMENTS, or a negative seed."""
  if assignment not in ASSIGNMENTS:
    raise UserError(f"--assignment={assignment!r} is not one of {', '.join(ASSIGNMENTS)}; fix: pass "
                    "--assignment=nearest (each window at its nearest centroid, the default) or "
                    "--assignment=random (random shards of the same sizes)")
  _check_seed("assignment_seed", assignment_seed)


def prepare(
  source: str,
  num_clusters: int,
  out: str,
  *,
  fit_sample: int = 400_000,
  val_fraction: float = 0.01,
  ensemble_val_docs: int = 202,
  test_docs: int = 4096,
  seed: int = 0,
  max_bytes: int | None = None,
  min_df: int = 5,
  max_features: int = 50_000,
  svd_dims: int = 128,
  tfds_data_dir: str | None = None,
  extract: str = "none",
  on_bad_record: str = "fail",
  assignment: str = "nearest",
  assignment_seed: int = 0,
) -> dict:
  """Builds the data dir `out` from `source`; returns the manifest. Bad input raises UserError.
  `assignment`: "nearest" or "random" (module docstring; its seed is recorded for "random" only)."""
  _check_assignment(assignment, assignment_seed)
  settings = {
    "source": source,
    "num_clusters": num_clusters,
    "fit_sample": fit_sample,
    "val_fraction": val_fraction,
    "ensemble_val_docs": ensemble_val_docs,
    "test_docs": test_docs,
    "seed": seed,
    "max_bytes": max_bytes,
    "min_df": min_df,
    "max_features": max_features,
    "svd_dims": svd_dims,
    "tfds_data_dir": tfds_data_dir,
    "extract": extract,  # none | html | auto (sources.iter_documents)
    "on_bad_record": on_bad_record,  # fail | skip
  }
  if assignment != "nearest":  # recorded only when used: "nearest" writes the same bytes as before
    settings.update(assignment=assignment, assignment_seed=assignment_seed)
  _check_settings(settings)
  sources.check_options(extract, on_bad_record)
  spec = sources.parse_source(source)
  out = _check_out(out)
  exclude = _inside_source(spec, out)
  tmp = _staging_dir(out)
  try:
    with _sigterm_raises():
      manifest = _prepare_into(tmp, spec, settings, exclude=exclude)
      _install(tmp, out)
  except OSError as e:  # a full disk, a quota, an unreadable file: one line, nothing half-made
    shutil.rmtree(tmp, ignore_errors=True)
    raise _failed(e, out) from None
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return manifest


_STAGING = ".{name}.tmp-{pid}-"  # prepare's staging folder beside --out: its process id in the name


def _staging_dir(out: str) -> str:
  """A new staging folder beside `out`, after removing those a killed prepare of the same
  `out` left behind (their process gone: SIGKILL, a power cut)."""
  parent, name = os.path.split(out)
  lead = _STAGING.format(name=name, pid="")[:-1]  # ".NAME.tmp-"
  for entry in os.listdir(parent):
    pid = entry[len(lead):].split("-", 1)[0] if entry.startswith(lead) else ""
    if pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
  tmp = tempfile.mkdtemp(prefix=_STAGING.format(name=name, pid=os.getpid()), dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the data dir should not be
  return tmp


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


class _Terminated(BaseException):
  """SIGTERM during prepare: raised so the staging folder is removed, as on Ctrl-C."""


@contextlib.contextmanager
def _sigterm_raises():
  """SIGTERM stops prepare like Ctrl-C (its staging folder removed), then exits 128 + 15."""
  def stop(signum, frame):
    raise _Terminated

  try:
    old = signal.signal(signal.SIGTERM, stop)
  except ValueError:  # not the main thread: leave signals alone
    yield
    return
  try:
    yield
  except _Terminated:
    raise SystemExit(128 + signal.SIGTERM) from None
  finally:
    signal.signal(signal.SIGTERM, old)


def _inside_source(spec: sources.SourceSpec, out: str) -> str | None:
  """`out` relative to a folder source's root when it lies inside it (a re-run would read
  its own manifest and held-out lists as documents), else None."""
  if spec.kind == "tfds" or not spec.path or not os.path.isdir(spec.path):
    return None
  rel = os.path.relpath(os.path.realpath(out), os.path.realpath(spec.path))
  return None if rel == ".." or rel.startswith(".." + os.sep) else rel.replace(os.sep, "/")


def unzip_corpus(zip_path: str, root: str) -> str:
  """Extracts a zip of text files (the notebook's CORPUS=FILE.zip) into root/STEM-HASH and
  returns that folder. HASH is the zip's SHA-256, so a zip replaced at the same path gets a
  folder (and a data dir) of its own instead of landing on top of the old files; a folder
  left by an interrupted extraction is never reused (it is staged, then renamed)."""
  if not os.path.isfile(zip_path):
    raise UserError(f"corpus zip {zip_path!r} not found; fix: upload it or correct CORPUS")
  stem = os.path.splitext(os.path.basename(zip_path))[0]
  folder = os.path.join(root, f"{stem}-{sha256_file(zip_path)[:12]}")
  if os.path.isdir(folder):
    return folder
  os.makedirs(root, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{stem}.unzip-", dir=root)
  try:
    with zipfile.ZipFile(zip_path) as z:
      z.extractall(staging)
    for old in os.listdir(root):  # the same zip name's earlier contents
      if old.startswith(stem + "-") and len(old) == len(stem) + 13:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    os.rename(staging, folder)
  except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as e:
    raise UserError(f"{zip_path!r} is not a readable zip file ({e}); fix: zip the folder of "
                    "text files again (e.g. `zip -r corpus.zip my_texts/`) and upload it") from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return folder


def _failed(e: OSError, out: str) -> UserError:
  """The one-line error of a prepare stopped by the file system (its staging folder removed)."""
  where = f" ({e.filename})" if e.filename else ""
  kept = "the existing --out is unchanged" if os.path.exists(out) else "nothing was written"
  full = e.errno in (errno.ENOSPC, errno.EDQUOT)
  fix = "free disk space or choose another --out" if full else "check the path and its permissions"
  return UserError(f"prepare failed: {e.strerror or e}{where}; {kept}; fix: {fix}")


def summary(manifest: dict, out: str, seconds: float) -> str:
  """What prepare_data prints on success: documents read and skipped, shards, eval sets."""
  d = manifest["documents"]
  skipped = ", ".join(
    [f"{n} {why}" for n, why in ((d["zero_length_skipped"], "zero-length"), (d.get("not_text_skipped", 0), "not text"))
     if n] + [_named(why, v["names"], v["count"]) for why, v in d.get("skipped", {}).items()]
  )
  a = manifest["assignment"]
  how = (f"random shards of the nearest-centroid sizes, assignment seed {a['seed']}" if a.get("kind") == "random"
         else "each at its nearest centroid")
  pages = d.get("html_extracted", 0)  # those left empty are among the skipped, by name
  extracted = f", main text extracted from {pages} HTML pages" if pages else ""
  return (
    f"wrote {out} in {seconds:.1f}s: {d['nonempty']} documents read ({d['bytes']:,} bytes){extracted}"
    f"{f', skipped {skipped}' if skipped else ''}; {manifest['training_windows']} training windows in "
    f"{manifest['num_clusters']} shards {a['windows_per_shard']} ({how}); {manifest['test_windows']} test windows, {manifest['ensemble_val_windows']} ensemble-val windows"
  )


def _named(why: str, ids: list[str], count: int) -> str:
  """'2 unreadable folder (a/, b/)': a count of skipped entries and the first few names."""
  names = ", ".join(ids[:3]) + (", ..." if count > 3 else "")
  cap = f" of {sources.MAX_DOCUMENT_BYTES >> 20} MiB" if why == "over the size cap" else ""
  return f"{count} {why}{cap} ({names})"


def _install(tmp: str, out: str) -> None:
  """Renames the finished temporary folder to `out`, replacing a previous data dir."""
  if os.path.exists(out):
    old = f"{tmp}.old"
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(tmp, out)


def _prepare_into(tmp: str, spec: sources.SourceSpec, settings: dict, exclude: str | None = None) -> dict:
  """Does all the work inside the temporary folder `tmp`: read, hold out, featurise, fit,
  assign, write."""
  t0 = time.time()
  work = os.path.join(tmp, "_work")
  os.makedirs(work)
  notes: list[str] = []
  corpus = _read_corpus(spec, os.path.join(work, "corpus.bin"), settings["max_bytes"], settings["tfds_data_dir"],
                        settings["extract"], settings["on_bad_record"], exclude=exclude)
  logging.info("read %d documents, %d bytes (%.1fs)", len(corpus.ids), sum(corpus.lengths), time.time() - t0)
  test_ids, ens_ids, screening = _hold_out(corpus, settings, notes)
  all_w = _spool_training_windows(corpus, set(test_ids) | set(ens_ids), os.path.join(work, "windows.bin"), settings)
  feat, centroids, fit = _fit(all_w, settings, notes)
  logging.info("fitted %d clusters (%.1fs)", settings["num_clusters"], time.time() - t0)
  assign, assignment = _assign_nearest(all_w, feat, centroids)
  if settings.get("assignment", "nearest") == "random":
    assign, centroids, assignment, fit["top_terms"] = _assign_random(all_w, feat, assign, assignment, fit, settings)
  router_lib.Router(feat, centroids).save(os.path.join(tmp, "router.npz"))
  shards = _write_shards(tmp, all_w, assign, settings)
  eval_counts = _write_eval_sets(tmp, corpus, test_ids, ens_ids)
  doc_stats = {
    "nonempty": len(corpus.ids),
    "zero_length_skipped": corpus.empty,
    "not_text_skipped": corpus.not_text,
    "skipped": {why: {"count": len(ids), "names": ids[:_MAX_LISTED_EXCLUSIONS]} for why, ids in corpus.skipped.items()},
    "html_extracted": corpus.counts["html_extracted"],  # pages whose main text was extracted
    "bytes": int(sum(corpus.lengths)),
    "shorter_than_window": int(sum(n < windows.WINDOW_BYTES for n in corpus.lengths)),
  }
  total = int(all_w.shape[0])
  del corpus, all_w
  shutil.rmtree(work)
  notes += _empty_set_notes(eval_counts, screening, doc_stats, settings)
  manifest = _manifest(tmp, spec, settings, doc_stats, total, shards, fit, assignment, eval_counts, screening, notes)
  logging.info("prepared %d shards (%.1fs)", settings["num_clusters"], time.time() - t0)
  return manifest


_SHARED = {"id": "id", "exact": "bytes", "normalised": "normalised text"}  # the screen's keys, in words


def _empty_set_notes(eval_counts: dict, screening: dict, doc_stats: dict, settings: dict) -> list[str]:
  """A note for each empty held-out set, naming the cause: every document long enough to hold
  out is a copy of another one (which stays in training), or there are too few of them."""
  notes = []
  long_docs = doc_stats["nonempty"] - doc_stats["shorter_than_window"]
  reasons = collections.Counter(e["reason"] for e in screening["listed"])
  for name, n, flag in (("test", eval_counts["test_windows"], "test_docs"),
                        ("ensemble-val", eval_counts["ensemble_val_windows"], "ensemble_val_docs")):
    if n:
      continue
    if settings[flag] and long_docs and screening["count"] == long_docs:
      why = ", ".join(f"{k} share their " + " and ".join(_SHARED[key] for key in r.split()[1].split("+"))
                      for r, k in reasons.most_common())  # r: "duplicate exact+normalised of a training document"
      only_ids = set(reasons) == {"duplicate id of a training document"}
      what, fix = (("share an id with another document", "give each document a distinct id") if only_ids
                   else ("are copies of each other", "remove the duplicate files or records"))
      notes.append(f"the {name} set is empty: all {long_docs} documents of >= {windows.WINDOW_BYTES} bytes {what} "
                   f"({why}), and such documents are never held out; fix: {fix}")
    else:
      notes.append(f"the {name} set is empty: evaluation on it is impossible (documents of >= {windows.WINDOW_BYTES} "
                   "bytes are needed); fix: a larger corpus or more --test_docs / --ensemble_val_docs")
  return notes


def _hold_out(corpus: _Corpus, settings: dict, notes: list[str]) -> tuple[list[int], list[int], dict]:
  """Test and ensemble-val documents (capped, screened); notes say what was cut and why."""
  n_docs = len(corpus.ids)
  cap = int(HELDOUT_CAP * n_docs)
  n_test, n_ens = min(settings["test_docs"], cap), min(settings["ensemble_val_docs"], cap)
  if n_test < settings["test_docs"] or n_ens < settings["ensemble_val_docs"]:
    notes.append(
      f"test/ensemble-val documents capped at {HELDOUT_CAP:.0%} of {n_docs} documents: {n_test} test, {n_ens} ensemble-val"
    )
  test_ids, ens_ids, exclusions, n_excluded, n_skipped = _select_heldout(corpus, n_test, n_ens, settings["seed"])
  if n_skipped:
    notes.append(f"{n_skipped} held-out candidates skipped to keep each split within {HELDOUT_CAP:.0%} of the corpus bytes")
  if len(test_ids) < n_test or len(ens_ids) < n_ens:
    notes.append(
      f"only {len(test_ids) + len(ens_ids)} documents of >= {windows.WINDOW_BYTES} bytes passed the overlap screen "
      f"and byte budget: {len(test_ids)} test, {len(ens_ids)} ensemble-val"
    )
  return test_ids, ens_ids, {"count": n_excluded, "listed": exclusions}


def _spool_training_windows(corpus: _Corpus, heldout: set[int], path: str, settings: dict) -> np.ndarray:
  """uint8 [n, 1025] training windows of every other document, in corpus order (memory-mapped)."""
  k = settings["num_clusters"]
  total = 0
  with open(path, "wb") as f:
    for i in range(len(corpus.ids)):
      if i not in heldout and corpus.lengths[i] > windows.CHUNK_BYTES:
        w = windows.training_windows(corpus.doc(i))
        f.write(w.tobytes())
        total += len(w)
  if total < 2 * k:
    raise UserError(
      f"the corpus gives {total} training windows of {windows.WINDOW_BYTES} bytes, too few for {k} clusters "
      f"(each needs a train and a validation window); fix: use a larger corpus or fewer --num_clusters"
    )
  return np.memmap(path, np.uint8, mode="r", shape=(total, windows.WINDOW_BYTES))


def _fit(all_w: np.ndarray, settings: dict, notes: list[str]) -> tuple[clustering.Featurizer, np.ndarray, dict]:
  """Featurizer and balanced k-means centroids fitted on a sample of clustering chunks.

  Balance constrains the fit only (so no centroid is starved); windows are then assigned
  to their nearest centroid (`_assign_nearest`). Returns (featurizer, centroids, info).
  """
  k, seed, total = settings["num_clusters"], settings["seed"], all_w.shape[0]
  n_fit = min(settings["fit_sample"], total)
  if n_fit < k:
    raise UserError(f"--fit_sample={n_fit} windows cannot fit {k} clusters; fix: raise --fit_sample")
  if settings["min_df"] > n_fit:  # no term can be in more windows than were sampled
    raise UserError(f"--min_df={settings['min_df']} is more than the {n_fit} windows sampled to fit tf-idf "
                    f"(a term is kept only if at least min_df of them hold it); fix: pass --min_df <= {n_fit}, e.g. 5")
  fit_idx = np.sort(np.random.default_rng([seed, 2]).choice(total, n_fit, replace=False))
  fit_texts = clustering.decode(all_w[fit_idx, : windows.CHUNK_BYTES])
  feat, feat_info = clustering.fit_featurizer(
    fit_texts, max_features=settings["max_features"], min_df=settings["min_df"], svd_dims=settings["svd_dims"], seed=seed
  )
  notes.extend(feat_info.pop("notes"))
  fit_tfidf = feat.tfidf(fit_texts)
  centroids, fit_assign, km_info = clustering.balanced_spherical_kmeans(feat.project(fit_tfidf), k, seed=seed)
  terms = clustering.top_terms(feat, fit_tfidf, fit_assign, k)
  km_info["fit_windows"] = int(n_fit)
  return feat, centroids, {"featurizer": feat_info, "kmeans": km_info, "top_terms": terms}


def _assign_nearest(all_w: np.ndarray, feat: clustering.Featurizer, centroids: np.ndarray) -> tuple[np.ndarray, dict]:
  """Each window's shard: the nearest centroid of its own clustering features (SPEC 4)."""
  total, k = all_w.shape[0], centroids.shape[0]
  assign = np.empty(total, np.int32)
  sim_sum = 0.0  # each window's similarity to its own (nearest) centroid, summed
  for s in range(0, total, _TRANSFORM_BATCH):
    texts = clustering.decode(all_w[s : s + _TRANSFORM_BATCH, : windows.CHUNK_BYTES])
    sims = feat.transform(texts) @ centroids.T
    assign[s : s + len(texts)] = np.argmax(sims, axis=1)
    sim_sum += float(sims.max(axis=1).sum(dtype=np.float64))
  sizes = np.bincount(assign, minlength=k)
  if sizes.min() < 2:
    empty = [int(e) for e in np.flatnonzero(sizes < 2)]
    raise UserError(
      f"clusters {empty} are the nearest centroid of fewer than 2 windows (each expert needs a train and a "
      "validation window); fix: use fewer --num_clusters or a larger corpus"
    )
  info = {
    "rule": "nearest centroid of each window's clustering features",
    "windows_per_shard": sizes.tolist(),
    "mean_similarity": sim_sum / total,
  }
  return assign, info


def _assign_random(all_w: np.ndarray, feat: clustering.Featurizer, nearest: np.ndarray, nearest_info: dict,
                   fit: dict, settings: dict) -> tuple[np.ndarray, np.ndarray, dict, list[list[str]]]:
  """The random-sharding control: the nearest-centroid labels of the training windows permuted
  with `assignment_seed`, so each shard keeps its semantic size but not its text.

  The router's centroids are recomputed from the windows each random shard holds (their mean
  clustering feature, normalised), so a window is routed to the expert whose training shard
  is nearest in feature space, as for "nearest"; features are centred, so these centroids lie
  close to the corpus mean and routing carries little topic. Returns (labels, centroids
  [k, D], the manifest's assignment entry, each random shard's distinctive terms).
  """
  k, seed = settings["num_clusters"], settings["assignment_seed"]
  assign = nearest[np.random.default_rng([seed, 4]).permutation(len(nearest))].astype(np.int32)
  centroids, mean_sim, terms = _shard_centroids(all_w, feat, assign, k)
  info = {
    "kind": "random",
    "seed": seed,
    "unit": "training window (the unit of the nearest assignment)",
    "rule": "a seeded random permutation of the windows' nearest-centroid shard labels",
    "sizes_match": "semantic",
    "router": "centroids of the random shards: each shard's mean clustering feature, normalised",
    "top_terms": "of the random shards, over all their windows",
    "windows_per_shard": np.bincount(assign, minlength=k).tolist(),
    "mean_similarity": mean_sim,  # each window's similarity to its own random shard's centroid
    "moved_fraction": float(np.mean(assign != nearest)),  # windows not in their semantic shard
    "semantic": {**nearest_info, "top_terms": fit["top_terms"]},
  }
  return assign, centroids, info, terms


def _shard_centroids(all_w: np.ndarray, feat: clustering.Featurizer, assign: np.ndarray,
                     k: int) -> tuple[np.ndarray, float, list[list[str]]]:
  """One pass over the windows: each shard's normalised mean feature [k, D] float32, the mean
  similarity of a window to its shard's centroid, and each shard's distinctive terms (mean
  tf-idf in the shard minus the overall mean, as clustering.top_terms)."""
  sums = np.zeros((k, feat.dims), np.float64)
  tf_sums = np.zeros((k, len(feat.vocabulary)), np.float64)
  for s in range(0, all_w.shape[0], _TRANSFORM_BATCH):
    x = feat.tfidf(clustering.decode(all_w[s : s + _TRANSFORM_BATCH, : windows.CHUNK_BYTES]))
    a = assign[s : s + x.shape[0]]
    np.add.at(sums, a, feat.project(x))
    onehot = sp.csr_matrix((np.ones(len(a), np.float64), (a, np.arange(len(a)))), shape=(k, len(a)))
    tf_sums += (onehot @ x.astype(np.float64)).toarray()
  centroids = (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(np.float32)
  mean_sim = float(np.sum(centroids.astype(np.float64) * sums) / all_w.shape[0])  # sum of z . c_own, linear in z
  sizes = np.bincount(assign, minlength=k).astype(np.float64)
  score = tf_sums / sizes[:, None] - tf_sums.sum(axis=0) / sizes.sum()
  return centroids, mean_sim, clustering.distinctive_terms(feat, score)


def _write_shards(tmp: str, all_w: np.ndarray, assign: np.ndarray, settings: dict) -> list[dict]:
  """experts/{e}/train.npy and val.npy (val_fraction of each shard, >= 1 window)."""
  shards = []
  for e in range(settings["num_clusters"]):
    idx = np.flatnonzero(assign == e)
    n_val = max(1, int(round(settings["val_fraction"] * len(idx))))
    val_mask = np.zeros(len(idx), bool)
    val_mask[np.random.default_rng([settings["seed"], 3, e]).choice(len(idx), n_val, replace=False)] = True
    train, val = all_w[idx[~val_mask]], all_w[idx[val_mask]]
    _save(os.path.join(tmp, "experts", f"{e:04d}", "train.npy"), train)
    _save(os.path.join(tmp, "experts", f"{e:04d}", "val.npy"), val)
    shards.append(
      {
        "expert": e,
        "windows": int(len(idx)),
        "train_windows": int(len(train)),
        "val_windows": int(len(val)),
        "train_bytes": int(train.size),
        "val_bytes": int(val.size),
      }
    )
  return shards


def _write_eval_sets(tmp: str, corpus: _Corpus, test_ids: list[int], ens_ids: list[int]) -> dict:
  """test.npy (first window per document), ensemble_val.npy (stride 768), their doc indices."""
  test_w, test_docs = windows.stack_windows(
    [windows.first_window(corpus.doc(i))[None] for i in test_ids], list(range(len(test_ids)))
  )
  ens_w, ens_docs = windows.stack_windows(
    [windows.eval_windows(corpus.doc(i)) for i in ens_ids], list(range(len(ens_ids)))
  )
  _save(os.path.join(tmp, "test.npy"), test_w)
  _save(os.path.join(tmp, "test_docs.npy"), test_docs)
  _save(os.path.join(tmp, "ensemble_val.npy"), ens_w)
  _save(os.path.join(tmp, "ensemble_val_docs.npy"), ens_docs)
  with open(os.path.join(tmp, "heldout_docs.json"), "w") as f:
    json.dump({"test": [corpus.ids[i] for i in test_ids], "ensemble_val": [corpus.ids[i] for i in ens_ids]}, f, indent=1)
  return {
    "ensemble_val_docs": len(ens_ids),
    "ensemble_val_windows": int(len(ens_w)),
    "test_docs": len(test_ids),
    "test_windows": int(len(test_w)),
  }


def _manifest(tmp, spec, settings, doc_stats, total, shards, fit, assignment, eval_counts, screening, notes) -> dict:
  """Writes manifest.json (with the SHA-256 of every file written before it) and returns it."""
  sizes = np.array([s["windows"] for s in shards])
  files = {}
  for dirpath, _, filenames in os.walk(tmp):
    for name in filenames:
      full = os.path.join(dirpath, name)
      files[os.path.relpath(full, tmp).replace(os.sep, "/")] = sha256_file(full)
  manifest = {
    "version": MANIFEST_VERSION,
    "source": str(spec),
    "num_clusters": settings["num_clusters"],
    "seed": settings["seed"],
    "settings": settings,
    "window_bytes": windows.WINDOW_BYTES,
    "chunk_bytes": windows.CHUNK_BYTES,
    "documents": doc_stats,
    "training_windows": int(total),
    "shards": shards,
    "assignment": assignment,
    "cluster_balance": {
      "sizes": sizes.tolist(),
      "mean": float(sizes.mean()),
      "max_relative_deviation": float(np.max(np.abs(sizes / sizes.mean() - 1.0))),
      "fit": fit["kmeans"],
    },
    "top_terms": fit["top_terms"],
    "featurizer": fit["featurizer"],
    "min_df_used": fit["featurizer"]["min_df_used"],
    **eval_counts,
    "exclusions": screening,
    "notes": notes,
    "files": dict(sorted(files.items())),
  }
  with open(os.path.join(tmp, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
  return manifest
