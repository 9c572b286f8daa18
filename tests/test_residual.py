"""The residual sublayer, Pre-Norm and Post-Norm (chapter 05)."""

from __future__ import annotations

import torch
from torch import nn

import transformer_lab as tl

D = 6


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 3 + 1


def _ffn() -> tl.FeedForward:
    torch.manual_seed(0)
    return tl.FeedForward(D, 12).double()


def test_pre_norm_formula() -> None:
    ffn, norm, x = _ffn(), tl.LayerNorm(D).double(), _x()
    out = tl.sublayer_connection(x, ffn, norm, nn.Identity(), norm_first=True)
    torch.testing.assert_close(out, x + ffn(norm(x)), atol=1e-12, rtol=0)


def test_post_norm_formula() -> None:
    ffn, norm, x = _ffn(), tl.LayerNorm(D).double(), _x()
    out = tl.sublayer_connection(x, ffn, norm, nn.Identity(), norm_first=False)
    torch.testing.assert_close(out, norm(x + ffn(x)), atol=1e-12, rtol=0)
    # Post-Norm output is normalized per token; Pre-Norm output is not.
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 3, dtype=torch.float64), atol=1e-10, rtol=0)


def test_residual_module_matches_the_function_in_both_settings() -> None:
    for norm_first in (True, False):
        block = tl.Residual(_ffn(), D, norm_first=norm_first).double()
        x = _x()
        expected = tl.sublayer_connection(x, block.sublayer, block.norm, nn.Identity(), norm_first)
        torch.testing.assert_close(block(x), expected, atol=1e-12, rtol=0)


def test_pre_norm_keeps_an_identity_path_for_the_gradient() -> None:
    # With a sublayer whose output is zero, Pre-Norm is exactly the identity: gradient 1 everywhere.
    zero = tl.FeedForward(D, 4).double()
    nn.init.zeros_(zero.w2.weight)
    nn.init.zeros_(zero.w2.bias)
    block = tl.Residual(zero, D, norm_first=True).double()
    x = _x().requires_grad_()
    out = block(x)
    torch.testing.assert_close(out, x, atol=0, rtol=0)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x), atol=0, rtol=0)


def test_dropout_applies_to_the_sublayer_output_only() -> None:
    block = tl.Residual(_ffn(), D, dropout=0.5, norm_first=True).double().train()
    x = _x()
    torch.manual_seed(3)
    out = block(x)
    torch.manual_seed(3)
    expected = x + nn.functional.dropout(block.sublayer(block.norm(x)), 0.5, training=True)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
