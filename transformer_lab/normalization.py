"""Normalization: LayerNorm (层归一化) and BatchNorm (批归一化) for sequences (chapter 04).

LayerNorm normalizes each token's vector over its D features:
    y = (x - mean) / sqrt(var + eps) * gamma + beta,     mean, var over the last axis
BatchNorm normalizes each feature over every token of the batch (axes B and T).

Both use the *biased* variance (divide by D, or by the number of tokens), as
`torch.nn.LayerNorm` and `torch.nn.BatchNorm1d` do; notes 000 and 003 use `x.std(-1)`, which is
unbiased (divides by D - 1), and divide by `std + eps`: chapter 04 measures the difference.

Shape legend: B batch, T sequence length, D features (d_model).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    HALF_DTYPES,
    check_bool,
    check_float,
    check_last_dim,
    check_like_module,
    check_positive_int,
    check_tensor,
    is_trusted,
)

__all__ = ["LayerNorm", "BatchNorm", "layer_norm_statistics", "batch_norm_statistics"]


class LayerNorm(nn.Module):
    """Layer normalization over the last axis (chapter 04); a drop-in for `nn.LayerNorm(d_model)`.

    `weight` (gamma) and `bias` (beta) are per-feature vectors of size D, an element-wise
    affine map (note 001 calls them "two linear matrices"; they are not). The state dict has the
    same keys as `nn.LayerNorm`'s, so either loads into the other.

    `fused` (attribute, default False) picks the path: False computes the formula term by term (the
    teaching code); True calls PyTorch's fused `F.layer_norm` with the same parameters (the fast
    path, tested equal). `tl.record_attention(model, False)` sets it for every LayerNorm of a model.
    Either way the module is called as a module, so its forward hooks fire.

    In float16 and bfloat16 the mean and variance are computed in float32 and the result cast back
    (as `nn.LayerNorm` does): the squares of half-precision values overflow or lose their digits.

    Args:
        d_model: D, the size of the normalized last axis.
        eps: added to the variance.
        fused: start on the fast path.

    Shape:
        x (..., D) -> (..., D).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, fused: bool = False) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        _check_eps(eps)
        check_bool("fused", fused)
        self.d_model = d_model
        self.eps = float(eps)
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma, (D,)
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta, (D,)

    def forward(self, x: Tensor) -> Tensor:
        if not is_trusted():
            check_tensor("x", x, min_dim=1)
            check_float("x", x)
            check_last_dim("x", x, self.d_model)
            check_like_module("x", x, self)
        if self.fused:
            return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)
        h = x.float() if x.dtype in HALF_DTYPES else x  # statistics in float32 for half precision
        mean = h.mean(dim=-1, keepdim=True)  # (..., 1)
        var = h.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1), biased: divide by D
        x_hat = (h - mean) / torch.sqrt(var + self.eps)  # (..., D)
        return (x_hat * self.weight + self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class BatchNorm(nn.Module):
    """Batch normalization of (B, T, D) sequences, written out (chapter 04).

    In training mode each feature is normalized with the mean and biased variance over every
    token of the batch (axes B and T), and running estimates are updated
    (running = (1 - momentum) * running + momentum * batch, the running variance unbiased), as
    `nn.BatchNorm1d` does. In eval mode the running estimates are used. Buffers and parameters
    have `nn.BatchNorm1d`'s names, so its state dict loads into this one and back.

    Unlike `nn.BatchNorm1d`, `forward` takes an optional `mask` of real tokens: padded positions
    are then left out of the statistics (and their outputs are still computed, with the
    statistics of the real tokens).

    Args:
        num_features: D.
        eps: added to the variance.
        momentum: weight of the current batch in the running estimates.

    Shape:
        x (B, T, D); mask (B, T) bool, True for real tokens. Output (B, T, D).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        check_positive_int("num_features", num_features)
        _check_eps(eps)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be a float in [0, 1], got {momentum!r}")
        self.num_features = num_features
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.weight = nn.Parameter(torch.ones(num_features))  # gamma, (D,)
        self.bias = nn.Parameter(torch.zeros(num_features))  # beta, (D,)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        check_tensor("x", x, dim=3)
        check_float("x", x)
        check_last_dim("x", x, self.num_features, what="num_features")
        check_like_module("x", x, self, dtype=False)  # another float dtype is promoted, as in PyTorch
        if self.training:
            mean, var, count = _masked_feature_statistics(x, mask)  # (D,), (D,), number of tokens
            if count < 2:
                raise ValueError(
                    f"BatchNorm needs at least 2 real tokens in a training batch to estimate a variance, got {count} "
                    "(x's tokens, less those the mask marks as padding); use a larger batch, or eval mode"
                )
            with torch.no_grad():
                unbiased = var * count / (count - 1)
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
                self.num_batches_tracked.add_(1)
        else:
            if mask is not None:
                _check_token_mask(mask, x)
            mean, var = self.running_mean, self.running_var
        x_hat = (x - mean) / torch.sqrt(var + self.eps)  # (B, T, D)
        return x_hat * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


def _check_eps(eps: object) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a positive float, got {eps!r}")
    if not 0 < eps < math.inf:
        raise ValueError(f"eps must be a positive finite float (e.g. 1e-5), got {eps!r}")


def _check_token_mask(mask: object, x: Tensor) -> None:
    check_tensor("mask", mask, dim=2)
    assert isinstance(mask, Tensor)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = real token), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"mask must have shape (B, T) = {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"mask is on {mask.device} but x is on {x.device}; move it with mask.to(x.device)")


def _masked_feature_statistics(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, int]:
    """Per-feature mean and biased variance over the real tokens of a (B, T, D) batch.

    With no token to average over (an empty batch, or a mask of padding only) there is no statistic: a mean
    of nothing would be NaN, or 0 / 1 = 0 with the count clamped, a number that looks real. Both are refused.
    """
    if mask is None:
        flat = x.reshape(-1, x.shape[-1])  # (B*T, D)
        if flat.shape[0] == 0:
            raise ValueError(f"x holds no token (shape {tuple(x.shape)}): there is nothing to average over")
        return flat.mean(dim=0), flat.var(dim=0, unbiased=False), flat.shape[0]
    _check_token_mask(mask, x)
    weights = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
    count = int(mask.sum())
    if count == 0:
        raise ValueError(
            f"mask marks every position of x {tuple(x.shape)} as padding (it holds no True): there is no real token "
            "to average over; True = real token (tl.padding_mask(tokens, pad_id)[:, 0, 0, :] gives one)"
        )
    mean = (x * weights).sum(dim=(0, 1)) / count  # (D,)
    var = (((x - mean) ** 2) * weights).sum(dim=(0, 1)) / count  # (D,)
    return mean, var, count


def batch_norm_statistics(x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """What BatchNorm averages over: per-feature mean and biased variance over all tokens (chapter 04).

    Shape:
        x (B, T, D), mask (B, T) bool of real tokens or None. Returns two (D,) tensors.
    """
    check_tensor("x", x, dim=3)
    check_float("x", x)
    mean, var, _ = _masked_feature_statistics(x, mask)
    return mean, var


def layer_norm_statistics(x: Tensor) -> tuple[Tensor, Tensor]:
    """What LayerNorm averages over: per-token mean and biased variance over the features (chapter 04).

    Shape:
        x (..., D). Returns two (...) tensors, one number per token.
    """
    check_tensor("x", x, min_dim=1)
    check_float("x", x)
    if x.shape[-1] == 0:
        raise ValueError(f"x has no features (shape {tuple(x.shape)}): a token's mean over 0 features is undefined")
    return x.mean(dim=-1), x.var(dim=-1, unbiased=False)


def batch_norm_statistics_per_position(x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """BatchNorm "per time step": each position's own per-feature statistics over the batch (chapter 04).

    This is how BatchNorm was applied to RNNs unrolled in time (note 000's second and third
    drawbacks): position t is normalized with the mean and variance of the B vectors found at t.
    Chapter 04 uses it to show that positions have different statistics, that late positions
    are estimated from few real tokens, and that a position longer than any training sentence
    has no statistics at all.

    Args:
        x: a batch of token vectors.
        mask: which positions hold real tokens (True) rather than padding; None counts every position.

    Shape:
        x (B, T, D), mask (B, T) bool or None.

    Returns:
        mean (T, D), biased variance (T, D), and count (T,) int64, the number of real tokens at each
        position. Where a position has no real token, mean and variance are NaN.
    """
    check_tensor("x", x, dim=3)
    check_float("x", x)
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    _check_token_mask(mask, x)
    weights = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
    count = mask.sum(dim=0)  # (T,)
    total = count.to(x.dtype).unsqueeze(-1)  # (T, 1); 0 where no real token, giving NaN below
    mean = (x * weights).sum(dim=0) / total  # (T, D)
    var = (((x - mean) ** 2) * weights).sum(dim=0) / total  # (T, D), x - mean broadcasts (B, T, D)
    return mean, var, count


def batch_size_sweep(
    x: Tensor, mask: Tensor | None, batch_sizes: list[int] | tuple[int, ...], count_padding: bool = False
) -> dict[str, Tensor]:
    """Statistics of the first b sequences of a batch, for each b in `batch_sizes` (chapter 04).

    BatchNorm's per-feature statistics depend on which (and how many) sequences share the batch;
    LayerNorm's per-token statistics of sequence 0 do not. This returns both, so a notebook can
    measure how far each one moves.

    Args:
        x: a padded batch of token vectors.
        mask: real tokens (True) vs padding; None means no padding.
        batch_sizes: each b must be in [1, B].
        count_padding: if True, BatchNorm's statistics include padded positions, as
            `nn.BatchNorm1d` does; if False they use real tokens only, as `tl.BatchNorm(...)(x, mask)`.

    Shape:
        x (B, T, D), mask (B, T) bool or None.

    Returns:
        {"batch_norm_mean": (N, D), "batch_norm_var": (N, D), "layer_norm_mean": (N, T),
        "layer_norm_var": (N, T)} for N = len(batch_sizes); the layer-norm rows are sequence 0's tokens.
    """
    check_tensor("x", x, dim=3)
    check_float("x", x)
    if mask is not None:
        _check_token_mask(mask, x)
    sizes = list(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= x.shape[0] for b in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of ints in [1, {x.shape[0]}], got {batch_sizes!r}")
    out: dict[str, list[Tensor]] = {
        "batch_norm_mean": [],
        "batch_norm_var": [],
        "layer_norm_mean": [],
        "layer_norm_var": [],
    }
    for b in sizes:
        sub_mask = None if (mask is None or count_padding) else mask[:b]
        mean, var = batch_norm_statistics(x[:b], sub_mask)  # (D,), (D,)
        ln_mean, ln_var = layer_norm_statistics(x[:b][0])  # (T,), (T,): sequence 0 in a batch of b
        out["batch_norm_mean"].append(mean)
        out["batch_norm_var"].append(var)
        out["layer_norm_mean"].append(ln_mean)
        out["layer_norm_var"].append(ln_var)
    return {key: torch.stack(values) for key, values in out.items()}


__all__ += ["batch_norm_statistics_per_position", "batch_size_sweep"]
