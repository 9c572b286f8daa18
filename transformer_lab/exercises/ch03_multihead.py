"""Exercises of chapter 03 (multi-head attention), easy to harder.

1. `split_heads`: (B, L, D) -> (B, H, L, d_k).
2. `merge_heads`: (B, H, L, d_k) -> (B, L, D), the inverse.
3. `multi_head_attention`: the whole forward pass from given weights, equal to tl.MultiHeadAttention.

Used in notebooks/03_multi_head_attention.ipynb as
`from transformer_lab.exercises import ch03_multihead as exercises`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise

__all__ = ["split_heads", "merge_heads", "multi_head_attention"]


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- 1. split heads -------------------------------------------------------------------------


def _split_reference(x: Tensor, n_heads: int) -> Tensor:
    """Cut the last dimension D into H pieces of d_k, then move the heads before the positions."""
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    return x.view(batch, length, n_heads, d_k).transpose(1, 2)  # (B, L, H, d_k) -> (B, H, L, d_k)


def _split_view_only(x: Tensor, n_heads: int) -> Tensor:
    batch, length, d_model = x.shape
    return x.view(batch, n_heads, length, d_model // n_heads)  # right shape, features scrambled


def _split_no_transpose(x: Tensor, n_heads: int) -> Tensor:
    batch, length, d_model = x.shape
    return x.view(batch, length, n_heads, d_model // n_heads)  # (B, L, H, d_k)


def _split_wrong_transpose(x: Tensor, n_heads: int) -> Tensor:
    batch, length, d_model = x.shape
    return x.view(batch, length, d_model // n_heads, n_heads).permute(0, 3, 1, 2)  # strided heads


split_heads = Exercise(
    name="split_heads",
    reference=_split_reference,
    cases=[
        Case("B=1, L=2, D=4, H=2", lambda: (torch.arange(8.0).view(1, 2, 4), 2)),
        Case("B=2, L=3, D=6, H=3", lambda: (_randn(2, 3, 6, seed=40), 3)),
        Case("one head: only a new axis", lambda: (_randn(2, 4, 4, seed=41), 1)),
        Case("B=2, L=5, D=16, H=4", lambda: (_randn(2, 5, 16, seed=42), 4)),
    ],
    hints=[
        """
    Two steps: x.view(B, L, H, d_k) cuts each position's D features into H consecutive slices of
    d_k (head 0 gets features 0..d_k-1); then .transpose(1, 2) swaps L and H to give (B, H, L, d_k).
    A single x.view(B, H, L, d_k) has the right shape but mixes positions into heads.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_split_view_only, _split_no_transpose, _split_wrong_transpose],
)


# --- 2. merge heads -------------------------------------------------------------------------


def _merge_reference(x: Tensor) -> Tensor:
    """Undo split_heads: (B, H, L, d_k) -> (B, L, H, d_k) -> (B, L, H * d_k)."""
    batch, n_heads, length, d_k = x.shape
    return x.transpose(1, 2).contiguous().view(batch, length, n_heads * d_k)  # (B, L, D)


def _merge_view_only(x: Tensor) -> Tensor:
    batch, n_heads, length, d_k = x.shape
    return x.reshape(batch, length, n_heads * d_k)  # no transpose: heads and positions mixed


def _merge_no_contiguous(x: Tensor) -> Tensor:
    batch, n_heads, length, d_k = x.shape
    return x.transpose(1, 2).view(batch, length, n_heads * d_k)  # RuntimeError unless H == 1 or L == 1


def _merge_wrong_order(x: Tensor) -> Tensor:
    batch, n_heads, length, d_k = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, length, n_heads * d_k)  # interleaves the heads


