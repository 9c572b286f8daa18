"""Figures of chapter 11 (the modern decoder): the soft-cap, the MLP's activations, rotary scores by position,
what Newton-Schulz does to singular values, validation loss against training time, and the ablation's gains.

Each function returns a new Figure in the course's style; a notebook cell that draws is one line.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from transformer_lab.plotting.style import (
    CMAP_SIGNED,
    check_lengths,
    check_range,
    course_style,
    curves,
    finite_values,
    heatmap,
    new_figure,
    to_numpy,
)

__all__ = ["soft_cap_curves", "activation_curves", "rope_scores", "singular_values", "loss_by_time", "ablation_gains"]


def _positive_numbers(name: str, values: object) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of positive numbers, got {values!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name} must hold positive finite numbers, got {value!r}")
    return [float(v) for v in values]


def soft_cap_curves(caps: Sequence[float] = (5.0, 15.0, 30.0), x_range: tuple[float, float] = (-60.0, 60.0)) -> Figure:
    """The logit soft-cap c tanh(z / c) for each cap c, beside the identity (chapter 11).

    Args:
        caps: the caps drawn (nanochat: 15; Gemma 2: 30 for the final logits).
        x_range: the logits z shown.
    """
    values = _positive_numbers("caps", caps)
    low, high = check_range("x_range", x_range)
    z = torch.linspace(low, high, 601, dtype=torch.float64)
    series = {"no cap (identity)": (z.tolist(), z)}
    series.update({f"c = {c:g}": (z.tolist(), c * torch.tanh(z / c)) for c in values})
    fig, axes = new_figure(size=(5.6, 3.8))
    ax = axes[0, 0]
    curves(ax, series, title="logit soft-cap: c tanh(z / c)", x_title="logit z", y_title="capped logit")
    with course_style():
        for c in values:
            ax.axhline(c, color="0.6", linestyle=":", linewidth=0.8)
            ax.axhline(-c, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_ylim(low, high)
    return fig


_ACTIVATIONS = {
    "gelu_tanh": ("GELU, tanh approximation (GPT-2)", lambda v: F.gelu(v, approximate="tanh")),
    "relu": ("ReLU (the paper)", F.relu),
    "relu2": ("ReLU squared (nanochat)", lambda v: F.relu(v) ** 2),
    "silu": ("SiLU, SwiGLU's gate (Llama, Qwen3)", F.silu),
}


def activation_curves(
    names: Sequence[str] = ("gelu_tanh", "relu2", "silu"), x_range: tuple[float, float] = (-3.0, 3.0)
) -> Figure:
    """The MLP activations of the models chapter 11 compares, on one axes.

    Args:
        names: among "gelu_tanh", "relu", "relu2", "silu".
        x_range: the inputs shown.
    """
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
        raise TypeError(f"names must be a non-empty list of names, e.g. ['relu2'], got {names!r}")
    unknown = [n for n in names if n not in _ACTIVATIONS]
    if unknown:
        raise ValueError(f"names must be among {sorted(_ACTIVATIONS)}, got {unknown}")
    low, high = check_range("x_range", x_range)
    xs = torch.linspace(low, high, 401, dtype=torch.float64)
    fig, axes = new_figure(size=(5.6, 3.8))
    ax = axes[0, 0]
    series = {_ACTIVATIONS[n][0]: (xs.tolist(), _ACTIVATIONS[n][1](xs)) for n in names}
    curves(ax, series, title="MLP activations", x_title="x", y_title="activation(x)")
    with course_style():
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.axvline(0.0, color="black", linewidth=0.5)
        ax.set_ylim(-1.0, high)
    return fig


def rope_scores(scores: object, title: str = "") -> Figure:
    """Scores q_m . k_n of one query vector and one key vector placed at every pair of positions (m, n).

    With rotary positions every diagonal (one distance m - n) holds one value: the score depends on the
    distance only. Drawn with a signed colour scale centred on 0.

    Args:
        scores: (L, L) matrix, row m = the query's position, column n = the key's.
    """
    values = finite_values("scores", to_numpy(scores, "scores"))
    if values.ndim != 2 or values.shape[0] != values.shape[1]:
        raise ValueError(f"scores must be a square (L, L) matrix of positions, got shape {values.shape}")
    bound = float(np.abs(values).max()) or 1.0
    fig, axes = new_figure(size=(0.35 * values.shape[1] + 2.6, 0.3 * values.shape[0] + 1.6))
    labels = [str(i) for i in range(values.shape[0])]
    heatmap(
        axes[0, 0],
        values,
        labels,
        labels,
        title=title or "score q . k by the positions of q and k",
        x_title="position n of the key",
        y_title="position m of the query",
        cmap=CMAP_SIGNED,
        vmin=-bound,
        vmax=bound,
        label_names=("positions", "positions"),
    )
    return fig


def singular_values(by_name: Mapping[str, object], title: str = "") -> Figure:
    """Singular values of matrices, largest first, one curve each (chapter 11: a momentum before and after
    Newton-Schulz, whose singular values all land near 1).

    Args:
        by_name: {name: 1-D singular values, or a 2-D matrix whose singular values are taken}.
    """
    if not isinstance(by_name, Mapping) or not by_name:
        raise TypeError("by_name must be a non-empty dict {name: singular values or matrix}")
    series = {}
    for name, value in by_name.items():
        array = finite_values(f"by_name[{name!r}]", to_numpy(value, f"by_name[{name!r}]"))
        if array.ndim == 2:
            array = np.linalg.svd(array, compute_uv=False)
        if array.ndim != 1:
            raise ValueError(f"by_name[{name!r}] must be 1-D singular values or a 2-D matrix, got shape {array.shape}")
        ordered = np.sort(array)[::-1]
        series[name] = (list(range(1, len(ordered) + 1)), ordered)
    fig, axes = new_figure(size=(5.6, 3.8))
    curves(
        axes[0, 0],
        series,
        title=title or "singular values, largest first",
        x_title="index (largest first)",
        y_title="singular value",
        argument="by_name",
    )
    with course_style():
        axes[0, 0].axhline(1.0, color="0.4", linestyle="--", linewidth=0.8)
    return fig


def loss_by_time(
    histories: Mapping[str, object], clock: str = "CPU", target: float | None = None, title: str = ""
) -> Figure:
    """Validation loss against training time (evaluations excluded) of several `train_gpt` runs (chapter 11).

    Args:
        histories: {name: `TextHistory` or its `to_dict()`}; their `eval_seconds` and `val_loss` are drawn.
        clock: what the seconds count, for the axis title ("CPU" for train_gpt(clock="cpu"), "wall").
        target: draw this validation loss as a dashed line.
    """
    if not isinstance(histories, Mapping) or not histories:
        raise TypeError("histories must be a non-empty dict {name: TextHistory}")
    if not isinstance(clock, str):
        raise TypeError(f"clock must be a str naming the clock (e.g. 'CPU'), got {clock!r}")
    series = {}
    for name, h in histories.items():
        if hasattr(h, "to_dict"):
            h = h.to_dict()
        if not isinstance(h, Mapping) or "eval_seconds" not in h or "val_loss" not in h:
            raise ValueError(f"histories[{name!r}] must be what tl.training.train_gpt returned (or its to_dict())")
        check_lengths(f"histories[{name!r}]", h, ("eval_seconds", "val_loss"))
        xs = finite_values(f"histories[{name!r}]['eval_seconds']", to_numpy(h["eval_seconds"], "eval_seconds"))
        ys = finite_values(f"histories[{name!r}]['val_loss']", to_numpy(h["val_loss"], "val_loss"))
        series[name] = (xs, ys)
    if target is not None and (isinstance(target, bool) or not isinstance(target, numbers.Real)):
        raise TypeError(f"target must be a number (a validation loss) or None, got {target!r}")
    fig, axes = new_figure(size=(6.4, 3.8))
    ax = axes[0, 0]
    curves(
        ax,
        series,
        title=title or "validation loss against training time",
        x_title=f"training time, {clock} seconds (evaluations excluded)",
        y_title="validation loss (nats / char)",
        argument="histories",
    )
    with course_style():
        for line, (xs, ys) in zip(ax.get_lines(), series.values(), strict=True):
            ax.scatter(xs[-1:], ys[-1:], s=18, color=line.get_color())
            ax.annotate(f"{ys[-1]:.3f}", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4))
        if target is not None:
            ax.axhline(target, color="0.4", linestyle="--", linewidth=1.0)
    return fig


def ablation_gains(table: Mapping[str, Mapping[str, object]], title: str = "") -> Figure:
    """Chapter 11's ablation as bars: what each change is worth, with the seed spread it must beat.

    Args:
        table: `tl.training.ablation_summary(runs)`: {variant: row}; the rows with a "gain" are drawn, the
            "+ X" rows (added to chapter 10's model) on the left panel, the "- X" and "full + X" rows (removed
            from, or added to, the full modern model) on the right.

    Each bar is a gain in validation loss (positive: the change lowers the loss); the grey band around 0 on its
    row is +- the noise (the larger seed spread of the variant and its reference): a bar that ends inside it is
    within noise.
    """
    if not isinstance(table, Mapping) or not table:
        raise TypeError("table must be the non-empty dict tl.training.ablation_summary returned")
    panels: dict[str, list[tuple[str, float, float]]] = {
        "added to chapter 10's model": [],
        "in the full modern model": [],
    }
    for name, row in table.items():
        if not isinstance(row, Mapping):
            raise TypeError(f"table[{name!r}] must be a dict (a row of ablation_summary), got {row!r}")
        if "gain" not in row:
            continue
        gain, noise = float(row["gain"]), float(row["noise"])  # type: ignore[arg-type]
        if not (math.isfinite(gain) and math.isfinite(noise)):
            raise ValueError(f"table[{name!r}] has a non-finite gain or noise: {gain}, {noise}")
        panel = (
            "added to chapter 10's model"
            if name.startswith("+ ") or name == "full modern"
            else "in the full modern model"
        )
        panels[panel].append((name, gain, noise))
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        raise ValueError("table has no row with a gain: it needs 'chapter 10' or 'full modern' as a reference")
    rows = max(len(v) for v in panels.values())
    fig, axes = new_figure(1, len(panels), size=(5.2 * len(panels), 0.9 + 0.32 * rows))
    with course_style():
        for ax, (panel, items) in zip(axes[0], panels.items(), strict=True):
            names = [name for name, _, _ in items][::-1]
            gains = np.array([gain for _, gain, _ in items][::-1])
            noises = np.array([noise for _, _, noise in items][::-1])
            ys = np.arange(len(items))
            ax.barh(ys, 2 * noises, left=-noises, height=0.8, color="0.88", label="seed spread (noise)")
            colors = [
                "tab:green" if g > n else "tab:red" if -g > n else "tab:gray"
                for g, n in zip(gains, noises, strict=True)
            ]
            ax.barh(ys, gains, height=0.5, color=colors)
            ax.axvline(0.0, color="0.3", linewidth=0.8)
            ax.set_yticks(ys, names)
            ax.set_xlabel("gain in validation loss (positive: the change helps)")
            ax.set_title(panel)
        axes[0, 0].legend(loc="best", fontsize="small")
        if title:
            fig.suptitle(title)
    return fig
