"""The classroom machinery (tools/classroom.py): exercise cells fit nbgrader, solutions get full marks.

Fast checks read every chapter's exercise cells (the three-cell pattern of NOTEBOOKS.md) and the
exercises they grade. The slow ones run nbgrader for real: the pipeline on a small fixture chapter
(tests/fixtures/classroom/98_sample.ipynb, which defines its exercises inline), and `nbgrader
autograde` of every chapter as written (the release version with the solutions filled in), which
must give full marks. tests/test_classroom_student.py does the student versions.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re
import shutil

import nbformat
import pytest
from support import load_tool, require_sandbox

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "classroom" / "98_sample.ipynb"


classroom = load_tool("classroom")
NOTEBOOKS = classroom.chapter_notebooks(ROOT)


def chapters(notebooks: list[pathlib.Path]) -> list:
    """Parameters over the chapters; a single failing one if there are none (never pass vacuously)."""
    if not notebooks:
        return [pytest.param(None, id="no-chapters")]
    return [pytest.param(path, id=path.stem) for path in notebooks]


def need(path: pathlib.Path | None) -> pathlib.Path:
    if path is None:
        pytest.fail("no chapter notebook matches notebooks/[0-9][0-9]_*.ipynb")
    return path


def exercise_cells(path: pathlib.Path) -> list[dict]:
    """The notebook's exercises: one dict per grade cell, with its solution cell and the names it uses."""
    nb = nbformat.read(path, as_version=4)
    found, solution = [], None
    for index, cell in enumerate(nb.cells):
        meta = classroom.nbgrader_meta(cell)
        if meta.get("solution") and cell.cell_type == "code":
            solution = cell
        if meta.get("grade") and cell.cell_type == "code":
            found.append({"index": index, "cell": cell, "meta": meta, "solution": solution})
    return found


def exercises_module(path: pathlib.Path):
    """The chapter's exercise module, from its `from transformer_lab.exercises import chNN_x as exercises`."""
    nb = nbformat.read(path, as_version=4)
    pattern = re.compile(r"from transformer_lab\.exercises import (ch\w+) as exercises")
    names = {m.group(1) for cell in nb.cells if cell.cell_type == "code" for m in pattern.finditer(cell.source)}
    assert len(names) <= 1, f"{path.name} imports several exercise modules as `exercises`: {sorted(names)}"
    if not names:
        return None
    return importlib.import_module(f"transformer_lab.exercises.{names.pop()}")


CALL = re.compile(r"^exercises\.(\w+)\.(check|grade)\((\w+)\)$")


def calls(source: str, method: str) -> list[tuple[str, str]]:
    """(exercise, function) of each `exercises.X.<method>(fn)` line."""
    found = []
    for line in source.splitlines():
        match = CALL.match(line.strip())
        if match and match.group(2) == method:
            found.append((match.group(1), match.group(3)))
    return found


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def region_inside_function(source: str) -> bool:
    """Whether every SOLUTION marker line lies inside the body of a function (nbgrader's stub must not run)."""
    lines = source.splitlines()
    bodies = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # The body runs on past its last statement through comment lines indented deeper than the def.
            end = node.end_lineno or node.lineno
            while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > node.col_offset):
                end += 1
            bodies.append((node.lineno + 1, end))
    markers = [
        number
        for number, line in enumerate(source.splitlines(), start=1)
        if line.strip() in (classroom.SOLUTION_BEGIN, classroom.SOLUTION_END)
    ]
    return bool(markers) and all(any(lo <= n <= hi for lo, hi in bodies) for n in markers)


# ---------------------------------------------------------------- fast: the exercise cells


def test_there_are_chapters():
    assert NOTEBOOKS, "no chapter notebook matches notebooks/[0-9][0-9]_*.ipynb"


@pytest.mark.parametrize("path", chapters(NOTEBOOKS))
def test_exercise_cells_fit_nbgrader(path):
    path = need(path)
    found = exercise_cells(path)
    assert len(found) >= 3 or path.name.startswith("00_"), f"{path.name}: {len(found)} graded exercises, expected >= 3"
    module = exercises_module(path) if found else None
    for item in found:
        meta, cell = item["meta"], item["cell"]
        where = f"{path.name} cell {item['index']} ({meta.get('grade_id')})"
        assert meta.get("locked") is True, f"{where}: a grade cell must be locked"
        assert meta.get("points", 0) > 0, f"{where}: a grade cell needs points > 0"
        visible, hidden = classroom.split_hidden(cell.source)
        checked, graded = calls(visible, "check"), calls(hidden, "grade")
        assert len(checked) == 1, f"{where}: the visible part must call exercises.<name>.check(<fn>) once"
        assert graded == checked, f"{where}: the hidden tests must call grade() on what check() checks: {graded}"
        name, function = checked[0]
        assert calls(visible, "grade") == [], f"{where}: grade() outside the hidden tests would show the answer"
        assert module is not None, f"{path.name}: no `from transformer_lab.exercises import chNN_x as exercises`"
        assert isinstance(getattr(module, name, None), classroom_exercise_type()), f"{where}: no exercise {name!r}"
        solution = item["solution"]
        assert solution is not None, f"{where}: no solution cell before the grade cell"
        assert re.search(rf"^(def|class) {function}\b", solution.source, re.M), (
            f"{where}: the solution cell before it does not define {function}"
        )
        assert region_inside_function(solution.source), (
            f"{where}: the solution region must lie inside a function body (nbgrader puts `raise` there)"
        )


