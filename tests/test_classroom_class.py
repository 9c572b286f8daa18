"""A simulated class, graded end to end with `tools/classroom.py` on two chapters.

Students: ada (all correct), bob (all blank), cy (plausible mistakes from each exercise's catalogue of wrong
answers, a browser's re-download name), dan (answers that call the finished version), eve (blank answers
plus a family of tampering attacks), fay (a corrupt notebook, an endless loop), gus (hands in blank, then
resubmits one chapter). The expected grades are computed here, independently of the grading pipeline: the
reference and each wrong answer are run directly on the same hidden inputs the grader draws (the test fixes
the secret seed), and each case passed earns its share of the points.
"""

from __future__ import annotations

import csv
import html
import inspect
import json
import pathlib
import re
import shutil
import textwrap
import time

import pytest
import torch
from support import require_sandbox
from test_classroom import NOTEBOOKS, ROOT, classroom

from transformer_lab.exercises.core import compare
from transformer_lab.exercises.grading import hidden_inputs, submission_secret

CHAPTERS = [p for p in NOTEBOOKS if p.name[:2] in ("02", "04")]
SECRET = 20261123
TIMEOUT = 5.0


def cells_by_id(notebook: dict) -> dict[str, dict]:
    return {c["metadata"]["nbgrader"]["grade_id"]: c for c in notebook["cells"] if "nbgrader" in c["metadata"]}


