"""Misuse probe, second round: the kinds of misuse an outside probe found without a clear error.

An outside probe of the public API (351 cases) found these passing silently (a NaN picture, a zero statistic, a
truthy string taken as True) or failing deep inside torch / numpy / matplotlib with words that name no argument.
Each kind has its own test; every case must raise the given error type with a message that names the argument
(every text of `names`). Inputs that turned out legitimate get a right answer instead (`RIGHT_ANSWERS`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import random
import zipfile
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab import cli as tl_cli
from transformer_lab import data as tl_data
from transformer_lab import diagnostics as tl_diag
from transformer_lab import embedding as tl_emb
from transformer_lab import normalization as tl_norm
from transformer_lab import plotting as P
from transformer_lab import training as tl_train
from transformer_lab import widgets as W
from transformer_lab.exercises import all_exercises

matplotlib.use("Agg")

V, D, H, FF = 13, 8, 2, 16
META = torch.device("meta")
NAN, INF = float("nan"), float("inf")
TEXT = "hello world\nthe cat sat\n" * 6
TEXT_TOK = tl_data.TextTokenizer.from_text(TEXT)
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tok(b: int, length: int) -> torch.Tensor:
    return torch.randint(1, V, (b, length), generator=torch.Generator().manual_seed(1))


def weights(t: int = 3, s: int = 4) -> torch.Tensor:
    return torch.softmax(x(t, s), dim=-1)


def with_nan(value: torch.Tensor) -> torch.Tensor:
    value = value.clone()
    value.view(-1)[1] = NAN
    return value


@functools.cache
def char_model() -> tl.Transformer:
    tokenizer = tl_data.CharTokenizer()
    torch.manual_seed(0)
    config = tl.TransformerConfig(
        tokenizer.vocab_size, tokenizer.vocab_size, d_model=D, n_heads=H, d_ff=FF, n_layers=1, max_len=24
    )
    return tl.Transformer(config).eval()


@functools.cache
def model() -> tl.Transformer:
    torch.manual_seed(0)
    return tl.Transformer(tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=1, max_len=10)).eval()


@functools.cache
def gpt() -> nn.Module:
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=TEXT_TOK.vocab_size, block_size=8, d_model=D, n_heads=H, n_layers=1)
    return tl.GPT(config).eval()


def stream() -> torch.Tensor:
    return TEXT_TOK.encode(TEXT)


def write(tmp: Path, content: bytes, name: str = "file.pt") -> Path:
    path = tmp / name
    path.write_bytes(content)
    return path


def junk(seed: int, prefix: bytes = b"") -> bytes:
    return prefix + random.Random(seed).randbytes(512)


def zipped(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def checkpoint(tmp: Path, **extra: object) -> Path:
    path = tmp / "model.pt"
    tl.save_checkpoint(char_model(), path, **extra)
    return path


def gpt_checkpoint(tmp: Path) -> Path:
    path = tmp / "gpt.pt"
    tl_train.save_gpt(gpt(), path, TEXT_TOK)
    return path


def history(**edits: object) -> dict[str, list]:
    h = {"step": [1, 2, 3], "loss": [2.0, 1.5, 1.0], "lr": [0.1, 0.1, 0.1], "eval_step": [3], "val_exact_match": [0.5]}
    return {**h, **edits}  # type: ignore[dict-item]


def text_history(**edits: object) -> dict[str, list]:
    h = {"step": [1, 2, 3], "loss": [2.5, 2.2, 2.0], "eval_step": [2, 3], "val_loss": [2.3, 2.1]}
    return {**h, **edits}  # type: ignore[dict-item]


def table(n: int = 20, d: int = 8) -> torch.Tensor:
    return tl.sinusoidal_encoding(n, d)


# (id, call taking a tmp folder, error type, the texts the message must contain)
Case = tuple[str, Callable[[Path], object], type[BaseException], str | tuple[str, ...]]


def run_case(call: Callable[[Path], object], error: type[BaseException], names: str | tuple[str, ...], tmp: Path):
    import matplotlib.pyplot as plt

    try:
        with pytest.raises(error) as caught:
            call(tmp)
    finally:
        plt.close("all")
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    for name in (names,) if isinstance(names, str) else names:
        assert name in str(caught.value), f"the message does not name {name!r}: {caught.value}"


def cases(table_of_cases: list[Case]) -> list:
    return [pytest.param(c[1], c[2], c[3], id=c[0], marks=c[4] if len(c) > 4 else ()) for c in table_of_cases]


# ------------------------------------------------------------------ 1. plotting: NaN, inf and values of the wrong kind

hm, grid = P.attention_heatmap, P.attention_grid

PLOT_VALUES: list[Case] = [
    ("heatmap NaN weight", lambda t: hm(with_nan(weights())), ValueError, ("weights", "masked")),
    ("heatmap all NaN", lambda t: hm(torch.full((3, 3), NAN)), ValueError, "weights"),
    ("heatmap +inf", lambda t: hm(torch.tensor([[INF, 0.0], [0.5, 0.5]])), ValueError, "weights"),
    ("heatmap scores, not weights", lambda t: hm(x(3, 4) * 5), ValueError, ("weights", "softmax")),
    ("heatmap numpy NaN", lambda t: hm(np.array([[np.nan, 1.0], [0.5, 0.5]])), ValueError, "weights"),
    ("grid NaN in one head", lambda t: grid(with_nan(torch.rand(2, 2, 3, 3))), ValueError, "weights"),
    ("grid list with inf", lambda t: grid([torch.full((2, 3, 3), INF)]), ValueError, "weights"),
    (
        "cross_attention_maps NaN",
        lambda t: P.cross_attention_maps([(with_nan(weights(2, 3)), list("abc"), ["x", "y"], "t")]),
        ValueError,
        "maps[0]",
    ),
    (
        "attention_by_distance NaN",
        lambda t: P.attention_by_distance(with_nan(torch.rand(1, 2, 6, 6)), max_distance=2),
        ValueError,
        "weights",
    ),
    ("softmax_saturation NaN score", lambda t: P.softmax_saturation([1.0, NAN, 2.0], [1, 2]), ValueError, "scores"),
    ("softmax_saturation inf score", lambda t: P.softmax_saturation([1.0, INF], [1, 2]), ValueError, "scores"),
    ("softmax_saturation NaN scale", lambda t: P.softmax_saturation([1.0, 2.0], [1.0, NAN]), ValueError, "scales"),
    ("softmax_saturation inf scale", lambda t: P.softmax_saturation([1.0, 2.0], [1.0, INF]), ValueError, "scales"),
    ("softmax_saturation scale 'abc'", lambda t: P.softmax_saturation([1.0, 2.0], [1, "abc"]), TypeError, "scales"),
    ("encoding_heatmap NaN table", lambda t: P.encoding_heatmap(with_nan(table())), ValueError, "pe"),
    ("value_histograms NaN", lambda t: P.value_histograms({"a": torch.tensor([1.0, NAN])}), ValueError, "series"),
    ("value_histograms inf", lambda t: P.value_histograms({"a": torch.tensor([1.0, INF])}), ValueError, "series"),
    (
        "sampling_filters NaN probability",
        lambda t: P.sampling_filters({"T=1": torch.tensor([0.5, NAN, 0.5])}, list("abc")),
        ValueError,
        "rows",
    ),
    (
        "sampling_filters logits",
        lambda t: P.sampling_filters({"T=1": torch.tensor([2.0, -1.0, 0.5])}, list("abc")),
        ValueError,
        "rows",
    ),
    (
        "sampling_filters not summing to 1",
        lambda t: P.sampling_filters({"T=1": torch.tensor([0.2, 0.3, 0.1])}, list("abc")),
        ValueError,
        ("rows", "summing to 1"),
    ),
    ("sample_rates a percentage", lambda t: P.sample_rates({"m": {"shape": 45.0}}), ValueError, "rates"),
    ("sample_rates NaN", lambda t: P.sample_rates({"m": {"shape": NAN}}), ValueError, "rates"),
    ("sample_rates a word", lambda t: P.sample_rates({"m": {"shape": "half"}}), ValueError, "rates"),
    ("frequency_errors NaN", lambda t: P.frequency_errors({"exp": [1e-8, NAN]}), ValueError, "errors"),
    ("frequency_errors negative", lambda t: P.frequency_errors({"exp": [1e-8, -1e-7]}), ValueError, "errors"),
    ("score_variance d_k 0", lambda t: P.score_variance([0, 4], [1.0, 4.0], [1.0, 1.0]), ValueError, "d_k"),
    ("score_variance NaN", lambda t: P.score_variance([2, 4], [NAN, 4.0], [1.0, 1.0]), ValueError, "unscaled"),
    ("gradient norm negative", lambda t: P.gradient_norms_per_layer({"a": [1.0, -2.0]}), ValueError, "series"),
    (
        "heatmap vmin > vmax",
        lambda t: P.heatmap(P.new_figure()[1][0, 0], weights(), vmin=1.0, vmax=0.0),
        ValueError,
        "vmin",
    ),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(PLOT_VALUES))
def test_plots_refuse_values_they_would_draw_wrong(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 2. plotting: ranks, empty and ragged inputs

PLOT_SHAPES: list[Case] = [
    (
        "grid layers of different T",
        lambda t: grid([torch.rand(2, 3, 3), torch.rand(2, 4, 4)]),
        ValueError,
        "weights[1]",
    ),
    (
        "grid layers of different H",
        lambda t: grid([torch.rand(2, 3, 3), torch.rand(4, 3, 3)]),
        ValueError,
        "weights[1]",
    ),
    ("grid empty list", lambda t: grid([]), ValueError, "weights"),
    ("grid zero queries", lambda t: grid(torch.rand(1, 2, 0, 3)), ValueError, "weights"),
    (
        "attention_by_distance ragged",
        lambda t: P.attention_by_distance([torch.rand(2, 6, 6), torch.rand(2, 5, 5)], max_distance=2),
        ValueError,
        "weights[1]",
    ),
    ("attention_by_distance empty", lambda t: P.attention_by_distance([], max_distance=2), ValueError, "weights"),
    ("heatmap (0, 0)", lambda t: hm(torch.zeros(0, 0)), ValueError, "weights"),
    ("heatmap (3, 0)", lambda t: hm(torch.zeros(3, 0)), ValueError, "weights"),
    ("mask_grid 0-d", lambda t: P.mask_grid({"m": torch.tensor(True)}), ValueError, "masks['m']"),
    ("mask_grid 4-D", lambda t: P.mask_grid({"pad": tl.padding_mask(tok(2, 3), 0)}), ValueError, "masks['pad']"),
    ("mask_grid token ids", lambda t: P.mask_grid({"m": tok(2, 3)}), ValueError, "masks['m']"),
    ("mask_broadcast ids", lambda t: P.mask_broadcast(tok(2, 3), tl.causal_mask(3)), ValueError, "padding"),
    (
        "mask_broadcast float causal",
        lambda t: P.mask_broadcast(torch.ones(2, 3, dtype=torch.bool), torch.rand(3, 3)),
        ValueError,
        "causal",
    ),
    (
        "cross_attention_maps 1-D",
        lambda t: P.cross_attention_maps([(torch.rand(3), list("abc"), ["x"], "t")]),
        ValueError,
        "maps[0]",
    ),
    (
        "cross_attention_maps labels",
        lambda t: P.cross_attention_maps([(weights(2, 3), list("ab"), ["x", "y"], "t")]),
        ValueError,
        ("maps[0]", "source_labels"),
    ),
    (
        "cross_attention_maps generator",
        lambda t: P.cross_attention_maps(m for m in [(weights(2, 3), list("abc"), ["x", "y"], "t")]),
        TypeError,
        "maps",
    ),
    ("training_curves ragged", lambda t: P.training_curves(history(loss=[2.0, 1.0])), ValueError, "histories"),
    (
        "recipe_curves ragged",
        lambda t: P.recipe_curves({"a": text_history(val_loss=[2.3])}, {"a": 64}),
        ValueError,
        "histories['a']",
    ),
    (
        "statistics_sensitivity a list",
        lambda t: P.statistics_sensitivity([([1, 2], [0.1, 0.2])], {"a": ([0.1], [0.2])}),
        TypeError,
        "by_batch_size",
    ),
    (
        "statistics_sensitivity ragged",
        lambda t: P.statistics_sensitivity({"a": ([1, 2], [0.1])}, {"a": ([0.1], [0.2])}),
        ValueError,
        "by_batch_size['a']",
    ),
    ("layer_norm_error a list", lambda t: P.layer_norm_error_vs_width([8, 16], [1e-7, 1e-7]), TypeError, "errors"),
    (
        "layer_norm_error lengths",
        lambda t: P.layer_norm_error_vs_width([8, 16, 32], {"ours": [1e-7, 1e-7]}),
        ValueError,
        "errors['ours']",
    ),
    ("gradient_norms_per_layer {}", lambda t: P.gradient_norms_per_layer({}), ValueError, "series"),
    ("norm_placement losses list", lambda t: P.norm_placement_training([[1.0]], {"a": [1.0]}), TypeError, "losses"),
    ("norm_placement empty run", lambda t: P.norm_placement_training({"a": []}, {"a": [1.0]}), ValueError, "losses"),
    (
        "norm_placement smooth 2.5",
        lambda t: P.norm_placement_training({"a": [1.0, 0.5]}, {"a": [1.0]}, smooth=2.5),
        ValueError,
        "smooth",
    ),
    (
        "norm_placement smooth '5'",
        lambda t: P.norm_placement_training({"a": [1.0, 0.5]}, {"a": [1.0]}, smooth="5"),
        ValueError,
        "smooth",
    ),
    ("seeds chance '2.3'", lambda t: P.norm_placement_seeds({"a": [[1.0, 0.5]]}, chance="2.3"), TypeError, "chance"),
    ("seeds warmup 1.5", lambda t: P.norm_placement_seeds({"a": [[1.0, 0.5]]}, warmup_steps=1.5), TypeError, "warmup"),
    ("encoding_curves dimensions 3", lambda t: P.encoding_curves(table(), dimensions=3), TypeError, "dimensions"),
    (
        "position_similarity positions 3",
        lambda t: P.position_similarity_curves(table(), positions=3),
        TypeError,
        "positions",
    ),
    (
        "position_similarity max_offset 3.0",
        lambda t: P.position_similarity_curves(table(), positions=(0, 1), max_offset=3.0),
        TypeError,
        "max_offset",
    ),
    ("rotation_pairs zoom '0.2'", lambda t: P.rotation_pairs(table(), 2, 3, zoom_below="0.2"), TypeError, "zoom"),
    ("rotation_pairs offset 1.5", lambda t: P.rotation_pairs(table(), 2, 1.5), TypeError, "offset"),
    ("rotation_pairs pairs 0", lambda t: P.rotation_pairs(table(), 2, 1, pairs=0), TypeError, "pairs"),
    ("encoding_heatmap empty", lambda t: P.encoding_heatmap(torch.zeros(0, 4)), ValueError, "pe"),
    (
        "encoding_overview fig an Axes",
        lambda t: P.encoding_overview(table(), 1, 1, fig=P.new_figure()[1][0, 0]),
        TypeError,
        "fig",
    ),
    ("label_smoothing target 2.0", lambda t: P.label_smoothing_plot(list("abcde"), 2.0), TypeError, "target"),
    ("label_smoothing two labels", lambda t: P.label_smoothing_plot(["<pad>", "a"], 1), ValueError, "labels"),
    ("label_smoothing pad_id 9", lambda t: P.label_smoothing_plot(list("abcde"), 2, pad_id=9), ValueError, "pad_id"),
    ("activation x_range strings", lambda t: P.activation_functions(x_range=("a", "b")), ValueError, "x_range"),
    ("activation x_range NaN", lambda t: P.activation_functions(x_range=(NAN, 1.0)), ValueError, "x_range"),
    ("axes cube features 0", lambda t: P.normalization_axes_cube(features=0), ValueError, "features"),
    ("axes unfolded features -2", lambda t: P.normalization_axes_unfolded(features=-2), ValueError, "features"),
    ("new_figure n_rows 0", lambda t: P.new_figure(0, 2), ValueError, "n_rows"),
    ("new_figure n_cols 1.5", lambda t: P.new_figure(1, 1.5), TypeError, "n_cols"),
    (
        "recipe_curves target '1.9'",
        lambda t: P.recipe_curves({"a": text_history()}, {"a": 64}, target="1.9"),
        TypeError,
        "target",
    ),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(PLOT_SHAPES))
def test_plots_refuse_ranks_empty_and_ragged_inputs(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 3. statistics over nothing

NONE_REAL = torch.zeros(2, 3, dtype=torch.bool)

STATISTICS: list[Case] = [
    ("batch_norm_statistics all masked", lambda t: tl.batch_norm_statistics(x(2, 3, 4), NONE_REAL), ValueError, "mask"),
    (
        "normalization_statistics all masked",
        lambda t: P.normalization_statistics(x(2, 3, 4), NONE_REAL),
        ValueError,
        "mask",
    ),
    (
        "batch_size_sweep first sequence padding",
        lambda t: tl_norm.batch_size_sweep(x(2, 3, 4), torch.tensor([[False] * 3, [True] * 3]), [1, 2]),
        ValueError,
        "mask",
    ),
    ("BatchNorm training all masked", lambda t: tl.BatchNorm(4)(x(2, 3, 4), NONE_REAL), ValueError, "mask"),
    ("batch_norm_statistics (0, T, D)", lambda t: tl.batch_norm_statistics(torch.zeros(0, 3, 4)), ValueError, "x"),
    ("batch_norm_statistics (B, 0, D)", lambda t: tl.batch_norm_statistics(torch.zeros(2, 0, 4)), ValueError, "x"),
    ("layer_norm_statistics D = 0", lambda t: tl.layer_norm_statistics(torch.zeros(2, 3, 0)), ValueError, "x"),
    (
        "batch_norm_explorer mask on meta",
        lambda t: W.batch_norm_explorer(x(3, 4, 4), torch.ones(3, 4, dtype=torch.bool, device=META)),
        ValueError,
        "mask",
    ),
    (
        "batch_norm_explorer x on meta",
        lambda t: W.batch_norm_explorer(x(3, 4, 4).to(META), torch.ones(3, 4, dtype=torch.bool)),
        ValueError,
        "x",
    ),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(STATISTICS))
def test_statistics_refuse_to_average_nothing(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 4. positions that are not whole numbers


def learned() -> tl_emb.LearnedPositionalEmbedding:
    return tl_emb.LearnedPositionalEmbedding(10, 4)


POSITIONS: list[Case] = [
    ("learned start 1.0", lambda t: learned()(x(1, 3, 4), start=1.0), TypeError, "start"),
    ("learned start 0.5", lambda t: learned()(x(1, 3, 4), start=0.5), TypeError, "start"),
    ("learned start True", lambda t: learned()(x(1, 3, 4), start=True), TypeError, "start"),
    ("learned start '2'", lambda t: learned()(x(1, 3, 4), start="2"), TypeError, "start"),
    ("learned start None", lambda t: learned()(x(1, 3, 4), start=None), TypeError, "start"),
    ("learned start float tensor", lambda t: learned()(x(1, 3, 4), start=torch.tensor(1.0)), TypeError, "start"),
    ("learned x on meta", lambda t: learned()(x(1, 3, 4).to(META)), ValueError, "x"),
    (
        "sinusoidal start np.float64",
        lambda t: tl.PositionalEncoding(4)(x(1, 3, 4), start=np.float64(1)),
        TypeError,
        "start",
    ),
    ("rotation_matrix dtype 'float64'", lambda t: tl_emb.rotation_matrix(4, 1, dtype="float64"), TypeError, "dtype"),
    ("rotation_matrix dtype int64", lambda t: tl_emb.rotation_matrix(4, 1, dtype=torch.int64), TypeError, "dtype"),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(POSITIONS))
def test_positions_must_be_whole_numbers(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 5. files that are not checkpoints


def _half_checkpoint(tmp: Path) -> Path:
    data = torch.load(checkpoint(tmp), weights_only=True)
    data["state_dict"] = {k: v.half() if v.is_floating_point() else v for k, v in data["state_dict"].items()}
    torch.save(data, tmp / "half.pt")
    return tmp / "half.pt"


CHECKPOINTS: list[Case] = [
    *[
        (f"load_checkpoint random bytes {s}", lambda t, s=s: tl.load_checkpoint(write(t, junk(s))), ValueError, "path")
        for s in range(6)
    ],
    *[
        (f"load_gpt random bytes {s}", lambda t, s=s: tl_train.load_gpt(write(t, junk(s))), ValueError, "path")
        for s in range(6)
    ],
    *[
        (
            f"load_gpt pickle header + bytes {s}",
            lambda t, s=s: tl_train.load_gpt(write(t, junk(s, b"\x80\x04"))),
            ValueError,
            ("path", "corrupt"),
        )
        for s in range(3)
    ],
    ("load_checkpoint text", lambda t: tl.load_checkpoint(write(t, b"hello, world\n" * 10)), ValueError, "path"),
    (
        "load_gpt zip of junk",
        lambda t: tl_train.load_gpt(write(t, zipped({"a/data.pkl": b"junk"}))),
        ValueError,
        "path",
    ),
    ("load_gpt empty file", lambda t: tl_train.load_gpt(write(t, b"")), ValueError, "path"),
    (
        "load_gpt truncated",
        lambda t: tl_train.load_gpt(write(t, gpt_checkpoint(t).read_bytes()[:1500], "cut.pt")),
        ValueError,
        "path",
    ),
    ("load_gpt a folder", lambda t: tl_train.load_gpt(t), ValueError, ("path", "folder")),
    ("load_checkpoint a folder", lambda t: tl.load_checkpoint(t), ValueError, ("path", "folder")),
    ("load_gpt pickled list", lambda t: tl_train.load_gpt(write(t, pickle.dumps([1, 2]))), ValueError, "path"),
    (
        "load_gpt a pickled model",
        lambda t: tl_train.load_gpt(_pickled_model(t)),
        ValueError,
        ("path", "Python objects"),
    ),
    (
        "load_checkpoint cuda",
        lambda t: tl.load_checkpoint(checkpoint(t), "cuda"),
        ValueError,
        "map_location",
        NO_CUDA,
    ),
    ("load_gpt cuda", lambda t: tl_train.load_gpt(gpt_checkpoint(t), "cuda"), ValueError, "map_location", NO_CUDA),
    (
        "load_trained task option",
        lambda t: tl_cli.load_trained(
            checkpoint(t, tokenizer=tl_data.CharTokenizer().to_dict(), task={"name": "copy", "lenght": 3})
        ),
        ValueError,
        ("path", "lenght"),
    ),
]


def _pickled_model(tmp: Path) -> Path:
    torch.save(nn.Linear(2, 2), tmp / "model.pt")
    return tmp / "model.pt"


@pytest.mark.parametrize(("call", "error", "names"), cases(CHECKPOINTS))
def test_unreadable_files_are_refused_with_the_path(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 6. exercise checks given a class


def report(exercise: str, candidate: object) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        all_exercises()[exercise].check(candidate)  # type: ignore[arg-type]
    return out.getvalue()


CLASSES = [
    ("ch01_attention.softmax_rows", type("softmax_rows", (), {"__init__": lambda self, x: None})),
    ("ch01_attention.softmax_rows", nn.Softmax),
    ("ch02_masking.masked_softmax", type("masked_softmax", (), {"__init__": lambda self, *a: None})),
    ("ch04_normalization.layer_norm", tl.LayerNorm),
    ("ch09_full_model.label_smoothed_loss", nn.CrossEntropyLoss),
]


@pytest.mark.parametrize(("exercise", "candidate"), CLASSES, ids=[f"{e} {c.__name__}" for e, c in CLASSES])
def test_a_check_given_a_class_says_so_once(exercise: str, candidate: type) -> None:
    text = report(exercise, candidate)
    name = exercise.split(".")[1]
    assert f"got the class {candidate.__name__}" in text and f"def {name}(" in text, text
    assert text.count("  ✗ ") == 1  # one line, not one per case
    with pytest.raises(AssertionError, match="got the class"):
        all_exercises()[exercise].grade(candidate)


def test_a_class_that_builds_the_answer_is_not_refused() -> None:
    reference = all_exercises()["ch01_attention.softmax_rows"].reference_copy()

    class softmax_rows(torch.Tensor):  # noqa: N801 - calling it returns the right tensor
        def __new__(cls, scores: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
            return reference(scores)

    assert "class" not in report("ch01_attention.softmax_rows", softmax_rows)


# ------------------------------------------------------------------ 7. empty sequences, used-up generators

EMPTY: list[Case] = [
    (
        "make_batch empty sources",
        lambda t: tl_data.make_batch([("", "a"), ("", "b")], tl_data.CharTokenizer()),
        ValueError,
        "examples[0]",
    ),
    (
        "make_batch one empty source",
        lambda t: tl_data.make_batch([("ab", "a"), ("", "b")], tl_data.CharTokenizer()),
        ValueError,
        "examples[1]",
    ),
    ("mask_explorer generator", lambda t: W.mask_explorer(s for s in ["a b", "c"]), TypeError, "sentences"),
    ("word_vectors generator", lambda t: W.word_vectors(w for w in ["a", "b"]), TypeError, "tokens"),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(EMPTY))
def test_empty_inputs_are_refused_where_nothing_can_come_of_them(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 8. tasks: unknown options, odd arguments

mt = tl_data.make_task

TASKS: list[Case] = [
    ("make_task copy lenght", lambda t: mt("copy", lenght=5), TypeError, ("lenght", "max_len")),
    ("make_task dates format", lambda t: mt("dates", format=["chinese"]), TypeError, ("'format'", "formats")),
    ("make_task reverse maxlen", lambda t: mt("reverse", maxlen=4), TypeError, ("maxlen", "max_len")),
    ("make_task dict bogus", lambda t: mt({"name": "copy", "bogus": 1}), TypeError, ("bogus", "min_len")),
    ("make_task dates seed", lambda t: mt("dates", seed=1), TypeError, ("seed", "first_year")),
    ("make_task dict and options", lambda t: mt({"name": "copy"}, max_len=3), TypeError, "options"),
    ("make_task dict name 3", lambda t: mt({"name": 3}), TypeError, "name"),
    ("copy alphabet 5", lambda t: mt("copy", alphabet=5), TypeError, "alphabet"),
    ("format_date of a string", lambda t: tl_data.format_date("2026-11-21", "chinese"), TypeError, "day"),
    ("split_of None", lambda t: tl_data.split_of(None), TypeError, "key"),
    ("split_of True", lambda t: tl_data.split_of(True), TypeError, "key"),
    ("split_of fractions over 1", lambda t: tl_data.split_of("abc", (0.7, 0.6)), ValueError, "fractions"),
    ("split_of negative fraction", lambda t: tl_data.split_of("abc", (-0.1, 0.1)), ValueError, "fractions"),
    ("split_of one fraction", lambda t: tl_data.split_of("abc", 0.1), TypeError, "fractions"),
    ("encode add_bos 'yes'", lambda t: tl_data.CharTokenizer().encode("ab", add_bos="yes"), TypeError, "add_bos"),
    ("encode add_eos 1", lambda t: tl_data.CharTokenizer().encode("ab", add_eos=1), TypeError, "add_eos"),
    ("decode stop_at_eos 'no'", lambda t: tl_data.CharTokenizer().decode([4, 2], stop_at_eos="no"), TypeError, "stop"),
    (
        "random_windows generator 0",
        lambda t: tl_data.random_windows(stream(), 4, 2, generator=0),
        TypeError,
        "generator",
    ),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(TASKS))
def test_tasks_and_tokenizers_refuse_unknown_options(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------ 9. devices that are not there, tensors without values

DEVICES: list[Case] = [
    ("causal_mask cuda", lambda t: tl.causal_mask(3, device="cuda"), ValueError, "device", NO_CUDA),
    (
        "make_batch cuda",
        lambda t: tl_data.make_batch([("ab", "c")], tl_data.CharTokenizer(), "cuda"),
        ValueError,
        "device",
        NO_CUDA,
    ),
    (
        "build_model cuda:1",
        lambda t: tl_train.build_model(model().config, device="cuda:1"),
        ValueError,
        "device",
        NO_CUDA,
    ),
    (
        "train cuda",
        lambda t: tl_train.train(char_model(), mt("copy"), tl_data.CharTokenizer(), steps=1, device="cuda"),
        ValueError,
        "device",
        NO_CUDA,
    ),
    (
        "train_gpt cuda",
        lambda t: tl_train.train_gpt(gpt(), stream(), steps=1, warmup=0, device="cuda", progress=False),
        ValueError,
        "device",
        NO_CUDA,
    ),
    (
        "train_gpt data on meta",
        lambda t: tl_train.train_gpt(gpt(), stream().to(META), steps=1, warmup=0, progress=False),
        ValueError,
        ("train_data", "meta"),
    ),
    ("evaluate_text data on meta", lambda t: tl_train.evaluate_text(gpt(), stream().to(META)), ValueError, "data"),
    (
        "smoothed_targets target on meta",
        lambda t: tl_train.smoothed_targets(tok(2, 3).to(META), V, 0, 0.1),
        ValueError,
        "target",
    ),
    ("noam_lr step on meta", lambda t: tl_train.noam_lr(torch.arange(1, 4, device=META), 8), ValueError, "step"),
    ("token_starts data on meta", lambda t: tl_data.token_starts(stream().to(META), 0, 4), ValueError, "data"),
    ("random_windows data on meta", lambda t: tl_data.random_windows(stream().to(META), 4, 2), ValueError, "data"),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(DEVICES))
def test_devices_that_are_not_there_are_named(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 10. training and diagnostics arguments

TRAINING: list[Case] = [
    (
        "train tokenizer larger than the vocabulary",
        lambda t: tl_train.train(model(), mt("copy"), tl_data.CharTokenizer(), steps=1, progress=False),
        ValueError,
        "tokenizer",
    ),
    (
        "label_smoothed_loss V = 2",
        lambda t: tl_train.label_smoothed_loss(x(2, 3, 2), torch.ones(2, 3, dtype=torch.long), 0),
        ValueError,
        "logits",
    ),
    (
        "time_to_loss '1.5'",
        lambda t: tl_train.TextHistory(val_loss=[2.0], eval_seconds=[1.0]).time_to_loss("1.5"),
        TypeError,
        "target",
    ),
    (
        "time_to_loss NaN",
        lambda t: tl_train.TextHistory(val_loss=[2.0], eval_seconds=[1.0]).time_to_loss(NAN),
        ValueError,
        "target",
    ),
    (
        "sdpa d_k = 0",
        lambda t: tl.scaled_dot_product_attention(torch.zeros(1, 2, 0), torch.zeros(1, 3, 0), x(1, 3, 4)),
        ValueError,
        "query",
    ),
    ("gradient_norms None", lambda t: tl_diag.gradient_norms(None), TypeError, "modules"),
    ("deep stack residual 'yes'", lambda t: tl_diag.deep_stack_gradient_norms(2, "yes"), TypeError, "residual"),
    ("deep stack seed -1", lambda t: tl_diag.deep_stack_gradient_norms(2, True, seed=-1), ValueError, "seed"),
    ("deep stack seed 1.5", lambda t: tl_diag.deep_stack_gradient_norms(2, True, seed=1.5), TypeError, "seed"),
    ("FeedForwardStack residual 'no'", lambda t: tl_diag.FeedForwardStack(4, 8, 2, "no"), TypeError, "residual"),
    ("norm placement lr NaN", lambda t: tl_diag.train_norm_placement(True, NAN, steps=1), ValueError, "lr"),
    ("norm placement lr True", lambda t: tl_diag.train_norm_placement(True, True, steps=1), TypeError, "lr"),
    ("norm placement lr inf", lambda t: tl_diag.train_norm_placement(True, INF, steps=1), ValueError, "lr"),
    ("norm placement norm_first 1", lambda t: tl_diag.train_norm_placement(1, 1e-3, steps=1), TypeError, "norm_first"),
    (
        "norm placement batch_size 0",
        lambda t: tl_diag.train_norm_placement(True, 1e-3, steps=1, batch_size=0),
        ValueError,
        "batch_size",
    ),
    (
        "norm placement length 0",
        lambda t: tl_diag.train_norm_placement(True, 1e-3, steps=1, length=0),
        ValueError,
        "length",
    ),
    (
        "norm placement seed '0'",
        lambda t: tl_diag.train_norm_placement(True, 1e-3, steps=1, seed="0"),
        TypeError,
        "seed",
    ),
    (
        "reverse batch_size -1",
        lambda t: tl_diag.reverse_task_batch(-1, 3, 5, torch.Generator()),
        ValueError,
        "batch_size",
    ),
    (
        "reverse vocab_size 0",
        lambda t: tl_diag.reverse_task_batch(2, 3, 0, torch.Generator()),
        ValueError,
        "vocab_size",
    ),
    ("reverse generator 0", lambda t: tl_diag.reverse_task_batch(2, 3, 5, 0), TypeError, "generator"),
    (
        "compare arm lr NaN",
        lambda t: tl_diag.compare_norm_placement({"a": {"norm_first": True, "lr": NAN}}, seeds=[0], steps=1),
        ValueError,
        "lr",
    ),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(TRAINING))
def test_training_and_diagnostics_arguments(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ 11. the command line: a message, never a traceback


def cli(*argv: str) -> int:
    return tl_cli.main(list(argv))


CLI: list[Case] = [
    ("evaluate random bytes", lambda t: cli("evaluate", str(write(t, junk(3)))), SystemExit, ("checkpoint", "path")),
    ("evaluate a missing file", lambda t: cli("evaluate", str(t / "none.pt")), SystemExit, ("checkpoint", "none.pt")),
    ("evaluate a folder", lambda t: cli("evaluate", str(t)), SystemExit, ("checkpoint", "folder")),
    ("evaluate a GPT checkpoint", lambda t: cli("evaluate", str(gpt_checkpoint(t))), SystemExit, ("checkpoint", "GPT")),
]


@pytest.mark.parametrize(("call", "error", "names"), cases(CLI))
def test_the_command_line_answers_with_a_message(call, error, names, tmp_path: Path) -> None:  # noqa: ANN001
    run_case(call, error, names, tmp_path)


# ------------------------------------------------------------------ right answers for inputs that are fine after all


def _decoded_empty() -> bool:
    empty = torch.tensor([])  # float32, as torch.tensor([]) is
    return TEXT_TOK.decode(empty) == "" and tl_data.CharTokenizer().decode(empty) == ""


def _same_positions(table: tl_emb.LearnedPositionalEmbedding) -> bool:
    zeros = torch.zeros(1, 2, 4)
    return torch.equal(table(zeros, start=torch.tensor(3)), table(zeros, start=3))


RIGHT_ANSWERS: dict[str, Callable[[Path], bool]] = {
    "decode of torch.tensor([]) is ''": lambda t: _decoded_empty(),
    "labels of torch.tensor([]) is []": lambda t: tl_data.CharTokenizer().labels(torch.tensor([])) == [],
    "PositionalEncoding start np.int64": lambda t: torch.allclose(
        tl.PositionalEncoding(4)(torch.zeros(1, 2, 4), start=np.int64(1))[0], tl.sinusoidal_encoding(3, 4)[1:]
    ),
    "PositionalEncoding start a 0-d long tensor": lambda t: torch.allclose(
        tl.PositionalEncoding(4)(torch.zeros(1, 2, 4), start=torch.tensor(1))[0], tl.sinusoidal_encoding(3, 4)[1:]
    ),
    "learned positions start a 0-d long tensor": lambda t: _same_positions(learned()),
    "learned positions float64 input": lambda t: (
        learned()(torch.zeros(1, 2, 4, dtype=torch.float64)).dtype == torch.float64
    ),
    "sdpa with no keys: zeros": lambda t: bool(
        (tl.scaled_dot_product_attention(x(1, 2, 4), torch.zeros(1, 0, 4), torch.zeros(1, 0, 5))[0] == 0).all()
    ),
    "BatchNorm eval, every position masked: running statistics": lambda t: bool(
        torch.isfinite(tl.BatchNorm(4).eval()(x(2, 3, 4), NONE_REAL)).all()
    ),
    "normalization_statistics, one row all padding": lambda t: isinstance(
        P.normalization_statistics(x(2, 3, 4), torch.tensor([[True, True, True], [False, False, False]])),
        matplotlib.figure.Figure,
    ),
    "load_checkpoint of float16 weights": lambda t: (
        next(tl.load_checkpoint(_half_checkpoint(t)).parameters()).dtype == torch.float32
    ),
    "sampling_filters labels as one string": lambda t: isinstance(
        P.sampling_filters({"T=1": torch.tensor([0.5, 0.25, 0.25])}, "abc"), matplotlib.figure.Figure
    ),
    "cross_attention_maps labels None": lambda t: isinstance(
        P.cross_attention_maps([(weights(2, 3), None, None, "t")]), matplotlib.figure.Figure
    ),
    "attention_heatmap float16 weights": lambda t: isinstance(
        hm(torch.softmax(x(3, 4), -1).half()), matplotlib.figure.Figure
    ),
    "rotation_pairs a negative offset": lambda t: isinstance(
        P.rotation_pairs(table(), 5, -2), matplotlib.figure.Figure
    ),
    "make_task from a dict": lambda t: mt(mt("copy", max_len=3).to_dict()).max_len == 3,
    "make_task('copy', alphabet=list)": lambda t: len(mt("copy", alphabet=list("ab")).examples("train", 2)) == 2,
    "an empty batch encodes to an empty result": lambda t: (
        tuple(model().encode(torch.zeros(0, 3, dtype=torch.long)).shape) == (0, 3, D)
    ),
}


@pytest.mark.parametrize("name", list(RIGHT_ANSWERS))
def test_legitimate_inputs_get_a_right_answer(name: str, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    try:
        assert RIGHT_ANSWERS[name](tmp_path)
    finally:
        plt.close("all")


def test_every_kind_has_cases() -> None:
    tables = (PLOT_VALUES, PLOT_SHAPES, STATISTICS, POSITIONS, CHECKPOINTS, EMPTY, TASKS, DEVICES, TRAINING, CLI)
    assert all(len(t) >= 4 for t in tables)
    assert sum(map(len, tables)) + len(CLASSES) + len(RIGHT_ANSWERS) >= 150
