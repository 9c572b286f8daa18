"""Chapter 12's shipped models: characters against byte-level BPE tokens, trained at equal CPU time (issue 25).

    OMP_NUM_THREADS=1 python benchmarks/bpe_models.py                       # both corpora, 150 CPU s per model
    OMP_NUM_THREADS=1 python benchmarks/bpe_models.py --corpus tang         # one corpus (its part of the JSON)
    OMP_NUM_THREADS=1 python benchmarks/bpe_models.py --seconds 20 --no-write   # a smoke run, nothing written

For each corpus (Tiny Shakespeare, the Tang poems) it trains chapter 11's "full modern" GPT twice on the same
training split, once on characters (`tl.data.TextTokenizer`, one id per distinct character) and once on
byte-level BPE tokens (`tl.bpe.ByteBPE`, GPT-2's split pattern, trained on that split), each for the same
budget of CPU seconds of this process (`train_gpt(seconds=..., clock="cpu")`, one thread): on a machine shared
with other jobs the CPU clock is the fair one, and a slower step (a bigger vocabulary's head) pays with fewer
steps. Everything else is the same: the model (block of 64 TOKENS, so a BPE window holds more text than a
character window: that is part of what the tokenizer buys), the recipe (Muon 0.02 + AdamW 3e-3, 30 warm-up
steps, cosine to 1e-4 over the time, batch 12), the initial seed and the batches' seed. The Tang models draw
half of their windows at the start of a poem (`tl.data.token_starts(..., share=0.5)`), as chapter 10's did.

Vocabularies: Shakespeare 1,024 tokens (a 1 MB text: at 4,096 many tokens are seen only a few times, and the
head costs more per position), the Tang poems 4,096 (fewer than the 5,711 characters of the character model).

Measured on the checkpoints as saved (float16, reloaded with `load_gpt`), and written to
transformer_lab/assets/bpe_models.json, which chapter 12 prints:

- bits per byte over the whole validation split (the last 10 % of the characters, `split_text`): the summed
  cross-entropy of every token but the first, in bits, over the UTF-8 bytes of those tokens. Consecutive windows
  of 64 tokens, and one last window for the tail that fills no whole window. Unlike a loss per token, it does
  not depend on how much text a token holds, so models with different vocabularies can be compared;
- for the Tang models, the poem-form rate of chapter 10 (4 or 8 lines of five characters, "，" and "。" in
  turn) and the verbatim-copy rate of 1,000 samples (sampler seeds 0-4, 200 each, temperature 1.0, from a
  prompt of one newline, 63 new tokens, cut at the next newline);
- steps, CPU and wall seconds of training, parameters, file size.

Checkpoints: transformer_lab/assets/gpt_char_<corpus>.pt and gpt_bpe_<corpus>.pt (float16, tokenizer embedded).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from transformer_lab import data, training  # noqa: E402
from transformer_lab.bpe import ByteBPE  # noqa: E402
from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402

ASSETS = ROOT / "transformer_lab" / "assets"
RESULTS = ASSETS / "bpe_models.json"
BLOCK = 64
VOCAB_SIZES = {"shakespeare": 1024, "tang": 4096}
#: chapter 11's "full modern" GPT (everything but the vocabulary)
MODERN = dict(
    block_size=BLOCK, d_model=128, n_heads=4, n_layers=4, dropout=0.0, bias=False, tie_embeddings=False,
    positions="rope", norm="rms_no_weight", embedding_norm=True, qk_norm="rms_no_weight", activation="relu2",
    logit_softcap=15.0, zero_init_output=True,
)  # fmt: skip
#: chapter 11's recipe; the length is a CPU-time budget, `steps` only an upper bound
RECIPE = dict(optimizer="muon", muon_lr=0.02, lr=3e-3, min_lr=1e-4, warmup=30, batch_size=12)
NEWLINE_SHARE = 0.5  # Tang: the share of windows that begin at a poem's start
POEM_SAMPLES, POEM_SEEDS, NEW_TOKENS = 200, range(5), 63

LINE = "[^，。\n]{5}"
POEM = re.compile(f"(?:{LINE}，{LINE}。){{2}}|(?:{LINE}，{LINE}。){{4}}")  # chapter 10's measure


def token_byte_lengths(tokenizer: data.TextTokenizer | ByteBPE) -> torch.Tensor:
    """(V,) the number of UTF-8 bytes each token id stands for."""
    if isinstance(tokenizer, ByteBPE):
        return torch.tensor([len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)])
    return torch.tensor([len(c.encode("utf-8")) for c in tokenizer.chars])


@torch.no_grad()
def bits_per_byte(model: GPT, ids: torch.Tensor, byte_lengths: torch.Tensor, block: int = BLOCK) -> dict[str, float]:
    """Bits per byte of `model` over every token of `ids` but the first (see the module's docstring)."""
    model.eval()
    windows = (len(ids) - 1) // block
    x = ids[: windows * block].view(windows, block)  # (W, block)
    y = ids[1 : windows * block + 1].view(windows, block)  # (W, block)
    nats = 0.0
    for start in range(0, windows, 128):
        logits = model(x[start : start + 128])  # (b, block, V)
        nats += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[start : start + 128].flatten(),
                                                  reduction="sum").double().item()
    tail = len(ids) - 1 - windows * block  # predictions no whole window made
    if tail:
        last = ids[-block - 1 :]  # one window ending at the last token; only its last `tail` predictions count
        logits = model(last[:-1][None])[0, -tail:]  # (tail, V)
        nats += torch.nn.functional.cross_entropy(logits, last[-tail:], reduction="sum").double().item()
    n_bytes = int(byte_lengths[ids[1:]].sum())
    return {"bits_per_byte": nats / math.log(2) / n_bytes, "nats_per_token": nats / (len(ids) - 1),
            "predicted_tokens": len(ids) - 1, "predicted_bytes": n_bytes}  # fmt: skip


