"""Input checks shared by the modules: clear errors that name the argument and what was expected."""

from __future__ import annotations

import torch
from torch import Tensor


def check_tensor(name: str, value: object, *, min_dim: int | None = None, dim: int | None = None) -> None:
    """Raise TypeError unless `value` is a tensor, ValueError unless its rank is as expected."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(value.shape)}")
    if min_dim is not None and value.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(value.shape)}")


def check_float(name: str, value: Tensor) -> None:
    """Raise TypeError unless `value` is a floating-point tensor (e.g. not token ids)."""
    if not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (embedded vectors), got dtype {value.dtype}; "
            "token ids go through an embedding first"
        )


def check_last_dim(name: str, value: Tensor, size: int, what: str = "d_model") -> None:
    """Raise ValueError unless the last dimension of `value` is `size`."""
    if value.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {what}={size}, got shape {tuple(value.shape)}")


def check_positive_int(name: str, value: object) -> None:
    """Raise TypeError/ValueError unless `value` is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")


def check_bool(name: str, value: object) -> None:
    """Raise TypeError unless `value` is True or False (a string like "no" would be silently truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_probability(name: str, value: object) -> None:
    """Raise TypeError/ValueError unless `value` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def check_mask(name: str, mask: object, target_shape: torch.Size | tuple[int, ...]) -> None:
    """Raise unless `mask` is a bool tensor broadcastable to `target_shape`.

    The library's convention is True = "may attend". A float mask (PyTorch's additive
    convention) or an int mask is refused rather than silently misread.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor where True means 'may attend', got dtype {mask.dtype}; "
            "convert an additive float mask with `mask == 0`, or a PyTorch-style bool mask "
            "(True = blocked) with tl.invert_mask"
        )
    target = tuple(target_shape)
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), target)
    except RuntimeError:
        broadcast = None
    if broadcast != target:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} cannot be broadcast to the attention scores' shape "
            f"{target} (batch..., T queries, S keys); a padding mask is (B, 1, 1, S), a causal mask (T, T)"
        )


def check_tokens(name: str, tokens: object, vocab_size: int) -> None:
    """Raise unless `tokens` is a 2-D integer tensor of ids in [0, vocab_size)."""
    check_tensor(name, tokens)
    assert isinstance(tokens, Tensor)
    if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len), got shape {tuple(tokens.shape)}")
    if tokens.numel() > 0:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size})")
