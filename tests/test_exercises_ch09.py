"""Chapter 09's exercises: each reference agrees with the library, PyTorch, or a plain loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lab as tl
from transformer_lab import training
from transformer_lab.exercises import ch09_full_model as ex

torch.set_num_threads(1)


def test_predicted_extra_parameters_are_the_untied_models() -> None:
    counts = {}
    for tied in (True, False):
        with torch.device("meta"):
            model = tl.Transformer(tl.TransformerConfig.base(37000, 37000, tie_embeddings=tied))
        counts[tied] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert counts[tied] == tl.count_parameters(model)["total"]
    assert counts[False] - counts[True] == ex.predict_untied_extra.reference()
    assert ex.predict_untied_extra.reference() not in ex.predict_untied_extra.explain


@pytest.mark.parametrize("case", range(5))
def test_label_smoothed_loss_reference_is_the_librarys(case: int) -> None:
    logits, target, pad_id, eps = ex.label_smoothed_loss.cases[case].inputs()
    logits = logits.double()
    ours = ex._smoothing_reference(logits, target, pad_id, eps)
    torch.testing.assert_close(ours, training.label_smoothed_loss(logits, target, pad_id, eps).double())
    # and the chapter's relation to PyTorch's cross-entropy, position by position
    v = logits.shape[-1]
    flat, y = logits.reshape(-1, v), target.reshape(-1)
    real = y != pad_id
    nll = F.cross_entropy(flat, y, reduction="none")[real]
    log_p = flat.log_softmax(-1)[real]
    per = (1 - eps) * nll + eps / (v - 2) * (-log_p.sum(-1) + log_p[:, pad_id] + log_p.gather(1, y[real, None])[:, 0])
    torch.testing.assert_close(ours, per.mean(), atol=1e-12, rtol=0)


def test_label_smoothed_loss_without_smoothing_is_pytorchs_cross_entropy() -> None:
    logits, target, pad_id, _ = ex.label_smoothed_loss.cases[2].inputs()
    logits = logits.double()
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=pad_id)
    torch.testing.assert_close(ex._smoothing_reference(logits, target, pad_id, 0.0), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize(("d_model", "warmup", "factor"), [(512, 4000, 1.0), (64, 200, 1.0), (256, 1000, 2.0)])
def test_predicted_noam_fractions_are_the_schedules(d_model: int, warmup: int, factor: float) -> None:
    peak = training.noam_lr(warmup, d_model, warmup, factor)
    got = (
        training.noam_lr(warmup // 2, d_model, warmup, factor) / peak,
        training.noam_lr(4 * warmup, d_model, warmup, factor) / peak,
    )
    assert got == pytest.approx(ex.predict_noam_fractions.reference(), rel=1e-12)
    assert ex.predict_noam_fractions.reference() not in ex.predict_noam_fractions.explain


@pytest.mark.parametrize("case", range(6))
def test_gnmt_scores_reference_is_a_plain_loop(case: int) -> None:
    log_probs, tokens, pad_id, alpha = ex.gnmt_scores.cases[case].inputs()
    expected = []
    for k in range(tokens.shape[0]):
        total, n = 0.0, 0
        for t in range(tokens.shape[1]):
            if tokens[k, t].item() == pad_id:
                break
            total += log_probs[k, t, tokens[k, t]].item()
            n += 1
        expected.append(total / ((5 + n) / 6) ** alpha)
    got = ex._gnmt_reference(log_probs.double(), tokens, pad_id, alpha)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=1e-6)


def test_gnmt_penalty_prefers_the_longer_answer_that_the_plain_sum_rejects() -> None:
    # a short answer with log P = -2.0 over 4 tokens, a long one with -2.6 over 11 tokens
    short, long = -2.0, -2.6
    assert short > long  # alpha = 0: the plain sum picks the short one
    assert short / ((5 + 4) / 6) ** 0.6 < long / ((5 + 11) / 6) ** 0.6  # alpha = 0.6 picks the long one
    assert math.isclose(((5 + 1) / 6) ** 0.6, 1.0)  # lp(1) = 1: one token is not penalised
