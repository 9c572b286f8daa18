"""Muon's cost at chapter 10's size: torch.optim.Muon (bfloat16) against tl.muon.Muon (float32) and AdamW.

    python benchmarks/muon_bench.py [--threads 1] [--repeats 7] [--warmup 2] [--device cpu|cuda] [--out PATH]

The model is chapter 10's GPT (vocabulary 65, block 64, d_model 128, 4 layers, 4 heads, GPT-2's switches),
the batch 12 windows of 64. Three optimizers, each on its own copy of the same model:

- "AdamW": `tl.training.make_adamw` (chapter 10's);
- "Muon, float32 NS": `tl.muon.make_muon`: `tl.muon.Muon` on the blocks' 24 matrices, AdamW on the rest;
- "torch Muon, bfloat16 NS": the same split with `torch.optim.Muon` on the matrices (same hyperparameters).

Two measurements of each, as ratios in one run:

1. the optimizer step alone (`optimizer.step()` on fixed gradients);
2. a whole training step (zero_grad, forward, cross-entropy, backward, gradient clipping, optimizer step).

After `--warmup` untimed rounds, each repeat runs every variant once in an order that rotates between
repeats, so that load from other processes falls on all variants alike; the table gives the medians
(as benchmarks/gpt_bench.py does) of the wall time and of the thread's CPU time (with one thread, what a
step costs even on a shared, loaded machine, where the wall time also counts the waits). Run it from the
repository root.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import device_line, time_once  # noqa: E402 - beside this file: the same timing as the other benchmarks

from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402
from transformer_lab.muon import MuonAdamW, make_muon  # noqa: E402
from transformer_lab.training import make_adamw  # noqa: E402

VOCAB, BLOCK, D_MODEL, LAYERS, HEADS, BATCH = 65, 64, 128, 4, 4, 12
LR, MUON_LR = 1e-3, 0.02


def optimizers(model: GPT) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
    """{name: (its own copy of model, its optimizer)}."""
    variants: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
    adamw_model = copy.deepcopy(model)
    variants["AdamW"] = (adamw_model, make_adamw(adamw_model, LR))
    ours_model = copy.deepcopy(model)
    variants["Muon, float32 NS"] = (ours_model, make_muon(ours_model, MUON_LR, LR))
    torch_model = copy.deepcopy(model)
    split = make_muon(torch_model, MUON_LR, LR)  # the same roles; its Muon replaced by torch's
    group = split.muon.param_groups[0]
    matrices = list(zip(group["param_names"], group["params"], strict=True))  # named, as the AdamW half's are
    torch_muon = torch.optim.Muon(matrices, lr=MUON_LR, weight_decay=0.0, momentum=0.95, nesterov=True)
    variants["torch Muon, bfloat16 NS"] = (torch_model, MuonAdamW(torch_muon, split.adamw))
    return variants


def interleaved(
    variants: dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device
) -> dict[str, tuple[float, float]]:
    """Median (wall seconds, CPU seconds of this thread) of each variant; each repeat runs all of them, in an
    order rotating between repeats. With one torch thread the work runs on this thread, so its CPU time is
    what the step costs even when other processes share the cores (the wall time then also counts waiting)."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cpu = time.thread_time()
            wall = time_once(variants[name], device)
            times[name].append((wall, time.thread_time() - cpu))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in times.items()
    }


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, dict[str, tuple[float, float]]]:
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(VOCAB, block_size=BLOCK, d_model=D_MODEL, n_heads=HEADS, n_layers=LAYERS)).to(device)
    model.train()
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(VOCAB, (BATCH, BLOCK), generator=g).to(device)  # (B, T)
    y = torch.randint(VOCAB, (BATCH, BLOCK), generator=g).to(device)
    variants = optimizers(model)

    def backward(net: nn.Module) -> None:
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())  # (B*T, V) against (B*T,)
        loss.backward()

    def optimizer_step(net: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        backward(net)  # one set of gradients, kept: only the step is timed

        def run() -> None:
            optimizer.step()

        return run

    def training_step(net: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            optimizer.zero_grad(set_to_none=True)
            backward(net)
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()

        return run

    steps = {name: optimizer_step(net, opt) for name, (net, opt) in variants.items()}
    result = {"optimizer step": interleaved(steps, args.repeats, args.warmup, device)}
    steps = {name: training_step(net, opt) for name, (net, opt) in variants.items()}
    result["training step"] = interleaved(steps, args.repeats, args.warmup, device)
    return result


def report(
    args: argparse.Namespace, device: torch.device, result: dict[str, dict[str, tuple[float, float]]], loads: list
) -> str:
    names = list(next(iter(result.values())))
    lines = [
        "# Muon at chapter 10's size: torch.optim.Muon (bfloat16 Newton-Schulz), tl.muon.Muon (float32), AdamW",
        "",
        f"- date (UTC): {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        f"- command: `{' '.join(['python benchmarks/muon_bench.py', *sys.argv[1:]])}`",
        device_line(device),
        f"- torch {torch.__version__}, Python {platform.python_version()}, torch threads {torch.get_num_threads()}",
        f"- GPT: vocabulary {VOCAB}, block {BLOCK}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads; batch {BATCH}; "
        f"{args.repeats} interleaved repeats (median), {args.warmup} warm-up rounds",
        f"- load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]}",
        "",
        "| measurement | " + " | ".join(f"{n} (ms)" for n in names) + " | ours / AdamW | torch / ours |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: | ---: |",
    ]
    for what, times in result.items():
        for clock, i in (("wall", 0), ("CPU", 1)):
            adamw, ours, theirs = (times[n][i] for n in ("AdamW", "Muon, float32 NS", "torch Muon, bfloat16 NS"))
            cells = " | ".join(f"{1000 * times[n][i]:.1f}" for n in names)
            lines.append(f"| {what}, {clock} time | {cells} | {ours / adamw:.2f} | {theirs / ours:.2f} |")
    return "\n".join(lines) + "\n"


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per variant and measurement (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    before = _load()
    result = measure(args, device)
    table = report(args, device, result, [before, _load()])
    print(table)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
