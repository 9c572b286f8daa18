"""Misuse suite (issue 13): what a learner or an engineer plausibly gets wrong, across the public API.

Every case in CASES must raise the given error type with a message that names the argument (the
`names` text); none may pass silently or crash inside PyTorch. Reduced precision is a matter of
right results, not errors: PRECISION_CASES check that the explicit and the fast path agree in
float16 and bfloat16 (fully masked rows included) within a stated tolerance. Cases are grouped by
the kinds of the issue; `test_every_kind_has_enough_cases` keeps at least 15 per kind.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab import _checks
from transformer_lab import cli as tl_cli
from transformer_lab.data import CharTokenizer, make_batch
from transformer_lab.decoding import beam_search, greedy_decode
from transformer_lab.training import (
    build_model,
    exact_match,
    label_smoothed_loss,
    make_optimizer,
    noam_lr,
    smoothed_targets,
    translate,
)

matplotlib.use("Agg")

V, D, H, FF = 13, 8, 2, 16
META = torch.device("meta")


@functools.cache
def model() -> tl.Transformer:
    torch.manual_seed(0)
    return tl.Transformer(tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=2, max_len=10)).eval()


@functools.cache
def char_model() -> tl.Transformer:
    tok = CharTokenizer()
    torch.manual_seed(0)
    config = tl.TransformerConfig(tok.vocab_size, tok.vocab_size, d_model=D, n_heads=H, d_ff=FF, n_layers=1)
    return tl.Transformer(config).eval()


def x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def tok(b: int, length: int) -> torch.Tensor:
    return torch.randint(1, V, (b, length), generator=torch.Generator().manual_seed(1))


def padded(b: int = 3, length: int = 3) -> torch.Tensor:
    """Token ids with padding (id 0) at the end of every row but the first; varied real tokens."""
    out = torch.arange(1, b * length + 1).view(b, length) % (V - 1) + 1
    for row in range(1, b):
        out[row, length - row :] = 0
    return out


def mha() -> tl.MultiHeadAttention:
    return tl.MultiHeadAttention(D, H)


def enc_layer() -> tl.EncoderLayer:
    return tl.EncoderLayer(D, H, FF, dropout=0.0)


def dec_layer() -> tl.DecoderLayer:
    return tl.DecoderLayer(D, H, FF, dropout=0.0)


def decoder() -> tl.Decoder:
    return tl.Decoder(D, H, FF, 2, dropout=0.0)


def filled_cache(batch: int = 2, memory: torch.Tensor | None = None) -> tuple[tl.DecoderCache, torch.Tensor]:
    """A cache after one decoding step of `model()` on a batch of `batch`; returns (cache, memory)."""
    m = model()
    memory = m.encode(tok(batch, 4)) if memory is None else memory
    cache = m.new_cache()
    m.decode(tok(batch, 1), memory, cache=cache)
    return cache, memory


def filled_layer_cache(batch: int = 2) -> tl.LayerCache:
    layer, cache = dec_layer(), tl.LayerCache()
    layer(x(batch, 1, D), x(batch, 4, D), cache=cache)
    return cache


def triu_blocked(t: int) -> torch.Tensor:
    """PyTorch's causal mask: True = blocked (above the diagonal)."""
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


def decode_kwargs(**overrides: object) -> dict[str, object]:
    return {"bos_id": 1, "eos_id": 2, "pad_id": 0, "max_len": 4, **overrides}


