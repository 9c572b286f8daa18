"""Tests of the command line's chapter 10 commands: gpt-train and gpt-sample (tiny models, few steps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lab import cli, training

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16", "--batch-size", "4"]
SHORT = ["--steps", "6", "--warmup", "2", "--eval-every", "3", "--no-progress"]


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "verse.txt"
    path.write_text("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 10, "utf-8")
    return path


def test_gpt_train_writes_a_checkpoint_that_samples(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "verse.pt"
    assert cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "validation loss" in printed and str(out) in printed
    raw = torch.load(out, weights_only=True)  # plain data only
    assert raw["kind"] == "gpt" and raw["options"]["steps"] == 6 and raw["history"]["eval_step"] == [3, 6]
    model, tokenizer = training.load_gpt(out)
    assert model.config.d_model == 16 and model.config.block_size == 16 and set(tokenizer.chars) >= set("Shall")
    # the same seed gives the same weights
    out2 = tmp_path / "again.pt"
    cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--seed", "1", "--out", str(out2)])
    capsys.readouterr()
    again = torch.load(out2, weights_only=True)["state_dict"]
    assert all(torch.equal(raw["state_dict"][k], again[k]) for k in again)

    sample = ["gpt-sample", str(out), "--prompt", "Thou", "--length", "30", "--seed", "3", "--num-samples", "2"]
    assert cli.main([*sample, "--top-k", "5", "--top-p", "0.9", "--temperature", "0.8"]) == 0
    first = capsys.readouterr().out
    assert first.count("--- sample") == 2 and first.count("\nThou") == 2
    cli.main([*sample, "--top-k", "5", "--top-p", "0.9", "--temperature", "0.8"])
    assert capsys.readouterr().out == first  # same seed, same samples
    assert cli.main(["gpt-sample", str(out), "--prompt", "Thou", "--length", "12", "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out.rstrip("\n")
    assert greedy.startswith("Thou") and len(greedy) == 4 + 12


def test_gpt_train_half_checkpoint(tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "half.pt"
    cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--half", "--clip-norm", "0", "--out", str(out)])
    assert torch.load(out, weights_only=True)["state_dict"]["norm.weight"].dtype == torch.float16
    model, _ = training.load_gpt(out)
    assert model.norm.weight.dtype == torch.float32


def test_gpt_train_checks_the_out_folder_before_training(
    tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started although --out cannot be written")

    monkeypatch.setattr(cli, "train_gpt", never)
    with pytest.raises(SystemExit, match="does not exist"):
        cli.main(["gpt-train", "--text", str(text_file), "--out", str(tmp_path / "missing" / "x.pt")])
    with pytest.raises(SystemExit, match="is a folder"):
        cli.main(["gpt-train", "--text", str(text_file), "--out", str(tmp_path)])


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--steps", "0"], "--steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--d-model", "15"], "divisible"),
        (["--dropout", "1.5"], "--dropout"),
        (["--lr", "-1"], "--lr"),
        (["--min-lr", "1"], "--min-lr"),
        (["--warmup", "-1"], "--warmup"),
        (["--warmup", "10", "--steps", "5"], "--decay-steps"),
        (["--weight-decay", "-1"], "--weight-decay"),
        (["--beta2", "1"], "--beta2"),
        (["--clip-norm", "-1"], "--clip-norm"),
        (["--train-fraction", "1"], "--train-fraction"),
        (["--seed", "-1"], "--seed"),
        (["--threads", "0"], "--threads"),
        (["--device", "gpu"], "not a device"),
        (["--block-size", "4000"], "fewer than --block-size"),
    ],
)
def test_gpt_train_refuses_bad_options(extra: list[str], match: str, tmp_path: Path, text_file: Path) -> None:
    with pytest.raises(SystemExit, match=match):
        cli.main(["gpt-train", "--text", str(text_file), *extra, "--out", str(tmp_path / "x.pt")])


def test_gpt_train_refuses_bad_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(["gpt-train", "--text", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x.pt")])
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8 \xc3")
    with pytest.raises(SystemExit, match="UTF-8"):
        cli.main(["gpt-train", "--text", str(binary), "--out", str(tmp_path / "x.pt")])
    with pytest.raises(SystemExit):
        cli.main(["gpt-train", "--corpus", "tang", "--text", str(binary), "--out", str(tmp_path / "x.pt")])
    assert "not allowed with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["gpt-train", "--corpus", "homer", "--out", str(tmp_path / "x.pt")])
    assert "invalid choice" in capsys.readouterr().err


def test_gpt_sample_refuses_bad_options(tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "verse.pt"
    cli.main(
        [
            "gpt-train",
            "--text",
            str(text_file),
            *TINY,
            "--steps",
            "1",
            "--warmup",
            "0",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    capsys.readouterr()
    for extra, match in [
        (["--length", "-1"], "--length"),
        (["--num-samples", "0"], "--num-samples"),
        (["--temperature", "-0.5"], "--temperature"),
        (["--top-k", "0"], "--top-k"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--seed", "-2"], "--seed"),
        (["--threads", "0"], "--threads"),
        (["--prompt", ""], "must not be empty"),
        (["--prompt", "Zebra#"], "never saw"),
    ]:
        with pytest.raises(SystemExit, match=match):
            cli.main(["gpt-sample", str(out), *extra])
    with pytest.raises(SystemExit, match="no GPT checkpoint"):
        cli.main(["gpt-sample", str(tmp_path / "missing.pt")])
    with pytest.raises(SystemExit, match="not a GPT checkpoint"):
        cli.main(["gpt-sample", str(cli.SHIPPED_CHECKPOINT)])


def test_gpt_commands_in_the_help() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for argv in (["--help"], ["gpt-train", "--help"], ["gpt-sample", "--help"]):
        result = subprocess.run(
            [sys.executable, "-m", "transformer_lab.cli", *argv], capture_output=True, text=True, env=env, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert "gpt-train" in result.stdout or "--top-p" in result.stdout or "--corpus" in result.stdout


def test_gpt_train_goes_on_from_a_checkpoint(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--init continues from a checkpoint's weights: the same as training that model further with train_gpt;
    a checkpoint of another text or block size is refused before training."""
    first = tmp_path / "first.pt"
    cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--seed", "1", "--out", str(first)])
    more = tmp_path / "more.pt"
    assert (
        cli.main(["gpt-train", "--text", str(text_file), "--init", str(first), *TINY, *SHORT, "--out", str(more)]) == 0
    )
    model, tokenizer = training.load_gpt(first)
    from transformer_lab.data import split_text

    train_data, val_data = split_text(tokenizer.encode(text_file.read_text("utf-8")))
    torch.manual_seed(0)
    model.train()
    training.train_gpt(
        model,
        train_data,
        val_data,
        steps=6,
        batch_size=4,
        block=16,
        lr=1e-3,
        min_lr=1e-4,
        warmup=2,
        eval_every=3,
        seed=0,
        progress=False,
    )
    continued, _ = training.load_gpt(more)
    for (name, a), b in zip(model.state_dict().items(), continued.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    assert torch.load(more, weights_only=True)["options"]["init"] == str(first)
    other = tmp_path / "other.txt"
    other.write_text("xyz " * 200, "utf-8")
    with pytest.raises(SystemExit, match="its characters are not those of this text"):
        cli.main(["gpt-train", "--text", str(other), "--init", str(first), *TINY, *SHORT, "--out", str(more)])
    with pytest.raises(SystemExit, match="pass --block-size 16"):
        cli.main(
            [
                "gpt-train",
                "--text",
                str(text_file),
                "--init",
                str(first),
                *TINY[:-4],
                "--block-size",
                "8",
                "--batch-size",
                "4",
                *SHORT,
                "--out",
                str(more),
            ]
        )


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_gpt_train_can_begin_windows_at_newlines(
    share: float, tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--newline-share S trains as train_gpt does with starts = token_starts(training split, newline, S)."""
    out = tmp_path / "lines.pt"
    args = ["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--newline-share", str(share), "--out", str(out)]
    assert cli.main(args) == 0
    assert torch.load(out, weights_only=True)["options"]["newline_share"] == share
    _, tokenizer = training.load_gpt(out)
    from transformer_lab.data import split_text, token_starts
    from transformer_lab.gpt import GPT, GPTConfig

    train_data, val_data = split_text(tokenizer.encode(text_file.read_text("utf-8")))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=1))
    starts = token_starts(train_data, tokenizer.encode("\n").item(), 16, share)
    settings = dict(steps=6, batch_size=4, block=16, lr=1e-3, min_lr=1e-4, warmup=2, eval_every=3, seed=0)
    training.train_gpt(model, train_data, val_data, starts=starts, progress=False, **settings)
    trained, _ = training.load_gpt(out)
    for (name, a), b in zip(model.state_dict().items(), trained.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    plain = tmp_path / "plain.pt"
    cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--out", str(plain)])
    assert not torch.equal(training.load_gpt(plain)[0].lm_head.weight, trained.lm_head.weight)  # other batches
    one_line = tmp_path / "one_line.txt"
    one_line.write_text("no newline in this text at all, " * 20, "utf-8")
    with pytest.raises(SystemExit, match="--newline-share: .* has no newline"):
        cli.main(["gpt-train", "--text", str(one_line), *TINY, *SHORT, "--newline-share", "0.5", "--out", str(out)])
    with pytest.raises(SystemExit, match=r"--newline-share must be in \[0, 1\]"):
        cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, "--newline-share", "1.5", "--out", str(out)])
