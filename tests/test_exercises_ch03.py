"""Chapter 03's exercises: each reference agrees with the library and with PyTorch's own modules."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab.exercises import ch03_multihead as ex


def test_predicted_strides_are_the_tensors() -> None:
    q = torch.randn(2, 3, 8)  # (B, T, D) as in the notebook
    assert q.view(2, 3, 2, 4).transpose(1, 2).stride() == ex.predict_split_strides.reference()
    assert ex.predict_split_strides.reference() not in ex.predict_split_strides.explain


@pytest.mark.parametrize("case", range(5))
def test_split_qkv_reference_equals_the_librarys_split_of_a_fused_projection(case: int) -> None:
    qkv, n_heads = ex.split_qkv.cases[case].inputs()
    d_model = qkv.shape[-1] // 3
    torch.manual_seed(case)
    mha = tl.MultiHeadAttention(d_model, n_heads).double()
    c_attn = nn.Linear(d_model, 3 * d_model).double()  # nanoGPT's fused projection, weight (3D, D)
    with torch.no_grad():
        c_attn.weight.copy_(torch.cat([mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]))
        c_attn.bias.copy_(torch.cat([mha.w_q.bias, mha.w_k.bias, mha.w_v.bias]))
    x = torch.randn(qkv.shape[0], qkv.shape[1], d_model, dtype=torch.float64)
    with torch.no_grad():
        got = ex._split_qkv_reference(c_attn(x), n_heads)
        expected = (mha.split_heads(mha.w_q(x)), mha.split_heads(mha.w_k(x)), mha.split_heads(mha.w_v(x)))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_split_qkv_reference_matches_pytorchs_packed_in_projection() -> None:
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        qkv = F.linear(x, theirs.in_proj_weight, theirs.in_proj_bias)  # (B, T, 3D): PyTorch's packed layout
        q, k, v = ex._split_qkv_reference(qkv, 2)
        w_q, w_k, w_v = theirs.in_proj_weight.chunk(3)
        b_q, b_k, b_v = theirs.in_proj_bias.chunk(3)
        for got, w, b in ((q, w_q, b_q), (k, w_k, b_k), (v, w_v, b_v)):
            torch.testing.assert_close(got, (x @ w.T + b).view(2, 3, 2, 4).transpose(1, 2), rtol=0, atol=1e-12)


def test_predicted_parameter_count_is_the_modules() -> None:
    ours = sum(p.numel() for p in tl.MultiHeadAttention(512, 8).parameters())
    theirs = sum(p.numel() for p in nn.MultiheadAttention(512, 8).parameters())
    assert ours == theirs == ex.predict_mha_parameters.reference()
    assert ex.predict_mha_parameters.reference() not in ex.predict_mha_parameters.explain


def test_a_heads_projection_reads_the_whole_token_as_the_feedback_says() -> None:
    """Exercise 3's feedback on 133,120 and 16,640: head i's W_i^Q is (D, d_k), a slice of w_q, not (d_k, d_k)."""
    mha, d_k = tl.MultiHeadAttention(512, 8), 64
    x = torch.randn(2, 3, 512)
    head_1 = mha.w_q.weight[d_k : 2 * d_k]  # (d_k, D) in nn.Linear's (out, in) layout: W_1^Q is its transpose
    assert tuple(head_1.T.shape) == (512, d_k)
    torch.testing.assert_close(mha.split_heads(mha.w_q(x))[:, 1], x @ head_1.T + mha.w_q.bias[d_k : 2 * d_k])
    assert 8 * 4 * (d_k * d_k + d_k) in ex.predict_mha_parameters.explain
    assert 4 * (d_k * d_k + d_k) in ex.predict_mha_parameters.explain


def test_scaling_by_d_model_is_a_different_answer_unless_one_head() -> None:
    """The sqrt(D) mistake of exercise 5 differs from the reference whenever H > 1."""
    inputs = ex.grouped_query_attention.cases[0].inputs()
    with torch.no_grad():
        wrong = ex._gqa_scale_by_model_width(*inputs)
        right = ex.grouped_query_attention.reference(*inputs)
    assert not torch.allclose(wrong, right)


@pytest.mark.parametrize("d_model", [1, 4, 8, 16])
def test_four_projections_look_like_the_librarys(d_model: int) -> None:
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(d_model, 1)
    library = ex._describe_projections(lambda d: [mha.w_q, mha.w_k, mha.w_v, mha.w_o], d_model)
    assert ex._describe_projections(ex._four_projections_reference, d_model) == library
    assert library["parameters"] == sum(p.numel() for p in mha.parameters()) == 4 * (d_model * d_model + d_model)


def test_the_notes_projections_share_one_layer_and_give_symmetric_scores() -> None:
    torch.manual_seed(0)
    shared = ex.notes_four_projections(8)
    assert ex._describe_projections(ex.notes_four_projections, 8)["parameters"] == 72
    x = torch.randn(5, 8)
    with torch.no_grad():
        scores = shared[0](x) @ shared[1](x).T
        torch.testing.assert_close(scores, scores.T)
        separate = ex._four_projections_reference(8)
        scores = separate[0](x) @ separate[1](x).T
        assert not torch.allclose(scores, scores.T)


def test_deepcopy_of_a_repeated_list_stays_shared() -> None:
    """The pitfall box says so: deepcopy copies each object once and keeps the sharing it finds."""
    copies = copy.deepcopy([nn.Linear(4, 4)] * 4)
    assert all(layer is copies[0] for layer in copies)
    independent = [copy.deepcopy(copies[0]) for _ in range(4)]
    assert len({id(layer.weight) for layer in independent}) == 4


def _case_in_float64(case: int) -> tuple:
    x, w_q, w_k, w_v, w_o, n_heads = ex.grouped_query_attention.cases[case].inputs()
    return (x.double(), w_q.double(), w_k.double(), w_v.double(), w_o.double(), n_heads)


@pytest.mark.parametrize("case", range(5))
def test_gqa_reference_equals_pytorchs_grouped_attention(case: int) -> None:
    x, w_q, w_k, w_v, w_o, n_heads = _case_in_float64(case)
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    with torch.no_grad():
        q = w_q(x).view(batch, length, n_heads, d_k).transpose(1, 2)
        k = w_k(x).view(batch, length, -1, d_k).transpose(1, 2)
        v = w_v(x).view(batch, length, -1, d_k).transpose(1, 2)
        heads = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # PyTorch's own grouping
        expected = w_o(heads.transpose(1, 2).reshape(batch, length, d_model))
        torch.testing.assert_close(ex._gqa_reference(x, w_q, w_k, w_v, w_o, n_heads), expected, rtol=0, atol=1e-10)


def test_gqa_with_as_many_kv_heads_as_query_heads_is_multi_head_attention() -> None:
    x, w_q, w_k, w_v, w_o, n_heads = _case_in_float64(1)
    assert w_k.out_features == x.shape[-1]  # H_kv = H
    ours = tl.MultiHeadAttention(x.shape[-1], n_heads).double()
    for name, layer in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
        getattr(ours, name).load_state_dict(layer.state_dict())
    theirs = nn.MultiheadAttention(x.shape[-1], n_heads, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([w_q.weight, w_k.weight, w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([w_q.bias, w_k.bias, w_v.bias]))
        theirs.out_proj.load_state_dict(w_o.state_dict())
        got = ex._gqa_reference(x, w_q, w_k, w_v, w_o, n_heads)
        torch.testing.assert_close(got, ours(x, x, x), rtol=0, atol=1e-10)
        torch.testing.assert_close(got, theirs(x, x, x, need_weights=False)[0], rtol=0, atol=1e-10)


def test_multi_query_attention_uses_one_key_head_for_every_query_head() -> None:
    x, w_q, w_k, w_v, w_o, n_heads = _case_in_float64(2)
    assert w_k.out_features == x.shape[-1] // n_heads  # H_kv = 1
    with torch.no_grad():
        wide_k, wide_v = nn.Linear(x.shape[-1], x.shape[-1]).double(), nn.Linear(x.shape[-1], x.shape[-1]).double()
        wide_k.weight.copy_(w_k.weight.repeat(n_heads, 1))  # the one key head copied into every head's slice
        wide_k.bias.copy_(w_k.bias.repeat(n_heads))
        wide_v.weight.copy_(w_v.weight.repeat(n_heads, 1))
        wide_v.bias.copy_(w_v.bias.repeat(n_heads))
        torch.testing.assert_close(
            ex._gqa_reference(x, w_q, w_k, w_v, w_o, n_heads),
            ex._gqa_reference(x, w_q, wide_k, wide_v, w_o, n_heads),
            rtol=0,
            atol=1e-10,
        )


# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _split_then_heads(qkv, n_heads):  # noqa: ANN001, ANN202
    batch, length, three_d = qkv.shape
    d = three_d // 3
    return tuple(t.view(batch, length, n_heads, d // n_heads).transpose(1, 2) for t in qkv.split(d, dim=-1))


def _split_unflatten(qkv, n_heads):  # noqa: ANN001, ANN202
    return qkv.unflatten(-1, (3, n_heads, -1)).movedim(2, 0).transpose(2, 3).unbind(0)


def _gqa_grouped_broadcast(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = w_k.out_features // d_k
    q = w_q(x).view(batch, length, n_kv, n_heads // n_kv, d_k).permute(0, 2, 3, 1, 4)  # (B, H_kv, G, T, d_k)
    k = w_k(x).view(batch, length, n_kv, 1, d_k).permute(0, 2, 3, 1, 4)  # (B, H_kv, 1, T, d_k)
    v = w_v(x).view(batch, length, n_kv, 1, d_k).permute(0, 2, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) / d_k**0.5, -1)
    return w_o((weights @ v).reshape(batch, n_heads, length, d_k).transpose(1, 2).reshape(batch, length, d_model))


def _gqa_loop_over_heads(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    d_k = x.shape[-1] // n_heads
    group = n_heads // (w_k.out_features // d_k)
    q_all, k_all, v_all = w_q(x), w_k(x), w_v(x)
    outs = []
    for h in range(n_heads):
        j = h // group
        q, k, v = (t[..., i * d_k : (i + 1) * d_k] for t, i in ((q_all, h), (k_all, j), (v_all, j)))
        outs.append(F.softmax(q @ k.transpose(1, 2) / d_k**0.5, dim=-1) @ v)
    return w_o(torch.cat(outs, dim=-1))


def _gqa_with_chapter_01s_attention(x, w_q, w_k, w_v, w_o, n_heads):  # noqa: ANN001, ANN202
    """The text allows chapter 01's tl.scaled_dot_product_attention (only PyTorch's, which groups itself, is out)."""
    q, k, v, group, _ = ex._gqa_parts(x, w_q, w_k, w_v, n_heads)
    heads, _ = tl.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    return w_o(heads.transpose(1, 2).reshape(x.shape))


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.split_qkv: [_split_then_heads, _split_unflatten],
        ex.four_projections: [
            lambda d: [nn.Linear(d, d) for _ in range(4)],
            lambda d: tuple(nn.Linear(d, d) for _ in range(4)),
            lambda d: nn.ModuleList([copy.deepcopy(m) for m in [nn.Linear(d, d)] * 4]),
        ],
        ex.grouped_query_attention: [_gqa_grouped_broadcast, _gqa_loop_over_heads, _gqa_with_chapter_01s_attention],
        ex.predict_split_strides: [lambda: [24, 4, 8, 1]],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()