def write(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def checkpoint(tmp: Path) -> Path:
    path = tmp / "model.pt"
    tl.save_checkpoint(model(), path)
    return path


def edited_checkpoint(tmp: Path, edit: Callable[[dict], None]) -> Path:
    data = torch.load(checkpoint(tmp), weights_only=True)
    edit(data)
    return write(tmp / "edited.pt", data)


def cli_train(tmp: Path, *extra: str) -> None:
    tl_cli.main(["train", "--task", "copy", "--steps", "1", "--out", str(tmp / "x.pt"), "--no-progress", *extra])


def history() -> dict[str, list]:
    return {"step": [1, 2], "loss": [2.0, 1.0], "lr": [0.1, 0.1], "eval_step": [2], "val_exact_match": [0.5]}


# (kind, id, call taking a tmp folder, error type, text the message must contain: the argument's name)
Case = tuple[str, str, Callable[[Path], object], type[BaseException], str]

MASKS: list[Case] = [
    (
        "masks",
        "model (B,S) src_mask with B == S == T",
        lambda t: model()(tok(3, 3), tok(3, 3), tok(3, 3) != 0),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "encode (B,S) src_mask",
        lambda t: model().encode(padded(3, 3), padded(3, 3) != 0),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "decode (B,S) src_mask",
        lambda t: model().decode(tok(3, 3), x(3, 3, D), padded() != 0),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "greedy (B,S) src_mask",
        lambda t: greedy_decode(model(), padded(), padded() != 0, **decode_kwargs()),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "beam (B,S) src_mask",
        lambda t: beam_search(model(), padded(), padded() != 0, **decode_kwargs()),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "forward PyTorch causal (True=blocked)",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=triu_blocked(4)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "decode PyTorch causal",
        lambda t: model().decode(tok(2, 4), x(2, 3, D), tgt_mask=triu_blocked(4)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "forward inverted tl.causal_mask",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=~tl.causal_mask(4)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "forward batched PyTorch causal",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=triu_blocked(4).expand(2, 1, 4, 4)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "forward all-blocked tgt_mask",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=torch.zeros(4, 4, dtype=torch.bool)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "forward nn.Transformer mask",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=nn.Transformer.generate_square_subsequent_mask(4)),
        TypeError,
        "tgt_mask",
    ),
    (
        "masks",
        "forward (src == pad)",
        lambda t: model()(padded(), tok(3, 2), (padded() == 0)[:, None, None, :]),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "encode (src == pad)",
        lambda t: model().encode(padded(), (padded() == 0)[:, None, None, :]),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "greedy (src == pad)",
        lambda t: greedy_decode(model(), padded(), (padded() == 0)[:, None, None, :], **decode_kwargs()),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "encode key_padding_mask style",
        lambda t: model().encode(padded(), tl.invert_mask(tl.padding_mask(padded(), 0))),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "src_mask additive float",
        lambda t: model().encode(padded(), tl.to_additive_mask(tl.padding_mask(padded(), 0))),
        TypeError,
        "src_mask",
    ),
    (
        "masks",
        "src_mask int 0/1",
        lambda t: model().encode(padded(), tl.padding_mask(padded(), 0).long()),
        TypeError,
        "src_mask",
    ),
    (
        "masks",
        "src_mask numpy",
        lambda t: model().encode(padded(), tl.padding_mask(padded(), 0).numpy()),
        TypeError,
        "src_mask",
    ),
    (
        "masks",
        "src_mask wrong length",
        lambda t: model().encode(padded(), torch.ones(3, 1, 1, 4, dtype=torch.bool)),
        ValueError,
        "src_mask",
    ),
    (
        "masks",
        "tgt_mask float",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=tl.causal_mask(4).float()),
        TypeError,
        "tgt_mask",
    ),
    (
        "masks",
        "tgt_mask wrong size",
        lambda t: model()(tok(2, 4), tok(2, 4), tgt_mask=tl.causal_mask(5)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "mha float mask",
        lambda t: mha()(x(2, 3, D), x(2, 3, D), x(2, 3, D), torch.zeros(3, 3)),
        TypeError,
        "mask",
    ),
    (
        "masks",
        "mha mask wrong shape",
        lambda t: mha()(x(2, 3, D), x(2, 3, D), x(2, 3, D), torch.ones(2, 4, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "masks",
        "mha mask as list",
        lambda t: mha()(x(2, 3, D), x(2, 3, D), x(2, 3, D), [[True] * 3] * 3),
        TypeError,
        "mask",
    ),
    (
        "masks",
        "encoder layer mask too long",
        lambda t: enc_layer()(x(2, 3, D), torch.ones(2, 1, 1, 4, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "masks",
        "encoder stack float mask",
        lambda t: tl.Encoder(D, H, FF, 2)(x(2, 3, D), torch.ones(2, 1, 1, 3)),
        TypeError,
        "mask",
    ),
    (
        "masks",
        "decoder layer tgt_mask wrong",
        lambda t: dec_layer()(x(2, 3, D), x(2, 4, D), tl.causal_mask(4)),
        ValueError,
        "tgt_mask",
    ),
    (
        "masks",
        "decoder layer memory_mask wrong",
        lambda t: dec_layer()(x(2, 3, D), x(2, 4, D), None, torch.ones(2, 1, 1, 3, dtype=torch.bool)),
        ValueError,
        "memory_mask",
    ),
    (
        "masks",
        "sdpa float mask",
        lambda t: tl.scaled_dot_product_attention(x(3, 4), x(3, 4), x(3, 4), torch.zeros(3, 3)),
        TypeError,
        "mask",
    ),
    (
        "masks",
        "sdpa mask wrong shape",
        lambda t: tl.scaled_dot_product_attention(x(3, 4), x(3, 4), x(3, 4), torch.ones(3, 4, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    ("masks", "padding_mask float tokens", lambda t: tl.padding_mask(x(2, 3), 0), TypeError, "tokens"),
    ("masks", "padding_mask float pad_id", lambda t: tl.padding_mask(tok(2, 3), 0.0), TypeError, "pad_id"),
    ("masks", "padding_mask 1-D tokens", lambda t: tl.padding_mask(torch.tensor([1, 0]), 0), ValueError, "tokens"),
    ("masks", "causal_mask float size", lambda t: tl.causal_mask(3.0), TypeError, "size"),
    ("masks", "causal_mask zero size", lambda t: tl.causal_mask(0), ValueError, "size"),
    ("masks", "invert_mask float", lambda t: tl.invert_mask(torch.zeros(2, 2)), TypeError, "mask"),
    (
        "masks",
        "to_additive int dtype",
        lambda t: tl.to_additive_mask(tl.causal_mask(2), torch.int64),
        TypeError,
        "dtype",
    ),
    ("masks", "target_mask float tokens", lambda t: tl.target_mask(x(2, 3), 0), TypeError, "tokens"),
]

KV_CACHE: list[Case] = [
    (
        "kv_cache",
        "batch 2 cache used on batch 3",
        lambda t: model().decode(tok(3, 1), x(3, 4, D), cache=filled_cache(2)[0]),
        ValueError,
        "cache",
    ),
    (
        "kv_cache",
        "batch 2 cache used on batch 1",
        lambda t: model().decode(tok(1, 1), x(1, 4, D), cache=filled_cache(2)[0]),
        ValueError,
        "cache",
    ),
    (
        "kv_cache",
        "cache from another source",
        lambda t: model().decode(tok(2, 1), model().encode(tok(2, 4) % 5 + 1), cache=filled_cache(2)[0]),
        ValueError,
        "memory",
    ),
    (
        "kv_cache",
        "cache from a longer source",
        lambda t: model().decode(tok(2, 1), x(2, 6, D), cache=filled_cache(2)[0]),
        ValueError,
        "memory",
    ),
    (
        "kv_cache",
        "reorder out of range",
        lambda t: filled_cache(2)[0].reorder(torch.tensor([0, 2])),
        ValueError,
        "index",
    ),
    ("kv_cache", "reorder negative", lambda t: filled_cache(2)[0].reorder(torch.tensor([-1, 0])), ValueError, "index"),
    (
        "kv_cache",
        "reorder float index",
        lambda t: filled_cache(2)[0].reorder(torch.tensor([0.0, 1.0])),
        TypeError,
        "index",
    ),
    (
        "kv_cache",
        "reorder bool index",
        lambda t: filled_cache(2)[0].reorder(torch.tensor([True, False])),
        TypeError,
        "index",
    ),
    ("kv_cache", "reorder list", lambda t: filled_cache(2)[0].reorder([0, 1]), TypeError, "index"),
    (
        "kv_cache",
        "reorder 2-D index",
        lambda t: filled_cache(2)[0].reorder(torch.tensor([[0, 1]])),
        ValueError,
        "index",
    ),
    (
        "kv_cache",
        "cache of another depth",
        lambda t: model().decode(tok(2, 1), x(2, 4, D), cache=tl.DecoderCache.empty(3)),
        ValueError,
        "cache",
    ),
    ("kv_cache", "cache is a dict", lambda t: model().decode(tok(2, 1), x(2, 4, D), cache={}), TypeError, "cache"),
    (
        "kv_cache",
        "cache is a LayerCache",
        lambda t: model().decode(tok(2, 1), x(2, 4, D), cache=tl.LayerCache()),
        TypeError,
        "cache",
    ),
    (
        "kv_cache",
        "cache from wider heads",
        lambda t: model().decode(
            tok(2, 1),
            x(2, 4, D),
            cache=tl.DecoderCache([tl.LayerCache(x(2, 4, 1, 2), x(2, 4, 1, 2)) for _ in range(2)], 1),
        ),
        ValueError,
        "cache",
    ),
    (
        "kv_cache",
        "decoder stack cache wrong batch",
        lambda t: decoder()(
            x(3, 1, D),
            x(3, 4, D),
            cache=tl.DecoderCache([tl.LayerCache(x(2, H, 1, D // H), x(2, H, 1, D // H)) for _ in range(2)], 1),
        ),
        ValueError,
        "cache",
    ),
    (
        "kv_cache",
        "decoder layer cache wrong batch",
        lambda t: dec_layer()(x(3, 1, D), x(3, 4, D), cache=filled_layer_cache(2)),
        ValueError,
        "cache",
    ),
    (
        "kv_cache",
        "decoder layer given DecoderCache",
        lambda t: dec_layer()(x(2, 1, D), x(2, 4, D), cache=tl.DecoderCache.empty(1)),
        TypeError,
        "cache",
    ),
    (
        "kv_cache",
        "decoder stack given LayerCache",
        lambda t: decoder()(x(2, 1, D), x(2, 4, D), cache=tl.LayerCache()),
        TypeError,
        "cache",
    ),
    ("kv_cache", "decoder stack other memory", lambda t: _decoder_other_memory(), ValueError, "memory"),
    (
        "kv_cache",
        "tgt_mask not covering the cache",
        lambda t: _decode_mask_not_covering(),
        ValueError,
        "tgt_mask",
    ),
    ("kv_cache", "empty cache of 0 layers", lambda t: tl.DecoderCache.empty(0), ValueError, "n_layers"),
    ("kv_cache", "decoding past max_len", lambda t: _decode_past_max_len(), ValueError, "max_len"),
]


def _decode_mask_not_covering() -> None:
    cache, memory = filled_cache(2)
    model().decode(tok(2, 1), memory, tgt_mask=tl.causal_mask(3), cache=cache)  # (3, 3): not (1, cached + 1)


def _decoder_other_memory() -> None:
    dec, cache = decoder(), tl.DecoderCache.empty(2)
    dec(x(2, 1, D), x(2, 4, D), cache=cache)
    dec(x(2, 1, D), x(2, 4, D) + 1, cache=cache)


def _decode_past_max_len() -> None:
    m = model()
    memory = m.encode(tok(1, 3))
    cache = m.new_cache()
    for _ in range(11):
        m.decode(tok(1, 1), memory, cache=cache)


def _float16_module_call() -> None:
    mha().half()(x(2, 3, D), x(2, 3, D), x(2, 3, D))


DTYPES_DEVICES: list[Case] = [
    (
        "dtype_device",
        "float16 input, float32 mha",
        lambda t: mha()(*(x(2, 3, D, dtype=torch.float16),) * 3),
        TypeError,
        "query",
    ),
    (
        "dtype_device",
        "bfloat16 input, float32 mha",
        lambda t: mha()(*(x(2, 3, D, dtype=torch.bfloat16),) * 3),
        TypeError,
        "query",
    ),
    ("dtype_device", "float32 input, float64 mha", lambda t: mha().double()(*(x(2, 3, D),) * 3), TypeError, "query"),
    ("dtype_device", "float32 input, float16 mha", lambda t: _float16_module_call(), TypeError, "query"),
    (
        "dtype_device",
        "int input to mha",
        lambda t: mha()(*(tok(2, 3).unsqueeze(-1).expand(2, 3, D),) * 3),
        TypeError,
        "query",
    ),
    (
        "dtype_device",
        "mixed key dtype",
        lambda t: mha()(x(2, 3, D), x(2, 3, D, dtype=torch.float64), x(2, 3, D)),
        TypeError,
        "key",
    ),
    (
        "dtype_device",
        "float16 input to LayerNorm",
        lambda t: tl.LayerNorm(D)(x(2, D, dtype=torch.float16)),
        TypeError,
        "x",
    ),
    ("dtype_device", "int input to LayerNorm", lambda t: tl.LayerNorm(D)(tok(2, D)), TypeError, "x"),
    (
        "dtype_device",
        "float32 input to float64 FeedForward",
        lambda t: tl.FeedForward(D, FF).double()(x(2, D)),
        TypeError,
        "x",
    ),
    (
        "dtype_device",
        "float16 input to EncoderLayer",
        lambda t: enc_layer()(x(2, 3, D, dtype=torch.float16)),
        TypeError,
        "x",
    ),
    (
        "dtype_device",
        "float64 memory to DecoderLayer",
        lambda t: dec_layer()(x(2, 3, D), x(2, 4, D, dtype=torch.float64)),
        TypeError,
        "memory",
    ),
    (
        "dtype_device",
        "float16 input to Encoder stack",
        lambda t: tl.Encoder(D, H, FF, 1)(x(2, 3, D, dtype=torch.float16)),
        TypeError,
        "x",
    ),
    ("dtype_device", "uint8 token ids", lambda t: model()(tok(2, 3).to(torch.uint8), tok(2, 3)), TypeError, "src"),
    ("dtype_device", "int16 target ids", lambda t: model()(tok(2, 3), tok(2, 3).to(torch.int16)), TypeError, "tgt"),
    ("dtype_device", "float token ids", lambda t: model()(tok(2, 3).float(), tok(2, 3)), TypeError, "src"),
    ("dtype_device", "bool token ids", lambda t: model().encode(tok(2, 3) > 3), TypeError, "src"),
    (
        "dtype_device",
        "uint8 to TokenEmbedding",
        lambda t: tl.TokenEmbedding(V, D)(tok(2, 3).to(torch.uint8)),
        TypeError,
        "tokens",
    ),
    (
        "dtype_device",
        "float64 memory to decode",
        lambda t: model().decode(tok(2, 3), x(2, 4, D, dtype=torch.float64)),
        TypeError,
        "memory",
    ),
    (
        "dtype_device",
        "mha mask on another device",
        lambda t: mha()(x(2, 3, D), x(2, 3, D), x(2, 3, D), torch.ones(3, 3, dtype=torch.bool, device=META)),
        ValueError,
        "mask",
    ),
    (
        "dtype_device",
        "sdpa mask on another device",
        lambda t: tl.scaled_dot_product_attention(
            x(3, 4), x(3, 4), x(3, 4), torch.ones(3, 3, dtype=torch.bool, device=META)
        ),
        ValueError,
        "mask",
    ),
    (
        "dtype_device",
        "src_mask on another device",
        lambda t: model().encode(padded(), tl.padding_mask(padded(), 0).to(META)),
        ValueError,
        "src_mask",
    ),
    (
        "dtype_device",
        "tgt_mask on another device",
        lambda t: model()(tok(2, 3), tok(2, 3), tgt_mask=tl.causal_mask(3, device=META)),
        ValueError,
        "tgt_mask",
    ),
    (
        "dtype_device",
        "encoder mask on another device",
        lambda t: enc_layer()(x(2, 3, D), torch.ones(2, 1, 1, 3, dtype=torch.bool, device=META)),
        ValueError,
        "mask",
    ),
    ("dtype_device", "input on another device", lambda t: mha()(*(x(2, 3, D).to(META),) * 3), ValueError, "query"),
    ("dtype_device", "tokens on another device", lambda t: model().encode(tok(2, 3).to(META)), ValueError, "src"),
    (
        "dtype_device",
        "memory on another device",
        lambda t: model().decode(tok(2, 3), x(2, 4, D).to(META)),
        ValueError,
        "memory",
    ),
    ("dtype_device", "causal_mask device='gpu'", lambda t: tl.causal_mask(3, device="gpu"), ValueError, "device"),
    (
        "dtype_device",
        "build_model device='gpu'",
        lambda t: build_model(model().config, device="gpu"),
        ValueError,
        "device",
    ),
    (
        "dtype_device",
        "make_batch device='gpu'",
        lambda t: make_batch([("a", "b")], CharTokenizer(), device="gpu"),
        ValueError,
        "device",
    ),
    (
        "dtype_device",
        "load_checkpoint map_location='gpu'",
        lambda t: tl.load_checkpoint(checkpoint(t), map_location="gpu"),
        ValueError,
        "map_location",
    ),
    (
        "dtype_device",
        "loss target on another device",
        lambda t: label_smoothed_loss(x(2, 3, V), tok(2, 3).to(META), 0),
        ValueError,
        "target",
    ),
    (
        "dtype_device",
        "loss int logits",
        lambda t: label_smoothed_loss(
            tok(
                2,
                3,
            )
            .unsqueeze(-1)
            .expand(2, 3, V),
            tok(2, 3),
            0,
        ),
        TypeError,
        "logits",
    ),
]

HELPERS: list[Case] = [
    (
        "helpers",
        "translate a bare string",
        lambda t: translate(char_model(), "2024-01-05", CharTokenizer()),
        TypeError,
        "sources",
    ),
    (
        "helpers",
        "translate a list with a number",
        lambda t: translate(char_model(), ["ab", 3], CharTokenizer()),
        TypeError,
        "sources",
    ),
    ("helpers", "translate tokenizer=None", lambda t: translate(char_model(), ["ab"], None), TypeError, "tokenizer"),
    (
        "helpers",
        "translate a non-model",
        lambda t: translate(nn.Linear(2, 2), ["ab"], CharTokenizer()),
        TypeError,
        "model",
    ),
    (
        "helpers",
        "make_batch strings, not pairs",
        lambda t: make_batch(["abc", "def"], CharTokenizer()),
        TypeError,
        "examples",
    ),
    ("helpers", "make_batch a bare string", lambda t: make_batch("abc", CharTokenizer()), TypeError, "examples"),
    ("helpers", "make_batch tokenizer=None", lambda t: make_batch([("a", "b")], None), TypeError, "tokenizer"),
    ("helpers", "make_batch triples", lambda t: make_batch([("a", "b", "c")], CharTokenizer()), TypeError, "examples"),
    (
        "helpers",
        "exact_match strings",
        lambda t: exact_match(char_model(), ["ab"], CharTokenizer()),
        TypeError,
        "examples",
    ),
    (
        "helpers",
        "loss float target",
        lambda t: label_smoothed_loss(x(2, 3, V), tok(2, 3).float(), 0),
        TypeError,
        "target",
    ),
    (
        "helpers",
        "loss target id == V",
        lambda t: label_smoothed_loss(x(2, 3, V), torch.full((2, 3), V), 0),
        ValueError,
        "target",
    ),
    (
        "helpers",
        "loss negative target id",
        lambda t: label_smoothed_loss(x(2, 3, V), torch.full((2, 3), -1), 0),
        ValueError,
        "target",
    ),
    ("helpers", "loss pad_id=-1", lambda t: label_smoothed_loss(x(2, 3, V), tok(2, 3), -1), ValueError, "pad_id"),
    ("helpers", "loss pad_id=V", lambda t: label_smoothed_loss(x(2, 3, V), tok(2, 3), V), ValueError, "pad_id"),
    (
        "helpers",
        "smoothed_targets float pad_id",
        lambda t: smoothed_targets(tok(2, 3), V, 0.5, 0.1),
        TypeError,
        "pad_id",
    ),
    (
        "helpers",
        "loss smoothing=1",
        lambda t: label_smoothed_loss(x(2, 3, V), tok(2, 3), 0, smoothing=1.0),
        ValueError,
        "smoothing",
    ),
    ("helpers", "noam factor -1", lambda t: noam_lr(1, 512, factor=-1), ValueError, "factor"),
    ("helpers", "noam factor string", lambda t: noam_lr(1, 512, factor="1"), TypeError, "factor"),
    ("helpers", "optimizer factor -1", lambda t: make_optimizer(model(), D, 10, factor=-1), ValueError, "factor"),
    (
        "helpers",
        "train lr_factor -1",
        lambda t: tl.training.train(
            char_model(), tl.data.make_task("copy"), CharTokenizer(), steps=1, lr_factor=-1, progress=False
        ),
        ValueError,
        "lr_factor",
    ),
    (
        "helpers",
        "train tokenizer None",
        lambda t: tl.training.train(char_model(), tl.data.make_task("copy"), None, steps=1, progress=False),
        TypeError,
        "tokenizer",
    ),
    ("helpers", "cli --lr-factor -1", lambda t: cli_train(t, "--lr-factor", "-1"), SystemExit, "lr-factor"),
    ("helpers", "cli --steps 0", lambda t: cli_train(t, "--steps", "0"), SystemExit, "steps"),
    (
        "helpers",
        "EncoderLayer norm_first='False'",
        lambda t: tl.EncoderLayer(D, H, FF, norm_first="False"),
        TypeError,
        "norm_first",
    ),
    (
        "helpers",
        "Decoder norm_first='False'",
        lambda t: tl.Decoder(D, H, FF, 1, norm_first="False"),
        TypeError,
        "norm_first",
    ),
    (
        "helpers",
        "Residual norm_first='no'",
        lambda t: tl.Residual(nn.Identity(), D, norm_first="no"),
        TypeError,
        "norm_first",
    ),
    (
        "helpers",
        "config norm_first='False'",
        lambda t: tl.TransformerConfig(V, V, norm_first="False"),
        TypeError,
        "norm_first",
    ),
    ("helpers", "MHA bias='no'", lambda t: tl.MultiHeadAttention(D, H, bias="no"), TypeError, "bias"),
    ("helpers", "LayerNorm fused='yes'", lambda t: tl.LayerNorm(D, fused="yes"), TypeError, "fused"),
    ("helpers", "Residual dropout=1.0", lambda t: tl.Residual(nn.Identity(), D, dropout=1.0), ValueError, "dropout"),
    ("helpers", "MHA dropout=1.0", lambda t: tl.MultiHeadAttention(D, H, dropout=1.0), ValueError, "dropout"),
    ("helpers", "FeedForward dropout=1.0", lambda t: tl.FeedForward(D, FF, dropout=1.0), ValueError, "dropout"),
    (
        "helpers",
        "PositionalEncoding dropout=1.0",
        lambda t: tl.PositionalEncoding(D, dropout=1.0),
        ValueError,
        "dropout",
    ),
    ("helpers", "config dropout=1.0", lambda t: tl.TransformerConfig(V, V, dropout=1.0), ValueError, "dropout"),
    ("helpers", "EncoderLayer dropout=1.0", lambda t: tl.EncoderLayer(D, H, FF, dropout=1.0), ValueError, "dropout"),
    ("helpers", "build_model with a dict", lambda t: build_model({"src_vocab_size": V}), TypeError, "config"),
    ("helpers", "build_model seed '0'", lambda t: build_model(model().config, seed="0"), TypeError, "seed"),
    (
        "helpers",
        "greedy max_len 0",
        lambda t: greedy_decode(model(), tok(2, 3), **decode_kwargs(max_len=0)),
        ValueError,
        "max_len",
    ),
    (
        "helpers",
        "beam length_penalty -1",
        lambda t: beam_search(model(), tok(2, 3), length_penalty=-1.0, **decode_kwargs()),
        ValueError,
        "length_penalty",
    ),
    (
        "helpers",
        "greedy eos_id = V",
        lambda t: greedy_decode(model(), tok(2, 3), **decode_kwargs(eos_id=V)),
        ValueError,
        "eos_id",
    ),
    ("helpers", "record_attention on='no'", lambda t: tl.record_attention(model(), "no"), TypeError, "on"),
    ("helpers", "check_masks='no'", lambda t: model().encode(tok(2, 3), check_masks="no"), TypeError, "check_masks"),
]

CHECKPOINTS: list[Case] = [
    (
        "checkpoints",
        "random bytes",
        lambda t: tl.load_checkpoint(_bytes(t, b"not a checkpoint at all")),
        ValueError,
        "path",
    ),
    ("checkpoints", "truncated file", lambda t: tl.load_checkpoint(_truncated(t)), ValueError, "path"),
    ("checkpoints", "empty file", lambda t: tl.load_checkpoint(_bytes(t, b"")), ValueError, "path"),
    (
        "checkpoints",
        "whole model pickled",
        lambda t: tl.load_checkpoint(write(t / "m.pt", model())),
        ValueError,
        "path",
    ),
    (
        "checkpoints",
        "a plain tensor",
        lambda t: tl.load_checkpoint(write(t / "m.pt", torch.zeros(2))),
        ValueError,
        "path",
    ),
    (
        "checkpoints",
        "a bare state dict",
        lambda t: tl.load_checkpoint(write(t / "m.pt", model().state_dict())),
        ValueError,
        "path",
    ),
    (
        "checkpoints",
        "config with unknown key",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d["config"].update(colour="red"))),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "config d_model edited",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d["config"].update(d_model=16))),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "config n_layers edited",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d["config"].update(n_layers=3))),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "config vocabulary edited",
        lambda t: tl.load_checkpoint(
            edited_checkpoint(t, lambda d: d["config"].update(src_vocab_size=20, tgt_vocab_size=20))
        ),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "config not a dict",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d.update(config=[1, 2]))),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "config invalid n_heads",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d["config"].update(n_heads=3))),
        ValueError,
        "n_heads",
    ),
    (
        "checkpoints",
        "weights missing a key",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d["state_dict"].pop("generator.weight"))),
        ValueError,
        "config",
    ),
    (
        "checkpoints",
        "map_location a float",
        lambda t: tl.load_checkpoint(checkpoint(t), map_location=1.5),
        TypeError,
        "map_location",
    ),
    ("checkpoints", "path None", lambda t: tl.load_checkpoint(None), TypeError, "path"),
    ("checkpoints", "path missing", lambda t: tl.load_checkpoint(t / "nothing.pt"), FileNotFoundError, "path"),
    (
        "checkpoints",
        "save a non-Transformer",
        lambda t: tl.save_checkpoint(nn.Linear(2, 2), t / "x.pt"),
        TypeError,
        "model",
    ),
    (
        "checkpoints",
        "save into a missing folder",
        lambda t: tl.save_checkpoint(model(), t / "no" / "x.pt"),
        ValueError,
        "path",
    ),
    (
        "checkpoints",
        "save extra 'config'",
        lambda t: tl.save_checkpoint(model(), t / "x.pt", config={}),
        ValueError,
        "config",
    ),
    ("checkpoints", "save path a number", lambda t: tl.save_checkpoint(model(), 3), TypeError, "path"),
    ("checkpoints", "cli --out folder missing", lambda t: cli_train(t / "missing"), SystemExit, "--out"),
    (
        "checkpoints",
        "load_trained without tokenizer",
        lambda t: tl_cli.load_trained(checkpoint(t)),
        ValueError,
        "tokenizer",
    ),
]


