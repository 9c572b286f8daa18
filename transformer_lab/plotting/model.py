"""Figures of chapter 09: the Noam schedule, label smoothing, training curves, cross-attention of a trained model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from transformer_lab._checks import check_int
from transformer_lab.plotting.attention import attention_heatmap, attention_values
from transformer_lab.plotting.style import check_lengths, course_style, curves, new_figure, to_numpy

__all__ = ["noam_schedule_plot", "label_smoothing_plot", "training_curves", "cross_attention_maps"]


def noam_schedule_plot(
    settings: Sequence[tuple[int, int]] = ((512, 4000), (512, 8000), (256, 4000)),
    steps: int = 20000,
    factor: float = 1.0,
) -> Figure:
    """The paper's learning rate against the step, one curve per (d_model, warmup) setting (chapter 09)."""
    from transformer_lab.training import noam_lr

    if not settings or not all(isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in settings):
        raise ValueError(f"settings must be a list of (d_model, warmup) pairs, e.g. [(512, 4000)], got {settings!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    import torch

    step = torch.arange(1, steps + 1)
    series = {
        f"d_model={d}, warmup={w}": (step.tolist(), noam_lr(step, d, w, factor).tolist())  # type: ignore[union-attr]
        for d, w in settings
    }
    fig, axes = new_figure(size=(6.0, 3.4))
    curves(axes[0, 0], series, title="Noam schedule: linear warm-up, then 1/sqrt(step)", y_title="learning rate")
    return fig


def label_smoothing_plot(
    labels: Sequence[str], target: int, pad_id: int = 0, smoothing: float = 0.1, log_y: bool = False
) -> Figure:
    """Three target distributions for one position, as bars, on a linear scale (chapter 09).

    One-hot; ours (`tl.training.smoothed_targets`: eps spread over the real tokens, PAD gets 0); and
    PyTorch's `label_smoothing` (eps / V on every class, PAD and the true token included). The left
    panel shows the whole distribution (the true token keeps about 1 - eps); the right one zooms in on
    every other token, where the two smoothings differ: ours gives PAD nothing and each other token
    eps / (V - 2), PyTorch gives every token eps / V.

    Args:
        labels: one label per vocabulary entry (V of them).
        target: the id of the true token.
        log_y: draw the left panel on a log scale (the right one is always linear).
    """
    import torch

    from transformer_lab.training import smoothed_targets

    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"labels must be a list of strings, one per vocabulary entry, got {type(labels).__name__}")
    v = len(labels)
    if v < 3:
        raise ValueError(f"labels must name at least 3 tokens (PAD, the true token and one other), got {v}")
    check_int("target", target)
    check_int("pad_id", pad_id, 0, v)
    if not 0 <= target < v or target == pad_id:
        raise ValueError(f"target must be a non-PAD id in [0, {v}), got {target}")
    one_hot = np.zeros(v)
    one_hot[target] = 1.0
    ours = to_numpy(smoothed_targets(torch.tensor([target]), v, pad_id, smoothing)[0])
    theirs = (1 - smoothing) * one_hot + smoothing / v
    series = (("one-hot", one_hot), ("ours (PAD excluded)", ours), ("F.cross_entropy(label_smoothing)", theirs))
    fig, axes = new_figure(1, 2, size=(max(9.0, 0.16 * v + 5.0), 3.6))
    whole, zoom = axes[0, 0], axes[0, 1]
    x = np.arange(v)
    others = x[x != target]
    with course_style():
        for k, (name, values) in enumerate(series):
            whole.bar(x + (k - 1) * 0.28, values, width=0.28, label=name)
            zoom.bar(np.arange(len(others)) + (k - 1) * 0.28, values[others], width=0.28, label=name)
        whole.set_xticks(x)
        whole.set_xticklabels(list(labels), rotation=90, fontsize=7)
        if log_y:
            whole.set_yscale("log")
        whole.set_xlabel("token")
        whole.set_ylabel("target probability")
        whole.set_title(f"the whole distribution (eps = {smoothing})")
        zoom.set_xticks(np.arange(len(others)))
        zoom.set_xticklabels([labels[i] for i in others], rotation=90, fontsize=7)
        zoom.set_ylim(0, 1.6 * max(ours[others].max(), theirs[others].max()))
        zoom.set_xlabel("token (the true one left out)")
        zoom.set_title("zoom: every other token")
        pad_at = int(np.nonzero(others == pad_id)[0][0]) if pad_id in others else None
        if pad_at is not None:
            zoom.annotate(
                "PAD: 0 in ours",
                (pad_at, 0),
                xytext=(pad_at + 0.5, 1.25 * max(ours[others].max(), theirs[others].max())),
                arrowprops={"arrowstyle": "->", "lw": 0.8},
                fontsize=8,
            )
        zoom.legend(fontsize=8, loc="upper right")
    return fig


