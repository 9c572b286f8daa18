"""Attention of a trained model, for the chapters before the model is built (01, 03, 06, 07).

The course ships several trained models in `transformer_lab/assets/`: chapter 09's date normaliser
(`dates_model.pt`) and seven small decoder-only GPTs of chapters 10 to 12 (`gpt_*.pt`). This module serves
the date normaliser, the only one with an encoder and cross-attention (made by
`python -m transformer_lab.cli train --task dates --seed 0 --out ...`; 2 encoder and 2 decoder
layers, 4 heads, d_model 64). It reads a date written in one of several formats, Chinese included
("2026年11月21日", "21 Nov 2026", "11/21/2026", ...), and writes it as ISO "2026-11-21". Its attention
maps are trained, unlike the random ones an untrained layer draws: earlier chapters use them to show what
attention learns, with the same plotting functions.

`date_attention(text)` runs the model once with teacher forcing on the text and a target (by default the
model's own greedy output) and returns every attention map with the characters as labels. Shape legend:
L layers, H heads, S source characters, T target characters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_lab.multihead import record_attention

__all__ = ["DateAttention", "date_model", "date_attention"]


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
