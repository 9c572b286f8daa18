"""FeedForward: the position-wise FFN (chapter 05)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl

D, FF = 6, 10


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_an_nn_sequential_with_copied_weights(activation: str) -> None:
    torch.manual_seed(0)
    ffn = tl.FeedForward(D, FF, activation=activation).double()
    act = nn.ReLU() if activation == "relu" else nn.GELU()
    reference = nn.Sequential(nn.Linear(D, FF), act, nn.Linear(FF, D)).double()
    reference.load_state_dict(
        {"0.weight": ffn.w1.weight, "0.bias": ffn.w1.bias, "2.weight": ffn.w2.weight, "2.bias": ffn.w2.bias}
    )
    x = _x(2, 3, D).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    out, ref = ffn(x), reference(x2)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(ffn.w1.weight.grad, reference[0].weight.grad, atol=1e-10, rtol=0)


def test_equation_two_written_out() -> None:
    ffn = tl.FeedForward(D, FF).double()
    x = _x(4, D)
    expected = torch.clamp(x @ ffn.w1.weight.T + ffn.w1.bias, min=0) @ ffn.w2.weight.T + ffn.w2.bias
    torch.testing.assert_close(ffn(x), expected, atol=1e-12, rtol=0)


def test_position_wise_each_position_separately() -> None:
    ffn = tl.FeedForward(D, FF).double()
    x = _x(2, 5, D)
    whole = ffn(x)
    for t in range(5):
        torch.testing.assert_close(ffn(x[:, t]), whole[:, t], atol=1e-12, rtol=0)


def test_shapes_and_parameter_count() -> None:
    ffn = tl.FeedForward(D, FF)
    assert ffn.w1.weight.shape == (FF, D) and ffn.w2.weight.shape == (D, FF)
    assert sum(p.numel() for p in ffn.parameters()) == D * FF + FF + FF * D + D


def test_dropout_sits_after_the_activation() -> None:
    torch.manual_seed(0)
    ffn = tl.FeedForward(D, FF, dropout=0.5).double().train()
    x = _x(3, D)
    torch.manual_seed(1)
    out = ffn(x)
    torch.manual_seed(1)
    expected = ffn.w2(F.dropout(F.relu(ffn.w1(x)), 0.5, training=True))
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn.w2(F.relu(ffn.w1(x))), atol=1e-12, rtol=0)


def test_gelu_tanh_is_gpt2s_formula_and_nn_gelu_tanh() -> None:
    """activation="gelu_tanh" (chapter 10): GPT-2's tanh approximation, written out, and nn.GELU(approximate="tanh")."""
    torch.manual_seed(0)
    ffn = tl.FeedForward(D, FF, activation="gelu_tanh").double()
    x = _x(2, 3, D)
    h = ffn.w1(x)
    written = 0.5 * h * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)))
    torch.testing.assert_close(ffn(x), ffn.w2(written), atol=1e-12, rtol=0)
    torch.testing.assert_close(ffn(x), ffn.w2(nn.GELU(approximate="tanh")(h)), atol=1e-12, rtol=0)
    assert (ffn(x) - ffn.w2(F.gelu(h))).abs().max() > 1e-8  # not the exact erf GELU
