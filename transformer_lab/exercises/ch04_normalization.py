"""Exercises of chapter 04, normalization (归一化): notebooks/04_normalization.ipynb.

1. `predict_batch_norm_dims`: the dims `nn.BatchNorm1d` averages over in its (B, D, T) layout (easy, predict).
2. `masked_batch_norm`: BatchNorm in training mode whose statistics skip the padding (medium, build).
3. `predict_eval_output`: one training batch, then eval mode: what comes out for one token (medium, predict).
4. `layer_norm`: notes 000/003's LayerNorm fixed (unbiased `x.std`, `std + eps`) (medium, debug the notes).
5. `rms_norm`: RMSNorm, LayerNorm without the mean, safe in float16 (harder, transfer).

Shape legend: B batch, T sequence length, D features (d_model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.modern import Float32RMSNorm
from transformer_lab.normalization import (
    BatchNorm,
    LayerNorm,
    _masked_feature_statistics,
    batch_norm_statistics,
    batch_norm_statistics_per_position,
    layer_norm_statistics,
)

#: every statistics helper of the library: an exercise of this chapter computes the statistics itself, so none of
#: them may do it for the answer, whichever of them fits (issue 36: one answer took 4 points with them)
STATISTICS_HELPERS = [
    batch_norm_statistics,
    batch_norm_statistics_per_position,
    layer_norm_statistics,
    _masked_feature_statistics,
]

#: refused by the grader's static check in every answer of this chapter, before it runs, under any name
FORBIDDEN_IN_CHAPTER = [*STATISTICS_HELPERS, LayerNorm, BatchNorm]

__all__ = ["predict_batch_norm_dims", "masked_batch_norm", "predict_eval_output", "layer_norm", "rms_norm"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- 1. predict: which dims nn.BatchNorm1d averages over --------------------------------------------


def _batch_norm_dims_reference() -> tuple[int, ...]:
    return (0, 2)  # (B, D, T): every dim except the features (dim 1), i.e. the batch and the positions


def _as_dims(value: Any) -> Any:
    """A learner's dims in one spelling: sorted, negative dims of a 3-d tensor made positive."""
    try:
        if isinstance(value, Tensor) and value.dim() <= 1 and not value.is_floating_point() and not value.is_complex():
            value = value.tolist()  # torch.tensor([0, 2]) or torch.tensor(1)
        if isinstance(value, (set, frozenset)):
            value = tuple(value)  # {0, 2}: a set of dims is as good as a tuple
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if isinstance(value, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
            if all(-3 <= d < 3 for d in value):
                return tuple(sorted({d % 3 for d in value}))
    except Exception:  # an exotic value is compared as it is
        pass
    return value


predict_batch_norm_dims = Exercise(
    "predict_batch_norm_dims",
    reference=_batch_norm_dims_reference,
    cases=[Case("the dims nn.BatchNorm1d averages over for an input laid out as (B, D, T)", lambda: ())],
    hints=[
        "BatchNorm keeps one statistic per feature. So the feature axis is the one dim it does NOT average over.",
        "In the (B, D, T) layout, dim 0 is the batch, dim 1 the features, dim 2 the positions.",
        "Average over every dim except the feature dim: list the other two.",
    ],
    level="easy",
    kind="predict",
    run=lambda candidate: _as_dims(candidate()),
    wrong=[lambda: (0, 1), lambda: (1,), lambda: (2,), lambda: (0,), lambda: (0, 1, 2)],
    why=(
        "(0, 2): every dim except the features. nn.BatchNorm1d keeps dim 1 (its 'channels', here D) and averages over "
        "the batch and the positions. In our (B, T, D) layout the same statistics are dims (0, 1), as the next cell "
        "shows; that is why section 2 transposes x before calling nn.BatchNorm1d."
    ),
    explain={
        (0, 1): "in (B, D, T), dim 1 holds the FEATURES: averaging over it mixes the features into one number. "
        "Which dim holds the positions here?",
        (1,): "that averages each token over its own features: LayerNorm's axis in this layout, not BatchNorm's.",
        (2,): "that averages each sequence over its positions alone, one statistic per (sentence, feature): that is "
        "InstanceNorm. BatchNorm also averages across the batch.",
        (0,): "that averages over the batch at each position separately: one statistic per (position, feature), the "
        "'per time step' BatchNorm of RNNs (section 4). nn.BatchNorm1d pools the positions too.",
        (0, 1, 2): "that gives one number for the whole batch; BatchNorm keeps one statistic per feature.",
        (1, 2): "that averages each sequence over its features and its positions: one number per sentence, mixing "
        "the features. BatchNorm keeps the features apart and averages across the batch.",
    },
)


# --- 2. build: BatchNorm whose statistics skip the padding -------------------------------------------


def _masked_batch_norm(x: Tensor, mask: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """Training-mode BatchNorm of a padded (B, T, D) batch, statistics over the real tokens (mask True)."""
    real = x[mask]  # (N, D): the N real tokens of the whole batch, padding dropped
    mean = real.sum(dim=0) / real.shape[0]  # (D,): one mean per feature
    var = ((real - mean) ** 2).sum(dim=0) / real.shape[0]  # (D,): biased, divide by N
    x_hat = (x - mean) / torch.sqrt(var + eps)  # (B, T, D): every position, padding too, with those statistics
    return x_hat * gamma + beta  # (B, T, D)


def _padded_batch(
    lengths: list[int], t: int, d: int, seed: int, pad_value: float = 50.0
) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    g = _generator(seed)
    x = torch.randn(len(lengths), t, d, generator=g) * 2.0 + torch.linspace(-1, 1, d)  # (B, T, D)
    mask = torch.arange(t) < torch.tensor(lengths).unsqueeze(1)  # (B, T), True = real token
    x = x.masked_fill(~mask.unsqueeze(-1), pad_value)  # padded vectors far from the rest
    gamma, beta = 1.0 + 0.5 * torch.randn(d, generator=g), 0.5 * torch.randn(d, generator=g)
    return x, mask, gamma, beta, 1e-5


def _mbn_counting_padding(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    flat = x.reshape(-1, x.shape[-1])  # every position, padding included (what nn.BatchNorm1d does)
    mean, var = flat.mean(0), flat.var(0, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_zeroed_but_counted(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    keep = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1): the padding multiplied away...
    mean = (x * keep).mean(dim=(0, 1))  # ...but still counted: divides by B * T, not by the real tokens
    var = (((x - mean) ** 2) * keep).mean(dim=(0, 1))
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_unbiased(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0)  # divides by N - 1
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_per_token(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)  # LayerNorm's axis
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_per_position(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    keep = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    n = keep.sum(0).clamp_min(1)  # (T, 1): real tokens at each position
    mean = (x * keep).sum(0) / n  # (T, D): one mean per position and feature
    var = (((x - mean) ** 2) * keep).sum(0) / n
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_no_affine(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps)  # gamma and beta never applied


def _mbn_eps_outside(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0, unbiased=False)
    return (x - mean) / (torch.sqrt(var) + eps) * gamma + beta  # eps added to the std, not to the variance


def _mbn_zero_padding(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), real.var(0, unbiased=False)
    out = (x - mean) / torch.sqrt(var + eps) * gamma + beta
    return out * mask.unsqueeze(-1)  # padded positions set to 0: not what was asked


def _mbn_with_library_module(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    bn = BatchNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        bn.weight.copy_(gamma), bn.bias.copy_(beta)
    return bn(x, mask)


def _mbn_with_library_statistics(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean, var = batch_norm_statistics(x, mask)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mbn_with_functional(x, mask, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    real = x[mask]
    mean, var = real.mean(0), ((real - real.mean(0)) ** 2).mean(0)
    stats = F.batch_norm(x.transpose(1, 2), mean, var, gamma, beta, training=False, eps=eps)  # (B, D, T)
    return stats.transpose(1, 2)


masked_batch_norm = Exercise(
    "masked_batch_norm",
    reference=_masked_batch_norm,
    cases=[
        Case("a batch without padding", lambda: _padded_batch([4, 4, 4], 4, 5, 0)),
        Case("a padded batch (the padded vectors hold 50.0)", lambda: _padded_batch([5, 2, 3], 5, 6, 1)),
        Case("one long sentence and much padding", lambda: _padded_batch([6, 1, 1, 1], 6, 3, 2)),
        Case("a batch of one sentence", lambda: _padded_batch([3], 5, 4, 3)),
    ],
    hints=[
        "BatchNorm has one mean and one variance per feature, shape (D,), taken over every REAL token of the batch "
        "(all sentences, all positions). The padded vectors must not enter them.",
        "x[mask] keeps the real tokens as an (N, D) matrix. Average over its dim 0; for the variance divide by N "
        "(biased), as in section 1.",
        "With mean and var of shape (D,), (x - mean) / torch.sqrt(var + eps) broadcasts over the whole (B, T, D) "
        "batch, padded positions included; then scale by gamma and shift by beta.",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _mbn_counting_padding,
            "The padded vectors went into your mean and variance: the statistics were taken over every position of "
            "the batch, not over the real tokens only.",
        ),
        Mistake(
            _mbn_zeroed_but_counted,
            "The padding was zeroed but still counted: the sums leave the padded vectors out, yet they were divided "
            "by the number of all positions rather than the number of real tokens.",
        ),
        Mistake(
            _mbn_unbiased,
            "Your variance is the unbiased one, its sum of squares divided by N - 1 (what Tensor.var gives by "
            "default); training-mode BatchNorm normalizes with the biased variance of section 1.",
        ),
        Mistake(
            _mbn_per_token,
            "Each token was normalized over its own features, which is LayerNorm's axis: BatchNorm keeps one mean and "
            "one variance per feature, taken across the tokens of the batch.",
        ),
        Mistake(
            _mbn_per_position,
            "Each position got statistics of its own, averaged over the sentences at that position only (the 'per "
            "time step' BatchNorm of RNNs); BatchNorm pools the real tokens of all positions.",
        ),
        Mistake(
            _mbn_zero_padding,
            "The padded positions of your output were set to 0; the exercise asks to normalize every position, "
            "padding included, with the real tokens' statistics (the padded outputs are ignored later).",
        ),
        Mistake(
            _mbn_no_affine,
            "gamma and beta are missing: your output is the normalized x alone, as if gamma were all ones and beta "
            "all zeros. The last step scales each feature by gamma and shifts it by beta.",
        ),
        Mistake(
            _mbn_eps_outside,
            "eps was added to the standard deviation, outside the square root, not to the variance under it as in "
            "section 1's formula; that shows only where a feature's variance is about as small as eps.",
        ),
    ],
    forbidden=[
        "batch_norm",
        BatchNorm,
        LayerNorm,
        nn.BatchNorm1d,
        *STATISTICS_HELPERS,
    ],
    shortcuts=[_mbn_with_library_module, _mbn_with_library_statistics, _mbn_with_functional],
)


# --- 3. predict: train mode, then eval mode ----------------------------------------------------------


def _eval_output_reference() -> float:
    values = torch.tensor([2.0, 4.0, 6.0, 8.0], dtype=torch.float64)  # the batch's four real tokens, one feature
    momentum, eps = 0.1, 1e-5
    batch_mean = values.mean()  # 5
    unbiased_var = ((values - batch_mean) ** 2).sum() / (len(values) - 1)  # 20 / 3: the running var is unbiased
    running_mean = (1 - momentum) * 0.0 + momentum * batch_mean  # starts at 0 -> 0.5
    running_var = (1 - momentum) * 1.0 + momentum * unbiased_var  # starts at 1 -> 1.5667
    return round(float((8.0 - running_mean) / torch.sqrt(running_var + eps)), 2)  # eval mode: running estimates


def _as_number(value: Any) -> Any:
    """A learner's number rounded to two decimals (a 1-element tensor counts); anything else as it is."""
    try:
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() and value.device.type == "cpu":
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return round(float(value), 2)
    except Exception:  # an exotic value is compared as it is
        pass
    return value


predict_eval_output = Exercise(
    "predict_eval_output",
    reference=_eval_output_reference,
    cases=[Case("your number for bn's eval-mode output at the token holding 8", lambda: ())],
    hints=[
        "In eval mode BatchNorm normalizes with its RUNNING estimates, not with the batch's statistics. So first work "
        "out what the one training batch did to running_mean and running_var.",
        "running = (1 - momentum) * running + momentum * batch value, starting from running_mean 0 and running_var 1. "
        "The batch value for the variance is the unbiased one: the squared deviations from 5 add up to 20; divide "
        "by N - 1 = 3.",
        "running_mean = 0.5 and running_var = 0.9 + 0.1 * 20 / 3. The output is (8 - running_mean) / "
        "sqrt(running_var + eps), with gamma 1 and beta 0.",
    ],
    level="medium",
    kind="predict",
    run=lambda candidate: _as_number(candidate()),
    wrong=[lambda: 1.34, lambda: 8.0, lambda: 7.5, lambda: 6.34, lambda: 1.42, lambda: 3.35],
    why=(
        "The training step moved running_mean from 0 to 0.5 and running_var from 1 to 0.9 + 0.1 * 20/3 = 1.567, so "
        "eval mode gives (8 - 0.5) / sqrt(1.567) = 5.99, while training mode gave (8 - 5) / sqrt(5) = 1.34 for the "
        "same token: the same input, two outputs. A real model's running estimates converge to the data's "
        "statistics after many batches, but they are never the statistics of the batch in hand."
    ),
    explain={
        1.34: "that is the TRAINING-mode output, (8 - 5) / sqrt(5), with the batch's own mean and variance. In eval "
        "mode BatchNorm does not look at the batch's statistics.",
        8.0: "that is what a FRESH BatchNorm outputs in eval mode (running mean 0, running variance 1). But the "
        "training batch updated both estimates first.",
        7.5: "the running mean moved to 0.5, right; the running variance moved too (it started at 1).",
        6.34: "close: you blended the biased variance 20/4 = 5. The running estimate stores the unbiased variance "
        "(divide by N - 1 = 3), as nn.BatchNorm1d does.",
        1.42: "momentum is the weight of the NEW batch (0.1), not of the old estimate: running = 0.9 * old + 0.1 * "
        "batch.",
        3.35: "eval mode uses the running VARIANCE too, not the batch's variance 5.",
        2.9: "eval mode uses the running variance (blended from 1 with momentum 0.1), not the batch's 20/3.",
        9.19: "the running variance starts at 1, not 0: running_var = 0.9 * 1 + 0.1 * 20/3.",
        1.16: "that uses the batch's own mean 5 and unbiased variance 20/3: eval mode uses the running estimates.",
        2.4: "the running variance, right, but the batch's mean 5: eval mode uses the running mean too.",
        6.0: "not at two decimals: if you rounded your result to a whole number or to one decimal, give it to two "
        "decimals, as the exercise asks.",
    },
)


# --- 4. debug the notes: LayerNorm with the biased variance, eps under the root ----------------------


def _layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last axis, as nn.LayerNorm: biased variance, eps under the square root."""
    mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (..., 1): biased, divide by D (not D - 1)
    x_hat = (x - mean) / torch.sqrt(var + eps)  # (..., D): eps added to the variance, under the root
    return gamma * x_hat + beta  # (..., D): gamma and beta are (D,) vectors


def notes_layer_norm(x: Tensor, a_2: Tensor, b_2: Tensor, eps: float = 1e-6) -> Tensor:
    """Notes 000/003's LayerNorm.forward (re-indented), in a few lines: the exercise's starting point."""
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)
    return a_2 * (x - mean) / (std + eps) + b_2


def _ln_unbiased_under_root(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) + beta  # only the eps fixed


def _ln_biased_plus_eps(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / (x.std(-1, keepdim=True, unbiased=False) + eps) + beta  # only the N fixed


def _ln_wrong_axis(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean, var = x.mean(0, keepdim=True), x.var(0, keepdim=True, unbiased=False)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def _ln_no_eps(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)) + beta  # 0 / 0 for constant x


def _ln_global(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean, var = x.mean(), x.var(unbiased=False)  # one mean and variance for the whole tensor
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def _ln_no_beta(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)  # beta never added


def _ln_no_affine(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)


def _ln_with_functional(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


def _ln_with_torch_alias(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    norm = getattr(torch, "layer_norm")  # noqa: B009 - the spelling is the point
    return norm(x, [x.shape[-1]], gamma, beta, eps)


def _ln_with_library_module(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    ln = LayerNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        ln.weight.copy_(gamma), ln.bias.copy_(beta)
    return ln(x)


def _ln_with_library_statistics(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    mean, var = layer_norm_statistics(x)
    return gamma * (x - mean.unsqueeze(-1)) / torch.sqrt(var.unsqueeze(-1) + eps) + beta


def _ln_with_group_norm(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    d = x.shape[-1]  # GroupNorm with one group over (N, D) rows is LayerNorm without its affine part
    return F.group_norm(x.reshape(-1, d), 1, None, None, eps).reshape(x.shape) * gamma + beta


def _ln_with_instance_norm(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    d = x.shape[-1]  # one channel of length D per vector
    return F.instance_norm(x.reshape(-1, 1, d), eps=eps).reshape(x.shape) * gamma + beta


def _ln_with_batch_norm(x, gamma, beta, eps=1e-5):  # noqa: ANN001, ANN202
    d = x.shape[-1]  # the vectors as the features, their D entries as the batch
    return F.batch_norm(x.reshape(-1, d).T, None, None, training=True, eps=eps).T.reshape(x.shape) * gamma + beta


def _ln_inputs(shape: tuple[int, ...], seed: int, scale: float = 3.0, offset: float = 0.0) -> tuple[Any, ...]:
    g = _generator(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset
    gamma = 1.0 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    return x, gamma, 0.5 * torch.randn(d, generator=g, dtype=torch.float64), 1e-5


layer_norm = Exercise(
    "layer_norm",
    reference=_layer_norm,
    cases=[
        Case("a (2, 3, 8) batch with random gamma and beta", lambda: _ln_inputs((2, 3, 8), 0)),
        Case("a small width, D = 4", lambda: _ln_inputs((3, 4), 2)),
        Case("a single wide vector, D = 256", lambda: _ln_inputs((256,), 1)),
        Case(
            "nearly constant vectors (std about 0.001, so var is about eps/10)",
            lambda: _ln_inputs((2, 64), 4, scale=1e-3, offset=2.0),
            atol=1e-7,
            rtol=1e-6,
        ),
        Case(
            "a constant vector (variance 0): the output is beta",
            lambda: (torch.full((2, 6), 7.0, dtype=torch.float64), torch.ones(6).double(), torch.arange(6.0).double()),
            hidden="scale",  # the vector stays constant in a graded class's hidden case
        ),
    ],
    hints=[
        "Run notes_layer_norm and nn.LayerNorm on the same input and compare, then write down nn.LayerNorm's formula "
        "from section 1 and compare it with the notes' code term by term. Two terms differ.",
        "Tensor.std(-1) is not the standard deviation of section 1's formula: how many values does it divide the sum "
        "of squares by? And where does section 1 put eps?",
        "Take var = the mean of (x - mean) ** 2 over the last axis (divide by D) and divide x - mean by "
        "torch.sqrt(var + eps), not by std + eps. gamma and beta stay where the notes put them.",
    ],
    level="medium",
    kind="debug",
    # The order matters: on the first cases the notes' version and "only eps fixed" give the same numbers (eps is
    # tiny there), and what both then show is the unbiased variance; the notes' own line comes on nearly constant
    # vectors, where the place of eps shows too.
    mistakes=[
        Mistake(
            _ln_unbiased_under_root,
            "Your variance is still the unbiased one, the sum of squares divided by D - 1 (what Tensor.std and "
            "Tensor.var give by default), not section 1's. The gap is largest when D is small.",
        ),
        Mistake(
            _ln_biased_plus_eps,
            "eps is still added to the standard deviation, outside the square root, which is not where section 1's "
            "formula puts it; that shows only when the variance is about as small as eps.",
        ),
        Mistake(
            notes_layer_norm,
            "Both of the notes' slips are still there: the variance divided by D - 1, and eps added outside the "
            "square root.",
        ),
        Mistake(
            _ln_no_eps,
            "eps is missing: a vector with (nearly) zero variance is divided by (nearly) zero, which gives huge "
            "values or NaN. eps is what keeps the denominator away from 0.",
        ),
        Mistake(
            _ln_wrong_axis,
            "The mean and variance were taken across the vectors of the batch (over dim 0), not over each vector's "
            "own D features: LayerNorm normalizes every token on its own.",
        ),
        Mistake(
            _ln_global,
            "One mean and one variance for the whole tensor: LayerNorm takes them separately for each vector, over "
            "its D features.",
        ),
        Mistake(  # before _ln_no_affine: on a constant vector both give 0, and beta is missing in both
            _ln_no_beta,
            "beta is missing: your output is gamma times the normalized x, with no shift; on a constant vector, "
            "whose normalized value is 0, the output should be beta.",
        ),
        Mistake(
            _ln_no_affine,
            "gamma and beta are missing: your output is the normalized x alone, as if gamma were all ones and beta "
            "all zeros.",
        ),
    ],
    forbidden=[
        "layer_norm",
        "group_norm",
        "instance_norm",
        "batch_norm",
        LayerNorm,
        BatchNorm,
        nn.LayerNorm,
        *STATISTICS_HELPERS,
    ],
    shortcuts=[
        _ln_with_functional,
        _ln_with_torch_alias,
        _ln_with_library_module,
        _ln_with_library_statistics,
        _ln_with_group_norm,
        _ln_with_instance_norm,
        _ln_with_batch_norm,
    ],
)


# --- 5. transfer: RMSNorm -----------------------------------------------------------------------------


def _rms_norm(x: Tensor, gamma: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * gamma; no mean subtracted, no beta."""
    h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # float16's squares overflow past 65504
    mean_square = (h * h).mean(dim=-1, keepdim=True)  # (..., 1): the root MEAN SQUARE, around 0, not the mean
    out = h / torch.sqrt(mean_square + eps) * gamma  # (..., D)
    return out.to(x.dtype)  # the input's dtype, as nn.RMSNorm


def _rms_with_course_module(x: Tensor, gamma: Tensor, eps: float = 1e-6) -> Tensor:  # chapter 11's RMSNorm
    norm = Float32RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(gamma)
    return norm(x).to(x.dtype)


def _rms_run(candidate: Callable[..., Any], x: Tensor, gamma: Tensor, eps: float) -> tuple[Any, str]:
    """The output, and its dtype (the check asks for the input's dtype back)."""
    out = candidate(x, gamma, eps)
    return out, str(out.dtype) if isinstance(out, Tensor) else type(out).__name__


def _rms_inputs(
    shape: tuple[int, ...], seed: int, scale: float = 1.0, offset: float = 0.0, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, float]:
    g = _generator(seed)
    x = torch.randn(*shape, generator=g) * scale + offset
    gamma = 1.0 + 0.5 * torch.randn(shape[-1], generator=g)
    return x.to(dtype), gamma.to(dtype), 1e-6


def _rms_layer_norm(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    h = h - h.mean(-1, keepdim=True)  # subtracts the mean: that is LayerNorm without beta
    return (h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps) * gamma).to(x.dtype)


def _rms_in_half(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma  # squares overflow in float16


def _rms_sum_not_mean(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    return (h / torch.sqrt((h * h).sum(-1, keepdim=True) + eps) * gamma).to(x.dtype)


def _rms_eps_outside(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    return (h / (torch.sqrt((h * h).mean(-1, keepdim=True)) + eps) * gamma).to(x.dtype)


def _rms_no_gamma(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    return (h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps)).to(x.dtype)  # gamma never applied


def _rms_float32_out(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    h = x.float()
    return h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps) * gamma.float()  # never cast back


def _rms_with_functional(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    return F.rms_norm(x, (x.shape[-1],), gamma, eps)


def _rms_with_torch_alias(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    return torch.rms_norm(x, [x.shape[-1]], gamma, eps)


def _rms_with_module(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    norm = nn.RMSNorm(x.shape[-1], eps=eps, dtype=x.dtype)
    with torch.no_grad():
        norm.weight.copy_(gamma)
    return norm(x)


def _rms_with_layer_norm(x, gamma, eps=1e-6):  # noqa: ANN001, ANN202
    d, h = x.shape[-1], x.float()  # [x, -x] has mean 0 and variance mean(x^2): LayerNorm of it is RMSNorm
    return (F.layer_norm(torch.cat([h, -h], dim=-1), (2 * d,), eps=eps)[..., :d] * gamma).to(x.dtype)


rms_norm = Exercise(
    "rms_norm",
    reference=_rms_norm,
    run=_rms_run,
    cases=[
        Case("a (2, 3, 8) batch with a random gamma", lambda: _rms_inputs((2, 3, 8), 0)),
        Case("a single vector of shape (16,)", lambda: _rms_inputs((16,), 1)),
        Case(
            "vectors whose mean is far from 0 (where RMSNorm and LayerNorm differ most)",
            lambda: _rms_inputs((3, 8), 2, offset=4.0),
        ),
        Case(
            "tiny activations (about 0.001), where the place of eps matters",
            lambda: _rms_inputs((2, 16), 4, scale=1e-3),
        ),
        Case(
            "an all-zero vector: the output is 0, not NaN",
            lambda: (torch.zeros(2, 5), torch.ones(5), 1e-6),
            hidden="scale",
        ),
        Case(
            "float16 activations of size about 300 (their squares overflow float16)",
            lambda: _rms_inputs((2, 3, 8), 3, scale=300.0, dtype=torch.float16),
            atol=2e-3,
            rtol=2e-3,
        ),
    ],
    hints=[
        "RMSNorm is LayerNorm with two things removed: the mean is not subtracted, and there is no beta. What is "
        "left to divide by is the root of the mean of the squares, sqrt(mean(x ** 2) + eps), over the last axis.",
        "The float16 case: 300 ** 2 = 90,000 is more than float16's largest number (65504), so x * x becomes inf and "
        "the output 0. Compute in float32 (x.float()) and cast the result back with .to(x.dtype).",
        "h = x.float() for half-precision input (else x); ms = (h * h).mean(dim=-1, keepdim=True) of shape (..., 1); "
        "divide h by torch.sqrt(ms + eps), multiply by gamma, then cast back to x's dtype.",
    ],
    level="harder",
    kind="transfer",
    output_names=["your output", "your output's dtype"],
    mistakes=[
        Mistake(
            _rms_layer_norm,
            "The mean was subtracted first: that makes it LayerNorm without beta, not RMSNorm. The two differ most on "
            "vectors whose mean is far from 0.",
        ),
        Mistake(
            _rms_sum_not_mean,
            "The squares were summed, not averaged: every output is sqrt(D) times too small.",
        ),
        Mistake(
            _rms_eps_outside,
            "eps was added after the square root instead of under it: on tiny activations, whose mean square "
            "(about 1e-6) is as small as eps itself, that changes the result.",
        ),
        Mistake(
            _rms_in_half,
            "The squares were computed in float16: 300 ** 2 is more than float16's largest number (65504), so the "
            "mean square became inf and the output 0.",
        ),
        Mistake(
            _rms_no_gamma,
            "gamma is missing: your output is x divided by its root mean square alone, as if gamma were all ones. "
            "RMSNorm keeps LayerNorm's per-feature scale (only beta goes).",
        ),
        Mistake(
            _rms_float32_out,
            "The values are right, but a float16 input came back in float32: the output should have the input's "
            "dtype, as nn.RMSNorm's has.",
        ),
    ],
    forbidden=[
        "rms_norm",
        nn.RMSNorm,
        "layer_norm",
        "group_norm",
        "instance_norm",
        "batch_norm",
        nn.LayerNorm,
        Float32RMSNorm,
        LayerNorm,
        BatchNorm,
        *STATISTICS_HELPERS,
    ],
    shortcuts=[
        _rms_with_functional,
        _rms_with_torch_alias,
        _rms_with_module,
        _rms_with_layer_norm,
        _rms_with_course_module,
    ],
    why=(
        "RMSNorm (Zhang and Sennrich, 2019; used by LLaMA and most recent decoder-only models) skips the mean: one "
        "reduction instead of two and no beta. On vectors whose mean is 0 it equals LayerNorm without beta, as the "
        "next cell shows with PyTorch's nn.RMSNorm."
    ),
)
