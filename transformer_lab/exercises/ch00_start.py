"""The warm-up exercise of chapter 00, to try the three-cell pattern before the real chapters.

`squared_lengths`: the squared length of every row vector, sum_j x_ij^2, which is the dot product
of a vector with itself (chapter 01 builds attention on dot products).

Used in notebooks/00_start_here.ipynb as `from transformer_lab.exercises import ch00_start as exercises`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise, Mistake

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


def _squares_not_added(x: Tensor) -> Tensor:
    return x * x  # (..., D): one square per entry, not one sum per vector


def _one_total(x: Tensor) -> Tensor:
    return (x * x).sum()  # (): every vector's entries added together


def _kept_dimension(x: Tensor) -> Tensor:
    return (x * x).sum(dim=-1, keepdim=True)  # (..., 1): the summed dimension kept


def _all_pairs(x: Tensor) -> Tensor:
    return x @ x.transpose(-1, -2)  # (..., N, N): every vector against every vector, not each with itself


def _norm_squared(x: Tensor) -> Tensor:  # the finished version: gets no credit
    return torch.linalg.vector_norm(x, dim=-1) ** 2


def _norm_method(x: Tensor) -> Tensor:
    return x.norm(dim=-1).pow(2)


squared_lengths = Exercise(
    name="squared_lengths",
    reference=_squared_lengths_reference,
    cases=[
        Case("one vector (3, 4): 9 + 16 = 25", lambda: (torch.tensor([[3.0, 4.0]]),)),
        Case(
            "three vectors of size 2",
            lambda: (torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.0, 0.0]]),),
            hidden="scale",  # the zero vector stays zero in a graded class's hidden case
        ),
        Case(
            "a batch (2, 3, 4): one length per row",
            lambda: (torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)),),
        ),
    ],
    hints=[
        """
        The squared length of a vector is the sum of its entries squared: for (3, 4) it is 9 + 16.
        Which dimension of x holds the entries of one vector?
        """,
        """
        Square every entry first (x * x squares element by element), then add up along the LAST
        dimension, the one that holds a vector's entries.
        """,
        """
        (x * x) has the shape of x; a sum over dim=-1 leaves one number per vector, so a (3, 2)
        input gives a (3,) output. Combine the two steps into one expression.
        """,
    ],
    level="easy",
    kind="build",
    mistakes=[
        Mistake(
            _sum_then_square,
            "the entries were added up before squaring: (3 + 4)^2 = 49 has cross terms (2 * 3 * 4) that a "
            "squared length does not have.",
        ),
        Mistake(
            _wrong_dimension,
            "the sum ran over the first dimension, across the vectors, instead of along each vector: it added "
            "up entry 0 of every vector, then entry 1, and so on.",
        ),
        Mistake(
            _lengths_not_squared,
            "that is each vector's length, not its squared length: the square root undoes the squaring.",
        ),
        Mistake(
            _squares_not_added,
            "each entry was squared, but the squares of a vector were not added up: the output still has one "
            "number per entry, not one per vector.",
        ),
        Mistake(
            _one_total,
            "the sum ran over the whole tensor: one number for all the vectors together, not one per vector.",
        ),
        Mistake(
            _kept_dimension,
            "the output keeps a last dimension of size 1, (..., 1), where one number per vector, (...), is asked "
            "for: the summed dimension must go.",
        ),
        Mistake(
            _all_pairs,
            "that is the dot product of every vector with every other vector, a table with one row and one column "
            "per vector. A squared length is the dot product of a vector with itself only: one number per vector.",
        ),
    ],
    forbidden=["vector_norm", "norm", "linalg_vector_norm"],
    shortcuts=[_norm_squared, _norm_method],
)
