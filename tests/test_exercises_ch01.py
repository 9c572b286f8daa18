"""Chapter 01's exercises against the library and PyTorch (float64), and what is specific to each.

The generic tests (tests/test_exercises.py) already hold every exercise to the checker's promises; here each
reference is proven equal to the finished version it replaces, and each prediction to what the code computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import transformer_lab as tl
from transformer_lab.exercises import ch01_attention as ex

DOUBLE = torch.float64


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DOUBLE)


def test_softmax_rows_equals_torch_softmax() -> None:
    for shape, scale in [((3,), 1.0), ((4, 5), 1.0), ((2, 3, 7), 1.0), ((2, 2, 3, 6), 1000.0)]:
        scores = _randn(*shape, seed=len(shape)) * scale
        torch.testing.assert_close(ex.softmax_rows.reference(scores), torch.softmax(scores, dim=-1), rtol=0, atol=1e-12)


def test_softmax_rows_cases_are_finite_where_the_naive_formula_is_not() -> None:
    """The large-score cases are there to fail the naive formula: prove that they do."""
    large = [case for case in ex.softmax_rows.cases if "2000" in case.name]
    assert large
    for case in large:
        (scores,) = case.inputs()
        assert torch.isfinite(ex.softmax_rows.reference(scores)).all()
        naive = scores.exp() / scores.exp().sum(-1, keepdim=True)
        assert not torch.isfinite(naive).all()


def test_attention_equals_the_library_and_pytorch_with_and_without_masks() -> None:
    query, key, value = _randn(2, 2, 3, 8, seed=1), _randn(2, 2, 6, 8, seed=2), _randn(2, 2, 6, 5, seed=3)
    masks = [
        None,
        torch.ones(6, dtype=torch.bool).repeat(3, 1).tril(diagonal=3),  # (T, S), every row sees a key
        torch.tensor([[True] * 4 + [False] * 2, [True] * 6])[:, None, None, :],  # (B, 1, 1, S) padding
    ]
    for mask in masks:
        out, weights = ex.attention.reference(query, key, value, mask)
        lib_out, lib_weights = tl.scaled_dot_product_attention(query, key, value, mask=mask)
        torch.testing.assert_close(out, lib_out, rtol=0, atol=1e-10)
        torch.testing.assert_close(weights, lib_weights, rtol=0, atol=1e-10)
        torch.testing.assert_close(
            out, F.scaled_dot_product_attention(query, key, value, attn_mask=mask), atol=1e-10, rtol=0
        )


def test_attention_cases_never_mask_a_whole_row() -> None:
    """Chapter 01 leaves a query that may see no key to chapter 02 (its masked_softmax exercise)."""
    for case in ex.attention.cases:
        inputs = case.inputs()
        if len(inputs) == 4:
            query, key, _, mask = inputs
            full = mask.expand(*torch.broadcast_shapes(mask.shape, (*query.shape[:-1], key.shape[-2])))
            assert full.any(dim=-1).all(), case.name


def test_the_notes_attention_is_a_known_wrong_answer_and_fails_only_on_masks() -> None:
    assert ex._notes_attention in ex.attention.wrong
    result = ex.attention.run(ex._notes_attention)
    for case, (ok, _line) in zip(ex.attention.cases, result.lines, strict=True):
        assert ok == (len(case.inputs()) == 3), case.name  # right without a mask, wrong with one


def test_distance_attention_equals_dot_product_attention_with_a_key_penalty() -> None:
    """What the exercise's `why` claims: -|q - k|^2 / 2 = q.k - |k|^2 / 2 - |q|^2 / 2, and the last term cancels."""
    query, key, value = _randn(2, 4, 3, seed=4), _randn(2, 7, 3, seed=5), _randn(2, 7, 2, seed=6)
    out, weights = ex.distance_attention.reference(query, key, value)
    scores = -0.5 * torch.cdist(query, key) ** 2
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1), rtol=0, atol=1e-10)
    penalty = -0.5 * (key * key).sum(-1)[:, None, :]  # (B, 1, S)
    via_dot = F.scaled_dot_product_attention(query, key, value, attn_mask=penalty, scale=1.0)
    torch.testing.assert_close(out, via_dot, rtol=0, atol=1e-10)


def test_distance_attention_is_not_dot_product_attention() -> None:
    """The cases tell the two apart (else the transfer would be the chapter's own attention)."""
    for case in ex.distance_attention.cases[:3]:
        query, key, value = case.inputs()
        ours, _ = ex.distance_attention.reference(query, key, value)
        dot, _ = tl.scaled_dot_product_attention(query, key, value)
        assert not torch.allclose(ours, dot, atol=1e-3), case.name


def test_predicted_zero_query_answer_is_what_the_look_up_computes() -> None:
    keys, prices = torch.tensor(ex.FRUIT_KEYS, dtype=DOUBLE), torch.tensor(ex.FRUIT_PRICES, dtype=DOUBLE)
    weights = torch.softmax(keys @ torch.zeros(2, dtype=DOUBLE), dim=0)
    assert math.isclose(ex.predict_zero_query.reference(), (weights @ prices).item(), abs_tol=1e-12)


