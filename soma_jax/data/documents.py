"""What every document reader shares: the entry a reader yields, the size cap, the text
test, and the file walks of file sources."""

from __future__ import annotations

import os
from dataclasses import dataclass

from soma_jax.errors import UserError

TEXT_SAMPLE_BYTES = 1 << 16  # is_text looks at this many leading bytes
MAX_INVALID_FRACTION = 0.3  # random bytes are about half invalid UTF-8; Latin-1 text a few %


def is_text(data: bytes) -> bool:
  """False for binary data: a NUL byte, or more than 30% invalid UTF-8, in the first 64 KiB."""
  head = data[:TEXT_SAMPLE_BYTES]
  if b"\0" in head:
    return False
  valid = len(head.decode("utf-8", errors="ignore").encode("utf-8"))
  return len(head) - valid <= MAX_INVALID_FRACTION * len(head)


@dataclass(frozen=True)
class Skipped:
  """Yielded in place of a document's bytes for what a file source could not use: `prepare`
  counts these by `reason` and names the first few in its summary line."""

  reason: str  # "unreadable folder", "over the size cap", "bad record", "empty after extraction", ...


Entry = tuple[str, bytes | Skipped]
MAX_DOCUMENT_BYTES = 256 << 20  # a file (after gunzip) larger than this is skipped, never read


def walk_files(root: str, exts: tuple[str, ...] | None = None,
                unreadable: list[str] | None = None) -> list[str]:
  """Sorted relative paths of regular files under root (hidden entries skipped).

  Symlinked folders are followed, except one leading back to a folder already on the way
  (a loop) or already walked; a folder that cannot be listed is appended to `unreadable`.
  """
  out, seen = [], set()

  def failed(err: OSError) -> None:
    if unreadable is not None:
      unreadable.append(os.path.relpath(err.filename, root) if err.filename else "?")

  for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=True):
    seen.add(os.path.realpath(dirpath))
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                         and os.path.realpath(os.path.join(dirpath, d)) not in seen)
    for name in filenames:
      if name.startswith("."):
        continue
      if exts is not None and not name.endswith(exts):
        continue
      full = os.path.join(dirpath, name)
      if os.path.isfile(full):
        out.append(os.path.relpath(full, root))
  return sorted(out)


def check_nonempty(files: list[str], root: str, what: str) -> None:
  if not files:
    raise UserError(f"no {what} found under {root!r}; fix: point the source at a folder that holds them")


def files_at(path: str, exts: tuple[str, ...], what: str) -> list[tuple[str, str]]:
  """(name, full path) of the file `path`, or of the files under the folder `path`, sorted."""
  if os.path.isfile(path):
    return [(os.path.basename(path), path)]
  files = walk_files(path, exts)
  check_nonempty(files, path, what)
  return [(rel, os.path.join(path, rel)) for rel in files]
