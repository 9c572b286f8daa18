"""The learner edition (notebooks/) and the learner's working copy (my_notebooks/).

- The committed learner edition equals a fresh generation from the source edition, outputs included
  (tools/editions.py; no kernel needed).
- It is the source edition with every exercise body blank and the hidden tests removed, every other
  cell the same, and each check cell's stored output what a blank answer prints.
- Every learner notebook runs to the end with every exercise blank (TRANSFORMER_LAB_QUICK=1); the chapters with
  widgets do so in JupyterLab, in tests/test_browser.py, where Chromium is at hand.
- the working copy (transformer_lab/workspace.py) never overwrites a learner's work, refreshes an unchanged copy,
  adds a new chapter.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import nbformat
import pytest
from support import check_cells, load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]


editions = load_tool("editions")
workspace = load_tool("workspace")
SOURCES = editions.source_notebooks(ROOT)
LEARNER = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# the chapters tests/test_browser.py runs blank in JupyterLab (as Run All), with its Chromium
from test_browser import CHROMIUM, WIDGET_CHAPTERS  # noqa: E402

BROWSER_RUN = {p.name for p in WIDGET_CHAPTERS}


def chapters(paths: list[pathlib.Path]) -> list:
    if not paths:
        return [pytest.param(None, id="no-chapters")]
    return [pytest.param(path, id=path.stem) for path in paths]


def need(path: pathlib.Path | None) -> pathlib.Path:
    if path is None:
        pytest.fail("no chapter notebook found")
    return path


def test_both_editions_have_the_same_chapters():
    assert SOURCES, "no source notebook in notebooks/solutions/"
    assert [p.name for p in LEARNER] == [p.name for p in SOURCES]


def test_the_learner_edition_equals_a_fresh_generation():
    problems = editions.stale(ROOT)
    assert not problems, "stale learner edition (run: python tools/editions.py):\n" + "\n".join(problems)


def _text(cell) -> str:
    return editions.source_text(cell)


@pytest.mark.parametrize("path", chapters(SOURCES))
def test_learner_cells_are_the_source_cells_with_blank_exercises(path):
    path = need(path)
    source = json.loads(path.read_text(encoding="utf-8"))
    learner = json.loads((ROOT / "notebooks" / path.name).read_text(encoding="utf-8"))
    assert len(learner["cells"]) == len(source["cells"])
    solutions = 0
    for index, (mine, theirs) in enumerate(zip(learner["cells"], source["cells"], strict=True)):
        meta = theirs.get("metadata", {}).get("nbgrader", {})
        where = f"{path.name}, cell {index}"
        assert mine["cell_type"] == theirs["cell_type"] and mine.get("metadata") == theirs.get("metadata"), where
        if meta.get("solution"):
            solutions += 1
            assert editions.SOLUTION_BEGIN not in _text(mine) and "raise NotImplementedError()" in _text(mine), where
            assert "# YOUR CODE HERE" in _text(mine), where
            compile(_text(mine), where, "exec")  # the stub keeps the cell valid Python
        elif meta.get("grade") and theirs["cell_type"] == "code":
            assert editions.HIDDEN_BEGIN not in _text(mine) and ".grade(" not in _text(mine), where
            printed = "".join("".join(o.get("text", "")) for o in mine.get("outputs", []))
            checks = [line for line in _text(mine).splitlines() if editions.CHECK.match(line.strip())]
            assert printed.count("not done yet") == len(checks), where
        else:
            assert mine == theirs, f"{where}: a cell that is not an exercise must be copied as it is"
    if path.name[:2] != "00" or solutions:
        assert solutions >= 1, f"{path.name} has no exercise"


def test_clearing_keeps_the_indentation_and_refuses_broken_regions():
    text = "def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    assert editions.clear_solution(text) == (
        "def f(x):\n    '''doc'''\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    )
    with pytest.raises(ValueError, match="without"):
        editions.clear_solution("def f():\n    ### BEGIN SOLUTION\n    return 1\n")
    assert editions.clear_hidden_tests("a\n### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS\n") == "a"


def test_the_learner_edition_is_what_binder_and_the_lab_open():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "urlpath=lab/tree/notebooks/00_start_here.ipynb" in readme
    run = (ROOT / "run.sh").read_text(encoding="utf-8")
    assert "transformer_lab.cli lab" in run and "my_notebooks" in run
    assert "/my_notebooks/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------- the blank run


@pytest.mark.slow
@pytest.mark.parametrize("path", chapters(LEARNER))
def test_the_learner_edition_runs_to_the_end_with_every_exercise_blank(path, tmp_path):
    """Run All on the learner edition as a learner gets it: no error, and every check says "not done yet".

    The chapters with widgets are run so in JupyterLab by tests/test_browser.py, with these same checks; they run
    here only where that test cannot (no Chromium).
    """
    from nbclient import NotebookClient

    path = need(path)
    if path.name in BROWSER_RUN and pathlib.Path(CHROMIUM).exists():
        pytest.skip(f"{path.name} runs to the end blank in JupyterLab, in tests/test_browser.py")
    notebook = nbformat.read(path, as_version=4)
    env_before = dict(os.environ)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TRANSFORMER_LAB_QUICK="1")
    try:
        client = NotebookClient(
            notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    errors = [
        (index, output.get("ename"), output.get("evalue"))
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, f"{path.name}: errors with every exercise blank: {errors}"
    for index in check_cells(notebook):
        outputs = notebook.cells[index].outputs
        printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        assert "not done yet" in printed, f"{path.name}: check cell {index} printed {printed!r}"


# ---------------------------------------------------------------- the working copy


def _chapter(folder: pathlib.Path, name: str, text: str) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": text}]}), encoding="utf-8")
    return path


def test_a_first_sync_copies_every_chapter(tmp_path):
    course, mine = tmp_path / "notebooks", tmp_path / "my_notebooks"
    _chapter(course, "01_a.ipynb", "one")
    _chapter(course, "02_b.ipynb", "two")
    messages = workspace.sync(course, mine)
    assert sorted(p.name for p in mine.glob("*.ipynb")) == ["01_a.ipynb", "02_b.ipynb"]
    assert len(messages) == 2 and all("added" in m for m in messages)
    assert workspace.sync(course, mine) == []  # nothing changed, nothing to say


def test_an_unedited_copy_is_refreshed(tmp_path):
    course, mine = tmp_path / "notebooks", tmp_path / "my_notebooks"
    _chapter(course, "01_a.ipynb", "one")
    workspace.sync(course, mine)
    _chapter(course, "01_a.ipynb", "one, corrected upstream")
    messages = workspace.sync(course, mine)
    assert (mine / "01_a.ipynb").read_text(encoding="utf-8") == (course / "01_a.ipynb").read_text(encoding="utf-8")
    assert messages == ["01_a.ipynb: refreshed (the course's version changed; you had not changed yours)"]
    assert not list(mine.glob("*.updated*.ipynb"))


def test_an_edited_copy_is_never_overwritten_and_the_new_version_is_put_beside_it(tmp_path):
    course, mine = tmp_path / "notebooks", tmp_path / "my_notebooks"
    _chapter(course, "01_a.ipynb", "one")
    workspace.sync(course, mine)
    work = _chapter(mine, "01_a.ipynb", "one, with the learner's answers")
    assert workspace.sync(course, mine) == []  # upstream unchanged: nothing to do, work kept
    assert "learner's answers" in work.read_text(encoding="utf-8")
    _chapter(course, "01_a.ipynb", "one, corrected upstream")
    messages = workspace.sync(course, mine)
    assert "learner's answers" in work.read_text(encoding="utf-8"), "the learner's work was overwritten"
    beside = mine / "01_a.updated.ipynb"
    assert beside.read_text(encoding="utf-8") == (course / "01_a.ipynb").read_text(encoding="utf-8")
    assert len(messages) == 1 and "01_a.updated.ipynb" in messages[0] and "kept" in messages[0]
    # said again next time, without writing another copy
    again = workspace.sync(course, mine)
    assert len(again) == 1 and "still in 01_a.updated.ipynb" in again[0]
    assert sorted(p.name for p in mine.glob("*.ipynb")) == ["01_a.ipynb", "01_a.updated.ipynb"]
    # a second upstream change replaces the untouched offered copy
    _chapter(course, "01_a.ipynb", "one, corrected twice")
    workspace.sync(course, mine)
    assert beside.read_text(encoding="utf-8") == (course / "01_a.ipynb").read_text(encoding="utf-8")
    assert "learner's answers" in work.read_text(encoding="utf-8")


def test_a_new_chapter_is_added_and_a_deleted_one_comes_back(tmp_path):
    course, mine = tmp_path / "notebooks", tmp_path / "my_notebooks"
    _chapter(course, "01_a.ipynb", "one")
    workspace.sync(course, mine)
    (mine / "01_a.ipynb").unlink()
    _chapter(course, "10_new.ipynb", "a new chapter")
    messages = workspace.sync(course, mine)
    assert sorted(messages) == ["01_a.ipynb: added", "10_new.ipynb: added"]


def test_the_working_copy_is_left_alone_by_git_the_linter_and_pytest():
    """my_notebooks/ is git-ignored, excluded from ruff and outside pytest's test paths."""
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "my_notebooks/01_attention.ipynb"], cwd=ROOT, check=False
    ).returncode
    if (ROOT / ".git").exists():
        assert ignored == 0, "my_notebooks/ must be git-ignored"
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "my_notebooks" in config["tool"]["ruff"]["extend-exclude"]
    assert all(not p.startswith("my_notebooks") for p in config["tool"]["pytest"]["ini_options"]["testpaths"])


def test_the_workspace_command_creates_the_copy(tmp_path):
    dest = tmp_path / "mine"
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "workspace.py"), "--dest", str(dest)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "never overwritten" in out
    assert sorted(p.name for p in dest.glob("*.ipynb")) == [p.name for p in LEARNER]


def test_each_chapter_states_its_measured_time():
    """The "**Time:**" line of every title cell and chapter 00's map agree with tools/chapter_times.py."""
    times = load_tool("chapter_times")
    for path in SOURCES:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        _, changed = times.updated(notebook)
        assert not changed, f"{path.name}: stale time line; run python tools/chapter_times.py"
        title = editions.source_text(notebook["cells"][0])
        assert "**Time:** about" in title and "min of reading" in title, path.name
    start = json.loads((ROOT / "notebooks" / "solutions" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    totals = {p.stem: times.total_minutes(times.estimate(json.loads(p.read_text(encoding="utf-8")))) for p in SOURCES}
    assert not times.update_map(start, totals), "chapter 00's map of the course: stale times"
