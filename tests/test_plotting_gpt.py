"""Tests of chapter 10's figures (tl.plotting.gpt): they draw, say what they show, and refuse bad input."""

from __future__ import annotations

import io
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import transformer_lab as tl  # noqa: E402
from transformer_lab.training import TextHistory  # noqa: E402


def _draw(fig: matplotlib.figure.Figure) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing-glyph or layout warning
        fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def _history(steps: int = 40, start: float = 3.0) -> TextHistory:
    h = TextHistory()
    h.step = list(range(1, steps + 1))
    h.loss = [start - 0.02 * s for s in h.step]
    h.lr = [1e-3] * steps
    h.eval_step = [10, 20, 40]
    h.val_loss = [2.5, 2.2, 1.9]
    h.eval_seconds = [1.0, 2.0, 4.0]
    return h


def test_recipe_curves_put_both_runs_on_the_characters_axis() -> None:
    fig = tl.plotting.recipe_curves(
        {"a": _history(), "b": _history(20).to_dict()}, {"a": 12 * 64, "b": 24 * 64}, target=1.88, smooth=5
    )
    right = fig.axes[1]
    lines = [line for line in right.get_lines() if line.get_label() in ("a", "b")]
    assert [line.get_label() for line in lines] == ["a", "b"]
    np.testing.assert_allclose(lines[0].get_xdata(), np.array([10, 20, 40]) * 12 * 64 / 1e6)
    np.testing.assert_allclose(lines[1].get_xdata(), np.array([10, 20, 40]) * 24 * 64 / 1e6)
    assert any("1.88" in t.get_text() for t in right.texts)
    left = fig.axes[0].get_lines()[0].get_ydata()
    np.testing.assert_allclose(left[4], np.mean(_history().loss[:5]))  # running mean over 5 steps
    _draw(fig)


def test_recipe_curves_label_two_nearby_ends_one_above_one_below() -> None:
    """A rerun that ends a little apart from its shipped run (chapter 10: 1.853 against 1.861): the two values
    would be drawn over each other, so the second goes below its point; a distant end keeps its label above."""
    rerun = _history()
    rerun.val_loss = [2.5, 2.2, 1.892]
    far = _history()
    far.val_loss = [2.5, 2.2, 1.6]
    fig = tl.plotting.recipe_curves({"a": _history(), "b": rerun, "c": far}, dict.fromkeys("abc", 768))
    offsets = {t.get_text(): t.xyann[1] for t in fig.axes[1].texts}
    assert offsets == {"1.900": 4, "1.892": -12, "1.600": 4}
    _draw(fig)


def test_recipe_curves_refuse_missing_sizes_and_bad_histories() -> None:
    with pytest.raises(ValueError, match="characters_per_step"):
        tl.plotting.recipe_curves({"a": _history()}, {"b": 768})
    with pytest.raises(ValueError, match="lacks"):
        tl.plotting.recipe_curves({"a": {"step": [1]}}, {"a": 768})
    with pytest.raises(TypeError, match="TextHistory"):
        tl.plotting.recipe_curves({"a": 3}, {"a": 768})
    with pytest.raises(ValueError, match="smooth"):
        tl.plotting.recipe_curves({"a": _history()}, {"a": 768}, smooth=0)


def test_sampling_filters_show_how_many_tokens_each_setting_keeps() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    rows = {
        "T=1": torch.softmax(logits, -1),
        "T=0.5": torch.softmax(logits / 0.5, -1),
        "top-k 2": torch.softmax(tl.gpt.filter_logits(logits, top_k=2), -1),
    }
    fig = tl.plotting.sampling_filters(rows, list("abcd"))
    titles = ["T=1\n4 of 4 can be drawn", "T=0.5\n4 of 4 can be drawn", "top-k 2\n2 of 4 can be drawn"]
    assert [ax.get_title() for ax in fig.axes] == titles
    _draw(fig)
    # show=2 draws the two most likely tokens (in vocabulary order); the counts stay over the whole vocabulary
    fig = tl.plotting.sampling_filters(rows, list("abcd"), show=2)
    assert [ax.get_title() for ax in fig.axes] == titles
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b"]
    _draw(fig)
    with pytest.raises(ValueError, match="one probability per label"):
        tl.plotting.sampling_filters(rows, list("abc"))
    with pytest.raises(ValueError, match="show"):
        tl.plotting.sampling_filters(rows, list("abcd"), show=5)


def test_attention_by_distance_averages_the_diagonals() -> None:
    t = 8
    previous = torch.zeros(t, t)
    previous[0, 0] = 1.0
    previous[torch.arange(1, t), torch.arange(t - 1)] = 1.0  # every query reads the character before it
    weights = torch.stack([previous, torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]])[None]
    fig = tl.plotting.attention_by_distance(weights, max_distance=3)  # (1 layer, 2 heads, T, T)
    table = fig.axes[0].get_images()[0].get_array()
    np.testing.assert_allclose(table[0], [0.0, 1.0, 0.0, 0.0])
    expected = np.mean([1.0 / (q + 1) for q in range(3, t)])
    np.testing.assert_allclose(table[1], [expected] * 4, rtol=1e-6)
    _draw(fig)
    with pytest.raises(ValueError, match="max_distance"):
        tl.plotting.attention_by_distance(weights, max_distance=t)
    with pytest.raises(ValueError, match="layers, heads, T, T"):
        tl.plotting.attention_by_distance(torch.zeros(2, 3, 3))


def test_sample_rates_label_every_bar() -> None:
    fig = tl.plotting.sample_rates({"model": {"shape": 0.97, "copy": 0.01}, "bigram": {"shape": 0.0, "copy": 0.0}})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["97%", "0%", "1%", "0%"]
    fig.canvas.draw()
    legend = fig.axes[0].get_legend().get_window_extent()
    assert legend.x0 >= fig.axes[0].get_window_extent().x1  # beside the axes, over no bar
    _draw(fig)
    with pytest.raises(ValueError, match="must have the rates"):
        tl.plotting.sample_rates({"a": {"x": 0.1}, "b": {"y": 0.2}})
