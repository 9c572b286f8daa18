"""Tests of chapter 04/05's figures: each builds, draws what it says, and refuses bad input."""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import transformer_lab as tl
from transformer_lab import plotting


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 6, generator=g)
    mask = torch.arange(5) < torch.tensor([5, 2, 4]).unsqueeze(1)
    return x, mask


def test_axes_cube_colours_one_feature_slab_and_one_token_rod() -> None:
    fig = plotting.normalization_axes_cube(batch=2, length=3, features=4, lengths=(3, 2))
    axes3d = [ax for ax in fig.axes if ax.name == "3d"]
    assert len(axes3d) == 2
    assert "BatchNorm" in axes3d[0].get_title() and "LayerNorm" in axes3d[1].get_title()
    # one Poly3DCollection per drawn voxel face group: both panels draw every cell of the block
    assert all(len(ax.collections) > 0 for ax in axes3d)


def test_axes_cube_rejects_bad_lengths() -> None:
    with pytest.raises(ValueError, match="lengths"):
        plotting.normalization_axes_cube(batch=2, length=3, features=4, lengths=(3, 4))


def test_axes_unfolded_highlights_the_right_cells() -> None:
    fig = plotting.normalization_axes_unfolded(batch=2, length=3, features=4, lengths=(3, 1))
    axes = np.array(fig.axes).reshape(2, 2)

    def coloured(ax, colour) -> int:
        target = matplotlib.colors.to_rgba(colour)
        return sum(p.get_facecolor() == target for p in ax.patches)

    # BatchNorm: feature 2 of every real token (3 + 1 real tokens); LayerNorm: one token's 4 features
    assert coloured(axes[0, 0], "#d62728") + coloured(axes[0, 1], "#d62728") == 4
    assert coloured(axes[1, 0], "#2ca02c") == 4 and coloured(axes[1, 1], "#2ca02c") == 0
    assert sum(p.get_hatch() == "//" for p in axes[0, 1].patches) == 2 * 4  # 2 padded positions x 4 features


def test_normalization_statistics_draws_both_kinds() -> None:
    x, mask = _batch()
    fig = plotting.normalization_statistics(x, mask)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("per-feature mean" in t for t in titles) and any("per-token mean" in t for t in titles)
    bars = fig.axes[0].patches
    assert len(bars) == 2 * 6
    mean_real, _ = tl.batch_norm_statistics(x, mask)
    np.testing.assert_allclose([b.get_height() for b in bars[:6]], mean_real.numpy(), rtol=1e-6)
    image = fig.axes[2].images[0].get_array()
    assert np.isnan(np.asarray(image.filled(np.nan) if hasattr(image, "filled") else image)[1, 3])  # padding blank


def test_normalization_statistics_legend_sits_above_the_bars() -> None:
    x, mask = _batch()
    fig = plotting.normalization_statistics(x, mask)
    assert fig.axes[0].get_legend() is None and fig.axes[1].get_legend() is None  # no legend inside a bar panel
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == 2 and "padding masked out" in labels[0] and "padding included" in labels[1]
    fig.canvas.draw()
    box = legend.get_window_extent()
    for ax in fig.axes[:2]:
        assert box.y0 >= ax.get_window_extent().y1 - 1  # wholly above both bar panels


def test_statistics_sensitivity_and_error_curves() -> None:
    fig = plotting.statistics_sensitivity(
        {"BatchNorm": ([2, 4, 8], [0.5, 0.3, 0.1]), "LayerNorm": ([2, 4, 8], [0.0, 0.0, 0.0])},
        {"BatchNorm": ([0.1, 0.5], [0.2, 0.9])},
    )
    assert fig.axes[0].get_xscale() == "log" and len(fig.axes[0].get_lines()) == 2
    fig = plotting.layer_norm_error_vs_width([2, 4, 8], {"notes": [1e-1, 1e-2, 1e-3], "fixed": [0.0, 0.0, 0.0]})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(ax.get_lines()[1].get_ydata(), [1e-17] * 3)


def test_activation_functions() -> None:
    fig = plotting.activation_functions(("relu", "gelu"))
    lines = fig.axes[0].get_lines()
    xs, relu = lines[0].get_data()
    np.testing.assert_allclose(relu, np.maximum(xs, 0.0))
    with pytest.raises(ValueError, match="names"):
        plotting.activation_functions(("tanh",))


