"""Chapter 02's exercises against the library and PyTorch, and what is specific to each.

The generic tests (tests/test_exercises.py) hold every exercise to the checker's promises; here each
reference is proven equal to the finished version it stands for, and the claims the exercises make are tested.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer_lab as tl
from transformer_lab.exercises import ch02_masking as ex

DOUBLE = torch.float64


def _randn(*shape: int, seed: int, dtype: torch.dtype = DOUBLE) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_padding_mask_from_lengths_equals_the_librarys_padding_mask() -> None:
    for lengths, max_len in [([5, 3], 5), ([1], 4), ([4, 4, 2], 6), ([0, 2], 3), ([7], 7)]:
        tokens = torch.zeros(len(lengths), max_len, dtype=torch.long)  # 0 = <pad>
        for b, n in enumerate(lengths):
            tokens[b, :n] = torch.arange(1, n + 1)
        expected = tl.padding_mask(tokens, pad_id=0)
        got = ex.padding_mask_from_lengths.reference(torch.tensor(lengths), max_len)
        assert got.dtype == torch.bool and torch.equal(got, expected)


def test_causal_mask_for_new_tokens_is_the_last_rows_of_the_causal_mask() -> None:
    for n_total in range(1, 8):
        for n_new in range(1, n_total + 1):
            got = ex.causal_mask_for_new_tokens.reference(n_new, n_total)
            assert got.dtype == torch.bool
            assert torch.equal(got, tl.causal_mask(n_total)[n_total - n_new :])


def test_cached_decoding_with_the_new_tokens_mask_equals_the_full_run() -> None:
    """The mask's purpose: the newest T queries against all S keys give the last T rows of the full run."""
    x = _randn(1, 6, 4, seed=1)
    full, _ = tl.scaled_dot_product_attention(x, x, x, mask=tl.causal_mask(6))
    new = x[:, -2:]  # the 2 newest tokens as queries; keys and values: all 6
    mask = ex.causal_mask_for_new_tokens.reference(2, 6)
    out, _ = tl.scaled_dot_product_attention(new, x, x, mask=mask)
    torch.testing.assert_close(out, full[:, -2:], rtol=0, atol=1e-12)
    torch.testing.assert_close(F.scaled_dot_product_attention(new, x, x, attn_mask=mask), out, rtol=0, atol=1e-12)


def test_is_causal_true_in_pytorch_is_top_left_aligned_as_the_why_says() -> None:
    """The exercise's `why` says is_causal=True builds ones(T, S).tril(); if PyTorch changes, the text must too."""
    q, k, v = _randn(1, 2, 4, seed=2), _randn(1, 5, 4, seed=3), _randn(1, 5, 3, seed=4)
    top_left = torch.ones(2, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=top_left),
    )
    assert not torch.equal(top_left, ex.causal_mask_for_new_tokens.reference(2, 5))


def test_predicted_blind_query_is_the_nan_row_of_nn_multiheadattention() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(4, num_heads=1, batch_first=True).double()
    x = _randn(1, 5, 4, seed=5)
    _, weights = mha(x, x, x, attn_mask=tl.causal_mask(5))  # our mask, read as True = blocked
    nan_rows = torch.isnan(weights[0]).all(dim=-1).nonzero().flatten().tolist()
    assert nan_rows == [ex.predict_blind_query.reference()]


def test_predict_explanations_never_give_the_answer(capsys) -> None:  # noqa: ANN001
    exercise = ex.predict_blind_query
    expected = exercise.reference()
    assert expected not in exercise.explain
    for wrong, text in exercise.explain.items():
        exercise.check(lambda wrong=wrong: wrong)
        out = capsys.readouterr().out
        assert "not right" in out and "All correct" not in out
        assert str(expected) not in text.replace("0 to 4", "")


def test_masked_softmax_equals_the_librarys_weights() -> None:
    scores = _randn(2, 2, 5, 5, seed=6)
    for mask in (
        tl.causal_mask(5),
        tl.padding_mask(torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]), pad_id=0),
        tl.target_mask(torch.tensor([[0, 0, 1, 6, 7], [1, 6, 7, 0, 0]]), pad_id=0),  # fully masked rows
    ):
        size = scores.shape[-1]
        eye = torch.eye(size, dtype=DOUBLE)
        _, expected = tl.scaled_dot_product_attention(scores * size**0.5, eye, eye, mask=mask)  # scores @ I / sqrt(S)
        torch.testing.assert_close(ex.masked_softmax.reference(scores, mask), expected, rtol=0, atol=1e-12)


def test_masked_softmax_float16_and_fully_masked_rows() -> None:
    mask = ex._left_padded_mask()
    scores = _randn(1, 1, 5, 5, seed=7, dtype=torch.float32).half()
    weights = ex.masked_softmax.reference(scores, mask)
    assert weights.dtype == torch.float16 and not torch.isnan(weights).any()
    assert torch.equal(weights[0, 0, :2], torch.zeros(2, 5, dtype=torch.float16))
    torch.testing.assert_close(weights[0, 0, 2:].float().sum(-1), torch.ones(3), atol=2e-3, rtol=0)


