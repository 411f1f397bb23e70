"""What every document reader shares: the entry a reader yields, the size cap, the text
test, and the file walks of file sources."""

from __future__ import annotations

import os
import stat
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


def walk_files(root: str, exts: tuple[str, ...] | None = None, unreadable: list[str] | None = None,
               other: list[str] | None = None) -> list[str]:
  """Sorted relative paths of regular files under root (hidden entries skipped), each real file once.

  Symlinked folders are followed; a folder or file reached again by another path (a symlink to a
  folder already listed, a loop, a hard link) is read once, under the path that comes first. A
  folder that cannot be listed is appended to `unreadable`, a file whose name ends in none of
  `exts` to `other`.
  """
  seen_dirs, found = {_identity(root)}, []

  def failed(err: OSError) -> None:
    if unreadable is not None:
      unreadable.append(os.path.relpath(err.filename, root) if err.filename else "?")

  for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=True):
    kept = []
    for d in sorted(d for d in dirnames if not d.startswith(".")):
      real = _identity(os.path.join(dirpath, d))
      if real not in seen_dirs:  # claimed when listed, so a sibling link to it is not walked too
        seen_dirs.add(real)
        kept.append(d)
    dirnames[:] = kept
    for name in filenames:
      full = os.path.join(dirpath, name)
      if not name.startswith(".") and (real := _identity(full, regular=True)):
        found.append((os.path.relpath(full, root), name, real))
  out, seen_files = [], set()
  for rel, name, real in sorted(found):
    if exts is not None and not name.endswith(exts):
      if other is not None:
        other.append(rel)
    elif real not in seen_files:
      seen_files.add(real)
      out.append(rel)
  return out


def _identity(path: str, regular: bool = False) -> tuple[int, int] | str | None:
  """What makes two paths the same file or folder: (device, inode) after symlinks; the real
  path if it cannot be stat'ed. With `regular`, None for anything but a regular file."""
  try:
    st = os.stat(path)
  except OSError:
    return None if regular else os.path.realpath(path)
  if regular and not stat.S_ISREG(st.st_mode):
    return None
  return st.st_dev, st.st_ino


def suffixes(exts: tuple[str, ...]) -> str:
  """'*.a, *.b or *.c': the names a folder source reads."""
  names = [f"*{e}" for e in exts]
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def files_at(path: str, exts: tuple[str, ...] | None = None) -> tuple[list[tuple[str, str]], list[Entry]]:
  """(name, full path) of the file `path`, or of the files under the folder `path` (sorted,
  each real file once); and a Skipped entry for each file passed over (its name ends in none of
  `exts`) and each sub-folder that could not be listed, for the reader to yield after the rest."""
  if os.path.isfile(path):
    return [(os.path.basename(path), path)], []
  unreadable, other = [], []
  files = walk_files(path, exts, unreadable, other)
  what = "files" if exts is None else f"{suffixes(exts)} files"
  if not files and not unreadable:
    held = f" (it holds {', '.join(other[:3])}{', ...' if len(other) > 3 else ''})" if other else ""
    raise UserError(f"no {what} found under {path!r}{held}; fix: point the source at a folder that holds them")
  passed = [(rel, Skipped(f"not named {suffixes(exts)}")) for rel in other]
  passed += [(rel + "/", Skipped("unreadable folder")) for rel in unreadable]
  return [(rel, os.path.join(path, rel)) for rel in files], passed
