"""Exercises of chapter 07, the decoder (解码器): notebooks/07_decoder.ipynb.

1. `shift_right`: the decoder's input for teacher forcing, BOS + target[:-1] (easy).
2. `decoder_self_attention_mask`: the causal and padding mask of a padded target batch (medium).
3. `decoder_layer_pre_norm`: one Pre-Norm decoder layer's forward from given sublayers (harder).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_lab.exercises.core import Case, Exercise
from transformer_lab.feedforward import FeedForward
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm

__all__ = ["shift_right", "decoder_self_attention_mask", "decoder_layer_pre_norm"]


# --- 1. shift the targets right ---------------------------------------------------------------


def _shift_reference(tgt: Tensor, bos_id: int) -> Tensor:
    bos = torch.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype)  # (B, 1)
    return torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, T): BOS, then every target token but the last


def _shift_roll(tgt: Tensor, bos_id: int) -> Tensor:
    return torch.roll(tgt, shifts=1, dims=1)  # the last token wraps around to the front


def _shift_left(tgt: Tensor, bos_id: int) -> Tensor:
    bos = torch.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype)
    return torch.cat([tgt[:, 1:], bos], dim=1)


def _shift_keep_all(tgt: Tensor, bos_id: int) -> Tensor:
    bos = torch.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype)
    return torch.cat([bos, tgt], dim=1)  # one position too long


def _shift_in_place(tgt: Tensor, bos_id: int) -> Tensor:
    tgt[:, 1:] = tgt[:, :-1].clone()
    tgt[:, 0] = bos_id
    return tgt


shift_right = Exercise(
    "shift_right",
    reference=_shift_reference,
    cases=[
        Case("one target sentence", lambda: (torch.tensor([[5, 6, 7, 2]]), 1)),
        Case("a batch of two", lambda: (torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]]), 1)),
        Case("a one-token target", lambda: (torch.tensor([[4], [3]]), 1)),
        Case("another BOS id", lambda: (torch.tensor([[3, 4, 5]]), 7)),
    ],
    hints=[
        """
    The decoder's input at position t must be the target token of position t - 1, and position 0
    gets the start token: build a (B, 1) column full of bos_id (torch.full) and concatenate it in
    front of tgt[:, :-1] along dim=1. The result has the same shape as tgt. Don't modify tgt.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_shift_roll, _shift_left, _shift_keep_all, _shift_in_place],
)


# --- 2. the decoder's self-attention mask -----------------------------------------------------


def _mask_reference(tgt: Tensor, pad_id: int) -> Tensor:
    length = tgt.shape[1]
    keep = (tgt != pad_id)[:, None, None, :]  # (B, 1, 1, T): the key is a real token
    causal = torch.ones(length, length, dtype=torch.bool).tril()  # (T, T): key j <= query i
    return keep & causal  # (B, 1, T, T)


def _mask_causal_only(tgt: Tensor, pad_id: int) -> Tensor:
    length = tgt.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal.expand(tgt.shape[0], 1, length, length)


def _mask_triu(tgt: Tensor, pad_id: int) -> Tensor:
    length = tgt.shape[1]
    keep = (tgt != pad_id)[:, None, None, :]
    return keep & torch.ones(length, length, dtype=torch.bool).triu()


def _mask_padding_on_queries(tgt: Tensor, pad_id: int) -> Tensor:
    length = tgt.shape[1]
    keep = (tgt != pad_id)[:, None, :, None]  # (B, 1, T, 1): masks query rows instead of key columns
    return keep & torch.ones(length, length, dtype=torch.bool).tril()


def _mask_blocked_convention(tgt: Tensor, pad_id: int) -> Tensor:
    return ~_mask_reference(tgt, pad_id)  # nn.MultiheadAttention's True = blocked


decoder_self_attention_mask = Exercise(
    "decoder_self_attention_mask",
    reference=_mask_reference,
    cases=[
        Case("no padding", lambda: (torch.tensor([[1, 5, 6, 7]]), 0)),
        Case("a padded batch", lambda: (torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 0, 0]]), 0)),
        Case("a one-token target", lambda: (torch.tensor([[1], [1]]), 0)),
        Case("pad id other than 0", lambda: (torch.tensor([[2, 3, 9, 9], [2, 3, 4, 5]]), 9)),
    ],
    hints=[
        """
    Two conditions, both True for "query i may attend to key j":
    - causal: j <= i, a (T, T) lower triangle (torch.ones(T, T, dtype=torch.bool).tril());
    - padding: key j is a real token, tgt != pad_id, shaped (B, 1, 1, T) so that it masks columns.
    Combine them with & ; broadcasting gives (B, 1, T, T). (tl.target_mask does exactly this.)
    """
    ],
    level="medium",
    kind="build",
    wrong=[_mask_causal_only, _mask_triu, _mask_padding_on_queries, _mask_blocked_convention],
)


