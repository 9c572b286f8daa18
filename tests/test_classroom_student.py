"""The student versions made by `python tools/classroom.py student`: blanks, runs to the end, scores 0.

One `nbgrader generate_assignment` makes the student version of two chapters (STUDENT_CHAPTERS: the
learner edition, which is nearly the same notebooks, runs every chapter blank in
tests/test_editions.py, so nbgrader's own run is kept to two chapters to save time); the blank
versions are then handed in unchanged, as the student "blank", and `nbgrader autograde` runs each
in a fresh kernel (one thread, TRANSFORMER_LAB_QUICK=1) with the hidden tests put back.

"Runs to the end with every exercise blank" is checked on that same run, to save a third execution
of every chapter: the autograded notebook is the handed-out one plus the hidden tests, so it must
have run every cell, with errors only where a hidden `grade()` assert fails, after `check()` printed
its report without raising. The handed-out grade cells are exactly the visible part (checked below),
so the handed-out notebook runs to the end without an error.

A separate file from tests/test_classroom.py so that pytest -n 2 --dist loadfile grades the
solutions and the student versions in parallel.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest
from test_classroom import FIXTURE, NOTEBOOKS, ROOT, chapters, classroom, exercise_cells, need

STUDENT_CHAPTERS = [path for path in NOTEBOOKS if path.name[:2] in ("02", "04")]


@pytest.fixture(scope="module")
def blank_grades(tmp_path_factory):
    """Make the student folder of every chapter and autograde it unchanged, as the student "blank"."""
    if not NOTEBOOKS:
        pytest.fail("no chapter notebook matches notebooks/[0-9][0-9]_*.ipynb")
    tmp = tmp_path_factory.mktemp("classroom_student")
    course = tmp / "course"
    out = classroom.make_student_folder(tmp / "student", course, STUDENT_CHAPTERS)
    (tmp / "submissions").mkdir()
    shutil.copytree(out, tmp / "submissions" / "blank")
    rows = classroom.grade_folder(tmp / "submissions", course, tmp / "grades.csv")
    return out, course, rows


@pytest.mark.slow
def test_the_student_folder_is_complete(blank_grades):
    out, _, _ = blank_grades
    assert len(STUDENT_CHAPTERS) == 2
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in STUDENT_CHAPTERS]
    assert (out / "transformer_lab" / "__init__.py").is_file()
    assert (out / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    assert "pip install -r requirements.txt" in (out / "README.md").read_text()
    assert not list(out.rglob("__pycache__"))


@pytest.mark.slow
@pytest.mark.parametrize("path", chapters(STUDENT_CHAPTERS))
def test_student_version(path, blank_grades):
    path = need(path)
    out, course, rows = blank_grades
    original = nbformat.read(path, as_version=4)
    student = nbformat.read(out / path.name, as_version=4)
    assert len(student.cells) == len(original.cells)

    # What the student gets: no solution, no hidden test, no output, the stub in every solution cell.
    for index, (mine, theirs) in enumerate(zip(student.cells, original.cells, strict=True)):
        where = f"{path.name} cell {index}"
        assert "BEGIN SOLUTION" not in mine.source and "HIDDEN TESTS" not in mine.source, where
        if mine.cell_type == "code":
            assert mine.outputs == [] and mine.execution_count is None, f"{where}: outputs not cleared"
        meta = classroom.nbgrader_meta(theirs)
        if meta.get("solution") and theirs.cell_type == "code":
            assert "raise NotImplementedError()" in mine.source, f"{where}: no stub in the solution cell"
        elif meta.get("grade") and theirs.cell_type == "code":
            assert mine.source.strip() == classroom.split_hidden(theirs.source)[0], f"{where}: not the visible part"
        else:
            assert mine.source == theirs.source, f"{where}: changed though it is not an exercise cell"

    # Autograded as handed out: 0 points for every exercise.
    mine = [r for r in rows if r["notebook"] == path.stem]
    assert len(mine) == len(exercise_cells(path)), f"{path.name}: the gradebook misses grade cells"
    for row in mine:
        assert row["score"] == 0 < row["max_score"], f"{path.name} {row['cell']}: {row['score']} points for a blank"

    # It ran to the end: every code cell ran; only grade cells failed, at their hidden grade() assert.
    graded = nbformat.read(course / "autograded" / "blank" / classroom.ASSIGNMENT / path.name, as_version=4)
    for index, cell in enumerate(graded.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        where = f"{path.name} cell {index}"
        assert cell.execution_count is not None, f"{where}: never ran"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if classroom.nbgrader_meta(cell).get("grade"):
            assert [e.ename for e in errors] == ["AssertionError"], f"{where}: {[e.ename for e in errors]}"
            assert "not done yet" in errors[0].evalue, f"{where}: {errors[0].evalue}"
            printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert "not done yet" in printed, f"{where}: check() printed no report before the hidden test"
        else:
            assert not errors, f"{where} raised {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.slow
def test_fixture_student_version_runs_to_the_end(tmp_path, monkeypatch):
    """The literal check on the fixture: the handed-out notebook, run as is, raises nowhere, and imports
    the package from the student folder itself (PYTHONPATH unset, as on a student's machine)."""
    from nbclient import NotebookClient

    out = classroom.make_student_folder(tmp_path / "student", tmp_path / "course", [FIXTURE])
    notebook = nbformat.read(out / FIXTURE.name, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("print(tl.__file__)"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
    text = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs)
    assert text.count("not done yet") == 2
    assert "(1, 3, 4) (1, 3, 3)" in text
    assert f"{out / 'transformer_lab' / '__init__.py'}" in text
