"""Exercises of chapter 05 (feed-forward network and residual connections): the FFN's parameter
count, its forward pass, and a residual sublayer in Pre-Norm and Post-Norm.

Shape legend: B batch, T sequence length, D d_model, F d_ff.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise

__all__ = ["ffn_parameter_count", "feed_forward", "residual_sublayer"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- 1. How many parameters? --------------------------------------------------------------------


def _ffn_parameter_count(d_model: int, d_ff: int, bias: bool = True) -> int:
    """Parameters of Linear(d_model, d_ff) followed by Linear(d_ff, d_model)."""
    weights = d_model * d_ff + d_ff * d_model  # W_1 (F, D) and W_2 (D, F)
    biases = d_ff + d_model if bias else 0  # b_1 (F,) and b_2 (D,)
    return weights + biases


def _count_no_bias(d_model: int, d_ff: int, bias: bool = True) -> int:
    return 2 * d_model * d_ff


def _count_one_matrix(d_model: int, d_ff: int, bias: bool = True) -> int:
    return d_model * d_ff + (d_ff + d_model if bias else 0)


def _count_bias_swapped(d_model: int, d_ff: int, bias: bool = True) -> int:
    return 2 * d_model * d_ff + (2 * d_model if bias else 0)


ffn_parameter_count = Exercise(
    name="ffn_parameter_count",
    reference=_ffn_parameter_count,
    cases=[
        Case("the paper's base model: d_model=512, d_ff=2048", lambda: (512, 2048, True)),
        Case("GPT-2 small: d_model=768, d_ff=4*768", lambda: (768, 3072, True)),
        Case("note 000's slip: hidden width = d_model = 512", lambda: (512, 512, True)),
        Case("without biases (bias=False, as in note 000's MLP)", lambda: (512, 2048, False)),
        Case("a tiny one: d_model=1, d_ff=1", lambda: (1, 1, True)),
    ],
    hints=[
        """
        nn.Linear(n_in, n_out) holds an (n_out, n_in) weight matrix and, if bias=True, an (n_out,) bias.
        The FFN has two of them: d_model -> d_ff and d_ff -> d_model. Add them up.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_count_no_bias, _count_one_matrix, _count_bias_swapped],
)


# --- 2. The position-wise feed-forward pass -----------------------------------------------------


def _feed_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """FFN(x) = max(0, x W_1^T + b_1) W_2^T + b_2, on every position; weights laid out as nn.Linear's."""
    hidden = torch.relu(x @ w1.T + b1)  # (..., D) @ (D, F) -> (..., F)
    return hidden @ w2.T + b2  # (..., F) @ (F, D) -> (..., D)


