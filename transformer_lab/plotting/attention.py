"""Attention maps and mask pictures (chapters 01-03, 06, 07, 09)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from transformer_lab.plotting.style import (
    CMAP_MASK,
    CMAP_WEIGHTS,
    course_style,
    finite_values,
    heatmap,
    new_figure,
    probabilities,
    to_numpy,
)

__all__ = [
    "attention_heatmap",
    "attention_grid",
    "mask_picture",
    "mask_legend",
    "mask_grid",
    "mask_broadcast",
    "softmax_saturation",
    "score_variance",
]


#: Where NaN weights come from, said when they are refused.
NAN_WEIGHTS = (
    "a query whose keys are all masked gets NaN from nn.MultiheadAttention or a hand-written softmax (0 / 0), "
    "where tl.scaled_dot_product_attention gives zeros; leave such rows out or use the library's attention"
)
WEIGHTS = "attention weights (each row a softmax over the keys; pass scores through torch.softmax first)"


def _matrix(name: str, values: object, hint: str) -> np.ndarray:
    """`values` as a 2-D (T, S) numpy array, or a ValueError naming the argument."""
    array = to_numpy(values, name)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (T, S) matrix, got shape {array.shape}; {hint}")
    return array


def attention_values(name: str, values: object, hint: str = "pick one batch row and head") -> np.ndarray:
    """`values` as a (T, S) numpy array of attention weights: at least one query and one key, finite, in [0, 1]."""
    array = _matrix(name, values, hint)
    if 0 in array.shape:
        raise ValueError(f"{name} is empty (shape {array.shape}): there is no query or no key to draw")
    return probabilities(name, finite_values(name, array, NAN_WEIGHTS), WEIGHTS)


def stack_layers(name: str, weights: object, shape: str) -> np.ndarray:
    """A tensor or array, or a list of per-layer ones, as one numpy array with the layers first.

    Every layer must have the same shape (heads, queries, keys): a ragged list cannot be one grid. `shape`
    names the shape each layer has, for the message.
    """
    if not isinstance(weights, (list, tuple)):
        return to_numpy(weights, name)
    if not weights:
        raise ValueError(f"{name} is an empty list: pass one {shape} array per layer")
    layers = [to_numpy(w, f"{name}[{i}]") for i, w in enumerate(weights)]
    for i, layer in enumerate(layers[1:], start=1):
        if layer.shape != layers[0].shape:
            raise ValueError(
                f"{name}[{i}] has shape {layer.shape} but {name}[0] has {layers[0].shape}: every layer must be a "
                f"{shape} array of the same shape (the same sequence, heads and length)"
            )
    return np.stack(layers)


def mask_values(name: str, mask: object, hint: str) -> np.ndarray:
    """`mask` as a (T, S) numpy array of 0 and 1 (a bool mask), or an error naming the argument."""
    values = _matrix(name, mask, hint)
    if not np.isin(values, (0.0, 1.0)).all():
        raise ValueError(
            f"{name} must be a bool (or 0/1) mask, True = may attend; got other values "
            f"(from {np.nanmin(values) if values.size else 0:.4g} to {np.nanmax(values) if values.size else 0:.4g}: "
            "weights? token ids? build masks with tl.padding_mask / tl.causal_mask)"
        )
    return values


def _axes_for(values: np.ndarray, cell_width: float, width_pad: float, height_pad: float) -> Axes:
    """A new figure's single axes, sized so each of the (T, S) cells stays readable."""
    _, axes = new_figure(size=(cell_width * values.shape[1] + width_pad, 0.4 * values.shape[0] + height_pad))
    return axes[0, 0]


