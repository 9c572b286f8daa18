"""Exercises of chapter 06, the encoder (编码器): notebooks/06_encoder.ipynb.

1. `count_encoder_layer_parameters`: how many numbers one encoder layer learns (easy).
2. `encoder_layer_pre_norm`: one Pre-Norm encoder layer's forward from given sublayers (medium).
3. `encode_with_padding`: a whole stack applied to a padded batch with its padding mask (harder).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer_lab.encoder import Encoder
from transformer_lab.exercises.core import Case, Exercise
from transformer_lab.feedforward import FeedForward
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm

__all__ = ["count_encoder_layer_parameters", "encoder_layer_pre_norm", "encode_with_padding"]


# --- 1. count the parameters of one encoder layer ---------------------------------------------


def _count_reference(d_model: int, n_heads: int, d_ff: int) -> int:
    attention = 4 * (d_model * d_model + d_model)  # W^Q, W^K, W^V, W^O, each with a bias
    feed_forward = (d_model * d_ff + d_ff) + (d_ff * d_model + d_model)  # W_1, b_1, W_2, b_2
    norms = 2 * (2 * d_model)  # two LayerNorms, each gamma and beta
    return attention + feed_forward + norms  # the number of heads does not change the count


def _count_no_bias(d_model: int, n_heads: int, d_ff: int) -> int:
    return 4 * d_model * d_model + 2 * d_model * d_ff + 4 * d_model


def _count_hidden_is_dim(d_model: int, n_heads: int, d_ff: int) -> int:  # note 000's FFN
    return _count_reference(d_model, n_heads, d_model)


def _count_per_head(d_model: int, n_heads: int, d_ff: int) -> int:
    return (
        n_heads * 4 * (d_model * d_model + d_model)
        + _count_reference(d_model, n_heads, d_ff)
        - 4 * (d_model * d_model + d_model)
    )


def _count_no_norms(d_model: int, n_heads: int, d_ff: int) -> int:
    return _count_reference(d_model, n_heads, d_ff) - 4 * d_model


count_encoder_layer_parameters = Exercise(
    "count_encoder_layer_parameters",
    reference=_count_reference,
    cases=[
        Case("a small layer: d_model=8, n_heads=2, d_ff=32", lambda: (8, 2, 32)),
        Case("one head, d_ff=1", lambda: (4, 1, 1)),
        Case("more heads, same d_model: same count?", lambda: (8, 8, 32)),
        Case("the paper's base layer: d_model=512, h=8, d_ff=2048", lambda: (512, 8, 2048)),
    ],
    hints=[
        """
    Add up the parameters of each part of `tl.EncoderLayer`:
    - self-attention: four Linear(d_model, d_model) layers (W^Q, W^K, W^V, W^O), each a weight
      matrix AND a bias vector;
    - the FFN: Linear(d_model, d_ff) then Linear(d_ff, d_model), again with biases;
    - two LayerNorms, each with gamma and beta of size d_model.
    Splitting into heads only reshapes the projections: n_heads does not change the count.
    Check yourself with sum(p.numel() for p in tl.EncoderLayer(8, 2, 32).parameters()).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_count_no_bias, _count_hidden_is_dim, _count_per_head, _count_no_norms],
)


# --- 2. a Pre-Norm encoder layer from given sublayers -----------------------------------------


def _layer_reference(
    x: Tensor,
    self_attn: nn.Module,
    feed_forward: nn.Module,
    norm1: nn.Module,
    norm2: nn.Module,
    mask: Tensor | None = None,
) -> Tensor:
    h = norm1(x)  # (B, S, D): Pre-Norm normalizes the sublayer's input...
    x = x + self_attn(h, h, h, mask)  # ...and adds the sublayer's output to the raw x
    return x + feed_forward(norm2(x))  # (B, S, D)


def _layer_post_norm(x, self_attn, feed_forward, norm1, norm2, mask=None):  # noqa: ANN001, ANN202
    x = norm1(x + self_attn(x, x, x, mask))
    return norm2(x + feed_forward(x))


def _layer_adds_normalized(x, self_attn, feed_forward, norm1, norm2, mask=None):  # noqa: ANN001, ANN202
    x = norm1(x)
    x = x + self_attn(x, x, x, mask)
    x = norm2(x)
    return x + feed_forward(x)


def _layer_no_mask(x, self_attn, feed_forward, norm1, norm2, mask=None):  # noqa: ANN001, ANN202
    return _layer_reference(x, self_attn, feed_forward, norm1, norm2, None)


def _layer_one_norm(x, self_attn, feed_forward, norm1, norm2, mask=None):  # noqa: ANN001, ANN202
    h = norm1(x)
    x = x + self_attn(h, h, h, mask)
    return x + feed_forward(norm1(x))


