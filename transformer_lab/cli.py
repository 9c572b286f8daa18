"""Train a toy task from the command line and write a checkpoint (chapter 09).

    python -m transformer_lab.cli train --task dates --seed 0 --out dates.pt
    python -m transformer_lab.cli train --task copy --steps 300 --device cuda --out copy.pt
    python -m transformer_lab.cli evaluate dates.pt
    python -m transformer_lab.cli gpt-train --corpus shakespeare --out shakespeare.pt      (chapter 10)
    python -m transformer_lab.cli gpt-train --corpus shakespeare --optimizer muon --out muon.pt   (chapter 11)
    python -m transformer_lab.cli gpt-train --corpus shakespeare --positions rope --norm rms_no_weight \
        --qk-norm rms_no_weight --activation relu2 --no-bias --untied --zero-init-output --out modern.pt
    python -m transformer_lab.cli gpt-train --corpus shakespeare --tokenizer bpe/ --out bpe.pt     (chapter 12)
    python -m transformer_lab.cli gpt-sample shakespeare.pt --prompt "ROMEO:" --temperature 0.8
    transformer-lab sft --out sft.pt                         (chapter 13: SFT of gpt_tang.pt on 藏头 and 续写)
    transformer-lab sft --lora-rank 8 --out lora.pt          (chapter 13: the same with LoRA: an adapter)
    transformer-lab rl sft.pt --out rl.pt                    (chapter 13: RL with the poem's checks as reward)
    transformer-lab poem 春夏秋冬                             (chapter 13: a 藏头诗 from the shipped RL model)
    transformer-lab lab --language zh        (your working copy of the course, opened in JupyterLab)

The checkpoint holds the model (`tl.save_checkpoint`: config and state dict) plus plain data
(the tokenizer's characters, the task's settings, the training options and history), so
`torch.load(path, weights_only=True)` reads it and `load_trained(path)` rebuilds everything.
A gpt-train checkpoint likewise holds the GPTConfig with every switch, and its tokenizer: the characters, or
a ByteBPE's `to_dict` (its merges) when trained with --tokenizer; `tl.training.load_gpt` rebuilds both.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from transformer_lab.bpe import ByteBPE
from transformer_lab.data import (
    CORPORA,
    CharTokenizer,
    DateTask,
    Task,
    TextTokenizer,
    load_corpus,
    make_task,
    split_text,
    token_starts,
)
from transformer_lab.distributed import is_main_process
from transformer_lab.gpt import GPT, NORMS, POSITIONS, RMS_NORMS, GPTConfig
from transformer_lab.model import Transformer, TransformerConfig, load_checkpoint, save_checkpoint
from transformer_lab.modern import ROPE_LAYOUTS
from transformer_lab.training import (
    GPT_OPTIMIZERS,
    build_model,
    exact_match_by_kind,
    load_gpt,
    save_gpt,
    train,
    train_gpt,
)

__all__ = [
    "main",
    "build_parser",
    "load_trained",
    "load_shipped",
    "DEFAULTS",
    "SHIPPED_CHECKPOINT",
    "SHIPPED_COMMAND",
    "SHIPPED_COPY_CHECKPOINT",
    "SHIPPED_COPY_COMMAND",
]

#: The recipe of chapter 09 (a small model that learns the date task on one CPU thread in about a minute).
DEFAULTS: dict[str, Any] = dict(
    d_model=64, n_heads=4, d_ff=256, n_layers=2, steps=1500, batch_size=64, warmup=200, lr_factor=1.0, smoothing=0.1
)

#: The date model shipped with the package, written by `SHIPPED_COMMAND` (chapter 09; earlier chapters may use it).
SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "assets" / "dates_model.pt"
SHIPPED_COMMAND = (
    "python -m transformer_lab.cli train --task dates --seed 0 --out transformer_lab/assets/dates_model.pt"
)
#: Chapter 09's copy model (section 6's recipe, `shipped.COPY_RECIPE`), written by `SHIPPED_COPY_COMMAND`.
SHIPPED_COPY_CHECKPOINT = SHIPPED_CHECKPOINT.with_name("copy_model.pt")
SHIPPED_COPY_COMMAND = "python -m transformer_lab.shipped transformer_lab/assets/copy_model.pt"


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
    _add_gpt_commands(commands)
    _add_finetune_commands(commands)
    from transformer_lab import workspace

    workspace.build_parser(
        commands.add_parser(
            "lab",
            help="make or refresh your working copy of the course and open chapter 00 in JupyterLab",
            allow_abbrev=False,
        )
    )
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
    try:
        tokenizer, task = CharTokenizer.from_dict(data["tokenizer"]), make_task(data["task"])
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"path {os.fspath(path)!r} holds a tokenizer or task that cannot be rebuilt: {error}"
        ) from None
    model.eval()
    return model, tokenizer, task


def load_shipped(task: str = "dates") -> tuple[Transformer, CharTokenizer, Task]:
    """A trained model shipped in transformer_lab/assets: the date model (see `SHIPPED_COMMAND`), or with
    task="copy" chapter 09's copy model (see `SHIPPED_COPY_COMMAND`)."""
    shipped = {"dates": (SHIPPED_CHECKPOINT, SHIPPED_COMMAND), "copy": (SHIPPED_COPY_CHECKPOINT, SHIPPED_COPY_COMMAND)}
    if not isinstance(task, str) or task not in shipped:
        raise ValueError(f"task must be 'dates' or 'copy' (the shipped models of chapter 09), got {task!r}")
    path, command = shipped[task]
    if not path.exists():
        raise FileNotFoundError(f"no shipped checkpoint at {path}; make it with: {command}")
    return load_trained(path)


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
    if not is_main_process():  # under torchrun only rank 0 tests, prints and saves
        return 0
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
    if not (args.lr_factor > 0 and math.isfinite(args.lr_factor)):
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
    if os.path.isdir(args.out):
        raise SystemExit(f"--out {args.out} is a folder; give a file name such as {os.path.join(args.out, 'model.pt')}")
    if not os.access(folder, os.W_OK):
        raise SystemExit(f"--out {args.out}: the folder {folder} is not writable")
    try:
        torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"--device {args.device!r} is not a device PyTorch knows (cpu, cuda, cuda:1, mps)") from None


