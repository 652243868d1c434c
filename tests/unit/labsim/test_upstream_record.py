"""library/labsim/UPSTREAM.md, the conformance record, is complete and honest: every row names a test that exists
(a function ``def test_<id>`` in the named file, found by its AST), named after the row's id, a source with a tag
or commit (``@ref``) or a provenance file of this repository, and no id comes twice."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "library" / "labsim" / "UPSTREAM.md"
#: the headings other parts of the work add their rows under
HEADINGS = ("k3s", "HAMi", "PVE tasks")

ID = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")
REF = re.compile(r"\S@[0-9A-Za-z][\w.+~-]*")
PROVENANCE = re.compile(r"\(([\w./-]+\.\w+)\)")
TEST = re.compile(r"^(?P<path>tests/[\w./-]+\.py)::(?P<name>\w+)$")


@dataclass
class Row:
    section: str
    line: int
    cells: list[str]


def rows_of(text: str) -> tuple[list[str], list[Row]]:
    """The record's ``##`` headings and the body rows of their tables (header and separator rows left out)."""
    headings, rows, section, in_table = [], [], "", False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section, in_table = line[3:].strip(), False
            headings.append(section)
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")]
        if not in_table:  # the header row; the separator follows it
            in_table = True
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        rows.append(Row(section, number, cells))
    return headings, rows


def expected_test(behaviour: str) -> str:
    return "test_" + behaviour.replace(".", "_").replace("-", "_")


def functions_of(path: Path) -> set[str]:
    return {
        n.name
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def problems(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the record `text` (files are looked up under `root`): one sentence each."""
    headings, rows = rows_of(text)
    found = [f"no '## {h}' heading (other rows are added under it)" for h in HEADINGS if h not in headings]
    seen: dict[str, int] = {}
    parsed: dict[Path, set[str]] = {}
    for row in rows:
        where = f"line {row.line} ({row.section})"
        if len(row.cells) != 4:
            found.append(f"{where}: {len(row.cells)} cells, a row has 4 (id, behaviour, upstream, test)")
            continue
        behaviour, what, source, test = row.cells
        if not ID.match(behaviour):
            found.append(f"{where}: id {behaviour!r} is not lower-case words joined by '.' and '-'")
        if behaviour in seen:
            found.append(f"{where}: id {behaviour!r} repeats the row of line {seen[behaviour]}")
        seen.setdefault(behaviour, row.line)
        if not what:
            found.append(f"{where}: {behaviour} says nothing of what the stand-in does")
        provenance = [m for m in PROVENANCE.findall(source) if "/" in m]
        if not REF.search(source) and not provenance:
            found.append(
                f"{where}: {behaviour}'s source {source!r} names no @tag/@commit and no provenance file"
            )
        for rel in provenance:
            if not (root / rel).is_file():
                found.append(f"{where}: {behaviour}'s provenance file {rel} does not exist")
        m = TEST.match(test)
        if not m:
            found.append(f"{where}: {behaviour}'s test {test!r} is not tests/PATH.py::test_NAME")
            continue
        if m["name"] != expected_test(behaviour):
            found.append(
                f"{where}: {behaviour}'s test is {m['name']}, its id's name is {expected_test(behaviour)}"
            )
        path = root / m["path"]
        if not path.is_file():
            found.append(f"{where}: {behaviour}'s test file {m['path']} does not exist")
            continue
        if path not in parsed:
            parsed[path] = functions_of(path)
        if m["name"] not in parsed[path]:
            found.append(f"{where}: {m['path']} has no function {m['name']}")
    return found


def test_the_record_has_no_problems():
    assert problems(RECORD.read_text()) == []


def test_the_record_is_linked_from_labsims_readme():
    assert "(UPSTREAM.md)" in (ROOT / "library" / "labsim" / "README.md").read_text()


# --- the checks themselves, on small records ------------------------------------------------------------------

HEAD = "| Behaviour | What | Upstream | Test |\n| --- | --- | --- | --- |\n"
SECTIONS = "".join(f"## {h}\n\n{HEAD}\n" for h in HEADINGS)


def record(*rows: str) -> str:
    return SECTIONS + "## tools\n\n" + HEAD + "".join(r + "\n" for r in rows)


def tree(tmp_path, body="def test_a_b_c():\n    pass\n"):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(body)
    (tmp_path / "tests" / "sample.txt").write_text("output\n")
    return tmp_path


def test_a_good_row_passes(tmp_path):
    root = tree(tmp_path)
    good = "| a.b-c | does it | repo@v1.0 file.c | tests/test_x.py::test_a_b_c |"
    assert problems(record(good), root) == []
    by_file = "| a.b-c | does it | tool 5 (tests/sample.txt) | `tests/test_x.py::test_a_b_c` |"
    assert problems(record(by_file), root) == []


def test_a_missing_test_is_found(tmp_path):
    root = tree(
        tmp_path, body="def helper():\n    pass\n\n\nclass T:\n    def test_a_b_c(self):\n        pass\n"
    )
    (found,) = problems(record("| a.b-c | does it | repo@v1 f.c | tests/test_x.py::test_a_b_c |"), root)
    assert "has no function test_a_b_c" in found
    (found,) = problems(record("| a.b-c | does it | repo@v1 f.c | tests/nope.py::test_a_b_c |"), root)
    assert "tests/nope.py does not exist" in found


def test_a_test_named_otherwise_is_found(tmp_path):
    root = tree(tmp_path, body="def test_other():\n    pass\n")
    found = problems(record("| a.b-c | does it | repo@v1 f.c | tests/test_x.py::test_other |"), root)
    assert found == ["line 20 (tools): a.b-c's test is test_other, its id's name is test_a_b_c"]


def test_a_source_without_tag_or_provenance_is_found(tmp_path):
    root = tree(tmp_path)
    for source in ("repo file.c", "the manual", "tool (somewhere)"):
        (found,) = problems(record(f"| a.b-c | does it | {source} | tests/test_x.py::test_a_b_c |"), root)
        assert "names no @tag/@commit and no provenance file" in found, source
    (found,) = problems(
        record("| a.b-c | does it | tool (tests/gone.txt) | tests/test_x.py::test_a_b_c |"), root
    )
    assert "provenance file tests/gone.txt does not exist" in found


def test_repeated_and_malformed_ids_are_found(tmp_path):
    root = tree(tmp_path)
    row = "| a.b-c | does it | repo@v1 f.c | tests/test_x.py::test_a_b_c |"
    (found,) = problems(record(row, row), root)
    assert "id 'a.b-c' repeats the row of line 20" in found
    bad = problems(record("| A_b | does it | repo@v1 f.c | tests/test_x.py::test_a_b |"), root)
    assert any("is not lower-case words" in p for p in bad)
    short = problems(record("| a.b-c | repo@v1 f.c | tests/test_x.py::test_a_b_c |"), root)
    assert short == ["line 20 (tools): 3 cells, a row has 4 (id, behaviour, upstream, test)"]


def test_a_missing_heading_is_found(tmp_path):
    root = tree(tmp_path)
    text = record().replace("## HAMi\n", "## other\n")
    assert problems(text, root) == ["no '## HAMi' heading (other rows are added under it)"]
