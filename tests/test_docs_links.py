"""Every relative link in README.md and docs/*.md resolves to a file or folder of the
repository, and every #anchor to a heading of the page it names."""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages() -> list[str]:
  return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def anchors(path: str) -> set[str]:
  """GitHub's anchors of a markdown page's headings: lower case, punctuation dropped, spaces
  to hyphens."""
  with open(path, encoding="utf-8") as f:
    text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
  out = set()
  for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    out.add(slug)
  return out


def broken(path: str) -> list[str]:
  """The relative links of one page that do not resolve."""
  with open(path, encoding="utf-8") as f:
    text = re.sub(r"```.*?```", "", f.read(), flags=re.S)  # code blocks hold no links
  text = re.sub(r"`[^`\n]*`", "", text)  # nor do code spans
  out = []
  for target in LINK.findall(text):
    if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(dest):
      out.append(f"{target} (no such file)")
    elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
      out.append(f"{target} (no heading #{anchor})")
  return out


def test_every_relative_link_resolves():
  bad = {os.path.relpath(p, ROOT): b for p in pages() if (b := broken(p))}
  assert not bad, bad


def test_every_docs_page_is_linked_from_readme_or_another_page():
  linked = set()
  for p in pages():
    with open(p, encoding="utf-8") as f:
      for target in LINK.findall(f.read()):
        file = target.partition("#")[0]
        if file.endswith(".md"):
          linked.add(os.path.normpath(os.path.join(os.path.dirname(p), file)))
  orphans = [os.path.relpath(p, ROOT) for p in pages()[1:] if p not in linked]
  assert not orphans, orphans


def test_the_check_sees_a_broken_link_and_anchor(tmp_path):
  (tmp_path / "b.md").write_text("# Title\n## The Step (fast)\n")
  page = tmp_path / "a.md"
  page.write_text("[ok](b.md) [ok](b.md#the-step-fast) [img](b.md) [web](https://x.org/y)\n"
                  "`[not a link](nowhere.md)`\n[gone](c.md) [bad anchor](b.md#nope)\n")
  assert broken(str(page)) == ["c.md (no such file)", "b.md#nope (no heading #nope)"]
