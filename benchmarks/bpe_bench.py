"""Chapter 12's byte-level BPE: training time, encoding speed and compression, each against a reference (issue 25).

    python benchmarks/bpe_bench.py                            # the full run (several minutes: the direct trainer)
    python benchmarks/bpe_bench.py --quick                    # direct trainer to 1,024 tokens, 1 repeat
    python benchmarks/bpe_bench.py --direct-vocab-size 2048 --repeats 5 --out results.md

Measures, in one process, on one thread (OMP_NUM_THREADS=1, RAYON_NUM_THREADS=1 for Hugging Face's Rust):

1. training: `ByteBPE.train` (incremental pair counts) on the whole of Tiny Shakespeare to a 4,096-token vocabulary
   (target <= 30 s), against `ByteBPE._train_direct` (recounts every pair before each merge) at
   --direct-vocab-size (default 4,096; the ratio is taken at that size, both trainers measured there), and
   Hugging Face `tokenizers`' `BpeTrainer` at 4,096 for scale. Each trainer's merges are compared with the
   others' (the same, or the table says not);
2. encoding: MB of UTF-8 per second of `ByteBPE.encode_ordinary` over the whole corpus (Tiny Shakespeare with
   its 4,096 tokenizer, and the Tang poems with theirs), cold (a fresh tokenizer: an empty chunk cache) and
   warm (the same tokenizer again), against tiktoken's `Encoding` built from the same merge ranks, and HF's
   `Tokenizer` from our tokenizer.json; the variants run interleaved, --repeats times, medians reported;
3. compression: bytes per token on each corpus's validation split (`split_text`: the last 10 %), our trainer
   against HF's `BpeTrainer`, both trained on the training split to the same vocabulary size.

Times are wall-clock seconds and, beside them, the CPU seconds of this process (`time.process_time`), which a
machine shared with other jobs inflates less. The table is printed and written to --out (default
benchmarks/results/bpe-<machine>.md). Needs tiktoken and tokenizers (requirements-test.txt pins them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # Hugging Face tokenizers' thread pool: one thread, as ours
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tiktoken  # noqa: E402
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from transformer_lab.bpe import GPT2_SPLIT_PATTERN, ByteBPE, _to_unicode  # noqa: E402
from transformer_lab.data import load_corpus, split_text  # noqa: E402

TARGET_TRAIN_SECONDS = 30.0
VOCAB_SIZE = 4096


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def hf_train(text: str, vocab_size: int, pattern: str) -> Tokenizer:
    """Hugging Face's trainer set up as ours: the same split, all 256 bytes, no special tokens."""
    tokenizer = Tokenizer(models.BPE())
    if pattern == GPT2_SPLIT_PATTERN:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator([text], trainer)  # one item: the split sees the whole text, as ours
    return tokenizer


def hf_merges(tokenizer: Tokenizer) -> list[tuple[str, str]]:
    return [tuple(m) for m in json.loads(tokenizer.to_str())["model"]["merges"]]  # type: ignore[misc]


def our_merges(tokenizer: ByteBPE) -> list[tuple[str, str]]:
    return [(_to_unicode(tokenizer.token_bytes(a)), _to_unicode(tokenizer.token_bytes(b))) for a, b in tokenizer.merges]


def as_tiktoken(tokenizer: ByteBPE) -> tiktoken.Encoding:
    ranks = {token: i for i, token in tokenizer.tokens.items()}  # ids are merge order: rank = id
    return tiktoken.Encoding(name="bench", pat_str=tokenizer.pattern, mergeable_ranks=ranks, special_tokens={})


# --------------------------------------------------------------------------- 1. training


def training(text: str, direct_size: int, repeats: int) -> dict[str, Any]:
    runs = [timed(lambda: ByteBPE.train(text, VOCAB_SIZE)) for _ in range(repeats)]
    ours = runs[0][0]
    out: dict[str, Any] = {
        "ours": (statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs)),
        "tokenizer": ours,
    }
    print(f"  incremental to {VOCAB_SIZE}: {out['ours'][0]:.1f} s", flush=True)
    if direct_size == VOCAB_SIZE:
        out["ours_at_direct"] = out["ours"]
        same_size = ours
    else:
        same_size, *times = timed(lambda: ByteBPE.train(text, direct_size))
        out["ours_at_direct"] = tuple(times)
    direct, *times = timed(lambda: ByteBPE._train_direct(text, direct_size))
    out["direct"] = tuple(times)
    out["direct_same"] = direct.merges == same_size.merges and direct.merge_counts == same_size.merge_counts
    print(f"  direct to {direct_size}: {out['direct'][0]:.1f} s", flush=True)
    hf, *times = timed(lambda: hf_train(text, VOCAB_SIZE, GPT2_SPLIT_PATTERN))
    out["hf"] = tuple(times)
    out["hf_same"] = hf_merges(hf) == our_merges(ours)
    return out