def test_fruit_keys_are_the_notebooks() -> None:
    import json
    import pathlib

    notebook = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "01_attention.ipynb"
    source = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"])
    assert "keys = torch.tensor([[1.0, 0.2], [0.3, 1.0], [0.9, -0.8]])" in source
    assert "values = torch.tensor([[3.0], [1.0], [8.0]])" in source
    assert [list(k) for k in ex.FRUIT_KEYS] == [[1.0, 0.2], [0.3, 1.0], [0.9, -0.8]]
    assert list(ex.FRUIT_PRICES) == [3.0, 1.0, 8.0]


def test_predicted_output_shape_is_the_librarys() -> None:
    B, T, S, d_k, d_v = 2, 3, 5, 4, 2  # noqa: N806
    out, _ = tl.scaled_dot_product_attention(
        _randn(B, T, d_k, seed=7), _randn(B, S, d_k, seed=8), _randn(B, S, d_v, seed=9)
    )
    assert ex.predict_output_shape.reference() == tuple(out.shape)


def test_predict_explanations_never_give_the_answer(capsys) -> None:  # noqa: ANN001
    for exercise in (ex.predict_zero_query, ex.predict_output_shape):
        expected = exercise.reference()
        assert expected not in exercise.explain
        for wrong, text in exercise.explain.items():
            exercise.check(lambda wrong=wrong: wrong)
            out = capsys.readouterr().out
            assert "not right" in out and "All correct" not in out
            assert repr(expected) not in out and str(expected) not in text


# --- right answers in other styles than the reference's: each must pass (a false rejection is the worst bug) ---


def _softmax_amax_loop(scores: torch.Tensor) -> torch.Tensor:
    flat = scores.reshape(-1, scores.shape[-1])
    out = torch.empty_like(flat)
    for i in range(flat.shape[0]):
        row = flat[i] - flat[i].amax()
        out[i] = row.exp() / row.exp().sum()
    return out.reshape(scores.shape)


def _softmax_in_float64(scores: torch.Tensor) -> torch.Tensor:
    d = scores.double()
    e = (d - d.max(-1, keepdim=True).values).exp()
    return (e / e.sum(-1, keepdim=True)).to(scores.dtype)


def _attention_einsum_where(query, key, value, mask=None):  # noqa: ANN001, ANN202
    scores = torch.einsum("...td,...sd->...ts", query, key) / query.shape[-1] ** 0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf")))
    exps = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = exps / exps.sum(-1, keepdim=True)
    return torch.einsum("...ts,...sd->...td", weights, value), weights


def _attention_minus_1e9(query, key, value, mask=None):  # noqa: ANN001, ANN202
    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(key.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)  # fine here: every query sees a key, float32
    weights = F.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_mask_on_exps(query, key, value, mask=None):  # noqa: ANN001, ANN202
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    exps = (scores - scores.max(-1, keepdim=True).values).exp()
    if mask is not None:
        exps = exps * mask
    weights = exps / exps.sum(-1, keepdim=True)
    return weights @ value, weights


def _distance_expanded(query, key, value):  # noqa: ANN001, ANN202
    square = (query**2).sum(-1, keepdim=True) + (key**2).sum(-1).unsqueeze(-2) - 2 * query @ key.transpose(-2, -1)
    weights = torch.softmax(-0.5 * square, -1)
    return weights @ value, weights


def _distance_vector_norm(query, key, value):  # noqa: ANN001, ANN202
    distance = torch.linalg.vector_norm(query.unsqueeze(-2) - key.unsqueeze(-3), dim=-1)
    weights = F.softmax(-0.5 * distance**2, dim=-1)
    return weights @ value, weights


def _distance_key_penalty(query, key, value):  # noqa: ANN001, ANN202
    weights = torch.softmax(query @ key.transpose(-2, -1) - 0.5 * (key * key).sum(-1)[..., None, :], -1)
    return weights @ value, weights


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.softmax_rows: [_softmax_amax_loop, _softmax_in_float64],
        ex.attention: [_attention_einsum_where, _attention_minus_1e9, _attention_mask_on_exps],
        ex.distance_attention: [_distance_expanded, _distance_vector_norm, _distance_key_penalty],
        ex.predict_zero_query: [lambda: 4, lambda: torch.tensor(4.0), lambda: 12 / 3],
        ex.predict_output_shape: [lambda: torch.Size([2, 3, 2]), lambda: [2, 3, 2]],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()


def test_the_librarys_core_attention_and_logsumexp_are_shortcuts() -> None:
    core = tl.attention.attention
    assert ex.attention.run(lambda q, k, v, mask=None: core(q, k, v, mask)).shortcut
    assert ex.softmax_rows.run(lambda s: (s - s.logsumexp(-1, keepdim=True)).exp()).shortcut
    assert ex.softmax_rows.run(lambda s: torch.ops.aten._softmax.default(s, -1, False)).shortcut
