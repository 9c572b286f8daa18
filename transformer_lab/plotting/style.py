"""The one look of every figure in the course, and the primitives the chapter plots build on."""

from __future__ import annotations

import contextlib
import math
import numbers
import pathlib
from collections.abc import Iterator, Mapping, Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_lab._checks import check_positive_int

__all__ = ["STYLE", "course_style", "new_figure", "heatmap", "curves", "to_numpy"]

#: A small font shipped with the package (a subset of Noto Sans CJK SC, SIL OFL 1.1, see
#: assets/OFL-TransformerLabCJK-Subset.txt) covering ASCII and the Chinese characters of the course's
#: tokens (年 月 日), so token labels draw on a machine without a CJK font and without a
#: missing-glyph warning.
CJK_FONT_FILE = pathlib.Path(__file__).resolve().parents[1] / "assets" / "TransformerLabCJK-Subset.otf"
CJK_FONT_FAMILY = "TransformerLab CJK Subset"
for _weight in ("", "-Bold"):  # regular and bold (titles are bold)
    font_manager.fontManager.addfont(str(CJK_FONT_FILE.with_name(f"TransformerLabCJK-Subset{_weight}.otf")))

#: matplotlib settings shared by every figure of the course.
STYLE: dict[str, object] = {
    # per-glyph fallback: DejaVu Sans first, the shipped subset for the Chinese characters
    "font.family": ["DejaVu Sans", CJK_FONT_FAMILY],
    "figure.dpi": 90,
    "savefig.dpi": 90,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "axes.prop_cycle": mpl.cycler(
        color=["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    ),
}

#: colour maps: weights in [0, 1], signed values centred on 0, masks (False/True).
CMAP_WEIGHTS = "viridis"
CMAP_SIGNED = "RdBu_r"
CMAP_MASK = mpl.colors.ListedColormap(["#d9d9d9", "#2b8cbe"])


@contextlib.contextmanager
def course_style() -> Iterator[None]:
    """Draw inside the course's style without changing the learner's global settings."""
    with mpl.rc_context(STYLE):
        yield
        # The first figure may load the backend inside this context; a notebook's inline backend then
        # switches interactive mode on, and rc_context would switch it off again on exit, so that every
        # later figure is silently never shown. Keep what the backend decided.
        interactive = mpl.is_interactive()
    mpl.interactive(interactive)


def new_figure(n_rows: int = 1, n_cols: int = 1, size: tuple[float, float] | None = None) -> tuple[Figure, np.ndarray]:
    """A figure with a grid of axes (always returned as a 2-D array), in the course's style."""
    check_positive_int("n_rows", n_rows)
    check_positive_int("n_cols", n_cols)
    with course_style():
        fig, axes = plt.subplots(
            n_rows, n_cols, figsize=size or (4.0 * n_cols, 3.4 * n_rows), squeeze=False, layout="constrained"
        )
    return fig, axes


def to_numpy(values: object, name: str = "values") -> np.ndarray:
    """A tensor (any device, with or without grad), array or list as a float numpy array.

    Anything else (a string, a dict, a ragged list, None ...) is a TypeError naming `name`.
    """
    if hasattr(values, "detach"):
        if values.device.type == "meta":  # type: ignore[union-attr]
            raise ValueError(f"{name} is a tensor on the meta device: it has a shape but no values to draw")
        if values.is_complex():  # type: ignore[union-attr]
            raise TypeError(f"{name} must hold real numbers, got dtype {values.dtype}")  # type: ignore[union-attr]
        values = values.detach().cpu().float().numpy()  # type: ignore[union-attr]
    if values is None or isinstance(values, (str, bytes, dict, set)):
        raise TypeError(f"{name} must be a tensor, a numpy array or a list of numbers, got {type(values).__name__}")
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a tensor, a numpy array or a (rectangular) list of numbers, got {str(values)[:60]}"
        ) from None


def finite_values(name: str, values: np.ndarray, what: str = "") -> np.ndarray:
    """`values` unchanged, or a ValueError naming `name` and where its first NaN or infinity is.

    A NaN is drawn as a blank cell, bar or gap without a word, so a picture of NaN looks like a picture
    of something. `what` adds a sentence on where such values usually come from.
    """
    bad = ~np.isfinite(values)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = values[where] if where else values.item()
        raise ValueError(
            f"{name} holds {int(bad.sum())} value(s) that are not finite numbers, e.g. {value} at index {where}"
            + (f"; {what}" if what else "")
        )
    return values


def probabilities(name: str, values: np.ndarray, what: str) -> np.ndarray:
    """`values` unchanged if they are finite numbers in [0, 1] (up to rounding), else a ValueError naming `name`."""
    finite_values(name, values, what)
    if values.size and (values.min() < -1e-3 or values.max() > 1 + 1e-3):
        raise ValueError(f"{name} must hold {what} in [0, 1], got values from {values.min():.4g} to {values.max():.4g}")
    return values


def check_range(name: str, value: object) -> tuple[float, float]:
    """Two finite numbers (low, high) with low < high, e.g. the x range a figure draws a function over."""
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        or not value[0] < value[1]
    ):
        raise ValueError(f"{name} must be two finite numbers (low, high) with low < high, got {value!r}")
    return float(value[0]), float(value[1])


