"""Exercises of chapter 04 (normalization): LayerNorm from scratch, BatchNorm's statistics over a
padded batch, and BatchNorm's running statistics.

Shape legend: B batch, T sequence length, D features.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise

__all__ = ["layer_norm", "masked_feature_statistics", "update_running_statistics"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- 1. LayerNorm from scratch -------------------------------------------------------------------


def _layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalize each vector over its last axis, then scale by gamma and shift by beta."""
    mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = x.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1): divide by D, not D - 1
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta  # (..., D)


def _ln_inputs(shape: tuple[int, ...], seed: int, offset: float = 0.0) -> tuple[Tensor, Tensor, Tensor, float]:
    g = _generator(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g) * 3.0 + offset
    return x, 1.0 + 0.5 * torch.randn(d, generator=g), 0.5 * torch.randn(d, generator=g), 1e-5


def _ln_notes(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    # notes 000/003: unbiased std, and eps added to the std
    return gamma * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + beta


def _ln_wrong_axis(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(dim=0, keepdim=True)
    var = x.var(dim=0, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _ln_no_affine(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(dim=-1, keepdim=True, unbiased=False) + eps)


layer_norm = Exercise(
    name="layer_norm",
    reference=_layer_norm,
    cases=[
        Case("a (2, 3, 8) batch with random gamma and beta", lambda: _ln_inputs((2, 3, 8), 0)),
        Case("a single vector of shape (16,)", lambda: _ln_inputs((16,), 1)),
        Case("a small width d_model = 4 (where N and N - 1 differ most)", lambda: _ln_inputs((3, 4), 2)),
        Case("vectors far from zero (mean 1000)", lambda: _ln_inputs((2, 5, 8), 3, offset=1000.0), atol=1e-3),
        Case(
            "a constant vector (variance 0): the output is beta",
            lambda: (torch.full((2, 6), 7.0), torch.ones(6), torch.arange(6.0), 1e-5),
        ),
    ],
    hints=[
        """
        Take the mean and the variance over the last axis (dim=-1) with keepdim=True so they broadcast.
        Use the biased variance, x.var(dim=-1, unbiased=False) (divide by D, as nn.LayerNorm), and divide
        by sqrt(var + eps), not by std + eps. Then multiply by gamma and add beta: both are (D,) vectors.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_ln_notes, _ln_wrong_axis, _ln_no_affine],
)


# --- 2. BatchNorm's statistics over the real tokens of a padded batch ---------------------------


def _masked_feature_statistics(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-feature mean and biased variance over the real tokens (mask True) of a (B, T, D) batch."""
    real = x[mask]  # (N, D): the N real tokens, padding dropped
    mean = real.mean(dim=0)  # (D,)
    var = ((real - mean) ** 2).mean(dim=0)  # (D,), biased: divide by N
    return mean, var


def _padded_batch(lengths: list[int], t: int, d: int, seed: int, pad_value: float = 50.0) -> tuple[Tensor, Tensor]:
    g = _generator(seed)
    x = torch.randn(len(lengths), t, d, generator=g) + torch.linspace(-1, 1, d)
    mask = torch.arange(t) < torch.tensor(lengths).unsqueeze(1)  # (B, T)
    x = x.masked_fill(~mask.unsqueeze(-1), pad_value)  # padded vectors far from the rest
    return x, mask


def _stats_counting_padding(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    flat = x.reshape(-1, x.shape[-1])
    return flat.mean(dim=0), flat.var(dim=0, unbiased=False)


def _stats_unbiased(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    real = x[mask]
    return real.mean(dim=0), real.var(dim=0, unbiased=True)


def _stats_per_token(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    real = x[mask]
    return real.mean(dim=-1), real.var(dim=-1, unbiased=False)


masked_feature_statistics = Exercise(
    name="masked_feature_statistics",
    reference=_masked_feature_statistics,
    cases=[
        Case("a batch without padding", lambda: _padded_batch([4, 4, 4], 4, 5, 0)),
        Case("a padded batch (padding holds 50.0)", lambda: _padded_batch([5, 2, 3], 5, 6, 1)),
        Case("one long sequence and much padding", lambda: _padded_batch([6, 1, 1, 1], 6, 3, 2)),
        Case("a batch of one sequence", lambda: _padded_batch([3], 5, 4, 3)),
    ],
    hints=[
        """
        BatchNorm gives one mean and one variance per feature (shape (D,)), over every real token of the
        batch. Boolean indexing x[mask] keeps the real tokens as an (N, D) matrix; then average over
        dim 0. Use the biased variance (divide by N), and don't let the padded vectors in.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_stats_counting_padding, _stats_unbiased, _stats_per_token],
)


# --- 3. Running statistics (what eval mode uses) ------------------------------------------------


def _update_running_statistics(
    x: Tensor, mask: Tensor, running_mean: Tensor, running_var: Tensor, momentum: float
) -> tuple[Tensor, Tensor]:
    """One training step's update of BatchNorm's running mean and variance, as nn.BatchNorm1d does it.

    running = (1 - momentum) * running + momentum * batch statistic; the variance stored is the
    unbiased one (divide by N - 1) over the N real tokens. Returns new tensors.
    """
    real = x[mask]  # (N, D)
    n = real.shape[0]
    mean = real.mean(dim=0)  # (D,)
    unbiased_var = ((real - mean) ** 2).sum(dim=0) / (n - 1)  # (D,)
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * unbiased_var
    return new_mean, new_var


def _running_inputs(lengths: list[int], momentum: float, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    x, mask = _padded_batch(lengths, max(lengths), 4, seed)
    g = _generator(seed + 100)
    return x, mask, torch.randn(4, generator=g), torch.rand(4, generator=g) + 0.5, momentum


def _running_biased(x, mask, running_mean, running_var, momentum):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0, unbiased=False)
    return (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * var


def _running_swapped(x, mask, running_mean, running_var, momentum):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0)
    return momentum * running_mean + (1 - momentum) * mean, momentum * running_var + (1 - momentum) * var


def _running_in_place(x, mask, running_mean, running_var, momentum):  # noqa: ANN001, ANN202
    real = x[mask]
    running_mean.mul_(1 - momentum).add_(momentum * real.mean(0))
    running_var.mul_(1 - momentum).add_(momentum * real.var(0))
    return running_mean, running_var


update_running_statistics = Exercise(
    name="update_running_statistics",
    reference=_update_running_statistics,
    cases=[
        Case("momentum 0.1 (PyTorch's default) on a padded batch", lambda: _running_inputs([4, 2, 3], 0.1, 0)),
        Case("momentum 0.5", lambda: _running_inputs([5, 5], 0.5, 1)),
        Case("momentum 1.0: the running values become the batch's", lambda: _running_inputs([3, 1, 2], 1.0, 2)),
        Case("momentum 0.0: nothing changes", lambda: _running_inputs([2, 2], 0.0, 3)),
    ],
    hints=[
        """
        Take the real tokens (x[mask], an (N, D) matrix), their per-feature mean, and their UNBIASED
        variance (divide by N - 1: that is what nn.BatchNorm1d stores). Then blend:
        new = (1 - momentum) * old + momentum * batch value. Return new tensors; don't change the inputs
        in place.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_running_biased, _running_swapped, _running_in_place],
)
