"""Exercises of chapter 03, multi-head attention (多头注意力): notebooks/03_multi_head_attention.ipynb.

1. `predict_split_strides`: the strides of a query tensor after view + transpose (easy, predict).
2. `split_qkv`: nanoGPT's fused `c_attn` output (B, T, 3D) cut into q, k, v heads (medium, build).
3. `predict_mha_parameters`: the parameter count of `tl.MultiHeadAttention(512, 8)` (medium, predict).
4. `four_projections`: note 002's `[nn.Linear(D, D)] * 4` fixed (medium, debug the notes).
5. `grouped_query_attention`: attention whose keys and values have fewer heads than its queries (harder, transfer).

Used in the notebook as `from transformer_lab.exercises import ch03_multihead as exercises`.
Shape legend: B batch, T positions, D d_model, H query heads, H_kv key/value heads, d_k = D / H.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.multihead import MultiHeadAttention, repeat_kv_heads

__all__ = [
    "predict_split_strides",
    "split_qkv",
    "predict_mha_parameters",
    "four_projections",
    "grouped_query_attention",
]


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- 1. predict: the strides after the split ------------------------------------------------------


def _strides_reference() -> tuple[int, int, int, int]:
    # q (2, 3, 8) has strides (24, 8, 1). view(2, 3, 2, 4) moves nothing: strides (24, 8, 4, 1).
    # transpose(1, 2) moves nothing either: it swaps the strides of axes 1 and 2.
    return (24, 4, 8, 1)  # (B, H, T, d_k): next head 4 numbers on, next position 8


predict_split_strides = Exercise(
    "predict_split_strides",
    reference=_strides_reference,
    cases=[Case("your strides for q.view(2, 3, 2, 4).transpose(1, 2)", lambda: ())],
    hints=[
        "Neither view nor transpose copies a number: both only write new strides for the same memory.",
        "After q.view(2, 3, 2, 4) the tensor is still laid out row by row: its last axis has stride 1, and each "
        "axis's stride is the product of the sizes of the axes after it.",
        "view(2, 3, 2, 4) has strides (24, 8, 4, 1). transpose(1, 2) swaps axes 1 and 2: write down what happens "
        "to their strides.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: (24, 12, 4, 1), lambda: (24, 8, 4, 1), lambda: (24, 8, 1), lambda: (2, 2, 3, 4)],
    why=(
        "(24, 4, 8, 1): one step along the head axis jumps 4 numbers, one step along the positions 8. Head h's "
        "4 numbers are still one part of each token's row of 8, beside the other head's, so the tensor is not "
        "contiguous: `view` cannot glue it back without a copy."
    ),
    explain={
        (24, 12, 4, 1): (
            "those are the strides of a NEW (2, 2, 3, 4) tensor laid out row by row. transpose copies nothing: "
            "where do the numbers of head 0, position 1 still sit?"
        ),
        (24, 8, 4, 1): "those are the strides after view, before the transpose. transpose(1, 2) swaps two axes.",
        (24, 8, 1): "that is q before the split; the result has four axes.",
        (2, 2, 3, 4): "that is the SHAPE (B, H, T, d_k). Strides say how far to jump in memory along each axis.",
    },
)


# --- 2. build: nanoGPT's fused c_attn output, cut into heads --------------------------------------


def _split_qkv_reference(qkv: Tensor, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    batch, length, three_d = qkv.shape
    d_k = three_d // (3 * n_heads)
    # each token's 3D features: [q | k | v], and inside each of them [head 0 | head 1 | ...]
    parts = qkv.view(batch, length, 3, n_heads, d_k)  # (B, T, 3, H, d_k)
    parts = parts.permute(2, 0, 3, 1, 4)  # (3, B, H, T, d_k): q/k/v first, heads before positions
    return parts[0], parts[1], parts[2]  # three (B, H, T, d_k)


def _qkv_interleaved(qkv, n_heads):  # noqa: ANN001, ANN202
    batch, length, three_d = qkv.shape
    d_k = three_d // (3 * n_heads)
    parts = qkv.view(batch, length, n_heads, 3, d_k).permute(3, 0, 2, 1, 4)  # per head [q | k | v]: another layout
    return parts[0], parts[1], parts[2]


def _qkv_no_transpose(qkv, n_heads):  # noqa: ANN001, ANN202
    batch, length, three_d = qkv.shape
    d = three_d // 3
    return tuple(t.reshape(batch, n_heads, length, d // n_heads) for t in qkv.split(d, dim=-1))  # mixes positions


def _qkv_strided_heads(qkv, n_heads):  # noqa: ANN001, ANN202
    batch, length, three_d = qkv.shape
    d_k = three_d // (3 * n_heads)
    parts = qkv.view(batch, length, 3, d_k, n_heads).permute(2, 0, 4, 1, 3)  # head h: every H-th feature
    return parts[0], parts[1], parts[2]


def _qkv_positions_first(qkv, n_heads):  # noqa: ANN001, ANN202
    batch, length, three_d = qkv.shape
    parts = qkv.view(batch, length, 3, n_heads, three_d // (3 * n_heads))
    return parts[:, :, 0], parts[:, :, 1], parts[:, :, 2]  # (B, T, H, d_k): heads not moved


def _split_qkv_with_library(qkv, n_heads):  # noqa: ANN001, ANN202
    d = qkv.shape[-1] // 3
    mha = MultiHeadAttention(d, n_heads)
    return tuple(mha.split_heads(t) for t in qkv.split(d, dim=-1))


def _split_qkv_unbound_method(qkv, n_heads):  # noqa: ANN001, ANN202
    d = qkv.shape[-1] // 3
    owner = SimpleNamespace(n_heads=n_heads, d_k=d // n_heads)
    split = getattr(MultiHeadAttention, "split" + "_heads")
    return tuple(split(owner, t) for t in qkv.chunk(3, dim=-1))


split_qkv = Exercise(
    "split_qkv",
    reference=_split_qkv_reference,
    cases=[
        Case("B=1, T=2, D=4, H=2 (numbered features)", lambda: (torch.arange(24.0).view(1, 2, 12), 2)),
        Case("B=2, T=3, D=6, H=3", lambda: (_randn(2, 3, 18, seed=40), 3)),
        Case("one head", lambda: (_randn(2, 4, 12, seed=41), 1)),
        Case("B=2, T=5, D=16, H=4", lambda: (_randn(2, 5, 48, seed=42), 4)),
        Case("a single position, T=1", lambda: (_randn(3, 1, 24, seed=43), 2)),
    ],
    hints=[
        "Write down where feature f of a token's 3D features belongs: which of q, k, v, which head, and which of "
        "that head's d_k features. Those three numbers are new axes.",
        "The 3D features are [q | k | v], and each block of D is [head 0 | head 1 | ...] of d_k each, so a single "
        "view can cut the last axis into (3, H, d_k), in that order (the slowest-changing first).",
        "After qkv.view(B, T, 3, H, d_k), reorder the axes so that q/k/v comes first and the heads come before the "
        "positions: (3, B, H, T, d_k). Then take the three slices along the first axis.",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _qkv_interleaved,
            "the features were read as [q | k | v] inside each head, but c_attn's output is all of q, then all of "
            "k, then all of v, each of them cut into heads: the two splits of the last axis are in the wrong "
            "order.",
        ),
        Mistake(
            _qkv_strided_heads,
            "head h got every H-th feature instead of a block of d_k consecutive features: the head axis and the "
            "d_k axis of the split are in the wrong order.",
        ),
        Mistake(
            _qkv_no_transpose,
            "positions got mixed into the heads: the numbers were cut into (B, H, T, d_k) in memory order, where "
            'positions come before heads, so a "head" holds pieces of several positions (section 2 shows why '
            "the axes must be moved instead).",
        ),
        Mistake(
            _qkv_positions_first,
            "the heads were cut but not moved: each tensor has its axes in the order (B, T, H, d_k), positions "
            "before heads, not (B, H, T, d_k).",
        ),
    ],
    forbidden=[MultiHeadAttention],
    shortcuts=[_split_qkv_with_library, _split_qkv_unbound_method],
    output_names=["your q", "your k", "your v"],
)


# --- 3. predict: the parameters of tl.MultiHeadAttention(512, 8) -----------------------------------


def _parameters_reference() -> int:
    d_model = 512
    per_linear = d_model * d_model + d_model  # an nn.Linear(D, D): a (D, D) weight and a (D,) bias
    return 4 * per_linear  # W^Q, W^K, W^V, W^O; the 8 heads share them: 1,050,624


predict_mha_parameters = Exercise(
    "predict_mha_parameters",
    reference=_parameters_reference,
    cases=[Case("your count for tl.MultiHeadAttention(512, 8)", lambda: ())],
    hints=[
        "Count the layers that hold numbers: which nn.Linear layers does a MultiHeadAttention own, and of what size?",
        "An nn.Linear(D, D) has a (D, D) weight and a bias of D numbers. Section 1 says where the heads' "
        "small matrices W_i^Q are kept.",
        "Four Linear layers W^Q, W^K, W^V, W^O of D * D + D numbers each, with D = 512; the heads only cut the "
        "outputs of these layers into slices.",
    ],
    level="medium",
    kind="predict",
    wrong=[lambda: 4 * 512 * 512, lambda: 8 * 4 * (512 * 512 + 512), lambda: 3 * (512 * 512 + 512)],
    why=(
        "4 (D^2 + D) = 1,050,624 for D = 512, whatever the number of heads: head i owns a slice of d_k rows of each "
        "of W^Q, W^K, W^V and a slice of d_k columns of W^O, so heads add no parameters."
    ),
    explain={
        4 * 512 * 512: "the four weight matrices are right; an nn.Linear also has a bias by default.",
        3 * (512 * 512 + 512): "W^Q, W^K and W^V, right; one more Linear mixes the heads' answers.",
        3 * 512 * 512: "W^Q, W^K and W^V without their biases; one more Linear mixes the heads' answers, and a "
        "Linear has a bias.",
        8 * 4 * (512 * 512 + 512): (
            "the heads do not each have their own (D, D) matrices: section 1 says where head i's W_i^Q is kept."
        ),
        4 * (512 * 64 + 64): "that is the share of ONE head (d_k = 64 rows of each matrix). There are 8 heads.",
        512 * 512 + 512: "that is one nn.Linear(512, 512). How many does the layer have?",
        8 * 4 * (64 * 64 + 64): (
            "each head's W_i^Q is not a (d_k, d_k) matrix: it reads the whole D-wide token and writes d_k features, "
            "so it is (D, d_k) = (512, 64); and W^O reads all the heads' answers together."
        ),
        4 * (64 * 64 + 64): (
            "that is four (d_k, d_k) layers with their biases, as if a head read only d_k features of a token; but "
            "each head's W_i^Q reads the whole D-wide token, and there are 8 heads."
        ),
    },
)


# --- 4. debug the notes: four projections, not one projection four times --------------------------


def _four_projections_reference(d_model: int) -> nn.ModuleList:
    # a NEW nn.Linear on every turn of the loop: four layers, four weights, four biases
    return nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])  # W^Q, W^K, W^V, W^O


def notes_four_projections(d_model: int) -> nn.ModuleList:
    """Note 002's mistake 4 in the course's words: one nn.Linear, listed four times."""
    return nn.ModuleList([nn.Linear(d_model, d_model)] * 4)


def _projections_deepcopy_list(d_model):  # noqa: ANN001, ANN202
    import copy

    return nn.ModuleList(copy.deepcopy([nn.Linear(d_model, d_model)] * 4))  # deepcopy keeps the sharing it finds


def _projections_three_shared(d_model):  # noqa: ANN001, ANN202
    return nn.ModuleList([nn.Linear(d_model, d_model)] + [nn.Linear(d_model, d_model)] * 3)


def _projections_head_size(d_model):  # noqa: ANN001, ANN202
    return nn.ModuleList([nn.Linear(d_model, max(1, d_model // 4)) for _ in range(4)])  # per-head size


def _projections_tied_weight(d_model):  # noqa: ANN001, ANN202
    layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])
    for layer in layers[1:]:
        layer.weight = layers[0].weight  # four modules, one weight
    return layers


def _projections_three(d_model):  # noqa: ANN001, ANN202
    return nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])  # W^Q, W^K, W^V: no W^O


def _projections_no_bias(d_model):  # noqa: ANN001, ANN202
    return nn.ModuleList([nn.Linear(d_model, d_model, bias=False) for _ in range(4)])


def _describe_projections(candidate, d_model):  # noqa: ANN001, ANN202
    """What the check compares: how many layers, how many distinct ones and weights, the parameter count."""
    layers = list(candidate(d_model))  # an nn.ModuleList or a plain list
    weights = [getattr(layer, "weight", None) for layer in layers]
    return {
        "layers": len(layers),
        "all nn.Linear": all(isinstance(layer, nn.Linear) for layer in layers),
        "distinct layers": len({id(layer) for layer in layers}),
        "distinct weights": len({w.data_ptr() for w in weights if isinstance(w, Tensor)}),
        "parameters": sum(p.numel() for p in nn.ModuleList(layers).parameters()),  # shared ones counted once
        "weight shapes": tuple(tuple(w.shape) if isinstance(w, Tensor) else None for w in weights),
    }


#: what each entry of `_projection_facts` is, for the check's messages
PROJECTION_FACTS = [
    "the number of layers",
    "“every layer is an nn.Linear”",
    "the number of distinct layers",
    "the number of distinct weights",
    "the parameter count",
    "the layers' weight shapes",
]


def _projection_facts(candidate, d_model):  # noqa: ANN001, ANN202
    """`_describe_projections` as a tuple, in the order of PROJECTION_FACTS, so a message names each fact."""
    return tuple(_describe_projections(candidate, d_model).values())


def _projections_from_library(d_model):  # noqa: ANN001, ANN202
    mha = MultiHeadAttention(d_model, 1)
    return nn.ModuleList([mha.w_q, mha.w_k, mha.w_v, mha.w_o])


def _projections_from_library_children(d_model):  # noqa: ANN001, ANN202
    cls = getattr(__import__("transformer_lab"), "MultiHead" + "Attention")
    return nn.ModuleList([m for m in cls(d_model, 1).children() if isinstance(m, nn.Linear)])


four_projections = Exercise(
    "four_projections",
    reference=_four_projections_reference,
    cases=[
        Case("D = 8", lambda: (8,)),
        Case("D = 16", lambda: (16,)),
        Case("D = 4", lambda: (4,)),
        Case("D = 1", lambda: (1,)),
    ],
    hints=[
        "Count the nn.Linear objects that notes_four_projections creates. Is it the same number as the entries of "
        "the list?",
        "`[obj] * 4` is a list of four references to ONE object, whatever obj is. The scores come out symmetric "
        "because the 'query' and the 'key' layer are that one object.",
        "Each of the four entries must be its own nn.Linear(d_model, d_model): create a new one for each entry "
        "(a list comprehension calls nn.Linear once per turn), and wrap the list in nn.ModuleList.",
    ],
    level="medium",
    kind="debug",
    run=_projection_facts,
    output_names=PROJECTION_FACTS,
    # the deepcopy of a repeated list gives what the notes' list gives; three shared of four is no common mistake
    wrong=[_projections_deepcopy_list, _projections_three_shared],
    mistakes=[
        Mistake(
            notes_four_projections,
            "the four entries are one and the same layer: a list times 4 repeats one object, it does not make "
            "four layers (and a deepcopy of that list keeps the sharing it finds).",
        ),
        Mistake(
            _projections_tied_weight,
            "four layers, but one weight matrix shared by all four: only their biases are their own.",
        ),
        Mistake(
            _projections_three,
            "three layers: W^O, the output projection that mixes the heads' answers, is missing.",
        ),
        Mistake(
            _projections_head_size,
            "the layers are one head wide: each projection maps the whole width D to D, and a head is a slice of "
            "its output (section 1).",
        ),
        Mistake(
            _projections_no_bias,
            "the layers have no bias: each of the four nn.Linear layers keeps its bias of D numbers, as the "
            "library's do.",
        ),
    ],
    forbidden=[MultiHeadAttention],
    shortcuts=[_projections_from_library, _projections_from_library_children],
)


# --- 5. transfer: grouped-query attention ---------------------------------------------------------


def _gqa_reference(x: Tensor, w_q: nn.Linear, w_k: nn.Linear, w_v: nn.Linear, w_o: nn.Linear, n_heads: int) -> Tensor:
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    n_kv_heads = w_k.out_features // d_k  # keys and values have fewer heads
    group = n_heads // n_kv_heads  # query heads per key/value head
    q = w_q(x).view(batch, length, n_heads, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = w_k(x).view(batch, length, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    v = w_v(x).view(batch, length, n_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
    # query head h uses key/value head h // group: repeat each key/value head `group` times in a row
    k = k.repeat_interleave(group, dim=1)  # (B, H, T, d_k): kv heads 0, 0, 1, 1, ... for group = 2
    v = v.repeat_interleave(group, dim=1)  # (B, H, T, d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, T)
    weights = torch.softmax(scores, dim=-1)
    heads = weights @ v  # (B, H, T, d_k)
    merged = heads.transpose(1, 2).reshape(batch, length, d_model)  # (B, T, D)
    return w_o(merged)  # (B, T, D)


def _gqa_parts(x, w_q, w_k, w_v, n_heads):  # noqa: ANN001, ANN202
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = w_k.out_features // d_k
    q = w_q(x).view(batch, length, n_heads, d_k).transpose(1, 2)
    k = w_k(x).view(batch, length, n_kv, d_k).transpose(1, 2)
    v = w_v(x).view(batch, length, n_kv, d_k).transpose(1, 2)
    return q, k, v, n_heads // n_kv, d_k


def _gqa_finish(q, k, v, w_o, scale):  # noqa: ANN001, ANN202
    batch, _, length, _ = q.shape
    weights = torch.softmax(q @ k.transpose(-2, -1) / scale, dim=-1)
    return w_o((weights @ v).transpose(1, 2).reshape(batch, length, -1))


def _gqa_tiled(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, d_k = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)  # kv heads 0, 1, 0, 1: query head h gets h % H_kv
    return _gqa_finish(q, k, v, w_o, math.sqrt(d_k))


def _gqa_first_kv_head(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, _, d_k = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    return _gqa_finish(q, k[:, :1], v[:, :1], w_o, math.sqrt(d_k))  # every query head uses kv head 0


def _gqa_no_scale(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, _ = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    return _gqa_finish(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), w_o, 1.0)


def _gqa_scale_by_model_width(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, _ = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    scale = math.sqrt(x.shape[-1])  # the width D of all query heads together, not d_k
    return _gqa_finish(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), w_o, scale)


def _gqa_scale_by_kv_width(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, _ = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    scale = math.sqrt(w_k.out_features)  # the width of all key heads together, not d_k
    return _gqa_finish(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), w_o, scale)


def _gqa_no_output_projection(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, d_k = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    return _gqa_finish(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), nn.Identity(), math.sqrt(d_k))


def _gqa_merge_without_transpose(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, d_k = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v  # (B, H, T, d_k)
    return w_o(heads.reshape(x.shape))  # (B, H, T, d_k) read as (B, T, D): positions and heads mixed


def _gqa_case(batch: int, length: int, d_model: int, n_heads: int, n_kv_heads: int, seed: int):
    def inputs() -> tuple:
        generator = torch.Generator().manual_seed(seed)
        d_k = d_model // n_heads
        layers = []
        for out in (d_model, n_kv_heads * d_k, n_kv_heads * d_k, d_model):  # W^Q, W^K, W^V, W^O
            layer = nn.Linear(d_model, out)
            with torch.no_grad():  # nn.Linear's own range, drawn from this case's generator
                bound = 1 / math.sqrt(d_model)
                layer.weight.copy_((torch.rand(out, d_model, generator=generator) * 2 - 1) * bound)
                layer.bias.copy_((torch.rand(out, generator=generator) * 2 - 1) * bound)
            layers.append(layer)
        x = torch.randn(batch, length, d_model, generator=generator)  # (B, T, D)
        return (x, *layers, n_heads)

    return inputs


def _gqa_with_torch(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, _, _ = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    heads = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (B, H, T, d_k)
    return w_o(heads.transpose(1, 2).reshape(x.shape))


def _gqa_with_torch_by_name(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, _ = _gqa_parts(x, w_q, w_k, w_v, n_heads)
    attend = getattr(torch.nn.functional, "scaled_dot_product_" + "attention")
    heads = attend(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    return w_o(heads.transpose(1, 2).reshape(x.shape))


def _gqa_with_library_repeat(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    q, k, v, group, d_k = _gqa_parts(x, w_q, w_k, w_v, n_heads)  # the grouping itself done by the library
    return _gqa_finish(q, repeat_kv_heads(k, group), repeat_kv_heads(v, group), w_o, math.sqrt(d_k))


grouped_query_attention = Exercise(
    "grouped_query_attention",
    reference=_gqa_reference,
    cases=[
        Case("H = 4 query heads, H_kv = 2, B=1, T=3, D=8", _gqa_case(1, 3, 8, 4, 2, seed=60)),
        Case("H_kv = H = 2: ordinary multi-head attention", _gqa_case(2, 4, 8, 2, 2, seed=61)),
        Case("H_kv = 1: multi-query attention", _gqa_case(2, 5, 16, 4, 1, seed=62)),
        Case("H = 6, H_kv = 3, D=12", _gqa_case(2, 4, 12, 6, 3, seed=63)),
        Case("H = 8, H_kv = 2, D=16, one position", _gqa_case(3, 1, 16, 8, 2, seed=64)),
    ],
    hints=[
        "Project and split as usual; only the number of heads differs: q has H heads, k and v have H_kv. Find d_k "
        "from D and H, and H_kv from w_k.out_features.",
        "Before Q K^T, give every query head its key/value head: query head h uses key/value head h // (H / H_kv). "
        "Grow k and v along the head axis (dim=1) from H_kv to H heads in that order; which torch function repeats "
        "each entry several times in a row, rather than the whole sequence?",
        "k.repeat_interleave(H // H_kv, dim=1) and the same for v give (B, H, T, d_k). From there it is the "
        "multi-head attention of section 2: scores scaled by sqrt(d_k), softmax, times v, merge the heads, w_o.",
    ],
    level="harder",
    kind="transfer",
    wrong=[_gqa_first_kv_head],  # taking key/value head 0 for every query head: no common mistake
    mistakes=[
        Mistake(
            _gqa_tiled,
            "query heads were paired with the wrong key/value heads: the key/value heads were repeated as a whole "
            "sequence (0, 1, 0, 1, ...), but section 9 groups CONSECUTIVE query heads, so heads 0 and 1 share "
            "key/value head 0.",
        ),
        Mistake(
            _gqa_no_scale,
            "the weights are too peaked: the scores were not scaled by 1 / sqrt(d_k).",
        ),
        Mistake(
            _gqa_scale_by_model_width,
            "the scores were scaled by sqrt(D), the width of all query heads together, not by sqrt(d_k) of one "
            "head (d_k = D / H): the weights come out too flat.",
        ),
        Mistake(
            _gqa_scale_by_kv_width,
            "the scores were scaled by the width of all key heads together, w_k.out_features, not by the width "
            "d_k of one head.",
        ),
        Mistake(
            _gqa_merge_without_transpose,
            "positions got mixed in the merged output: reading (B, H, T, d_k) straight as (B, T, D) glues the "
            "numbers in memory order, head after head, not position after position.",
        ),
        Mistake(
            _gqa_no_output_projection,
            "the heads were merged but never mixed: w_o, the output projection, was not applied.",
        ),
    ],
    forbidden=["scaled_dot_product_attention", MultiHeadAttention, repeat_kv_heads],
    shortcuts=[_gqa_with_torch, _gqa_with_torch_by_name, _gqa_with_library_repeat],
)
