"""Chapter 04's explorer: change the batch size and the padding, watch BatchNorm's statistics move
while LayerNorm's stay put.

Shape legend: B batch, T sequence length, D features.
"""

from __future__ import annotations

import io
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from torch import Tensor

from transformer_lab._checks import check_float, check_has_values, check_tensor
from transformer_lab.normalization import batch_norm_statistics, layer_norm_statistics
from transformer_lab.plotting.style import course_style, new_figure, to_numpy

__all__ = ["batch_norm_explorer", "BatchNormExplorer"]


def _statistics(x: Tensor, mask: Tensor, batch_size: int, length: int) -> dict[str, Any]:
    """Statistics of the first `batch_size` sequences, cut or padded to `length` positions."""
    sub, sub_mask = x[:batch_size, :length], mask[:batch_size, :length]  # (b, L, D), (b, L)
    counted_mean, counted_var = batch_norm_statistics(sub)  # padding counted, as nn.BatchNorm1d
    real_mean, real_var = batch_norm_statistics(sub, sub_mask)  # real tokens only, as tl.BatchNorm + mask
    n0 = int(mask[0].sum())
    ln_mean, ln_var = layer_norm_statistics(sub[0, :n0])  # sequence 0's real tokens, (n0,)
    return {
        "batch_norm_mean_counting_padding": counted_mean,
        "batch_norm_var_counting_padding": counted_var,
        "batch_norm_mean_real_tokens": real_mean,
        "batch_norm_var_real_tokens": real_var,
        "layer_norm_mean_sequence_0": ln_mean,
        "layer_norm_var_sequence_0": ln_var,
        "padded_fraction": float(1.0 - sub_mask.float().mean()),
    }


class BatchNormExplorer(widgets.VBox):
    """The widget `batch_norm_explorer` returns: two sliders, a line of numbers, and a picture.

    The picture is a PNG rendered with matplotlib into an `ipywidgets.Image`, so moving a slider only
    updates widget values (no cell output is written), in JupyterLab, under nbval and in plain Python.

    Attributes:
        batch_size, extra_padding: the two `IntSlider`s (also `children[0]` and `children[1]`).
        summary: an `HTML` widget with the measured shifts; image: the `Image` widget.
        state: a dict with the current slider values, statistics and shifts (see `batch_norm_explorer`).
    """

    def __init__(self, x: Tensor, mask: Tensor, features: int) -> None:
        self._x, self._mask = x, mask
        lengths = mask.sum(dim=1)  # (B,)
        self._longest = int(lengths.max())
        self._reference = _statistics(x, mask, x.shape[0], self._longest)
        self._features = min(features, x.shape[-1])
        self.state: dict[str, Any] = {}
        self.batch_size = widgets.IntSlider(value=2, min=2, max=x.shape[0], description="batch size")
        self.extra_padding = widgets.IntSlider(
            value=0, min=0, max=x.shape[1] - self._longest, description="extra padding"
        )
        self.summary = widgets.HTML()
        self.image = widgets.Image(format="png")
        super().__init__(children=(self.batch_size, self.extra_padding, self.summary, self.image))
        self.batch_size.observe(self._update, names="value")
        self.extra_padding.observe(self._update, names="value")
        self._update()

    def _update(self, change: object = None) -> None:
        batch_size, extra_padding = self.batch_size.value, self.extra_padding.value
        stats = _statistics(self._x, self._mask, batch_size, self._longest + extra_padding)
        reference = self._reference
        shift = {
            "batch_norm_shift_counting_padding": float(
                (stats["batch_norm_mean_counting_padding"] - reference["batch_norm_mean_real_tokens"]).abs().mean()
            ),
            "batch_norm_shift_real_tokens": float(
                (stats["batch_norm_mean_real_tokens"] - reference["batch_norm_mean_real_tokens"]).abs().mean()
            ),
            "layer_norm_shift": float(
                (stats["layer_norm_mean_sequence_0"] - reference["layer_norm_mean_sequence_0"]).abs().max()
            ),
        }
        self.state.clear()
        self.state.update(batch_size=batch_size, extra_padding=extra_padding, **stats, **shift)
        self.summary.value = (
            f"padded positions: {stats['padded_fraction']:.0%}. Mean |shift| of BatchNorm's per-feature mean from "
            f"the whole batch's: <b>{shift['batch_norm_shift_counting_padding']:.3f}</b> counting padding, "
            f"<b>{shift['batch_norm_shift_real_tokens']:.3f}</b> real tokens only; "
            f"LayerNorm's per-token mean of sequence 0 moved <b>{shift['layer_norm_shift']:.3f}</b>."
        )
        self.image.value = self._render(stats, batch_size)

    def _render(self, stats: dict[str, Any], batch_size: int) -> bytes:
        n, reference = self._features, self._reference
        fig, axes = new_figure(1, 2, size=(11.0, 3.6))
        with course_style():
            ax = axes[0, 0]
            d = range(n)
            ax.plot(d, to_numpy(reference["batch_norm_mean_real_tokens"])[:n], "k--", label="whole batch, real tokens")
            ax.plot(d, to_numpy(stats["batch_norm_mean_counting_padding"])[:n], "o-", label="padding counted")
            ax.plot(d, to_numpy(stats["batch_norm_mean_real_tokens"])[:n], "s-", label="real tokens only")
            ax.set_title(f"BatchNorm per-feature mean, batch of {batch_size}")
            ax.set_xlabel("feature d")
            ax.set_ylabel("mean")
            ax.legend(fontsize=8)
            ax = axes[0, 1]
            ax.plot(to_numpy(reference["layer_norm_mean_sequence_0"]), "k--", label="alone")
            ax.plot(to_numpy(stats["layer_norm_mean_sequence_0"]), "o-", label=f"in a batch of {batch_size}")
            ax.set_title("LayerNorm per-token mean, sequence 0")
            ax.set_xlabel("position t")
            ax.set_ylabel("mean")
            ax.legend(fontsize=8)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
        plt.close(fig)
        return buffer.getvalue()

    def __repr__(self) -> str:  # the text/plain view nbval compares: short and deterministic
        return f"BatchNormExplorer(batch_size={self.batch_size.value}, extra_padding={self.extra_padding.value})"


