"""The documentation stays short and its links stay whole: README.md and BENCHMARKS.md within
their line budgets, and every relative link (and #anchor) in the user-facing Markdown files
resolves to a file that exists and a heading it has. Plain file checks: no convtune import,
no GPU, well under a second."""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

README_MAX_LINES = 250
BENCHMARKS_MAX_LINES = 300


def checked_files() -> List[str]:
    """The Markdown files whose links are checked, relative to the repository root."""
    files = ["README.md", "BENCHMARKS.md", "benches/README.md", "benches/results/README.md"]
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return files


def line_count(rel: str) -> int:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return len(f.read().splitlines())


def test_readme_fits_its_budget():
    n = line_count("README.md")
    assert n <= README_MAX_LINES, f"README.md has {n} lines, over {README_MAX_LINES}: move detail into docs/"


def test_benchmarks_fits_its_budget():
    n = line_count("BENCHMARKS.md")
    assert n <= BENCHMARKS_MAX_LINES, (
        f"BENCHMARKS.md has {n} lines, over {BENCHMARKS_MAX_LINES}: move superseded runs into "
        "benches/results/HISTORY.md")


def test_docs_folder_has_pages():
    assert len(checked_files()) > 4, "docs/*.md not found"


# --- Markdown parsing, as much of GitHub's as the links need ---

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks and HTML comments."""
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (links by their text, inline code
    by its content), lowercased, every character but letters, digits, underscores, hyphens
    and spaces dropped, spaces turned into hyphens."""
    text = LINK.sub(lambda m: m.group(1), heading)
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchor_cache: Dict[str, set] = {}


def anchors(path: str) -> set:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2, ... as on GitHub."""
    if path not in _anchor_cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen: Dict[str, int] = {}
        found = set()
        for _, line in prose_lines(text):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        # explicit HTML anchors (<a name="x"> / id="x") count too
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links(rel: str) -> Iterator[Tuple[int, str]]:
    """(line number, target) of every inline link and image in a file's prose."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        # inline code cannot hold a link; keep its place so link text in backticks still parses
        line = INLINE_CODE.sub(lambda m: "x" * len(m.group(0)) if "](" in m.group(2) else m.group(0), line)
        for m in LINK.finditer(line):
            yield n, m.group(2)


def broken_links(rel: str) -> List[str]:
    problems = []
    here = os.path.dirname(os.path.join(ROOT, rel))
    for n, target in links(rel):
        if re.match(r"^(https?:|mailto:|ftp:)", target, re.I):
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, rel)
        if not os.path.exists(dest):
            problems.append(f"{rel}:{n}: {target}: no such file {os.path.relpath(dest, ROOT)}")
            continue
        if anchor:
            if os.path.isdir(dest) or not dest.endswith(".md"):
                problems.append(f"{rel}:{n}: {target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{rel}:{n}: {target}: {os.path.relpath(dest, ROOT)} has no heading #{anchor}")
    return problems


@pytest.mark.parametrize("rel", checked_files())
def test_relative_links_resolve(rel):
    assert os.path.exists(os.path.join(ROOT, rel)), f"{rel} is missing"
    problems = broken_links(rel)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_slug_rule():
    assert slug("Against cuDNN: latest full run, commit `8e60086` (H200, 2026-11-27)") == \
        "against-cudnn-latest-full-run-commit-8e60086-h200-2026-11-27"
    assert slug('"high" against cuDNN TF32') == "high-against-cudnn-tf32"
    assert slug("Max |x| on the copy threads") == "max-x-on-the-copy-threads"
    assert slug("Using [convtune](x.md) from Rust") == "using-convtune-from-rust"


def test_duplicate_headings_are_numbered(tmp_path):
    p = tmp_path / "d.md"
    p.write_text("# A\n\n## Run\n\n```sh\n# Run\n```\n\n## Run\n\n## Run\n", encoding="utf-8")
    assert anchors(str(p)) == {"a", "run", "run-1", "run-2"}