# --- 3. a Pre-Norm decoder layer from given sublayers -----------------------------------------


def _layer_reference(
    x: Tensor,
    memory: Tensor,
    self_attn: nn.Module,
    cross_attn: nn.Module,
    feed_forward: nn.Module,
    norm1: nn.Module,
    norm2: nn.Module,
    norm3: nn.Module,
    tgt_mask: Tensor | None = None,
    memory_mask: Tensor | None = None,
) -> Tensor:
    h = norm1(x)  # (B, T, D)
    x = x + self_attn(h, h, h, tgt_mask)  # masked self-attention over the target
    h = norm2(x)
    x = x + cross_attn(h, memory, memory, memory_mask)  # queries from the decoder, keys/values from the encoder
    return x + feed_forward(norm3(x))  # (B, T, D)


def _layer_cross_on_self(
    x, memory, self_attn, cross_attn, feed_forward, norm1, norm2, norm3, tgt_mask=None, memory_mask=None
):  # noqa: ANN001, ANN202, E501
    h = norm1(x)
    x = x + self_attn(h, h, h, tgt_mask)
    h = norm2(x)
    x = x + cross_attn(h, h, h, tgt_mask)  # never looks at the source
    return x + feed_forward(norm3(x))


def _layer_memory_queries(
    x, memory, self_attn, cross_attn, feed_forward, norm1, norm2, norm3, tgt_mask=None, memory_mask=None
):  # noqa: ANN001, ANN202, E501
    h = norm1(x)
    x = x + self_attn(h, h, h, tgt_mask)
    h = norm2(x)
    x = x + cross_attn(memory, h, h, None)  # queries and keys swapped
    return x + feed_forward(norm3(x))


def _layer_normalizes_memory(
    x, memory, self_attn, cross_attn, feed_forward, norm1, norm2, norm3, tgt_mask=None, memory_mask=None
):  # noqa: ANN001, ANN202, E501
    h = norm1(x)
    x = x + self_attn(h, h, h, tgt_mask)
    h, m = norm2(x), norm2(memory)
    x = x + cross_attn(h, m, m, memory_mask)
    return x + feed_forward(norm3(x))


def _layer_no_causal(
    x, memory, self_attn, cross_attn, feed_forward, norm1, norm2, norm3, tgt_mask=None, memory_mask=None
):  # noqa: ANN001, ANN202, E501
    return _layer_reference(x, memory, self_attn, cross_attn, feed_forward, norm1, norm2, norm3, None, memory_mask)


def _decoder_case(batch: int, tgt_len: int, src_len: int, seed: int, padded: bool) -> tuple[object, ...]:
    d_model = 8
    torch.manual_seed(seed)
    self_attn, cross_attn = MultiHeadAttention(d_model, 2), MultiHeadAttention(d_model, 2)
    ff = FeedForward(d_model, 16)
    norms = [LayerNorm(d_model) for _ in range(3)]
    with torch.no_grad():  # gammas and betas away from 1 and 0, so that swapping the norms shows
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, tgt_len, d_model, generator=g)
    memory = torch.randn(batch, src_len, d_model, generator=g)
    tgt_mask = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()  # (T, T)
    memory_mask = None
    if padded:
        lengths = torch.arange(src_len, src_len - batch, -1).clamp(min=1)  # (B,) real source lengths
        memory_mask = (torch.arange(src_len)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return x, memory, self_attn, cross_attn, ff, *norms, tgt_mask, memory_mask


decoder_layer_pre_norm = Exercise(
    "decoder_layer_pre_norm",
    reference=_layer_reference,
    cases=[
        Case("target of 4 tokens, source of 6", lambda: _decoder_case(1, 4, 6, 0, False)),
        Case("a batch with a padded source", lambda: _decoder_case(3, 5, 7, 1, True)),
        Case("target and source of equal length", lambda: _decoder_case(2, 5, 5, 2, False)),
        Case("a one-token target (the first generation step)", lambda: _decoder_case(2, 1, 4, 3, True)),
    ],
    hints=[
        """
    Three Pre-Norm sublayers, each x = x + sublayer(norm_k(x)):
    1. masked self-attention: h = norm1(x); x = x + self_attn(h, h, h, tgt_mask)
    2. cross-attention: h = norm2(x); queries from the decoder (h), keys and values from the
       encoder's output, which is already normalized: x = x + cross_attn(h, memory, memory, memory_mask)
    3. the FFN: x = x + feed_forward(norm3(x))
    """
    ],
    level="medium",
    kind="build",
    wrong=[_layer_cross_on_self, _layer_memory_queries, _layer_normalizes_memory, _layer_no_causal],
)
