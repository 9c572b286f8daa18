"""Chapter 08 figures: each draws what it says (checked on the artists), and refuses bad input clearly."""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import transformer_lab as tl  # noqa: E402
from transformer_lab.plotting import encoding as plots  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def pe() -> torch.Tensor:
    return tl.sinusoidal_encoding(60, 16)


def test_heatmap_shows_the_table_and_the_chosen_row_and_column(pe: torch.Tensor) -> None:
    fig = plots.encoding_heatmap(pe, position=7, dimension=3)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), pe.numpy())
    assert ax.get_xlabel() == "dimension" and ax.get_ylabel() == "position"
    ys = [line.get_ydata()[0] for line in ax.lines if line.get_ydata()[0] == line.get_ydata()[1]]
    xs = [line.get_xdata()[0] for line in ax.lines if line.get_xdata()[0] == line.get_xdata()[1]]
    assert 7 in ys and 3 in xs
    # a (1, max_len, D) buffer as in the notes works too
    plots.encoding_heatmap(pe.unsqueeze(0))


def test_curves_follow_the_columns(pe: torch.Tensor) -> None:
    fig = plots.encoding_curves(pe, dimensions=(0, 5), position=12)
    lines = fig.axes[0].lines
    # the encoding at whole positions (dots), each on a fine line of the sinusoid it samples
    dots = [line for line in lines if line.get_marker() == "o" and len(line.get_xdata()) == pe.shape[0]]
    np.testing.assert_allclose(dots[0].get_ydata(), pe[:, 0].numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dots[1].get_ydata(), pe[:, 5].numpy(), rtol=1e-6, atol=1e-6)
    fine = [line for line in lines if len(line.get_xdata()) > pe.shape[0]]
    assert len(fine) == 2
    for line, column in zip(fine, (0, 5), strict=True):
        xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        np.testing.assert_allclose(np.interp(np.arange(pe.shape[0]), xs, ys), pe[:, column].numpy(), atol=2e-2)
    # a table that is not sinusoidal (learned positions) is drawn as it is, with no invented curve
    learned = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    lines = plots.encoding_curves(learned, dimensions=(1,)).axes[0].lines
    assert len(lines) == 1
    np.testing.assert_allclose(lines[0].get_ydata(), learned[:, 1].numpy(), rtol=1e-6)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["dim 0 (sin)", "dim 5 (cos)"]


def test_similarity_heatmap_is_the_gram_matrix(pe: torch.Tensor) -> None:
    fig = plots.position_similarity_heatmap(pe)
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), (pe @ pe.T).numpy(), rtol=1e-5, atol=1e-5)


def test_similarity_curves_depend_on_the_offset_only(pe: torch.Tensor) -> None:
    fig = plots.position_similarity_curves(pe, positions=(0, 9, 20), max_offset=30)
    lines = fig.axes[0].lines
    assert len(lines) == 3
    np.testing.assert_allclose(lines[0].get_xdata(), np.arange(31))
    for line in lines[1:]:
        np.testing.assert_allclose(line.get_ydata(), lines[0].get_ydata(), atol=1e-4)
    assert lines[0].get_ydata()[0] == pytest.approx(8.0, abs=1e-5)  # |PE(p)|^2 = D / 2