def _evaluate(args: argparse.Namespace) -> int:
    try:
        model, tokenizer, task = load_trained(args.checkpoint)
    except (OSError, ValueError) as error:  # a missing, corrupt or foreign file: a message, not a traceback
        _fail(f"checkpoint {args.checkpoint}: {error}")
    counts = exact_match_by_kind(model, test_examples(task, args.test_per_format), tokenizer, beam_size=args.beam_size)
    print(_report(counts))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: `train` or `evaluate` (see `--help`). Returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lab"]:  # options it does not know go on to `jupyter lab`
        from transformer_lab import workspace

        args, extra = parser.parse_known_args(argv)
        return workspace.lab(args, extra)
    args = parser.parse_args(argv)
    if args.command in GPT_COMMANDS:
        return GPT_COMMANDS[args.command](args)
    if args.threads < 1:
        raise SystemExit("--threads must be at least 1")
    if args.command == "train":
        _check_train_args(parser, args)
    else:
        if args.beam_size is not None and args.beam_size < 1:
            raise SystemExit(f"--beam-size must be at least 1, got {args.beam_size}")
        if args.test_per_format < 1:
            raise SystemExit(f"--test-per-format must be at least 1, got {args.test_per_format}")
    torch.set_num_threads(args.threads)
    if args.command == "train":
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("--device cuda was asked for, but PyTorch sees no CUDA GPU")
        return _train(args)
    return _evaluate(args)


# ---------------------------------------------------------------------------------------------
# Chapter 10: train a GPT on a text, sample from it
# ---------------------------------------------------------------------------------------------

#: nanoGPT's Shakespeare-character recipe with its CPU settings (config/train_shakespeare_char.py).
GPT_DEFAULTS: dict[str, Any] = dict(
    block_size=64,
    d_model=128,
    n_heads=4,
    n_layers=4,
    dropout=0.0,
    steps=2000,
    batch_size=12,
    lr=1e-3,
    min_lr=1e-4,
    warmup=100,
    weight_decay=0.1,
    beta2=0.99,
    clip_norm=1.0,
    eval_every=250,
)


def _add_gpt_commands(commands: Any) -> None:
    d = GPT_DEFAULTS
    g = commands.add_parser(
        "gpt-train",
        help="train a GPT on a shipped corpus or a UTF-8 text file (chapters 10-12)",
        description="Train a GPT (chapter 10) and write a weights_only checkpoint. The defaults are nanoGPT's "
        "Shakespeare-character recipe on a CPU: GPT-2's architecture reading characters. The model switches "
        "(chapter 11) turn it, one option at a time, into a 2026 decoder; --tokenizer (chapter 12) makes it read "
        "byte-level BPE tokens. Under `torchrun --nproc_per_node=N` it trains with DistributedDataParallel, "
        "--batch-size being the global batch.",
    )
    source = g.add_mutually_exclusive_group()
    source.add_argument(
        "--corpus", choices=sorted(CORPORA), default=None, help="a shipped corpus (default shakespeare)"
    )
    source.add_argument("--text", default=None, help="or the path of any UTF-8 text file")
    g.add_argument("--out", required=True, help="where to write the checkpoint (.pt); its folder must exist")
    g.add_argument("--seed", type=int, default=0, help="seed of the weights and of the batches (default 0)")
    g.add_argument(
        "--block-size", type=int, default=d["block_size"], help="context length in tokens (characters by default)"
    )
    g.add_argument("--d-model", type=int, default=d["d_model"], help="model width")
    g.add_argument("--n-heads", type=int, default=d["n_heads"], help="attention heads")
    g.add_argument("--n-layers", type=int, default=d["n_layers"], help="blocks")
    g.add_argument("--dropout", type=float, default=d["dropout"], help="dropout probability")
    g.add_argument("--steps", type=int, default=d["steps"], help="optimisation steps")
    g.add_argument("--batch-size", type=int, default=d["batch_size"], help="windows per step (the global batch)")
    g.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate")
    g.add_argument("--min-lr", type=float, default=d["min_lr"], help="learning rate at the end of the cosine")
    g.add_argument("--warmup", type=int, default=d["warmup"], help="linear warm-up steps")
    g.add_argument(
        "--decay-steps", type=int, default=None, help="step where the cosine reaches --min-lr (default --steps)"
    )
    g.add_argument("--weight-decay", type=float, default=d["weight_decay"], help="AdamW weight decay on matrices")
    g.add_argument("--beta2", type=float, default=d["beta2"], help="AdamW's beta2 (beta1 is 0.9)")
    g.add_argument(
        "--optimizer",
        choices=GPT_OPTIMIZERS,
        default="adamw",
        help="adamw (chapter 10) or muon (chapter 11): Muon for the blocks' matrices, AdamW (--lr, --weight-decay, "
        "--beta2) for the embeddings, head and gains (default adamw)",
    )
    g.add_argument("--muon-lr", type=float, default=0.02, help="Muon's peak learning rate (default 0.02)")
    g.add_argument("--muon-weight-decay", type=float, default=0.0, help="Muon's weight decay (default 0)")
    g.add_argument("--clip-norm", type=float, default=d["clip_norm"], help="gradient norm clip; 0 for none")
    g.add_argument("--eval-every", type=int, default=d["eval_every"], help="steps between validation losses")
    g.add_argument("--train-fraction", type=float, default=0.9, help="the first share of the text for training")
    g.add_argument(
        "--newline-share",
        type=float,
        default=0.0,
        metavar="S",
        help="the share of training windows that begin at a newline, the rest at any offset (default 0: any "
        "offset, as nanoGPT). For a text of one item per line, such as the tang corpus's poems, the model then "
        "learns to write an item from its start, as gpt-sample does from its default prompt of a newline",
    )
    g.add_argument("--half", action="store_true", help="store the weights in float16 (half the file size)")
    g.add_argument(
        "--init",
        default=None,
        metavar="CHECKPOINT",
        help="go on training from the weights of a checkpoint gpt-train wrote on the same text with the same "
        "--tokenizer (its model sizes and switches are used; a fresh optimiser and schedule)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="read the text as byte-level BPE tokens of this tokenizer (a folder written by tl.bpe.ByteBPE.save, "
        "or its tokenizer.json) instead of characters; the vocabulary size is the tokenizer's, and the "
        "checkpoint embeds the tokenizer. Special-token strings in the text are encoded as their ids",
    )
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps ... (default cpu)")
    g.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_switches(g)
    s = commands.add_parser("gpt-sample", help="sample text from a checkpoint written by gpt-train (chapter 10)")
    s.add_argument("checkpoint", help="a checkpoint written by gpt-train")
    s.add_argument("--prompt", default=None, help="the text to continue (default: a newline)")
    s.add_argument(
        "--length", type=int, default=200, help="tokens (characters for a character model) per sample (default 200)"
    )
    s.add_argument("--temperature", type=float, default=1.0, help="> 0; 0 for greedy (default 1.0)")
    s.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep this share of probability")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    s.add_argument("--num-samples", type=int, default=1, help="how many samples (default 1)")
    s.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="optional: the tokenizer you expect the checkpoint to read (a ByteBPE folder or tokenizer.json); "
        "refused unless it is the one embedded in the checkpoint, which is always the one used",
    )
    s.add_argument("--device", default="cpu", help="cpu, cuda ... (default cpu)")
    s.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")


