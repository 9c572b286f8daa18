"""Figures of chapter 10 (the GPT): two recipes' curves, sampling filters, heads by distance, poem rates."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from transformer_lab._checks import check_number
from transformer_lab.plotting.attention import NAN_WEIGHTS, WEIGHTS, stack_layers
from transformer_lab.plotting.style import (
    CMAP_WEIGHTS,
    check_lengths,
    course_style,
    curves,
    finite_values,
    heatmap,
    new_figure,
    probabilities,
    to_numpy,
)

__all__ = ["recipe_curves", "sampling_filters", "attention_by_distance", "sample_rates"]


def _history(name: str, h: object) -> Mapping[str, object]:
    if hasattr(h, "to_dict"):
        h = h.to_dict()
    if not isinstance(h, Mapping):
        raise TypeError(
            f"histories[{name!r}] must be a tl.training.TextHistory or its to_dict(), got {type(h).__name__}"
        )
    missing = [key for key in ("step", "loss", "eval_step", "val_loss") if key not in h]
    if missing:
        raise ValueError(f"histories[{name!r}] lacks {missing}; pass what tl.training.train_gpt returned")
    check_lengths(f"histories[{name!r}]", h, ("step", "loss"), ("eval_step", "val_loss"))
    return h


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """A running mean over `window` steps (shorter at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def recipe_curves(
    histories: Mapping[str, object],
    characters_per_step: Mapping[str, int],
    target: float | None = None,
    smooth: int = 50,
    title: str = "",
) -> Figure:
    """Training and validation loss of several `train_gpt` runs against the characters trained on (chapter 10).

    The x-axis is the number of training characters seen (step x batch x block), which does not depend on the
    machine, so a run of this machine and a shipped log of another compare fairly; on one thread the training
    time is close to proportional to it.

    Args:
        histories: {name: `TextHistory` or its `to_dict()`}.
        characters_per_step: {name: batch_size x block} for every run.
        target: draw this validation loss as a dashed line (e.g. 1.88).
        smooth: the training loss is drawn as a running mean over this many steps.
    """
    if not isinstance(histories, Mapping) or not histories:
        raise TypeError("histories must be a non-empty dict {name: TextHistory}")
    if not isinstance(characters_per_step, Mapping) or set(characters_per_step) != set(histories):
        raise ValueError(
            f"characters_per_step must give batch x block for every run: runs {sorted(histories)}, got "
            f"{sorted(characters_per_step) if isinstance(characters_per_step, Mapping) else characters_per_step!r}"
        )
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be an int >= 1 (steps in the running mean), got {smooth!r}")
    if target is not None:
        check_number("target", target)
    runs = {name: _history(name, h) for name, h in histories.items()}
    train, val = {}, {}
    for name, h in runs.items():
        per_step = characters_per_step[name]
        if isinstance(per_step, bool) or not isinstance(per_step, int) or per_step < 1:
            raise ValueError(f"characters_per_step[{name!r}] must be an int >= 1, got {per_step!r}")
        steps = to_numpy(h["step"], "step") * per_step / 1e6
        train[name] = (steps, _smooth(to_numpy(h["loss"], "loss"), smooth))
        val[name] = (to_numpy(h["eval_step"], "eval_step") * per_step / 1e6, to_numpy(h["val_loss"], "val_loss"))
    fig, axes = new_figure(1, 2, size=(10.0, 3.6))
    x_title = "training characters seen (millions)"
    curves(axes[0, 0], train, f"training loss (running mean over {smooth} steps)", x_title, "loss (nats / char)")
    curves(axes[0, 1], val, "validation loss (whole split)", x_title, "loss (nats / char)")
    with course_style():
        for ax in axes[0]:
            ax.set_ylim(1.4, 3.0)
        labelled: list[tuple[float, float]] = []
        for line, (xs, ys) in zip(axes[0, 1].get_lines(), val.values(), strict=True):
            axes[0, 1].scatter(xs[-1:], ys[-1:], s=18, color=line.get_color())
            end = (float(xs[-1]), float(ys[-1]))
            # two runs ending at nearly the same point (a rerun of a shipped run): the second label goes below
            below = any(abs(end[0] - x) < 0.05 and abs(end[1] - y) < 0.05 for x, y in labelled)
            offset = (4, -12 if below else 4)
            axes[0, 1].annotate(f"{end[1]:.3f}", end, textcoords="offset points", xytext=offset, color=line.get_color())
            labelled.append(end)
        if target is not None:
            axes[0, 1].axhline(target, color="0.4", linestyle="--", linewidth=1.0)
            axes[0, 1].annotate(f"{target}", (0.0, target), textcoords="offset points", xytext=(2, -12), color="0.3")
    if title:
        fig.suptitle(title)
    return fig


def sampling_filters(
    rows: Mapping[str, object], labels: Sequence[str], title: str = "", show: int | None = None
) -> Figure:
    """Next-token distributions side by side: one panel per sampling setting (chapter 10).

    Each panel's title says how many tokens of the whole vocabulary the setting leaves a probability above 0,
    i.e. how many it can still draw: temperature reshapes the distribution and keeps every token; top-k and
    top-p set the others to 0.

    Args:
        rows: {setting name: probabilities (V,)} over the whole vocabulary, e.g.
            softmax(filter_logits(logits / T, top_k, top_p)).
        labels: V labels (the characters), drawn under the bars.
        show: draw only this many tokens, the most likely under the first setting, in vocabulary order
            (None: all V). The counts in the titles are over all V either way.
    """
    if not isinstance(rows, Mapping) or not rows:
        raise TypeError("rows must be a non-empty dict {setting: probabilities (V,)}")
    values = {name: to_numpy(p, f"rows[{name!r}]") for name, p in rows.items()}
    for name, p in values.items():
        if p.ndim != 1 or len(p) != len(labels):
            raise ValueError(f"rows[{name!r}] must have one probability per label ({len(labels)}), got {p.shape}")
        what = "probabilities over the vocabulary (softmax of the logits)"
        probabilities(f"rows[{name!r}]", p, what)
        if abs(p.sum() - 1.0) > 1e-2:  # a filtered row still sums to 1: its removed tokens have probability 0
            raise ValueError(f"rows[{name!r}] must hold {what}, summing to 1, got a sum of {p.sum():.4g}")
    vocab = len(labels)
    if show is None:
        shown = np.arange(vocab)
    elif isinstance(show, bool) or not isinstance(show, int) or not 1 <= show <= vocab:
        raise ValueError(f"show must be None or an int in [1, {vocab}], got {show!r}")
    else:
        first = next(iter(values.values()))
        shown = np.sort(np.argsort(-first, kind="stable")[:show])  # the most likely, in vocabulary order
    fig, axes = new_figure(1, len(values), size=(2.6 * len(values) + 0.6, 3.0))
    with course_style():
        for ax, (name, p) in zip(axes[0], values.items(), strict=True):
            possible = int((p > 0).sum())  # over the whole vocabulary, shown or not
            ax.bar(range(len(shown)), p[shown], color="#1f77b4")
            ax.set_xticks(range(len(shown)))
            ax.set_xticklabels([labels[i] for i in shown], fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(f"{name}\n{possible} of {vocab} can be drawn")
        axes[0, 0].set_ylabel("probability")
    if title:
        fig.suptitle(title)
    return fig


def attention_by_distance(weights: object, max_distance: int = 16, title: str = "") -> Figure:
    """Where each head looks: its mean attention weight at each distance back from the query (chapter 10).

    Row "layer l, head h", column d: the mean, over the queries t >= max_distance, of the weight that query t
    gives to key t - d (d = 0: the query's own position). A head that reads the previous character has its
    mass in column 1; one that spreads over the context has a flat row.

    Args:
        weights: (L, H, T, T) causal attention weights of one sequence (a list of (H, T, T) works too).
        max_distance: the largest distance shown; T must exceed it.
    """
    values = stack_layers("weights", weights, "(H, T, T)")
    if values.ndim != 4 or values.shape[-1] != values.shape[-2]:
        raise ValueError(f"weights must be (layers, heads, T, T), got shape {values.shape}")
    probabilities("weights", finite_values("weights", values, NAN_WEIGHTS), WEIGHTS)
    n_layers, n_heads, t, _ = values.shape
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or not 1 <= max_distance < t:
        raise ValueError(f"max_distance must be an int in [1, T={t}), got {max_distance!r}")
    queries = np.arange(max_distance, t)
    table = np.stack(
        [values[:, :, queries, queries - d].mean(axis=-1) for d in range(max_distance + 1)], axis=-1
    )  # (L, H, max_distance + 1)
    table = table.reshape(n_layers * n_heads, max_distance + 1)
    names = [f"layer {layer + 1}, head {head + 1}" for layer in range(n_layers) for head in range(n_heads)]
    fig, axes = new_figure(size=(0.34 * (max_distance + 1) + 3.2, 0.3 * len(names) + 1.4))
    heatmap(
        axes[0, 0],
        table,
        [str(d) for d in range(max_distance + 1)],
        names,
        title=title or "mean attention weight by distance back",
        x_title="distance back from the query (0 = itself)",
        cmap=CMAP_WEIGHTS,
        vmin=0.0,
        vmax=1.0,
    )
    return fig


def sample_rates(rates: Mapping[str, Mapping[str, float]], title: str = "") -> Figure:
    """Grouped bars: for each model, each measured rate in [0, 1] (chapter 10: poem shape, verbatim copies).

    Args:
        rates: {model name: {rate name: value in [0, 1]}}, every model with the same rate names.
    """
    if not isinstance(rates, Mapping) or not rates:
        raise TypeError("rates must be a non-empty dict {model: {rate: value}}")
    names = list(next(iter(rates.values())))
    for model, row in rates.items():
        if not isinstance(row, Mapping) or list(row) != names:
            raise ValueError(f"rates[{model!r}] must have the rates {names}, got {row!r}")
        for name, value in row.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"rates[{model!r}][{name!r}] must be a share in [0, 1] (0.45, not 45), got {value!r}")
    fig, axes = new_figure(size=(1.6 * len(rates) * len(names) + 2.0, 3.2))
    ax = axes[0, 0]
    width = 0.8 / len(names)
    with course_style():
        for i, name in enumerate(names):
            xs = np.arange(len(rates)) + (i - (len(names) - 1) / 2) * width
            ys = [float(row[name]) for row in rates.values()]
            bars = ax.bar(xs, ys, width, label=name)
            ax.bar_label(bars, labels=[f"{y:.0%}" for y in ys], fontsize=8)
        ax.set_xticks(range(len(rates)))
        ax.set_xticklabels(list(rates))
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of samples")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it covers no bar
        ax.set_title(title)
    return fig
