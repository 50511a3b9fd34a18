"""docs/method.md is the document the code cites: every citation names a section it has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
CITED_FROM = ("README.md", "src", "tests", "benchmarks", "scripts", "docs", "examples", "configs")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh"}

SECTION = re.compile(r"^#{2,3} §(\d+(?:\.\d+)?) ", re.M)
ANCHORED = re.compile(r'<a id="([\w-]+)"></a>\n## §(\d+) ')
# "docs/method.md §3", "method.md §8 and §9", "[method.md §3](method.md#ktae)",
# "[method.md](method.md) §2, §10 and §11"
CITATION = re.compile(r"method\.md(?:\]\(method\.md(?:#[\w-]+)?\))? (§[\d.]+(?:(?:, | and )§[\d.]+)*)")
LINK = re.compile(r"method\.md#([\w-]+)")
OLD_NAME = "SP" + "EC"  # the name of the document method.md replaced, spelt so this file passes


def _sources():
    for top in CITED_FROM:
        if (ROOT / top).is_file():
            yield ROOT / top
            continue
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path


def _sections() -> set[str]:
    return set(SECTION.findall(METHOD.read_text()))


def test_sections_are_numbered_in_order_and_anchored():
    text = METHOD.read_text()
    top = [s for s in SECTION.findall(text) if "." not in s]
    assert top == [str(i) for i in range(1, len(top) + 1)]
    anchored = dict((n, a) for a, n in ANCHORED.findall(text))
    assert sorted(anchored, key=int) == top, "every top-level section has an anchor"
    assert len(set(anchored.values())) == len(anchored)


def test_every_citation_points_at_an_existing_section():
    sections = _sections()
    anchors = {a for a, _ in ANCHORED.findall(METHOD.read_text())}
    cited, bad = 0, []
    for path in _sources():
        text = path.read_text(errors="replace")
        for match in CITATION.finditer(text):
            for number in re.findall(r"§([\d.]+)", match.group(1)):
                cited += 1
                if number.rstrip(".") not in sections:
                    bad.append(f"{path.relative_to(ROOT)}: §{number}")
        for anchor in LINK.findall(text):
            if anchor not in anchors:
                bad.append(f"{path.relative_to(ROOT)}: #{anchor}")
    assert not bad, bad
    assert cited >= 60  # the code cites it throughout (a regex that matched nothing fails)


def test_no_file_cites_the_document_method_md_replaced():
    word = re.compile(rf"\b{OLD_NAME}\b")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _sources()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if word.search(line)]
    assert not hits, hits
