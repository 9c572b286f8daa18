"""Exercises of every chapter, with `check()`, `hint()` and `solution()` (see core.py).

Each chapter has its own module (`ch01_attention`, ...) defining `Exercise` objects; a notebook
imports its chapter's module:

    from transformer_lab.exercises import ch01_attention as exercises
    exercises.softmax_rows.check(softmax_rows)

`all_exercises()` finds every exercise of every chapter (the tests use it to prove that each
checker accepts its reference solution and rejects its known-wrong ones).
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from transformer_lab.exercises.core import Case, CheckResult, Exercise, compare

__all__ = ["Case", "CheckResult", "Exercise", "compare", "all_exercises", "EXTRA_PATH_VARIABLE"]

#: A teacher's own exercise modules can live outside the package: the folders named in this variable
#: (separated like PATH) are searched too, so `from transformer_lab.exercises import ch11_mine as exercises`
#: finds `ch11_mine.py` there (docs/exercises.md, "An exercise of your own").
EXTRA_PATH_VARIABLE = "TRANSFORMER_LAB_EXERCISES"
__path__ += [folder for folder in os.environ.get(EXTRA_PATH_VARIABLE, "").split(os.pathsep) if folder]  # noqa: PLE0605


def all_exercises() -> dict[str, Exercise]:
    """Every exercise of every chapter module, keyed "module.name"."""
    found: dict[str, Exercise] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("ch"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for attr, value in vars(module).items():
            if isinstance(value, Exercise):
                found[f"{info.name}.{attr}"] = value
    return found