def attention_heatmap(
    weights: object,
    key_labels: Sequence[str] | None = None,
    query_labels: Sequence[str] | None = None,
    title: str = "attention weights",
    ax: Axes | None = None,
    annotate: bool | None = None,
) -> Figure:
    """One (T, S) matrix of attention weights: queries down the rows, keys along the columns.

    Args:
        weights: (T, S) weights, rows summing to 1 (a tensor or array).
        key_labels: S labels for the columns (the tokens attended to).
        query_labels: T labels for the rows (the tokens attending).
        annotate: write each weight in its cell (default: when the matrix is at most 10 x 10).
    """
    values = attention_values("weights", weights)
    ax = ax if ax is not None else _axes_for(values, cell_width=0.45, width_pad=2.6, height_pad=1.8)
    if annotate is None:
        annotate = max(values.shape) <= 10
    heatmap(
        ax,
        values,
        key_labels,
        query_labels,
        title=title,
        x_title="key (attended to)",
        y_title="query (attending)",
        cmap=CMAP_WEIGHTS,
        vmin=0.0,
        vmax=1.0,
        annotate=annotate,
        label_names=("key_labels", "query_labels"),
    )
    return ax.figure


def attention_grid(
    weights: object,
    key_labels: Sequence[str] | None = None,
    query_labels: Sequence[str] | None = None,
    title: str = "attention weights",
    row_names: Sequence[str] | None = None,
    x_title: str = "key (attended to)",
    y_title: str = "query (attending)",
) -> Figure:
    """A grid of attention maps: one row per layer, one column per head.

    Args:
        weights: (L, H, T, S) for L layers (a list of (H, T, S) tensors works too), or (H, T, S) for one layer.
        row_names: a name for each row (default "layer 1", "layer 2", ...).
        x_title, y_title: the axis titles, written once for the whole grid (the same words as
            `attention_heatmap`'s); pass "" to leave one out.
    """
    values = stack_layers("weights", weights, "(H, T, S)")
    if values.ndim == 3:
        values = values[None]
    if values.ndim != 4:
        raise ValueError(f"weights must be (layers, heads, T, S) or (heads, T, S), got shape {values.shape}")
    if 0 in values.shape:
        raise ValueError(f"weights is empty (shape {values.shape}): there is no layer, head, query or key to draw")
    probabilities("weights", finite_values("weights", values, NAN_WEIGHTS), WEIGHTS)
    n_layers, n_heads, t, s = values.shape
    names = list(row_names) if row_names is not None else [f"layer {i + 1}" for i in range(n_layers)]
    if isinstance(row_names, str) or len(names) != n_layers:
        raise ValueError(f"row_names must be {n_layers} names, one per layer, got {row_names!r}")
    cell = max(2.2, 0.28 * max(t, s) + 1.0)
    fig, axes = new_figure(n_layers, n_heads, size=(cell * n_heads, cell * n_layers))
    for i in range(n_layers):
        for h in range(n_heads):
            ax = axes[i, h]
            heatmap(
                ax,
                values[i, h],
                key_labels if i == n_layers - 1 else None,
                query_labels if h == 0 else None,
                title=f"{names[i]}, head {h + 1}",
                vmin=0.0,
                vmax=1.0,
                colorbar=False,
            )
            if i != n_layers - 1 or key_labels is None:
                ax.set_xticks([])
            if h != 0 or query_labels is None:
                ax.set_yticks([])
    # one colour scale for every panel, drawn once
    fig.colorbar(axes[0, 0].get_images()[0], ax=axes.ravel().tolist(), shrink=0.8, label="weight")
    fig.suptitle(title)
    with course_style():
        if x_title:  # columns: the keys, along the bottom of the grid
            fig.supxlabel(x_title, fontsize="medium")
        if y_title:  # rows: the queries, down its left side
            fig.supylabel(y_title, fontsize="medium")
    return fig


