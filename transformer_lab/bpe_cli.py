"""`tl-bpe`: train a byte-level BPE tokenizer, encode and decode with it (chapter 12).

    tl-bpe train --corpus shakespeare --vocab-size 4096 --out tokenizers/shakespeare
    tl-bpe train --corpus tang --vocab-size 4096 --pattern gpt4 --special "<|endoftext|>" --out tokenizers/tang
    tl-bpe encode tokenizers/shakespeare --text "To be, or not to be"        # prints the ids
    tl-bpe decode tokenizers/shakespeare 396 304 11 529 321 287 304           # prints the text

(`python -m transformer_lab.bpe_cli ...` is the same.) `train` writes vocab.json, merges.txt and tokenizer.json
(`ByteBPE.save`); `encode` and `decode` read a directory or a tokenizer.json (`ByteBPE.load`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from transformer_lab.bpe import SPLIT_PATTERNS, ByteBPE

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tl-bpe", description="Train a byte-level BPE tokenizer (chapter 12), encode text, decode ids."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    t = commands.add_parser("train", help="learn merges from a text and write the tokenizer's files")
    t.add_argument("--corpus", required=True, help="a shipped corpus (shakespeare, tang) or a UTF-8 text file")
    t.add_argument("--vocab-size", type=int, required=True, help="256 bytes + merges + special tokens")
    t.add_argument(
        "--pattern", default="gpt2", help=f"split pattern: {' or '.join(SPLIT_PATTERNS)} or a regular expression"
    )
    t.add_argument("--special", action="append", default=[], metavar="TOKEN", help="a special token (repeatable)")
    t.add_argument(
        "--split",
        choices=("train", "all"),
        default="train",
        help="train on the first 90%% of the text, as the models do (default), or on all of it",
    )
    t.add_argument("--out", required=True, help="directory to write vocab.json, merges.txt and tokenizer.json to")

    e = commands.add_parser("encode", help="print the token ids of a text, space-separated")
    e.add_argument("tokenizer", help="a directory that `train` wrote, or a tokenizer.json")
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to encode")
    source.add_argument("--file", help="a UTF-8 file to encode")
    e.add_argument(
        "--allowed-special",
        nargs="*",
        default=[],
        metavar="TOKEN",
        help="special tokens to encode as their id ('all' for every one); others in the text are an error",
    )

    d = commands.add_parser("decode", help="print the text of token ids")
    d.add_argument("tokenizer", help="a directory that `train` wrote, or a tokenizer.json")
    d.add_argument("ids", nargs="*", help="token ids (or use --file)")
    d.add_argument("--file", help="a file of whitespace-separated ids")
    d.add_argument(
        "--errors",
        choices=("replace", "strict", "ignore", "backslashreplace"),
        default="replace",
        help="what to do with bytes that are not whole UTF-8 characters (default replace: U+FFFD)",
    )
    return parser


def _train(args: argparse.Namespace) -> int:
    from transformer_lab.data import load_corpus, split_text  # imports torch: only for this command

    text = load_corpus(args.corpus)
    held_out = ""
    if args.split == "train":
        text, held_out = split_text(text)
    start = time.perf_counter()
    tokenizer = ByteBPE.train(text, args.vocab_size, pattern=args.pattern, special_tokens=args.special)
    seconds = time.perf_counter() - start
    paths = tokenizer.save(args.out)
    print(
        f"trained {len(tokenizer.merges)} merges on {len(text.encode('utf-8')):,} bytes in {seconds:.1f} s: "
        f"vocabulary {tokenizer.vocab_size} ({tokenizer!r})"
    )
    if held_out:
        n_bytes, n_tokens = len(held_out.encode("utf-8")), len(tokenizer.encode_ordinary(held_out))
        print(f"held-out 10%: {n_bytes:,} bytes -> {n_tokens:,} tokens, {n_bytes / n_tokens:.2f} bytes per token")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _encode(args: argparse.Namespace) -> int:
    tokenizer = ByteBPE.load(args.tokenizer)
    text = args.text if args.text is not None else Path(args.file).read_text(encoding="utf-8")
    allowed = "all" if args.allowed_special == ["all"] else set(args.allowed_special)
    print(" ".join(map(str, tokenizer.encode(text, allowed_special=allowed))))
    return 0


def _decode(args: argparse.Namespace) -> int:
    tokenizer = ByteBPE.load(args.tokenizer)
    words = list(args.ids) + (Path(args.file).read_text(encoding="utf-8").split() if args.file else [])
    try:
        ids = [int(word) for word in words]
    except ValueError:
        raise SystemExit(f"ids must be whole numbers separated by spaces, got {' '.join(words)[:80]!r}") from None
    sys.stdout.write(tokenizer.decode(ids, errors=args.errors) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`tl-bpe train | encode | decode` (see --help). Returns the exit status; bad input exits with its message."""
    args = build_parser().parse_args(argv)
    command = {"train": _train, "encode": _encode, "decode": _decode}[args.command]
    try:
        return command(args)
    except (ValueError, TypeError, FileNotFoundError, UnicodeDecodeError) as error:
        raise SystemExit(f"tl-bpe {args.command}: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
