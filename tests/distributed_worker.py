"""Trains a tiny model for a few steps with one of the course's trainers; run by tests/test_distributed.py.

    torchrun --nproc_per_node=2 tests/distributed_worker.py gpt|transformer OUT.pt     (data-parallel)
    python tests/distributed_worker.py gpt|transformer OUT.pt                          (one process)

The trainers are called exactly as a single-process script calls them: under torchrun they find the
process group themselves. The model is float64 so that the comparison is exact up to rounding. Rank 0
writes the trained state dict and the history to OUT.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformer_lab as tl  # noqa: E402
from transformer_lab import training  # noqa: E402
from transformer_lab.data import TextTokenizer, split_text  # noqa: E402
from transformer_lab.distributed import is_main_process  # noqa: E402
from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402

STEPS = 4
TEXT = "the cat sat on the mat; the dog sat on the log. " * 40


def train_gpt() -> tuple[torch.nn.Module, dict[str, object]]:
    tokenizer = TextTokenizer.from_text(TEXT)
    train_data, val_data = split_text(tokenizer.encode(TEXT))
    torch.manual_seed(0)
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=2)).double()
    history = training.train_gpt(
        model, train_data, val_data, steps=STEPS, batch_size=5, lr=1e-2, warmup=1, eval_every=2, progress=False
    )
    return model, history.to_dict()


def train_transformer() -> tuple[torch.nn.Module, dict[str, object]]:
    tokenizer = tl.data.CharTokenizer()
    task = tl.data.make_task("copy")
    config = tl.TransformerConfig(
        tokenizer.vocab_size, tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=64, dropout=0.0
    )
    model = training.build_model(config, seed=0).double()
    history = training.train(
        model, task, tokenizer, steps=STEPS, batch_size=5, warmup=2, eval_every=STEPS, eval_examples=4, progress=False
    )
    return model, history.to_dict()


def main(kind: str, out: str) -> None:
    torch.set_num_threads(1)
    model, history = {"gpt": train_gpt, "transformer": train_transformer}[kind]()
    if is_main_process():
        torch.save({"state_dict": model.state_dict(), "history": history}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