@pytest.mark.parametrize("path", chapters(NOTEBOOKS))
def test_markers_only_in_their_cells(path):
    """nbgrader acts on these words in any cell (even in prose), so they may appear only where they belong."""
    path = need(path)
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        meta = classroom.nbgrader_meta(cell)
        allowed = set()
        if meta.get("solution") and cell.cell_type == "code":
            allowed |= {"BEGIN SOLUTION", "END SOLUTION"}
        if meta.get("grade") and cell.cell_type == "code":
            allowed |= {"BEGIN HIDDEN TESTS", "END HIDDEN TESTS"}
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
            assert marker in allowed or marker not in cell.source, (
                f"{path.name} cell {index} ({cell.cell_type}) contains {marker!r}: nbgrader would treat it as a "
                "marker (and refuse a solution region outside a solution cell); rephrase it"
            )


def classroom_exercise_type():
    from transformer_lab.exercises import Exercise

    return Exercise


def test_grade_ids_are_unique_across_the_course():
    if not NOTEBOOKS:
        pytest.fail("no chapter notebook matches notebooks/[0-9][0-9]_*.ipynb")
    seen: dict[str, str] = {}
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            grade_id = classroom.nbgrader_meta(cell).get("grade_id")
            if grade_id is None:
                continue
            assert grade_id not in seen, f"grade_id {grade_id!r} in {path.name} is already used in {seen[grade_id]}"
            seen[grade_id] = path.name


def test_every_exercise_is_graded_in_its_chapter():
    """Each Exercise of transformer_lab.exercises is checked and graded by one grade cell of a chapter."""
    from transformer_lab.exercises import all_exercises

    defined = all_exercises()
    assert defined, "transformer_lab.exercises defines no exercise"
    graded = set()
    for path in NOTEBOOKS:
        module = exercises_module(path)
        for item in exercise_cells(path):
            _, hidden = classroom.split_hidden(item["cell"].source)
            for name, _ in calls(hidden, "grade"):
                graded.add(f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
    assert sorted(set(defined) - graded) == [], "exercises that no notebook grades"


def test_a_blank_answer_fails_grade_but_not_check(capsys):
    """What scores 0 in the student version: grade() raises on nbgrader's stub, check() only prints."""
    from transformer_lab.exercises import all_exercises

    def blank(*args, **kwargs):
        raise NotImplementedError()

    exercises = all_exercises()
    assert exercises, "transformer_lab.exercises defines no exercise"
    for key, exercise in exercises.items():
        exercise.check(blank)
        assert "not done yet" in capsys.readouterr().out, key
        with pytest.raises(AssertionError, match="not done yet"):
            exercise.grade(blank)
        exercise.grade(exercise.reference_copy())


def test_split_hidden():
    visible, hidden = classroom.split_hidden("a.check(f)\n### BEGIN HIDDEN TESTS\na.grade(f)\n### END HIDDEN TESTS\n")
    assert (visible, hidden) == ("a.check(f)", "a.grade(f)")
    with pytest.raises(ValueError, match="BEGIN HIDDEN TESTS"):
        classroom.split_hidden("a.check(f)")


def test_region_inside_function():
    assert region_inside_function("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n")
    assert not region_inside_function("### BEGIN SOLUTION\ny = 1\n### END SOLUTION\n")
    assert not region_inside_function("def f(x):\n    return x\n")


def test_the_fixture_follows_the_pattern():
    found = exercise_cells(FIXTURE)
    assert [item["meta"]["grade_id"] for item in found] == ["ch98_softmax_rows_check", "ch98_double_check"]
    for item in found:
        assert region_inside_function(item["solution"].source)
        visible, hidden = classroom.split_hidden(item["cell"].source)
        assert calls(visible, "check") == calls(hidden, "grade")


# ---------------------------------------------------------------- slow: the grader on every chapter


@pytest.mark.slow
def test_the_source_edition_gets_full_marks_in_every_chapter(tmp_path):
    require_sandbox()
    """Every chapter's answers (the source edition), handed in as they are, get every point, with no problem."""
    if not NOTEBOOKS:
        pytest.fail("no chapter notebook matches notebooks/solutions/[0-9][0-9]_*.ipynb")
    course = tmp_path / "course"
    classroom.write_config(course)
    for path in NOTEBOOKS:
        (course / "source" / path.stem).mkdir(parents=True)
        shutil.copy(path, course / "source" / path.stem / path.name)
        (tmp_path / "subs" / "teacher").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / "subs" / "teacher" / path.name)
    records = classroom.grade_folder(tmp_path / "subs", course, timeout=20, secret=1, write_gb=False)
    assert {r["chapter"] for r in records} == {p.stem for p in NOTEBOOKS}
    for record in records:
        assert record["problems"] == [], f"{record['chapter']}: {record['problems']}"
        for exercise in record["exercises"]:
            assert exercise["points"] == exercise["max_points"] > 0, (record["chapter"], exercise)


