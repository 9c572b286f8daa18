"""The position-wise feed-forward network (前馈网络, FFN / MLP) (chapter 05).

FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                       (paper, equation 2)

The same two Linear layers act on every position separately. The hidden width d_ff is
2048 = 4 x d_model in the paper (note 000's code sets it equal to d_model by mistake).
GELU instead of ReLU is what GPT (note 004) uses; GPT-2 computes it with the tanh approximation
GELU(x) ~ 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), which is "gelu_tanh" here (chapter 10).
Chapter 11 adds ReLU^2 ("relu2": max(0, x)^2, So et al., 2021, nanochat's MLP) and the gated `SwiGLU`
(Shazeer, 2020; Llama, Qwen3), whose third matrix chapter 05 builds by hand.

Shape legend: B batch, T length, D d_model, F d_ff.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    check_bool,
    check_float,
    check_last_dim,
    check_like_module,
    check_positive_int,
    check_probability,
    check_tensor,
    is_trusted,
)

__all__ = ["FeedForward", "SwiGLU", "relu_squared", "swiglu_width"]


def relu_squared(x: Tensor) -> Tensor:
    """ReLU^2: max(0, x)^2 (So et al., 2021, "Primer"; nanochat and modded-nanogpt's MLP) (chapter 11).

    Written r * r rather than `torch.square(r)`: the same numbers and gradients, computed faster (about 15% for
    forward and backward at chapter 11's size): the gradient of a product is g r + g r, while that of `square` (a
    `pow`) first computes r^1 again, then doubles it, then multiplies by g.
    """
    positive = F.relu(x)
    return positive * positive


_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu2": relu_squared,
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(D, d_ff), activation, dropout, Linear(d_ff, D) (chapter 05).

    Dropout sits after the activation, where `nn.TransformerEncoderLayer` and note 002 put it.

    Args:
        d_model: D.
        d_ff: hidden width (2048 in the paper, 4 x D in GPT).
        dropout: dropout probability after the activation.
        activation: "relu" (the paper), "gelu" (GPT, note 004), "gelu_tanh" (GELU's tanh approximation,
            as GPT-2 computes it; chapter 10) or "relu2" (ReLU squared, nanochat's; chapter 11).

    Shape:
        x (..., D) -> (..., D).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_probability("dropout", dropout)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.d_model = d_model
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff)  # W_1: D -> d_ff
        self.w2 = nn.Linear(d_ff, d_model)  # W_2: d_ff -> D
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if not is_trusted():  # inside a layer that has checked x, not again
            check_tensor("x", x, min_dim=1)
            check_float("x", x)
            check_last_dim("x", x, self.d_model)
            check_like_module("x", x, self)
        hidden = _ACTIVATIONS[self.activation](self.w1(x))  # (..., F)
        return self.w2(self.dropout(hidden))  # (..., D)


def swiglu_width(d_model: int, multiple_of: int = 8) -> int:
    """The hidden width of a SwiGLU as large as a 4 x d_model two-matrix FFN: 8/3 d_model, rounded up (chapter 11).

    Three matrices of h x D instead of two of 4D x D: h = 2/3 x 4D keeps the weight count. Llama computes
    int(8D / 3) and rounds it up to a multiple (256 at its size; 8 here, for small models).
    """
    check_positive_int("d_model", d_model)
    check_positive_int("multiple_of", multiple_of)
    width = int(8 * d_model / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama-style models (chapter 05's exercise as a module; chapter 11).

        SwiGLU(x) = W_2 (SiLU(W_1 x) * W_3 x),    SiLU(a) = a sigmoid(a)

    W_1 (the gate, Hugging Face's `gate_proj`) and W_3 (`up_proj`) map D to the hidden width, W_2 (`down_proj`)
    maps back; dropout sits after the product, where `FeedForward` puts it after the activation.

    Args:
        d_model: D.
        d_ff: hidden width (`swiglu_width(D)` keeps a 4D FFN's size; Llama and Qwen3 set it in their config).
        dropout: dropout probability after the gated product.
        bias: whether the three Linear layers have biases (Llama: no).

    Shape:
        x (..., D) -> (..., D).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_probability("dropout", dropout)
        check_bool("bias", bias)
        self.d_model = d_model
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # W_1, the gate: D -> d_ff
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)  # W_3, the value gated: D -> d_ff
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)  # W_2: d_ff -> D
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if not is_trusted():
            check_tensor("x", x, min_dim=1)
            check_float("x", x)
            check_last_dim("x", x, self.d_model)
            check_like_module("x", x, self)
        hidden = F.silu(self.w1(x)) * self.w3(x)  # (..., F)
        return self.w2(self.dropout(hidden))  # (..., D)
