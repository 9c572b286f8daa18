"""Tests of the chapter 09 figures and of the shipped CJK font (every token label legible)."""

from __future__ import annotations

import io
import logging
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import font_manager  # noqa: E402

import transformer_lab as tl  # noqa: E402
from transformer_lab.plotting import style  # noqa: E402
from transformer_lab.training import History  # noqa: E402


def _render(fig: matplotlib.figure.Figure) -> list[str]:
    """Draw to PNG and return every warning and font log message emitted while drawing."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("matplotlib")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.savefig(io.BytesIO(), format="png")
    finally:
        logger.removeHandler(handler)
        plt.close(fig)
    return [str(w.message) for w in caught] + [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_the_shipped_font_is_ours_and_covers_the_vocabulary() -> None:
    for weight in ("normal", "bold"):
        found = font_manager.findfont(
            font_manager.FontProperties(family=style.CJK_FONT_FAMILY, weight=weight), fallback_to_default=False
        )
        assert "TransformerLabCJK-Subset" in found
    from fontTools.ttLib import TTFont

    cmap = TTFont(style.CJK_FONT_FILE).getBestCmap()
    assert all(ord(ch) in cmap for ch in "年月日0123456789-") and 0x2423 in cmap
    assert (style.CJK_FONT_FILE.parent / "OFL-TransformerLabCJK-Subset.txt").exists()


def test_chinese_token_labels_draw_without_missing_glyph_warnings() -> None:
    labels = list("2026年11月21日")
    fig = tl.plotting.attention_heatmap(torch.rand(len(labels), len(labels)).softmax(-1), labels, labels, title="年")
    problems = _render(fig)
    assert not [p for p in problems if "missing from" in p or "Glyph" in p or "findfont" in p], problems


def test_the_check_would_see_a_missing_glyph() -> None:
    """Control: a character outside both fonts does produce the warning the test above looks for."""
    fig, axes = style.new_figure()
    with style.course_style():
        axes[0, 0].set_title("号")  # not in DejaVu Sans nor in the subset
    problems = _render(fig)
    assert any("missing from" in p or "Glyph" in p for p in problems), problems


def test_noam_and_label_smoothing_plots() -> None:
    fig = tl.plotting.noam_schedule_plot(((64, 100), (64, 400)), steps=500)
    assert len(fig.axes[0].lines) == 2
    assert not _render(fig)
    labels = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "b", "年"]
    fig = tl.plotting.label_smoothing_plot(labels, target=4, pad_id=0, smoothing=0.2)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert len(heights) == 3 * len(labels)
    assert heights[len(labels)] == 0.0  # ours: nothing on PAD
    assert heights[2 * len(labels)] == pytest.approx(0.2 / 7)  # PyTorch: eps / V on PAD
    assert not _render(fig)
    with pytest.raises(ValueError, match="target"):
        tl.plotting.label_smoothing_plot(labels, target=0)


def test_training_curves_and_cross_attention_maps() -> None:
    h = History(step=[1, 2, 3], loss=[3.0, 2.0, 1.0], lr=[0.1, 0.2, 0.3], eval_step=[3], val_exact_match=[0.5])
    fig = tl.plotting.training_curves({"a": h, "b": h.to_dict()})
    assert len(fig.axes) == 3 and len(fig.axes[0].lines) == 2
    fig.clf()
    src = list("2026年1月5日")
    out = ["<bos>", *"2026-01-05"]
    w = torch.rand(len(out), len(src)).softmax(-1)
    fig = tl.plotting.cross_attention_maps([(w, src, out, "chinese"), (w, src, out, "again"), (w, src, out, "3")])
    assert sum(ax.get_visible() for ax in fig.axes if ax.images) == 3
    assert not [p for p in _render(fig) if "missing" in p or "Glyph" in p]
    with pytest.raises(ValueError, match="maps"):
        tl.plotting.cross_attention_maps([])


def test_no_notebook_in_either_language_drew_a_missing_glyph() -> None:
    """Every figure of both editions in both languages: no missing-glyph warning in any stored output. The Chinese
    notebooks' figures are the English ones (tests/test_translation.py proves every non-exercise output identical),
    so Chinese reaches a figure only through a token label, which the shipped font covers (tests above)."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    paths = sorted(root.glob("notebooks/**/[0-9][0-9]_*.ipynb"))
    assert any("zh" in p.parts for p in paths), "no Chinese notebook found (python tools/translate.py)"
    for path in paths:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for output in cell.get("outputs", []):
                text = "".join(output.get("text", "")) + json.dumps(output.get("data", {}).get("text/plain", ""))
                assert "missing from" not in text and "Glyph" not in text, f"{path.relative_to(root)}: {text[:200]}"