def batch_norm_explorer(x: Tensor, mask: Tensor, features: int = 16) -> BatchNormExplorer:
    """A widget with two sliders, batch size and extra padding, over a padded batch of token vectors (chapter 04).

    For the first `batch size` sequences, padded to (longest sequence + extra padding) positions, it
    draws BatchNorm's per-feature mean (counting padding, as `nn.BatchNorm1d`; and over real tokens
    only, as `tl.BatchNorm` with a mask) against the same statistic on the whole batch, and LayerNorm's
    per-token mean of sequence 0, which never moves; a line of text says how far each moved.

    The numbers behind the picture are in `widget.state` (a dict, updated on every slider change), so
    the widget can be driven from plain Python: `w.batch_size.value = 8` (or `w.children[0].value = 8`)
    recomputes `w.state`.

    Args:
        x: the padded batch, with room for extra padding (T longer than the longest sequence).
        mask: True for real tokens; every sequence must start with at least one real token.
        features: how many features to draw.

    Shape:
        x (B, T, D), mask (B, T) bool.
    """
    check_tensor("x", x, dim=3)
    check_float("x", x)
    check_tensor("mask", mask, dim=2)
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"mask must be a bool tensor of shape (B, T) = {tuple(x.shape[:2])}")
    check_has_values("x", x)
    check_has_values("mask", mask)
    if mask.device != x.device:
        raise ValueError(f"mask is on {mask.device} but x is on {x.device}; move it with mask.to(x.device)")
    if isinstance(features, bool) or not isinstance(features, int) or features < 1:
        raise ValueError(f"features must be a positive int (how many features to draw), got {features!r}")
    if x.shape[0] < 2:
        raise ValueError(f"x must hold at least 2 sequences to vary the batch size, got B={x.shape[0]}")
    if bool((mask.sum(dim=1) == 0).any()) or not bool(mask[:, 0].all()):
        raise ValueError("every sequence of mask must start with a real token (padding on the right)")
    return BatchNormExplorer(x.detach(), mask, features)
