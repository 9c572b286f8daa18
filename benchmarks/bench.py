"""Speed and memory of transformer_lab against PyTorch's own modules (issue 8).

    python benchmarks/bench.py [--threads 2] [--quick] [--device cpu|cuda] [--out PATH]

Measures, in one process and interleaved (each repeat runs every variant once, in a rotating
order, and the table reports medians over repeats):

1. forward + backward time and peak memory of `tl.MultiHeadAttention`, `tl.EncoderLayer`,
   `tl.DecoderLayer` and a full training step (a small `tl.Transformer` with Adam) against
   `nn.MultiheadAttention`, `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer` and
   `nn.Transformer` + embeddings + output Linear, in both of our attention paths: "fast"
   (`record_weights=False`, `F.scaled_dot_product_attention`) and "explicit" (`record_weights=True`,
   the teaching code that forms the weights); at T=128 (with targets) and T=512 (no target);
2. greedy decoding speed (tokens per second) with and without the KV cache, 128 generated tokens.

It prints a markdown table of ratios (ours / torch) and writes it, with the machine's conditions,
to benchmarks/results/<machine>.md (or --out). See benchmarks/README.md for the method.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import transformer_lab as tl  # noqa: E402
from transformer_lab.decoding import greedy_decode  # noqa: E402

BATCH, D_MODEL, HEADS, D_FF = 16, 256, 8, 1024
TARGET_FAST, TARGET_EXPLICIT, TARGET_CACHE = 1.10, 1.5, 5.0
VARIANTS = ("torch", "fast", "explicit")


# --------------------------------------------------------------------------- measuring


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds taken by one call of `fn` (the GPU is synchronised before and after)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of tensor memory allocated during one call of `fn`, above what was live before.

    CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus the bytes
    allocated before the call. CPU: PyTorch has no CPU peak counter, so the call runs under
    `torch.profiler` with `profile_memory=True`, which records every allocation and free of the
    CPU tensor allocator with a timestamp; replaying them in time order gives the live bytes at
    each moment and their maximum. Both count tensors only (not Python objects or allocator
    caching), the same way for ours and torch's.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocations: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            allocations.append((event.start_time_ns, event.extra_fields.alloc_size))  # size < 0 for a free
        stack.extend(event.children)
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


@dataclass
class Case:
    """One comparison: a step function per variant (torch, fast, explicit)."""

    name: str
    length: int
    steps: dict[str, Callable[[], object]]
    target: bool  # whether the T=128 targets apply
    times: dict[str, list[float]] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)


def forward_backward(module: nn.Module, inputs: Callable[[], tuple], call: Callable[..., Tensor]) -> Callable[[], None]:
    """A step: drop old gradients, run forward, backward of the sum of the output."""
    params = list(module.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        args = inputs()
        call(*args).sum().backward()

    return step


# --------------------------------------------------------------------------- the cases


def padding_lengths(batch: int, length: int, generator: torch.Generator) -> Tensor:
    """Row lengths between length/2 and length: a padded batch, as in real training."""
    return torch.randint(length // 2, length + 1, (batch,), generator=generator)


def component_cases(length: int, device: torch.device, dropout: float, seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, length, D_MODEL, generator=g).to(device).requires_grad_()
    memory = torch.randn(BATCH, length, D_MODEL, generator=g).to(device).requires_grad_()
    keep = torch.arange(length)[None, :] < padding_lengths(BATCH, length, g)[:, None]  # (B, S) True = real
    keep = keep.to(device)
    ours_pad = keep[:, None, None, :]  # (B, 1, 1, S), True = may attend
    torch_pad = ~keep  # (B, S), True = blocked (PyTorch's convention)
    ours_causal = tl.causal_mask(length, device=device)  # (T, T), True = may attend
    torch_causal = ~ours_causal  # True = blocked

    def ours(make: Callable[[], nn.Module], fast: bool) -> nn.Module:
        module = make().to(device).train()
        return tl.record_attention(module, not fast)

    inputs_x = lambda: (x,)  # noqa: E731
    inputs_xm = lambda: (x, memory)  # noqa: E731
    cases = []

    # Multi-head self-attention, no mask.
    steps = {}
    mha = nn.MultiheadAttention(D_MODEL, HEADS, dropout=dropout, batch_first=True).to(device).train()
    steps["torch"] = forward_backward(mha, inputs_x, lambda h: mha(h, h, h, need_weights=False)[0])
    for variant in ("fast", "explicit"):
        m = ours(lambda: tl.MultiHeadAttention(D_MODEL, HEADS, dropout), variant == "fast")
        steps[variant] = forward_backward(m, inputs_x, lambda h, m=m: m(h, h, h))
    cases.append(Case("MultiHeadAttention", length, steps, length == 128))

    # Encoder layer (Pre-Norm) with a padding mask.
    steps = {}
    enc = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout, batch_first=True, norm_first=True)
    enc = enc.to(device).train()
    steps["torch"] = forward_backward(enc, inputs_x, lambda h: enc(h, src_key_padding_mask=torch_pad))
    for variant in ("fast", "explicit"):
        m = ours(lambda: tl.EncoderLayer(D_MODEL, HEADS, D_FF, dropout), variant == "fast")
        steps[variant] = forward_backward(m, inputs_x, lambda h, m=m: m(h, ours_pad))
    cases.append(Case("EncoderLayer", length, steps, length == 128))

    # Decoder layer (Pre-Norm): causal self-attention, cross-attention to a padded memory.
    steps = {}
    dec = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, dropout, batch_first=True, norm_first=True)
    dec = dec.to(device).train()
    steps["torch"] = forward_backward(
        dec, inputs_xm, lambda h, mem: dec(h, mem, tgt_mask=torch_causal, memory_key_padding_mask=torch_pad)
    )
    for variant in ("fast", "explicit"):
        m = ours(lambda: tl.DecoderLayer(D_MODEL, HEADS, D_FF, dropout), variant == "fast")
        steps[variant] = forward_backward(m, inputs_xm, lambda h, mem, m=m: m(h, mem, ours_causal, ours_pad))
    cases.append(Case("DecoderLayer", length, steps, length == 128))
    return cases


class TorchSeq2Seq(nn.Module):
    """`nn.Transformer` with what it leaves out: embeddings (times sqrt(d_model)), the sinusoidal
    positional encoding and the output Linear; the same sizes as the `tl.Transformer` it is timed against."""

    def __init__(self, vocab: int, n_layers: int, dropout: float, max_len: int) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(vocab, D_MODEL)
        self.tgt_embed = nn.Embedding(vocab, D_MODEL)
        self.register_buffer("pe", tl.sinusoidal_encoding(max_len, D_MODEL))
        self.dropout = nn.Dropout(dropout)
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first was True"
            warnings.simplefilter("ignore")
            self.transformer = nn.Transformer(
                D_MODEL, HEADS, n_layers, n_layers, D_FF, dropout, batch_first=True, norm_first=True
            )
        self.generator = nn.Linear(D_MODEL, vocab, bias=False)

    def forward(self, src: Tensor, tgt: Tensor, src_blocked: Tensor, tgt_blocked: Tensor) -> Tensor:
        scale = math.sqrt(D_MODEL)
        s = self.dropout(self.src_embed(src) * scale + self.pe[: src.shape[1]])  # (B, S, D)
        t = self.dropout(self.tgt_embed(tgt) * scale + self.pe[: tgt.shape[1]])  # (B, T, D)
        out = self.transformer(
            s, t, tgt_mask=tgt_blocked, src_key_padding_mask=src_blocked, memory_key_padding_mask=src_blocked
        )
        return self.generator(out)  # (B, T, V)


def training_case(length: int, device: torch.device, dropout: float, seed: int) -> Case:
    """A full training step: forward, cross-entropy, backward, Adam update."""
    vocab, n_layers, pad = 1000, 2, 0
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, vocab, (BATCH, length), generator=g)
    src[torch.arange(length)[None, :] >= padding_lengths(BATCH, length, g)[:, None]] = pad
    tgt = torch.randint(1, vocab, (BATCH, length + 1), generator=g)
    src, tgt = src.to(device), tgt.to(device)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # teacher forcing: predict token t+1 from tokens <= t
    ours_src_mask = tl.padding_mask(src, pad)  # (B, 1, 1, S)
    src_blocked = src == pad  # (B, S), True = blocked
    tgt_blocked = ~tl.causal_mask(length, device=device)  # (T, T), True = blocked

    def make_step(model: nn.Module, forward: Callable[[], Tensor]) -> Callable[[], None]:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            logits = forward()  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, vocab), tgt_out.reshape(-1))
            loss.backward()
            optimizer.step()

        return step

    steps = {}
    reference = TorchSeq2Seq(vocab, n_layers, dropout, max(length, 128)).to(device).train()
    steps["torch"] = make_step(reference, lambda: reference(src, tgt_in, src_blocked, tgt_blocked))
    config = tl.TransformerConfig(
        vocab, vocab, d_model=D_MODEL, n_heads=HEADS, d_ff=D_FF, n_layers=n_layers, dropout=dropout,
        max_len=max(length, 128),
    )  # fmt: skip
    for variant in ("fast", "explicit"):
        model = tl.record_attention(tl.Transformer(config).to(device).train(), variant == "explicit")
        steps[variant] = make_step(model, lambda model=model: model(src, tgt_in, ours_src_mask))
    return Case(f"training step ({n_layers}+{n_layers} layers, V={vocab})", length, steps, length == 128)


def run_cases(cases: list[Case], repeats: int, warmup: int, device: torch.device) -> None:
    for case in cases:
        for variant, step in case.steps.items():
            for _ in range(warmup):
                step()
            case.memory[variant] = peak_memory(step, device)
            case.times[variant] = []
        for r in range(repeats):  # interleaved: every variant once per repeat, in a rotating order
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
            for variant in order:
                case.times[variant].append(time_once(case.steps[variant], device))
        print(f"  measured {case.name} T={case.length}", flush=True)


# --------------------------------------------------------------------------- decoding


def decoding_speed(
    device: torch.device, repeats: int, new_tokens: int, seed: int
) -> tuple[dict[str, list[float]], int]:
    """Seconds to greedily decode `new_tokens` tokens for 8 sources, with and without the cache."""
    vocab, batch, src_len, pad, bos, eos = 1000, 8, 64, 0, 1, 2
    torch.manual_seed(seed)
    config = tl.TransformerConfig(
        vocab, vocab, d_model=D_MODEL, n_heads=HEADS, d_ff=D_FF, n_layers=3, dropout=0.1, max_len=256
    )
    model = tl.record_attention(tl.Transformer(config).to(device), False)
    # An untrained model might emit EOS and stop early; to always generate `new_tokens` tokens the
    # EOS logit is set to -inf by a hook on the output Linear (the same cost with and without cache).
    model.generator.register_forward_hook(
        lambda _m, _i, out: out.index_fill(-1, torch.tensor([eos], device=device), -math.inf)
    )
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (batch, src_len), generator=g)
    src[torch.arange(src_len)[None, :] >= padding_lengths(batch, src_len, g)[:, None]] = pad
    src = src.to(device)
    src_mask = tl.padding_mask(src, pad)

    def run(use_cache: bool) -> None:
        out = greedy_decode(
            model, src, src_mask, bos_id=bos, eos_id=eos, pad_id=pad, max_len=new_tokens, use_cache=use_cache
        )
        assert out.shape == (batch, 1 + new_tokens), out.shape

    times: dict[str, list[float]] = {"cache": [], "no cache": []}
    for use_cache in (True, False):  # warm-up: a few tokens each
        greedy_decode(model, src, src_mask, bos_id=bos, eos_id=eos, pad_id=pad, max_len=4, use_cache=use_cache)
    for r in range(repeats):
        for use_cache in (True, False) if r % 2 == 0 else (False, True):
            times["cache" if use_cache else "no cache"].append(time_once(lambda u=use_cache: run(u), device))
    return times, batch * new_tokens


# --------------------------------------------------------------------------- report


def processor_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# What decides the cost of bfloat16 arithmetic on a CPU: whether it has bfloat16 instructions (x86: AVX-512 BF16
# and AMX-BF16; Arm: BF16 and SVE BF16) and whether PyTorch's kernels use them. A result file names them beside
# the processor, since the same code can be several times faster or slower in bfloat16 from one CPU to another.
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "svebf16")


def bfloat16_flags(cpuinfo: str | None = None) -> str:
    """The CPU's bfloat16 instructions as /proc/cpuinfo lists them (its `flags` line on x86, `Features` on Arm),
    e.g. "bfloat16 flags: avx512_bf16, amx_bf16", "bfloat16 flags: none of avx512_bf16, amx_bf16", or "unknown"
    where there is no /proc/cpuinfo (macOS, Windows)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"bfloat16 flags: unknown (no /proc/cpuinfo on {platform.system()} {platform.machine()})"
    for line in cpuinfo.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features") and ":" in line:
            present = set(line.split(":", 1)[1].split())
            arm = key == "features"
            wanted = BFLOAT16_FLAGS[2:] if arm else BFLOAT16_FLAGS[:2]
            found = [flag for flag in wanted if flag in present]
            return "bfloat16 flags: " + (", ".join(found) if found else "none of " + ", ".join(wanted))
    return "bfloat16 flags: unknown (/proc/cpuinfo lists no flags)"