# --------------------------------------------------------------------------- 2. encoding


def encoding(text: str, tokenizer: ByteBPE, repeats: int) -> dict[str, Any]:
    encoder = as_tiktoken(tokenizer)
    with tempfile.TemporaryDirectory() as directory:
        hf = Tokenizer.from_file(str(tokenizer.save(directory)["tokenizer"]))
    warm = ByteBPE.from_dict(tokenizer.to_dict())
    expected = warm.encode_ordinary(text)  # also fills warm's cache
    variants: dict[str, Callable[[], list[int]]] = {
        "ours, cold cache": lambda: ByteBPE.from_dict(tokenizer.to_dict()).encode_ordinary(text),
        "ours, warm cache": lambda: warm.encode_ordinary(text),
        "tiktoken": lambda: encoder.encode_ordinary(text),
        "HF tokenizers": lambda: hf.encode(text, add_special_tokens=False).ids,
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):  # interleaved, in a rotating order: load hits every variant alike
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            ids, wall, _ = timed(variants[name])
            assert ids == expected, f"{name} gave other ids"
            seconds[name].append(wall)
    megabytes = len(text.encode("utf-8")) / 1e6
    return {
        "MB": megabytes,
        "tokens": len(expected),
        "MB/s": {name: megabytes / statistics.median(s) for name, s in seconds.items()},
    }


# --------------------------------------------------------------------------- 3. compression