def poem_rates(model: GPT, tokenizer: data.TextTokenizer | ByteBPE, corpus: set[str]) -> dict[str, float]:
    """Chapter 10's poem-form and verbatim-copy rates over POEM_SAMPLES x len(POEM_SEEDS) samples."""
    newline = torch.as_tensor(tokenizer.encode("\n"))  # (1,)
    samples = []
    for seed in POEM_SEEDS:
        out = model.generate(newline.repeat(POEM_SAMPLES, 1), NEW_TOKENS, temperature=1.0,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
        samples += [tokenizer.decode(row[1:].tolist()).split("\n")[0] for row in out]
    return {"poem_form": sum(POEM.fullmatch(s) is not None for s in samples) / len(samples),
            "verbatim_copy": sum(s in corpus for s in samples) / len(samples), "samples": len(samples)}  # fmt: skip


def train_one(name: str, corpus: str, tokenizer: Any, train_text: str, val_text: str, seconds: float,
              write: bool, progress: bool) -> dict[str, Any]:  # fmt: skip
    encode = (lambda s: torch.tensor(tokenizer.encode(s))) if isinstance(tokenizer, ByteBPE) else tokenizer.encode
    train_ids, val_ids = encode(train_text), encode(val_text)
    starts = None
    if corpus == "tang":
        newline = int(encode("\n")[0])
        starts = data.token_starts(train_ids, newline, BLOCK, share=NEWLINE_SHARE)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **MODERN)
    torch.manual_seed(0)
    model = GPT(config)
    wall = time.perf_counter()
    history = training.train_gpt(model, train_ids, val_ids, steps=1_000_000, eval_every=1_000_000, seed=0,
                                 starts=starts, seconds=seconds, clock="cpu", progress=progress, **RECIPE)  # fmt: skip
    wall = time.perf_counter() - wall
    path = ASSETS / f"gpt_{name}_{corpus}.pt"
    if not write:
        path = Path(os.environ.get("TMPDIR", "/tmp")) / path.name
    recipe = {**RECIPE, "seconds": seconds, "clock": "cpu", "block": BLOCK, "seed": 0,
              "newline_share": NEWLINE_SHARE if starts is not None else None}  # fmt: skip
    training.save_gpt(model, path, tokenizer, half=True, recipe=recipe, made_by="python benchmarks/bpe_models.py",
                      history={"steps": history.step[-1], "train_loss": history.loss[-1],
                               "val_loss_per_token": history.val_loss[-1]})  # fmt: skip
    shipped, shipped_tokenizer = training.load_gpt(path)  # what the notebook measures: the float16 weights
    figures = bits_per_byte(shipped, encode(val_text), token_byte_lengths(shipped_tokenizer))
    figures.update(
        steps=history.step[-1], cpu_seconds=round(history.eval_seconds[-1], 1), wall_seconds=round(wall, 1),
        vocab_size=tokenizer.vocab_size, parameters=sum(p.numel() for p in shipped.parameters()),
        file=path.name, file_megabytes=round(path.stat().st_size / 1e6, 2),
        train_tokens=len(train_ids), val_tokens=len(val_ids),
    )  # fmt: skip
    print(f"{corpus:>11} {name}: {figures['steps']} steps in {figures['cpu_seconds']} CPU s "
          f"({figures['wall_seconds']} s wall), {figures['bits_per_byte']:.4f} bits per byte", flush=True)  # fmt: skip
    return figures