def _add_switches(g: argparse.ArgumentParser) -> None:
    """gpt-train's model switches (chapter 11): one option per GPTConfig field, GPT-2's behaviour by default."""
    m = g.add_argument_group(
        "model switches (chapter 11)",
        "Each option changes one thing of GPT-2's architecture (see tl.gpt.GPTConfig); the defaults are GPT-2's. "
        "With --init the checkpoint's own architecture is used.",
    )
    m.add_argument("--no-bias", action="store_true", help="no biases in the Linear layers and norms (Llama, Qwen3)")
    m.add_argument("--untied", action="store_true", help="an output head of its own, not tied to the token embedding")
    m.add_argument(
        "--activation",
        choices=SWITCH_ACTIVATIONS,
        default="gelu_tanh",
        help="the feed-forward network: GELU (GPT-2's tanh form), ReLU squared (nanochat) or the gated SwiGLU "
        "(Llama, Qwen3; three matrices of width 8/3 d_model) (default gelu_tanh)",
    )
    m.add_argument(
        "--positions", choices=POSITIONS, default="learned", help="learned position vectors or rotary (default learned)"
    )
    m.add_argument(
        "--rope-base", type=float, default=10000.0, help="the base of the rotary frequencies (default 10000)"
    )
    m.add_argument(
        "--rope-layout",
        choices=ROPE_LAYOUTS,
        default="pairs",
        help="which features RoPE turns together: (2i, 2i+1) or Hugging Face's (i, i + d_k/2) (default pairs)",
    )
    m.add_argument(
        "--norm",
        choices=NORMS,
        default="layer",
        help="every norm: LayerNorm, RMSNorm with a gain, or RMSNorm without parameters (default layer)",
    )
    m.add_argument("--norm-eps", type=float, default=1e-5, help="the epsilon of every norm (default 1e-5)")
    m.add_argument("--embedding-norm", action="store_true", help="one more norm right after the embedding (nanochat)")
    m.add_argument(
        "--qk-norm",
        choices=("none", *RMS_NORMS),
        default="none",
        help="RMSNorm over each head's queries and keys, with or without a gain (default none)",
    )
    m.add_argument(
        "--n-kv-heads", type=int, default=None, help="key/value heads, dividing --n-heads (default: --n-heads)"
    )
    m.add_argument("--head-dim", type=int, default=None, help="the size of each head (default: --d-model / --n-heads)")
    m.add_argument(
        "--ff-width",
        type=int,
        default=None,
        help="the feed-forward hidden width (default: 4 x --d-model, or 8/3 x --d-model for swiglu)",
    )
    m.add_argument(
        "--logit-softcap", type=float, default=None, help="c in logits = c tanh(logits / c) (default: no cap)"
    )
    m.add_argument(
        "--zero-init-output",
        action="store_true",
        help="start the projections into the residual stream (W^O, W_2) at zero (nanochat)",
    )


#: The feed-forward networks gpt-train offers (GPTConfig also takes plain "gelu" and "relu").
SWITCH_ACTIVATIONS = ("gelu_tanh", "relu2", "swiglu")

#: gpt-train's option -> GPTConfig's field, for the model's switches.
SWITCH_FIELDS = {
    "activation": "activation",
    "positions": "positions",
    "rope_base": "rope_base",
    "rope_layout": "rope_layout",
    "norm": "norm",
    "norm_eps": "norm_eps",
    "embedding_norm": "embedding_norm",
    "qk_norm": "qk_norm",
    "n_kv_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "ff_width": "ff_width",
    "logit_softcap": "logit_softcap",
    "zero_init_output": "zero_init_output",
}


def _fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")


