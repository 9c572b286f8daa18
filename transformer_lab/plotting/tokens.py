"""Figures of chapter 12 (tokens): BPE merge by merge, and tokens per character against the vocabulary size."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from transformer_lab.plotting.style import course_style, new_figure

__all__ = ["merge_steps", "tokens_per_character"]


def merge_steps(rows: Sequence[tuple[str, Sequence[str]]], title: str = "") -> Figure:
    """One row of boxes per step of BPE: the text cut into its tokens after that many merges.

    Each box is one token, as wide as its label has characters, so every row spans the same text and the
    boxes grow as merges join them. Labels should be plain ASCII or the course's own symbols ("␣" for a
    space): a fresh machine has no CJK font.

    Args:
        rows: (row label, the tokens' labels in order), e.g. ("after 3 merges", ["lo", "w", "␣", ...]).
        title: the figure's title.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise TypeError("rows must be a non-empty list of (label, [token labels]) pairs")
    for i, row in enumerate(rows):
        if not (isinstance(row, (tuple, list)) and len(row) == 2 and isinstance(row[0], str)):
            raise ValueError(f"rows[{i}] must be a pair (label, [token labels]), got {row!r}")
        if isinstance(row[1], str) or not all(isinstance(t, str) and t for t in row[1]):
            raise ValueError(f"rows[{i}][1] must be a list of non-empty token labels, got {row[1]!r}")
    width = max(sum(len(t) for t in tokens) for _, tokens in rows)
    fig, axes = new_figure(size=(min(0.22 * width + 2.2, 16.0), 0.42 * len(rows) + 0.9))
    ax = axes[0, 0]
    colours = ["#c6dbef", "#fdd0a2"]
    with course_style():
        for r, (_, tokens) in enumerate(rows):
            y, x = len(rows) - 1 - r, 0.0
            for k, token in enumerate(tokens):
                ax.add_patch(Rectangle((x, y + 0.1), len(token), 0.8, facecolor=colours[k % 2], edgecolor="#555555"))
                ax.text(x + len(token) / 2, y + 0.5, token, ha="center", va="center", fontsize=9, family="monospace")
                x += len(token)
            ax.text(x + 0.4, y + 0.5, f"{len(tokens)} tokens", va="center", fontsize=8, color="#555555")
        ax.set_xlim(0, width + 5)
        ax.set_ylim(0, len(rows))
        ax.set_yticks([len(rows) - 0.5 - r for r in range(len(rows))])
        ax.set_yticklabels([label for label, _ in rows])
        ax.set_xticks([])
        ax.spines[["left", "bottom"]].set_visible(False)
        ax.set_title(title)
    return fig


def tokens_per_character(rates: Mapping[str, Mapping[int, float]], title: str = "") -> Figure:
    """Tokens per character against the vocabulary size, one curve per text (log-2 vocabulary axis).

    Args:
        rates: {text name: {vocabulary size: tokens per character}}.
    """
    if not isinstance(rates, Mapping) or not rates:
        raise TypeError("rates must be a non-empty dict {text: {vocab_size: tokens per character}}")
    for name, row in rates.items():
        if not isinstance(row, Mapping) or not row:
            raise ValueError(f"rates[{name!r}] must be a non-empty dict {{vocab_size: tokens per character}}")
        for size, value in row.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"rates[{name!r}]: vocabulary sizes must be positive ints, got {size!r}")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"rates[{name!r}][{size}] must be a positive number of tokens, got {value!r}")
    fig, axes = new_figure(size=(6.0, 3.6))
    ax = axes[0, 0]
    with course_style():
        for name, row in rates.items():
            sizes = sorted(row)
            ax.plot(sizes, [row[s] for s in sizes], marker="o", label=name)
        ax.axhline(1.0, color="#7f7f7f", linestyle="--", linewidth=1)
        ax.text(min(min(r) for r in rates.values()), 1.02, "one token per character", fontsize=8, color="#555555",
                va="bottom")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("vocabulary size (tokens)")
        ax.set_ylabel("tokens per character")
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.set_title(title)
    return fig
