"""pytest configuration shared by the unit tests and the notebooks run under nbval."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Report notebook cells tagged `requires-cuda` as skipped where no GPU is present.

    Those cells are optional (NOTEBOOKS.md): they guard themselves with
    `torch.cuda.is_available()` and nothing later depends on them, so skipping them is safe.
    """
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="requires-cuda cell: no CUDA GPU on this machine")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "requires-cuda" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(skip)
