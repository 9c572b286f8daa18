"""Exercises of chapter 01 (scaled dot-product attention), easy to harder.

1. `softmax_rows`: a numerically stable softmax over the last dimension.
2. `scaled_scores`: the similarity scores Q K^T / sqrt(d_k).
3. `attention`: the whole of equation (1), with an optional mask (True = may attend).

Used in notebooks/01_attention.ipynb as `from transformer_lab.exercises import ch01_attention as exercises`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises.core import Case, Exercise

__all__ = ["softmax_rows", "scaled_scores", "attention"]


def _randn(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


# --- 1. softmax over rows -------------------------------------------------------------------


def _softmax_rows_reference(scores: Tensor) -> Tensor:
    """softmax(x)_j = exp(x_j - max x) / sum_k exp(x_k - max x), over the last dimension."""
    shifted = scores - scores.max(dim=-1, keepdim=True).values  # the largest entry becomes 0: no overflow
    exps = shifted.exp()
    return exps / exps.sum(dim=-1, keepdim=True)


def _softmax_naive(scores: Tensor) -> Tensor:
    exps = scores.exp()  # overflows to inf for scores above ~88 (float32)
    return exps / exps.sum(dim=-1, keepdim=True)


def _softmax_wrong_dim(scores: Tensor) -> Tensor:
    return torch.softmax(scores, dim=0)


def _softmax_unnormalised(scores: Tensor) -> Tensor:
    return (scores - scores.max(dim=-1, keepdim=True).values).exp()


softmax_rows = Exercise(
    name="softmax_rows",
    reference=_softmax_rows_reference,
    cases=[
        Case("one row of three scores", lambda: (torch.tensor([[1.0, 2.0, 3.0]]),)),
        Case("a (4, 5) matrix: each row on its own", lambda: (_randn(4, 5, seed=1),)),
        Case("a batch (2, 3, 4): the last dimension only", lambda: (_randn(2, 3, 4, seed=2),)),
        Case("equal scores give equal weights", lambda: (torch.full((2, 4), 7.0),)),
        Case("large scores (up to 1000): subtract the row maximum first", lambda: (_randn(3, 6, seed=3) * 1000.0,)),
    ],
    hints=[
        """
    Work over dim=-1 and keep that dimension (keepdim=True) so the shapes broadcast.
    exp() of a large number overflows to inf, and inf / inf is NaN: subtract each row's maximum
    first. softmax(x) == softmax(x - c) for any constant c, so the answer does not change.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_softmax_naive, _softmax_wrong_dim, _softmax_unnormalised],
)


# --- 2. scaled scores -----------------------------------------------------------------------


def _scaled_scores_reference(query: Tensor, key: Tensor) -> Tensor:
    """Q K^T / sqrt(d_k): one score for every (query, key) pair."""
    d_k = query.shape[-1]
    return query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, d_k) @ (..., d_k, S) -> (..., T, S)


def _scores_unscaled(query: Tensor, key: Tensor) -> Tensor:
    return query @ key.transpose(-2, -1)


def _scores_divided_by_d_k(query: Tensor, key: Tensor) -> Tensor:
    return query @ key.transpose(-2, -1) / query.shape[-1]


def _scores_key_t(query: Tensor, key: Tensor) -> Tensor:
    return query @ key.transpose(0, 1) / math.sqrt(query.shape[-1])  # swaps the wrong pair in a batch


scaled_scores = Exercise(
    name="scaled_scores",
    reference=_scaled_scores_reference,
    cases=[
        Case("T=2 queries, S=3 keys, d_k=4", lambda: (_randn(2, 4, seed=10), _randn(3, 4, seed=11))),
        Case("T=S=5, d_k=16", lambda: (_randn(5, 16, seed=12), _randn(5, 16, seed=13))),
        Case("a batch (2, 3, 8) x (2, 4, 8)", lambda: (_randn(2, 3, 8, seed=14), _randn(2, 4, 8, seed=15))),
        Case("batch and heads (2, 2, 3, 4)", lambda: (_randn(2, 2, 3, 4, seed=16), _randn(2, 2, 3, 4, seed=17))),
    ],
    hints=[
        """
    Swap the LAST two dimensions of key with key.transpose(-2, -1) (key.transpose(0, 1) or key.T only
    work for a single matrix, not for a batch), multiply with @, and divide by math.sqrt(d_k) where
    d_k is query.shape[-1].
    """
    ],
    level="medium",
    kind="build",
    wrong=[_scores_unscaled, _scores_divided_by_d_k, _scores_key_t],
)


# --- 3. attention with a mask ---------------------------------------------------------------


def _attention_reference(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V; returns (output, weights)."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # masked keys get weight exactly 0
    weights = torch.softmax(scores, dim=-1)  # (..., T, S), rows sum to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a fully masked row: NaN -> 0
    return weights @ value, weights  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)


def _attention_no_scale(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ value, weights


def _attention_ignores_mask(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    return weights @ value, weights


def _attention_nan_rows(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # a fully masked row becomes NaN
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_inverted_mask(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    return scaled_dot_product_attention(query, key, value, None if mask is None else ~mask)


def _causal(t: int) -> Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def _half_blind(t: int, s: int) -> Tensor:
    mask = torch.ones(t, s, dtype=torch.bool)
    mask[0] = False  # the first query may see no key at all
    return mask


attention = Exercise(
    name="attention",
    reference=_attention_reference,
    cases=[
        Case(
            "no mask, T=3, S=4, d_k=d_v=2",
            lambda: (_randn(3, 2, seed=20), _randn(4, 2, seed=21), _randn(4, 2, seed=22)),
        ),
        Case(
            "a batch, d_v=5 different from d_k=8",
            lambda: (_randn(2, 3, 8, seed=23), _randn(2, 6, 8, seed=24), _randn(2, 6, 5, seed=25)),
        ),
        Case(
            "a causal mask (4, 4)",
            lambda: (_randn(4, 4, seed=26), _randn(4, 4, seed=27), _randn(4, 4, seed=28), _causal(4)),
        ),
        Case(
            "a padding mask (2, 1, 5) broadcast over the queries",
            lambda: (
                _randn(2, 3, 4, seed=29),
                _randn(2, 5, 4, seed=30),
                _randn(2, 5, 4, seed=31),
                torch.tensor([[[True, True, True, False, False]], [[True, True, True, True, True]]]),
            ),
        ),
        Case(
            "a query that may see no key: weights and output all zero, not NaN",
            lambda: (_randn(3, 4, seed=32), _randn(5, 4, seed=33), _randn(5, 4, seed=34), _half_blind(3, 5)),
        ),
    ],
    hints=[
        """
    1. scores = Q K^T / sqrt(d_k)                      (your scaled_scores)
    2. where mask is False, put -inf: scores.masked_fill(~mask, float("-inf"))
    3. weights = softmax over the keys (dim=-1)
    4. a row whose keys are ALL masked is softmax(-inf, ..., -inf) = NaN: set the masked
       weights to 0 afterwards, e.g. weights.masked_fill(~mask, 0.0)
    5. return (weights @ value, weights)
    """
    ],
    level="medium",
    kind="build",
    wrong=[_attention_no_scale, _attention_ignores_mask, _attention_nan_rows, _attention_inverted_mask],
)
