"""The chapter 08 encoding explorer works in plain Python: moving a slider updates its state and figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import transformer_lab as tl  # noqa: E402

torch.set_num_threads(1)


def _marked_row(explorer) -> float:  # the horizontal line drawn on the heatmap
    ax = explorer.figure.axes[0]
    return next(line.get_ydata()[0] for line in ax.lines if line.get_ydata()[0] == line.get_ydata()[1])


def test_explorer_starts_with_its_arguments() -> None:
    explorer = tl.widgets.encoding_explorer(d_model=16, max_len=40, position=5, dimension=3)
    assert explorer.state == {"position": 5, "dimension": 3, "d_model": 16}
    assert explorer.n_draws == 1
    assert explorer.pe.shape == (40, 16)
    assert _marked_row(explorer) == 5
    assert repr(explorer) == "EncodingExplorer(position=5, dimension=3, d_model=16)"
    assert explorer.widget.children[1] is explorer.image
    assert explorer.image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_moving_the_position_slider_redraws() -> None:
    explorer = tl.widgets.encoding_explorer(d_model=16, max_len=40, position=5, dimension=3)
    explorer.position.value = 22
    assert explorer.state["position"] == 22 and explorer.n_draws == 2
    assert _marked_row(explorer) == 22
    dots = explorer.figure.axes[2].lines[0].get_ydata()
    np.testing.assert_allclose(dots, (explorer.pe @ explorer.pe[22]).numpy(), rtol=1e-5, atol=1e-5)


def test_moving_the_dimension_slider_changes_the_curve() -> None:
    explorer = tl.widgets.encoding_explorer(d_model=16, max_len=40, position=5, dimension=3)
    explorer.dimension.value = 10
    samples = [
        line for line in explorer.figure.axes[1].lines if line.get_marker() == "o" and len(line.get_ydata()) == 40
    ]
    np.testing.assert_allclose(
        samples[0].get_ydata(), tl.sinusoidal_encoding(40, 16)[:, 10].numpy(), rtol=1e-6, atol=1e-7
    )
    assert "dim 10" in explorer.figure.axes[1].get_title()


def test_lowering_d_model_clamps_the_dimension_and_rebuilds_the_table() -> None:
    explorer = tl.widgets.encoding_explorer(d_model=32, max_len=30, position=2, dimension=20)
    explorer.d_model.value = 9  # odd: the last column is a sine
    assert explorer.state == {"position": 2, "dimension": 8, "d_model": 9}
    assert explorer.pe.shape == (30, 9)
    torch.testing.assert_close(explorer.pe, tl.sinusoidal_encoding(30, 9))
    assert explorer.figure.axes[0].images[0].get_array().shape == (30, 9)
    explorer.d_model.value = 64
    assert explorer.dimension.max == 63 and explorer.state["dimension"] == 8


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="d_model"):
        tl.widgets.encoding_explorer(d_model=1)
    with pytest.raises(ValueError, match="position"):
        tl.widgets.encoding_explorer(max_len=10, position=10)
    with pytest.raises(ValueError, match="dimension"):
        tl.widgets.encoding_explorer(d_model=8, dimension=8)


def test_every_change_replaces_the_picture() -> None:
    explorer = tl.widgets.encoding_explorer(d_model=8, max_len=20, position=1, dimension=0)
    first = explorer.image.value
    explorer.position.value = 7
    second = explorer.image.value
    explorer.dimension.value = 5
    assert second[:8] == b"\x89PNG\r\n\x1a\n" and len({first, second, explorer.image.value}) == 3
    assert explorer.n_draws == 3
