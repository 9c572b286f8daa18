"""pytest configuration shared by the unit tests and the notebooks run under nbval."""

from __future__ import annotations

import os

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


# Each long test file's time on one worker (seconds, `bash run.sh test --durations=90` on the course's 2-core machine,
# November 2026; a notebook's is its cells under nbval). Only the order of the files depends on these.
MEASURED_SECONDS = {
    "tests/test_editions.py": 335,  # every learner notebook run to the end in quick mode
    "tests/test_grading_attacks.py": 250,  # a class of 49 attackers graded in the sandbox
    "notebooks/solutions/10_gpt.ipynb": 225,
    "tests/test_browser.py": 180,  # JupyterLab in Chromium, one chapter after another
    "tests/test_site.py": 170,  # the website built and read in Chromium
    "tests/test_classroom_class.py": 165,  # a class graded
    "notebooks/solutions/09_full_model.ipynb": 160,
    "tests/test_classroom.py": 90,  # every chapter's source edition graded
    "notebooks/solutions/11_modern_decoder.ipynb": 85,
    "tests/test_classroom_zh.py": 70,
    "notebooks/solutions/05_feed_forward_and_residuals.ipynb": 60,
    "tests/test_distributed.py": 50,
    "tests/test_exercises.py": 50,
    "notebooks/solutions/12_tokens.ipynb": 35,
}


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The test files in the order that lets the workers (pytest -n N --dist loadfile --no-loadscope-reorder) end
    together: the files measured longest first (`MEASURED_SECONDS`), then the other files with a `slow` test
    (notebooks under nbval, re-runs, subprocesses, a browser), then the many short unit tests, which fill in at the
    end. (Without --no-loadscope-reorder pytest-xdist sends the files with the most tests first, whatever their
    time: the chapters' notebooks then came in the middle and the run ended on one worker.) A file's tests keep
    their order."""
    first_index: dict[str, int] = {}
    rank: dict[str, tuple[int, float]] = {}
    for i, item in enumerate(items):
        name = item.nodeid.split("::")[0]
        first_index.setdefault(name, i)
        if name in MEASURED_SECONDS:
            rank[name] = (0, -float(MEASURED_SECONDS[name]))
        elif name.endswith(".ipynb") or item.get_closest_marker("slow") is not None:
            rank[name] = (1, 0.0)
        else:
            rank.setdefault(name, (2, 0.0))
    order = {item: i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[int, float, int, int]:
        name = item.nodeid.split("::")[0]
        return (*rank[name], first_index[name], order[item])

    return sorted(items, key=key)