def run_corpus(corpus: str, seconds: float, write: bool, progress: bool) -> dict[str, Any]:
    text = data.load_corpus(corpus)
    train_text, val_text = data.split_text(text)
    chars = data.TextTokenizer.from_text(text)  # chapter 10's: every character of the corpus
    started = time.process_time()
    bpe = ByteBPE.train(train_text, VOCAB_SIZES[corpus])  # GPT-2's split pattern, the training split only
    bpe_seconds = time.process_time() - started
    print(f"{corpus:>11} BPE: {bpe.vocab_size} tokens trained in {bpe_seconds:.1f} CPU s", flush=True)
    result: dict[str, Any] = {"val_bytes": len(val_text.encode("utf-8")), "val_characters": len(val_text),
                              "bpe_training_cpu_seconds": round(bpe_seconds, 1)}  # fmt: skip
    for name, tokenizer in (("char", chars), ("bpe", bpe)):
        result[name] = train_one(name, corpus, tokenizer, train_text, val_text, seconds, write, progress)
        if corpus == "tang":
            model, tok = training.load_gpt(ASSETS / result[name]["file"] if write else
                                           Path(os.environ.get("TMPDIR", "/tmp")) / result[name]["file"])  # fmt: skip
            poems = {p for p in text.split("\n") if p}
            result[name].update(poem_rates(model, tok, poems))
            print(f"{corpus:>11} {name}: poem form {result[name]['poem_form']:.1%}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["shakespeare", "tang", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=150.0, help="CPU seconds of training per model")
    parser.add_argument("--no-write", action="store_true", help="write nothing under transformer_lab/assets")
    parser.add_argument("--progress", action="store_true", help="show progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    corpora = ["shakespeare", "tang"] if args.corpus == "both" else [args.corpus]
    results = {corpus: run_corpus(corpus, args.seconds, not args.no_write, args.progress) for corpus in corpora}
    if args.no_write:
        print(json.dumps(results, indent=1))
        return 0
    previous = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
    previous.setdefault("corpora", {}).update(results)
    previous.update(
        made_by="OMP_NUM_THREADS=1 python benchmarks/bpe_models.py",
        seconds_per_model=args.seconds, clock="cpu (time.process_time, one thread)",
        model=MODERN, recipe=RECIPE, vocab_sizes=VOCAB_SIZES,
        machine=f"{platform.machine()} {platform.processor() or ''}".strip() + f", {os.cpu_count()} logical CPUs",
        torch=torch.__version__, date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )  # fmt: skip
    RESULTS.write_text(json.dumps(previous, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
