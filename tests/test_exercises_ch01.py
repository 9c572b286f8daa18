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
    source = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"])
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