def compression(name: str, pattern: str) -> dict[str, Any]:
    train, validation = split_text(load_corpus(name))
    ours, *ours_times = timed(lambda: ByteBPE.train(train, VOCAB_SIZE, pattern=pattern))
    hf, *hf_times = timed(lambda: hf_train(train, VOCAB_SIZE, ours.pattern))
    n_bytes = len(validation.encode("utf-8"))
    ours_tokens = len(ours.encode_ordinary(validation))
    hf_tokens = len(hf.encode(validation, add_special_tokens=False).ids)
    mine, theirs = our_merges(ours), hf_merges(hf)
    first_difference = next((k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    print(f"  compression {name}/{pattern}: {n_bytes / ours_tokens:.3f} / {n_bytes / hf_tokens:.3f}", flush=True)
    return {
        "corpus": name,
        "pattern": pattern,
        "bytes": n_bytes,
        "ours": n_bytes / ours_tokens,
        "hf": n_bytes / hf_tokens,
        "same_merges": mine == theirs,
        "first_difference": first_difference,
        "train_seconds": (ours_times[0], hf_times[0]),
        "tokenizer": ours,
    }


# --------------------------------------------------------------------------- report


def machine_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1]
                break
    except OSError:
        pass
    return "cpu-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def report(args: argparse.Namespace, train: dict[str, Any], enc: dict[str, dict], comp: list[dict]) -> list[str]:
    wall, cpu = train["ours"]
    lines = [
        "| training on Tiny Shakespeare (1,115,394 bytes), one thread | vocabulary | wall s | CPU s | "
        "same merges as ours |",
        "| --- | ---: | ---: | ---: | --- |",
        f"| ours, incremental pair counts (`ByteBPE.train`) | {VOCAB_SIZE:,} | {wall:.1f} | {cpu:.1f} | - |",
    ]
    if args.direct_vocab_size != VOCAB_SIZE:
        w, c = train["ours_at_direct"]
        lines.append(f"| ours, incremental | {args.direct_vocab_size:,} | {w:.1f} | {c:.1f} | - |")
    w, c = train["direct"]
    same = "yes" if train["direct_same"] else "**no**"
    lines.append(f"| direct: recount every pair per merge (`_train_direct`) | {args.direct_vocab_size:,} | {w:.1f} | "
                 f"{c:.1f} | {same} (and the same counts) |")  # fmt: skip
    w, c = train["hf"]
    lines.append(f"| Hugging Face `BpeTrainer` (Rust, 1 thread) | {VOCAB_SIZE:,} | {w:.1f} | {c:.1f} | "
                 f"{'yes' if train['hf_same'] else '**no**'} |")  # fmt: skip
    ratio_wall = train["direct"][0] / train["ours_at_direct"][0]
    ratio_cpu = train["direct"][1] / train["ours_at_direct"][1]
    met = "met" if wall <= TARGET_TRAIN_SECONDS else "**not met**"
    lines += [
        "",
        f"- incremental to {VOCAB_SIZE:,}: {wall:.1f} s wall (target <= {TARGET_TRAIN_SECONDS:.0f} s: {met})",
        f"- direct / incremental at {args.direct_vocab_size:,} tokens: {ratio_wall:.0f}x wall, {ratio_cpu:.0f}x CPU",
        f"- HF's trainer / ours at {VOCAB_SIZE:,}: {train['hf'][0] / wall:.2f}x wall, {train['hf'][1] / cpu:.2f}x CPU",
        "",
        "| encoding the whole corpus, one thread | MB | tokens | ours cold MB/s | ours warm MB/s | tiktoken MB/s | "
        "HF MB/s | tiktoken / ours cold | tiktoken / ours warm |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, e in enc.items():
        r = e["MB/s"]
        cold, warm, tik, hf = r["ours, cold cache"], r["ours, warm cache"], r["tiktoken"], r["HF tokenizers"]
        lines.append(
            f"| {name} ({VOCAB_SIZE:,} tokens) | {e['MB']:.2f} | {e['tokens']:,} | {cold:.2f} | {warm:.2f} | "
            f"{tik:.2f} | {hf:.2f} | {tik / cold:.1f}x | {tik / warm:.1f}x |"
        )
    lines += [
        "",
        "| compression on the validation split (last 10 %), trained on the first 90 % | pattern | bytes | "
        "ours bytes/token | HF BpeTrainer bytes/token | same merges | "
        "train wall s ours / HF (one run, not the median) |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for c in comp:
        same = "yes" if c["same_merges"] else f"no, from merge {c['first_difference']}"
        o, h = c["train_seconds"]
        lines.append(
            f"| {c['corpus']} ({VOCAB_SIZE:,} tokens) | {c['pattern']} | {c['bytes']:,} | {c['ours']:.4f} | "
            f"{c['hf']:.4f} | {same} | {o:.1f} / {h:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="direct trainer to 1,024 tokens, 1 repeat")
    parser.add_argument("--direct-vocab-size", type=int, default=None, help="default 4096 (quick: 1024)")
    parser.add_argument("--repeats", type=int, default=None, help="training and encoding repeats (default 3)")
    parser.add_argument("--patterns", default="gpt2", help="split patterns for the compression table: gpt2,gpt4")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/bpe-<machine>.md")
    parser.add_argument("--note", default="", help="a line about the conditions, written into the results file")
    args = parser.parse_args()
    args.direct_vocab_size = args.direct_vocab_size or (1024 if args.quick else VOCAB_SIZE)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if not 256 < args.direct_vocab_size <= VOCAB_SIZE:
        parser.error(f"--direct-vocab-size must be in (256, {VOCAB_SIZE}]")
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    shakespeare = load_corpus("shakespeare")
    print("training", flush=True)
    train = training(shakespeare, args.direct_vocab_size, args.repeats)
    print("compression", flush=True)
    comp = [compression(name, p) for p in args.patterns.split(",") for name in ("shakespeare", "tang")]
    print("encoding", flush=True)
    tang = next(c["tokenizer"] for c in comp if c["corpus"] == "tang")
    enc = {
        "Tiny Shakespeare": encoding(shakespeare, train["tokenizer"], args.repeats),
        "Tang poems": encoding(load_corpus("tang"), tang, args.repeats),
    }
    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    import regex
    import tokenizers

    lines = [
        f"# Byte-level BPE benchmark: {machine_name()}",
        "",
        f"- date (UTC): {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        f"- command: `python benchmarks/bpe_bench.py {' '.join(sys.argv[1:])}`".replace("  ", " "),
        f"- {os.cpu_count()} logical CPUs visible; one thread everywhere (RAYON_NUM_THREADS=1 for HF)",
        f"- Python {platform.python_version()}, regex {regex.__version__}, tiktoken {tiktoken.__version__}, "
        f"tokenizers {tokenizers.__version__}; split pattern GPT-2's unless the table says; {args.repeats} repeats "
        "(training: median; encoding: interleaved, median)",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
    ]
    if args.note:
        lines.append(f"- note: {args.note}")
    text = "\n".join([*lines, "", *report(args, train, enc, comp)]) + "\n"
    print(text)
    out = args.out or ROOT / "benchmarks" / "results" / f"bpe-{machine_name()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
