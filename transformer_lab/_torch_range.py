"""The PyTorch releases the course works with, checked when `transformer_lab` is imported (this module's import).

pyproject.toml asks pip for the same range (tests/test_torch_range.py holds the two together), but a runtime can
have a PyTorch that pip never checked: a hosted notebook's own, or an install with --no-deps. There, one clear
sentence says what is wrong and how to fix it, instead of an AttributeError deep inside a chapter.
"""

from __future__ import annotations

import re
import warnings

__all__ = ["TORCH_MINIMUM", "TORCH_BELOW", "TORCH_REQUIREMENT", "check_torch"]

#: The first release with torch.optim.Muon, which chapter 11 checks its own Muon against (PyTorch 2.9.0).
TORCH_MINIMUM = (2, 9)
#: The next major release: not tested.
TORCH_BELOW = (3, 0)
TORCH_REQUIREMENT = f"torch>={TORCH_MINIMUM[0]}.{TORCH_MINIMUM[1]},<{TORCH_BELOW[0]}"


def _release(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ImportError(
            f"transformer_lab cannot read the version of PyTorch, {version!r}; it needs {TORCH_REQUIREMENT}."
        )
    return int(match.group(1)), int(match.group(2))


def check_torch(version: str | None = None) -> None:
    """Raise ImportError for a PyTorch older than the course needs; warn for one newer than it was tested with."""
    if version is None:
        import torch

        version = str(torch.__version__)
    release = _release(version)
    if release < TORCH_MINIMUM:
        raise ImportError(
            f"transformer_lab needs PyTorch {TORCH_MINIMUM[0]}.{TORCH_MINIMUM[1]} or newer (chapter 11 uses "
            f"torch.optim.Muon, new in 2.9), but this Python has torch {version}: install a supported one with "
            f'pip install "{TORCH_REQUIREMENT}" and restart the kernel.'
        )
    if release >= TORCH_BELOW:
        warnings.warn(
            f"transformer_lab was tested with {TORCH_REQUIREMENT}, and this Python has torch {version}: if a chapter "
            f'fails, install a tested one with pip install "{TORCH_REQUIREMENT}".',
            stacklevel=2,
        )


check_torch()
