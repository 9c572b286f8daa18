"""Masks: which query may look at which key (chapter 02).

Convention of this library: a mask is a bool tensor and **True means "may attend"**, as in
`F.scaled_dot_product_attention`, the Annotated Transformer and nanoGPT's `tril`.
`nn.MultiheadAttention` and `nn.Transformer` use the opposite bool convention (True means
"blocked"), and note 001 adds a float matrix of 0 and -inf; `invert_mask` and
`to_additive_mask` convert to those.

Shape legend: B batch, H heads, T queries (target length), S keys (source length).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab._checks import as_device, check_positive_int, check_tensor

__all__ = [
    "causal_mask",
    "padding_mask",
    "target_mask",
    "invert_mask",
    "to_additive_mask",
    "from_additive_mask",
]


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """The causal ("look-ahead", 因果) mask of a decoder (chapter 02).

    Query i may attend to keys 0..i: True on and below the diagonal (`torch.tril`).

    Shape:
        (size, size), broadcastable to (B, H, T, T).
    """
    check_positive_int("size", size)
    if device is not None:
        device = as_device("device", device)
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()  # (T, T)


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """The padding mask of a batch of token ids (chapter 02): True where a token is real.

    Args:
        tokens: (B, S) integer token ids.
        pad_id: the id used for padding.

    Returns:
        (B, 1, 1, S) bool, True where `tokens != pad_id`; it broadcasts over heads and queries.
    """
    check_tensor("tokens", tokens, dim=2)
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor of token ids, got dtype {tokens.dtype}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"pad_id must be an int, got {pad_id!r}")
    return (tokens != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Padding and causal mask combined, for decoder self-attention (chapter 02).

    Returns:
        (B, 1, T, T) bool: query i may see key j when j <= i and token j is not padding.
    """
    keep = padding_mask(tokens, pad_id)  # (B, 1, 1, T)
    return keep & causal_mask(tokens.shape[1], device=tokens.device)  # (B, 1, T, T)


def invert_mask(mask: Tensor) -> Tensor:
    """Switch between the two bool conventions: True = "may attend" <-> True = "blocked".

    `nn.MultiheadAttention(attn_mask=..., key_padding_mask=...)` and `nn.Transformer` want
    True = blocked; this library and `F.scaled_dot_product_attention` want True = may attend.
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    return ~mask


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a bool mask (True = may attend) into a float mask to add to the scores.

    0 where attending is allowed, -inf where it is not (the convention of note 001 and of
    PyTorch's float masks).
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill(~mask, float("-inf"))


def from_additive_mask(mask: Tensor) -> Tensor:
    """Turn an additive float mask (0 = allowed, -inf or a large negative = blocked) into a
    bool mask with True = may attend."""
    check_tensor("mask", mask)
    if not mask.is_floating_point():
        raise TypeError(f"mask must be a floating-point additive mask, got dtype {mask.dtype}")
    return mask == 0