def test_rotation_pairs_one_panel_per_pair_with_both_points(pe: torch.Tensor) -> None:
    fig = plots.rotation_pairs(pe, position=5, offset=3, pairs=(0, 2))
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    ax = fig.axes[1]  # pair 2: dimensions 4 and 5
    points = {line.get_label(): (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines}
    np.testing.assert_allclose(points["pos = 5"], pe[5, 4:6].numpy(), rtol=1e-6)
    np.testing.assert_allclose(points["pos + 3"], pe[8, 4:6].numpy(), rtol=1e-6)


def test_rotation_pairs_draws_each_turn_as_an_arc_and_enlarges_short_ones() -> None:
    table = tl.sinusoidal_encoding(200, 8)
    fig = plots.rotation_pairs(table, position=4, offset=3, pairs=(0, 2))
    assert len(fig.axes) == 2  # the inset is a child of its panel, not a panel of its own
    for ax, i, turn in ((fig.axes[0], 0, 3.0), (fig.axes[1], 2, 0.03)):
        arc = next(line for line in ax.lines if line.get_label() == "turn by 3 steps")
        xs, ys = arc.get_xdata(), arc.get_ydata()
        np.testing.assert_allclose(np.hypot(xs, ys), 1.0, atol=1e-6)  # along the unit circle
        np.testing.assert_allclose([xs[0], ys[0]], table[4, 2 * i : 2 * i + 2].numpy(), atol=1e-5)
        np.testing.assert_allclose([xs[-1], ys[-1]], table[7, 2 * i : 2 * i + 2].numpy(), atol=1e-5)
        assert ax.get_title().endswith(f"turn {turn:.2f} rad")
    assert not fig.axes[0].child_axes  # a 3-radian turn needs no enlargement
    (inset,) = fig.axes[1].child_axes  # a 0.03-radian one does
    width = np.diff(inset.get_xlim())[0]
    assert width < 0.1 and any(line.get_label() == "turn by 3 steps" for line in inset.lines)
    assert not plots.rotation_pairs(table, 4, 3, pairs=(2,), zoom_below=0).axes[0].child_axes


def test_histograms_cut_at_y_max_say_how_high_the_cut_bar_goes() -> None:
    spike, wide = torch.zeros(1000), torch.linspace(-3, 3, 1000)
    fig = plots.value_histograms({"spike": spike, "wide": wide}, bins=30, y_max=1.0)
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    (note,) = ax.texts  # only the spike goes above the cut
    assert note.get_text().startswith("spike: density ") and "↑" in note.get_text()
    with pytest.raises(ValueError, match="y_max"):
        plots.value_histograms({"a": wide}, y_max=0)


def test_histograms_and_frequency_errors_draw_each_series() -> None:
    fig = plots.value_histograms({"a": torch.randn(100), "b": torch.rand(10, 10)})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["a", "b"]
    fig = plots.frequency_errors({"exp_log": torch.tensor([0.0, 1e-7, 3e-7]), "pow": torch.zeros(3)})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [1e-12, 1e-7, 3e-7])


def test_overview_redraws_into_the_same_figure(pe: torch.Tensor) -> None:
    fig = plots.encoding_overview(pe, position=4, dimension=2)
    assert len(fig.axes) == 4  # three panels and the heatmap's colour bar
    again = plots.encoding_overview(pe, position=10, dimension=9, fig=fig)
    assert again is fig and len(fig.axes) == 4
    dots = fig.axes[2].lines[0].get_ydata()
    np.testing.assert_allclose(dots, (pe @ pe[10]).numpy(), rtol=1e-5, atol=1e-5)


def test_bad_arguments_name_the_argument(pe: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="pe must be"):
        plots.encoding_heatmap(torch.zeros(3))
    with pytest.raises(ValueError, match="position"):
        plots.encoding_heatmap(pe, position=60)
    with pytest.raises(ValueError, match="dimensions"):
        plots.encoding_curves(pe, dimensions=(16,))
    with pytest.raises(ValueError, match="max_offset"):
        plots.position_similarity_curves(pe, positions=(0, 50), max_offset=20)
    with pytest.raises(ValueError, match="position \\+ offset"):
        plots.rotation_pairs(pe, position=50, offset=20)
    with pytest.raises(ValueError, match="pairs"):
        plots.rotation_pairs(pe, position=0, offset=1, pairs=(8,))
    with pytest.raises(TypeError, match="dimension"):
        plots.encoding_overview(pe, position=0, dimension=1.0)  # type: ignore[arg-type]


def test_no_warnings_while_drawing(pe: torch.Tensor) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.encoding_overview(pe, 3, 3)
        plots.rotation_pairs(pe, 3, 4)
        plots.position_similarity_curves(pe)
