"""Attention of a trained model for the chapters before the model is built (01, 03, 06, 07); chapter 09's copy model.

The course ships several trained models in `transformer_lab/assets/`: chapter 09's date normaliser
(`dates_model.pt`) and copy model (`copy_model.pt`, made by `write_copy_model` below), seven small
decoder-only GPTs of chapters 10 to 12 (`gpt_*.pt`), and chapter 13's fine-tunings of the Tang GPT
(`finetune_sft.pt`, `finetune_rl.pt` and the LoRA adapter `finetune_lora.pt`, see `cli.FINETUNE_CHECKPOINTS`).
This module serves the date normaliser, whose attention the early chapters draw (made by
`python -m transformer_lab.cli train --task dates --seed 0 --out ...`; 2 encoder and 2 decoder
layers, 4 heads, d_model 64). It reads a date written in one of several formats, Chinese included
("2026年11月21日", "21 Nov 2026", "11/21/2026", ...), and writes it as ISO "2026-11-21". Its attention
maps are trained, unlike the random ones an untrained layer draws: earlier chapters use them to show what
attention learns, with the same plotting functions.

`date_attention(text)` runs the model once with teacher forcing on the text and a target (by default the
model's own greedy output) and returns every attention map with the characters as labels. Shape legend:
L layers, H heads, S source characters, T target characters.

`COPY_RECIPE` is chapter 09's copy model (section 6 of the notebook: strings of 1 to 8 letters, 400 steps of 32);
`write_copy_model(path)` trains it on one CPU thread and writes the checkpoint that ships as `copy_model.pt`
(`python -m transformer_lab.shipped transformer_lab/assets/copy_model.pt`), read with
`cli.load_shipped("copy")`. Its weights are float32, as trained: on another CPU the same recipe gives a
slightly different model, which is why chapter 09's beam-search figures read the shipped one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transformer_lab.multihead import record_attention

__all__ = [
    "COPY_RECIPE",
    "DateAttention",
    "copy_model",
    "date_attention",
    "date_model",
    "train_copy_model",
    "write_copy_model",
]

#: Chapter 09's copy model, as its section 6 trains it: the task, the model's sizes, `training.train`'s options,
#: and the held-out strings its exact match is measured on.
COPY_RECIPE: dict[str, Any] = {
    "task": {"name": "copy", "min_len": 1, "max_len": 8, "alphabet": "abcdefghijklmnopqrstuvwxyz"},
    "model": dict(d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.0, max_len=64, tie_embeddings=True),
    "train": dict(
        steps=400, batch_size=32, warmup=100, lr_factor=1.0, smoothing=0.1, eval_every=100, eval_examples=100, seed=0
    ),
    "test_examples": 300,
}


@dataclass
class DateAttention:
    """Every attention map of the trained date model on one example (weights detached, on the CPU).

    Attributes:
        source, target: the input text and the target fed to the decoder (by default the model's own output).
        source_labels: the S source characters; target_labels: the T decoder inputs ("<bos>" then the target).
        encoder_self: one (H, S, S) map per encoder layer (queries and keys: source characters).
        decoder_self: one (H, T, T) map per decoder layer (causal).
        cross: one (H, T, S) map per decoder layer (queries: target, keys: source).
    """

    source: str
    target: str
    source_labels: list[str]
    target_labels: list[str]
    encoder_self: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


def date_model():  # noqa: ANN201 - (Transformer, CharTokenizer, DateTask), see cli.load_shipped
    """The shipped trained date model, its tokenizer and its task, the model in eval mode."""
    from transformer_lab.cli import load_shipped

    return load_shipped()


def date_attention(text: str, target: str | None = None) -> DateAttention:
    """Every attention map of the trained date model reading `text` (a date in one of the task's formats).

    Args:
        text: the source, e.g. "21 Nov 2026" or "2026年11月21日".
        target: what the decoder is fed (teacher forcing); default: the model's own greedy output.

    Returns:
        a `DateAttention` with the maps and the character labels.
    """
    if not isinstance(text, str) or not text:
        raise TypeError(f"text must be a non-empty string such as '21 Nov 2026', got {text!r}")
    if target is not None and not isinstance(target, str):
        raise TypeError(f"target must be a string such as '2026-11-21' or None, got {type(target).__name__}")
    from transformer_lab.data import make_batch
    from transformer_lab.training import translate

    model, tokenizer, _ = date_model()
    for name, value in (("text", text), ("target", target)):
        longest = model.config.max_len - (name == "target")  # the decoder is fed BOS + target
        if value is not None and len(value) > longest:
            raise ValueError(f"{name} has {len(value)} characters; the model reads at most {longest}")
    if target is None:
        target = translate(model, [text], tokenizer)[0]
    batch = make_batch([(text, target)], tokenizer, "cpu")
    record_attention(model, True)
    with torch.no_grad():
        model(batch.src, batch.tgt_in, batch.src_mask)
    encoder = [layer.self_attn.attention_weights[0].clone() for layer in model.encoder.layers]  # (H, S, S)
    decoder = [layer.self_attn.attention_weights[0].clone() for layer in model.decoder.layers]  # (H, T, T)
    cross = [layer.cross_attn.attention_weights[0].clone() for layer in model.decoder.layers]  # (H, T, S)
    return DateAttention(
        source=text,
        target=target,
        source_labels=tokenizer.labels(batch.src[0]),
        target_labels=tokenizer.labels(batch.tgt_in[0]),
        encoder_self=encoder,
        decoder_self=decoder,
        cross=cross,
    )


def train_copy_model(steps: int | None = None, progress: bool = False):  # noqa: ANN201 - (model, tokenizer, task, History)
    """Train chapter 09's copy model by `COPY_RECIPE` on one CPU thread (the thread count is restored after).

    Args:
        steps: stop after this many steps (default: the recipe's 400); the first steps of a run are those of
            the whole run, so a short run checks the recipe cheaply.
        progress: show a tqdm progress bar.

    Returns:
        (model, tokenizer, task, history): the model in eval mode, as the notebook's `copy_model` after training.
    """
    from transformer_lab.data import CharTokenizer, make_task
    from transformer_lab.model import TransformerConfig
    from transformer_lab.training import build_model, train

    options = dict(COPY_RECIPE["train"])
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= options["steps"]:
            raise ValueError(f"steps must be an int from 1 to {options['steps']} (the recipe's length), got {steps!r}")
        options["steps"] = steps
    tokenizer, task = CharTokenizer(), make_task(COPY_RECIPE["task"])
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, **COPY_RECIPE["model"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the notebook trains it
    try:
        model = build_model(config, seed=options["seed"])
        history = train(model, task, tokenizer, progress=progress, **options)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model, tokenizer, task, history


def write_copy_model(path: str) -> float:
    """Train the copy model by `COPY_RECIPE` and save it to `path` (float32) with its recipe and history.

    The checkpoint holds what `cli.load_trained` reads (config, weights, tokenizer, task) and, as
    `dates_model.pt` does, `options` (the recipe's model sizes and training options), `history` (loss and
    learning rate of every step, validation exact match) and `test_exact_match` on the recipe's held-out
    strings. Returns that exact match.
    """
    from transformer_lab.model import save_checkpoint
    from transformer_lab.training import exact_match

    model, tokenizer, task, history = train_copy_model(progress=True)
    test = task.examples("test", COPY_RECIPE["test_examples"])
    correct = exact_match(model, test, tokenizer)
    options = {**COPY_RECIPE["model"], **COPY_RECIPE["train"], "task": "copy", "threads": 1, "device": "cpu"}
    save_checkpoint(
        model,
        path,
        tokenizer=tokenizer.to_dict(),
        task=task.to_dict(),
        options=options,
        history=history.to_dict(),
        test_exact_match={"all": [round(correct * len(test)), len(test)]},
        torch_version=str(torch.__version__),
    )
    return correct


def copy_model():  # noqa: ANN201 - (Transformer, CharTokenizer, CopyTask), see cli.load_shipped
    """The shipped copy model of chapter 09, its tokenizer and its task, the model in eval mode."""
    from transformer_lab.cli import load_shipped

    return load_shipped("copy")


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.shipped",
        description="Train chapter 09's copy model by COPY_RECIPE (one CPU thread) and write its checkpoint.",
    )
    parser.add_argument("out", help="where to write it, e.g. transformer_lab/assets/copy_model.pt")
    args = parser.parse_args(argv)
    correct = write_copy_model(args.out)
    n = COPY_RECIPE["test_examples"]
    print(f"copy model written to {args.out}; exact match on {n} held-out strings {correct:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
