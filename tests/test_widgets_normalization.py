"""Tests of chapter 04's widget: it builds, and moving a slider recomputes its state."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

import transformer_lab as tl
from transformer_lab import widgets


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, 4, generator=g)
    mask = torch.arange(8) < torch.tensor([5, 3, 2, 5, 4, 1]).unsqueeze(1)
    return x, mask


def test_explorer_starts_at_batch_two_without_extra_padding() -> None:
    x, mask = _batch()
    w = widgets.batch_norm_explorer(x, mask)
    batch_slider, pad_slider = w.children[0], w.children[1]
    assert (batch_slider.value, batch_slider.max, pad_slider.value, pad_slider.max) == (2, 6, 0, 3)
    assert w.state["batch_size"] == 2 and w.state["extra_padding"] == 0
    mean, _ = tl.batch_norm_statistics(x[:2, :5], mask[:2, :5])
    torch.testing.assert_close(w.state["batch_norm_mean_real_tokens"], mean)
    assert "padded positions" in w.summary.value
    assert w.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert repr(w) == "BatchNormExplorer(batch_size=2, extra_padding=0)"


def test_moving_the_sliders_updates_the_state() -> None:
    x, mask = _batch()
    w = widgets.batch_norm_explorer(x, mask)
    first_image = w.image.value
    w.children[0].value = 6
    assert w.state["batch_size"] == 6 and w.image.value != first_image
    assert repr(w) == "BatchNormExplorer(batch_size=6, extra_padding=0)"
    assert w.state["batch_norm_shift_real_tokens"] == pytest.approx(0.0, abs=1e-7)  # the whole batch
    before = w.state["batch_norm_shift_counting_padding"]
    w.children[1].value = 3
    assert w.state["extra_padding"] == 3
    assert w.state["padded_fraction"] == pytest.approx(1 - 20 / 48)
    mean, _ = tl.batch_norm_statistics(x[:, :8])  # padding counted
    torch.testing.assert_close(w.state["batch_norm_mean_counting_padding"], mean)
    assert w.state["batch_norm_shift_counting_padding"] != before
    assert w.state["batch_norm_shift_real_tokens"] == pytest.approx(0.0, abs=1e-7)  # masking ignores padding
    assert w.state["layer_norm_shift"] == 0.0  # LayerNorm never moves


def test_explorer_rejects_bad_input() -> None:
    x, mask = _batch()
    with pytest.raises(ValueError, match="mask must be a bool"):
        widgets.batch_norm_explorer(x, mask.float())
    with pytest.raises(ValueError, match="at least 2 sequences"):
        widgets.batch_norm_explorer(x[:1], mask[:1])
    bad = mask.clone()
    bad[0] = False
    with pytest.raises(ValueError, match="start with a real token"):
        widgets.batch_norm_explorer(x, bad)