def test_gradient_norms_and_training_figure() -> None:
    fig = plotting.gradient_norms_per_layer({"with residual": [1.0, 1.0, 1.0], "without": [1e-8, 1e-4, 1.0]})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert list(ax.get_lines()[0].get_xdata()) == [1, 2, 3]
    fig = plotting.norm_placement_training(
        {"Post-Norm": [2.0, 1.9, 1.5, 1.4, 1.2, 1.0], "Pre-Norm": [2.0, 1.8, 1.7, 1.2, 1.1, 1.0]},
        {"Post-Norm": [0.3, 0.2], "Pre-Norm": [0.1, 0.1]},
        smooth=3,
    )
    assert len(fig.axes) == 2
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_ydata(), [1.8, 1.6, 1.3666667, 1.2], rtol=1e-6)
    with pytest.raises(ValueError, match="smooth"):
        plotting.norm_placement_training({"a": [1.0]}, {"a": [1.0]}, smooth=0)


def test_stack_scale_draws_the_final_norm_apart_from_the_layers() -> None:
    fig = plotting.stack_scale({"Pre-Norm": ([1.1, 1.2, 1.3], 1.0), "Post-Norm": ([1.0, 1.0, 1.0], 1.0)})
    ax = fig.axes[0]
    layers = [line for line in ax.get_lines() if line.get_label() in ("Pre-Norm", "Post-Norm")]
    assert [list(line.get_xdata()) for line in layers] == [[1, 2, 3], [1, 2, 3]]  # the layer lines stop at layer 3
    np.testing.assert_allclose(layers[0].get_ydata(), [1.1, 1.2, 1.3])
    finals = [line for line in ax.get_lines() if line.get_marker() == "s"]
    assert len(finals) == 2 and all(list(line.get_xdata()) == [4] for line in finals)
    assert finals[0].get_markersize() > finals[1].get_markersize()  # equal values: both squares stay visible
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "final\nnorm"
    with pytest.raises(TypeError, match="pair"):
        plotting.stack_scale({"a": [1.0, 2.0]})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="same number of layers"):
        plotting.stack_scale({"a": ([1.0, 2.0], 1.0), "b": ([1.0], 1.0)})
    with pytest.raises(ValueError, match="at least one"):
        plotting.stack_scale({})


def test_no_warnings_when_drawing() -> None:
    x, mask = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plotting.normalization_axes_cube()
        plotting.normalization_axes_unfolded()
        plotting.normalization_statistics(x, mask)
        plotting.stack_scale({"a": ([1.0, 2.0], 1.0)})


def test_norm_placement_seeds_draws_one_line_per_seed() -> None:
    losses = {"Post-Norm": [[2.3] * 6, [2.2] * 6], "Pre-Norm": [[2.0, 1.0, 0.5, 0.2, 0.1, 0.1], [1.0] * 6]}
    fig = plotting.norm_placement_seeds(losses, {"Post-Norm": [0.3, 0.2], "Pre-Norm": [0.1, 0.1]}, smooth=3, chance=2.3)
    ax = fig.axes[0]
    assert len(fig.axes) == 2 and ax.get_yscale() == "log"
    lines = ax.get_lines()
    assert len(lines) == 4 + 1  # two arms x two seeds, and the chance line
    np.testing.assert_allclose(lines[2].get_ydata(), [7 / 6, 0.5666667, 0.2666667, 0.1333333], rtol=1e-6)
    assert list(lines[2].get_xdata()) == [3, 4, 5, 6]  # the step at the end of each window
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()  # one colour per arm
    assert len(plotting.norm_placement_seeds(losses, smooth=1, warmup_steps=2).axes) == 1


@pytest.mark.parametrize(
    ("losses", "smooth", "error", "match"),
    [
        ({"a": [[1.0, 2.0]]}, 0, ValueError, "smooth"),
        ({}, 2, TypeError, "losses"),
        ({"a": [1.0, 2.0]}, 2, ValueError, r"losses\['a'\]"),
        ({"a": [[1.0, 2.0], [1.0]]}, 2, TypeError, r"losses\['a'\]"),
    ],
)
def test_norm_placement_seeds_refuses_bad_input(losses, smooth, error, match) -> None:
    with pytest.raises(error, match=match):
        plotting.norm_placement_seeds(losses, smooth=smooth)
