"""LayerNorm against nn.LayerNorm and BatchNorm against nn.BatchNorm1d (chapter 04)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_lab as tl

B, T, D = 3, 5, 6


def _x(*shape: int, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g) * scale + shift


def _random_affine(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=g, dtype=module.weight.dtype))
        module.bias.copy_(torch.randn(module.bias.shape, generator=g, dtype=module.bias.dtype))


# ---------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize("shape", [(D,), (T, D), (B, T, D)], ids=str)
def test_layer_norm_matches_pytorch(shape: tuple[int, ...], eps: float) -> None:
    ours = tl.LayerNorm(D, eps=eps).double()
    _random_affine(ours, 0)
    theirs = nn.LayerNorm(D, eps=eps).double()
    theirs.load_state_dict(ours.state_dict())
    x = _x(*shape, seed=1, scale=3.0, shift=2.0).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    out, ref = ours(x), theirs(x2)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    upstream = _x(*shape, seed=2)
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, atol=1e-10, rtol=0)


def test_layer_norm_state_dict_loads_both_ways() -> None:
    ours, theirs = tl.LayerNorm(D), nn.LayerNorm(D)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    _random_affine(theirs, 3)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    _random_affine(ours, 4)
    theirs.load_state_dict(ours.state_dict())
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)


def test_layer_norm_uses_the_biased_variance() -> None:
    # Each token normalized by hand with the population variance (divide by D, not D - 1).
    x = _x(T, D, seed=5)
    out = tl.LayerNorm(D, eps=1e-12).double()(x)
    for t in range(T):
        row = x[t].tolist()
        mean = sum(row) / D
        var = sum((v - mean) ** 2 for v in row) / D
        expected = torch.tensor([(v - mean) / (var + 1e-12) ** 0.5 for v in row], dtype=torch.float64)
        torch.testing.assert_close(out[t], expected, atol=1e-10, rtol=0)
    assert torch.allclose(out.mean(-1), torch.zeros(T, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(T, dtype=torch.float64), atol=1e-9)


def test_layer_norm_statistics_are_per_token() -> None:
    x = _x(B, T, D, seed=6)
    mean, var = tl.layer_norm_statistics(x)
    assert mean.shape == var.shape == (B, T)
    torch.testing.assert_close(mean, x.mean(-1))
    torch.testing.assert_close(var, x.var(-1, unbiased=False))


# ---------------------------------------------------------------- BatchNorm


def _batch_norm_pair() -> tuple[tl.BatchNorm, nn.BatchNorm1d]:
    ours = tl.BatchNorm(D, momentum=0.2).double()
    _random_affine(ours, 0)
    theirs = nn.BatchNorm1d(D, momentum=0.2).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _bn_ref(module: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """nn.BatchNorm1d wants (B, D, T): features on axis 1."""
    return module(x.transpose(1, 2)).transpose(1, 2)


def test_batch_norm_train_steps_then_eval_match_pytorch() -> None:
    ours, theirs = _batch_norm_pair()
    for step in range(4):
        x = _x(B, T, D, seed=10 + step, scale=2.0, shift=step).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        out, ref = ours(x), _bn_ref(theirs, x2)
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
        upstream = _x(B, T, D, seed=20 + step)
        (out * upstream).sum().backward()
        (ref * upstream).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, atol=1e-10, rtol=0)
    ours.eval(), theirs.eval()
    x = _x(B, T, D, seed=30)
    torch.testing.assert_close(ours(x), _bn_ref(theirs, x), atol=1e-10, rtol=0)
    before = ours.running_mean.clone()
    ours(x)
    assert torch.equal(ours.running_mean, before)  # eval mode leaves the running estimates alone


def test_batch_norm_state_dict_loads_both_ways() -> None:
    ours, theirs = _batch_norm_pair()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    _bn_ref(theirs, _x(B, T, D, seed=1, shift=3.0))
    ours.load_state_dict(theirs.state_dict())
    ours.eval(), theirs.eval()
    x = _x(B, T, D, seed=2)
    torch.testing.assert_close(ours(x), _bn_ref(theirs, x), atol=1e-10, rtol=0)
    ours.train()
    ours(_x(B, T, D, seed=3, scale=4.0))
    theirs.load_state_dict(ours.state_dict())
    ours.eval()
    torch.testing.assert_close(ours(x), _bn_ref(theirs, x), atol=1e-10, rtol=0)


def test_batch_norm_with_padding_uses_only_real_tokens() -> None:
    ours = tl.BatchNorm(D, momentum=0.5).double()
    lengths = [5, 2, 3]
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    x = _x(B, T, D, seed=7)
    x[~mask] = 1000.0  # padding with a huge value: must not move the statistics
    real = torch.cat([x[b, : lengths[b]] for b in range(B)])  # (10, D), the real tokens only
    mean = real.mean(0)
    var = real.var(0, unbiased=False)
    stat_mean, stat_var = tl.batch_norm_statistics(x, mask)
    torch.testing.assert_close(stat_mean, mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(stat_var, var, atol=1e-10, rtol=0)
    out = ours(x, mask)
    torch.testing.assert_close(out[mask], (real - mean) / torch.sqrt(var + ours.eps), atol=1e-10, rtol=0)
    # Running estimates: the unbiased variance of the real tokens, as nn.BatchNorm1d would keep.
    torch.testing.assert_close(ours.running_mean, 0.5 * mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.running_var, 0.5 + 0.5 * real.var(0, unbiased=True), atol=1e-10, rtol=0)
    # Same as nn.BatchNorm1d run on the real tokens alone (as a (N, D) batch).
    reference = nn.BatchNorm1d(D, momentum=0.5).double()
    torch.testing.assert_close(out[mask], reference(real), atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.running_var, reference.running_var, atol=1e-10, rtol=0)


def test_batch_norm_without_the_mask_is_moved_by_padding() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True]])
    x = _x(2, 3, D, seed=8)
    x[~mask] = 0.0
    with_mask, _ = tl.batch_norm_statistics(x, mask)
    without, _ = tl.batch_norm_statistics(x)
    assert not torch.allclose(with_mask, without)
    torch.testing.assert_close(without, x.reshape(-1, D).mean(0))


def test_batch_norm_all_ones_mask_equals_no_mask() -> None:
    x = _x(B, T, D, seed=9)
    a, b = tl.BatchNorm(D).double(), tl.BatchNorm(D).double()
    torch.testing.assert_close(a(x, torch.ones(B, T, dtype=torch.bool)), b(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(a.running_var, b.running_var, atol=1e-12, rtol=0)
