"""Table 9's external corpus (`table9.py`), one nobody trained on: WikiText-103 raw or any SOURCE
prepare_data.py reads, checked against the rows' data dir (not its source, none of its
documents), cut into 1,025-byte windows and scored as a study's own evaluation sets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.data import pipeline, sources
from soma_jax.data import windows as windows_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError
from soma_jax.studies import planning

WIKITEXT_FILES = {"validation": "wiki.valid.raw", "test": "wiki.test.raw"}


HALVES = ("validation", "test")  # an external source's documents alternate these


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The external corpus: WikiText-103 raw (`kind` "wikitext103", `where` its folder) or a
  SOURCE (`kind` "source", `where` the SOURCE string as parsed), and how many 1,025-byte
  windows of each split to score (0: all)."""
  kind: str
  where: str
  val_windows: int
  test_windows: int

  @property
  def name(self) -> str:
    return f"wikitext103:{self.where}" if self.kind == "wikitext103" else self.where


def check_corpus(wikitext: str, external: str, val_windows: int, test_windows: int) -> Corpus:
  """The external corpus: `wikitext` (a folder holding WikiText-103's raw validation and test
  files) when set, else `external` (a SOURCE this machine has); a UserError naming the fix."""
  if wikitext:
    folder = os.path.abspath(os.path.expanduser(wikitext))
    missing = [f for f in WIKITEXT_FILES.values() if not os.path.isfile(os.path.join(folder, f))]
    if missing:
      raise UserError(f"wikitext={wikitext!r} holds no {' or '.join(missing)}: a WikiText-103 "
                      "raw folder has wiki.valid.raw and wiki.test.raw; fix: --config.wikitext="
                      "the wikitext-103-raw folder, or --config.wikitext='' --config.external="
                      "SOURCE")
    return Corpus("wikitext103", folder, val_windows, test_windows)
  if not external:
    raise UserError("wikitext='' and external='': table9 needs a corpus nobody trained on; fix: "
                    "--config.wikitext=FOLDER (WikiText-103 raw) or --config.external=textdir:"
                    "FOLDER (any SOURCE prepare_data.py reads)")
  try:
    spec = sources.parse_source(external)
  except UserError as e:
    why = str(e).split("; fix:")[0]  # its own fix names prepare_data's --source
    raise UserError(f"external={external!r} is not a corpus this machine has ({why}); fix: "
                    "--config.external=textdir:FOLDER (text no study trains on) or "
                    "--config.wikitext=FOLDER (WikiText-103 raw)") from None
  return Corpus("source", str(spec), val_windows, test_windows)


def check_not_trained_on(corpus: Corpus, data_dir: str) -> str:
  """The corpus the rows train on (data_dir's manifest); a UserError if it is `corpus`."""
  trained = str(pipeline.load_manifest(data_dir).get("source", ""))
  same = trained == corpus.name or (corpus.kind == "wikitext103"
                                    and trained.startswith("wikitext103:"))
  if same:
    raise UserError(f"the external corpus {corpus.name} is the one the rows train on "
                    f"({trained}, {data_dir}/manifest.json): its scores would be in-domain; fix: "
                    "--config.external= another corpus, or --config.data_dir= a data dir "
                    "prepared from another")
  return trained


