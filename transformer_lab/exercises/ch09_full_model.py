"""Exercises of chapter 09, the full model (整体 Transformer): notebooks/09_full_model.ipynb.

1. `predict_untied_extra`: how many parameters the base model would gain with untied embeddings (easy, predict).
2. `label_smoothed_loss`: the paper's smoothed cross-entropy, PAD-aware, written out (medium, build).
3. `predict_noam_fractions`: the Noam rate at half and at four times the warm-up, as fractions of the peak
   (medium, predict).
4. `gnmt_scores`: the length-penalised score the paper ranks beam hypotheses by, GNMT's ((5 + n) / 6)^alpha
   (harder, transfer).

Used in the notebook as `from transformer_lab.exercises import ch09_full_model as exercises`.
Shape legend: B batch, T target positions, V vocabulary size, K hypotheses, L their (padded) length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab import training
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.training import label_smoothed_loss as _library_loss

__all__ = ["predict_untied_extra", "label_smoothed_loss", "predict_noam_fractions", "gnmt_scores"]


# --- 1. predict: what tying the three embedding matrices saves ------------------------------------


def _untied_extra_reference() -> int:
    vocab, d_model = 37000, 512
    one_matrix = vocab * d_model  # a (V, d_model) table: 18,944,000 numbers
    # tied: ONE matrix serves the source embedding, the target embedding and the pre-softmax Linear
    # untied: three matrices, so two more (the output Linear of tl.Transformer has no bias)
    return 2 * one_matrix  # 37,888,000


predict_untied_extra = Exercise(
    "predict_untied_extra",
    reference=_untied_extra_reference,
    cases=[Case("your count of the extra parameters of the untied base model", lambda: ())],
    hints=[
        "Which matrices does section 3.4 of the paper share, and what shape does each of them have?",
        "The source embedding, the target embedding and the pre-softmax Linear are each a 37000 x 512 matrix "
        "(the Linear has no bias in tl.Transformer). Tied, the model holds one copy of it.",
        "Untied, the model holds three such matrices instead of one. The extra count is a whole number of "
        "37000 x 512 matrices.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: 37000 * 512, lambda: 3 * 37000 * 512, lambda: 2 * 37000],
    why=(
        "2 x 37000 x 512 = 37,888,000: tied, one (V, d_model) matrix serves three places; untied there are three, "
        "two more than tied. That is more than half the base model again (63 M -> 101 M), all of it in "
        "look-up tables."
    ),
    explain={
        37000 * 512: "that is ONE (V, d_model) matrix. Untied, how many of them does the model hold, and tied?",
        3 * 37000 * 512: "that is all three matrices of the untied model; the tied model already holds one of them.",
        2 * 37000 * 512 + 37000: "the two extra matrices are right; the output Linear of tl.Transformer has no bias.",
        2 * 37000: "a matrix of the embedding has a row of d_model = 512 numbers per token, not one number.",
    },
)


# --- 2. build: the label-smoothed loss -------------------------------------------------------------


def _smoothing_reference(logits: Tensor, target: Tensor, pad_id: int, smoothing: float) -> Tensor:
    vocab = logits.shape[-1]
    log_p = logits - logits.logsumexp(-1, keepdim=True)  # (B, T, V): log-softmax
    q = torch.full_like(log_p, smoothing / (vocab - 2))  # eps spread over V - 2 tokens (not PAD, not y)
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)  # the right token gets 1 - eps
    q[..., pad_id] = 0.0  # PAD is never a right answer
    per_position = -(q * log_p).sum(-1)  # (B, T): cross-entropy against q
    real = target != pad_id  # (B, T): positions that count
    return per_position[real].sum() / real.sum()  # mean over real positions only


def _smoothing_pytorch(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), target.reshape(-1), ignore_index=pad_id, label_smoothing=smoothing)


def _smoothing_counts_pad_positions(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    q = torch.full_like(log_p, smoothing / (logits.shape[-1] - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0
    return -(q * log_p).sum(-1).mean()  # averages over padded positions too


def _smoothing_mass_on_pad(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    q = torch.full_like(log_p, smoothing / (logits.shape[-1] - 1))  # PAD gets a share of eps
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    real = target != pad_id
    return -(q * log_p).sum(-1)[real].mean()


def _smoothing_pad_zeroed_over_v_minus_1(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    q = torch.full_like(log_p, smoothing / (logits.shape[-1] - 1))  # eps / (V - 1), then PAD set to 0
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0
    real = target != pad_id
    return -(q * log_p).sum(-1)[real].mean()


def _smoothing_sum(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    q = torch.full_like(log_p, smoothing / (logits.shape[-1] - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0
    real = target != pad_id
    return -(q * log_p).sum(-1)[real].sum()  # a sum: grows with the batch


def _smoothing_no_minus(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    q = torch.full_like(log_p, smoothing / (logits.shape[-1] - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0
    real = target != pad_id
    return (q * log_p).sum(-1)[real].mean()  # the sum of q log p, a negative number


def _smoothing_added_on_top(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    log_p = logits.log_softmax(-1)
    vocab = logits.shape[-1]
    q = smoothing / (vocab - 2) + (1 - smoothing) * F.one_hot(target, vocab).to(log_p.dtype)  # the right token: both
    q[..., pad_id] = 0
    real = target != pad_id
    return -(q * log_p).sum(-1)[real].mean()


def _smoothing_with_library(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    return training.label_smoothed_loss(logits, target, pad_id, smoothing)


def _smoothing_by_name(logits, target, pad_id, smoothing):  # noqa: ANN001, ANN202
    import transformer_lab as tl

    return getattr(tl.training, "label_smoothed" + "_loss")(logits, target, pad_id, smoothing)


def _logits_case(seed: int, vocab: int = 6, pad_from: int | None = 2, smoothing: float = 0.1):  # noqa: ANN202
    def inputs() -> tuple[Tensor, Tensor, int, float]:
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(2, 4, vocab, generator=generator)  # (B, T, V)
        target = torch.randint(1, vocab, (2, 4), generator=generator)  # (B, T), never PAD = 0
        if pad_from is not None:
            target[1, pad_from:] = 0  # the second answer is shorter: padded
        return logits, target, 0, smoothing

    return inputs


label_smoothed_loss = Exercise(
    "label_smoothed_loss",
    reference=_smoothing_reference,
    cases=[
        Case("no smoothing (plain cross-entropy), no padding", _logits_case(0, pad_from=None, smoothing=0.0)),
        Case("eps = 0.1, no padding", _logits_case(3, pad_from=None)),
        Case("eps = 0.1 with padded positions", _logits_case(1)),
        Case("eps = 0.3, a bigger vocabulary", _logits_case(2, vocab=11, smoothing=0.3)),
        Case("a row that is almost all padding", _logits_case(4, vocab=8, pad_from=1, smoothing=0.2)),
    ],
    hints=[
        "Two steps: the smoothed target q for every position (a (B, T, V) tensor), then the cross-entropy "
        "-sum_c q_c log p_c, averaged. Which positions count in the average?",
        "Start q as a tensor full of eps / (V - 2), shaped like the logits; put 1 - eps at each position's right "
        "token (scatter_ along the last axis with target.unsqueeze(-1)); set the PAD column to 0. log p is "
        "log_softmax of the logits over the last axis.",
        "The loss at a position is -(q * log_p).sum(-1), shape (B, T). Average it over the positions where "
        "target != pad_id only: pick them with that boolean mask (or multiply by it and divide by its sum).",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _smoothing_no_minus,
            "the loss came out negative: log-probabilities are at most 0, and a cross-entropy is a positive number "
            "that shrinks as the model gets better.",
        ),
        Mistake(
            _smoothing_sum,
            "the losses of the positions were added up, not averaged: such a loss grows with the batch and the "
            "length of the answers.",
        ),
        Mistake(
            _smoothing_pytorch,
            "that is PyTorch's label_smoothing, which spreads eps over every token, the right one and PAD "
            "included: another q than the paper's one above.",
        ),
        Mistake(
            _smoothing_mass_on_pad,
            "PAD received a share of eps: PAD is never a right answer, so the smoothed target gives it nothing.",
        ),
        Mistake(
            _smoothing_pad_zeroed_over_v_minus_1,
            "eps was divided by V - 1, but with the right token and PAD left out only V - 2 tokens share it: q then "
            "sums to less than 1.",
        ),
        Mistake(
            _smoothing_added_on_top,
            "the right token got 1 - eps on top of its share of eps, so q no longer sums to 1.",
        ),
        Mistake(
            _smoothing_counts_pad_positions,
            "the padded positions were counted in the average: a position whose target is PAD has nothing to "
            "predict and must not weigh in.",
        ),
    ],
    forbidden=[_library_loss],
    shortcuts=[_smoothing_with_library, _smoothing_by_name],
)


# --- 3. predict: the Noam rate away from its peak ---------------------------------------------------


def _noam_fractions_reference() -> tuple[float, float]:
    # lr(step) = c * min(step ** -0.5, step * w ** -1.5) with c = factor * d_model ** -0.5
    # the peak: lr(w) = c / sqrt(w)
    # half the warm-up: lr(w / 2) = c * (w / 2) * w ** -1.5 = 0.5 * c / sqrt(w)  (linear rise)
    # four times the warm-up: lr(4 w) = c / sqrt(4 w) = 0.5 * c / sqrt(w)      (1 / sqrt(step) decay)
    return (0.5, 0.5)


predict_noam_fractions = Exercise(
    "predict_noam_fractions",
    reference=_noam_fractions_reference,
    cases=[Case("your (lr(warmup / 2), lr(4 * warmup)) as fractions of lr(warmup)", lambda: ())],
    hints=[
        "Which of the two terms of the min is smaller before step = warmup, and which after?",
        "Before the peak the rate is factor * d_model^-0.5 * step * warmup^-1.5: proportional to the step. After "
        "it, factor * d_model^-0.5 * step^-0.5. The factor and d_model^-0.5 cancel in a fraction of the peak.",
        "The peak is lr(warmup) = (factor * d_model^-0.5) / sqrt(warmup). Put step = warmup / 2 into the first "
        "formula and step = 4 * warmup into the second, and divide each by the peak.",
    ],
    level="medium",
    kind="predict",
    wrong=[lambda: (0.5, 0.25), lambda: (0.25, 0.5), lambda: (math.sqrt(0.5), 0.5), lambda: (1.0, 1.0)],
    why=(
        "(0.5, 0.5): the rate rises linearly, so half the warm-up gives half the peak; it decays as 1/sqrt(step), "
        "so it takes four times the warm-up to fall to half again. The decay is much slower than the rise: at "
        "step 100 w the rate is still a tenth of the peak."
    ),
    explain={
        (0.5, 0.25): "the warm-up half is right. After the peak the rate falls as 1/sqrt(step), not as 1/step.",
        (0.25, 0.5): "the decay half is right. During the warm-up the rate is proportional to step, not step^2.",
        (math.sqrt(0.5), 0.5): "the decay half is right. During the warm-up the rate grows like step, not sqrt(step).",
        (1.0, 1.0): "the rate is not flat around the peak: one term of the min rises, the other falls.",
        (0.5, 2.0): "after the peak the rate falls: step^-0.5 gets smaller as the step grows.",
    },
)


# --- 4. transfer: GNMT's length penalty --------------------------------------------------------------


def _gnmt_reference(log_probs: Tensor, tokens: Tensor, pad_id: int, alpha: float) -> Tensor:
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (K, L): log p of each generated token
    real = tokens != pad_id  # (K, L): the generated tokens, EOS included; PAD after it
    total = torch.where(real, picked, torch.zeros_like(picked)).sum(-1)  # (K,): log P(y | x)
    length = real.sum(-1).to(log_probs.dtype)  # (K,): n, EOS counted
    penalty = ((5 + length) / 6) ** alpha  # (K,): GNMT's lp(y); 1 when alpha = 0
    return total / penalty  # (K,): higher is better


def _gnmt_library_style(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    real = tokens != pad_id
    length = real.sum(-1).to(log_probs.dtype)
    return (picked * real).sum(-1) / length**alpha  # n ** alpha: tl.beam_search's normalisation, not GNMT's


def _gnmt_counts_padding(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    length = (tokens != pad_id).sum(-1).to(log_probs.dtype)
    return picked.sum(-1) / ((5 + length) / 6) ** alpha  # the log-probs after EOS are added too


def _gnmt_full_length(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    real = tokens != pad_id
    length = torch.full((tokens.shape[0],), float(tokens.shape[1]), dtype=log_probs.dtype)  # padded length
    return (picked * real).sum(-1) / ((5 + length) / 6) ** alpha


def _gnmt_multiplied(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    real = tokens != pad_id
    length = real.sum(-1).to(log_probs.dtype)
    return (picked * real).sum(-1) * ((5 + length) / 6) ** alpha  # punishes long answers instead


def _gnmt_no_eos(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    real = tokens != pad_id
    length = real.sum(-1).to(log_probs.dtype) - 1  # EOS not counted in n
    return (picked * real).sum(-1) / ((5 + length) / 6) ** alpha


def _gnmt_power_of_six(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    real = tokens != pad_id
    length = real.sum(-1).to(log_probs.dtype)
    return (picked * real).sum(-1) / ((5 + length) / 6**alpha)  # ** binds tighter than /: only 6 is raised


def _gnmt_by_reference(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    from transformer_lab.exercises import ch09_full_model

    return ch09_full_model.gnmt_scores.reference(log_probs, tokens, pad_id, alpha)


def _gnmt_by_name(log_probs, tokens, pad_id, alpha):  # noqa: ANN001, ANN202
    import importlib

    module = importlib.import_module("transformer_lab.exercises.ch09_" + "full_model")
    return getattr(module, "_gnmt_" + "reference")(log_probs, tokens, pad_id, alpha)


def _hypotheses(lengths: list[int], vocab: int, seed: int, alpha: float, dtype: torch.dtype = torch.float32):  # noqa: ANN202
    """K finished hypotheses: random log-softmax rows, tokens 4.. with EOS = 2 at the end, PAD = 0 after it."""

    def inputs() -> tuple[Tensor, Tensor, int, float]:
        generator = torch.Generator().manual_seed(seed)
        k, width = len(lengths), max(lengths)
        log_probs = torch.randn(k, width, vocab, generator=generator, dtype=dtype).log_softmax(-1)  # (K, L, V)
        tokens = torch.randint(4, vocab, (k, width), generator=generator)  # (K, L)
        for row, n in enumerate(lengths):
            tokens[row, n - 1] = 2  # EOS ends each hypothesis
            tokens[row, n:] = 0  # then PAD
        return log_probs, tokens, 0, alpha

    return inputs


gnmt_scores = Exercise(
    "gnmt_scores",
    reference=_gnmt_reference,
    cases=[
        Case("two hypotheses of the same length, alpha = 0.6", _hypotheses([5, 5], 9, seed=20, alpha=0.6)),
        Case("a short and a long one, alpha = 0.6", _hypotheses([3, 11], 12, seed=21, alpha=0.6)),
        Case("alpha = 0: the plain sum of log-probabilities", _hypotheses([2, 6, 4], 10, seed=22, alpha=0.0)),
        Case("alpha = 1, a beam of 4", _hypotheses([7, 1, 4, 7], 15, seed=23, alpha=1.0)),
        Case("one hypothesis that is only EOS", _hypotheses([1], 6, seed=24, alpha=0.6)),
        Case("float64, lengths 1 to 12", _hypotheses(list(range(1, 13)), 20, seed=25, alpha=0.6, dtype=torch.float64)),
    ],
    hints=[
        "Three pieces per hypothesis: its log-probability (a sum over its real tokens), its length n (EOS counts, "
        "PAD does not), and GNMT's penalty lp = ((5 + n) / 6) ** alpha. The score is the first divided by the last.",
        "log_probs[k, t] is the whole distribution at step t; the token that was chosen is tokens[k, t]. gather "
        "along the last axis with tokens.unsqueeze(-1) picks its log-probability, shape (K, L). The positions "
        "after EOS hold PAD, and log_probs there are not zero: leave them out of the sum.",
        "With real = tokens != pad_id: total = picked where real, 0 elsewhere, summed over L; n = real.sum(-1) as "
        "a float. Then divide total by ((5 + n) / 6) ** alpha.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _gnmt_library_style,
            "the log-probability was divided by |y| to the power alpha, tl.beam_search's default: GNMT's penalty "
            "is the other formula, the one with the 5 and the 6.",
        ),
        Mistake(
            _gnmt_power_of_six,
            "the power alpha was applied to the 6 alone, not to the whole fraction: in Python ** binds tighter than /.",
        ),
        Mistake(
            _gnmt_multiplied,
            "the log-probability was multiplied by the penalty, not divided by it: long answers were pushed down "
            "further instead of helped.",
        ),
        Mistake(
            _gnmt_no_eos,
            "EOS was not counted in |y|: it is a generated token like the others.",
        ),
        Mistake(
            _gnmt_counts_padding,
            "the log-probabilities after EOS were added too: the steps that hold PAD are not part of the hypothesis.",
        ),
        Mistake(
            _gnmt_full_length,
            "every hypothesis got the padded length L: |y| counts each hypothesis's own tokens.",
        ),
    ],
    shortcuts=[_gnmt_by_reference, _gnmt_by_name],
)