def test_float32_weights_break_the_float16_step_after_them_as_the_feedback_says() -> None:
    """Exercise 4 names float32 weights for float16 scores: the attention's next step, weights @ value, fails."""
    scores, mask = _randn(4, 4, seed=10, dtype=torch.float32).half(), tl.causal_mask(4)
    value = _randn(4, 3, seed=11, dtype=torch.float32).half()
    wrong = ex._masked_softmax_in_float32(scores, mask)
    assert wrong.dtype == torch.float32
    torch.testing.assert_close(wrong.half(), ex.masked_softmax.reference(scores, mask), atol=2e-3, rtol=2e-3)
    try:
        wrong @ value
    except RuntimeError as error:
        assert "dtype" in str(error)
    else:  # pragma: no cover - a PyTorch that mixes float32 and float16 in a matmul makes the message wrong
        raise AssertionError("float32 @ float16 no longer raises: update exercise 4's float32 feedback")
    assert (ex.masked_softmax.reference(scores, mask) @ value).dtype == torch.float16


def test_the_notes_version_leaks_the_future_and_overflows_float16() -> None:
    """What the pitfall box after exercise 4 says about note 002's -1e9."""
    mask = ex._left_padded_mask()
    leaked = ex._notes_masked_softmax(_randn(1, 1, 5, 5, seed=8), mask)[0, 0, 0]
    torch.testing.assert_close(leaked, torch.full((5,), 0.2, dtype=DOUBLE))  # uniform over all five keys
    tokens = [0, 0, 1, 6, 7]
    assert sum(1 for j, token in enumerate(tokens) if j > 0 and token != 0 and leaked[j] > 0) == 3
    try:
        ex._notes_masked_softmax(_randn(4, 4, seed=9, dtype=torch.float32).half(), tl.causal_mask(4))
    except RuntimeError as error:
        assert "overflow" in str(error)
    else:  # pragma: no cover - a PyTorch that stores -1e9 in float16 would make the pitfall box wrong
        raise AssertionError("masked_fill(-1e9) on float16 no longer raises: update chapter 02's float16 box")


def test_is_causal_cases_mean_what_their_names_say() -> None:
    """Each case's expected answer, from an independent method: the Jacobian's blocks above the diagonal."""
    for case in ex.is_causal.cases:
        fn, x = case.inputs()
        x = x.to(DOUBLE)
        jac = torch.autograd.functional.jacobian(fn, x)  # (B, T, D_out, B, T, D)
        length = x.shape[1]
        leaks = any(
            jac[:, i, :, :, j, :].abs().max() > 0 for i in range(length) for j in range(length) if j > i
        )  # output i depends on a later input j
        assert ("(True)" in case.name) == (not leaks), case.name
        assert ex.is_causal.reference(fn, x) == (not leaks), case.name


def test_the_last_token_test_of_section_6_misses_a_leak() -> None:
    """Why the transfer exists: the wrong answer that changes only the last token is fooled by a case."""
    assert ex._tester_last_only in ex.is_causal.wrong
    fooled = [
        case.name
        for case in ex.is_causal.cases
        if ex._tester_last_only(*case.inputs()) != ex.is_causal.reference(*case.inputs())
    ]
    assert fooled


# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _lengths_loop(lengths, max_len):  # noqa: ANN001, ANN202
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return mask.view(len(lengths), 1, 1, max_len)


def _new_tokens_diagonal(n_new, n_total):  # noqa: ANN001, ANN202
    return torch.ones(n_new, n_total, dtype=torch.bool).tril(diagonal=n_total - n_new)


def _new_tokens_not_triu(n_new, n_total):  # noqa: ANN001, ANN202
    return ~torch.ones(n_new, n_total, dtype=torch.bool).triu(diagonal=n_total - n_new + 1)


def _masked_softmax_nan_to_num(scores, mask):  # noqa: ANN001, ANN202
    return torch.nan_to_num(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), nan=0.0)


def _masked_softmax_empty_rows(scores, mask):  # noqa: ANN001, ANN202
    full = mask.expand(scores.shape)
    weights = torch.softmax(scores.masked_fill(~full, float("-inf")), -1)
    return weights.masked_fill(~full.any(-1, keepdim=True), 0.0)


def _tester_random_suffix(fn, x):  # noqa: ANN001, ANN202
    base = fn(x)
    for t in range(x.shape[1]):
        changed = x.clone()
        changed[:, t:] = torch.randn_like(changed[:, t:])  # every position from t on at once
        if not torch.allclose(fn(changed)[:, :t], base[:, :t]):
            return False
    return True


def _tester_jacobian(fn, x):  # noqa: ANN001, ANN202
    jacobian = torch.autograd.functional.jacobian(fn, x)  # (B, T, D_out, B, T, D)
    return all(not bool(jacobian[:, s, :, :, s + 1 :].any()) for s in range(x.shape[1]))


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.padding_mask_from_lengths: [_lengths_loop],
        ex.causal_mask_for_new_tokens: [_new_tokens_diagonal, _new_tokens_not_triu],
        ex.masked_softmax: [_masked_softmax_nan_to_num, _masked_softmax_empty_rows],
        ex.is_causal: [
            _tester_random_suffix,
            _tester_jacobian,
            ex._tester_by_gradients,
        ],  # autograd works, as in a notebook
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()


def test_blind_query_explains_a_python_index_and_counting_from_one(capsys) -> None:  # noqa: ANN001
    for answer, words in ((-1, "counted from 0"), (5, "numbered from 0")):
        ex.predict_blind_query.check(lambda answer=answer: answer)
        out = capsys.readouterr().out
        assert words in out and "All correct" not in out
