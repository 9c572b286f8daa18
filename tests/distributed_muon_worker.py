"""Trains a tiny GPT with Muon for a few steps; run by tests/test_distributed_muon.py.

    torchrun --nproc_per_node=2 tests/distributed_muon_worker.py OUT     (data-parallel)
    python tests/distributed_muon_worker.py OUT                          (one process)

`train_gpt(..., optimizer="muon")` is called exactly as a single-process script calls it: under torchrun it
finds the process group itself. The model is float64 (so Newton-Schulz runs in float64 too) and the
comparison is exact up to rounding. EVERY process writes its trained state dict, the initial one and the
history to OUT.rank<r>.pt, so that the test can check that the processes agree with each other.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformer_lab import training  # noqa: E402
from transformer_lab.data import TextTokenizer, split_text  # noqa: E402
from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402

STEPS = 4
TEXT = "the cat sat on the mat; the dog sat on the log. " * 40


def main(out: str) -> None:
    torch.set_num_threads(1)
    tokenizer = TextTokenizer.from_text(TEXT)
    train_data, val_data = split_text(tokenizer.encode(TEXT))
    torch.manual_seed(0)
    config = GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=2, tie_embeddings=False)
    model = GPT(config).double()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    history = training.train_gpt(
        model, train_data, val_data, steps=STEPS, batch_size=5, lr=1e-2, warmup=1, eval_every=2, progress=False,
        optimizer="muon", muon_lr=0.05, muon_weight_decay=0.1,
    )  # fmt: skip
    rank = int(os.environ.get("RANK", "0"))
    torch.save(
        {"state_dict": model.state_dict(), "initial": initial, "history": history.to_dict()}, f"{out}.rank{rank}.pt"
    )


if __name__ == "__main__":
    main(sys.argv[1])