def _bytes(tmp: Path, data: bytes) -> Path:
    path = tmp / "bad.pt"
    path.write_bytes(data)
    return path


def _truncated(tmp: Path) -> Path:
    data = checkpoint(tmp).read_bytes()
    return _bytes(tmp, data[: len(data) // 2])


def _plot(name: str) -> Callable[..., object]:
    import transformer_lab.plotting as plotting

    return getattr(plotting, name)


def _widget(name: str) -> Callable[..., object]:
    import transformer_lab.widgets as widgets

    return getattr(widgets, name)


PLOTTING: list[Case] = [
    ("plotting_widgets", "heatmap of a string", lambda t: _plot("attention_heatmap")("abc"), TypeError, "weights"),
    ("plotting_widgets", "heatmap of None", lambda t: _plot("attention_heatmap")(None), TypeError, "weights"),
    (
        "plotting_widgets",
        "heatmap of a ragged list",
        lambda t: _plot("attention_heatmap")([[0.5, 0.5], [1.0]]),
        TypeError,
        "weights",
    ),
    ("plotting_widgets", "heatmap of a dict", lambda t: _plot("attention_heatmap")({"a": 1}), TypeError, "weights"),
    (
        "plotting_widgets",
        "heatmap of (B,H,T,S)",
        lambda t: _plot("attention_heatmap")(torch.rand(1, 2, 3, 3)),
        ValueError,
        "weights",
    ),
    (
        "plotting_widgets",
        "too few key labels",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3), ["a", "b"]),
        ValueError,
        "key_labels",
    ),
    (
        "plotting_widgets",
        "too many query labels",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3), None, ["a", "b", "c"]),
        ValueError,
        "query_labels",
    ),
    (
        "plotting_widgets",
        "key labels a string",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3), "abc"),
        TypeError,
        "key_labels",
    ),
    (
        "plotting_widgets",
        "mask picture labels",
        lambda t: _plot("mask_picture")(tl.causal_mask(3), ["a"]),
        ValueError,
        "key_labels",
    ),
    ("plotting_widgets", "mask picture of a string", lambda t: _plot("mask_picture")("mask"), TypeError, "mask"),
    (
        "plotting_widgets",
        "training curves of a list",
        lambda t: _plot("training_curves")([1.0, 2.0]),
        TypeError,
        "histories",
    ),
    (
        "plotting_widgets",
        "training curves missing keys",
        lambda t: _plot("training_curves")({"loss": [1.0]}),
        ValueError,
        "histories",
    ),
    (
        "plotting_widgets",
        "training curves a run of floats",
        lambda t: _plot("training_curves")({"a": [1.0, 2.0]}),
        TypeError,
        "histories",
    ),
    (
        "plotting_widgets",
        "training curves no 'step'",
        lambda t: _plot("training_curves")({"run": {k: v for k, v in history().items() if k != "step"}}),
        ValueError,
        "step",
    ),
    ("plotting_widgets", "training curves empty", lambda t: _plot("training_curves")({}), ValueError, "histories"),
    (
        "plotting_widgets",
        "training curves ragged",
        lambda t: _plot("training_curves")({**history(), "loss": [1.0]}),
        ValueError,
        "series",
    ),
    (
        "plotting_widgets",
        "softmax_saturation 2-D scores",
        lambda t: _plot("softmax_saturation")(torch.rand(2, 2), [1.0]),
        ValueError,
        "scores",
    ),
    (
        "plotting_widgets",
        "softmax_saturation text scores",
        lambda t: _plot("softmax_saturation")("abc", [1.0]),
        TypeError,
        "scores",
    ),
    ("plotting_widgets", "encoding heatmap 1-D", lambda t: _plot("encoding_heatmap")(torch.rand(5)), ValueError, "pe"),
    ("plotting_widgets", "cross maps empty", lambda t: _plot("cross_attention_maps")([]), ValueError, "maps"),
    ("plotting_widgets", "explorer seed string", lambda t: _widget("attention_explorer")(seed="a"), TypeError, "seed"),
    ("plotting_widgets", "explorer seed float", lambda t: _widget("attention_explorer")(seed=1.5), TypeError, "seed"),
    (
        "plotting_widgets",
        "explorer seed negative",
        lambda t: _widget("attention_explorer")(seed=-1),
        ValueError,
        "seed",
    ),
    (
        "plotting_widgets",
        "explorer sentence None",
        lambda t: _widget("attention_explorer")(sentence=None),
        TypeError,
        "sentence",
    ),
    (
        "plotting_widgets",
        "explorer d_model not divisible",
        lambda t: _widget("attention_explorer")(d_model=10, n_heads=4),
        ValueError,
        "d_model",
    ),
    (
        "plotting_widgets",
        "mask explorer one string",
        lambda t: _widget("mask_explorer")("a dog ran"),
        TypeError,
        "sentences",
    ),
    (
        "plotting_widgets",
        "word_vectors of a string",
        lambda t: tl.widgets.attention.word_vectors("the cat"),
        TypeError,
        "tokens",
    ),
    (
        "plotting_widgets",
        "batch norm explorer float mask",
        lambda t: _widget("batch_norm_explorer")(x(3, 4, 8), torch.ones(3, 4)),
        ValueError,
        "mask",
    ),
]

