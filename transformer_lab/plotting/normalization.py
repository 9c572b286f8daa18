"""Figures of chapters 04 and 05: what BatchNorm and LayerNorm average over, their statistics on a
padded batch, how those statistics move, activations, and gradient norms through a stack.

Shape legend: B batch, T sequence length, D features (d_model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import ScalarFormatter

from transformer_lab._checks import check_int, check_number
from transformer_lab.normalization import batch_norm_statistics, layer_norm_statistics
from transformer_lab.plotting.style import (
    CMAP_SIGNED,
    STYLE,
    check_mapping,
    check_range,
    course_style,
    curves,
    finite_values,
    heatmap,
    new_figure,
    to_numpy,
)

__all__ = [
    "normalization_axes_cube",
    "normalization_axes_unfolded",
    "normalization_statistics",
    "statistics_sensitivity",
    "layer_norm_error_vs_width",
    "activation_functions",
    "gradient_norms_per_layer",
    "stack_scale",
    "norm_placement_training",
    "norm_placement_seeds",
]

_REAL = "#9ecae1"  # a real token's cell, not in the statistic
_PAD = "#d9d9d9"  # a padded cell
_BATCH = "#d62728"  # the cells of one BatchNorm statistic
_LAYER = "#2ca02c"  # the cells of one LayerNorm statistic
_COLOURS = [c["color"] for c in STYLE["axes.prop_cycle"]]  # the course's line colours, in order
_OVER_REAL = "the real tokens only, padding masked out (tl.BatchNorm(D)(x, mask))"  # the two BatchNorm bars
_OVER_ALL = "every position, padding included (nn.BatchNorm1d)"


def _lengths_or_full(lengths: Sequence[int] | None, batch: int, length: int, features: int) -> list[int]:
    for name, value in (("batch", batch), ("length", length), ("features", features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if lengths is None:
        return [length] * batch
    if len(lengths) != batch or any(not 1 <= n <= length for n in lengths):
        raise ValueError(f"lengths must be {batch} ints in [1, {length}], got {list(lengths)!r}")
    return list(lengths)


def normalization_axes_cube(
    batch: int = 3, length: int = 5, features: int = 6, lengths: Sequence[int] | None = (5, 3, 4)
) -> Figure:
    """The (B, T, D) block drawn in 3-D twice: the cells BatchNorm averages for one feature (a slab
    across every sequence and position), and the cells LayerNorm averages for one token (a rod
    along the features). Padded cells are grey and see-through (chapter 04).

    Args:
        batch, length, features: B, T and D of the drawn block (keep them small).
        lengths: the real length of each sequence (the rest is padding), or None for no padding.
    """
    lengths = _lengths_or_full(lengths, batch, length, features)
    real = np.zeros((batch, length, features), dtype=bool)  # (B, T, D)
    for b, n in enumerate(lengths):
        real[b, :n] = True
    feature, token = features // 2, (0, 1)
    with course_style():
        fig = new_figure(1, 2, size=(10.0, 5.0))[0]
        fig.clear()
        panels = (
            ("BatchNorm (red): one mean per feature,\naveraged over B and T", _BATCH, "batch"),
            ("LayerNorm (green): one mean per token,\naveraged over D", _LAYER, "layer"),
        )
        for i, (title, colour, kind) in enumerate(panels):
            ax = fig.add_subplot(1, 2, i + 1, projection="3d")
            chosen = np.zeros_like(real)
            if kind == "batch":
                chosen[:, :, feature] = real[:, :, feature]  # every real token, one feature
            else:
                chosen[token[0], token[1], :] = True  # one token, every feature
            colours = np.empty(real.shape, dtype=object)
            colours[real] = _REAL + "80"
            colours[~real] = "#ffffff10"  # padding: nearly transparent, only its edges show
            colours[chosen] = colour + "e6"
            # axes of the drawing: x = T (positions), y = B (sequences), z = D (features)
            filled = np.ones_like(real).transpose(1, 0, 2)  # (T, B, D)
            ax.voxels(filled, facecolors=colours.transpose(1, 0, 2), edgecolor="#555555", linewidth=0.3)
            ax.set_xlabel("T (position)")
            ax.set_ylabel("B (sequence)")
            ax.set_zlabel("D (feature)")
            ax.set_title(title)
            ax.view_init(elev=22, azim=-58)
            ax.set_box_aspect((length, batch, features), zoom=0.85)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_zticks([])
        fig.suptitle("the (B, T, D) block; empty cells = padding (sequences 1 and 2 are shorter)")
    return fig


def normalization_axes_unfolded(
    batch: int = 3, length: int = 5, features: int = 6, lengths: Sequence[int] | None = (5, 3, 4)
) -> Figure:
    """The (B, T, D) block unfolded into B grids of T x D cells, drawn twice: top row, the cells of one
    BatchNorm statistic (one feature, every real token of every sequence); bottom row, the cells of
    one LayerNorm statistic (one token, every feature). Padded cells are grey and hatched (chapter 04).
    """
    lengths = _lengths_or_full(lengths, batch, length, features)
    feature, token = features // 2, (0, 1)
    fig, axes = new_figure(2, batch, size=(2.3 * batch + 0.6, 5.6))
    with course_style():
        for row, (name, colour) in enumerate((("BatchNorm", _BATCH), ("LayerNorm", _LAYER))):
            for b in range(batch):
                ax = axes[row, b]
                for t in range(length):
                    for d in range(features):
                        padded = t >= lengths[b]
                        if row == 0:
                            chosen = d == feature and not padded
                        else:
                            chosen = (b, t) == token
                        face = colour if chosen else (_PAD if padded else _REAL)
                        ax.add_patch(
                            Rectangle((d, t), 1, 1, facecolor=face, edgecolor="white", hatch="//" if padded else None)
                        )
                ax.set_xlim(0, features)
                ax.set_ylim(length, 0)
                ax.set_aspect("equal")
                ax.set_xticks(np.arange(features) + 0.5, [str(d) for d in range(features)])
                ax.set_yticks(np.arange(length) + 0.5, [str(t) for t in range(length)])
                ax.set_xlabel("feature d")
                if b == 0:
                    ax.set_ylabel(f"{name}\nposition t")
                ax.set_title(f"sequence b={b} (length {lengths[b]})", fontsize=9)
        fig.suptitle(
            "BatchNorm (red): one statistic per feature, over every real token of the batch\n"
            "LayerNorm (green): one statistic per token, over its own features; grey = padding"
        )
    return fig


def normalization_statistics(x: torch.Tensor, mask: torch.Tensor | None = None, feature_limit: int = 16) -> Figure:
    """BatchNorm's per-feature statistics beside LayerNorm's per-token statistics, on one padded batch.

    Top row: the per-feature mean and variance over the batch (the first `feature_limit` features),
    computed over real tokens only (`tl.BatchNorm(D)(x, mask)`) and counting padding too (what
    `nn.BatchNorm1d` does); one legend above the two panels names the two kinds of bar. Bottom row:
    the per-token mean and variance, one per (sequence, position), with padded positions blank
    (chapter 04).

    Shape:
        x (B, T, D), mask (B, T) bool (True = real token) or None.
    """
    if isinstance(feature_limit, bool) or not isinstance(feature_limit, int) or feature_limit < 1:
        raise ValueError(f"feature_limit must be a positive int, got {feature_limit!r}")
    mean_real, var_real = batch_norm_statistics(x, mask)  # (D,), (D,)
    mean_all, var_all = batch_norm_statistics(x)  # (D,), (D,): padding counted
    token_mean, token_var = layer_norm_statistics(x)  # (B, T), (B, T)
    if mask is not None:
        token_mean = token_mean.masked_fill(~mask, float("nan"))
        token_var = token_var.masked_fill(~mask, float("nan"))
    n = min(feature_limit, x.shape[-1])
    fig, axes = new_figure(2, 2, size=(11.0, 7.0))
    with course_style():
        features = np.arange(n)
        for ax, real, counted, what in (
            (axes[0, 0], mean_real, mean_all, "mean"),
            (axes[0, 1], var_real, var_all, "variance"),
        ):
            ax.bar(features - 0.2, to_numpy(real)[:n], width=0.4, label=_OVER_REAL)
            ax.bar(features + 0.2, to_numpy(counted)[:n], width=0.4, label=_OVER_ALL)
            ax.set_title(f"BatchNorm: per-feature {what} ({x.shape[-1]} numbers)")
            ax.set_xlabel("feature d")
            ax.set_ylabel(what)
            ax.axhline(0.0, color="black", linewidth=0.6)
        # one legend for both bar panels, above them: inside an axes it would hide bars
        fig.legend(
            *axes[0, 0].get_legend_handles_labels(),
            loc="outside upper center",
            ncols=2,
            fontsize=9,
            title="BatchNorm bars: each feature's statistic computed over",
            title_fontsize=9,
        )
    b, t = x.shape[:2]
    heatmap(
        axes[1, 0],
        token_mean,
        title=f"LayerNorm: per-token mean ({b} x {t} numbers)",
        x_title="position t",
        y_title="sequence b",
        cmap=CMAP_SIGNED,
        vmin=-float(np.nanmax(np.abs(to_numpy(token_mean)))),
        vmax=float(np.nanmax(np.abs(to_numpy(token_mean)))),
    )
    heatmap(
        axes[1, 1],
        token_var,
        title="LayerNorm: per-token variance (blank = padding)",
        x_title="position t",
        y_title="sequence b",
    )
    return fig


def statistics_sensitivity(
    by_batch_size: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    by_padding: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    y_title: str = "distance from the reference",
) -> Figure:
    """Two panels of curves: how far each normalization's statistics move as the batch size grows,
    and as padding is added (chapter 04).

    Args:
        by_batch_size: {name: (batch sizes, change)}, drawn with a log2 x axis.
        by_padding: {name: (padding fractions or lengths, change)}.
    """
    check_mapping("by_batch_size", by_batch_size)
    check_mapping("by_padding", by_padding)
    fig, axes = new_figure(1, 2, size=(11.0, 3.8))
    curves(
        axes[0, 0],
        by_batch_size,
        title="statistics vs batch size",
        x_title="batch size",
        y_title=y_title,
        argument="by_batch_size",
    )
    axes[0, 0].set_xscale("log", base=2)
    axes[0, 0].xaxis.set_major_formatter(ScalarFormatter())
    curves(
        axes[0, 1],
        by_padding,
        title="statistics vs padding",
        x_title="fraction of padded positions",
        y_title=y_title,
        argument="by_padding",
    )
    for ax in axes[0]:
        for line in ax.get_lines():
            line.set_marker("o")
        ax.legend(fontsize=8)
    return fig


def layer_norm_error_vs_width(d_models: Sequence[int], errors: Mapping[str, Sequence[float]]) -> Figure:
    """Largest difference from `nn.LayerNorm` against d_model, log-log (chapter 04: the notes' unbiased std).

    Args:
        d_models: the widths measured.
        errors: {name of the implementation: max |difference| at each width}; zeros are drawn at 1e-17.
    """
    widths = finite_values("d_models", to_numpy(d_models, "d_models"))
    if widths.ndim != 1 or widths.size == 0 or (widths <= 0).any():
        raise ValueError(f"d_models must be a non-empty list of positive widths, got {widths.tolist()}")
    check_mapping("errors", errors)
    series = {}
    for name, values in errors.items():
        array = to_numpy(values, f"errors[{name!r}]")
        if array.shape != widths.shape:
            raise ValueError(
                f"errors[{name!r}] must hold one difference per width in d_models ({widths.size}), got shape "
                f"{array.shape}"
            )
        series[name] = (widths.tolist(), np.maximum(array, 1e-17))  # 0 (exact) drawn at 1e-17 on the log scale
    fig, axes = new_figure(size=(6.0, 3.8))
    ax = axes[0, 0]
    curves(
        ax,
        series,
        title="difference from nn.LayerNorm",
        x_title="d_model",
        y_title="max |difference|",
        log_y=True,
        argument="errors",
    )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    for line in ax.get_lines():
        line.set_marker("o")
    return fig


def activation_functions(names: Sequence[str] = ("relu", "gelu"), x_range: tuple[float, float] = (-4.0, 4.0)) -> Figure:
    """The FFN's activation functions on one axes, e.g. ReLU (the paper) and GELU (GPT, note 004) (chapter 05)."""
    known = {
        "relu": ("ReLU", F.relu),
        "gelu": ("GELU (exact, erf)", F.gelu),
        "gelu_tanh": ("GELU (tanh approximation)", lambda v: F.gelu(v, approximate="tanh")),
        "silu": ("SiLU / Swish", F.silu),
    }
    if isinstance(names, str):
        raise TypeError(f"names must be a list of names, e.g. ['relu'], got the string {names!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"names must be among {sorted(known)}, got {unknown}")
    low, high = check_range("x_range", x_range)
    xs = torch.linspace(low, high, 401, dtype=torch.float64)
    fig, axes = new_figure(size=(5.6, 3.8))
    ax = axes[0, 0]
    curves(ax, {known[n][0]: (xs.tolist(), known[n][1](xs)) for n in names}, title="activation functions", x_title="x")
    ax.set_ylabel("activation(x)")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.axvline(0.0, color="black", linewidth=0.5)
    return fig


def gradient_norms_per_layer(
    series: Mapping[str, Sequence[float]], title: str = "gradient norm per layer", ax: Axes | None = None
) -> Figure:
    """Gradient norm of each layer's parameters, layer 1 nearest the input, log scale (chapter 05).

    Args:
        series: {name: one norm per layer}.
    """
    check_mapping("series", series)
    if not series:
        raise ValueError("series must hold at least one named list of gradient norms")
    data = {}
    for name, v in series.items():
        norms = to_numpy(v, f"series[{name!r}]")
        if (norms < 0).any():
            raise ValueError(f"series[{name!r}] must hold gradient norms (>= 0), got {norms.min():.4g}")
        data[name] = (list(range(1, len(norms) + 1)), np.maximum(norms, 1e-30))  # 0 drawn at 1e-30 on the log scale
    if ax is None:
        ax = new_figure(size=(6.4, 3.8))[1][0, 0]
    curves(ax, data, title=title, x_title="layer (1 = nearest the input)", y_title="||gradient||", log_y=True)
    for line in ax.get_lines():
        line.set_marker("o")
        line.set_markersize(3)
    return ax.figure


def stack_scale(
    series: Mapping[str, tuple[Sequence[float], float]],
    title: str = "size of the token vectors through a stack",
    y_title: str = "mean std per token",
    ax: Axes | None = None,
) -> Figure:
    """A size measured after each layer of a stack, then after the stack's final norm (chapter 06).

    The layers are drawn as one line with round markers; the final norm, which is not a layer, as a separate
    hollow square to the right of a dashed separator, joined to the last layer by a dotted segment (the squares
    of later series are drawn smaller, so that equal values stay visible).

    Args:
        series: {name: (one value per layer, the value after the final norm)}.
    """
    check_mapping("series", series)
    if not series:
        raise ValueError("series must hold at least one named stack")
    if ax is None:
        ax = new_figure(size=(6.0, 3.3))[1][0, 0]
    n_layers = 0
    with course_style():
        for i, (name, value) in enumerate(series.items()):
            colour = _COLOURS[i % len(_COLOURS)]
            if not (isinstance(value, tuple) and len(value) == 2):
                raise TypeError(
                    f"series[{name!r}] must be a pair (one value per layer, the value after the final norm)"
                )
            per_layer = to_numpy(value[0], f"series[{name!r}] layers")
            final = to_numpy(value[1], f"series[{name!r}] final norm")
            if per_layer.ndim != 1 or per_layer.size == 0 or final.size != 1:
                raise ValueError(
                    f"series[{name!r}] must hold one value per layer (a 1-D list) and one number after the final norm"
                )
            if n_layers and per_layer.size != n_layers:
                raise ValueError(
                    f"every stack must have the same number of layers, got {n_layers} and {per_layer.size}"
                )
            n_layers = per_layer.size
            layers = np.arange(1, n_layers + 1)
            ax.plot(layers, per_layer, "o-", color=colour, markersize=4, label=name)
            ax.plot([n_layers, n_layers + 1], [per_layer[-1], final.item()], ":", color=colour, linewidth=1.2)
            size = max(9 - 3 * i, 4)  # nested squares: equal values after the final norm all stay visible
            ax.plot([n_layers + 1], [final.item()], "s", color=colour, markersize=size, markerfacecolor="none")
        ax.axvline(n_layers + 0.5, color="#7f7f7f", linewidth=0.8, linestyle="--")
        ax.set_xticks(list(range(1, n_layers + 2)))
        ax.set_xticklabels([str(i) for i in range(1, n_layers + 1)] + ["final\nnorm"])
        ax.set_xlim(0.5, n_layers + 1.6)
        ax.set_title(title)
        ax.set_xlabel("after layer (the squares: after the stack's final norm, which is not a layer)")
        ax.set_ylabel(y_title)
        ax.legend()
    return ax.figure


def norm_placement_training(
    losses: Mapping[str, Sequence[float]], grad_norms: Mapping[str, Sequence[float]], smooth: int = 5
) -> Figure:
    """Post-Norm vs Pre-Norm: loss curves (left) and per-layer gradient norms at the first step (right).

    Args:
        losses: {run name: loss at each step}; drawn with a moving average over `smooth` steps
            (the raw curve faint behind it).
        grad_norms: {run name: one gradient norm per layer}.
    """
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be an int >= 1, got {smooth!r}")
    check_mapping("losses", losses)
    for name, values in losses.items():
        v = to_numpy(values, f"losses[{name!r}]")
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"losses[{name!r}] must be one loss per step (a non-empty list), got shape {v.shape}")
    fig, axes = new_figure(1, 2, size=(11.5, 4.0))
    ax = axes[0, 0]
    smoothed = {}
    for name, values in losses.items():
        v = to_numpy(values)
        kernel = np.ones(min(smooth, len(v))) / min(smooth, len(v))
        smoothed[name] = (list(range(smooth - 1, len(v))), np.convolve(v, kernel, mode="valid"))
    curves(ax, smoothed, title=f"training loss (moving average of {smooth})", x_title="step", y_title="cross-entropy")
    with course_style():
        for line, values in zip(ax.get_lines(), losses.values(), strict=True):
            ax.plot(range(len(values)), to_numpy(values), color=line.get_color(), alpha=0.2, linewidth=0.8)
    gradient_norms_per_layer(grad_norms, title="gradient norm per layer, first step", ax=axes[0, 1])
    return fig


def norm_placement_seeds(
    losses: Mapping[str, Sequence[Sequence[float]]],
    grad_norms: Mapping[str, Sequence[float]] | None = None,
    smooth: int = 10,
    chance: float | None = None,
    warmup_steps: int | None = None,
) -> Figure:
    """Several training arms over several seeds: one colour per arm, one line per seed (chapter 05).

    Left: the training loss of every run (moving average over `smooth` steps), log scale, so that a run
    stuck near chance and a run near zero loss both show. Right (if `grad_norms` is given): one gradient
    norm per layer for each named run, e.g. at the first step.

    Args:
        losses: {arm name: [the loss at each step, one list per seed]}.
        grad_norms: {run name: one gradient norm per layer}, or None for no right panel.
        smooth: the window of the moving average (1: the raw losses).
        chance: the loss of a uniform guess (ln V), drawn as a dotted line, or None.
        warmup_steps: the end of the warm-up, drawn as a vertical line, or None.
    """
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be an int >= 1, got {smooth!r}")
    if not isinstance(losses, Mapping) or not losses:
        raise TypeError(f"losses must be a non-empty dict {{arm name: [one loss curve per seed]}}, got {losses!r}")
    if chance is not None:
        check_number("chance", chance)
    if warmup_steps is not None:
        check_int("warmup_steps", warmup_steps, 0)
    curves_of = {}
    for name, runs in losses.items():
        array = to_numpy(runs, f"losses[{name!r}]")
        if array.ndim != 2 or array.shape[1] < 1:
            raise ValueError(
                f"losses[{name!r}] must be a list of loss curves of one length (one per seed), got shape {array.shape}"
            )
        curves_of[name] = array
    fig, axes = new_figure(1, 2 if grad_norms is not None else 1, size=(11.5 if grad_norms is not None else 6.4, 4.0))
    ax = axes[0, 0]
    with course_style():
        colours = _COLOURS
        for i, (name, array) in enumerate(curves_of.items()):
            window = min(smooth, array.shape[1])
            kernel = np.ones(window) / window
            steps = np.arange(window, array.shape[1] + 1)  # the step at the end of each window (1-based)
            for j, run in enumerate(array):
                label = f"{name} ({len(array)} seeds)" if j == 0 else None
                ax.plot(steps, np.convolve(run, kernel, mode="valid"), color=colours[i % len(colours)], label=label)
        if chance is not None:
            ax.axhline(chance, color="black", linestyle=":", linewidth=1.0, label=f"chance, {chance:.2f}")
        if warmup_steps:
            ax.axvline(warmup_steps, color="grey", linestyle="--", linewidth=0.8, label="end of the warm-up")
        ax.set_yscale("log")
        ax.set_title(f"training loss, moving average of {smooth} steps")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (log scale)")
        ax.legend(fontsize=8)
    if grad_norms is not None:
        gradient_norms_per_layer(grad_norms, title="gradient norm per layer, first step", ax=axes[0, 1])
    return fig
