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