# Sizes given as 0, a negative number, a float, a string or a bool, to every constructor that takes one.
SIZE_ARGUMENTS: dict[str, Callable[[object], object]] = {
    "MultiHeadAttention d_model": lambda v: tl.MultiHeadAttention(v, 1),
    "MultiHeadAttention n_heads": lambda v: tl.MultiHeadAttention(D, v),
    "FeedForward d_model": lambda v: tl.FeedForward(v, FF),
    "FeedForward d_ff": lambda v: tl.FeedForward(D, v),
    "LayerNorm d_model": lambda v: tl.LayerNorm(v),
    "TokenEmbedding vocab_size": lambda v: tl.TokenEmbedding(v, D),
    "TokenEmbedding d_model": lambda v: tl.TokenEmbedding(V, v),
    "PositionalEncoding d_model": lambda v: tl.PositionalEncoding(v),
    "PositionalEncoding max_len": lambda v: tl.PositionalEncoding(D, v),
    "Encoder n_layers": lambda v: tl.Encoder(D, H, FF, v),
    "Decoder n_layers": lambda v: tl.Decoder(D, H, FF, v),
    "TransformerConfig d_model": lambda v: tl.TransformerConfig(V, V, d_model=v, n_heads=1),
    "TransformerConfig max_len": lambda v: tl.TransformerConfig(V, V, max_len=v),
}
BAD_SIZES = ((0, ValueError), (-1, ValueError), (2.5, TypeError), ("8", TypeError), (True, TypeError))
SIZES: list[Case] = [
    ("sizes", f"{what}={value!r}", lambda t, f=make, v=value: f(v), error, what.split()[1])
    for what, make in SIZE_ARGUMENTS.items()
    for value, error in BAD_SIZES
]

