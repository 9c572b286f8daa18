"""Tests of the command-line entry point (transformer_lab.cli)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_lab as tl
from transformer_lab import cli, training

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--batch-size", "8"]


def test_train_writes_a_checkpoint_that_reloads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "copy.pt"
    argv = ["train", "--task", "copy", "--steps", "6", "--eval-every", "3", "--test-per-format", "2", "--no-progress"]
    assert cli.main([*argv, *TINY, "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exact match" in printed and str(out) in printed
    raw = torch.load(out, weights_only=True)  # plain data only
    assert raw["task"]["name"] == "copy" and raw["options"]["steps"] == 6
    assert len(raw["history"]["loss"]) == 6 and raw["history"]["eval_step"] == [3, 6]
    model, tokenizer, task = cli.load_trained(out)
    assert isinstance(model, tl.Transformer) and model.config.d_model == 16 and not model.training
    assert tokenizer.vocab_size == model.config.src_vocab_size and task.name == "copy"
    # the same seed gives the same weights
    out2 = tmp_path / "copy2.pt"
    cli.main([*argv, *TINY, "--seed", "1", "--out", str(out2)])
    capsys.readouterr()
    again = torch.load(out2, weights_only=True)["state_dict"]
    assert all(torch.equal(raw["state_dict"][k], again[k]) for k in again)
    assert cli.main(["evaluate", str(out), "--test-per-format", "2"]) == 0
    assert "exact match" in capsys.readouterr().out


def test_bad_arguments_exit_with_a_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--task", "sort", "--out", str(tmp_path / "x.pt")])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="threads"):
        cli.main(["train", "--threads", "0", "--out", str(tmp_path / "x.pt")])


def test_help_in_a_subprocess() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "transformer_lab.cli", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout and "evaluate" in result.stdout


def test_the_shipped_checkpoint_is_the_documented_run_and_normalises_dates() -> None:
    model, tokenizer, task = cli.load_shipped()
    options = torch.load(cli.SHIPPED_CHECKPOINT, weights_only=True)["options"]
    assert options["seed"] == 0 and options["task"] == "dates"
    assert {k: options[k] for k in cli.DEFAULTS} == cli.DEFAULTS  # trained with the command's defaults
    assert "train --task dates --seed 0 --out" in cli.SHIPPED_COMMAND
    test = task.examples_per_format("test", 40, seed=7)
    counts = training.exact_match_by_kind(model, test, tokenizer)
    assert counts["all"][0] >= 0.98 * counts["all"][1], counts
