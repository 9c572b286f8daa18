"""Train a toy task from the command line and write a checkpoint (chapter 09).

    python -m transformer_lab.cli train --task dates --seed 0 --out dates.pt
    python -m transformer_lab.cli train --task copy --steps 300 --device cuda --out copy.pt
    python -m transformer_lab.cli evaluate dates.pt

The checkpoint holds the model (`tl.save_checkpoint`: config and state dict) plus plain data
(the tokenizer's characters, the task's settings, the training options and history), so
`torch.load(path, weights_only=True)` reads it and `load_trained(path)` rebuilds everything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_lab.data import CharTokenizer, DateTask, Task, make_task
from transformer_lab.model import Transformer, TransformerConfig, load_checkpoint, save_checkpoint
from transformer_lab.training import build_model, exact_match_by_kind, train

__all__ = ["main", "build_parser", "load_trained", "load_shipped", "DEFAULTS", "SHIPPED_CHECKPOINT", "SHIPPED_COMMAND"]

#: The recipe of chapter 09 (a small model that learns the date task on one CPU thread in about a minute).
DEFAULTS: dict[str, Any] = dict(
    d_model=64, n_heads=4, d_ff=256, n_layers=2, steps=1500, batch_size=64, warmup=200, lr_factor=1.0, smoothing=0.1
)

#: The date model shipped with the package, written by `SHIPPED_COMMAND` (chapter 09; earlier chapters may use it).
SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "assets" / "dates_model.pt"
SHIPPED_COMMAND = (
    "python -m transformer_lab.cli train --task dates --seed 0 --out transformer_lab/assets/dates_model.pt"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.cli",
        description="Train a small Transformer on a toy task (copy, reverse, dates) and write a checkpoint.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train", help="train a model and write a checkpoint")
    t.add_argument("--task", choices=("copy", "reverse", "dates"), default="dates", help="which task (default dates)")
    t.add_argument("--out", required=True, help="where to write the checkpoint (.pt)")
    t.add_argument("--seed", type=int, default=0, help="seed of the weights and of the data (default 0)")
    t.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="optimisation steps")
    t.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="examples per step")
    t.add_argument("--d-model", type=int, default=DEFAULTS["d_model"], help="model width d_model")
    t.add_argument("--n-heads", type=int, default=DEFAULTS["n_heads"], help="attention heads h")
    t.add_argument("--d-ff", type=int, default=DEFAULTS["d_ff"], help="feed-forward width d_ff")
    t.add_argument("--n-layers", type=int, default=DEFAULTS["n_layers"], help="layers N of encoder and decoder")
    t.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="Noam warm-up steps")
    t.add_argument("--lr-factor", type=float, default=DEFAULTS["lr_factor"], help="Noam scale factor")
    t.add_argument("--smoothing", type=float, default=DEFAULTS["smoothing"], help="label smoothing eps")
    t.add_argument("--eval-every", type=int, default=250, help="steps between validation measurements")
    t.add_argument("--test-per-format", type=int, default=150, help="held-out examples per format in the final test")
    t.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps ... (default cpu)")
    t.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    e = commands.add_parser("evaluate", help="measure the exact match of a checkpoint on held-out examples")
    e.add_argument("checkpoint", help="a checkpoint written by `train`")
    e.add_argument("--test-per-format", type=int, default=150, help="held-out examples per format")
    e.add_argument("--beam-size", type=int, default=None, help="beam search of this width (default: greedy)")
    e.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    return parser


def test_examples(task: Task, per_format: int, seed: int = 0) -> list:
    """Held-out test examples: `per_format` of each date format, or 8 x `per_format` for copy/reverse."""
    if isinstance(task, DateTask):
        return task.examples_per_format("test", per_format, seed=seed)
    return task.examples("test", per_format * 8, seed=seed)


def load_trained(path: str | os.PathLike[str], map_location: str = "cpu") -> tuple[Transformer, CharTokenizer, Task]:
    """Rebuild (model, tokenizer, task) from a checkpoint written by `train` (chapter 09)."""
    model = load_checkpoint(path, map_location)
    data = torch.load(path, map_location=map_location, weights_only=True)
    if "tokenizer" not in data or "task" not in data:
        raise ValueError(f"{path} has no tokenizer/task: was it written by `python -m transformer_lab.cli train`?")
    model.eval()
    return model, CharTokenizer.from_dict(data["tokenizer"]), make_task(data["task"])


def load_shipped() -> tuple[Transformer, CharTokenizer, Task]:
    """The trained date model shipped in transformer_lab/assets (see `SHIPPED_COMMAND`)."""
    if not SHIPPED_CHECKPOINT.exists():
        raise FileNotFoundError(f"no shipped checkpoint at {SHIPPED_CHECKPOINT}; make it with: {SHIPPED_COMMAND}")
    return load_trained(SHIPPED_CHECKPOINT)


def _report(counts: dict[str, tuple[int, int]]) -> str:
    lines = [f"  {kind:<12} {c:>5} / {n:<5} = {c / n:.4f}" for kind, (c, n) in counts.items() if kind != "all"]
    c, n = counts["all"]
    return "\n".join([*lines, f"exact match (greedy unless --beam-size): {c} / {n} = {c / n:.4f}"])


def _train(args: argparse.Namespace) -> int:
    tokenizer = CharTokenizer()
    task = make_task(args.task)
    config = TransformerConfig(
        tokenizer.vocab_size,
        tokenizer.vocab_size,
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
        n_layers=args.n_layers,
        dropout=0.0,
        max_len=64,
        tie_embeddings=True,
    )
    model = build_model(config, seed=args.seed, device=args.device)
    cpu_start = time.process_time()
    history = train(
        model,
        task,
        tokenizer,
        steps=args.steps,
        batch_size=args.batch_size,
        warmup=args.warmup,
        lr_factor=args.lr_factor,
        smoothing=args.smoothing,
        eval_every=args.eval_every,
        seed=args.seed,
        progress=not args.no_progress,
    )
    cpu_seconds = time.process_time() - cpu_start
    counts = exact_match_by_kind(model, test_examples(task, args.test_per_format), tokenizer)
    options = {k: v for k, v in vars(args).items() if k not in ("command", "out")}
    save_checkpoint(
        model.cpu(),
        args.out,
        tokenizer=tokenizer.to_dict(),
        task=task.to_dict(),
        options=options,
        history=history.to_dict(),
        test_exact_match={k: list(v) for k, v in counts.items()},
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(f"trained {n_params} parameters for {args.steps} steps in {history.seconds:.1f} s ({cpu_seconds:.1f} s CPU)")
    print(_report(counts))
    print(f"checkpoint written to {args.out}")
    return 0


def _check_train_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything that would otherwise fail after (or during) training, refused before it starts."""
    for option in ("steps", "batch_size", "d_model", "n_heads", "d_ff", "n_layers", "warmup", "eval_every"):
        value = getattr(args, option)
        if value < 1:
            raise SystemExit(f"--{option.replace('_', '-')} must be at least 1, got {value}")
    if args.test_per_format < 1:
        raise SystemExit(f"--test-per-format must be at least 1, got {args.test_per_format}")
    if not args.lr_factor > 0:
        raise SystemExit(f"--lr-factor must be > 0 (a negative factor climbs the loss), got {args.lr_factor}")
    if not 0 <= args.smoothing < 1:
        raise SystemExit(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0, got {args.seed}")
    if args.d_model % args.n_heads:
        raise SystemExit(f"--d-model ({args.d_model}) must be divisible by --n-heads ({args.n_heads})")
    folder = os.path.dirname(args.out) or "."
    if not os.path.isdir(folder):
        raise SystemExit(f"--out {args.out}: the folder {folder} does not exist (create it before training)")
    if not os.access(folder, os.W_OK):
        raise SystemExit(f"--out {args.out}: the folder {folder} is not writable")
    try:
        torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"--device {args.device!r} is not a device PyTorch knows (cpu, cuda, cuda:1, mps)") from None


def _evaluate(args: argparse.Namespace) -> int:
    model, tokenizer, task = load_trained(args.checkpoint)
    counts = exact_match_by_kind(model, test_examples(task, args.test_per_format), tokenizer, beam_size=args.beam_size)
    print(_report(counts))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: `train` or `evaluate` (see `--help`). Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        raise SystemExit("--threads must be at least 1")
    if args.command == "train":
        _check_train_args(parser, args)
    elif args.beam_size is not None and args.beam_size < 1:
        raise SystemExit(f"--beam-size must be at least 1, got {args.beam_size}")
    torch.set_num_threads(args.threads)
    if args.command == "train":
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("--device cuda was asked for, but PyTorch sees no CUDA GPU")
        return _train(args)
    return _evaluate(args)


if __name__ == "__main__":
    sys.exit(main())
