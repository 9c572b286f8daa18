"""tl.plotting: the shared style (plotting/style.py) and the attention and mask pictures (plotting/attention.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import transformer_lab as tl  # noqa: E402
from transformer_lab.plotting import style  # noqa: E402

TOKENS = ["the", "cat", "sat", "down"]


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _weights(t: int = 4, s: int = 4, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(t, s, generator=generator), dim=-1)


def _tick_labels(ax: plt.Axes, axis: str) -> list[str]:
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


# --- style ---------------------------------------------------------------------------------------


def test_course_style_is_scoped() -> None:
    before = matplotlib.rcParams["axes.spines.top"]
    with style.course_style():
        assert matplotlib.rcParams["axes.spines.top"] is False
        assert matplotlib.rcParams["figure.dpi"] == 90
    assert matplotlib.rcParams["axes.spines.top"] == before


def test_course_style_keeps_interactive_mode_switched_on_inside() -> None:
    """A notebook's inline backend switches interactive mode on when the first figure loads it; leaving the
    style context must not switch it off again (or no later figure would be shown)."""
    was = matplotlib.is_interactive()
    try:
        matplotlib.interactive(False)
        with style.course_style():
            matplotlib.interactive(True)
        assert matplotlib.is_interactive()
    finally:
        matplotlib.interactive(was)


def test_new_figure_returns_a_2d_grid() -> None:
    fig, axes = style.new_figure(2, 3)
    assert isinstance(fig, Figure)
    assert axes.shape == (2, 3)
    assert fig.dpi == 90


def test_to_numpy_accepts_tensors_with_grad_and_lists() -> None:
    x = torch.ones(2, 2, requires_grad=True)
    assert style.to_numpy(x).dtype == np.float64
    assert style.to_numpy([[1, 2]]).shape == (1, 2)


def test_heatmap_labels_both_axes_and_rejects_bad_input() -> None:
    fig, axes = style.new_figure()
    ax = axes[0, 0]
    style.heatmap(ax, np.eye(3), ["a", "b", "c"], ["x", "y", "z"], title="t", x_title="keys", y_title="queries")
    assert _tick_labels(ax, "x") == ["a", "b", "c"]
    assert _tick_labels(ax, "y") == ["x", "y", "z"]
    assert ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries" and ax.get_title() == "t"
    with pytest.raises(ValueError, match="2-D"):
        style.heatmap(ax, np.zeros(3))
    with pytest.raises(ValueError, match="2 labels for an axis of length 3"):
        style.heatmap(ax, np.eye(3), ["a", "b"])


def test_curves_draws_named_lines_with_legend() -> None:
    fig, axes = style.new_figure()
    ax = axes[0, 0]
    style.curves(ax, {"a": [1.0, 2.0, 3.0], "b": ([0, 2], [1.0, 0.5])}, x_title="step", y_title="loss", log_y=True)
    assert len(ax.get_lines()) == 2
    assert ax.get_legend() is not None
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "step" and ax.get_ylabel() == "loss"


# --- attention maps --------------------------------------------------------------------------------


def test_attention_heatmap_has_token_labels_on_both_axes() -> None:
    fig = tl.plotting.attention_heatmap(_weights(), TOKENS, TOKENS, title="untrained")
    ax = fig.axes[0]
    assert _tick_labels(ax, "x") == TOKENS
    assert _tick_labels(ax, "y") == TOKENS
    assert ax.get_xlabel() and ax.get_ylabel()
    assert ax.get_title() == "untrained"
    image = ax.get_images()[0]
    np.testing.assert_allclose(image.get_array(), _weights().numpy(), rtol=1e-6)
    assert image.get_clim() == (0.0, 1.0)
    assert len(ax.texts) == 16  # annotated: small matrix


def test_attention_heatmap_rectangular_and_no_annotation_when_large() -> None:
    fig = tl.plotting.attention_heatmap(_weights(12, 11), [str(i) for i in range(11)], [str(i) for i in range(12)])
    ax = fig.axes[0]
    assert len(ax.texts) == 0
    assert len(_tick_labels(ax, "x")) == 11 and len(_tick_labels(ax, "y")) == 12


def test_attention_heatmap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\(T, S\) matrix"):
        tl.plotting.attention_heatmap(torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="labels"):
        tl.plotting.attention_heatmap(_weights(), TOKENS[:3], TOKENS)


def test_attention_grid_layers_by_heads() -> None:
    weights = torch.stack([torch.stack([_weights(seed=10 * layer + h) for h in range(3)]) for layer in range(2)])
    fig = tl.plotting.attention_grid(weights, TOKENS, TOKENS, title="grid")
    assert len(fig.axes) == 7  # 6 maps and one shared colour bar
    maps = fig.axes[:6]
    titles = [ax.get_title() for ax in maps]
    assert titles[0] == "layer 1, head 1" and titles[-1] == "layer 2, head 3"
    assert _tick_labels(maps[3], "x") == TOKENS  # bottom row carries the key labels
    assert _tick_labels(maps[0], "y") == TOKENS  # first column carries the query labels
    np.testing.assert_allclose(maps[4].get_images()[0].get_array(), weights[1, 1].numpy(), rtol=1e-6)
    assert fig.axes[6].get_ylabel() == "weight"
    # one title per axis for the whole grid, the words of attention_heatmap's axes
    assert (fig.get_supxlabel(), fig.get_supylabel()) == ("key (attended to)", "query (attending)")
    assert len(fig.axes) == 7  # the titles add no axes: a notebook's "<Figure ... with 9 Axes>" stays the same
    one_layer = tl.plotting.attention_grid(weights[0], row_names=["self-attention"])
    assert one_layer.axes[1].get_title() == "self-attention, head 2"
    untitled = tl.plotting.attention_grid(weights[0], x_title="", y_title="source position")
    assert (untitled.get_supxlabel(), untitled.get_supylabel()) == ("", "source position")
    as_list = tl.plotting.attention_grid([weights[0], weights[1]])
    assert len(as_list.axes) == 7


def test_attention_grid_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="layers, heads, T, S"):
        tl.plotting.attention_grid(torch.zeros(4, 4))


def test_mask_picture_and_grid() -> None:
    mask = tl.causal_mask(4)
    fig = tl.plotting.mask_picture(mask, TOKENS, TOKENS)
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), mask.numpy().astype(float))
    assert _tick_labels(ax, "x") == TOKENS and _tick_labels(ax, "y") == TOKENS
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    padding = torch.tensor([[True, True, True, False]])  # (1, S) before broadcasting
    grid = tl.plotting.mask_grid({"padding (1, S)": padding, "causal": mask, "both": padding & mask}, TOKENS)
    assert [a.get_title() for a in grid.axes] == ["padding (1, S)", "causal", "both"]
    # a one-row mask before broadcasting holds for every query: its row says so instead of an index
    assert _tick_labels(grid.axes[0], "y") == ["all queries"] and _tick_labels(grid.axes[1], "y") == TOKENS


def test_mask_picture_writes_cell_labels_and_axis_titles() -> None:
    padding = torch.tensor([[True, True, True], [True, False, False]])  # (B=2, S=3): rows are sentences
    words = [["a", "b", "c"], ["d", "<pad>", "<pad>"]]
    fig = tl.plotting.mask_picture(padding, cell_labels=words, x_title="key position", y_title="sentence")
    ax = fig.axes[0]
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    assert {k: t.get_text() for k, t in cells.items()} == {(i, j): words[i][j] for i in range(2) for j in range(3)}
    assert cells[(0, 0)].get_color() == "white" and cells[(1, 1)].get_color() == "black"  # readable on both colours
    assert ax.get_xlabel() == "key position" and ax.get_ylabel() == "sentence"
    with pytest.raises(ValueError, match="cell_labels must be 2 lists"):
        tl.plotting.mask_picture(padding, cell_labels=words[:1])
    with pytest.raises(ValueError, match=r"cell_labels\[1\] must be a list of 3"):
        tl.plotting.mask_picture(padding, cell_labels=[words[0], ["d"]])


def test_mask_broadcast_draws_one_row_of_panels_per_sentence() -> None:
    batch = torch.tensor([[1, 2, 3, 4], [1, 5, 0, 0], [1, 0, 0, 0]])  # (B=3, S=4), pad id 0
    padding = tl.padding_mask(batch, pad_id=0)  # (B, 1, 1, S)
    causal = tl.causal_mask(4)
    words = [[f"w{b}{j}" for j in range(4)] for b in range(3)]
    fig = tl.plotting.mask_broadcast(padding, causal, words)
    assert len(fig.axes) == 3 * 4 and len(fig.legends) == 1
    expected = tl.target_mask(batch, pad_id=0)  # (B, 1, T, T): what the library computes
    fig.canvas.draw()
    for b in range(3):
        strip, copied, triangle, combined = fig.axes[4 * b : 4 * b + 4]
        np.testing.assert_array_equal(strip.get_images()[0].get_array(), padding[b, 0].numpy().astype(float))
        np.testing.assert_array_equal(copied.get_images()[0].get_array(), padding[b, 0].expand(4, 4).numpy())
        np.testing.assert_array_equal(triangle.get_images()[0].get_array(), causal.numpy().astype(float))
        np.testing.assert_array_equal(combined.get_images()[0].get_array(), expected[b, 0].numpy().astype(float))
        assert _tick_labels(combined, "x") == words[b] and _tick_labels(combined, "y") == words[b]
        assert _tick_labels(strip, "y") == ["all queries"] and strip.get_title().startswith(f"sentence {b}")
        assert strip.get_window_extent().height < 0.4 * copied.get_window_extent().height  # a strip, not a square
    # a (B, S) padding mask works too, and positions label the cells when no tokens are given
    plain = tl.plotting.mask_broadcast(padding[:, 0, 0], causal)
    assert _tick_labels(plain.axes[3], "x") == ["0", "1", "2", "3"]


def test_mask_broadcast_rejects_bad_input() -> None:
    padding = tl.padding_mask(torch.tensor([[1, 2, 0]]), pad_id=0)  # (1, 1, 1, 3)
    with pytest.raises(ValueError, match=r"causal must be \(S, S\) = \(3, 3\)"):
        tl.plotting.mask_broadcast(padding, tl.causal_mask(4))
    with pytest.raises(ValueError, match="padding must be"):
        tl.plotting.mask_broadcast(torch.ones(3, dtype=torch.bool), tl.causal_mask(3))
    with pytest.raises(ValueError, match="tokens must be 1 lists"):
        tl.plotting.mask_broadcast(padding, tl.causal_mask(3), [["a", "b", "c"], ["d", "e", "f"]])
    with pytest.raises(ValueError, match=r"tokens\[0\] must be a list of 3"):
        tl.plotting.mask_broadcast(padding, tl.causal_mask(3), [["a", "b"]])


def test_mask_pictures_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="2-D"):
        tl.plotting.mask_picture(torch.ones(1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-empty dict"):
        tl.plotting.mask_grid({})


# --- why sqrt(d_k) -------------------------------------------------------------------------------


def test_softmax_saturation_curves() -> None:
    scores = torch.tensor([1.0, 0.5, -0.3, 0.2])
    fig = tl.plotting.softmax_saturation(scores, [0.5, 1, 4, 16])
    left, right = fig.axes
    assert len(left.get_lines()) == 4
    largest_weight, largest_gradient = (line.get_ydata() for line in right.get_lines())
    assert np.all(np.diff(largest_weight) > 0)  # the softmax gets peakier
    assert largest_gradient[-1] < 0.01 < largest_gradient[0]  # and its gradient vanishes
    for ax in (left, right):
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


def test_softmax_saturation_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="1-D vector"):
        tl.plotting.softmax_saturation(torch.zeros(2, 2), [1.0])
    with pytest.raises(ValueError, match="positive"):
        tl.plotting.softmax_saturation(torch.zeros(3), [0.0, 1.0])


def test_score_variance_plot() -> None:
    fig = tl.plotting.score_variance([1, 4, 16], [1.1, 3.9, 16.5], [1.1, 0.97, 1.03])
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 3
    assert ax.get_xlabel() == "d_k" and ax.get_ylabel()
    with pytest.raises(ValueError, match="one value per d_k"):
        tl.plotting.score_variance([1, 4], [1.0], [1.0, 1.0])


def test_plots_emit_no_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl.plotting.attention_heatmap(_weights(), TOKENS, TOKENS)
        tl.plotting.mask_grid({"causal": tl.causal_mask(4)}, TOKENS)
        tl.plotting.softmax_saturation(torch.tensor([1.0, 0.0]), [1.0, 2.0])
        fig = tl.plotting.score_variance([1, 2], [1.0, 2.0], [1.0, 1.0])
        fig.canvas.draw()


def test_mask_pictures_have_a_legend_and_draw_a_one_row_mask_as_a_strip() -> None:
    import torch

    import transformer_lab as tl

    fig = tl.plotting.mask_picture(tl.causal_mask(4))
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert texts == ["True: may attend", "False: blocked"]
    strip = torch.tensor([[True, True, False, False, False]])
    fig = tl.plotting.mask_grid({"padding (1, S)": strip, "causal": tl.causal_mask(5)})
    assert len(fig.legends) == 1  # one legend for the whole grid
    fig.canvas.draw()
    strip_box, square_box = (ax.get_window_extent() for ax in fig.axes[:2])
    assert strip_box.height < 0.4 * square_box.height, "a (1, S) mask must be drawn as a strip, not a square"


def test_label_smoothing_zoom_shows_where_the_two_smoothings_differ() -> None:
    import transformer_lab as tl

    labels = ["<pad>", "<s>", "</s>", "a", "b", "c"]
    fig = tl.plotting.label_smoothing_plot(labels, target=3, pad_id=0, smoothing=0.1)
    whole, zoom = fig.axes[:2]
    assert whole.get_yscale() == "linear"
    assert [t.get_text() for t in zoom.get_xticklabels()] == ["<pad>", "<s>", "</s>", "b", "c"]
    heights = [patch.get_height() for patch in zoom.patches]  # 3 series x 5 tokens, series by series
    ours, theirs = heights[5:10], heights[10:15]
    assert ours[0] == 0 and abs(theirs[0] - 0.1 / 6) < 1e-9  # PAD: nothing in ours, eps / V in PyTorch's
    assert abs(ours[1] - 0.1 / 4) < 1e-6  # eps over the V - 2 tokens that are neither PAD nor the true one
