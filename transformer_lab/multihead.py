"""Multi-head attention (多头注意力, chapter 03).

MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                 (paper, section 3.2.2)

The h projections of size d_k = d_model / h are computed by one (d_model x d_model) Linear
each for Q, K and V, then split into heads with view + transpose.

Shape legend: B batch, T queries, S keys, H heads, D d_model, d_k = D / H.
"""

from __future__ import annotations

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
from transformer_lab.normalization import LayerNorm

__all__ = ["MultiHeadAttention", "record_attention"]


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
        d_model: size of the model's vectors (D); must be divisible by n_heads.
        n_heads: number of heads (H, the paper's h).
        dropout: dropout probability on the attention weights.
        bias: whether the four projections have a bias.
        record_weights: keep the last attention weights (explicit path) or not (fast path).

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
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        check_probability("dropout", dropout)
        check_bool("record_weights", record_weights)
        check_bool("bias", bias)
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads so that each head gets d_k = d_model / n_heads "
                f"features: got d_model={d_model}, n_heads={n_heads}"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        # Four separate Linear layers (note 002 warns: `[nn.Linear(...)] * 4` would be ONE layer
        # repeated four times, sharing its weights).
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.record_weights = record_weights
        self.attention_weights: Tensor | None = None

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, d_k): give each head its own slice of the features."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, d_k) -> (B, L, D): concatenate the heads again.

        `transpose` makes the tensor non-contiguous, so `view` needs `contiguous()` first
        (one of note 002's common mistakes).
        """
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).contiguous().view(batch, length, self.d_model)  # (B, L, D)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Project keys and values and split them into heads: two (B, H, S, d_k) tensors.

        Separate from `attend` so that a decoder can cache them (see `DecoderCache`).
        """
        return self.split_heads(self.w_k(key)), self.split_heads(self.w_v(value))

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Project the queries and attend to already projected keys and values.

        Shape:
            query (B, T, D); k, v (B, H, S, d_k); mask broadcastable to (B, H, T, S). Returns (B, T, D).
        """
        if mask is not None and not is_trusted():
            check_mask("mask", mask, (query.shape[0], self.n_heads, query.shape[1], k.shape[2]), device=query.device)
        return self._attend(query, k, v, mask)

    def _attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        q = self.split_heads(self.w_q(query))  # (B, H, T, d_k)
        if self.record_weights:
            heads, weights = attention(q, k, v, mask, self.dropout)  # (B, H, T, d_k)
            self.attention_weights = weights.detach()  # (B, H, T, S)
        else:
            dropout_p = self.dropout.p if self.training else 0.0
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            self.attention_weights = None
        return self.w_o(self.merge_heads(heads))  # (B, T, D)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attend from `query` to `key`/`value`; self-attention is `forward(x, x, x)`."""
        if not is_trusted():
            self.check_inputs(query, key, value, mask)
        if not self.record_weights and key is value:
            return self._fast_forward(query, key, mask)
        k, v = self.project_kv(key, value)  # (B, H, S, d_k) each
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
        """[W^Q; W^K; W^V] (or [W^K; W^V] without queries) stacked into one (n * D, D) weight, and the biases
        likewise: one matmul then projects all of them (the fast path's, and GPT's one-token step's)."""
        layers = (self.w_q, self.w_k, self.w_v) if with_queries else (self.w_k, self.w_v)
        weight = torch.cat([layer.weight for layer in layers])  # (n * D, D)
        return weight, torch.cat([layer.bias for layer in layers]) if self.w_q.bias is not None else None

    def _fast_forward(self, query: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """Fast path only (performance, tested equal to the explicit path): when keys and values come
        from one tensor, project them with ONE matmul against the stacked weights [W^K; W^V], and for
        self-attention (query is memory too) all three with [W^Q; W^K; W^V], as `nn.MultiheadAttention`
        does with its packed `in_proj_weight`. The parameters stay w_q, w_k, w_v."""
        batch, length, _ = query.shape
        n = 3 if query is memory else 2  # queries, keys and values, or keys and values
        packed = F.linear(memory, *self.packed_projections(query is memory))  # (B, S, n * D)
        packed = packed.view(batch, memory.shape[1], n, self.n_heads, self.d_k)  # (B, S, n, H, d_k)
        heads = packed.permute(2, 0, 3, 1, 4)  # (n, B, H, S, d_k)
        if query is memory:
            q, k, v = heads.unbind(0)  # (B, H, T, d_k) each
        else:
            q = self.split_heads(self.w_q(query))  # (B, H, T, d_k)
            k, v = heads.unbind(0)  # (B, H, S, d_k) each
        dropout_p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # (B, H, T, d_k)
        self.attention_weights = None
        return self.w_o(self.merge_heads(out))  # (B, T, D)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, d_k={self.d_k}, record_weights={self.record_weights}"


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
