"""Scaled dot-product attention, the core of the Transformer (chapter 01).

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V        (paper, equation 1)

Shape legend used in this module:
    ...  any leading batch dimensions (B, or B and H)
    T    number of queries (target length)
    S    number of keys and values (source length)
    d_k  size of each query and key vector
    d_v  size of each value vector
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lab._checks import HALF_DTYPES, check_float, check_mask, check_tensor

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: nn.Dropout | None = None,
) -> tuple[Tensor, Tensor]:
    """Attend from every query to every key and mix the values (chapter 01).

    This is the explicit, readable version: it forms the full matrix of weights so that a
    learner can look at it. `MultiHeadAttention` switches to PyTorch's fused kernel when the
    weights are not needed (see `record_weights` there); both are tested equal.

    Args:
        query: the questions, one vector per query position.
        key: the labels the queries are compared with.
        value: what is returned, mixed by the attention weights.
        mask: optional bool tensor broadcastable to (..., T, S); True means "this query may
            attend to this key". A query whose keys are all masked gets all-zero weights and
            a zero output (never NaN).
        dropout: optional `nn.Dropout` applied to the weights before they mix the values.

    In float16 and bfloat16 the scores, the softmax and the mixing are computed in float32 and the
    results cast back (as PyTorch's own attention does): Q K^T of half-precision vectors overflows
    float16's range (65504) long before the scaling by 1/sqrt(d_k) would bring it back.

    Shape:
        query (..., T, d_k), key (..., S, d_k), value (..., S, d_v), mask broadcastable to
        (..., T, S).

    Returns:
        (output, weights): output (..., T, d_v); weights (..., T, S), before dropout,
        each row summing to 1 over the keys it may see (or all zero if it may see none).
    """
    check_tensor("query", query, min_dim=2)
    check_tensor("key", key, min_dim=2)
    check_tensor("value", value, min_dim=2)
    check_float("query", query)
    if query.shape[-1] == 0:  # the scores would be 0 / sqrt(0) = NaN
        raise ValueError(f"query must have at least one feature (d_k >= 1), got shape {tuple(query.shape)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"key must have the same last dimension d_k as query: query has d_k={query.shape[-1]}, "
            f"key has {key.shape[-1]} (shapes {tuple(query.shape)} and {tuple(key.shape)})"
        )
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"value must have one vector per key: key has S={key.shape[-2]} positions, value has "
            f"{value.shape[-2]} (shapes {tuple(key.shape)} and {tuple(value.shape)})"
        )
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "query, key and value must have the same (or broadcastable) leading batch dimensions, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}"
        ) from None
    if dropout is not None and not isinstance(dropout, nn.Module):
        raise TypeError(f"dropout must be an nn.Dropout module or None, got {type(dropout).__name__}")
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != query.dtype:
            raise TypeError(
                f"{name} must have the dtype of query, got {tensor.dtype} and {query.dtype}; convert one to the other"
            )
        if tensor.device != query.device:
            raise ValueError(f"{name} is on {tensor.device} but query is on {query.device}; move it with .to()")
    if mask is not None:
        scores_shape = (*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]), query.shape[-2], key.shape[-2])
        check_mask("mask", mask, scores_shape, device=query.device)
    return attention(query, key, value, mask, dropout)


def attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """`scaled_dot_product_attention` without its input checks, for callers that have made them
    (`MultiHeadAttention`). Same arguments, shapes and results."""
    dtype = query.dtype
    if dtype in HALF_DTYPES:  # scores, softmax and mixing in float32, as PyTorch does
        query, key, value = query.float(), key.float(), value.float()
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, S)
    if mask is not None:
        # -inf gives exactly zero weight to masked keys after the softmax.
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    if mask is not None:
        # A row with every key masked is softmax(-inf, ..., -inf) = NaN; make it all zeros.
        weights = weights.masked_fill(~mask, 0.0)
    mixed = dropout(weights) if dropout is not None else weights
    output = mixed @ value  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)
    return output.to(dtype), weights.to(dtype)
