"""The position-wise feed-forward network (前馈网络, FFN / MLP) (chapter 05).

FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                       (paper, equation 2)

The same two Linear layers act on every position separately. The hidden width d_ff is
2048 = 4 x d_model in the paper (note 000's code sets it equal to d_model by mistake).
GELU instead of ReLU is what GPT (note 004) uses; GPT-2 computes it with the tanh approximation
GELU(x) ~ 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), which is "gelu_tanh" here (chapter 10).

Shape legend: B batch, T length, D d_model, F d_ff.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    check_float,
    check_last_dim,
    check_like_module,
    check_positive_int,
    check_probability,
    check_tensor,
    is_trusted,
)

__all__ = ["FeedForward"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh")}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(D, d_ff), activation, dropout, Linear(d_ff, D) (chapter 05).

    Dropout sits after the activation, where `nn.TransformerEncoderLayer` and note 002 put it.

    Args:
        d_model: D.
        d_ff: hidden width (2048 in the paper, 4 x D in GPT).
        dropout: dropout probability after the activation.
        activation: "relu" (the paper), "gelu" (GPT, note 004) or "gelu_tanh" (GELU's tanh approximation,
            as GPT-2 computes it; chapter 10).

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
