"""The warm-up exercise of chapter 00, to try the three-cell pattern before the real chapters.

`squared_lengths`: the squared length of every row vector, sum_j x_ij^2, which is the dot product
of a vector with itself (chapter 01 builds attention on dot products).

Used in notebooks/00_start_here.ipynb as `from transformer_lab.exercises import ch00_start as exercises`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise

__all__ = ["squared_lengths"]


def _squared_lengths_reference(x: Tensor) -> Tensor:
    """sum over the last dimension of x * x: (..., D) -> (...)."""
    return (x * x).sum(dim=-1)


def _sum_then_square(x: Tensor) -> Tensor:
    return x.sum(dim=-1) ** 2


def _wrong_dimension(x: Tensor) -> Tensor:
    return (x * x).sum(dim=0)


def _lengths_not_squared(x: Tensor) -> Tensor:
    return (x * x).sum(dim=-1).sqrt()


squared_lengths = Exercise(
    name="squared_lengths",
    reference=_squared_lengths_reference,
    cases=[
        Case("one vector (3, 4): 9 + 16 = 25", lambda: (torch.tensor([[3.0, 4.0]]),)),
        Case("three vectors of size 2", lambda: (torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.0, 0.0]]),)),
        Case(
            "a batch (2, 3, 4): one length per row",
            lambda: (torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)),),
        ),
    ],
    hint="""
    Multiply x by itself element by element (x * x), then add up along the LAST dimension:
    .sum(dim=-1). The result has one number per vector, so a (3, 2) input gives a (3,) output.
    """,
    wrong=[_sum_then_square, _wrong_dimension, _lengths_not_squared],
)
