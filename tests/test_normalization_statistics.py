"""Tests of chapter 04's statistics helpers in normalization.py (per-position BatchNorm, batch-size sweep)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.normalization import batch_norm_statistics_per_position, batch_size_sweep


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(6) < torch.tensor([6, 2, 4, 1]).unsqueeze(1)
    return x, mask


def test_per_position_statistics_match_batchnorm1d_on_each_position() -> None:
    x, _ = _batch()
    mean, var, count = batch_norm_statistics_per_position(x)
    for t in range(x.shape[1]):
        bn = nn.BatchNorm1d(x.shape[-1], momentum=1.0, dtype=torch.float64)
        bn(x[:, t])  # momentum 1: running_mean becomes this batch's mean
        torch.testing.assert_close(mean[t], bn.running_mean, rtol=0, atol=1e-12)
        n = x.shape[0]
        torch.testing.assert_close(var[t], bn.running_var * (n - 1) / n, rtol=0, atol=1e-12)
    assert count.tolist() == [4] * 6


def test_per_position_statistics_use_real_tokens_only_and_nan_where_none() -> None:
    x, mask = _batch()
    mask[:, 5] = False  # no real token at the last position
    mean, var, count = batch_norm_statistics_per_position(x, mask)
    assert count.tolist() == [4, 3, 2, 2, 1, 0]
    torch.testing.assert_close(mean[2], x[[0, 2], 2].mean(0))
    torch.testing.assert_close(var[4], torch.zeros(5, dtype=torch.float64))  # one token: variance 0
    assert torch.isnan(mean[5]).all() and torch.isnan(var[5]).all()


def test_per_position_statistics_reject_bad_input() -> None:
    x, mask = _batch()
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        batch_norm_statistics_per_position(x[0])
    with pytest.raises(TypeError, match="mask must be a bool"):
        batch_norm_statistics_per_position(x, mask.int())
    with pytest.raises(ValueError, match="mask must have shape"):
        batch_norm_statistics_per_position(x, mask[:, :3])


def test_batch_size_sweep_matches_the_library_statistics() -> None:
    x, mask = _batch(1)
    out = batch_size_sweep(x, mask, [1, 2, 4])
    assert out["batch_norm_mean"].shape == (3, 5) and out["layer_norm_mean"].shape == (3, 6)
    for i, b in enumerate([1, 2, 4]):
        mean, var = tl.batch_norm_statistics(x[:b], mask[:b])
        torch.testing.assert_close(out["batch_norm_mean"][i], mean)
        torch.testing.assert_close(out["batch_norm_var"][i], var)
    counted = batch_size_sweep(x, mask, [4], count_padding=True)
    torch.testing.assert_close(counted["batch_norm_mean"][0], x.reshape(-1, 5).mean(0))


def test_batch_size_sweep_layer_norm_statistics_do_not_depend_on_the_batch() -> None:
    x, mask = _batch(2)
    out = batch_size_sweep(x, mask, [1, 2, 3, 4])
    assert torch.equal(out["layer_norm_mean"], out["layer_norm_mean"][:1].expand(4, -1))
    assert not torch.allclose(out["batch_norm_mean"][0], out["batch_norm_mean"][3])
    ln = nn.LayerNorm(5, elementwise_affine=False, dtype=torch.float64)
    normalized = (x[0] - out["layer_norm_mean"][0, :, None]) / torch.sqrt(out["layer_norm_var"][0, :, None] + 1e-5)
    torch.testing.assert_close(normalized, ln(x[0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("sizes", [[], [0], [5], [2.0], [True]])
def test_batch_size_sweep_rejects_bad_sizes(sizes: list) -> None:
    x, mask = _batch()
    with pytest.raises(ValueError, match="batch_sizes"):
        batch_size_sweep(x, mask, sizes)
