"""The encoder (编码器): a stack of N identical layers (chapter 06).

EncoderLayer: self-attention, then the feed-forward network, each inside a residual
connection with a LayerNorm (Pre-Norm or Post-Norm, see residual.py).

Shape legend: B batch, S source length, D d_model, H heads.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import check_float, check_last_dim, check_positive_int, check_tensor
from transformer_lab.feedforward import FeedForward
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm
from transformer_lab.residual import sublayer_connection

__all__ = ["EncoderLayer", "Encoder"]


def check_sequence(name: str, x: object, d_model: int) -> None:
    """Raise unless `x` is a float (B, L, d_model) tensor."""
    check_tensor(name, x, dim=3)
    assert isinstance(x, Tensor)
    check_float(name, x)
    check_last_dim(name, x, d_model)


def fast_norm(norm: nn.Module) -> Callable[[Tensor], Tensor]:
    """The fast path's LayerNorm (performance only): PyTorch's fused `F.layer_norm` with the
    parameters of our `LayerNorm`, which computes the same thing in several separate kernels.

    Layers use it when their attention is on the fast path (`record_weights=False`, see
    `record_attention`); tested equal to the explicit path. Any other norm is returned as is.
    """
    if type(norm) is not LayerNorm:
        return norm
    return partial(F.layer_norm, normalized_shape=(norm.d_model,), weight=norm.weight, bias=norm.bias, eps=norm.eps)


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention and FFN, each with residual and LayerNorm (chapter 06).

    Equal to `nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True,
    norm_first=...)` once weights are copied (tested).

    Args:
        d_model, n_heads, d_ff: the paper's d_model, h and d_ff.
        dropout: dropout on attention weights, inside the FFN and on each sublayer's output.
        norm_first: True for Pre-Norm (the notes' code), False for Post-Norm (the paper).
        eps: LayerNorm epsilon.
        activation: "relu" or "gelu".

    Shape:
        x (B, S, D), mask broadcastable to (B, H, S, S) (usually a (B, 1, 1, S) padding mask).
        Output (B, S, D).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = True,
        eps: float = 1e-5,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        check_sequence("x", x, self.d_model)
        norm1, norm2 = self.norm1, self.norm2
        if not self.self_attn.record_weights:  # fast path: fused LayerNorm too
            norm1, norm2 = fast_norm(norm1), fast_norm(norm2)
        x = sublayer_connection(x, lambda h: self.self_attn(h, h, h, mask), norm1, self.dropout1, self.norm_first)
        return sublayer_connection(x, self.feed_forward, norm2, self.dropout2, self.norm_first)


class Encoder(nn.Module):
    """N encoder layers, plus a final LayerNorm for Pre-Norm (chapter 06).

    Pre-Norm leaves the last layer's output un-normalized, so the stack ends with `norm`
    (as `nn.Transformer` does); for Post-Norm `norm` is the identity.

    Shape:
        x (B, S, D), mask broadcastable to (B, H, S, S). Output (B, S, D).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.1,
        norm_first: bool = True,
        eps: float = 1e-5,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        check_positive_int("n_layers", n_layers)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first, eps, activation) for _ in range(n_layers)
        )
        self.norm: nn.Module = LayerNorm(d_model, eps) if norm_first else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        fast = not self.layers[-1].self_attn.record_weights
        return fast_norm(self.norm)(x) if fast else self.norm(x)