merge_heads = Exercise(
    name="merge_heads",
    reference=_merge_reference,
    cases=[
        Case("B=1, H=2, L=2, d_k=2", lambda: (torch.arange(8.0).view(1, 2, 2, 2),)),
        Case("B=2, H=3, L=4, d_k=2", lambda: (_randn(2, 3, 4, 2, seed=50),)),
        Case("one head", lambda: (_randn(2, 1, 3, 4, seed=51),)),
        Case("B=2, H=4, L=5, d_k=3", lambda: (_randn(2, 4, 5, 3, seed=52),)),
    ],
    hints=[
        """
    Undo split_heads in reverse order: .transpose(1, 2) back to (B, L, H, d_k), then glue the last two
    dimensions with .view(B, L, H * d_k). view needs a contiguous tensor and transpose does not copy,
    so call .contiguous() in between (or use .reshape, which copies when it must).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_merge_view_only, _merge_no_contiguous, _merge_wrong_order],
)


# --- 3. the whole forward pass --------------------------------------------------------------


def _linear(x: Tensor, weights: dict[str, Tensor], name: str) -> Tensor:
    return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]  # nn.Linear: x W^T + b


def _mha_reference(
    query: Tensor, key: Tensor, value: Tensor, weights: dict[str, Tensor], n_heads: int, mask: Tensor | None = None
) -> Tensor:
    """Project, split into heads, attend in each head, merge, project: (B, T, D)."""
    batch, t, d_model = query.shape
    s = key.shape[1]
    d_k = d_model // n_heads
    # 1. projections (nn.Linear computes x @ W^T + b)
    q = query @ weights["w_q.weight"].T + weights["w_q.bias"]  # (B, T, D)
    k = key @ weights["w_k.weight"].T + weights["w_k.bias"]  # (B, S, D)
    v = value @ weights["w_v.weight"].T + weights["w_v.bias"]  # (B, S, D)
    # 2. split into heads
    q = q.view(batch, t, n_heads, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = k.view(batch, s, n_heads, d_k).transpose(1, 2)  # (B, H, S, d_k)
    v = v.view(batch, s, n_heads, d_k).transpose(1, 2)  # (B, H, S, d_k)
    # 3. scaled dot-product attention in every head at once
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # the mask broadcasts to (B, H, T, S)
    attn = torch.softmax(scores, dim=-1)
    if mask is not None:
        attn = attn.masked_fill(~mask, 0.0)  # fully masked rows: 0, not NaN
    heads = attn @ v  # (B, H, T, S) @ (B, H, S, d_k) -> (B, H, T, d_k)
    # 4. merge the heads and apply the output projection
    merged = heads.transpose(1, 2).contiguous().view(batch, t, d_model)  # (B, T, D)
    return merged @ weights["w_o.weight"].T + weights["w_o.bias"]  # (B, T, D)


def _mha_no_scale(query, key, value, weights, n_heads, mask=None):
    q = _split_reference(_linear(query, weights, "w_q"), n_heads)
    k = _split_reference(_linear(key, weights, "w_k"), n_heads)
    v = _split_reference(_linear(value, weights, "w_v"), n_heads)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return _linear(_merge_reference(torch.softmax(scores, -1).nan_to_num(0.0) @ v), weights, "w_o")


def _mha_one_head(query, key, value, weights, n_heads, mask=None):
    return _mha_reference(query, key, value, weights, 1, mask)  # forgot to split into heads


def _mha_no_output_projection(query, key, value, weights, n_heads, mask=None):
    identity = {"w_o.weight": torch.eye(query.shape[-1]), "w_o.bias": torch.zeros(query.shape[-1])}
    return _mha_reference(query, key, value, {**weights, **identity}, n_heads, mask)


def _mha_shared_projection(query, key, value, weights, n_heads, mask=None):
    shared = {f"{name}.{p}": weights[f"w_q.{p}"] for name in ("w_k", "w_v", "w_o") for p in ("weight", "bias")}
    return _mha_reference(query, key, value, {**weights, **shared}, n_heads, mask)  # [nn.Linear()] * 4


def _weights(d_model: int, seed: int) -> dict[str, Tensor]:
    """The state dict of a MultiHeadAttention(d_model, ...): uniform in +-1/sqrt(D), like nn.Linear's init."""
    generator = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(d_model)
    out = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        out[f"{name}.weight"] = (torch.rand(d_model, d_model, generator=generator) * 2 - 1) * bound  # (D_out, D_in)
        out[f"{name}.bias"] = (torch.rand(d_model, generator=generator) * 2 - 1) * bound  # (D,)
    return out


def _mha_case(b: int, t: int, s: int, d: int, h: int, seed: int, mask: Tensor | None = None):
    def inputs() -> tuple:
        x = _randn(b, t, d, seed=seed)
        memory = x if s == t else _randn(b, s, d, seed=seed + 1)
        return (x, memory, memory, _weights(d, seed + 2), h, None if mask is None else mask.clone())

    return inputs


def _run_mha(candidate, query, key, value, weights, n_heads, mask):
    if mask is None:
        return candidate(query, key, value, weights, n_heads)
    return candidate(query, key, value, weights, n_heads, mask)


multi_head_attention = Exercise(
    name="multi_head_attention",
    reference=_mha_reference,
    cases=[
        Case("self-attention, B=1, T=3, D=4, H=2", _mha_case(1, 3, 3, 4, 2, seed=60)),
        Case("cross-attention, T=2 queries, S=5 keys, D=8, H=4", _mha_case(2, 2, 5, 8, 4, seed=63)),
        Case(
            "a causal mask (T, T) broadcast over batch and heads",
            _mha_case(2, 4, 4, 6, 3, seed=66, mask=torch.ones(4, 4, dtype=torch.bool).tril()),
        ),
        Case(
            "a padding mask (B, 1, 1, S)",
            _mha_case(
                2, 3, 3, 8, 2, seed=69, mask=torch.tensor([[True, True, True], [True, False, False]])[:, None, None]
            ),
        ),
    ],
    hints=[
        """
    weights holds nn.Linear-style tensors: weights["w_q.weight"] is (D, D) and a Linear computes
    x @ W.T + b. Then: project Q, K, V; split each into heads (your split_heads); scaled dot-product
    attention in every head at once (the mask broadcasts over (B, H, T, S)); merge the heads (your
    merge_heads); and finish with the output projection w_o.
    """
    ],
    level="medium",
    kind="build",
    run=_run_mha,
    wrong=[_mha_no_scale, _mha_one_head, _mha_no_output_projection, _mha_shared_projection],
)
