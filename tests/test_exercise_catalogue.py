"""The exercises as the notebooks present them: headings, levels in order, the three cells, no answer above.

Reads the source edition (notebooks/solutions/): each grade cell's exercise has a heading above it,
`### Exercise N (LEVEL, KIND): title`, which agrees with the Exercise object's `level` and `kind`;
within a chapter the levels never go down; the help cell prints nothing until the learner asks; nothing
after an exercise calls the learner's function; no cell above an exercise shows its reference's source.
"""

from __future__ import annotations

import importlib
import pathlib
import re

import nbformat
import pytest

from transformer_lab.exercises.core import LEVELS

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))
HEADING = re.compile(r"^#{2,4} .*\((easy|medium|harder), (build|debug the (?:notes|code)|predict|transfer)\)", re.M)
IMPORT = re.compile(r"from transformer_lab\.exercises import (\w+) as exercises")
CHECK = re.compile(r"^exercises\.(\w+)\.check\((\w+)\)\s*$", re.M)


def exercises_in(path: pathlib.Path) -> list[dict]:
    """In notebook order: each exercise's heading (level, kind), its module object, and its cells' indices."""
    nb = nbformat.read(path, as_version=4)
    module = None
    heading = None
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for match in HEADING.finditer(cell.source):
                heading = (match.group(1), match.group(2), index)
        elif cell.cell_type == "code":
            match = IMPORT.search(cell.source)
            if match:
                module = importlib.import_module(f"transformer_lab.exercises.{match.group(1)}")
            meta = cell.get("metadata", {}).get("nbgrader", {})
            check = CHECK.search(cell.source)
            if meta.get("grade") and check:
                found.append(
                    {
                        "name": check.group(1),
                        "function": check.group(2),
                        "heading": heading,
                        "exercise": getattr(module, check.group(1), None) if module else None,
                        "index": index,
                        "cells": nb.cells,
                    }
                )
                heading = None
    return found


def params():
    return [pytest.param(path, id=path.stem) for path in SOURCES] or [pytest.param(None, id="none")]


@pytest.mark.parametrize("path", params())
def test_headings_agree_with_the_exercises_and_levels_never_go_down(path):
    assert path is not None, "no source notebook"
    found = exercises_in(path)
    if path.name[:2] != "00":
        assert len(found) >= 4, f"{path.name}: {len(found)} exercises, at least 4 needed"
    previous = 0
    for item in found:
        exercise = item["exercise"]
        assert exercise is not None, f"{path.name}: exercises.{item['name']} is not in the chapter's module"
        assert item["heading"] is not None, f"{path.name}: no '(LEVEL, KIND)' heading above {item['name']}"
        level, kind, _ = item["heading"]
        assert (level, kind) == (exercise.level, exercise.kind_title), (
            f"{path.name}: the heading of {item['name']} says ({level}, {kind}), the exercise is ({exercise.title})"
        )
        assert LEVELS.index(level) >= previous, f"{path.name}: {item['name']} ({level}) comes after a harder one"
        previous = LEVELS.index(level)


@pytest.mark.parametrize("path", params())
def test_help_cells_print_nothing_until_asked_and_later_cells_never_call_the_learner(path):
    assert path is not None
    for item in exercises_in(path):
        cells, index, name, function = item["cells"], item["index"], item["name"], item["function"]
        help_cell = cells[index + 1]
        assert f"exercises.{name}.hint()" in help_cell.source, f"{path.name}: no help cell after {name}'s check"
        live = [line for line in help_cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        assert not live, f"{path.name}: the help cell of {name} runs {live}: keep every line commented"
        call = re.compile(rf"(?<![\w.]){re.escape(function)}\(")
        for later in cells[index + 1 :]:
            if later.cell_type != "code" or later.get("metadata", {}).get("nbgrader", {}).get("solution"):
                continue
            code = "\n".join(line.split("#")[0] for line in later.source.splitlines())
            code = re.sub(rf"def {re.escape(function)}\(", "", code)
            assert not call.search(code), f"{path.name}: a later cell calls the learner's {function}()"


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"#.*", "", text)).strip()


@pytest.mark.parametrize("path", params())
def test_no_reference_source_above_its_exercise(path):
    """The reference's body (comments and white space aside) appears in no cell or output above the exercise."""
    import inspect
    import textwrap

    assert path is not None
    for item in exercises_in(path):
        exercise = item["exercise"]
        source = textwrap.dedent(inspect.getsource(exercise.reference))
        body = source.split(":\n", 1)[1] if ":\n" in source else source
        lines = [
            _normalised(line)
            for line in body.splitlines()
            if _normalised(line) and not _normalised(line).startswith(('"""', "return None"))
        ]
        lines = [line for line in lines if len(line) > 25]  # the lines that carry the substance
        if not lines:
            continue
        for cell in item["cells"][: item["index"] - 1]:
            texts = [cell.source]
            if cell.cell_type == "code":
                texts += ["".join(o.get("text", "")) for o in cell.get("outputs", [])]
            seen = _normalised("\n".join(texts))
            shown = [line for line in lines if line in seen]
            assert len(shown) < max(2, len(lines) // 2 + 1), (
                f"{path.name}: the answer of {item['name']} can be read above it: {shown}"
            )
