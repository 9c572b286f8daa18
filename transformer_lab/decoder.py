"""The decoder (解码器): a stack of N identical layers (chapter 07).

DecoderLayer: masked self-attention over the target, cross-attention (queries from the
decoder, keys and values from the encoder's output, the "memory"), then the FFN; each inside
a residual connection with its own LayerNorm (norm1, norm2, norm3).

For generation one token at a time, a `DecoderCache` keeps each layer's self-attention keys
and values of the tokens seen so far and the cross-attention keys and values of the source,
so each step projects only the new token (the KV cache).

Shape legend: B batch, T target length, S source length, D d_model, H heads, d_k = D / H.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from transformer_lab._checks import check_positive_int
from transformer_lab.encoder import check_sequence, fast_norm
from transformer_lab.feedforward import FeedForward
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm
from transformer_lab.residual import sublayer_connection

__all__ = ["DecoderLayer", "Decoder", "LayerCache", "DecoderCache"]


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values, each (B, H, length, d_k)."""

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None


@dataclass
class DecoderCache:
    """The KV cache of a whole decoder (chapter 09, issue: incremental decoding).

    `length` is the number of target positions already processed; `Transformer.decode` uses it
    to place the positional encoding and the causal mask of the new tokens.
    """

    layers: list[LayerCache] = field(default_factory=list)
    length: int = 0

    @classmethod
    def empty(cls, n_layers: int) -> DecoderCache:
        return cls([LayerCache() for _ in range(n_layers)], 0)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (in that order), e.g. the surviving hypotheses of a beam search."""
        for layer in self.layers:
            for name in ("self_k", "self_v", "cross_k", "cross_v"):
                value = getattr(layer, name)
                if value is not None:
                    setattr(layer, name, value.index_select(0, index))


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention, FFN (chapter 07).

    Equal to `nn.TransformerDecoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True,
    norm_first=...)` once weights are copied (tested).

    Shape:
        x (B, T, D), memory (B, S, D), tgt_mask broadcastable to (B, H, T, T) (with a cache:
        (B, H, T, cached + T)), memory_mask broadcastable to (B, H, T, S). Output (B, T, D).
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
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.norm3 = LayerNorm(d_model, eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        check_sequence("x", x, self.d_model)
        check_sequence("memory", memory, self.d_model)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"memory must have the same batch size as x: x has B={x.shape[0]}, memory has B={memory.shape[0]}"
            )
        norm1, norm2, norm3 = self.norm1, self.norm2, self.norm3
        if not self.self_attn.record_weights:  # fast path: fused LayerNorm too
            norm1, norm2, norm3 = fast_norm(norm1), fast_norm(norm2), fast_norm(norm3)
        x = sublayer_connection(
            x, lambda h: self._self_attention(h, tgt_mask, cache), norm1, self.dropout1, self.norm_first
        )
        x = sublayer_connection(
            x,
            lambda h: self._cross_attention(h, memory, memory_mask, cache),
            norm2,
            self.dropout2,
            self.norm_first,
        )
        return sublayer_connection(x, self.feed_forward, norm3, self.dropout3, self.norm_first)

    def _self_attention(self, h: Tensor, mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        if cache is None:
            return self.self_attn(h, h, h, mask)
        k, v = self.self_attn.project_kv(h, h)  # (B, H, T, d_k) for the new positions
        if cache.self_k is not None:
            k = torch.cat([cache.self_k, k], dim=2)  # (B, H, cached + T, d_k)
            v = torch.cat([cache.self_v, v], dim=2)
        cache.self_k, cache.self_v = k, v
        return self.self_attn.attend(h, k, v, mask)

    def _cross_attention(self, h: Tensor, memory: Tensor, mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        if cache is None:
            return self.cross_attn(h, memory, memory, mask)
        if cache.cross_k is None:  # the source is projected once, at the first step
            cache.cross_k, cache.cross_v = self.cross_attn.project_kv(memory, memory)  # (B, H, S, d_k)
        return self.cross_attn.attend(h, cache.cross_k, cache.cross_v, mask)


class Decoder(nn.Module):
    """N decoder layers, plus a final LayerNorm for Pre-Norm (chapter 07).

    Shape:
        x (B, T, D), memory (B, S, D). Output (B, T, D).
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
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first, eps, activation) for _ in range(n_layers)
        )
        self.norm: nn.Module = LayerNorm(d_model, eps) if norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        if cache is not None and len(cache.layers) != len(self.layers):
            raise ValueError(f"cache has {len(cache.layers)} layers, the decoder has {len(self.layers)}")
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask, memory_mask, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += x.shape[1]
        fast = not self.layers[-1].self_attn.record_weights
        return fast_norm(self.norm)(x) if fast else self.norm(x)
