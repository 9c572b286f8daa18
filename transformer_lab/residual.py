"""Residual connections (残差连接) around a sublayer, Post-Norm and Pre-Norm (chapter 05).

Post-Norm, the paper's figure and note 002's "Add & Norm":  x = LayerNorm(x + Dropout(sublayer(x)))
Pre-Norm, the notes' code and GPT:                         x = x + Dropout(sublayer(LayerNorm(x)))

Pre-Norm leaves an identity path from the input to the output of the whole stack, which is why
it trains deep stacks without warm-up tricks; it needs one extra LayerNorm at the end of the stack.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from transformer_lab._checks import check_bool, check_probability, check_tensor, is_trusted
from transformer_lab.normalization import LayerNorm

__all__ = ["sublayer_connection", "Residual"]


def sublayer_connection(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    norm: nn.Module,
    dropout: nn.Module,
    norm_first: bool,
) -> Tensor:
    """Apply `sublayer` to `x` with a residual connection and a LayerNorm, Pre- or Post-Norm.

    Shape:
        x (B, T, D) -> (B, T, D).
    """
    if not is_trusted():  # called on its own: inside a layer the layer's own modules are trusted
        check_bool("norm_first", norm_first)
        sublayer = _same_shape(sublayer)
    if norm_first:
        return x + dropout(sublayer(norm(x)))  # Pre-Norm
    return norm(x + dropout(sublayer(x)))  # Post-Norm ("Add & Norm")


def _same_shape(sublayer: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """`sublayer`, raising a ValueError if its output's shape differs from its input's (no residual sum then)."""

    def checked(h: Tensor) -> Tensor:
        out = sublayer(h)
        if not isinstance(out, Tensor) or out.shape != h.shape:
            shown = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"sublayer must map (..., d_model) to the same shape for the residual sum x + sublayer(x): "
                f"got {tuple(h.shape)} -> {shown}"
            )
        return out

    return checked


class Residual(nn.Module):
    """A sublayer wrapped in its residual connection and LayerNorm (chapter 05).

    Args:
        sublayer: a module mapping (B, T, D) to (B, T, D), e.g. a `FeedForward`.
        d_model: D, the size of the LayerNorm.
        dropout: dropout on the sublayer's output before it is added.
        norm_first: True for Pre-Norm, False for Post-Norm.
    """

    def __init__(self, sublayer: nn.Module, d_model: int, dropout: float = 0.0, norm_first: bool = True) -> None:
        super().__init__()
        if not isinstance(sublayer, nn.Module):
            raise TypeError(f"sublayer must be an nn.Module, got {type(sublayer).__name__}")
        check_probability("dropout", dropout)
        check_bool("norm_first", norm_first)
        self.sublayer = sublayer
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor) -> Tensor:
        if not is_trusted():
            check_tensor("x", x, min_dim=1)
        return sublayer_connection(x, self.sublayer, self.norm, self.dropout, self.norm_first)
