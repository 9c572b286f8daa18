"""Exercises of chapter 02 (masks), easy to harder.

1. `build_causal_mask`: the (T, T) look-ahead mask, True on and below the diagonal.
2. `build_padding_mask`: the (B, 1, 1, S) mask of real (non-padding) tokens.
3. `build_decoder_mask`: both combined into the (B, 1, T, T) mask of decoder self-attention.
4. `to_additive`: a bool mask (True = may attend) as the float 0 / -inf matrix of note 001.

The library's convention throughout: bool, True means "may attend".
Used in notebooks/02_masking.ipynb as `from transformer_lab.exercises import ch02_masking as exercises`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise

__all__ = ["build_causal_mask", "build_padding_mask", "build_decoder_mask", "to_additive"]

PAD = 0


def _tokens(*rows: list[int]) -> Tensor:
    return torch.tensor(rows, dtype=torch.long)


# --- 1. causal mask -------------------------------------------------------------------------


def _causal_reference(size: int) -> Tensor:
    """Query i may see keys 0..i: True on and below the diagonal."""
    return torch.ones(size, size, dtype=torch.bool).tril()  # (T, T)


def _causal_triu(size: int) -> Tensor:
    return torch.ones(size, size, dtype=torch.bool).triu()  # the future instead of the past


def _causal_strict(size: int) -> Tensor:
    return torch.ones(size, size, dtype=torch.bool).tril(diagonal=-1)  # a token may not see itself


def _causal_float(size: int) -> Tensor:
    return torch.ones(size, size).tril()  # 1.0/0.0 floats, not bools


build_causal_mask = Exercise(
    name="build_causal_mask",
    reference=_causal_reference,
    cases=[
        Case("size 1: a single token sees itself", lambda: (1,)),
        Case("size 3", lambda: (3,)),
        Case("size 6", lambda: (6,)),
    ],
    hints=[
        """
    Start from torch.ones(size, size, dtype=torch.bool) and keep the lower triangle with .tril():
    row i (the query) has True in columns 0..i (the keys it may see), diagonal included.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_causal_triu, _causal_strict, _causal_float],
)


# --- 2. padding mask ------------------------------------------------------------------------


def _padding_reference(tokens: Tensor, pad_id: int) -> Tensor:
    """True where a token is real; (B, S) -> (B, 1, 1, S) to broadcast over heads and queries."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def _padding_flat(tokens: Tensor, pad_id: int) -> Tensor:
    return tokens != pad_id  # (B, S): does not broadcast against (B, H, T, S)


def _padding_inverted(tokens: Tensor, pad_id: int) -> Tensor:
    return (tokens == pad_id)[:, None, None, :]  # PyTorch's key_padding_mask convention


def _padding_on_queries(tokens: Tensor, pad_id: int) -> Tensor:
    return (tokens != pad_id)[:, None, :, None]  # (B, 1, S, 1): masks queries, not keys


build_padding_mask = Exercise(
    name="build_padding_mask",
    reference=_padding_reference,
    cases=[
        Case("one sequence without padding", lambda: (_tokens([5, 6, 7]), PAD)),
        Case("two sequences, the second padded", lambda: (_tokens([5, 6, 7, 8], [9, 4, PAD, PAD]), PAD)),
        Case("pad_id=1 and a token id 0 that is real", lambda: (_tokens([0, 3, 1], [2, 1, 1]), 1)),
    ],
    hints=[
        """
    (tokens != pad_id) gives a (B, S) bool tensor. Insert two size-1 dimensions for the heads and
    the queries, e.g. with [:, None, None, :] or .unsqueeze(1).unsqueeze(2), to get (B, 1, 1, S).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_padding_flat, _padding_inverted, _padding_on_queries],
)


# --- 3. padding and causal combined ---------------------------------------------------------


def _decoder_reference(tokens: Tensor, pad_id: int) -> Tensor:
    """Query i may see key j when j <= i AND token j is not padding: (B, 1, T, T)."""
    keep = (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, T)
    size = tokens.shape[1]
    causal = torch.ones(size, size, dtype=torch.bool).tril()  # (T, T)
    return keep & causal  # broadcast: (B, 1, 1, T) & (T, T) -> (B, 1, T, T)


def _decoder_or(tokens: Tensor, pad_id: int) -> Tensor:
    size = tokens.shape[1]
    return (tokens != pad_id)[:, None, None, :] | torch.ones(size, size, dtype=torch.bool).tril()


def _decoder_causal_only(tokens: Tensor, pad_id: int) -> Tensor:
    size = tokens.shape[1]
    return torch.ones(size, size, dtype=torch.bool).tril().expand(tokens.shape[0], 1, size, size)


def _decoder_pad_queries(tokens: Tensor, pad_id: int) -> Tensor:
    size = tokens.shape[1]
    return (tokens != pad_id)[:, None, :, None] & torch.ones(size, size, dtype=torch.bool).tril()


build_decoder_mask = Exercise(
    name="build_decoder_mask",
    reference=_decoder_reference,
    cases=[
        Case("no padding: the causal mask for each sequence", lambda: (_tokens([3, 4, 5]), PAD)),
        Case("the second sequence padded", lambda: (_tokens([3, 4, 5, 6], [7, 8, PAD, PAD]), PAD)),
        Case("three sequences, pad_id=2", lambda: (_tokens([5, 2, 2], [5, 6, 2], [5, 6, 7]), 2)),
    ],
    hints=[
        """
    Build the two masks you already have, a padding mask (B, 1, 1, T) and a causal mask (T, T),
    and keep a position only if BOTH allow it: `&`. Broadcasting does the rest: (B, 1, 1, T) & (T, T)
    -> (B, 1, T, T).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_decoder_or, _decoder_causal_only, _decoder_pad_queries],
)


# --- 4. bool to additive --------------------------------------------------------------------


def _additive_reference(mask: Tensor) -> Tensor:
    """0.0 where attending is allowed, -inf where it is not (float32)."""
    return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))


def _additive_big_negative(mask: Tensor) -> Tensor:
    return torch.zeros(mask.shape).masked_fill(~mask, -1e9)


def _additive_inverted(mask: Tensor) -> Tensor:
    return torch.zeros(mask.shape).masked_fill(mask, float("-inf"))


def _additive_in_place(mask: Tensor) -> Tensor:
    out = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    mask.fill_(True)  # changes the caller's mask
    return out


to_additive = Exercise(
    name="to_additive",
    reference=_additive_reference,
    cases=[
        Case("a causal (3, 3) mask", lambda: (torch.ones(3, 3, dtype=torch.bool).tril(),)),
        Case(
            "a padding mask (2, 1, 1, 4)",
            lambda: (torch.tensor([[True, True, False, False], [True, True, True, True]])[:, None, None, :],),
        ),
        Case("everything allowed", lambda: (torch.ones(2, 2, dtype=torch.bool),)),
    ],
    hints=[
        """
    Start from torch.zeros(mask.shape) (float32) and write float("-inf") where the mask is False:
    .masked_fill(~mask, float("-inf")). Adding this to the scores leaves allowed scores unchanged.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_additive_big_negative, _additive_inverted, _additive_in_place],
)
