"""The encoder (编码器): a stack of N identical layers (chapter 06).

EncoderLayer: self-attention, then the feed-forward network, each inside a residual
connection with a LayerNorm (Pre-Norm or Post-Norm, see residual.py).

Shape legend: B batch, S source length, D d_model, H heads.
"""

from __future__ import annotations

from torch import Tensor, nn

from transformer_lab._checks import (
    check_bool,
    check_like_module,
    check_mask,
    check_positive_int,
    check_sequence,
    is_trusted,
    trusted,
)
from transformer_lab.feedforward import FeedForward
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm
from transformer_lab.residual import sublayer_connection

__all__ = ["EncoderLayer", "Encoder"]


def check_encoder_inputs(module: nn.Module, x: object, mask: object, n_heads: int, d_model: int) -> None:
    """The checks of an encoder layer or stack: x a float (B, S, D) tensor of the module's dtype and
    device, mask None or a bool tensor broadcastable to (B, H, S, S) on x's device."""
    check_sequence("x", x, d_model)
    assert isinstance(x, Tensor)
    check_like_module("x", x, module)
    if mask is not None:
        check_mask("mask", mask, (x.shape[0], n_heads, x.shape[1], x.shape[1]), device=x.device)


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
        check_bool("norm_first", norm_first)
        self.d_model = d_model
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    @classmethod
    def from_parts(
        cls,
        self_attn: MultiHeadAttention,
        feed_forward: nn.Module,
        norm1: nn.Module,
        norm2: nn.Module,
        dropout: float = 0.1,
        norm_first: bool = True,
    ) -> EncoderLayer:
        """A layer around sublayers built elsewhere, with the same `forward` (chapter 11's GPT switches: rotary or
        grouped-query attention, a SwiGLU network, RMSNorm). `self_attn` must be a `MultiHeadAttention`."""
        if not isinstance(self_attn, MultiHeadAttention):
            raise TypeError(f"self_attn must be a tl.MultiHeadAttention, got {type(self_attn).__name__}")
        for name, part in (("feed_forward", feed_forward), ("norm1", norm1), ("norm2", norm2)):
            if not isinstance(part, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(part).__name__}")
        check_bool("norm_first", norm_first)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.d_model = self_attn.d_model
        layer.norm_first = norm_first
        layer.self_attn, layer.feed_forward, layer.norm1, layer.norm2 = self_attn, feed_forward, norm1, norm2
        layer.dropout1 = nn.Dropout(dropout)
        layer.dropout2 = nn.Dropout(dropout)
        return layer

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if not is_trusted():  # called on its own: check here, then let the sublayers trust the inputs
            check_encoder_inputs(self, x, mask, self.self_attn.n_heads, self.d_model)
        with trusted():
            x = sublayer_connection(
                x, lambda h: self.self_attn(h, h, h, mask), self.norm1, self.dropout1, self.norm_first
            )
            return sublayer_connection(x, self.feed_forward, self.norm2, self.dropout2, self.norm_first)


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
        if not is_trusted():
            first = self.layers[0]
            check_encoder_inputs(self, x, mask, first.self_attn.n_heads, first.d_model)
        with trusted():
            for layer in self.layers:
                x = layer(x, mask)
            return self.norm(x)
