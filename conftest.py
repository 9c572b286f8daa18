"""pytest configuration shared by the unit tests and the notebooks run under nbval."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Report optional notebook cells as skipped where what they need is missing.

    - `requires-cuda`: skipped where no GPU is present. Those cells guard themselves with
      `torch.cuda.is_available()` and nothing later depends on them (NOTEBOOKS.md).
    - `requires-network`: skipped unless the learner opted in with TRANSFORMER_LAB_DOWNLOAD_GPT2=1 (chapter 10's
      cell that downloads GPT-2's weights). The cell guards itself with the same variable, and the tests never
      touch the network.

    Then the longest files run first (see `_longest_first`).
    """
    skips = {}
    if not torch.cuda.is_available():
        skips["requires-cuda"] = pytest.mark.skip(reason="requires-cuda cell: no CUDA GPU on this machine")
    if os.environ.get("TRANSFORMER_LAB_DOWNLOAD_GPT2") != "1":
        skips["requires-network"] = pytest.mark.skip(
            reason="requires-network cell: downloads GPT-2 only with TRANSFORMER_LAB_DOWNLOAD_GPT2=1"
        )
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:
            continue
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag in skips:
                item.add_marker(skips[tag])
    items[:] = _longest_first(items)


def _notebook_seconds(path: Path) -> float:
    """A chapter's computation time as its title cell states it ("... 216 s of computation ...", written by
    tools/chapter_times.py from a measured run); 0 where it states none."""
    try:
        title = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0.0
    found = re.search(r"(\d+) s of computation", title)
    return float(found.group(1)) if found else 0.0


# The longest test files that are not notebooks, longest first (seconds on two cores, `bash run.sh test
# --durations=90`, November 2026): they start before the other `slow` files. Only the order depends on it.
LONGEST_TEST_FILES = (
    "tests/test_editions.py",  # 330 s: every learner notebook run to the end
    "tests/test_grading_attacks.py",  # 250 s: a class of 49 attackers graded in the sandbox
    "tests/test_browser.py",  # 200 s: JupyterLab in Chromium, one chapter after another
    "tests/test_classroom_class.py",  # 170 s: a class graded
)


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The test files in the order that lets two workers (pytest -n 2 --dist loadfile) end together: the
    notebooks under nbval first, longest first by their measured time, then the files with a `slow` test
    (notebooks re-run, subprocesses, a browser), then the many short unit tests, which fill in at the end.
    Collected in their own order (testpaths: tests, then notebooks/solutions) the notebooks came last, the
    longest of them, chapter 10 (over three minutes), among them. A file's tests keep their order."""
    first_index: dict[str, int] = {}
    rank: dict[str, tuple[int, float]] = {}
    for i, item in enumerate(items):
        name = item.nodeid.split("::")[0]
        first_index.setdefault(name, i)
        if name.endswith(".ipynb"):
            if name not in rank:  # read once per notebook, not once per cell
                rank[name] = (0, -_notebook_seconds(Path(str(item.fspath))))
        elif name in LONGEST_TEST_FILES:
            rank[name] = (1, float(LONGEST_TEST_FILES.index(name)))
        elif item.get_closest_marker("slow") is not None:
            rank[name] = (2, 0.0)
        else:
            rank.setdefault(name, (3, 0.0))
    order = {item: i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[int, float, int, int]:
        name = item.nodeid.split("::")[0]
        return (*rank[name], first_index[name], order[item])

    return sorted(items, key=key)