def _check_device(value: str) -> None:
    try:
        device = torch.device(value)
    except RuntimeError:
        _fail(f"--device {value!r} is not a device PyTorch knows (cpu, cuda, cuda:1, mps)")
    if device.type == "cuda" and not torch.cuda.is_available():
        _fail(f"--device {value} was asked for, but PyTorch sees no CUDA GPU")


def _check_gpt_train_args(args: argparse.Namespace) -> None:
    """Everything that would fail during or after training, refused before it starts."""
    for option in ("steps", "batch_size", "block_size", "d_model", "n_heads", "n_layers", "eval_every", "threads"):
        if getattr(args, option) < 1:
            _fail(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}")
    if args.head_dim is None and args.d_model % args.n_heads:
        _fail(f"--d-model ({args.d_model}) must be divisible by --n-heads ({args.n_heads}), or give --head-dim")
    if not 0.0 <= args.dropout < 1.0:
        _fail(f"--dropout must be in [0, 1), got {args.dropout}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        _fail(f"--lr must be a number > 0, got {args.lr}")
    if not 0.0 <= args.min_lr <= args.lr:
        _fail(f"--min-lr must be in [0, --lr={args.lr}], got {args.min_lr}")
    if args.warmup < 0:
        _fail(f"--warmup must be >= 0, got {args.warmup}")
    decay = args.steps if args.decay_steps is None else args.decay_steps
    if decay < args.warmup:
        _fail(f"--decay-steps ({decay}) must be >= --warmup ({args.warmup})")
    if not (args.weight_decay >= 0 and math.isfinite(args.weight_decay)):
        _fail(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if not 0.0 <= args.beta2 < 1.0:
        _fail(f"--beta2 must be in [0, 1), got {args.beta2}")
    if not (args.muon_lr > 0 and math.isfinite(args.muon_lr)):
        _fail(f"--muon-lr must be a number > 0, got {args.muon_lr}")
    if not (args.muon_weight_decay >= 0 and math.isfinite(args.muon_weight_decay)):
        _fail(f"--muon-weight-decay must be >= 0, got {args.muon_weight_decay}")
    if not (args.clip_norm >= 0 and math.isfinite(args.clip_norm)):
        _fail(f"--clip-norm must be >= 0 (0: no clipping), got {args.clip_norm}")
    if not 0.0 <= args.newline_share <= 1.0:
        _fail(
            f"--newline-share must be in [0, 1] (the share of windows beginning at a newline), got {args.newline_share}"
        )
    if not 0.0 < args.train_fraction < 1.0:
        _fail(f"--train-fraction must be in (0, 1), got {args.train_fraction}")
    if args.seed < 0:
        _fail(f"--seed must be >= 0, got {args.seed}")
    _check_switches(args)
    folder = os.path.dirname(args.out) or "."
    if not os.path.isdir(folder):
        _fail(f"--out {args.out}: the folder {folder} does not exist (create it before training)")
    if not os.access(folder, os.W_OK):
        _fail(f"--out {args.out}: the folder {folder} is not writable")
    if os.path.isdir(args.out):
        _fail(f"--out {args.out} is a folder; give a file name such as {os.path.join(args.out, 'gpt.pt')}")
    if args.text is not None and not os.path.isfile(args.text):
        _fail(f"--text {args.text}: no such file")
    if args.tokenizer is not None and not os.path.exists(args.tokenizer):
        _fail(f"--tokenizer {args.tokenizer}: no such file or folder (give what tl.bpe.ByteBPE.save wrote)")
    _check_device(args.device)


def _check_switches(args: argparse.Namespace) -> None:
    """The model switches one by one (naming the option), then together (GPTConfig's own checks)."""
    for option in ("n_kv_heads", "head_dim", "ff_width"):
        value = getattr(args, option)
        if value is not None and value < 1:
            _fail(f"--{option.replace('_', '-')} must be at least 1, got {value}")
    for option in ("rope_base", "norm_eps", "logit_softcap"):
        value = getattr(args, option)
        if value is not None and not (value > 0 and math.isfinite(value)):
            _fail(f"--{option.replace('_', '-')} must be a number > 0, got {value}")
    _gpt_config(args, vocab_size=1)  # the combination, before the text is read: the vocabulary does not matter


def _gpt_config(args: argparse.Namespace, vocab_size: int) -> GPTConfig:
    """The GPTConfig of gpt-train's options; a combination GPTConfig refuses ends the command with its reason."""
    switches = {field: getattr(args, option) for option, field in SWITCH_FIELDS.items()}
    if switches["qk_norm"] == "none":
        switches["qk_norm"] = None
    try:
        return GPTConfig(
            vocab_size=vocab_size,
            block_size=args.block_size,
            d_model=args.d_model,
            n_heads=args.n_heads,
            n_layers=args.n_layers,
            dropout=args.dropout,
            bias=not args.no_bias,
            tie_embeddings=not args.untied,
            **switches,
        )
    except (TypeError, ValueError) as error:
        _fail(f"{_options_named(str(error))}: {error}")


def _options_named(message: str) -> str:
    """The gpt-train options behind the GPTConfig fields a message names, e.g. "--n-kv-heads / --n-heads"."""
    options = {field: f"--{option.replace('_', '-')}" for option, field in SWITCH_FIELDS.items()}
    options.update(
        d_model="--d-model",
        n_heads="--n-heads",
        n_layers="--n-layers",
        block_size="--block-size",
        dropout="--dropout",
        bias="--no-bias",
        tie_embeddings="--untied",
    )
    found: dict[int, str] = {}  # position of the field in the message -> its option
    for field, option in options.items():
        match = re.search(rf"\b{field}\b", message)  # "n_heads" is not found inside "n_kv_heads"
        if match:
            found[match.start()] = option
    return " / ".join(found[position] for position in sorted(found)) or "the model options"


def _gpt_train(args: argparse.Namespace) -> int:
    _check_gpt_train_args(args)
    torch.set_num_threads(args.threads)
    source = args.text if args.text is not None else (args.corpus or "shakespeare")
    try:
        text = load_corpus(source)
    except (ValueError, FileNotFoundError) as error:
        _fail(f"--text {source}: {error}")
    if not text:
        _fail(f"{source} is empty")
    tokenizer: TextTokenizer | ByteBPE
    if args.tokenizer is not None:
        tokenizer = _load_bpe("--tokenizer", args.tokenizer)
        ids = torch.tensor(tokenizer.encode(text, allowed_special="all"), dtype=torch.long)
    else:
        tokenizer = TextTokenizer.from_text(text)
        ids = tokenizer.encode(text)
    unit = "characters" if args.tokenizer is None else "tokens"
    train_data, val_data = split_text(ids, args.train_fraction)
    for name, data in (("training", train_data), ("validation", val_data)):
        if len(data) < args.block_size + 1:
            _fail(
                f"the {name} split of {source} has {len(data)} {unit}, fewer than --block-size + 1 = "
                f"{args.block_size + 1}; use a longer text or a smaller --block-size"
            )
    starts = None
    if args.newline_share > 0:
        newline = _newline_id(tokenizer, text, source)
        try:
            starts = token_starts(train_data, newline, args.block_size, args.newline_share)
        except ValueError:
            _fail(
                f"--newline-share: no newline of the training split of {source} has --block-size + 1 = "
                f"{args.block_size + 1} {unit} after it; leave the option out or use a smaller --block-size"
            )
    config = _gpt_config(args, tokenizer.vocab_size)
    torch.manual_seed(args.seed)
    if args.init is not None:
        model = _initial_model(args, tokenizer)
    else:
        model = GPT(config)
    model = model.to(args.device)
    history = train_gpt(
        model,
        train_data,
        val_data,
        steps=args.steps,
        batch_size=args.batch_size,
        block=args.block_size,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup=args.warmup,
        decay_steps=args.decay_steps,
        weight_decay=args.weight_decay,
        betas=(0.9, args.beta2),
        clip_norm=args.clip_norm or None,
        eval_every=args.eval_every,
        seed=args.seed,
        starts=starts,
        progress=not args.no_progress,
        optimizer=args.optimizer,
        muon_lr=args.muon_lr,
        muon_weight_decay=args.muon_weight_decay,
    )
    if not is_main_process():  # under torchrun only rank 0 prints and saves
        return 0
    options = {k: v for k, v in vars(args).items() if k not in ("command", "out")}
    options["source"] = str(source)
    save_gpt(model.cpu(), args.out, tokenizer, half=args.half, options=options, history=history.to_dict())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"trained {n_params} parameters on {source} for {args.steps} steps in {history.seconds:.1f} s")
    print(f"validation loss (whole split, windows of {args.block_size}): {history.val_loss[-1]:.4f}")
    print(f"checkpoint written to {args.out}")
    return 0


def _load_bpe(option: str, path: str) -> ByteBPE:
    try:
        return ByteBPE.load(path)
    except (OSError, ValueError) as error:
        _fail(f"{option} {path}: not a byte-level BPE tokenizer that tl.bpe.ByteBPE.load reads ({error})")


def _newline_id(tokenizer: TextTokenizer | ByteBPE, text: str, source: str) -> int:
    """The id of a newline, for --newline-share: a character, or a BPE token that is exactly one newline."""
    if "\n" not in text:
        _fail(f"--newline-share: {source} has no newline; leave the option out")
    if isinstance(tokenizer, TextTokenizer):
        return int(tokenizer.encode("\n").item())
    ids = tokenizer.encode_ordinary("\n")
    if len(ids) != 1:
        _fail("--newline-share: the tokenizer has no token for a lone newline; leave the option out")
    return ids[0]


def _reads(tokenizer: TextTokenizer | ByteBPE) -> str:
    return f"characters ({tokenizer.vocab_size})" if isinstance(tokenizer, TextTokenizer) else repr(tokenizer)


def _initial_model(args: argparse.Namespace, tokenizer: TextTokenizer | ByteBPE) -> GPT:
    """The model of the checkpoint --init names, checked against the text and the options (a float32 GPT)."""
    from transformer_lab.training import load_gpt

    try:
        model, known = load_gpt(args.init)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        _fail(f"--init {args.init}: not a checkpoint written by gpt-train ({error})")
    if isinstance(known, TextTokenizer) and isinstance(tokenizer, TextTokenizer):
        if known.chars != tokenizer.chars:
            _fail(
                f"--init {args.init}: its characters are not those of this text; continue on the text it was trained on"
            )
    elif type(known) is not type(tokenizer) or known.to_dict() != tokenizer.to_dict():
        _fail(
            f"--init {args.init} was trained with another tokenizer (it reads {_reads(known)}, this run "
            f"{_reads(tokenizer)}); continue with the one it was trained with (--tokenizer, or none for characters)"
        )
    if model.config.block_size != args.block_size:
        size = model.config.block_size
        _fail(f"--init {args.init}: its block size is {size}; pass --block-size {size}")
    model.train()
    return model


def _gpt_sample(args: argparse.Namespace) -> int:
    if args.threads < 1:
        _fail(f"--threads must be at least 1, got {args.threads}")
    if args.length < 0:
        _fail(f"--length must be >= 0, got {args.length}")
    if args.num_samples < 1:
        _fail(f"--num-samples must be at least 1, got {args.num_samples}")
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        _fail(f"--temperature must be a number >= 0 (0: greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        _fail(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        _fail(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.seed < 0:
        _fail(f"--seed must be >= 0, got {args.seed}")
    _check_device(args.device)
    torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_gpt(args.checkpoint, map_location=args.device)
    except (FileNotFoundError, ValueError) as error:
        _fail(str(error))
    if args.tokenizer is not None:
        _check_same_tokenizer(args, tokenizer)
    prompt = args.prompt
    if prompt is None:
        if isinstance(tokenizer, TextTokenizer) and "\n" not in tokenizer.chars:
            _fail("the vocabulary has no newline to start from: give a --prompt")
        prompt = "\n"
    if not prompt:
        _fail("--prompt must not be empty (the model needs at least one token to continue)")
    if isinstance(tokenizer, ByteBPE):  # every string has byte-level tokens
        prompt_ids = torch.tensor(tokenizer.encode(prompt, allowed_special="all"), dtype=torch.long)
    else:
        unknown = sorted(set(prompt) - set(tokenizer.chars))
        if unknown:
            _fail(f"--prompt holds characters the model never saw: {unknown[:10]}")
        prompt_ids = tokenizer.encode(prompt)
    idx = prompt_ids.to(model.lm_head.weight.device).repeat(args.num_samples, 1)  # (N, T0)
    generator = torch.Generator(device=idx.device).manual_seed(args.seed)
    out = model.generate(
        idx, args.length, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator
    )
    for i, row in enumerate(out.cpu()):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        print(tokenizer.decode(row))
    return 0


def _check_same_tokenizer(args: argparse.Namespace, embedded: TextTokenizer | ByteBPE) -> None:
    """gpt-sample --tokenizer: only the tokenizer the model was trained with (the embedded one) is accepted."""
    given = _load_bpe("--tokenizer", args.tokenizer)
    if not isinstance(embedded, ByteBPE):
        _fail(
            f"--tokenizer {args.tokenizer}: {args.checkpoint} was trained on characters, not BPE tokens; "
            "leave --tokenizer out"
        )
    if given.to_dict() != embedded.to_dict():
        _fail(
            f"--tokenizer {args.tokenizer} is not the tokenizer {args.checkpoint} was trained with ({given!r}, "
            f"the checkpoint's: {embedded!r}); its ids would mean other text. Leave --tokenizer out: the "
            "checkpoint's own is used"
        )


# ---------------------------------------------------------------------------------------------
# Chapter 13: fine-tune the Tang model to write 藏头诗 (SFT, LoRA, RL), and ask it for a poem
# ---------------------------------------------------------------------------------------------

ASSETS = Path(__file__).resolve().parent / "assets"
#: The shipped models of chapter 13 (benchmarks/finetune.py --write, seed 0; the commands below reproduce them).
FINETUNE_CHECKPOINTS = {
    "base": ASSETS / "gpt_tang.pt",
    "sft": ASSETS / "finetune_sft.pt",
    "lora": ASSETS / "finetune_lora.pt",
    "rl": ASSETS / "finetune_rl.pt",
}
#: The recipes of chapter 13 (benchmarks/finetune.py's SETTINGS; tested equal).
FINETUNE_DEFAULTS: dict[str, Any] = {
    "sft": {"steps": 1000, "batch_size": 32, "lr": 4e-3, "warmup": 20, "data": "rhyming"},
    "lora": {
        "steps": 1000,
        "batch_size": 32,
        "lr": 2e-2,
        "warmup": 20,
        "rank": 8,
        "alpha": 16.0,
        "targets": ["w_q", "w_k", "w_v", "w_o", "w1", "w2"],
        "data": "rhyming",
    },
    "rl": {"steps": 100, "prompts_per_step": 16, "group_size": 8, "lr": 3e-4, "temperature": 1.0, "kl_coef": 0.1},
}
FINETUNE_COMMANDS_DOC = (
    "transformer-lab sft --out transformer_lab/assets/finetune_sft.pt",
    "transformer-lab sft --lora-rank 8 --out transformer_lab/assets/finetune_lora.pt",
    "transformer-lab rl transformer_lab/assets/finetune_sft.pt --out transformer_lab/assets/finetune_rl.pt",
)


def _add_finetune_commands(commands: Any) -> None:
    d, r = FINETUNE_DEFAULTS["sft"], FINETUNE_DEFAULTS["rl"]
    f = commands.add_parser(
        "sft",
        help="fine-tune the Tang GPT to follow 藏头 and 续写 instructions (chapter 13)",
        description="Supervised fine-tuning (chapter 13) of a Tang GPT (default: the shipped gpt_tang.pt) on the "
        "corpus's own quatrains (by default those whose lines 2 and 4 rhyme, --data): 藏头 + four heads -> the "
        "quatrain, 续写 + a first line -> the rest; the loss on the response only. All weights, or LoRA "
        "(--lora-rank) which writes an adapter (A, B and the three format tokens' rows) instead of a model. With "
        "the defaults it reproduces the shipped transformer_lab/assets/finetune_sft.pt (and with --lora-rank 8, "
        "finetune_lora.pt).",
    )
    f.add_argument("--out", required=True, help="where to write the fine-tuned model (or the LoRA adapter)")
    f.add_argument(
        "--base", default=str(FINETUNE_CHECKPOINTS["base"]), help="a gpt-train checkpoint (default: gpt_tang.pt)"
    )
    f.add_argument(
        "--lora-rank", type=int, default=0, help="LoRA's rank on every Linear of the blocks (0: all weights)"
    )
    f.add_argument("--steps", type=int, default=d["steps"], help=f"optimisation steps (default {d['steps']})")
    f.add_argument("--batch-size", type=int, default=d["batch_size"], help="examples per step (default 32)")
    f.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"peak learning rate (default {d['lr']:g}; with LoRA {FINETUNE_DEFAULTS['lora']['lr']:g})",
    )
    f.add_argument(
        "--data",
        choices=("rhyming", "all"),
        default=d["data"],
        help="the training quatrains: those whose lines 2 and 4 rhyme, as the instruction asks (default), or all",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the batches and of LoRA's A (default 0)")
    f.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    g = commands.add_parser(
        "rl",
        help="reinforcement learning of a fine-tuned Tang GPT with the poem's checks as reward (chapter 13)",
        description="RL with a reward a program checks (chapter 13): a group-relative policy gradient from a model "
        "written by `sft`, on the training poems' heads, reward = the share of the three checks passed (in form, "
        "acrostic, lines 2 and 4 rhyming on two different characters), with a KL penalty to the SFT model (--kl) that "
        "keeps the rhyme characters varied. With the defaults, from the shipped "
        "finetune_sft.pt, it reproduces transformer_lab/assets/finetune_rl.pt.",
    )
    g.add_argument("checkpoint", help="a model written by `sft`")
    g.add_argument("--out", required=True, help="where to write the model")
    g.add_argument("--steps", type=int, default=r["steps"], help=f"policy-gradient steps (default {r['steps']})")
    g.add_argument("--lr", type=float, default=r["lr"], help=f"learning rate (default {r['lr']})")
    g.add_argument(
        "--kl",
        type=float,
        default=r["kl_coef"],
        help=f"weight of the KL penalty to the SFT model (default {r['kl_coef']}; 0: none, as nanochat)",
    )
    g.add_argument(
        "--reward",
        choices=("poem", "rhyme"),
        default="poem",
        help="poem: the three checks (default); rhyme: the rhyme alone (the reward a policy games)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the prompts and the samples (default 0)")
    g.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    p = commands.add_parser(
        "poem",
        help="ask the fine-tuned Tang model for a 藏头诗 (chapter 13): transformer-lab poem 春夏秋冬",
        description="Write a five-character quatrain whose lines begin with the four given characters, with a model "
        "written by `sft` or `rl` (default: the shipped finetune_rl.pt), or a LoRA adapter on its base.",
    )
    p.add_argument("heads", help="four Chinese characters, one per line, e.g. 春夏秋冬")
    p.add_argument("--checkpoint", default=None, help="a model written by sft or rl (default: the shipped RL model)")
    p.add_argument("--lora", default=None, help="a LoRA adapter written by `sft --lora-rank`, put on --base")
    p.add_argument("--base", default=None, help="the base the adapter was trained on (default: gpt_tang.pt)")
    p.add_argument("--num-samples", type=int, default=1, help="how many poems (default 1)")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0 (default 0.8, as the chapter measures)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--check", action="store_true", help="also print each poem's checks (form, acrostic, rhyme)")


def _positive_options(args: argparse.Namespace, names: Sequence[str]) -> None:
    for name in names:
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


def _checkpoint_kind(path: str) -> object:
    """The "kind" a checkpoint file says it holds (None if it cannot be read: the loader then names the problem)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True) if os.path.isfile(path) else None
    except Exception:  # noqa: BLE001 - the loader names the problem
        return None
    return data.get("kind") if isinstance(data, dict) else None


def _require_characters(tokenizer: Any, option: str) -> None:
    """Chapter 13's format and checks read one token per character: refuse a model with another tokenizer."""
    if not isinstance(tokenizer, TextTokenizer):
        _fail(
            f"{option} uses a {type(tokenizer).__name__} tokenizer, but the 藏头诗 format needs one token per "
            "character: pass a character-level Tang model such as gpt_tang.pt (the default)"
        )


def _require_vocabulary(tokenizer: TextTokenizer, texts: Sequence[str], option: str) -> None:
    """Refuse a character model whose vocabulary lacks characters of the instructions or the poems."""
    known = set(tokenizer.chars)
    missing = sorted({c for text in texts for c in text} - known)
    if missing:
        _fail(
            f"{option} has no token for {len(missing)} of the characters of the Tang poems and their "
            f"instructions (e.g. {''.join(missing[:5])!r}): pass a model trained on the Tang corpus such as "
            "gpt_tang.pt (the default)"
        )


def _finetune_base(path: str) -> tuple[GPT, TextTokenizer]:
    from transformer_lab import finetune as ft

    kind = _checkpoint_kind(path)
    if kind in (ft.SFT_KIND, ft.LORA_KIND):
        _fail(f"--base {path} is already fine-tuned ({kind}): give the base model, e.g. gpt_tang.pt")
    try:
        model, tokenizer = load_gpt(path)
    except (FileNotFoundError, ValueError) as error:
        _fail(str(error))
    _require_characters(tokenizer, f"--base {path}")
    return model, tokenizer


def _sft_command(args: argparse.Namespace) -> int:
    from transformer_lab import finetune as ft

    _positive_options(args, ("steps", "batch_size", "threads"))
    if args.lora_rank < 0:
        _fail(f"--lora-rank must be >= 0 (0: all weights), got {args.lora_rank}")
    _positive_rate(args.lr)
    torch.set_num_threads(args.threads)
    base, tokenizer = _finetune_base(args.base)
    fmt = ft.SFTFormat(tokenizer.vocab_size)
    splits = ft.sft_splits(load_corpus("tang"), rhyming_only=args.data == "rhyming")
    _require_vocabulary(
        tokenizer,
        [e.prompt + e.response for part in ("train", "validation") for e in splits[part]],
        f"--base {args.base}",
    )
    train = ft.encode_examples(splits["train"], fmt, tokenizer)
    valid = ft.encode_examples(splits["validation"], fmt, tokenizer)
    recipe = FINETUNE_DEFAULTS["lora" if args.lora_rank else "sft"]
    lr = args.lr if args.lr is not None else recipe["lr"]
    model, history = ft.fine_tune(
        base,
        train,
        valid,
        seed=args.seed,
        lora_rank=args.lora_rank,
        lora_targets=FINETUNE_DEFAULTS["lora"]["targets"],
        steps=args.steps,
        batch_size=args.batch_size,
        lr=lr,
        warmup=recipe["warmup"],
        eval_every=125,
        log=print,
    )
    settings = {"steps": args.steps, "batch_size": args.batch_size, "lr": lr, "seed": args.seed, "data": args.data}
    if args.lora_rank:  # float16, as shipped
        ft.save_lora(model, args.out, new_rows=3, half=True, settings={**settings, "rank": args.lora_rank})
    else:
        ft.save_sft(model, args.out, tokenizer, fmt, half=True, settings=settings)
    print(f"wrote {args.out}: validation loss {history['val_loss'][-1]:.3f}, {history['seconds'][0]:.0f} s of CPU")
    return 0


def _positive_rate(lr: float | None) -> None:
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        _fail(f"--lr must be a number > 0 (the peak learning rate), got {lr}")


def _load_finetuned(path: str) -> tuple[GPT, Any, Any]:
    from transformer_lab import finetune as ft

    if _checkpoint_kind(path) == ft.LORA_KIND:
        _fail(
            f"{path} is a LoRA adapter (A and B only), not a model: give it with --lora and its base with "
            "--base (e.g. transformer-lab poem 春夏秋冬 --lora finetune_lora.pt --base gpt_tang.pt)"
        )
    try:
        model, tokenizer, fmt = ft.load_sft(path)
    except (FileNotFoundError, ValueError) as error:
        _fail(str(error))
    _require_characters(tokenizer, path)
    return model, tokenizer, fmt


def _rl_command(args: argparse.Namespace) -> int:
    from transformer_lab import finetune as ft

    _positive_options(args, ("steps", "threads"))
    _positive_rate(args.lr)
    if not (args.kl >= 0 and math.isfinite(args.kl)):
        _fail(f"--kl must be a number >= 0 (the KL penalty's weight; 0: none), got {args.kl}")
    torch.set_num_threads(args.threads)
    model, tokenizer, fmt = _load_finetuned(args.checkpoint)
    splits = ft.sft_splits(load_corpus("tang"))
    heads = [e.argument for e in splits["train"] if e.kind == "acrostic"]
    _require_vocabulary(tokenizer, [ft.acrostic_prompt(h) for h in heads], args.checkpoint)
    if args.reward == "poem":

        def reward(text: str | None, h: str) -> float:
            return ft.poem_reward(text, h, True)
    else:
        reward = ft.rhyme_reward
    r = FINETUNE_DEFAULTS["rl"]
    reference = copy.deepcopy(model) if args.kl else None  # the SFT model, frozen: what the KL penalty measures
    history = ft.rl(
        model,
        fmt,
        tokenizer,
        heads,
        reward,
        steps=args.steps,
        prompts_per_step=r["prompts_per_step"],
        group_size=r["group_size"],
        lr=args.lr,
        temperature=r["temperature"],
        kl_coef=args.kl,
        reference=reference,
        seed=args.seed,
    )
    ft.save_sft(
        model,
        args.out,
        tokenizer,
        fmt,
        half=True,
        settings={"steps": args.steps, "lr": args.lr, "kl_coef": args.kl, "reward": args.reward, "seed": args.seed},
    )
    rewards = history["reward"]
    print(
        f"wrote {args.out}: mean reward {sum(rewards[:10]) / len(rewards[:10]):.3f} over the first 10 steps, "
        f"{sum(rewards[-10:]) / len(rewards[-10:]):.3f} over the last 10; {history['seconds'][0]:.0f} s of CPU"
    )
    return 0


def _poem_command(args: argparse.Namespace) -> int:
    from transformer_lab import finetune as ft

    heads = args.heads
    if len(heads) != 4:
        _fail(f"heads must be four characters, one per line (e.g. 春夏秋冬), got {len(heads)}: {heads!r}")
    _positive_options(args, ("num_samples",))
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        _fail(f"--temperature must be a number > 0, got {args.temperature}")
    if args.lora is not None and args.checkpoint is not None:
        _fail("give either --checkpoint (a whole model) or --lora with --base (an adapter and its base), not both")
    if args.lora is not None:
        base, tokenizer = _finetune_base(args.base or str(FINETUNE_CHECKPOINTS["base"]))
        fmt = ft.SFTFormat(tokenizer.vocab_size)
        try:
            model = ft.load_lora(ft.add_special_tokens(base), args.lora)
        except (FileNotFoundError, ValueError) as error:
            _fail(f"--lora {args.lora}: {error}")
        model.eval()
    else:
        if args.base is not None:
            _fail("--base goes with --lora (the base an adapter was trained on); a --checkpoint is a whole model")
        model, tokenizer, fmt = _load_finetuned(args.checkpoint or str(FINETUNE_CHECKPOINTS["rl"]))
    other = [c for c in heads if not ft._is_hanzi(c)]
    if other:
        _fail(
            f"heads must be four Chinese characters, one per line; {''.join(other)!r} is not a Chinese character "
            "(punctuation, a letter or a digit cannot begin a line): give four characters such as 春夏秋冬"
        )
    unknown = [c for c in heads if c not in tokenizer.chars]
    if unknown:
        _fail(
            f"heads must be four Chinese characters the model knows; {''.join(unknown)!r} is not in its vocabulary "
            "of the Tang corpus's characters: choose another"
        )
    texts = ft.sample_poems(
        model, fmt, tokenizer, [heads], temperature=args.temperature, samples=args.num_samples, seed=args.seed
    )[0]
    for text in texts:
        shown = text if text is not None else "(the model wrote a format marker inside its answer)"
        if args.check and text is not None:
            checks = ft.poem_checks(text, heads)
            shown += "  " + " ".join(f"{k}={'yes' if v else 'no'}" for k, v in checks.items())
        print(shown)
    return 0


GPT_COMMANDS = {
    "gpt-train": _gpt_train,
    "gpt-sample": _gpt_sample,
    "sft": _sft_command,
    "rl": _rl_command,
    "poem": _poem_command,
}


if __name__ == "__main__":
    sys.exit(main())