def device_line(device: torch.device) -> str:
    """The "- device:" line of a result file: the machine, the CPUs visible, and on a CPU its bfloat16 flags."""
    line = f"- device: {machine_name(device)}, {os.cpu_count()} logical CPUs visible"
    return line + (f"; {bfloat16_flags()}" if device.type == "cpu" else "")


def machine_name(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else processor_name()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{device.type}-{slug}"


def conditions(device: torch.device, args: argparse.Namespace, load_before: str, load_after: str) -> list[str]:
    lines = [
        f"- date (UTC): {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        f"- command: `python benchmarks/bench.py {' '.join(sys.argv[1:])}`".replace("  ", " "),
        device_line(device),
        f"- torch {torch.__version__}, Python {platform.python_version()}, torch threads {torch.get_num_threads()}",
        f"- B={BATCH}, d_model={D_MODEL}, heads={HEADS}, d_ff={D_FF}, dropout={args.dropout}, training mode; "
        f"{args.repeats} interleaved repeats (median), {args.warmup} warm-up steps per variant "
        f"(+1 profiled step for memory); decoding: {args.decoding_repeats} interleaved repeats",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
    ]
    if device.type == "cuda":
        lines.append(f"- GPU: {torch.cuda.get_device_name(device)}")
    if args.note:
        lines.append(f"- note: {args.note}")
    return lines


def fmt_ratio(ratio: float, target: float | None, higher_is_better: bool = False) -> str:
    if target is None:
        return f"{ratio:.2f}x"
    met = ratio >= target if higher_is_better else ratio <= target
    return f"{ratio:.2f}x ({'met' if met else 'MISSED'})"


def report(cases: list[Case], decoding: tuple[dict[str, list[float]], int] | None) -> list[str]:
    lines = [
        "| module | T | torch ms | fast ms | explicit ms | fast / torch (target <= 1.10) "
        "| explicit / torch (target <= 1.5) | torch MiB | fast MiB | explicit MiB | fast / torch mem "
        "| explicit / torch mem |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case in cases:
        ms = {v: 1e3 * statistics.median(case.times[v]) for v in VARIANTS}
        mib = {v: case.memory[v] / 2**20 for v in VARIANTS}
        fast, explicit = ms["fast"] / ms["torch"], ms["explicit"] / ms["torch"]
        lines.append(
            f"| {case.name} | {case.length} | {ms['torch']:.1f} | {ms['fast']:.1f} | {ms['explicit']:.1f} "
            f"| {fmt_ratio(fast, TARGET_FAST if case.target else None)} "
            f"| {fmt_ratio(explicit, TARGET_EXPLICIT if case.target else None)} "
            f"| {mib['torch']:.1f} | {mib['fast']:.1f} | {mib['explicit']:.1f} "
            f"| {mib['fast'] / mib['torch']:.2f}x | {mib['explicit'] / mib['torch']:.2f}x |"
        )
    if decoding is not None:
        times, tokens = decoding
        cached, plain = statistics.median(times["cache"]), statistics.median(times["no cache"])
        lines += [
            "",
            f"| greedy decoding, {tokens // 8} new tokens, batch 8, source 64, 3+3 layers | tokens/s | seconds |",
            "| --- | ---: | ---: |",
            f"| with KV cache | {tokens / cached:.0f} | {cached:.2f} |",
            f"| without cache (recompute the prefix) | {tokens / plain:.0f} | {plain:.2f} |",
            f"| speed-up (target >= {TARGET_CACHE:.0f}x) | {fmt_ratio(plain / cached, TARGET_CACHE, True)} | |",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats, T=128 only: a smoke run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", type=Path, default=None, help="markdown file (default results/<machine>.md)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 7, quick 3)")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout in every module (default 0.1)")
    parser.add_argument(
        "--lengths", default=None, help="comma-separated sequence lengths T (default 128,512; quick 128)"
    )
    parser.add_argument("--decoding-repeats", type=int, default=None, help="default: half of --repeats, >= 1")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated in the decoding test")
    parser.add_argument("--note", default="", help="a line about the conditions, written into the results file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available")
    torch.set_num_threads(args.threads)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.warmup = 1 if args.quick else 2
    args.decoding_repeats = args.decoding_repeats or max(1, args.repeats // 2)
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    lengths = [int(t) for t in (args.lengths or ("128" if args.quick else "128,512")).split(",")]
    cases = []
    for length in lengths:
        cases += component_cases(length, device, args.dropout, args.seed)
        cases.append(training_case(length, device, args.dropout, args.seed))
    run_cases(cases, args.repeats, args.warmup, device)
    decoding = decoding_speed(device, args.decoding_repeats, args.new_tokens, args.seed)
    print("  measured decoding", flush=True)

    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [f"# Benchmark: {machine_name(device)}", "", *conditions(device, args, load_before, load_after), ""]
    lines += report(cases, decoding)
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or ROOT / "benchmarks" / "results" / f"{machine_name(device)}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
