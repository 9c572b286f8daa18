"""Helpers for tests that need something outside Python (a browser, a tool).

On a learner's machine a missing tool skips the test with a clear reason; under CI (the `CI`
environment variable set) the same thing is a failure, so a missing install step cannot hide.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require(condition: bool, reason: str) -> None:
    """Skip (locally) or fail (under CI) unless `condition` holds."""
    if condition:
        return
    if under_ci():
        pytest.fail(f"{reason} (CI is set, so this is a failure rather than a skip)")
    pytest.skip(reason)


@functools.cache
def _sandbox_reason() -> str | None:
    from transformer_lab.exercises.sandbox import probe

    return probe()


def require_sandbox() -> None:
    """Grading runs each submission in a bubblewrap sandbox: skip (locally) or fail (under CI) where none can be
    made, saying why (docs/teaching.md, "The sandbox", says how to install it)."""
    reason = _sandbox_reason()
    require(reason is None, f"grading needs its sandbox, which cannot be made here: {reason}")


def load_tool(name: str):  # noqa: ANN201 - the module
    """tools/<name>.py as a module (imported by path: tools/ is not a package)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"transformer_lab_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_cells(notebook) -> list[int]:  # noqa: ANN001 - an nbformat notebook
    """The indices of a notebook's check cells (nbgrader grade cells with code): with every exercise blank, each
    must say "not done yet" (tests/test_editions.py under nbclient, tests/test_browser.py in JupyterLab)."""
    return [
        i
        for i, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("grade")
    ]


def share_dependencies(python: pathlib.Path) -> pathlib.Path:
    """Let the fresh virtual environment of `python` see this environment's packages (torch, JupyterLab, ...) after
    its own, through a .pth file: installing them afresh would need the network. Returns its site-packages."""
    import subprocess
    import sysconfig

    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    pth = pathlib.Path(site) / "_course_dependencies.pth"
    pth.write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return pathlib.Path(site)