def check_lengths(name: str, record: Mapping[str, object], *groups: tuple[str, ...]) -> None:
    """Raise ValueError unless the lists of each group of keys of `record` (a training history) have one length:
    a step without its loss would draw a curve shifted against its axis."""
    for keys in groups:
        lengths = {key: len(to_numpy(record[key], f"{name}[{key!r}]").ravel()) for key in keys}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"{name}: the series {', '.join(keys)} must have one length (one entry per step), got {lengths}"
            )


def check_mapping(name: str, value: object) -> None:
    """Raise TypeError unless `value` is a dict (a mapping of names to values)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict {{name: values}}, got {type(value).__name__}")


def check_ax(ax: object) -> None:
    """Raise TypeError unless `ax` is None or a matplotlib Axes."""
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes (e.g. from plt.subplots()) or None, got {type(ax).__name__}")


def heatmap(
    ax: Axes,
    matrix: object,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
    x_title: str = "",
    y_title: str = "",
    cmap: str | mpl.colors.Colormap = CMAP_WEIGHTS,
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    aspect: str = "auto",
    label_names: tuple[str, str] = ("x_labels", "y_labels"),
) -> mpl.image.AxesImage:
    """Draw a 2-D matrix with optional tick labels on both axes; the primitive of attention maps.

    `aspect="equal"` keeps every cell square (a (1, S) mask is then drawn as a strip, not a square).
    `label_names` are the caller's names of the column and row labels, used in error messages.
    """
    check_ax(ax)
    values = to_numpy(matrix)
    if values.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {values.shape}")
    for name, value in (("vmin", vmin), ("vmax", vmax)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(f"{name} must be a number (an end of the colour scale) or None, got {value!r}")
    if vmin is not None and vmax is not None and vmin > vmax:
        raise ValueError(f"vmin ({vmin}) must not exceed vmax ({vmax}): they are the ends of the colour scale")
    with course_style():
        image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
        for labels, n, set_ticks, set_labels, rotation in (
            (x_labels, values.shape[1], ax.set_xticks, ax.set_xticklabels, 90),
            (y_labels, values.shape[0], ax.set_yticks, ax.set_yticklabels, 0),
        ):
            if labels is not None:
                which = label_names[0] if labels is x_labels else label_names[1]
                if isinstance(labels, str) or not hasattr(labels, "__len__"):
                    raise TypeError(f"{which} must be a list of strings, one per cell, got {type(labels).__name__}")
                if len(labels) != n:
                    raise ValueError(
                        f"{which}: got {len(labels)} labels for an axis of length {n} "
                        f"({'columns' if labels is x_labels else 'rows'}); pass exactly {n}"
                    )
                set_ticks(range(n))
                set_labels(list(labels), rotation=rotation)
        if annotate:
            mid = np.nanmean(values) if values.size else 0.0
            for (i, j), v in np.ndenumerate(values):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < mid else "black")
        ax.set_title(title)
        ax.set_xlabel(x_title)
        ax.set_ylabel(y_title)
        if colorbar:
            ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return image


def curves(
    ax: Axes,
    series: Mapping[str, Sequence[float]] | Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str = "",
    x_title: str = "step",
    y_title: str = "",
    log_y: bool = False,
    *,
    argument: str = "series",
) -> None:
    """Draw named curves on one axes: {name: ys} or {name: (xs, ys)}, with a legend.

    `argument` is what the caller calls `series`, used in error messages (e.g. "by_batch_size").
    """
    if not isinstance(series, Mapping):
        raise TypeError(f"{argument} must be a dict {{name: ys}} or {{name: (xs, ys)}}, got {type(series).__name__}")
    with course_style():
        for name, values in series.items():
            if isinstance(values, tuple) and len(values) == 2:
                xs, ys = values
            else:
                ys = values
                xs = range(len(to_numpy(ys, f"{argument}[{name!r}]")))
            ys = to_numpy(ys, f"{argument}[{name!r}]")
            xs = to_numpy(xs, f"{argument}[{name!r}] steps")
            if ys.ndim != 1 or xs.shape != ys.shape:
                raise ValueError(
                    f"{argument}[{name!r}] must be one curve: xs and ys of one equal length, got shapes {xs.shape} "
                    f"and {ys.shape}"
                )
            ax.plot(list(xs), ys, label=name)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(x_title)
        ax.set_ylabel(y_title)
        if len(series) > 1:
            ax.legend()
