"""Chapter 04's explorer: change the batch size and the padding, watch BatchNorm's statistics move
while LayerNorm's stay put.

Shape legend: B batch, T sequence length, D features.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from torch import Tensor

from transformer_lab._checks import check_float, check_tensor
from transformer_lab.normalization import batch_norm_statistics, layer_norm_statistics
from transformer_lab.plotting.style import course_style, new_figure, to_numpy

__all__ = ["batch_norm_explorer"]


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


def batch_norm_explorer(x: Tensor, mask: Tensor, features: int = 16) -> widgets.interactive:
    """A widget with two sliders, batch size and extra padding, over a padded batch of token vectors.

    For the first `batch size` sequences, padded to (longest sequence + extra padding) positions, it
    draws BatchNorm's per-feature mean (counting padding, as `nn.BatchNorm1d`; and over real tokens
    only, as `tl.BatchNorm` with a mask) against the same statistic on the whole batch, and LayerNorm's
    per-token mean of sequence 0, which never moves. It prints how far each moved.

    The numbers behind the picture are in `widget.state` (a dict, updated on every slider change), so
    the widget can be driven from plain Python: `w.children[0].value = 8` recomputes `w.state`.

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
    if x.shape[0] < 2:
        raise ValueError(f"x must hold at least 2 sequences to vary the batch size, got B={x.shape[0]}")
    lengths = mask.sum(dim=1)  # (B,)
    if bool((lengths == 0).any()) or not bool(mask[:, 0].all()):
        raise ValueError("every sequence of mask must start with a real token (padding on the right)")
    x = x.detach()
    longest = int(lengths.max())
    room = x.shape[1] - longest
    reference = _statistics(x, mask, x.shape[0], longest)
    n = min(features, x.shape[-1])
    state: dict[str, Any] = {}

    def show(batch_size: int, extra_padding: int) -> None:
        stats = _statistics(x, mask, batch_size, longest + extra_padding)
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
        state.clear()
        state.update(batch_size=batch_size, extra_padding=extra_padding, **stats, **shift)
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
        plt.show()
        plt.close(fig)
        print(
            f"padded positions: {stats['padded_fraction']:.0%}; mean |shift| of BatchNorm's per-feature mean: "
            f"{shift['batch_norm_shift_counting_padding']:.3f} counting padding, "
            f"{shift['batch_norm_shift_real_tokens']:.3f} real tokens only; "
            f"LayerNorm's: {shift['layer_norm_shift']:.3f}"
        )

    widget = widgets.interactive(
        show,
        batch_size=widgets.IntSlider(value=2, min=2, max=x.shape[0], description="batch size"),
        extra_padding=widgets.IntSlider(value=0, min=0, max=room, description="extra padding"),
    )
    widget.state = state  # type: ignore[attr-defined]
    return widget
