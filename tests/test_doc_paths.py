"""Every repository path and relative link the documents cite (README.md, docs/*.md, the index
docs/bench/README.md) exists: a moved or deleted script, test or raw result fails here, naming the
document and the path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "bench" / "README.md"]
TOPS = ("docs", "scripts", "splitkv_bench", "tests", "splitkv_common", "cuda_ref", "ascend_ops", "splitkv_vllm", ".ci")
#: A path at the start of a word, under one of TOPS; a trailing ``*`` makes it a glob.
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./+-]*[\w+-])(\*?)" % "|".join(re.escape(t) for t in TOPS))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: What a build makes and git does not hold (scripts/build_ascend.sh).
BUILT = ("ascend_ops/_lib",)


def cited(doc: Path) -> list[tuple[str, bool]]:
    """(path, whether it exists) of each cited path and relative link in ``doc``."""
    text, out = doc.read_text(), []
    for m in PATH.finditer(text):
        path, glob = m.groups()
        if path.startswith(BUILT):
            continue
        found = any(ROOT.glob(path + "*")) if glob else (ROOT / path).exists() or (doc.parent / path).exists()
        out.append((path + glob, found))
    for m in LINK.finditer(text):
        if not re.match(r"[a-z]+:", m.group(1)):
            out.append((m.group(1), (doc.parent / m.group(1)).exists()))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(doc):
    missing = sorted({path for path, found in cited(doc) if not found})
    assert not missing, f"{doc.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_raw_results_are_only_those_the_documents_cite():
    """docs/bench holds a file only when README.md or docs/*.md cites it (or the ``.md`` of its run,
    or a ``bench/<prefix>*`` glob), and each file has a row in docs/bench/README.md."""
    bench = ROOT / "docs" / "bench"
    text = "\n".join(doc.read_text() for doc in DOCS[:-1])
    cited = set(re.findall(r"bench/([\w.+-]*[\w+-])", text))
    globs = re.findall(r"bench/([\w.+-]+)\*", text)
    index = (bench / "README.md").read_text()
    files = [p for p in sorted(bench.iterdir()) if p.name != "README.md"]
    uncited = [p.name for p in files
               if not ({p.name, p.stem + ".md"} & cited or any(p.name.startswith(g) for g in globs))]
    assert not uncited, f"docs/bench holds results no document cites: {uncited}"
    assert not [p.name for p in files if f"]({p.name})" not in index], "docs/bench/README.md lacks rows"


def test_the_check_has_teeth(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("Run `scripts/run_tests.sh`, then scripts/gone.py; see [x](missing.md), [y](d.md), "
                   "`tests/test_vllm_*.py` and [z](https://example.org/a).\n")
    assert cited(doc) == [("scripts/run_tests.sh", True), ("scripts/gone.py", False), ("tests/test_vllm_*", True),
                          ("missing.md", False), ("d.md", True)]