def _sublayers(d_model: int, n_heads: int, d_ff: int, seed: int) -> tuple[nn.Module, ...]:
    torch.manual_seed(seed)
    attn = MultiHeadAttention(d_model, n_heads)
    ff = FeedForward(d_model, d_ff)
    norm1, norm2 = LayerNorm(d_model), LayerNorm(d_model)
    with torch.no_grad():  # gammas and betas away from 1 and 0, so that swapping the norms shows
        for norm in (norm1, norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return attn, ff, norm1, norm2


def _layer_case(batch: int, length: int, seed: int, padded: bool) -> tuple[object, ...]:
    d_model = 8
    attn, ff, norm1, norm2 = _sublayers(d_model, 2, 16, seed)
    x = torch.randn(batch, length, d_model, generator=torch.Generator().manual_seed(seed + 1))
    mask = None
    if padded:
        lengths = torch.arange(length, length - batch, -1).clamp(min=1)  # (B,) real lengths
        mask = (torch.arange(length)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return x, attn, ff, norm1, norm2, mask


encoder_layer_pre_norm = Exercise(
    "encoder_layer_pre_norm",
    reference=_layer_reference,
    cases=[
        Case("one sentence of 5 tokens, no mask", lambda: _layer_case(1, 5, 0, False)),
        Case("a batch of 3 with a padding mask", lambda: _layer_case(3, 6, 1, True)),
        Case("a single token", lambda: _layer_case(2, 1, 2, False)),
    ],
    hints=[
        """
    Pre-Norm (the notes' code): each sublayer sees a normalized copy of x, and its output is added
    to x itself (not to the normalized copy):
        h = norm1(x);   x = x + self_attn(h, h, h, mask)
        x = x + feed_forward(norm2(x))
    Self-attention means queries, keys and values all come from the same h; pass the mask on.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_layer_post_norm, _layer_adds_normalized, _layer_no_mask, _layer_one_norm],
)


# --- 3. the stack on a padded batch ------------------------------------------------------------


def _encode_reference(layers: Sequence[nn.Module], norm: nn.Module, x: Tensor, tokens: Tensor, pad_id: int) -> Tensor:
    mask = (tokens != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S): True = real key
    for layer in layers:
        x = layer(x, mask)  # (B, S, D)
    return norm(x)  # LayerNorm for Pre-Norm, identity for Post-Norm


def _encode_no_mask(layers, norm, x, tokens, pad_id):  # noqa: ANN001, ANN202
    for layer in layers:
        x = layer(x)
    return norm(x)


def _encode_inverted_mask(layers, norm, x, tokens, pad_id):  # noqa: ANN001, ANN202
    mask = (tokens == pad_id)[:, None, None, :]  # PyTorch's "True = blocked" convention
    for layer in layers:
        x = layer(x, mask)
    return norm(x)


def _encode_no_final_norm(layers, norm, x, tokens, pad_id):  # noqa: ANN001, ANN202
    mask = (tokens != pad_id)[:, None, None, :]
    for layer in layers:
        x = layer(x, mask)
    return x


def _encode_first_layer_only(layers, norm, x, tokens, pad_id):  # noqa: ANN001, ANN202
    mask = (tokens != pad_id)[:, None, None, :]
    return norm(layers[0](x, mask))


def _stack(norm_first: bool, n_layers: int, seed: int) -> tuple[nn.ModuleList, nn.Module]:
    torch.manual_seed(seed)
    encoder = Encoder(8, 2, 16, n_layers, dropout=0.0, norm_first=norm_first).eval()
    if norm_first:
        with torch.no_grad():
            encoder.norm.weight.uniform_(0.5, 1.5)
    return encoder.layers, encoder.norm


def _encode_case(norm_first: bool, tokens: list[list[int]], seed: int) -> tuple[object, ...]:
    layers, norm = _stack(norm_first, 2, seed)
    ids = torch.tensor(tokens)
    x = torch.randn(*ids.shape, 8, generator=torch.Generator().manual_seed(seed + 1))
    return layers, norm, x, ids, 0


def _real_positions(candidate, layers, norm, x, tokens, pad_id):  # noqa: ANN001, ANN202
    out = candidate(layers, norm, x, tokens, pad_id)
    if not isinstance(out, Tensor) or out.shape[:2] != tokens.shape:
        return out  # let the comparison report the wrong type or shape
    return out[tokens != pad_id]  # (number of real tokens, D): padded positions are not graded


encode_with_padding = Exercise(
    "encode_with_padding",
    reference=_encode_reference,
    cases=[
        Case("Pre-Norm stack, no padding in the batch", lambda: _encode_case(True, [[5, 6, 7, 8]], 0)),
        Case("Pre-Norm stack, a padded batch", lambda: _encode_case(True, [[5, 6, 7, 8], [9, 4, 0, 0]], 1)),
        Case("Post-Norm stack (norm is the identity)", lambda: _encode_case(False, [[3, 0, 0], [3, 4, 5]], 2)),
        Case(
            "a one-token sentence among longer ones", lambda: _encode_case(True, [[7, 0, 0, 0, 0], [1, 2, 3, 4, 5]], 3)
        ),
    ],
    hints=[
        """
    1. The padding mask: True where a token is real, shaped (B, 1, 1, S) so that it broadcasts over
       heads and queries: (tokens != pad_id)[:, None, None, :]  (this is tl.padding_mask).
    2. Run x through every layer in order, giving each the same mask: x = layer(x, mask).
    3. Finish with norm(x): the final LayerNorm of a Pre-Norm stack (the identity for Post-Norm).
    Only the outputs at real tokens are graded.
    """
    ],
    level="medium",
    kind="build",
    run=_real_positions,
    wrong=[_encode_no_mask, _encode_inverted_mask, _encode_no_final_norm, _encode_first_layer_only],
)