def _ffn_inputs(
    shape: tuple[int, ...], d_ff: int, seed: int, offset: float = 0.0
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    g = _generator(seed)
    d = shape[-1]
    return (
        torch.randn(*shape, generator=g) + offset,
        torch.randn(d_ff, d, generator=g) / d**0.5,
        torch.randn(d_ff, generator=g) * 0.1,
        torch.randn(d, d_ff, generator=g) / d_ff**0.5,
        torch.randn(d, generator=g) * 0.1,
    )


def _ffn_no_activation(x, w1, b1, w2, b2):  # noqa: ANN001, ANN202
    return (x @ w1.T + b1) @ w2.T + b2


def _ffn_relu_at_the_end(x, w1, b1, w2, b2):  # noqa: ANN001, ANN202
    return torch.relu((x @ w1.T + b1) @ w2.T + b2)


def _ffn_gelu(x, w1, b1, w2, b2):  # noqa: ANN001, ANN202
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


feed_forward = Exercise(
    name="feed_forward",
    reference=_feed_forward,
    cases=[
        Case("a (2, 3, 4) batch, d_ff = 16", lambda: _ffn_inputs((2, 3, 4), 16, 0)),
        Case("one position, shape (8,), d_ff = 32", lambda: _ffn_inputs((8,), 32, 1)),
        Case("a (5, 6) sequence without a batch axis, d_ff = 24", lambda: _ffn_inputs((5, 6), 24, 2)),
        Case("inputs far below zero (the ReLU cuts most of them)", lambda: _ffn_inputs((4, 4), 8, 3, offset=-3.0)),
    ],
    hints=[
        """
        The weights are laid out as nn.Linear stores them: w1 is (d_ff, d_model), so the first layer is
        x @ w1.T + b1. Apply ReLU (torch.relu) to the hidden layer only, then the second layer
        hidden @ w2.T + b2. The same matrices act on every position: no loop is needed.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_ffn_no_activation, _ffn_relu_at_the_end, _ffn_gelu],
)


# --- 3. A residual sublayer, Pre-Norm or Post-Norm -----------------------------------------------


def _layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _residual_sublayer(
    x: Tensor, sublayer: Callable[[Tensor], Tensor], gamma: Tensor, beta: Tensor, norm_first: bool
) -> Tensor:
    """Pre-Norm: x + sublayer(LN(x)).  Post-Norm ("Add & Norm"): LN(x + sublayer(x)).  LN with eps=1e-5."""
    if norm_first:
        return x + sublayer(_layer_norm(x, gamma, beta))  # Pre-Norm, the notes' code
    return _layer_norm(x + sublayer(x), gamma, beta)  # Post-Norm, the paper's figure


def _sublayer_inputs(norm_first: bool, seed: int, zero: bool = False):  # noqa: ANN202
    g = _generator(seed)
    d = 6
    x = torch.randn(2, 3, d, generator=g) * 2.0 + 1.0
    weight = torch.zeros(d, d) if zero else torch.randn(d, d, generator=g) / d**0.5

    def sublayer(h: Tensor) -> Tensor:
        return torch.tanh(h @ weight.T)

    return x, sublayer, 1.0 + 0.3 * torch.randn(d, generator=g), 0.3 * torch.randn(d, generator=g), norm_first


def _sublayer_swapped(x, sublayer, gamma, beta, norm_first):  # noqa: ANN001, ANN202
    return _residual_sublayer(x, sublayer, gamma, beta, not norm_first)


def _sublayer_no_residual(x, sublayer, gamma, beta, norm_first):  # noqa: ANN001, ANN202
    if norm_first:
        return sublayer(_layer_norm(x, gamma, beta))
    return _layer_norm(sublayer(x), gamma, beta)


def _sublayer_normalizes_the_sum_twice(x, sublayer, gamma, beta, norm_first):  # noqa: ANN001, ANN202
    if norm_first:
        return _layer_norm(x + sublayer(_layer_norm(x, gamma, beta)), gamma, beta)
    return _layer_norm(x + sublayer(x), gamma, beta)


residual_sublayer = Exercise(
    name="residual_sublayer",
    reference=_residual_sublayer,
    cases=[
        Case("Pre-Norm (norm_first=True)", lambda: _sublayer_inputs(True, 0)),
        Case("Post-Norm (norm_first=False)", lambda: _sublayer_inputs(False, 1)),
        Case(
            "Pre-Norm with a sublayer that outputs zeros: x comes out unchanged",
            lambda: _sublayer_inputs(True, 2, True),
        ),
        Case("Post-Norm with a sublayer that outputs zeros: LayerNorm(x)", lambda: _sublayer_inputs(False, 3, True)),
    ],
    hints=[
        """
        Pre-Norm normalizes the sublayer's INPUT and adds the raw x back: x + sublayer(LN(x)).
        Post-Norm ("Add & Norm") adds first and normalizes the SUM: LN(x + sublayer(x)).
        Write a small layer norm over the last axis (biased variance, eps=1e-5) with gamma and beta.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_sublayer_swapped, _sublayer_no_residual, _sublayer_normalizes_the_sum_twice],
)