def training_curves(histories: object | Mapping[str, object], title: str = "") -> Figure:
    """Loss, learning rate and validation exact match of one or several `History` objects (chapter 09).

    Args:
        histories: a `tl.training.History` (or its `to_dict()`), or {name: history} to compare runs.
    """
    if not isinstance(histories, Mapping) or "loss" in histories:
        histories = {"run": histories}
    if not histories:
        raise ValueError("histories must hold at least one run")
    runs = {}
    needed = ("step", "loss", "lr", "eval_step", "val_exact_match")
    for name, h in histories.items():  # type: ignore[union-attr]
        if hasattr(h, "to_dict"):
            h = h.to_dict()
        if not isinstance(h, Mapping):
            raise TypeError(
                f"histories must be a tl.training.History, its to_dict(), or {{name: history}}; "
                f"run {name!r} is a {type(h).__name__}"
            )
        missing = [key for key in needed if key not in h]
        if missing:
            raise ValueError(f"histories: run {name!r} lacks {missing}; pass what tl.training.train returned")
        check_lengths(f"histories: run {name!r}", h, ("step", "loss", "lr"), ("eval_step", "val_exact_match"))
        runs[name] = h
    fig, axes = new_figure(1, 3, size=(12.0, 3.4))
    curves(
        axes[0, 0], {n: (h["step"], h["loss"]) for n, h in runs.items()}, "training loss", y_title="loss", log_y=True
    )
    curves(axes[0, 1], {n: (h["step"], h["lr"]) for n, h in runs.items()}, "learning rate", y_title="lr")
    curves(
        axes[0, 2],
        {n: (h["eval_step"], h["val_exact_match"]) for n, h in runs.items()},
        "validation exact match (greedy)",
        y_title="share of whole answers right",
    )
    axes[0, 2].set_ylim(-0.02, 1.02)
    if title:
        fig.suptitle(title)
    return fig


def cross_attention_maps(
    maps: Sequence[tuple[object, Sequence[str], Sequence[str], str]],
    n_cols: int = 2,
    title: str = "",
) -> Figure:
    """Several cross-attention maps side by side, e.g. one per date format (chapters 07, 09).

    Args:
        maps: (weights (T, S), source labels (S), output labels (T), panel title) for each panel;
            rows are the decoder's positions (queries), columns the source characters (keys).
        n_cols: panels per row.
    """
    if not isinstance(maps, (list, tuple)):  # a generator would be used up by the checks below
        raise TypeError(f"maps must be a list of (weights, source_labels, output_labels, title), got {maps!r}")
    if not maps:
        raise ValueError("maps must hold at least one (weights, source_labels, output_labels, title)")
    if isinstance(n_cols, bool) or not isinstance(n_cols, int) or n_cols < 1:
        raise ValueError(f"n_cols must be a positive int, got {n_cols!r}")
    shapes = []
    for i, m in enumerate(maps):
        if not isinstance(m, (tuple, list)) or len(m) != 4:
            raise TypeError(f"maps[{i}] must be a tuple (weights, source_labels, output_labels, title)")
        t, s = attention_values(f"maps[{i}] weights", m[0], "one (T, S) map per panel").shape
        for labels, n, what in ((m[1], s, "source_labels (one per key)"), (m[2], t, "output_labels (one per query)")):
            if labels is not None and (isinstance(labels, str) or not hasattr(labels, "__len__") or len(labels) != n):
                shown = len(labels) if hasattr(labels, "__len__") and not isinstance(labels, str) else repr(labels)
                raise ValueError(
                    f"maps[{i}]: its weights are (T, S) = {(t, s)}, so {what} must be {n} labels, got {shown}"
                )
        shapes.append((t, s))
    n_rows = -(-len(maps) // n_cols)
    widest = max(s for _, s in shapes)
    tallest = max(t for t, _ in shapes)
    fig, axes = new_figure(n_rows, n_cols, size=(n_cols * (0.3 * widest + 2.4), n_rows * (0.3 * tallest + 1.9)))
    for ax, (weights, src_labels, out_labels, name) in zip(axes.flat, maps, strict=False):
        attention_heatmap(weights, src_labels, out_labels, title=name, ax=ax, annotate=False)
        ax.tick_params(axis="x", labelrotation=0)  # single characters (年, 月, 日 included) read best upright
    for ax in list(axes.flat)[len(maps) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig
