"""Pictures of embeddings and positional encodings (chapter 08).

Every function takes tensors or arrays (an encoding table is (positions, d_model)), draws on `ax`
(or `fig` for the multi-panel overview) when given, else on a new figure, and returns the Figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_lab._checks import check_number
from transformer_lab.plotting.style import (
    CMAP_SIGNED,
    check_mapping,
    course_style,
    curves,
    finite_values,
    heatmap,
    new_figure,
    to_numpy,
)

__all__ = [
    "encoding_heatmap",
    "encoding_curves",
    "position_similarity_heatmap",
    "position_similarity_curves",
    "rotation_pairs",
    "value_histograms",
    "frequency_errors",
    "encoding_overview",
]


def _table(pe: object, name: str = "pe") -> np.ndarray:
    values = to_numpy(pe, name)
    if values.ndim == 3 and values.shape[0] == 1:
        values = values[0]  # a (1, max_len, D) buffer as in the notes
    if values.ndim != 2:
        raise ValueError(f"{name} must be a (positions, d_model) table, got shape {values.shape}")
    if 0 in values.shape:
        raise ValueError(f"{name} is empty (shape {values.shape}): a table needs at least one position and dimension")
    return finite_values(name, values)


def _indices(name: str, values: object) -> list[int]:
    """A list of indices (a list or tuple, not one int, whose items `_check_index` checks)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of ints, e.g. [0, 1], got {values!r}")
    return list(values)


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    _, axes = new_figure(size=size)
    return axes[0, 0]


def _check_index(name: str, value: int | None, size: int, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= value < size:
        raise ValueError(f"{name} must be in [0, {size}) ({what}), got {value}")


def _sinusoid(positions: np.ndarray, d_model: int) -> np.ndarray:
    """The sinusoidal encoding at any (also fractional) positions: (len(positions), d_model), in float64."""
    i = np.arange(0, d_model, 2, dtype=float)
    angles = positions[:, None] / np.power(10000.0, i / d_model)[None, :]  # (P, D / 2)
    table = np.zeros((len(positions), d_model))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


def encoding_heatmap(
    pe: object,
    title: str = "sinusoidal positional encoding",
    ax: Axes | None = None,
    position: int | None = None,
    dimension: int | None = None,
) -> Figure:
    """The encoding table as a picture: one row per position, one column per dimension, values in [-1, 1].

    Args:
        pe: (positions, D) table (a (1, positions, D) buffer works too).
        position, dimension: draw a line at this row / column (the widget's current choice).
    """
    values = _table(pe)
    _check_index("position", position, values.shape[0], "a row of the table")
    _check_index("dimension", dimension, values.shape[1], "a column of the table")
    ax = _axes(ax, (6.0, 4.0))
    limit = max(1.0, float(np.abs(values).max())) if values.size else 1.0
    heatmap(ax, values, title=title, x_title="dimension", y_title="position", cmap=CMAP_SIGNED, vmin=-limit, vmax=limit)
    with course_style():
        if position is not None:
            ax.axhline(position, color="black", lw=1.0)
        if dimension is not None:
            ax.axvline(dimension, color="black", lw=1.8, ls="--")
    return ax.figure


def encoding_curves(
    pe: object,
    dimensions: Sequence[int] = (0, 1, 4, 5),
    title: str = "a few dimensions of the encoding",
    ax: Axes | None = None,
    position: int | None = None,
) -> Figure:
    """Each chosen dimension over the positions: low dimensions oscillate fast, high ones slowly.

    A sinusoidal table is drawn as dots at the whole positions (where the encoding is defined) on a
    thin line of the sinusoid they sample, so fast dimensions do not alias into a zigzag; any other
    table (a learned one) as dots joined by lines.

    Args:
        pe: (positions, D) table.
        dimensions: which columns to draw.
        position: mark this position on every curve.
    """
    values = _table(pe)
    dimensions = _indices("dimensions", dimensions)
    if len(dimensions) == 0:
        raise ValueError("dimensions must name at least one column")
    for d in dimensions:
        _check_index("dimensions", d, values.shape[1], "a column of the table")
    _check_index("position", position, values.shape[0], "a row of the table")
    ax = _axes(ax, (6.0, 3.2))
    positions, d_model = values.shape
    sinusoidal = np.allclose(values, _sinusoid(np.arange(positions, dtype=float), d_model), atol=1e-5)
    with course_style():
        for d in dimensions:
            label = f"dim {d} ({'sin' if d % 2 == 0 else 'cos'})"
            if sinusoidal:
                # The encoding exists only at whole positions (the dots); the thin line is the sinusoid
                # they sample. Joining the dots of a fast dimension (0, 1: one turn every 2 pi positions)
                # with straight lines would draw a zigzag that is not in the encoding.
                fine = np.linspace(0, positions - 1, 20 * positions)
                (line,) = ax.plot(fine, _sinusoid(fine, d_model)[:, d], lw=0.8, alpha=0.6)
                ax.plot(np.arange(positions), values[:, d], "o", ms=2.5, color=line.get_color(), label=label)
            else:
                ax.plot(np.arange(positions), values[:, d], "-o", ms=2.5, lw=1.0, label=label)
        ax.set_title(title)
        ax.set_xlabel("position")
        ax.set_ylabel("PE(position, dim)")
        if len(dimensions) > 1:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # outside: the curves fill the box
        if position is not None:
            ax.axvline(position, color="black", lw=0.8, ls="--")
            ax.plot([position] * len(dimensions), values[position, list(dimensions)], "ko", ms=4)
    return ax.figure


def position_similarity_heatmap(
    pe: object, title: str = "PE(p) · PE(q) between positions", ax: Axes | None = None
) -> Figure:
    """The (positions, positions) matrix of dot products PE(p) · PE(q); constant along each diagonal."""
    values = _table(pe)
    dots = values @ values.T  # (P, D) @ (D, P) -> (P, P)
    ax = _axes(ax, (5.0, 4.2))
    heatmap(ax, dots, title=title, x_title="position q", y_title="position p", cmap="viridis")
    return ax.figure


def position_similarity_curves(
    pe: object,
    positions: Sequence[int] = (0, 10, 30),
    max_offset: int | None = None,
    title: str = "PE(p) · PE(p + k) against the offset k",
    ax: Axes | None = None,
) -> Figure:
    """Dot product of PE(p) with PE(p + k) as k grows, one curve per starting position p.

    The curves lie on top of each other: the dot product depends on the offset k only, not on p.
    """
    values = _table(pe)
    n = values.shape[0]
    positions = _indices("positions", positions)
    if len(positions) == 0:
        raise ValueError("positions must name at least one starting position")
    for p in positions:
        _check_index("positions", p, n, "a row of the table")
    longest = n - 1 - max(positions)
    if max_offset is None:
        max_offset = longest
    if isinstance(max_offset, bool) or not isinstance(max_offset, (int, np.integer)):
        raise TypeError(f"max_offset must be an int (the largest offset k drawn) or None, got {max_offset!r}")
    if max_offset < 1 or max_offset > longest:
        raise ValueError(f"max_offset must be in [1, {longest}] so that p + k stays in the table, got {max_offset}")
    ks = np.arange(max_offset + 1)
    series = {f"p = {p}": (ks, values[p + ks] @ values[p]) for p in positions}  # (K, D) @ (D,) -> (K,)
    ax = _axes(ax, (6.0, 3.2))
    curves(ax, series, title=title, x_title="offset k", y_title="PE(p) · PE(p + k)")
    return ax.figure


def rotation_pairs(
    pe: object,
    position: int,
    offset: int,
    pairs: Sequence[int] = (0, 1, 2),
    title: str = "PE(pos + k) is PE(pos) turned, pair by pair",
    zoom_below: float = 0.2,
) -> Figure:
    """One panel per pair of dimensions (2i, 2i + 1): the circle the pair walks on, PE(pos) and PE(pos + k).

    Each pair (sin(pos w_i), cos(pos w_i)) lies on the unit circle; k steps on turn it by the angle
    k * w_i, the same whatever pos is. The turn is drawn as an arc along the circle, and each panel's title
    gives its angle. A turn shorter than `zoom_below` radians is also drawn enlarged in an inset inside the
    circle, where it would otherwise be a dot.

    Args:
        pe: (positions, D) table with position + offset < positions.
        pairs: the indices i of the pairs to draw.
        zoom_below: turns (in radians, taken from the table) below this get the enlarged inset; 0 for none.
    """
    values = _table(pe)
    n, d = values.shape
    _check_index("position", position, n, "a row of the table")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int (the number of positions k to move on), got {offset!r}")
    _check_index("position + offset", position + offset, n, "a row of the table")
    pairs = _indices("pairs", pairs)
    check_number("zoom_below", zoom_below, non_negative=True)
    if len(pairs) == 0:
        raise ValueError("pairs must name at least one pair of dimensions")
    for i in pairs:
        _check_index("pairs", i, d // 2, "the index i of dimensions 2i and 2i + 1")
    fig, axes = new_figure(1, len(pairs), size=(2.9 * len(pairs), 3.3))
    theta = np.linspace(0.0, 2 * np.pi, 200)
    with course_style():
        for ax, i in zip(axes[0], pairs, strict=True):
            a, b = values[position, 2 * i : 2 * i + 2], values[position + offset, 2 * i : 2 * i + 2]
            # a point (sin t, cos t) sits at angle t, measured clockwise from the top of the circle
            start, turn = np.arctan2(a[0], a[1]), np.arctan2(b[0], b[1]) - np.arctan2(a[0], a[1])
            turn = (turn + np.pi) % (2 * np.pi) - np.pi  # the shorter way round, in (-pi, pi]
            arc = start + np.linspace(0.0, turn, 100)
            targets = [ax]
            if 0 < abs(turn) < zoom_below:
                inset = ax.inset_axes([0.27, 0.27, 0.46, 0.46])  # inside the circle, which is always empty
                half = max(0.7 * np.hypot(*(b - a)), 0.01)
                middle = (a + b) / 2
                inset.set_xlim(middle[0] - half, middle[0] + half)
                inset.set_ylim(middle[1] - half, middle[1] + half)
                inset.set_xticks([])
                inset.set_yticks([])
                for side in ("top", "right"):
                    inset.spines[side].set_visible(True)
                inset.set_title("enlarged", fontsize=7, pad=2)
                ax.indicate_inset_zoom(inset, edgecolor="#7f7f7f")
                targets.append(inset)
            for target in targets:
                main = target is ax
                target.plot(np.sin(theta), np.cos(theta), color="#bbbbbb", lw=0.8)
                target.plot(
                    values[:, 2 * i],
                    values[:, 2 * i + 1],
                    ".",
                    color="#9ecae1",
                    ms=2 if main else 4,
                    label="all positions",
                )
                target.plot(np.sin(arc), np.cos(arc), color="#d62728", lw=2.0, label=f"turn by {offset} steps")
                target.annotate(
                    "",
                    xy=b,
                    xytext=(np.sin(arc[-5]), np.cos(arc[-5])),
                    arrowprops={"arrowstyle": "->", "color": "#d62728", "lw": 1.4},
                )
                target.plot(*a, "o", color="#1f77b4", ms=6 if main else 7, label=f"pos = {position}")
                target.plot(*b, "o", color="#d62728", ms=6 if main else 7, label=f"pos + {offset}")
                target.set_aspect("equal")
            ax.set_xlim(-1.25, 1.25)
            ax.set_ylim(-1.25, 1.25)
            ax.set_title(f"dims {2 * i}, {2 * i + 1}: turn {abs(turn):.2f} rad")
            ax.set_xlabel(f"sin (dim {2 * i})")
            ax.set_ylabel(f"cos (dim {2 * i + 1})")
        axes[0, -1].legend(loc="lower left", fontsize=7)
        fig.suptitle(title)
    return fig


def value_histograms(
    series: Mapping[str, object],
    title: str = "values that get added together",
    bins: int = 60,
    ax: Axes | None = None,
    y_max: float | None = None,
) -> Figure:
    """Overlaid histograms of the entries of several tensors (e.g. a scaled embedding and the encoding).

    Args:
        series: {name: tensor}; every entry of each tensor is counted, with bins shared by all series.
        bins: the number of bins over the range of all the values.
        y_max: cut the density axis at this height so that the wide distributions stay readable next to a
            narrow spike; a bar that goes higher is drawn cut off, with its real height written above it.
    """
    check_mapping("series", series)
    if not series:
        raise ValueError("series must hold at least one named tensor")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    if y_max is not None and (isinstance(y_max, bool) or not isinstance(y_max, (int, float)) or not y_max > 0):
        raise ValueError(f"y_max must be a positive number or None, got {y_max!r}")
    arrays = {
        name: finite_values(f"series[{name!r}]", to_numpy(values, f"series[{name!r}]").ravel())
        for name, values in series.items()
    }
    everything = np.concatenate(list(arrays.values()))
    if everything.size == 0:
        raise ValueError("series holds no values at all: every tensor is empty")
    ax = _axes(ax, (6.0, 3.2))
    with course_style():
        edges = np.linspace(everything.min(), everything.max(), bins + 1)
        for name, values in arrays.items():
            heights, edges_used, patches = ax.hist(values, bins=edges, alpha=0.55, density=True, label=name)
            if y_max is not None and heights.size and heights.max() > y_max:  # cut off: say how high it goes
                k = int(heights.argmax())
                ax.text(
                    (edges_used[k] + edges_used[k + 1]) / 2,
                    0.97 * y_max,
                    f"{name}: density {heights[k]:.1f} ↑ ",
                    ha="right",
                    va="top",
                    fontsize=8,
                    color=patches[k].get_facecolor(),
                    alpha=1.0,
                )
        if y_max is not None:
            ax.set_ylim(0, y_max)
        ax.set_title(title)
        ax.set_xlabel("value of one entry")
        ax.set_ylabel("density" if y_max is None else f"density (cut at {y_max:g})")
        ax.legend(fontsize=8)
    return ax.figure


def frequency_errors(
    errors: Mapping[str, object],
    title: str = "relative error of the float32 frequencies",
    ax: Axes | None = None,
) -> Figure:
    """Relative errors per frequency index i, one curve per method, on a log scale (zeros drawn at 1e-12)."""
    check_mapping("errors", errors)
    if not errors:
        raise ValueError("errors must hold at least one named curve")
    series = {}
    for name, values in errors.items():
        array = finite_values(f"errors[{name!r}]", to_numpy(values, f"errors[{name!r}]"))
        if (array < 0).any():
            raise ValueError(f"errors[{name!r}] must hold relative errors |error| / value >= 0, got {array.min():.3g}")
        series[name] = np.maximum(array, 1e-12)  # 0 (exact) drawn at 1e-12 on the log scale
    ax = _axes(ax, (6.0, 3.2))
    curves(ax, series, title=title, x_title="frequency index i (dimensions 2i, 2i + 1)", y_title="|error| / value")
    with course_style():
        ax.set_yscale("log")
        ax.axhline(2.0**-24, color="black", lw=0.8, ls=":")
        ax.text(0, 2.0**-24, " half a float32 ulp", va="bottom", fontsize=7)
    return ax.figure


def encoding_overview(pe: object, position: int, dimension: int, fig: Figure | None = None) -> Figure:
    """Three panels for the encoding explorer: the table, one dimension over positions, dot products with one position.

    Args:
        pe: (positions, D) table.
        position: the chosen position (a row).
        dimension: the chosen dimension (a column).
        fig: draw into this figure (cleared first), as the widget does on every change; default a new one.
    """
    values = _table(pe)
    n, d = values.shape
    _check_index("position", position, n, "a row of the table")
    _check_index("dimension", dimension, d, "a column of the table")
    if fig is not None and not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure (e.g. plt.figure()) or None, got {type(fig).__name__}")
    if fig is None:
        fig, _ = new_figure(1, 3, size=(12.0, 3.4))
    fig.clear()
    with course_style():
        axes = fig.subplots(1, 3)
    encoding_heatmap(values, title=f"encoding, d_model = {d}", ax=axes[0], position=position, dimension=dimension)
    i = dimension // 2
    wavelength = 2 * np.pi * 10000.0 ** (2 * i / d)
    encoding_curves(
        values,
        (dimension,),
        title=f"dim {dimension}: wavelength {wavelength:.1f} positions",
        ax=axes[1],
        position=position,
    )
    dots = values @ values[position]  # (P, D) @ (D,) -> (P,)
    curves(
        axes[2],
        {f"PE({position}) · PE(q)": (np.arange(n), dots)},
        title=f"dot product with position {position}",
        x_title="position q",
        y_title="dot product",
    )
    with course_style():
        axes[2].axvline(position, color="black", lw=0.8, ls="--")
    return fig
