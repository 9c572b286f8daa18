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

from transformer_lab._checks import (
    check_bool,
    check_like_module,
    check_mask,
    check_positive_int,
    check_sequence,
    check_tensor,
    is_trusted,
    trusted,
)
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
    # Room for later positions (see `extend_self`): a key buffer and a value buffer, each (B, H, capacity, d_k),
    # the id of the LayerCache that may write into them, and how many positions it filled; self_k and self_v are
    # views of that filled part.
    _room: tuple[Tensor, Tensor, int, int] | None = field(default=None, repr=False, compare=False)

    def extend_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the self-attention keys and values of new positions, (B, H, T, d_k) each; returns all of
        them, (B, H, cached + T, d_k) each, which are now `self_k` and `self_v`.

        The same values as `torch.cat([self_k, k], dim=2)` (tested), without its cost: a concatenation copies
        every cached position into newly allocated memory at every step, and one token at a time that copy
        costs more than the step's arithmetic (chapter 10; the figures are in `benchmarks/README.md`). Here the
        keys and values live in buffers with room to spare, doubled when full, so a step writes only its new
        positions.

        `torch.cat` is still used while autograd records the step (writing in place would change tensors that
        the backward pass needs). The buffers are written only by the LayerCache that made them, and only past
        what it filled: in a copy of the cache, after `DecoderCache.reorder`, or when `self_k` was set by hand
        (cut short, say), the next step moves the keys and values into buffers of its own, so that no tensor
        handed out before is ever overwritten.
        """
        old_k, old_v = self.self_k, self.self_v
        if old_k is None or old_v is None:
            self.self_k, self.self_v = k, v
            return k, v
        if k.shape[:2] != old_k.shape[:2] or k.shape[3:] != old_k.shape[3:] or v.shape != k.shape:
            raise ValueError(
                f"new keys and values of shape {tuple(k.shape)} and {tuple(v.shape)} do not fit the cache's "
                f"{tuple(old_k.shape)} (B, H, length, d_k): the cache was filled by another model or batch; start "
                "a new cache with model.new_cache()"
            )
        recorded = torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, old_k, old_v))
        if recorded or k.dtype != old_k.dtype or k.device != old_k.device:
            self._room = None
            self.self_k, self.self_v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
            return self.self_k, self.self_v
        length, new = old_k.shape[2], old_k.shape[2] + k.shape[2]
        room = self._room
        if (
            room is None
            or room[2:] != (id(self), length)
            or room[0].shape[2] < new
            or not _fills(old_k, room[0], old_v, room[1])
        ):
            shape = (*old_k.shape[:2], max(2 * new, 16), old_k.shape[3])  # (B, H, capacity, d_k)
            room = (old_k.new_empty(shape), old_v.new_empty(shape), id(self), length)
            room[0][:, :, :length] = old_k
            room[1][:, :, :length] = old_v
        room[0][:, :, length:new] = k
        room[1][:, :, length:new] = v
        self._room = (room[0], room[1], id(self), new)
        self.self_k, self.self_v = room[0][:, :, :new], room[1][:, :, :new]
        return self.self_k, self.self_v

    def check(self, batch: int, n_heads: int, d_k: int, name: str = "cache") -> None:
        """Raise ValueError unless the cached keys and values are (batch, n_heads, ., d_k)."""
        for key in ("self_k", "cross_k"):
            value = getattr(self, key)
            if value is None:
                continue
            if value.shape[0] != batch:
                raise ValueError(
                    f"{name} holds keys and values for a batch of {value.shape[0]}, the input has {batch} rows; "
                    "start a new cache (model.new_cache()) for a new batch, or select rows with cache.reorder(index)"
                )
            if value.shape[1] != n_heads or value.shape[3] != d_k:
                raise ValueError(
                    f"{name} holds keys of shape {tuple(value.shape)}, not (B, H={n_heads}, length, d_k={d_k}): "
                    "it was filled by another model; start a new cache with model.new_cache()"
                )


def _fills(k: Tensor, k_buffer: Tensor, v: Tensor, v_buffer: Tensor) -> bool:
    """Whether k and v are the filled part of the buffers (views of their first positions, as `extend_self`
    leaves them)."""
    return all(
        t.data_ptr() == b.data_ptr() and t.stride() == b.stride() and t.dtype == b.dtype and t.device == b.device
        for t, b in ((k, k_buffer), (v, v_buffer))
    )


@dataclass
class DecoderCache:
    """The KV cache of a whole decoder (chapter 09, issue: incremental decoding).

    `length` is the number of target positions already processed; `Transformer.decode` uses it
    to place the positional encoding and the causal mask of the new tokens. `memory` is the encoder
    output the cross-attention keys and values were projected from: a later step given another
    memory is refused (the cached keys would silently belong to the first source).
    """

    layers: list[LayerCache] = field(default_factory=list)
    length: int = 0
    memory: Tensor | None = None

    @classmethod
    def empty(cls, n_layers: int) -> DecoderCache:
        check_positive_int("n_layers", n_layers)
        return cls([LayerCache() for _ in range(n_layers)], 0)

    @property
    def batch_size(self) -> int | None:
        """The number of rows the cache holds, or None while it is empty."""
        for layer in self.layers:
            for value in (layer.self_k, layer.cross_k):
                if value is not None:
                    return value.shape[0]
        return None

    def check_memory(self, memory: Tensor) -> None:
        """Raise ValueError if the cache was filled from another memory than `memory`; remember it otherwise.

        The same tensor object costs nothing; another tensor (e.g. rows repeated for a beam search after
        `reorder`) is compared by value once, then remembered.
        """
        if self.memory is None or self.memory is memory:
            self.memory = memory
            return
        if self.memory.shape != memory.shape or not torch.equal(self.memory, memory):
            raise ValueError(
                "memory is not the memory this cache was filled from: its cross-attention keys and values "
                "belong to another source; start a new cache (model.new_cache()) for a new source"
            )
        self.memory = memory

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (in that order), e.g. the surviving hypotheses of a beam search.

        Args:
            index: 1-D integer tensor of row numbers in [0, B), repeats allowed.
        """
        check_tensor("index", index, dim=1)
        if index.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"index must be an integer tensor of row numbers (torch.long), got dtype {index.dtype}")
        batch = self.batch_size
        if batch is not None and index.numel() > 0:
            low, high = torch.stack(torch.aminmax(index)).tolist()
            if low < 0 or high >= batch:
                raise ValueError(
                    f"index must hold row numbers in [0, {batch}) (the cache's batch), got {low if low < 0 else high}"
                )
        for layer in self.layers:
            for name in ("self_k", "self_v", "cross_k", "cross_v"):
                value = getattr(layer, name)
                if value is not None:
                    setattr(layer, name, value.index_select(0, index.to(value.device)))
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index.to(self.memory.device))


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
        check_bool("norm_first", norm_first)
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
        if not is_trusted():  # called on its own: check here, then let the sublayers trust the inputs
            check_decoder_inputs(self, x, memory, tgt_mask, memory_mask, cache)
        with trusted():
            x = sublayer_connection(
                x, lambda h: self._self_attention(h, tgt_mask, cache), self.norm1, self.dropout1, self.norm_first
            )
            x = sublayer_connection(
                x,
                lambda h: self._cross_attention(h, memory, memory_mask, cache),
                self.norm2,
                self.dropout2,
                self.norm_first,
            )
            return sublayer_connection(x, self.feed_forward, self.norm3, self.dropout3, self.norm_first)

    def _self_attention(self, h: Tensor, mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        if cache is None:
            return self.self_attn(h, h, h, mask)
        k, v = cache.extend_self(*self.self_attn.project_kv(h, h))  # (B, H, cached + T, d_k) each
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
        if not is_trusted():
            check_decoder_inputs(self, x, memory, tgt_mask, memory_mask, cache)
        with trusted():
            for i, layer in enumerate(self.layers):
                x = layer(x, memory, tgt_mask, memory_mask, cache.layers[i] if cache is not None else None)
            if cache is not None:
                cache.length += x.shape[1]
            return self.norm(x)


def check_decoder_inputs(
    module: DecoderLayer | Decoder,
    x: object,
    memory: object,
    tgt_mask: object,
    memory_mask: object,
    cache: object,
) -> None:
    """The checks of a decoder layer or stack, with errors named after the caller's arguments: x (B, T, D)
    and memory (B, S, D) float tensors of the module's dtype and device, masks broadcastable to (B, H, T,
    cached + T) and (B, H, T, S), and a cache of the right kind, batch and source."""
    layer = module if isinstance(module, DecoderLayer) else module.layers[0]
    check_sequence("x", x, layer.d_model)
    check_sequence("memory", memory, layer.d_model)
    assert isinstance(x, Tensor) and isinstance(memory, Tensor)
    check_like_module("x", x, module)
    check_like_module("memory", memory, module)
    if memory.shape[0] != x.shape[0]:
        raise ValueError(
            f"memory must have the same batch size as x: x has B={x.shape[0]}, memory has B={memory.shape[0]}"
        )
    batch, length, heads = x.shape[0], x.shape[1], layer.self_attn.n_heads
    cached = 0
    if cache is not None:
        kind = LayerCache if isinstance(module, DecoderLayer) else DecoderCache
        if not isinstance(cache, kind):
            raise TypeError(f"cache must be a {kind.__name__} or None, got {type(cache).__name__}")
        if isinstance(cache, DecoderCache):
            if len(cache.layers) != len(module.layers):  # type: ignore[union-attr]
                raise ValueError(
                    f"cache has {len(cache.layers)} layers, the decoder has {len(module.layers)}"  # type: ignore[union-attr]
                )
            layer_caches = cache.layers
        else:
            layer_caches = [cache]
        for layer_cache in layer_caches:
            layer_cache.check(batch, heads, layer.self_attn.d_k)
        if isinstance(cache, DecoderCache):
            cache.check_memory(memory)
        first = layer_caches[0]
        cached = first.self_k.shape[2] if first.self_k is not None else 0
    if tgt_mask is not None:
        check_mask("tgt_mask", tgt_mask, (batch, heads, length, cached + length), device=x.device)
    if memory_mask is not None:
        check_mask("memory_mask", memory_mask, (batch, heads, length, memory.shape[1]), device=x.device)