def mask_picture(
    mask: object,
    key_labels: Sequence[str] | None = None,
    query_labels: Sequence[str] | None = None,
    title: str = "mask: may query (row) see key (column)?",
    ax: Axes | None = None,
    legend: bool = True,
    cell_labels: Sequence[Sequence[str]] | None = None,
    x_title: str = "key",
    y_title: str = "query",
) -> Figure:
    """A (T, S) bool mask as a picture: blue where the query may attend to the key, grey where not.

    Every cell is square, so a mask before broadcasting, such as a (1, S) padding mask, is drawn as the
    strip it is; a legend below says which colour is which.

    Args:
        mask: (T, S) bool (or 0/1) mask, True = may attend.
        key_labels: S labels for the columns; query_labels: T labels for the rows (default: positions).
        cell_labels: T lists of S strings written in the cells, e.g. the token at each position of each
            sentence when the rows are the sentences of a batch (whose columns no single list can label).
        x_title, y_title: the axis titles (e.g. "sentence" when the rows are a batch, not queries).
    """
    values = mask_values("mask", mask, "choose a batch row and head first")
    if cell_labels is not None:
        if isinstance(cell_labels, str) or len(cell_labels) != values.shape[0]:
            raise ValueError(
                f"cell_labels must be {values.shape[0]} lists (one per row of the mask) of {values.shape[1]} strings"
            )
        for i, row in enumerate(cell_labels):
            if isinstance(row, str) or len(row) != values.shape[1]:
                raise ValueError(f"cell_labels[{i}] must be a list of {values.shape[1]} strings, one per column")
    ax = ax if ax is not None else _axes_for(values, cell_width=0.4, width_pad=2.2, height_pad=1.6)
    heatmap(
        ax,
        values,
        key_labels,
        query_labels,
        title=title,
        x_title=x_title,
        y_title=y_title,
        cmap=CMAP_MASK,
        vmin=0,
        vmax=1,
        colorbar=False,
        aspect="equal",
        label_names=("key_labels", "query_labels"),
    )
    if legend:
        mask_legend(ax.figure)
    # unlabelled axes count positions 0, 1, ... (never fractional ticks)
    if key_labels is None:
        ax.set_xticks(range(values.shape[1]))
    if query_labels is None:
        ax.set_yticks(range(values.shape[0]))
    # a grid between cells makes the single positions countable
    ax.set_xticks(np.arange(-0.5, values.shape[1], 1), minor=True)
    ax.set_yticks(np.arange(-0.5, values.shape[0], 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    if cell_labels is not None:
        with course_style():
            for (i, j), v in np.ndenumerate(values):
                colour = "white" if v > 0.5 else "black"  # white on blue (True), black on grey (False)
                ax.text(j, i, str(cell_labels[i][j]), ha="center", va="center", fontsize=7, color=colour)
    return ax.figure


def mask_legend(fig: Figure) -> None:
    """One legend below a figure of masks: which colour means True (may attend) and which False (blocked)."""
    handles = [
        Patch(facecolor=CMAP_MASK(1.0), label="True: may attend"),
        Patch(facecolor=CMAP_MASK(0.0), label="False: blocked"),
    ]
    with course_style():
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, handlelength=1.0)


def mask_grid(masks: dict[str, object], key_labels: Sequence[str] | None = None, title: str = "") -> Figure:
    """Several 2-D masks side by side, e.g. {"padding": ..., "causal": ..., "padding & causal": ...}.

    Each mask is (T, S) with T queries and S keys; a mask before broadcasting may have one row
    (e.g. a (1, S) padding mask, drawn as a single strip, its row labelled "all queries"). `key_labels`
    label the columns, and the rows too when a mask is square.
    """
    if not isinstance(masks, dict) or not masks:
        raise ValueError("masks must be a non-empty dict {title: 2-D mask}")
    for name, mask in masks.items():  # all checked before any figure is made
        mask_values(f"masks[{name!r}]", mask, "a (T, S) mask, e.g. tl.padding_mask(tokens, pad_id)[b, 0]")
    fig, axes = new_figure(1, len(masks), size=(3.2 * len(masks), 3.2))
    for ax, (name, mask) in zip(axes[0], masks.items(), strict=True):
        rows = to_numpy(mask, f"masks[{name!r}]").shape[0]
        query_labels = key_labels if key_labels is not None and len(key_labels) == rows else None
        if rows == 1 and key_labels is not None and len(key_labels) != 1:
            query_labels = ["all queries"]  # one row before broadcasting: it holds for every query
        mask_picture(mask, key_labels, query_labels, title=name, ax=ax, legend=False)
    mask_legend(fig)
    if title:
        fig.suptitle(title)
    return fig


def mask_broadcast(
    padding: object,
    causal: object,
    tokens: Sequence[Sequence[str]] | None = None,
    title: str = "padding (B, 1, 1, S) & causal (T, T) -> (B, 1, T, T): one row per sentence b",
) -> Figure:
    """How a batch's padding mask and one causal mask broadcast together: one row of panels per sentence.

    Row b is sentence b of the batch (the batch axis B, drawn downwards): its padding mask before
    broadcasting, a (1, S) strip; that strip copied down the T query rows; the causal mask (T, T), the
    same triangle for every sentence; and their `&`, the (T, T) mask of sentence b's decoder self-attention.

    Args:
        padding: (B, S) or the library's (B, 1, 1, S) bool padding mask, True at the real tokens.
        causal: (T, T) bool causal mask, T == S (self-attention).
        tokens: B lists of S token strings, sentence b's labels in row b (default: positions 0, 1, ...).

    Shape:
        padding (B, S) or (B, 1, 1, S), causal (S, S) -> a figure of B rows of 4 panels.

    Returns:
        the figure, with one legend for the two colours.
    """
    pad = to_numpy(padding, "padding")
    if pad.ndim == 4 and pad.shape[1:3] == (1, 1):
        pad = pad[:, 0, 0]  # (B, S)
    if pad.ndim != 2:
        raise ValueError(
            f"padding must be (B, S) or the library's (B, 1, 1, S) padding mask, got shape {pad.shape}; "
            "build it with tl.padding_mask(tokens, pad_id)"
        )
    mask_values("padding", pad, "a (B, S) padding mask")
    tri = mask_values("causal", causal, "pass one (T, T) causal mask, e.g. tl.causal_mask(T)")
    n_sentences, s = pad.shape
    if tri.shape != (s, s):
        raise ValueError(
            f"causal must be (S, S) = ({s}, {s}) to match the padding mask's {s} positions, got {tri.shape}"
        )
    if tokens is not None:
        if isinstance(tokens, str) or len(tokens) != n_sentences:
            raise ValueError(f"tokens must be {n_sentences} lists of {s} strings, one list per sentence")
        for b, row in enumerate(tokens):
            if isinstance(row, str) or len(row) != s:
                raise ValueError(f"tokens[{b}] must be a list of {s} strings, one per position, got {row!r}")
    fig, axes = new_figure(n_sentences, 4, size=(11.5, 2.9 * n_sentences + 0.6))
    for b in range(n_sentences):
        labels = list(tokens[b]) if tokens is not None else [str(j) for j in range(s)]
        strip = pad[b : b + 1]  # (1, S)
        panels = (
            (strip, ["all queries"], f"sentence {b}: padding (1, S)"),
            (np.repeat(strip, s, axis=0), labels, "copied to (T, S)"),
            (tri, labels, "& causal (T, T)"),
            (strip.astype(bool) & tri.astype(bool), labels, f"= sentence {b}'s mask"),
        )
        for ax, (mask, query_labels, name) in zip(axes[b], panels, strict=True):
            mask_picture(mask, labels, query_labels, title=name, ax=ax, legend=False)
    mask_legend(fig)
    fig.suptitle(title)
    return fig


def softmax_saturation(
    scores: object, scales: Sequence[float], title: str = "softmax saturates as scores grow"
) -> Figure:
    """Why attention divides by sqrt(d_k) (chapter 01): softmax(scale * scores) for growing scales.

    Left: the weights over the keys for each scale; they collapse onto the largest score.
    Right: the largest weight, and the largest entry of the softmax Jacobian d p_i / d s_j
    (the gradient that flows back to the scores), against the scale: when the softmax saturates,
    its gradient vanishes.

    Args:
        scores: (S,) one query's scores over S keys.
        scales: the factors to multiply the scores by (e.g. 0.5, 1, 2, 4, 8, 16).
    """
    values = torch.as_tensor(finite_values("scores", to_numpy(scores, "scores")), dtype=torch.float64)
    if values.ndim != 1 or values.numel() < 2:
        raise ValueError(f"scores must be a 1-D vector of at least 2 scores, got shape {tuple(values.shape)}")
    if isinstance(scales, (str, bytes)) or not isinstance(scales, Sequence):
        raise TypeError(f"scales must be a list of positive numbers, got {type(scales).__name__}")
    given = finite_values("scales", to_numpy(scales, "scales"))
    if given.ndim != 1 or given.size == 0 or (given <= 0).any():
        raise ValueError(f"scales must be a non-empty list of positive numbers, got {list(scales)}")
    factors = given.tolist()  # plain floats
    fig, axes = new_figure(1, 2, size=(9.0, 3.4))
    left, right = axes[0]
    largest_weight, largest_gradient = [], []
    with course_style():
        keys = np.arange(values.numel())
        for factor in factors:
            p = torch.softmax(values * factor, dim=0)  # (S,)
            jacobian = torch.diag(p) - torch.outer(p, p)  # d p_i / d s_j, (S, S)
            largest_weight.append(float(p.max()))
            largest_gradient.append(float(jacobian.abs().max()))
            left.plot(keys, p.numpy(), marker="o", label=f"x {factor:g}")
        left.set_xticks(keys)
        left.set_xlabel("key")
        left.set_ylabel("weight")
        left.set_title("softmax(scale * scores)")
        left.legend(fontsize=8)
        right.plot(factors, largest_weight, marker="o", label="largest weight")
        right.plot(factors, largest_gradient, marker="s", label="largest |d weight / d score|")
        right.set_xscale("log", base=2)
        right.set_xlabel("scale of the scores")
        right.set_ylabel("value")
        right.set_title("saturation kills the gradient")
        right.legend(fontsize=8)
        fig.suptitle(title)
    return fig


def score_variance(
    d_k: Sequence[int],
    unscaled: Sequence[float],
    scaled: Sequence[float],
    title: str = "variance of q . k for random unit-variance vectors",
) -> Figure:
    """The measured variance of dot-product scores against d_k (chapter 01).

    For q, k with independent unit-variance entries, Var(q . k) = d_k, and Var(q . k / sqrt(d_k)) = 1.
    The dashed line draws y = d_k for reference.

    Args:
        d_k: the vector sizes measured.
        unscaled: the measured variance of q . k for each d_k.
        scaled: the measured variance of q . k / sqrt(d_k) for each d_k.
    """
    sizes = finite_values("d_k", to_numpy(d_k, "d_k"))
    raw = finite_values("unscaled", to_numpy(unscaled, "unscaled"))
    normalised = finite_values("scaled", to_numpy(scaled, "scaled"))
    if sizes.ndim != 1 or sizes.size == 0:
        raise ValueError(f"d_k must be a non-empty 1-D sequence, got shape {sizes.shape}")
    if (sizes <= 0).any():  # drawn on a log axis, where 0 and below vanish without a word
        raise ValueError(f"d_k must hold positive sizes, got {sizes.tolist()}")
    if raw.shape != sizes.shape or normalised.shape != sizes.shape:
        raise ValueError(
            f"unscaled and scaled must have one value per d_k ({sizes.size}), got {raw.size} and {normalised.size}"
        )
    fig, axes = new_figure(size=(5.0, 3.6))
    ax = axes[0, 0]
    with course_style():
        ax.plot(sizes, sizes, linestyle="--", color="#7f7f7f", label="y = d_k")
        ax.plot(sizes, raw, marker="o", label="Var(q . k)")
        ax.plot(sizes, normalised, marker="s", label="Var(q . k / sqrt(d_k))")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_ylabel("variance of the scores")
        ax.set_title(title)
        ax.legend(fontsize=8)
    return fig
