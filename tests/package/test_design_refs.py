"""docs/design.md holds every decision the code and the docs cite, once each, in at most 600 lines."""
import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
CITING = ("fusion_shim", "tests", "benchmarks", "native", "docs", "README.md")
SUFFIXES = {".py", ".pyi", ".c", ".h", ".md", ".toml", ".cfg", ".txt"}
CITATION = re.compile(r"\bD([0-9]{1,3})\b")
HEADING = re.compile(r"^### D([0-9]{1,3})\. ", re.M)
MAX_LINES = 600


def _citing_files():
    for name in CITING:
        path = ROOT / name
        if path.is_file():
            yield path
            continue
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.suffix in SUFFIXES and f != DESIGN and "__pycache__" not in f.parts:
                yield f


def _recorded() -> list[int]:
    return [int(n) for n in HEADING.findall(DESIGN.read_text(encoding="utf-8"))]


def test_every_decision_cited_in_the_code_tests_benchmarks_and_docs_is_recorded_in_design_md():
    recorded = set(_recorded())
    missing = collections.defaultdict(list)
    for f in _citing_files():
        for n in CITATION.findall(f.read_text(encoding="utf-8", errors="replace")):
            if int(n) not in recorded:
                missing[f"D{n}"].append(str(f.relative_to(ROOT)))
    assert not missing, {d: sorted(set(fs))[:5] for d, fs in missing.items()}


def test_design_md_gives_each_decision_one_number_once():
    counts = collections.Counter(_recorded())
    assert counts, "no '### D<n>. ' heading found in docs/design.md"
    assert not [n for n, c in counts.items() if c > 1], sorted(n for n, c in counts.items() if c > 1)


def test_design_md_decisions_refer_only_to_recorded_decisions():
    text = DESIGN.read_text(encoding="utf-8")
    dangling = sorted({int(n) for n in CITATION.findall(text)} - set(_recorded()))
    assert not dangling, dangling


def test_design_md_stays_within_600_lines():
    lines = DESIGN.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/design.md has {lines} lines; keep the decisions in force, at most {MAX_LINES}"