# Found by an independent probe of the public API (branch probe): each crashed deep, passed silently or
# named no argument before its fix.


@functools.cache
def gpt() -> tl.GPT:
    torch.manual_seed(0)
    return tl.GPT(tl.GPTConfig(vocab_size=V, block_size=8, d_model=D, n_heads=H, n_layers=2)).eval()


TEXT_TOKENIZER = tl.data.TextTokenizer("abcdefghijklm")  # V characters


def gpt_checkpoint(tmp: Path) -> Path:
    path = tmp / "gpt.pt"
    tl.training.save_gpt(gpt(), path, TEXT_TOKENIZER)
    return path


def gpt2_state_dict(**edits: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A tiny GPT-2 state dict (Conv1D layouts, 2 blocks, no "transformer." prefix); edits by name (None: drop)."""
    g = torch.Generator().manual_seed(0)
    sd = {"wte.weight": torch.randn(V, D, generator=g), "wpe.weight": torch.randn(8, D, generator=g)}
    sd |= {"ln_f.weight": torch.ones(D), "ln_f.bias": torch.zeros(D)}
    shapes = {"attn.c_attn": (D, 3 * D), "attn.c_proj": (D, D), "mlp.c_fc": (D, 4 * D), "mlp.c_proj": (4 * D, D)}
    for i in range(2):
        for ln in ("ln_1", "ln_2"):
            sd |= {f"h.{i}.{ln}.weight": torch.ones(D), f"h.{i}.{ln}.bias": torch.zeros(D)}
        for name, shape in shapes.items():
            sd[f"h.{i}.{name}.weight"] = torch.randn(*shape, generator=g)
            sd[f"h.{i}.{name}.bias"] = torch.zeros(shape[1])
    for name, value in edits.items():
        if value is None:
            sd.pop(name)
        else:
            sd[name] = value
    return sd


def gpt2_folder(tmp: Path, config_json: str) -> Path:
    torch.save(gpt2_state_dict(), tmp / "pytorch_model.bin")
    (tmp / "config.json").write_text(config_json, encoding="utf-8")
    return tmp


def _from_gpt2(**edits: torch.Tensor | None) -> tl.GPT:
    return tl.GPT.from_gpt2(gpt2_state_dict(**edits), n_heads=H)


def _stream() -> torch.Tensor:
    return TEXT_TOKENIZER.encode("abcdefghijklm" * 4)


PROBED: list[Case] = [
    (
        "dtype_device",
        "TokenEmbedding ids on meta",
        lambda t: tl.TokenEmbedding(V, D)(tok(2, 3).to(META)),
        ValueError,
        "tokens",
    ),
    ("dtype_device", "GPT idx on meta", lambda t: gpt()(tok(1, 3).to(META)), ValueError, "idx"),
    ("dtype_device", "generate prompt on meta", lambda t: gpt().generate(tok(1, 2).to(META), 2), ValueError, "idx"),
    (
        "dtype_device",
        "greedy src on meta",
        lambda t: greedy_decode(model(), tok(2, 3).to(META), **decode_kwargs()),
        ValueError,
        "src",
    ),
    ("dtype_device", "BatchNorm x on meta", lambda t: tl.BatchNorm(D)(x(2, 3, D).to(META)), ValueError, "x"),
    (
        "dtype_device",
        "BatchNorm mask on meta (eval)",
        lambda t: tl.BatchNorm(D).eval()(x(2, 3, D), torch.ones(2, 3, dtype=torch.bool, device=META)),
        ValueError,
        "mask",
    ),
    (
        "dtype_device",
        "sinusoidal_encoding int dtype",
        lambda t: tl.sinusoidal_encoding(10, D, dtype=torch.int64),
        TypeError,
        "dtype",
    ),
    (
        "dtype_device",
        "sinusoidal_encoding dtype string",
        lambda t: tl.sinusoidal_encoding(10, D, dtype="float32"),
        TypeError,
        "dtype",
    ),
    (
        "masks",
        "to_additive dtype string",
        lambda t: tl.to_additive_mask(tl.causal_mask(2), "float32"),
        TypeError,
        "dtype",
    ),
    ("helpers", "LayerNorm eps nan", lambda t: tl.LayerNorm(D, eps=float("nan")), ValueError, "eps"),
    ("helpers", "LayerNorm eps inf", lambda t: tl.LayerNorm(D, eps=float("inf")), ValueError, "eps"),
    ("helpers", "BatchNorm eps nan", lambda t: tl.BatchNorm(D, eps=float("nan")), ValueError, "eps"),
    ("helpers", "BatchNorm momentum True", lambda t: tl.BatchNorm(D, momentum=True), ValueError, "momentum"),
    (
        "helpers",
        "Residual sublayer changes width",
        lambda t: tl.Residual(nn.Linear(D, D + 1), D)(x(2, 3, D)),
        ValueError,
        "sublayer",
    ),
    (
        "helpers",
        "sublayer_connection norm_first 'yes'",
        lambda t: tl.sublayer_connection(x(2, 3, D), nn.Identity(), tl.LayerNorm(D), nn.Identity(), "yes"),
        TypeError,
        "norm_first",
    ),
    ("helpers", "filter_logits int logits", lambda t: tl.gpt.filter_logits(tok(2, V), top_k=2), TypeError, "logits"),
    ("helpers", "filter_logits a list", lambda t: tl.gpt.filter_logits([[1.0, 2.0]], top_k=1), TypeError, "logits"),
    ("helpers", "filter_logits 0-d", lambda t: tl.gpt.filter_logits(torch.tensor(1.0), top_k=1), ValueError, "logits"),
    (
        "helpers",
        "translate an empty source",
        lambda t: translate(char_model(), [""], CharTokenizer()),
        ValueError,
        "sources",
    ),
    ("helpers", "make_adamw a string", lambda t: tl.training.make_adamw("gpt", 1e-3), TypeError, "model"),
    (
        "helpers",
        "evaluate_text id == V",
        lambda t: tl.training.evaluate_text(gpt(), torch.full((20,), V)),
        ValueError,
        "data",
    ),
    (
        "helpers",
        "evaluate_text negative id",
        lambda t: tl.training.evaluate_text(gpt(), torch.full((20,), -1)),
        ValueError,
        "data",
    ),
    (
        "helpers",
        "train_gpt negative id",
        lambda t: tl.training.train_gpt(gpt(), torch.full((30,), -1), steps=1, warmup=0, progress=False),
        ValueError,
        "train_data",
    ),
    ("helpers", "make_task dict without name", lambda t: tl.data.make_task({"min_len": 2}), ValueError, "name"),
    ("helpers", "CharTokenizer decode float ids", lambda t: CharTokenizer().decode([4.7]), TypeError, "ids"),
    ("helpers", "CharTokenizer decode a string", lambda t: CharTokenizer().decode("abc"), TypeError, "ids"),
    ("helpers", "CharTokenizer labels out of range", lambda t: CharTokenizer().labels([10_000]), ValueError, "ids"),
    ("helpers", "CharTokenizer labels negative", lambda t: CharTokenizer().labels([-1]), ValueError, "ids"),
    ("helpers", "CharTokenizer.from_dict without chars", lambda t: CharTokenizer.from_dict({}), ValueError, "data"),
    (
        "helpers",
        "TextTokenizer decode float tensor",
        lambda t: TEXT_TOKENIZER.decode(torch.tensor([0.5, 1.7])),
        TypeError,
        "ids",
    ),
    ("helpers", "TextTokenizer chars None", lambda t: tl.data.TextTokenizer(None), TypeError, "chars"),
    (
        "helpers",
        "random_windows bool data",
        lambda t: tl.data.random_windows(torch.ones(20, dtype=torch.bool), 4, 2),
        TypeError,
        "data",
    ),
    ("helpers", "date_attention text too long", lambda t: tl.shipped.date_attention("1" * 100), ValueError, "text"),
    ("helpers", "cli train --lr-factor inf", lambda t: cli_train(t, "--lr-factor", "inf"), SystemExit, "lr-factor"),
    (
        "checkpoints",
        "load_checkpoint of a GPT checkpoint",
        lambda t: tl.load_checkpoint(gpt_checkpoint(t)),
        ValueError,
        "load_gpt",
    ),
    (
        "checkpoints",
        "load_checkpoint state_dict a list",
        lambda t: tl.load_checkpoint(edited_checkpoint(t, lambda d: d.update(state_dict=[1]))),
        ValueError,
        "state_dict",
    ),
    ("checkpoints", "save_checkpoint path a folder", lambda t: tl.save_checkpoint(model(), t), ValueError, "path"),
    (
        "checkpoints",
        "save_checkpoint extra a Python object",
        lambda t: tl.save_checkpoint(model(), t / "x.pt", tokenizer=CharTokenizer()),
        TypeError,
        "tokenizer",
    ),
    (
        "checkpoints",
        "save_gpt extra a Python object",
        lambda t: tl.training.save_gpt(gpt(), t / "g.pt", TEXT_TOKENIZER, note=CharTokenizer()),
        TypeError,
        "note",
    ),
    (
        "checkpoints",
        "save_gpt half='yes'",
        lambda t: tl.training.save_gpt(gpt(), t / "g.pt", TEXT_TOKENIZER, half="yes"),
        TypeError,
        "half",
    ),
    (
        "checkpoints",
        "load_gpt state_dict a list",
        lambda t: tl.training.load_gpt(
            write(t / "s.pt", {**torch.load(gpt_checkpoint(t), weights_only=True), "state_dict": [1]})
        ),
        ValueError,
        "state_dict",
    ),
    (
        "checkpoints",
        "cli train --out a folder",
        lambda t: tl_cli.main(["train", "--task", "copy", "--steps", "1", "--out", str(t), "--no-progress"]),
        SystemExit,
        "--out",
    ),
    (
        "checkpoints",
        "from_gpt2 without h.0.mlp.c_fc",
        lambda t: _from_gpt2(**{"h.0.mlp.c_fc.weight": None}),
        ValueError,
        "h.0.mlp.c_fc.weight",
    ),
    (
        "checkpoints",
        "from_gpt2 c_attn in Linear layout",
        lambda t: _from_gpt2(**{"h.0.attn.c_attn.weight": torch.randn(3 * D, D)}),
        ValueError,
        "h.0.attn.c_attn.weight",
    ),
    (
        "checkpoints",
        "from_gpt2 c_proj wrong shape",
        lambda t: _from_gpt2(**{"h.0.attn.c_proj.weight": torch.randn(D, D + 1)}),
        ValueError,
        "c_proj",
    ),
    ("checkpoints", "from_gpt2 wte 1-D", lambda t: _from_gpt2(**{"wte.weight": torch.randn(V)}), ValueError, "wte"),
    (
        "checkpoints",
        "from_gpt2 wpe width differs",
        lambda t: _from_gpt2(**{"wpe.weight": torch.randn(8, D - 2)}),
        ValueError,
        "wpe",
    ),
    (
        "checkpoints",
        "from_gpt2 lm_head wrong shape",
        lambda t: _from_gpt2(**{"lm_head.weight": torch.randn(V, D + 1)}),
        ValueError,
        "lm_head",
    ),
    (
        "checkpoints",
        "from_gpt2 numpy arrays",
        lambda t: tl.GPT.from_gpt2({k: v.numpy() for k, v in gpt2_state_dict().items()}, n_heads=H),
        TypeError,
        "state_dict",
    ),
    (
        "checkpoints",
        "from_gpt2 int weights",
        lambda t: tl.GPT.from_gpt2({k: v.long() for k, v in gpt2_state_dict().items()}, n_heads=H),
        TypeError,
        "state_dict",
    ),
    (
        "checkpoints",
        "from_gpt2 mixed dtypes",
        lambda t: _from_gpt2(**{"wte.weight": torch.randn(V, D).half()}),
        ValueError,
        "state_dict",
    ),
    (
        "checkpoints",
        "from_gpt2 meta tensors",
        lambda t: tl.GPT.from_gpt2({k: v.to(META) for k, v in gpt2_state_dict().items()}, n_heads=H),
        ValueError,
        "state_dict",
    ),
    ("checkpoints", "load_gpt2 path None", lambda t: tl.gpt.load_gpt2(None), TypeError, "path"),
    (
        "checkpoints",
        "load_gpt2 corrupt .bin",
        lambda t: tl.gpt.load_gpt2(_bytes(t, b"xx").rename(t / "pytorch_model.bin")),
        ValueError,
        "path",
    ),
    (
        "checkpoints",
        "load_gpt2 config.json not JSON",
        lambda t: tl.gpt.load_gpt2(gpt2_folder(t, "{not json")),
        ValueError,
        "config.json",
    ),
    (
        "checkpoints",
        "load_gpt2 config.json a list",
        lambda t: tl.gpt.load_gpt2(gpt2_folder(t, "[1, 2]")),
        ValueError,
        "config.json",
    ),
    (
        "plotting_widgets",
        "heatmap on meta",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3).to(META)),
        ValueError,
        "weights",
    ),
    (
        "plotting_widgets",
        "heatmap complex",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3, dtype=torch.complex64)),
        TypeError,
        "weights",
    ),
    (
        "plotting_widgets",
        "heatmap ax a string",
        lambda t: _plot("attention_heatmap")(torch.rand(2, 3), ax="left"),
        TypeError,
        "ax",
    ),
    (
        "plotting_widgets",
        "attention_grid too few row_names",
        lambda t: _plot("attention_grid")(torch.rand(2, 2, 3, 3), row_names=["a"]),
        ValueError,
        "row_names",
    ),
    (
        "plotting_widgets",
        "mask_picture of weights",
        lambda t: _plot("mask_picture")(torch.rand(3, 3)),
        ValueError,
        "mask",
    ),
    (
        "plotting_widgets",
        "softmax_saturation scales a string",
        lambda t: _plot("softmax_saturation")(torch.rand(4), "123"),
        TypeError,
        "scales",
    ),
    (
        "plotting_widgets",
        "value_histograms a list",
        lambda t: _plot("value_histograms")([torch.rand(5)]),
        TypeError,
        "series",
    ),
    (
        "plotting_widgets",
        "value_histograms bins 0",
        lambda t: _plot("value_histograms")({"a": torch.rand(5)}, bins=0),
        ValueError,
        "bins",
    ),
    ("plotting_widgets", "frequency_errors a list", lambda t: _plot("frequency_errors")([1.0]), TypeError, "errors"),
    (
        "plotting_widgets",
        "noam_schedule_plot steps 0",
        lambda t: _plot("noam_schedule_plot")(steps=0),
        ValueError,
        "steps",
    ),
    (
        "plotting_widgets",
        "noam_schedule_plot one flat pair",
        lambda t: _plot("noam_schedule_plot")(settings=(512, 4000)),
        ValueError,
        "settings",
    ),
    (
        "plotting_widgets",
        "label_smoothing_plot labels a string",
        lambda t: _plot("label_smoothing_plot")("abc", 1),
        TypeError,
        "labels",
    ),
    (
        "plotting_widgets",
        "cross_attention_maps item a tensor",
        lambda t: _plot("cross_attention_maps")([torch.rand(2, 3)]),
        TypeError,
        "maps",
    ),
    (
        "plotting_widgets",
        "cross_attention_maps n_cols 0",
        lambda t: _plot("cross_attention_maps")([(torch.rand(2, 3), list("abc"), ["x", "y"], "t")], n_cols=0),
        ValueError,
        "n_cols",
    ),
    (
        "plotting_widgets",
        "normalization_axes_cube batch 0",
        lambda t: _plot("normalization_axes_cube")(batch=0),
        ValueError,
        "batch",
    ),
    (
        "plotting_widgets",
        "normalization_statistics feature_limit 0",
        lambda t: _plot("normalization_statistics")(x(2, 3, 8), feature_limit=0),
        ValueError,
        "feature_limit",
    ),
    (
        "plotting_widgets",
        "activation_functions x_range reversed",
        lambda t: _plot("activation_functions")(x_range=(4.0, -4.0)),
        ValueError,
        "x_range",
    ),
    (
        "plotting_widgets",
        "activation_functions a string",
        lambda t: _plot("activation_functions")("relu"),
        TypeError,
        "names",
    ),
    (
        "plotting_widgets",
        "gradient_norms_per_layer a list",
        lambda t: _plot("gradient_norms_per_layer")([1.0, 2.0]),
        TypeError,
        "series",
    ),
    (
        "plotting_widgets",
        "batch_norm_explorer features 0",
        lambda t: _widget("batch_norm_explorer")(x(3, 4, 8), torch.ones(3, 4, dtype=torch.bool), features=0),
        ValueError,
        "features",
    ),
]

CASES: list[Case] = MASKS + KV_CACHE + DTYPES_DEVICES + HELPERS + CHECKPOINTS + PLOTTING + SIZES + PROBED
KINDS = ("masks", "kv_cache", "dtype_device", "helpers", "checkpoints", "plotting_widgets", "sizes")


@pytest.mark.parametrize(
    ("call", "error", "names"), [pytest.param(c[2], c[3], c[4], id=f"{c[0]}: {c[1]}") for c in CASES]
)
def test_misuse_raises_a_clear_error(
    call: Callable[[Path], object], error: type[BaseException], names: str, tmp_path: Path
) -> None:
    import matplotlib.pyplot as plt

    try:
        with pytest.raises(error) as caught:
            call(tmp_path)
    finally:
        plt.close("all")
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    assert names in str(caught.value), f"the message does not name {names!r}: {caught.value}"


def test_every_kind_has_enough_cases() -> None:
    counts = {kind: sum(c[0] == kind for c in CASES) for kind in KINDS}
    assert all(n >= 15 for n in counts.values()), counts
    assert 2 * len(PRECISION_CASES) >= 15  # each in float16 and bfloat16
    assert len(CASES) + 2 * len(PRECISION_CASES) >= 250


# ------------------------------------------------------------------------------------------- precision
#
# Tolerances of the explicit vs fast path in reduced precision (outputs of O(1) size): float16 5e-3, bfloat16
# 3e-2 absolute (a few units in the last place: float16 has 11 significant bits, bfloat16 8).

TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _paths(module: nn.Module, call: Callable[[nn.Module], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    tl.record_attention(module, True)
    explicit = call(module)
    tl.record_attention(module, False)
    fast = call(module)
    tl.record_attention(module, True)
    return explicit, fast


def _mha_rows_masked(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = tl.MultiHeadAttention(D, H).to(dtype).eval()
    q, kv = x(2, 4, D, dtype=dtype), x(2, 5, D, dtype=dtype)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # a fully masked query row
    mask[1] = False  # a fully masked batch row
    return _paths(m, lambda mod: mod(q, kv, kv, mask))


def _sdpa_large(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # |q . k| up to 64 * 300 * 300 overflows float16 (65504) unless computed in float32.
    q, k, v = (
        (x(1, 2, 3, 64, dtype=torch.float32) * 300).to(dtype),
        (x(1, 2, 5, 64) * 300).to(dtype),
        x(1, 2, 5, 64, dtype=dtype),
    )
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2] = False
    explicit, _ = tl.scaled_dot_product_attention(q, k, v, mask)
    return explicit, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _layer_norm_offset(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Large mean, small spread: float16 statistics of x*x collapse; float32 statistics do not.
    inp = (x(4, 64) * 0.5 + 300).to(dtype)
    ours = tl.LayerNorm(64).to(dtype)
    return ours(inp), nn.LayerNorm(64).to(dtype)(inp)


def _layer_norm_fused(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inp = x(3, 5, D, dtype=dtype) * 4
    norm = tl.LayerNorm(D).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    explicit = norm(inp)
    norm.fused = True
    return explicit, norm(inp)


def _encoder_layer(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = tl.EncoderLayer(D, H, FF, dropout=0.0).to(dtype).eval()
    mask = tl.padding_mask(padded(3, 4), 0)
    inp = x(3, 4, D, dtype=dtype)
    return _paths(layer, lambda mod: mod(inp, mask))


def _decoder_layer(dtype: torch.dtype, norm_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = tl.DecoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first).to(dtype).eval()
    tgt_mask = tl.target_mask(padded(3, 4), 0)
    mem_mask = tl.padding_mask(padded(3, 5), 0)
    a, m = x(3, 4, D, dtype=dtype), x(3, 5, D, dtype=dtype)
    return _paths(layer, lambda mod: mod(a, m, tgt_mask, mem_mask))


def _transformer(dtype: torch.dtype, norm_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    config = tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=2, dropout=0.0, norm_first=norm_first)
    m = tl.Transformer(config).to(dtype).eval()
    src, tgt = padded(3, 5), padded(3, 4)
    src_mask = tl.padding_mask(src, 0)
    return _paths(m, lambda mod: torch.log_softmax(mod(src, tgt, src_mask).float(), -1).to(dtype))


def _transformer_all_masked(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = (
        tl.Transformer(tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=1, dropout=0.0))
        .to(dtype)
        .eval()
    )
    src = tok(2, 3)
    src_mask = torch.tensor([True, False]).view(2, 1, 1, 1)  # row 1: no visible source at all
    return _paths(m, lambda mod: mod(src, tok(2, 2), src_mask))


PRECISION_CASES = {
    "sdpa scores beyond float16 range, masked row": _sdpa_large,
    "mha fully masked rows": _mha_rows_masked,
    "LayerNorm large offset vs nn.LayerNorm": _layer_norm_offset,
    "LayerNorm explicit vs fused": _layer_norm_fused,
    "EncoderLayer padded": _encoder_layer,
    "DecoderLayer Pre-Norm": functools.partial(_decoder_layer, norm_first=True),
    "DecoderLayer Post-Norm": functools.partial(_decoder_layer, norm_first=False),
    "Transformer Pre-Norm": functools.partial(_transformer, norm_first=True),
    "Transformer Post-Norm": functools.partial(_transformer, norm_first=False),
    "Transformer source fully masked": _transformer_all_masked,
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(PRECISION_CASES))
def test_reduced_precision_paths_agree(case: str, dtype: torch.dtype) -> None:
    explicit, fast = PRECISION_CASES[case](dtype)
    assert explicit.dtype == dtype and fast.dtype == dtype
    assert torch.isfinite(explicit).all() and torch.isfinite(fast).all()
    scale = max(1.0, float(fast.float().abs().max()))
    torch.testing.assert_close(explicit.float(), fast.float(), atol=TOL[dtype] * scale, rtol=0)


def test_half_precision_layer_norm_matches_float32_statistics() -> None:
    inp = (x(4, 64) * 0.5 + 300).half()  # values 0.25 apart in float16 near 300: few distinct values
    reference = nn.LayerNorm(64)(inp.float())
    ours = tl.LayerNorm(64).half()(inp).float()
    torch.testing.assert_close(ours, reference, atol=3e-2, rtol=0)  # not collapsed to 0 (or NaN)
    assert ours.std() > 0.5


# ------------------------------------------------------------------------------------------- ways through


def test_conventions_have_a_documented_way_through() -> None:
    m = model()
    src = torch.tensor([[7, 7, 0], [7, 0, 0]])  # every real token is 7
    right = tl.padding_mask(src, 0)
    m.encode(src, right)  # a right padding mask never trips the inverted-padding rule
    odd = torch.tensor([[True, False, False], [True, False, True]])[:, None, None, :]  # True exactly where 5
    odd_src = torch.tensor([[5, 3, 4], [5, 6, 5]])
    with pytest.raises(ValueError, match="check_masks=False"):
        m.encode(odd_src, odd)
    assert torch.isfinite(m.encode(odd_src, odd, check_masks=False)).all()
    blocked = torch.zeros(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="check_masks=False"):
        m(tok(2, 2), tok(2, 2), tgt_mask=blocked)
    assert torch.isfinite(m(tok(2, 2), tok(2, 2), tgt_mask=blocked, check_masks=False)).all()


def test_a_kv_cache_follows_its_memory_through_reorder() -> None:
    m = model()
    memory = m.encode(tok(2, 4))
    cache = m.new_cache()
    m.decode(tok(2, 1), memory, cache=cache)
    index = torch.tensor([1, 1, 0])
    cache.reorder(index)
    m.decode(tok(3, 1), memory.index_select(0, index), cache=cache)  # same values, another tensor: accepted
    assert cache.length == 2


# ------------------------------------------------------------------------------------------- checked once


CHECKED_MODULES = (
    "transformer_lab.model",
    "transformer_lab.decoder",
    "transformer_lab.encoder",
    "transformer_lab.multihead",
    "transformer_lab.attention",
    "transformer_lab._checks",
)


def _count(function: str) -> tuple[list[mock._patch], mock.MagicMock]:
    import importlib

    original = getattr(_checks, function)
    counter = mock.MagicMock(side_effect=original)
    patches = []
    for name in CHECKED_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, function):
            patches.append(mock.patch.object(module, function, counter))
    return patches, counter


@pytest.mark.parametrize("function", ["check_mask", "check_sequence", "check_like_module"])
def test_a_model_call_checks_each_input_once(function: str) -> None:
    m = model()
    src, tgt = padded(3, 4), tok(3, 3)
    patches, counter = _count(function)
    for p in patches:
        p.start()
    try:
        memory = m.encode(src, tl.padding_mask(src, 0))
        before = counter.call_count
        m.decode(tgt, memory, tl.padding_mask(src, 0), tl.causal_mask(3))
        per_decode = counter.call_count - before
    finally:
        for p in patches:
            p.stop()
    # decode checks tgt_mask and src_mask once each (2 layers would have made it 3N + 1 = 7 before).
    expected = {"check_mask": 2, "check_sequence": 1, "check_like_module": 2}[function]
    assert per_decode == expected, counter.call_args_list


def test_a_layer_called_on_its_own_still_checks() -> None:
    patches, counter = _count("check_mask")
    for p in patches:
        p.start()
    try:
        enc_layer()(x(2, 3, D), torch.ones(2, 1, 1, 3, dtype=torch.bool))
        assert counter.call_count == 1
        mha()(x(2, 3, D), x(2, 3, D), x(2, 3, D), torch.ones(3, 3, dtype=torch.bool))
        assert counter.call_count == 2
    finally:
        for p in patches:
            p.stop()
    with pytest.raises(ValueError, match="mask"):
        enc_layer()(x(2, 3, D), torch.ones(2, 1, 1, 4, dtype=torch.bool))


def test_token_checks_read_back_once_per_call() -> None:
    m = model()
    calls = []
    original = torch.Tensor.tolist

    def counting(self: torch.Tensor) -> object:
        calls.append(self.shape)
        return original(self)

    with mock.patch.object(torch.Tensor, "tolist", counting):
        m(tok(2, 3), tok(2, 3))
    assert len(calls) == 1  # src and tgt ids checked with one read-back for both


# ------------------------------------------------------------------------------------------- one switch


def test_record_attention_is_the_one_switch_and_norm_hooks_fire_on_both_paths() -> None:
    torch.manual_seed(0)
    m = tl.Transformer(tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=1, dropout=0.0)).eval()
    calls: list[str] = []
    m.encoder.layers[0].norm1.register_forward_hook(lambda *_: calls.append("norm1"))
    m.decoder.norm.register_forward_hook(lambda *_: calls.append("final"))
    src, tgt = tok(2, 3), tok(2, 3)
    explicit = m(src, tgt)
    tl.record_attention(m, False)
    norms = [mod for mod in m.modules() if isinstance(mod, tl.LayerNorm)]
    assert norms and all(n.fused for n in norms)
    assert all(not a.record_weights for a in m.modules() if isinstance(a, tl.MultiHeadAttention))
    fast = m(src, tgt)
    tl.record_attention(m, True)
    assert not any(n.fused for n in norms)
    assert calls == ["norm1", "final"] * 2
    torch.testing.assert_close(explicit, fast, atol=1e-5, rtol=1e-5)


def test_a_layer_norm_subclass_keeps_its_own_forward_on_the_fast_path() -> None:
    class Scaled(tl.LayerNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    layer = tl.EncoderLayer(D, H, FF, dropout=0.0).eval()
    layer.norm1 = Scaled(D)
    inp = x(2, 3, D)
    explicit = layer(inp)
    tl.record_attention(layer, False)
    assert layer.norm1.fused
    torch.testing.assert_close(layer(inp), explicit, atol=1e-5, rtol=1e-5)


def test_pickle_of_a_model_still_loads_with_its_flags() -> None:
    m = tl.record_attention(model(), False)
    clone = pickle.loads(pickle.dumps(m))
    tl.record_attention(m, True)
    assert all(n.fused for n in clone.modules() if isinstance(n, tl.LayerNorm))
