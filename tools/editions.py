"""Make the learner edition of the course from the source edition.

    python tools/editions.py           # write notebooks/NN_*.ipynb from notebooks/solutions/NN_*.ipynb
    python tools/editions.py --check   # exit 1, naming the chapters, if a committed learner notebook is stale

The source edition (`notebooks/solutions/`) holds every exercise answered; it is the one a developer
edits and executes (`bash run.sh notebooks`). The learner edition (`notebooks/`) is what people open:
Binder and `bash run.sh lab` give it to learners. It is made here, never edited by hand, with the two
operations of nbgrader's ClearSolutions and ClearHiddenTests, done in place:

- in every solution cell (nbgrader metadata `solution: true`) the region between `### BEGIN SOLUTION`
  and `### END SOLUTION` becomes `# YOUR CODE HERE` / `raise NotImplementedError()`, indented as the
  region was;
- in every grade cell the lines between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` go;
- each grade cell's stored output becomes what its check prints for a blank answer ("not done yet",
  with the true number of cases), which the exercise module computes without running anything.

Every other cell, outputs included, is copied as it is, so a learner reading the learner edition on a
code host sees the same figures as the source edition. No kernel is needed.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import pathlib
import re
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks" / "solutions"
LEARNER = ROOT / "notebooks"

SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
TEXT_STUB = "YOUR ANSWER HERE"
IMPORT = re.compile(r"^from transformer_lab\.exercises import (\w+) as (\w+)\s*$", re.M)
CHECK = re.compile(r"^(\w+)\.(\w+)\.check\((\w+)\)\s*$")


def source_text(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def as_lines(text: str) -> list[str]:
    """A cell source in the form nbformat writes it: a list of lines, each but the last ending in a newline."""
    return text.splitlines(keepends=True)


def clear_solution(text: str, code: bool = True) -> str:
    """Replace every solution region with the stub (nbgrader's ClearSolutions)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == SOLUTION_BEGIN:
            if inside:
                raise ValueError(f"source: nested {SOLUTION_BEGIN!r}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + stub for stub in CODE_STUB] if code else [indent + TEXT_STUB]
        elif stripped == SOLUTION_END:
            if not inside:
                raise ValueError(f"source: {SOLUTION_END!r} without {SOLUTION_BEGIN!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"source: {SOLUTION_BEGIN!r} without {SOLUTION_END!r}")
    return "\n".join(out)


def clear_hidden_tests(text: str) -> str:
    """Remove the hidden tests of a grade cell (nbgrader's ClearHiddenTests), and the blank lines they leave."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == HIDDEN_BEGIN:
            inside = True
        elif stripped == HIDDEN_END:
            inside = False
        elif not inside:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def exercise_modules(notebook: dict[str, Any]) -> dict[str, Any]:
    """{alias: module} for each `from transformer_lab.exercises import chNN_x as alias` of the notebook."""
    found: dict[str, Any] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            for module, alias in IMPORT.findall(source_text(cell)):
                found[alias] = importlib.import_module(f"transformer_lab.exercises.{module}")
    return found


def blank_outputs(text: str, modules: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """What a grade cell prints when the learner's function is still blank."""
    printed = []
    for line in text.splitlines():
        match = CHECK.match(line.strip())
        if not match:
            continue
        alias, name, _ = match.groups()
        if alias not in modules:
            raise ValueError(f"{where}: `{line.strip()}` uses {alias!r}, which no exercise import defines")
        exercise = getattr(modules[alias], name, None)
        if exercise is None:
            raise ValueError(f"{where}: the exercise module has no exercise {name!r}")
        printed.append(exercise.blank_report() + "\n")
    if not printed:
        return []
    return [{"name": "stdout", "output_type": "stream", "text": as_lines("".join(printed))}]


def learner_notebook(source: dict[str, Any], name: str = "notebook") -> dict[str, Any]:
    """The learner edition of one source notebook (a new dict; the source is not changed)."""
    notebook = copy.deepcopy(source)
    modules = exercise_modules(notebook)
    for index, cell in enumerate(notebook.get("cells", [])):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        text = source_text(cell)
        code = cell.get("cell_type") == "code"
        if meta.get("solution"):
            cell["source"] = as_lines(clear_solution(text, code=code))
            if code:
                cell["outputs"] = []
        if meta.get("grade") and code:
            visible = clear_hidden_tests(text)
            cell["source"] = as_lines(visible)
            cell["outputs"] = blank_outputs(visible, modules, f"{name}, cell {index}")
    notebook.setdefault("metadata", {})["transformer_lab"] = {
        "edition": "learner",
        "generated_from": f"notebooks/solutions/{name}",
        "note": "generated by tools/editions.py: edit the source edition, not this file",
    }
    return notebook


def dumps(notebook: dict[str, Any]) -> str:
    """The text nbformat writes for a notebook (indent 1, keys sorted, non-ASCII kept, final newline)."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def source_notebooks(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return sorted((root / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def generate(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
    """{learner notebook path: its text} for every chapter of the source edition."""
    paths = source_notebooks(root)
    if not paths:
        raise FileNotFoundError(f"no source notebook in {root / 'notebooks' / 'solutions'}")
    out = {}
    for path in paths:
        source = json.loads(path.read_text(encoding="utf-8"))
        out[root / "notebooks" / path.name] = dumps(learner_notebook(source, path.name))
    return out


def stale(root: pathlib.Path = ROOT) -> list[str]:
    """The learner notebooks that differ from a fresh generation (or are missing, or have no source)."""
    fresh = generate(root)
    problems = []
    for path, text in fresh.items():
        if not path.exists():
            problems.append(f"{path.relative_to(root)}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.relative_to(root)}: differs from a fresh generation")
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if path not in fresh:
            problems.append(f"{path.relative_to(root)}: has no source in notebooks/solutions/")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the learner edition is up to date")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem)
        if problems:
            print("run: python tools/editions.py", file=sys.stderr)
            return 1
        print("the learner edition is up to date")
        return 0
    fresh = generate()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if path not in fresh:
            path.unlink()
            print(f"{path.relative_to(ROOT)}: removed (no source)")
    for path, text in fresh.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"{path.relative_to(ROOT)}: written")
    print(f"learner edition: {len(fresh)} chapters in notebooks/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
