"""Where the course's optional GPU cells run (chapter 00 shows it).

`pick_device()` chooses a CUDA GPU, then Apple's GPU (`mps`), then the CPU. Only the cells tagged `requires-cuda`
use it (chapters 00, 08 and 09); every other cell stays on the CPU, so that a chapter's stored outputs are the same
on every machine. PyTorch has not written every operation for Apple's GPU: `mps_gaps(device)` turns such a failure
into one printed sentence, in the course's language, instead of an error that stops the notebook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from transformer_lab import i18n

__all__ = ["pick_device", "mps_gaps"]


def pick_device() -> torch.device:
    """The fastest device this machine offers: `cuda` if PyTorch sees an NVIDIA GPU, else `mps` on Apple silicon,
    else `cpu`."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _missing_on_mps(error: BaseException) -> bool:
    """True for the errors PyTorch raises where Apple's GPU lacks what a cell asks for: an operator it has not
    written for mps (NotImplementedError), or float64, which the mps framework does not have (TypeError)."""
    if isinstance(error, NotImplementedError):
        return True
    return isinstance(error, TypeError) and "MPS" in str(error)


@contextlib.contextmanager
def mps_gaps(device: torch.device | str) -> Iterator[None]:
    """Run the block; where `device` is Apple's GPU and PyTorch lacks an operation there, print why in one
    sentence and go on. On any other device, or for any other error, the error stands.

        with tl.mps_gaps(gpu):
            ...  # the cell's work on `gpu`
    """
    try:
        yield
    except (NotImplementedError, TypeError) as error:
        if torch.device(device).type != "mps" or not _missing_on_mps(error):
            raise
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        print(i18n.message("device.mps_missing", reason=reason))