def exercises_of(path: pathlib.Path) -> list[tuple[str, str, object, float]]:
    """(answer cell id, function name, Exercise, points) for each exercise of a chapter, in order."""
    import importlib

    notebook = json.loads(path.read_text(encoding="utf-8"))
    module_name = re.search(
        r"from transformer_lab\.exercises import (\w+) as exercises", path.read_text(encoding="utf-8")
    ).group(1)
    module = importlib.import_module(f"transformer_lab.exercises.{module_name}")
    found, answer = [], None
    for cell in notebook["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            answer = meta["grade_id"]
        if meta.get("grade"):
            name, function = re.search(r"exercises\.(\w+)\.check\((\w+)\)", "".join(cell["source"])).groups()
            found.append((answer, function, getattr(module, name), float(meta["points"])))
    return found


def renamed_source(function: object, name: str) -> str:
    source = textwrap.dedent(inspect.getsource(function))
    return re.sub(r"^def \w+\(", f"def {name}(", source, count=1, flags=re.M)


def fair_points(exercise, candidate, points: float, secret: int = SECRET) -> float:
    """What a fair teacher gives: each hidden case passed earns its share. `secret`: the submission's
    (`grading.submission_secret` of the class's secret, the student and the answer cells)."""
    passed = 0
    for index, case in enumerate(exercise.cases):
        inputs = hidden_inputs(exercise, index, secret)
        try:
            with torch.no_grad():
                got = exercise._run(candidate, *hidden_inputs(exercise, index, secret))
        except Exception:
            continue
        expected = exercise._run(exercise.reference, *inputs)
        passed += compare(got, expected, case.atol, case.rtol) is None
    return round(points * passed / len(exercise.cases), 4)


def put(folder: pathlib.Path, name: str, notebook: dict | str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(notebook if isinstance(notebook, str) else json.dumps(notebook), encoding="utf-8")


TAMPERING = """\
import builtins, sys
from transformer_lab.exercises import core
from transformer_lab.exercises.core import Exercise
Exercise.grade = lambda self, c: None
Exercise.check = lambda self, c: print("All correct. Well done!")
core.compare = lambda *a, **k: None
torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
sys.displayhook = lambda value: None
builtins.float = lambda *a: 1.0
sys.modules["transformer_lab.exercises.grading"] = None
"""


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    require_sandbox()
    if len(CHAPTERS) != 2:
        pytest.fail("the simulated class needs chapters 02 and 04 in notebooks/solutions/")
    tmp = tmp_path_factory.mktemp("class")
    course = tmp / "course"
    out = classroom.make_student_folder(tmp / "student", course, CHAPTERS)
    subs = tmp / "subs"
    expected: dict[str, dict[str, float]] = {}
    for path in CHAPTERS:
        source = json.loads(path.read_text(encoding="utf-8"))
        blank = json.loads((out / path.name).read_text(encoding="utf-8"))
        plan = exercises_of(path)
        full = sum(points for *_, points in plan)
        put(subs / "ada", path.name, source)
        expected.setdefault("ada", {})[path.stem] = full
        put(subs / "bob", path.name, blank)
        expected.setdefault("bob", {})[path.stem] = 0.0
        put(subs / "gus", path.name, blank)
        expected.setdefault("gus", {})[path.stem] = 0.0
        # cy: the first known mistake of each exercise
        mistakes = json.loads(json.dumps(source))
        cells = cells_by_id(mistakes)
        total = 0.0
        for answer, function, exercise, points in plan:
            wrong = exercise.mistakes[0].answer if exercise.mistakes else exercise.wrong[0]
            cells[answer]["source"] = renamed_source(wrong, function)
            secret = submission_secret(SECRET, "cy", [cells[answer]["source"]])  # cy's own hidden inputs
            total += fair_points(exercise, wrong, points, secret)
        put(subs / "cy", path.stem + " (1).ipynb", mistakes)
        expected.setdefault("cy", {})[path.stem] = round(total, 4)
        # dan: every answer calls the finished version (the exercise's own reference)
        calls = json.loads(json.dumps(source))
        cells = cells_by_id(calls)
        for answer, function, exercise, _ in plan:
            cells[answer]["source"] = (
                f"finished = getattr(exercises, {exercise.name!r}).reference\n"
                f"def {function}(*args):\n    return finished(*args)\n"
            )
        put(subs / "dan", path.name, calls)
        expected.setdefault("dan", {})[path.stem] = 0.0
        # eve: blank answers, tampering, a locked cell edited, one check cell deleted, one renamed
        tampered = json.loads(json.dumps(blank))
        cells = cells_by_id(tampered)
        first_answer = plan[0][0]
        cells[first_answer]["source"] = TAMPERING + "".join(cells[first_answer]["source"])
        checks = [c for c in tampered["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
        checks[0]["source"] = 'print("All correct. Well done!")\n'
        checks[1]["metadata"]["nbgrader"]["grade_id"] += "_renamed"
        tampered["cells"].remove(checks[2])
        put(subs / "eve", path.name, tampered)
        expected.setdefault("eve", {})[path.stem] = 0.0
    # fay: chapter 02 correct but one endless loop; chapter 04 corrupt
    loop = json.loads(CHAPTERS[0].read_text(encoding="utf-8"))
    answer, function, exercise, points = exercises_of(CHAPTERS[0])[0]
    cells_by_id(loop)[answer]["source"] = f"def {function}(*args):\n    while True:\n        pass\n"
    put(subs / "fay", CHAPTERS[0].name, loop)
    full0 = sum(p for *_, p in exercises_of(CHAPTERS[0]))
    put(subs / "fay", CHAPTERS[1].name, '{"cells": [ truncated')
    expected["fay"] = {CHAPTERS[0].stem: full0 - points, CHAPTERS[1].stem: 0.0}

    start = time.perf_counter()
    classroom.grade_folder(subs, course, timeout=TIMEOUT, secret=SECRET)
    seconds = time.perf_counter() - start
    # gus resubmits chapter 02, correct this time: only that chapter's grade changes
    resubmit = tmp / "resubmit"
    put(resubmit / "gus", CHAPTERS[0].name, json.loads(CHAPTERS[0].read_text(encoding="utf-8")))
    classroom.grade_folder(resubmit, course, timeout=TIMEOUT, secret=SECRET)
    expected["gus"][CHAPTERS[0].stem] = sum(p for *_, p in exercises_of(CHAPTERS[0]))
    return course, out, expected, seconds, tmp


def read_table(path: pathlib.Path) -> dict[str, dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_the_grade_table_is_what_a_fair_teacher_gives(klass):
    course, _, expected, seconds, _ = klass
    table = read_table(course / "grades.csv")
    assert sorted(table) == sorted(expected)
    maxima = classroom.chapter_maxima(course)
    for student, chapters in expected.items():
        for chapter, points in chapters.items():
            assert float(table[student][chapter]) == pytest.approx(points, abs=1e-3), (student, chapter)
        assert float(table[student]["total"]) == pytest.approx(sum(chapters.values()), abs=1e-3), student
        assert float(table[student]["max_total"]) == sum(maxima.values())
    assert 0 < float(table["cy"]["total"]) < float(table["ada"]["total"]), "plausible mistakes earn partial credit"
    print(f"graded {len(expected)} students x {len(CHAPTERS)} chapters in {seconds:.1f} s")


@pytest.mark.slow
def test_the_gradebook_holds_the_same_scores(klass):
    course, _, expected, _, _ = klass
    with classroom.gradebook(course) as gb:
        for student, chapters in expected.items():
            for chapter, points in chapters.items():
                submission = gb.find_submission(chapter, student)
                assert submission.score == pytest.approx(points, abs=1e-3), (student, chapter)


@pytest.mark.slow
def test_the_report_names_every_problem_and_no_honest_student(klass):
    course, *_ = klass
    report = (course / "grading_report.md").read_text(encoding="utf-8")
    sections = {}
    for block in report.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip()] = body
    honest = sections["No problem"].split()
    for student in ("ada", "bob", "gus"):
        assert student not in sections and student in honest, student
    assert all("misnamed" in line for line in sections["cy"].strip().splitlines()), sections["cy"]
    dan = sections["dan"]
    # dan's answers reach the exercise's reference (`exercises.<name>.reference`): the static check refuses each
    assert dan.count("refused (not run)") == sum(len(exercises_of(p)) for p in CHAPTERS)
    assert "`exercises`" in dan and "reference" in dan
    eve = sections["eve"]
    for needle in (
        "Exercise.grade",
        "Exercise.check",
        "torch.allclose",
        "assert_close",
        "sys.displayhook",
        "builtins.float",
        "was edited",
        "was deleted or renamed",
        "core.compare",
    ):
        assert needle in eve, needle
    fay = sections["fay"]
    assert "time limit" in fay and "not a valid notebook" in fay


@pytest.mark.slow
def test_feedback_pages_have_no_paths_and_no_package(klass):
    course, _, expected, _, tmp = klass
    pages = classroom.feedback(course, tmp / "feedback")
    assert len(pages) == sum(len(c) for c in expected.values())
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert str(tmp) not in text and str(ROOT) not in text and "/home/" not in text
        assert "points" in text
    assert not list((tmp / "feedback").rglob("*.py"))


@pytest.mark.slow
def test_the_feedback_names_each_known_mistake_the_grader_recognised(klass):
    """cy's answers are each exercise's first known mistake: the grader (outside the sandbox, on the hidden
    inputs) recognises it by its symptom, and cy's feedback says what it shows, as check() would."""
    course, _, _, _, tmp = klass
    pages = classroom.feedback(course, tmp / "feedback_mistakes")
    cy = " ".join(html.unescape(p.read_text(encoding="utf-8")) for p in pages if "cy" in p.parts)
    cy = " ".join(cy.split())
    named = 0
    for path in CHAPTERS:
        for _, _, exercise, _ in exercises_of(path):
            if exercise.mistakes:
                says = " ".join(textwrap.dedent(exercise.mistakes[0].says).split())
                assert says in cy, (exercise.name, says)
                named += 1
    assert named >= 4, "chapters 02 and 04 have build, debug and transfer exercises with known mistakes"


@pytest.mark.slow
def test_the_student_folder_holds_what_a_student_needs(klass):
    _, out, *_ = klass
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in CHAPTERS]
    assets = {p.name for p in (out / "transformer_lab" / "assets").iterdir()}
    assert "dates_model.pt" not in assets and not any(a.endswith("tinyshakespeare.txt") for a in assets)
    assert (out / "transformer_lab" / "exercises" / "expected.pt").is_file()
    stored = torch.load(out / "transformer_lab" / "exercises" / "expected.pt", weights_only=False)
    handed = {
        exercise.reference.__module__.rsplit(".", 1)[-1] for p in CHAPTERS for _, _, exercise, _ in exercises_of(p)
    }
    assert stored and {key.split(".", 1)[0] for key in stored} == handed  # no answer of a chapter not handed out
    module = (
        out
        / "transformer_lab"
        / "exercises"
        / f"{exercises_of(CHAPTERS[0])[0][2].reference.__module__.rsplit('.', 1)[-1]}.py"
    ).read_text(encoding="utf-8")
    assert "the reference answer is not in this copy of the course" in module
    for _, _, exercise, _ in exercises_of(CHAPTERS[0]):  # no reference, no known-wrong answer is left in it
        assert f"def {exercise.reference.__name__}(" not in module
        assert not any(f"def {wrong.__name__}(" in module for wrong in exercise.wrong)
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "more tests" not in readme and "no solutions" in readme
    assert not list(out.rglob("__pycache__"))


@pytest.mark.slow
def test_regenerating_after_grading_keeps_grades_and_releases(klass):
    course, *_, tmp = klass
    before = (course / "grades.csv").read_text(encoding="utf-8")
    changed = tmp / "changed" / CHAPTERS[0].name
    changed.parent.mkdir()
    notebook = json.loads(CHAPTERS[0].read_text(encoding="utf-8"))
    notebook["cells"][0]["source"] = "".join(notebook["cells"][0]["source"]) + "\n\n(A typo fixed mid-term.)"
    changed.write_text(json.dumps(notebook), encoding="utf-8")
    assert "generated" in classroom.generate_chapter(course, changed)
    assert list((course / "release_history" / CHAPTERS[0].stem).glob("*/*.ipynb")), "the earlier release is kept"
    classroom.write_tables(course, course / "grades.csv")
    assert (course / "grades.csv").read_text(encoding="utf-8") == before


@pytest.mark.slow
def test_the_course_folder_can_be_moved(klass, tmp_path):
    course, *_ = klass
    moved = tmp_path / "moved"
    shutil.copytree(course, moved)
    config = (moved / "nbgrader_config.py").read_text(encoding="utf-8")
    assert str(course) not in config
    out = classroom.nbgrader(moved, "db", "student", "list")
    assert "ada" in out


MY_MODULE = '''
"""A teacher's own exercise, outside the package (docs/exercises.md, "An exercise of your own")."""
import torch

from transformer_lab.exercises.core import Case, Exercise


def _reference(x):
    return x.clamp(min=0.0) * 2.0


def _no_clamp(x):
    return x * 2.0


double_relu = Exercise(
    "double_relu",
    reference=_reference,
    cases=[
        Case("positive entries only", lambda: (torch.tensor([5.0, 6.0, 7.0]),)),
        Case("a matrix", lambda: (torch.eye(3) - 0.5,)),
    ],
    hints=["ReLU first.", "clamp(min=0) keeps the positive part.", "Then multiply by two."],
    level="easy",
    kind="build",
    wrong=[_no_clamp],
    forbidden=["relu"],
    shortcuts=[lambda x: torch.relu(x) * 2],
)
'''


def my_notebook() -> dict:
    import nbformat

    def meta(**fields):
        return {"nbgrader": {"schema_version": 3, "task": False, **fields}}

    cells = [
        nbformat.v4.new_markdown_cell("# 11 · My own chapter"),
        nbformat.v4.new_code_cell("import torch\n\nimport transformer_lab as tl"),
        nbformat.v4.new_code_cell("from transformer_lab.exercises import ch11_mine as exercises"),
        nbformat.v4.new_markdown_cell("### Exercise 1 (easy, build): twice the ReLU"),
        nbformat.v4.new_code_cell(
            "def double_relu(x):\n    ### BEGIN SOLUTION\n"
            "    return torch.where(x > 0, x, 0.0) * 2\n    ### END SOLUTION",
            metadata=meta(grade=False, grade_id="ch11_double_relu", locked=False, solution=True),
        ),
        nbformat.v4.new_code_cell(
            "exercises.double_relu.check(double_relu)\n### BEGIN HIDDEN TESTS\n"
            "exercises.double_relu.grade(double_relu)\n### END HIDDEN TESTS",
            metadata=meta(grade=True, grade_id="ch11_double_relu_check", locked=True, points=2, solution=False),
        ),
        nbformat.v4.new_code_cell(
            "# exercises.double_relu.hint()",
            metadata=meta(grade=False, grade_id="ch11_double_relu_help", locked=True, solution=False),
        ),
    ]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return json.loads(nbformat.writes(notebook))


@pytest.mark.slow
def test_a_teachers_own_exercise_grades(tmp_path, monkeypatch):
    import transformer_lab.exercises as package

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "ch11_mine.py").write_text(MY_MODULE, encoding="utf-8")
    monkeypatch.setenv("TRANSFORMER_LAB_EXERCISES", str(mine))
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(mine)])
    source = tmp_path / "11_mine.ipynb"
    source.write_text(json.dumps(my_notebook()), encoding="utf-8")
    out = classroom.make_student_folder(tmp_path / "student", tmp_path / "course", [source])
    assert (out / "transformer_lab" / "exercises" / "ch11_mine.py").is_file()
    right = json.loads(source.read_text(encoding="utf-8"))
    wrong = json.loads(source.read_text(encoding="utf-8"))
    cells_by_id(wrong)["ch11_double_relu"]["source"] = "def double_relu(x):\n    return x * 2.0\n"
    shortcut = json.loads(source.read_text(encoding="utf-8"))
    cells_by_id(shortcut)["ch11_double_relu"]["source"] = "def double_relu(x):\n    return torch.relu(x) * 2\n"
    put(tmp_path / "subs" / "ann", "11_mine.ipynb", right)
    put(tmp_path / "subs" / "ben", "11_mine.ipynb", wrong)
    put(tmp_path / "subs" / "cal", "11_mine.ipynb", shortcut)
    put(tmp_path / "subs" / "dee", "11_mine.ipynb", json.loads((out / "11_mine.ipynb").read_text(encoding="utf-8")))
    classroom.grade_folder(tmp_path / "subs", tmp_path / "course", timeout=5, secret=SECRET)
    table = read_table(tmp_path / "course" / "grades.csv")
    assert {s: float(r["11_mine"]) for s, r in table.items()} == {"ann": 2.0, "ben": 1.0, "cal": 0.0, "dee": 0.0}