def test_grader_threads_compute_their_references_one_at_a_time(monkeypatch):
    require_sandbox()
    """grade_folder grades in threads. A case's inputs seed and draw from torch's one global generator (chapter
    06's cases do), so two threads computing hidden inputs at once would draw each other's numbers: the
    reference would then answer other inputs than the student's function got, and a right answer lose points
    (it did, under load, for chapter 06's first case). Both threads here arrive together; each must still
    compute alone, and both right answers get every point."""
    import threading

    from transformer_lab.exercises import ch06_encoder, grading

    inside, most = [], []
    arrived = threading.Barrier(2, timeout=3)
    computed = grading.hidden_inputs

    def watched(*args):
        try:
            arrived.wait()  # the other thread is here too (or, if it must wait its turn, 3 s pass)
        except threading.BrokenBarrierError:
            pass
        inside.append(1)
        most.append(len(inside))
        try:
            return computed(*args)
        finally:
            inside.pop()

    monkeypatch.setattr(grading, "hidden_inputs", watched)
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(ch06_encoder._from_pytorch_reference))
    setup = "import torch\nfrom torch import nn\nfrom transformer_lab.encoder import EncoderLayer\n"
    cells = [("setup", setup), ("answer", source.replace("def _from_pytorch_reference(", "def from_pytorch_layer(", 1))]
    grades = [None, None]

    def grade(slot):
        grades[slot] = grading.grade_exercise(ch06_encoder.from_pytorch_layer, "from_pytorch_layer", cells, 3.0, 1)

    threads = [threading.Thread(target=grade, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(most) == 1
    assert [g.points for g in grades] == [3.0, 3.0], [g.cases for g in grades]


# ---------------------------------------------------------------- fast: the student folder's models


@pytest.mark.parametrize("edition", ["notebooks", "notebooks/zh"])
def test_chapter_09s_student_folder_gets_the_copy_model_its_code_loads(edition, tmp_path):
    """Chapter 09 calls cli.load_shipped("copy"): its student folder needs copy_model.pt even if its prose stopped
    naming the file (the "any file a chapter names" rule would then miss it)."""
    [chapter] = sorted((ROOT / edition).glob("09_*.ipynb"))
    text = chapter.read_text(encoding="utf-8")
    assert 'load_shipped(\\"copy\\")' in text, "chapter 09 no longer loads the shipped copy model: update this test"
    assert "copy_model.pt" in classroom.needed_assets([chapter])
    reworded = tmp_path / chapter.name  # the same chapter with every mention of the file's name gone
    reworded.write_text(text.replace("copy_model", "the copy checkpoint"), encoding="utf-8")
    assert "copy_model" not in reworded.read_text(encoding="utf-8")
    assert "copy_model.pt" in classroom.needed_assets([reworded])
    assert "dates_model.pt" in classroom.needed_assets([reworded])  # and the date model its sections 8-9 decode


def test_a_chapter_that_loads_no_copy_model_does_not_get_it(tmp_path):
    loads_dates = tmp_path / "98_dates.ipynb"
    loads_dates.write_text('{"source": ["model, tokenizer, task = cli.load_shipped()\\n"]}', encoding="utf-8")
    assert classroom.needed_assets([loads_dates]) >= {"dates_model.pt"}
    assert "copy_model.pt" not in classroom.needed_assets([loads_dates])
    for call in ('cli.load_shipped("copy")', "cli.load_shipped(task='copy')"):  # as a .py file writes it
        loads_copy = tmp_path / "97_copy.py"
        loads_copy.write_text(call + "\n", encoding="utf-8")
        assert "copy_model.pt" in classroom.needed_assets([loads_copy])