def wikitext_splits(folder: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{split: (windows [n, 1025], article id [n])} of WikiText-103's raw validation and test
  files (SPEC 4: windows advance 768 bytes within an article, incomplete ones dropped)."""
  return {split: windows_lib.wikitext103_windows(os.path.join(folder, name))
          for split, name in WIKITEXT_FILES.items()}


def source_splits(source: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{half: (windows [n, 1025], document id [n])} of a SOURCE: each text document (empty,
  binary and exact-duplicate ones dropped) cut into 1,025-byte windows advancing by 768 bytes
  within it, incomplete ones dropped; the documents with a window alternate, in the reader's
  order, validation (0, 2, 4, ...) and test (1, 3, 5, ...)."""
  parts: dict[str, list[np.ndarray]] = {half: [] for half in HALVES}
  seen, kept = set(), 0
  for _, data in sources.iter_documents(source):
    if isinstance(data, sources.Skipped) or not data or not sources.is_text(data):
      continue
    digest = hashlib.sha256(data).digest()
    if digest in seen:
      continue
    seen.add(digest)
    w = windows_lib.eval_windows(data)
    if w.shape[0]:
      parts[HALVES[kept % 2]].append(w)
      kept += 1
  return {half: windows_lib.stack_windows(p, list(range(len(p)))) for half, p in parts.items()}


class ExternalSet(eval_lib.TestSet):
  """An external split scored as a study's own sets (`evaluate.TestSet`): `max_windows` of its
  1,025-byte windows spread over its documents (0: all), cut into pieces of route + score + 1
  bytes, routed by the data dir's router on each piece's first `route` bytes."""

  def __init__(self, windows_nx1025: np.ndarray, doc_ids_n: np.ndarray, data_dir: str,
               split: str, span: planning.EvalSpan, max_windows: int):
    if windows_nx1025.shape[0] == 0:
      raise UserError(f"the external corpus's {split} split has no complete 1,025-byte window; "
                      "fix: a corpus with documents of at least 1,025 bytes")
    self.documents_available = int(np.unique(doc_ids_n).size)  # documents with a window
    keep = pipeline.spread_windows(doc_ids_n, max_windows)
    self.windows_scored = int(keep.size)
    self.windows, self.doc_ids = eval_lib.cut_windows(windows_nx1025[keep], doc_ids_n[keep],
                                                      span.route, span.score)
    self.split, self.route, self.score = split, span.route, span.score
    self.router = Router.load(os.path.join(data_dir, "router.npz"))
    self._routes = {}


# An external corpus with at least this share of its documents in the rows' data dir is drawn
# from the training corpus (a few shared boilerplate files are not): refused.
MAX_SHARED_DOCUMENTS = 0.01


def _keys(windows_nx1025: np.ndarray) -> np.ndarray:
  """A 64-bit key of each window's first 64 bytes (equal windows, equal keys)."""
  words = np.ascontiguousarray(windows_nx1025[:, :64]).view(np.uint64)
  key = np.zeros(words.shape[0], np.uint64)
  for j in range(words.shape[1]):  # wraps around modulo 2**64, as intended
    key = (key ^ words[:, j]) * np.uint64(0x100000001B3)
  return key


def shared_documents(splits: dict[str, tuple[np.ndarray, np.ndarray]], data_dir: str
                     ) -> tuple[int, int]:
  """(external documents whose first window lies in `data_dir`, external documents). A
  document's first evaluation window starts at its first byte, as its first training window
  does (`windows`: training windows at 1,024 j, evaluation windows at 768 i), so a document
  of the training corpus, trained on or held out, is found in the data dir's .npy windows."""
  firsts = []
  for windows, ids in splits.values():
    _, first = np.unique(ids, return_index=True)
    firsts.append(np.asarray(windows)[first])
  firsts = np.concatenate(firsts) if firsts else np.zeros((0, 1025), np.uint8)
  wanted = {bytes(row) for row in firsts}
  keys = np.unique(_keys(firsts)) if len(firsts) else np.zeros(0, np.uint64)
  found = set()
  for folder, _, files in os.walk(data_dir):
    for name in files:
      if not name.endswith(".npy"):
        continue
      try:
        data = np.load(os.path.join(folder, name), mmap_mode="r", allow_pickle=False)
      except (OSError, ValueError):
        continue
      if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != firsts.shape[1]:
        continue
      for lo in range(0, data.shape[0], 1 << 18):
        block = np.asarray(data[lo:lo + (1 << 18)])
        for row in block[np.isin(_keys(block), keys)]:
          if bytes(row) in wanted:
            found.add(bytes(row))
  return len(found), len(wanted)


def check_not_drawn_from(corpus: Corpus, splits: dict, data_dir: str) -> dict:
  """How many of the external corpus's documents the rows' data dir holds; a UserError when
  that is MAX_SHARED_DOCUMENTS of them or more (the corpus was drawn from the training one:
  its scores would be in-domain, whatever its name)."""
  shared, documents = shared_documents(splits, data_dir)
  if documents and shared >= max(1, MAX_SHARED_DOCUMENTS * documents):
    raise UserError(f"{shared} of the external corpus's {documents} documents ({corpus.name}) "
                    f"are in the data the rows train on ({data_dir}): it is drawn from the "
                    "training corpus, so its scores would be in-domain; fix: --config.external= "
                    "a corpus none of whose documents the data dir holds, or --config.data_dir= "
                    "a data dir prepared from another corpus")
  return {"shared_documents": shared, "documents": documents,
          "how": "external documents whose first 1,025-byte window is one of the data dir's "
                 f"windows; refused at {MAX_SHARED_DOCUMENTS:.0%} of them or more"}


def external_sets(corpus: Corpus, data_dir: str, span: planning.EvalSpan
                  ) -> tuple[ExternalSet, ExternalSet]:
  """(validation, test) of the external corpus on the study's span; refused when it is drawn
  from the training corpus (`check_not_drawn_from`)."""
  splits = (wikitext_splits(corpus.where) if corpus.kind == "wikitext103"
            else source_splits(corpus.where))
  check_not_drawn_from(corpus, splits, data_dir)
  counts = {"validation": corpus.val_windows, "test": corpus.test_windows}
  val, test = (ExternalSet(*splits[s], data_dir, s, span, counts[s]) for s in HALVES)
  return val, test
