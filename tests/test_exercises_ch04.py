"""Chapter 04's exercises: each reference agrees with the library and with PyTorch's own modules (float64)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab.exercises import ch04_normalization as ex


def test_predicted_dims_are_the_ones_nn_batchnorm1d_averages_over() -> None:
    dims = ex.predict_batch_norm_dims.reference()
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (B, D, T)
    bn = nn.BatchNorm1d(5, dtype=torch.float64).train()
    mean, var = x.mean(dim=dims, keepdim=True), x.var(dim=dims, keepdim=True, unbiased=False)
    torch.testing.assert_close(bn(x), (x - mean) / torch.sqrt(var + bn.eps), rtol=0, atol=1e-10)
    assert dims not in ex.predict_batch_norm_dims.explain
    for wrong in ex.predict_batch_norm_dims.explain:  # each explained answer really gives something else
        m, v = x.mean(dim=wrong, keepdim=True), x.var(dim=wrong, keepdim=True, unbiased=False)
        assert not torch.allclose(bn(x), (x - m) / torch.sqrt(v + bn.eps))


def test_dims_in_any_spelling_are_accepted() -> None:
    for spelling in ((0, 2), (2, 0), [0, -1], (-3, 2)):
        assert ex.predict_batch_norm_dims.passes(lambda s=spelling: s)


@pytest.mark.parametrize("case", range(4))
def test_masked_batch_norm_equals_tl_batchnorm_and_pytorch_on_the_real_tokens(case: int) -> None:
    x, mask, gamma, beta, eps = ex.masked_batch_norm.cases[case].inputs()
    x, gamma, beta = x.double(), gamma.double(), beta.double()
    got = ex._masked_batch_norm(x, mask, gamma, beta, eps)
    ours = tl.BatchNorm(x.shape[-1], eps=eps).double().train()
    with torch.no_grad():
        ours.weight.copy_(gamma), ours.bias.copy_(beta)
    torch.testing.assert_close(got, ours(x, mask), rtol=0, atol=1e-10)
    theirs = nn.BatchNorm1d(x.shape[-1], eps=eps, dtype=torch.float64).train()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    with torch.no_grad():
        theirs.weight.copy_(gamma), theirs.bias.copy_(beta)
    torch.testing.assert_close(got[mask], theirs(x[mask]), rtol=0, atol=1e-10)  # (N, D): the real tokens


def test_predicted_eval_output_is_what_batchnorm_gives() -> None:
    four = torch.tensor([2.0, 4.0, 6.0, 8.0], dtype=torch.float64).reshape(1, 4, 1)  # (B, T, D)
    ours = tl.BatchNorm(1).double()
    theirs = nn.BatchNorm1d(1, dtype=torch.float64)
    with torch.no_grad():
        ours(four)  # one training step
        theirs(four.transpose(1, 2))  # (B, D, T)
        ours_eval = ours.eval()(four)[0, 3, 0].item()
        theirs_eval = theirs.eval()(four.transpose(1, 2))[0, 0, 3].item()
        train_value = tl.BatchNorm(1).double()(four)[0, 3, 0].item()
    answer = ex.predict_eval_output.reference()
    assert round(ours_eval, 2) == round(theirs_eval, 2) == answer
    assert math.isclose(ours_eval, theirs_eval, rel_tol=1e-12)
    assert round(train_value, 2) == 1.34 and 1.34 in ex.predict_eval_output.explain
    assert answer not in ex.predict_eval_output.explain
    assert all(str(answer) not in text for text in ex.predict_eval_output.explain.values())


@pytest.mark.parametrize("case", range(5))
def test_layer_norm_reference_equals_nn_layernorm(case: int) -> None:
    x, gamma, beta, *rest = ex.layer_norm.cases[case].inputs()
    eps = rest[0] if rest else 1e-5
    theirs = nn.LayerNorm(x.shape[-1], eps=eps, dtype=torch.float64)
    ours = tl.LayerNorm(x.shape[-1], eps=eps).double()
    with torch.no_grad():
        for module in (theirs, ours):
            module.weight.copy_(gamma), module.bias.copy_(beta)
        torch.testing.assert_close(ex._layer_norm(x, gamma, beta, eps), theirs(x), rtol=0, atol=1e-10)
        torch.testing.assert_close(ex._layer_norm(x, gamma, beta, eps), ours(x), rtol=0, atol=1e-10)


def test_the_notes_layer_norm_is_off_by_the_factor_sqrt_d_minus_1_over_d() -> None:
    """With eps out of the way (eps = 0), the notes' output is sqrt((D-1)/D) times the right one, exactly."""
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ones, zeros = torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    notes = ex.notes_layer_norm(x, ones, zeros, eps=0.0)
    right = F.layer_norm(x, (4,), eps=0.0)
    torch.testing.assert_close(notes, right * math.sqrt(3 / 4), rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", range(6))
def test_rms_norm_reference_equals_nn_rmsnorm(case: int) -> None:
    x, gamma, eps = ex.rms_norm.cases[case].inputs()
    theirs = nn.RMSNorm(x.shape[-1], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.copy_(gamma.double())
        if x.dtype == torch.float64 or x.dtype == torch.float32:
            got = ex._rms_norm(x.double(), gamma.double(), eps)
            torch.testing.assert_close(got, theirs(x.double()), rtol=0, atol=1e-10)
        got = ex._rms_norm(x, gamma, eps)
        assert got.dtype == x.dtype
        expected = F.rms_norm(x, (x.shape[-1],), gamma, eps)  # PyTorch's own, in the input's dtype
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
        assert torch.isfinite(got).all()


def test_rms_norm_is_layer_norm_without_beta_on_zero_mean_vectors() -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = x - x.mean(-1, keepdim=True)
    gamma = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
    torch.testing.assert_close(
        ex._rms_norm(x, gamma, 1e-5), F.layer_norm(x, (8,), gamma, None, 1e-5), rtol=0, atol=1e-10
    )


def test_the_half_precision_case_overflows_without_float32() -> None:
    x, gamma, eps = ex.rms_norm.cases[-1].inputs()
    assert x.dtype == torch.float16 and torch.isinf((x * x).mean(-1)).any()


# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _mbn_weighted_sums(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    keep = mask.unsqueeze(-1).to(x.dtype)
    n = keep.sum()
    mean = (x * keep).sum((0, 1)) / n
    var = (((x - mean) * keep) ** 2).sum((0, 1)) / n
    return gamma * (x - mean) / (var + eps).sqrt() + beta


def _mbn_var_mean(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    var, mean = torch.var_mean(x[mask], dim=0, unbiased=False)
    return (x - mean) * torch.rsqrt(var + eps) * gamma + beta


def _ln_second_moment(x, a_2, b_2, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean * mean
    return a_2 * (x - mean) / torch.sqrt(var + eps) + b_2


def _ln_biased_std_squared(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / (x.std(-1, keepdim=True, unbiased=False) ** 2 + eps) ** 0.5 + beta


def _rms_float64(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.double()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gamma.double()).to(x.dtype)


def _rms_vector_norm(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    rms = torch.linalg.vector_norm(h, dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
    return (h / torch.sqrt(rms * rms + eps) * gamma).type_as(x)


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.predict_batch_norm_dims: [lambda: [2, 0], lambda: (0, -1), lambda: {0, 2}, lambda: torch.tensor([0, 2])],
        ex.masked_batch_norm: [_mbn_weighted_sums, _mbn_var_mean],
        ex.predict_eval_output: [lambda: 5.99, lambda: 5.992, lambda: torch.tensor(5.99)],
        ex.layer_norm: [_ln_second_moment, _ln_biased_std_squared],
        ex.rms_norm: [_rms_float64, _rms_vector_norm],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()


def test_other_normalizations_are_shortcuts_for_layer_norm_and_rms_norm() -> None:
    def by_group_norm(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
        d = x.shape[-1]
        return nn.GroupNorm(1, d, eps=eps, affine=False).to(x.dtype)(x.reshape(-1, d)).reshape(x.shape) * gamma + beta

    assert ex.layer_norm.run(by_group_norm).shortcut
    assert ex.rms_norm.run(ex._rms_with_layer_norm).shortcut
