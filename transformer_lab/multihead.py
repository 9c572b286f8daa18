"""Multi-head attention (多头注意力, chapter 03), with chapter 11's grouped-query attention and QK norm.

MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                 (paper, section 3.2.2)

The h projections of size d_k = d_model / h are computed by one (d_model x d_model) Linear
each for Q, K and V, then split into heads with view + transpose.

Chapter 11's options (each off by default): fewer key/value heads than query heads (grouped-query attention,
Ainslie et al., 2023: query head i reads key/value head i // (H / H_kv)), a head size d_k chosen freely (Qwen3),
an RMSNorm over each head's queries and keys (QK norm, Qwen3 / nanochat), and rotary positions turning the queries
and keys (`tl.modern.RotaryEmbedding`), in that order, as Qwen3 does.

Shape legend: B batch, T queries, S keys, H heads, H_kv key/value heads, D d_model, d_k = D / H unless given.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    check_bool,
    check_float,
    check_last_dim,
    check_like_module,
    check_mask,
    check_positive_int,
    check_probability,
    check_tensor,
    is_trusted,
)
from transformer_lab.attention import attention
from transformer_lab.masking import causal_mask
from transformer_lab.normalization import LayerNorm

__all__ = ["MultiHeadAttention", "record_attention", "repeat_kv_heads"]


def repeat_kv_heads(x: Tensor, group: int) -> Tensor:
    """Grouped-query attention's keys or values for every query head: each of the H_kv heads repeated `group`
    times in a row (heads 0, 0, 1, 1, ... for group 2), as chapter 03's exercise and Hugging Face's `repeat_kv`
    do. (B, H_kv, S, d_k) -> (B, H_kv * group, S, d_k); the tensor itself when group is 1."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _is_causal(mask: Tensor | None, queries: int, keys: int) -> bool:
    """Whether `mask` is the plain (T, T) causal mask of T queries attending to T keys: True exactly on and below
    the diagonal (a few microseconds to check at T = 64)."""
    if mask is None or mask.dtype != torch.bool or mask.shape != (queries, keys) or queries != keys:
        return False
    return torch.equal(mask, causal_mask(queries, device=mask.device))


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the paper's W^Q, W^K, W^V and W^O (chapter 03).

    Two paths compute the same thing (tested equal, outputs and gradients):
    - `record_weights=True` (the default, for learning): the explicit
      `scaled_dot_product_attention`, and the detached (B, H, T, S) weights of the last call
      are kept in `.attention_weights` for plotting;
    - `record_weights=False` (for training fast): PyTorch's fused
      `F.scaled_dot_product_attention`, which never forms the weights, with the projections packed
      into one matmul when keys and values (and queries) are one tensor;
      `.attention_weights` is None. `record_attention(model, False)` switches a whole model: every
      attention, and every `LayerNorm` (its `fused` flag: PyTorch's fused `F.layer_norm`).

    Inputs are checked when the module is called on its own; inside a layer or model that has
    checked them already, they are not checked again.

    Args:
        d_model: size of the model's vectors (D); must be divisible by n_heads unless d_k is given.
        n_heads: number of (query) heads (H, the paper's h).
        dropout: dropout probability on the attention weights.
        bias: whether the four projections have a bias.
        record_weights: keep the last attention weights (explicit path) or not (fast path).
        n_kv_heads: number of key/value heads H_kv, dividing n_heads (grouped-query attention; chapter 11).
            None: n_heads, the paper's multi-head attention. W^K and W^V then map D to H_kv * d_k.
        d_k: the size of each head; None: d_model / n_heads. W^Q maps D to H * d_k and W^O back to D.
        qk_norm: None, or a function making a norm of size d_k (e.g. `lambda d: nn.RMSNorm(d)`), applied to each
            head's queries and keys after the projection (QK norm, chapter 11): `q_norm` and `k_norm`.
        rotary: None, or a `tl.modern.RotaryEmbedding` turning queries and keys by their positions (after the QK
            norm); for self-attention, where queries and keys share positions.

    Shape:
        query (B, T, D), key and value (B, S, D), mask broadcastable to (B, H, T, S) with
        True = may attend. Output (B, T, D).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        record_weights: bool = True,
        *,
        n_kv_heads: int | None = None,
        d_k: int | None = None,
        qk_norm: Callable[[int], nn.Module] | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        check_probability("dropout", dropout)
        check_bool("record_weights", record_weights)
        check_bool("bias", bias)
        if d_k is None:
            if d_model % n_heads != 0:
                raise ValueError(
                    f"d_model must be divisible by n_heads so that each head gets d_k = d_model / n_heads "
                    f"features: got d_model={d_model}, n_heads={n_heads} (or give the head size d_k)"
                )
            d_k = d_model // n_heads
        check_positive_int("d_k", d_k)
        if n_kv_heads is None:
            n_kv_heads = n_heads
        check_positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_kv_heads must divide n_heads, so that each key/value head serves the same number of query "
                f"heads: got n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        if qk_norm is not None and not callable(qk_norm):
            raise TypeError(f"qk_norm must be None or a function of the head size returning a norm, got {qk_norm!r}")
        if rotary is not None and not isinstance(rotary, nn.Module):
            raise TypeError(f"rotary must be None or a tl.modern.RotaryEmbedding, got {type(rotary).__name__}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.d_k = d_k
        # Four separate Linear layers (note 002 warns: `[nn.Linear(...)] * 4` would be ONE layer
        # repeated four times, sharing its weights).
        self.w_q = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)
        self.w_o = nn.Linear(n_heads * d_k, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        # Chapter 11's options, None where off (then not sub-modules: the paper's module is unchanged).
        self.q_norm: nn.Module | None = qk_norm(d_k) if qk_norm is not None else None
        self.k_norm: nn.Module | None = qk_norm(d_k) if qk_norm is not None else None
        self.rotary = rotary
        self.record_weights = record_weights
        self.attention_weights: Tensor | None = None

    def split_heads(self, x: Tensor, n_heads: int | None = None) -> Tensor:
        """(B, L, n_heads * d_k) -> (B, n_heads, L, d_k): give each head its own slice of the features.
        n_heads: H (the default), or H_kv for keys and values."""
        batch, length, _ = x.shape
        heads = self.n_heads if n_heads is None else n_heads
        return x.view(batch, length, heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, d_k) -> (B, L, H * d_k): concatenate the heads again (H * d_k = D unless d_k was given).

        `transpose` makes the tensor non-contiguous, so `view` needs `contiguous()` first
        (one of note 002's common mistakes).
        """
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).contiguous().view(batch, length, self.n_heads * self.d_k)  # (B, L, H * d_k)

    def norm_and_rotate(self, x: Tensor, norm: nn.Module | None, start: int = 0) -> Tensor:
        """Chapter 11's QK norm and rotary positions of queries or keys (B, heads, L, d_k), where this module has
        them (the tensor unchanged otherwise). `start` is the position of the first of the L."""
        if norm is not None:
            x = norm(x)  # (B, heads, L, d_k), each head's vector normalised
        if self.rotary is not None:
            x = self.rotary(x, start)  # (B, heads, L, d_k), turned by positions start .. start + L - 1
        return x

    def project_kv(self, key: Tensor, value: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Project keys and values and split them into heads: two (B, H_kv, S, d_k) tensors.

        Separate from `attend` so that a decoder can cache them (see `DecoderCache`); with rotary positions,
        `start` is the position of the first key.
        """
        k = self.norm_and_rotate(self.split_heads(self.w_k(key), self.n_kv_heads), self.k_norm, start)
        return k, self.split_heads(self.w_v(value), self.n_kv_heads)

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, start: int = 0) -> Tensor:
        """Project the queries and attend to already projected keys and values.

        Shape:
            query (B, T, D); k, v (B, H_kv, S, d_k); mask broadcastable to (B, H, T, S). Returns (B, T, D).
            With rotary positions, `start` is the position of the first query.
        """
        if mask is not None and not is_trusted():
            check_mask("mask", mask, (query.shape[0], self.n_heads, query.shape[1], k.shape[2]), device=query.device)
        return self._attend(query, k, v, mask, start)

    def _attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, start: int = 0) -> Tensor:
        q = self.norm_and_rotate(self.split_heads(self.w_q(query)), self.q_norm, start)  # (B, H, T, d_k)
        if self.record_weights:
            group = self.n_heads // self.n_kv_heads
            k, v = repeat_kv_heads(k, group), repeat_kv_heads(v, group)  # (B, H, S, d_k) each
            heads, weights = attention(q, k, v, mask, self.dropout)  # (B, H, T, d_k)
            self.attention_weights = weights.detach()  # (B, H, T, S)
        else:
            heads = self._fused_attention(q, k, v, mask)  # (B, H, T, d_k)
            self.attention_weights = None
        return self.w_o(self.merge_heads(heads))  # (B, T, D)

    def _fused_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """PyTorch's fused attention, (B, H, T, d_k) queries against (B, H_kv, S, d_k) keys and values; it
        shares each key/value head among its group of query heads itself (`enable_gqa`).

        A mask that is exactly the causal one (T = S, True on and below the diagonal, as GPT's) is given to the
        kernel as `is_causal=True` instead, as nanoGPT does: the kernel then skips the blocks above the diagonal
        and never reads the mask. The result is the same to the bit on a CPU (tested). It is done only without
        dropout, whose random draws the two calls might make in another order."""
        dropout_p = self.dropout.p if self.training else 0.0
        gqa = self.n_kv_heads != self.n_heads
        if dropout_p == 0.0 and _is_causal(mask, q.shape[-2], k.shape[-2]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attend from `query` to `key`/`value`; self-attention is `forward(x, x, x)`. With rotary positions the
        queries and keys sit at positions 0, 1, ... (a KV cache passes later ones to `project_kv` and `attend`)."""
        if not is_trusted():
            self.check_inputs(query, key, value, mask)
        if not self.record_weights and key is value:
            return self._fast_forward(query, key, mask)
        k, v = self.project_kv(key, value)  # (B, H_kv, S, d_k) each
        return self._attend(query, k, v, mask)

    def check_inputs(self, query: object, key: object, value: object, mask: object = None) -> None:
        """The checks of `forward`: float (B, T, D) / (B, S, D) tensors of this module's dtype and device,
        one batch size, and a bool mask broadcastable to (B, H, T, S) on the same device."""
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            check_tensor(name, tensor, dim=3)
            assert isinstance(tensor, Tensor)
            check_float(name, tensor)
            check_last_dim(name, tensor, self.d_model)
            check_like_module(name, tensor, self)
        assert isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)
        if key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must have the same batch size B, got {query.shape[0]}, "
                f"{key.shape[0]} and {value.shape[0]}"
            )
        if value.shape[1] != key.shape[1]:
            raise ValueError(
                f"key and value must have the same length S, got shapes {tuple(key.shape)} and {tuple(value.shape)}"
            )
        if mask is not None:
            shape = (query.shape[0], self.n_heads, query.shape[1], key.shape[1])
            check_mask("mask", mask, shape, device=query.device)

    def packed_projections(self, with_queries: bool = True) -> tuple[Tensor, Tensor | None]:
        """[W^Q; W^K; W^V] (or [W^K; W^V] without queries) stacked into one (H d_k + 2 H_kv d_k, D) weight (3D rows
        for the paper's sizes), and the biases likewise: one matmul then projects all of them (the fast path's, and
        GPT's one-token step's). `packed_sizes` says where each part ends."""
        layers = (self.w_q, self.w_k, self.w_v) if with_queries else (self.w_k, self.w_v)
        weight = torch.cat([layer.weight for layer in layers])  # (sum of packed_sizes, D)
        return weight, torch.cat([layer.bias for layer in layers]) if self.w_q.bias is not None else None

    def packed_sizes(self, with_queries: bool = True) -> list[int]:
        """The rows of queries, keys and values (or keys and values) in `packed_projections`, in that order."""
        kv = self.n_kv_heads * self.d_k
        return [self.n_heads * self.d_k, kv, kv] if with_queries else [kv, kv]

    def _fast_forward(self, query: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """Fast path only (performance, tested equal to the explicit path): when keys and values come
        from one tensor, project them with ONE matmul against the stacked weights [W^K; W^V], and for
        self-attention (query is memory too) all three with [W^Q; W^K; W^V], as `nn.MultiheadAttention`
        does with its packed `in_proj_weight`. The parameters stay w_q, w_k, w_v."""
        packed = F.linear(memory, *self.packed_projections(query is memory))  # (B, S, sum of packed_sizes)
        parts = packed.split(self.packed_sizes(query is memory), dim=-1)  # views, (B, S, heads * d_k) each
        if query is memory:
            q = self.split_heads(parts[0])  # (B, H, T, d_k)
            k, v = (self.split_heads(part, self.n_kv_heads) for part in parts[1:])  # (B, H_kv, S, d_k) each
        else:
            q = self.split_heads(self.w_q(query))  # (B, H, T, d_k)
            k, v = (self.split_heads(part, self.n_kv_heads) for part in parts)  # (B, H_kv, S, d_k) each
        q, k = self.norm_and_rotate(q, self.q_norm), self.norm_and_rotate(k, self.k_norm)  # positions 0, 1, ...
        out = self._fused_attention(q, k, v, mask)  # (B, H, T, d_k)
        self.attention_weights = None
        return self.w_o(self.merge_heads(out))  # (B, T, D)

    def extra_repr(self) -> str:
        grouped = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}{grouped}, d_k={self.d_k}, "
            f"record_weights={self.record_weights}"
        )


def record_attention(model: nn.Module, on: bool = True) -> nn.Module:
    """The one switch between the explicit and the fast path of a whole model (chapters 03, 09).

    Sets `record_weights = on` on every `MultiHeadAttention` inside `model` and `fused = not on` on
    every `LayerNorm`. On: the explicit path, attention weights kept for plotting, LayerNorm computed
    term by term. Off: PyTorch's fused `F.scaled_dot_product_attention` and `F.layer_norm` (the same
    results, tested; forward hooks on the modules fire on both paths). Returns `model`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(on, bool):
        raise TypeError(f"on must be True or False, got {on!r}")
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.record_weights = on
            module.attention_weights = None
        elif isinstance(module, LayerNorm):
            module.fused = not on
    return model
