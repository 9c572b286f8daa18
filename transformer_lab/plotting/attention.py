"""Attention maps and mask pictures (chapters 01-03, 06, 07, 09)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_lab.plotting.style import CMAP_MASK, CMAP_WEIGHTS, heatmap, new_figure, to_numpy

__all__ = ["attention_heatmap", "attention_grid", "mask_picture", "mask_grid"]


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
    values = to_numpy(weights)
    if values.ndim != 2:
        raise ValueError(f"weights must be a (T, S) matrix, got shape {values.shape}; pick one batch row and head")
    if ax is None:
        fig, axes = new_figure(size=(0.45 * values.shape[1] + 2.6, 0.4 * values.shape[0] + 1.8))
        ax = axes[0, 0]
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
    )
    return ax.figure


def attention_grid(
    weights: object,
    key_labels: Sequence[str] | None = None,
    query_labels: Sequence[str] | None = None,
    title: str = "attention weights",
    row_names: Sequence[str] | None = None,
) -> Figure:
    """A grid of attention maps: one row per layer, one column per head.

    Args:
        weights: (L, H, T, S) for L layers (a list of (H, T, S) tensors works too), or (H, T, S) for one layer.
        row_names: a name for each row (default "layer 1", "layer 2", ...).
    """
    if isinstance(weights, (list, tuple)):
        values = np.stack([to_numpy(w) for w in weights])
    else:
        values = to_numpy(weights)
    if values.ndim == 3:
        values = values[None]
    if values.ndim != 4:
        raise ValueError(f"weights must be (layers, heads, T, S) or (heads, T, S), got shape {values.shape}")
    n_layers, n_heads, t, s = values.shape
    names = list(row_names) if row_names is not None else [f"layer {i + 1}" for i in range(n_layers)]
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
    fig.suptitle(title)
    return fig


def mask_picture(
    mask: object,
    key_labels: Sequence[str] | None = None,
    query_labels: Sequence[str] | None = None,
    title: str = "mask: may query (row) see key (column)?",
    ax: Axes | None = None,
) -> Figure:
    """A (T, S) bool mask as a picture: blue where the query may attend to the key, grey where not."""
    values = to_numpy(mask)
    if values.ndim != 2:
        raise ValueError(f"mask must be 2-D (T, S) after choosing a batch row and head, got shape {values.shape}")
    if ax is None:
        fig, axes = new_figure(size=(0.4 * values.shape[1] + 2.2, 0.4 * values.shape[0] + 1.6))
        ax = axes[0, 0]
    heatmap(
        ax,
        values,
        key_labels,
        query_labels,
        title=title,
        x_title="key",
        y_title="query",
        cmap=CMAP_MASK,
        vmin=0,
        vmax=1,
        colorbar=False,
    )
    # a grid between cells makes the single positions countable
    ax.set_xticks(np.arange(-0.5, values.shape[1], 1), minor=True)
    ax.set_yticks(np.arange(-0.5, values.shape[0], 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    return ax.figure


def mask_grid(masks: dict[str, object], key_labels: Sequence[str] | None = None, title: str = "") -> Figure:
    """Several 2-D masks side by side, e.g. {"padding": ..., "causal": ..., "padding & causal": ...}."""
    fig, axes = new_figure(1, len(masks), size=(3.2 * len(masks), 3.2))
    for ax, (name, mask) in zip(axes[0], masks.items(), strict=True):
        mask_picture(mask, key_labels, key_labels, title=name, ax=ax)
    if title:
        fig.suptitle(title)
    return fig
