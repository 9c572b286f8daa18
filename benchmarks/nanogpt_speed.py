"""A training step of our GPT against the models people copy: nanoGPT's `model.py` and nanochat's `gpt.py` (issue 24).

    python benchmarks/nanogpt_speed.py --nanogpt PATH [--nanochat PATH] [--repeats 40] [--warmup 5] [--profile 10]

At chapter 10's configuration (vocabulary 65, block 64, d_model 128, 4 layers, 4 heads, batch 12, dropout 0, no
biases), one torch thread, five models in two comparisons, the models of each holding the same weights:

1. **GPT-2**: `transformer_lab.gpt.GPT` with GPT-2's switches (learned positions, LayerNorm, tied head) and
   `activation="gelu"` (the exact GELU: nanoGPT's `nn.GELU()`), against nanoGPT's `GPT` with `bias=False`.
   Optimizers: ours `tl.training.make_adamw`, nanoGPT's own `configure_optimizers` (the same groups and settings:
   weight decay 0.1 on the matrices, betas (0.9, 0.99), lr 1e-3). nanoGPT asks for PyTorch's fused AdamW on CUDA
   only (it was written before PyTorch had a fused AdamW for CPUs); `make_adamw` uses it on a CPU too. So the
   pair is measured twice: each trainer's step as it trains (ours fused, theirs plain), and both with the plain
   AdamW (`make_adamw(..., fused=False)`), which compares the models alone and keeps the two runs equal to the
   bit.
2. **Modern**: our GPT with nanochat's switches (rotary positions in the "halves" layout, RMSNorm without weights,
   a norm after the embedding, QK norm, ReLU^2, grouped-query attention with 2 key/value heads, an untied head,
   logit soft-cap 15), against nanochat's `GPT` from its `gpt.py` of November 2025 (commit 11e68bf, the last
   one with only these changes; later ones add value embeddings, smear and backout gates, per-layer residual
   scalars and sliding windows, which our GPT has no switches for). Both with `make_adamw` (nanochat's own
   optimizer is Muon + AdamW; the step compared here is the model's, the optimizer being equal: fused for both).

A training step is what `tl.training.train_gpt` does each step (without clipping, as the issue states it):
zero_grad(set_to_none), forward, cross-entropy, backward, AdamW step, ours on the fast path
(`record_attention(model, False)`, as training sets it). Every model runs the same batches in the same order
(8 random batches, cycled), so the two models of a pair stay equal step after step: the first losses are
asserted equal to 1e-5, the proof that they compute the same thing, and the largest difference over the whole
run is reported. After `--warmup` untimed rounds, each repeat runs every model once in an order that rotates
between repeats (load from other processes then falls on all alike); the ratio ours / theirs is taken within
each repeat, and the table gives medians of the wall time and of this thread's CPU time.

Nothing of nanoGPT or nanochat is copied into this project: their files are read at run time.
`--nanogpt` takes nanoGPT's `model.py`, a clone of the repository, or its git directory (`model.py` is then read
at `--nanogpt-rev`, default HEAD). `--nanochat` takes a clone (checked out at 11e68bf) or a git directory (read at
`--nanochat-rev`, default 11e68bf...). Without them, the script looks for snapshots in `$NANOGPT_GIT_DIR` /
`$NANOCHAT_GIT_DIR`, then /work/.mirror/karpathy+{nanoGPT,nanochat}/repo, and skips what it cannot find with a
message. To reproduce without a network, keep a clone:

    git clone https://github.com/karpathy/nanoGPT ~/src/nanoGPT
    git clone https://github.com/karpathy/nanochat ~/src/nanochat
    python benchmarks/nanogpt_speed.py --nanogpt ~/src/nanoGPT --nanochat ~/src/nanochat/.git

Options: `--profile N` profiles N steps of each model with `torch.profiler` (one thread) and adds the top
operators to the results; `--out PATH` (default benchmarks/results/nanogpt-speed-<machine>.md).
Run it from the repository root (it puts the root on `sys.path`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import importlib
import importlib.util
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import device_line, machine_name  # noqa: E402 - beside this file: the machine's name as the other benchmarks write it

from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402
from transformer_lab.multihead import record_attention  # noqa: E402
from transformer_lab.training import make_adamw  # noqa: E402

VOCAB, BLOCK, D_MODEL, LAYERS, HEADS, BATCH = 65, 64, 128, 4, 4, 12
KV_HEADS = 2  # the modern pair's grouped-query attention
LR, WEIGHT_DECAY, BETAS = 1e-3, 0.1, (0.9, 0.99)
N_BATCHES = 8
LOSS_TOLERANCE = 1e-5
PLAIN = "ours, GPT-2 switches, plain AdamW"
NANOCHAT_REV = "11e68bf4427aef8748a8c0c3978c9c03838a9466"  # nanochat/gpt.py of 2025-11-17
NANOCHAT_FILES = ("__init__.py", "common.py", "gpt.py", "muon.py", "adamw.py")  # what gpt.py imports
MIRRORS = Path("/work/.mirror")


# --- Finding and loading the other projects' files (read at run time, never copied into the project) ---


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def _git_show(git_dir: Path, rev: str, name: str) -> bytes:
    try:
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{rev}:{name}"], check=True, capture_output=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        stderr = getattr(error, "stderr", b"") or b""
        raise SystemExit(f"could not read {name} at {rev} from {git_dir}: {stderr.decode().strip() or error}") from None


def _default_source(variable: str, mirror: str) -> Path | None:
    for candidate in (os.environ.get(variable), MIRRORS / mirror / "repo"):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    return None


def nanogpt_model_file(source: Path, rev: str, workdir: Path) -> Path:
    """nanoGPT's model.py from a file, a clone, or a git directory (extracted into `workdir`)."""
    if source.is_file():
        return source
    if (source / "model.py").is_file():
        return source / "model.py"
    if _is_git_dir(source):
        target = workdir / "nanogpt_model.py"
        target.write_bytes(_git_show(source, rev, "model.py"))
        return target
    raise SystemExit(f"--nanogpt must be nanoGPT's model.py, a clone holding it, or its git directory; got {source}")


def nanochat_root(source: Path, rev: str, workdir: Path) -> Path:
    """A folder holding the `nanochat` package: a clone, or the files gpt.py needs extracted from a git directory."""
    if (source / "nanochat" / "gpt.py").is_file():
        return source
    if _is_git_dir(source):
        package = workdir / "nanochat"
        package.mkdir()
        for name in NANOCHAT_FILES:
            (package / name).write_bytes(_git_show(source, rev, f"nanochat/{name}"))
        return workdir
    raise SystemExit(f"--nanochat must be a clone of nanochat or its git directory; got {source}")


def load_nanogpt(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_nanochat(root: Path) -> ModuleType:
    sys.path.insert(0, str(root))
    module = importlib.import_module("nanochat.gpt")
    if "window_pattern" in module.GPTConfig.__dataclass_fields__:
        raise SystemExit(
            f"{root}/nanochat/gpt.py is a later nanochat (value embeddings, smear, sliding windows, ...) than this "
            f"benchmark compares against; check out {NANOCHAT_REV[:7]} or pass the git directory"
        )
    return module


# --- The pairs of models, with equal weights ---


def gpt2_pair(nanogpt: ModuleType) -> tuple[nn.Module, nn.Module]:
    """(ours, nanoGPT's) at chapter 10's size, exact GELU, no biases; nanoGPT's weights copied into ours."""
    config = nanogpt.GPTConfig(
        block_size=BLOCK, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=D_MODEL, dropout=0.0, bias=False
    )
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        theirs = nanogpt.GPT(config)
    ours = GPT(
        GPTConfig(
            VOCAB, block_size=BLOCK, d_model=D_MODEL, n_heads=HEADS, n_layers=LAYERS, bias=False, activation="gelu"
        )
    )
    sd = theirs.state_dict()
    mapped = {
        "token_embedding.weight": sd["transformer.wte.weight"],
        "position_embedding.embedding.weight": sd["transformer.wpe.weight"],
        "norm.weight": sd["transformer.ln_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],  # tied to wte in both
    }
    for i in range(LAYERS):
        h, o = f"transformer.h.{i}.", f"layers.{i}."
        # nanoGPT's c_attn is nn.Linear (3D, D): rows [W^Q; W^K; W^V] (not GPT-2's transposed Conv1D).
        w_q, w_k, w_v = sd[h + "attn.c_attn.weight"].split(D_MODEL, dim=0)
        mapped |= {
            o + "self_attn.w_q.weight": w_q,
            o + "self_attn.w_k.weight": w_k,
            o + "self_attn.w_v.weight": w_v,
            o + "self_attn.w_o.weight": sd[h + "attn.c_proj.weight"],
            o + "feed_forward.w1.weight": sd[h + "mlp.c_fc.weight"],
            o + "feed_forward.w2.weight": sd[h + "mlp.c_proj.weight"],
            o + "norm1.weight": sd[h + "ln_1.weight"],
            o + "norm2.weight": sd[h + "ln_2.weight"],
        }
    ours.load_state_dict(mapped, strict=True)
    return ours, theirs


def modern_pair(nanochat: ModuleType) -> tuple[nn.Module, nn.Module]:
    """(ours, nanochat's) with nanochat's architecture; nanochat's weights and rotary tables copied into ours."""
    config = nanochat.GPTConfig(
        sequence_len=BLOCK, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_kv_head=KV_HEADS, n_embd=D_MODEL
    )
    theirs = nanochat.GPT(config)
    theirs.init_weights()
    # nanochat zero-initialises the head and the output projections: the loss would then not depend on most
    # weights, and an equal first loss would prove little. Random weights everywhere make it a real check.
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.endswith(("c_proj.weight", "lm_head.weight")):
                nn.init.normal_(p, std=0.02)
    ours = GPT(
        GPTConfig(
            VOCAB,
            block_size=BLOCK,
            d_model=D_MODEL,
            n_heads=HEADS,
            n_layers=LAYERS,
            bias=False,
            tie_embeddings=False,
            activation="relu2",
            positions="rope",
            rope_layout="halves",
            norm="rms_no_weight",
            norm_eps=torch.finfo(torch.float32).eps,  # F.rms_norm's default eps=None, nanochat's
            embedding_norm=True,
            qk_norm="rms_no_weight",
            n_kv_heads=KV_HEADS,
            logit_softcap=15.0,
        )
    )
    sd = theirs.state_dict()
    mapped = {"token_embedding.weight": sd["transformer.wte.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for i in range(LAYERS):
        h, o = f"transformer.h.{i}.", f"layers.{i}."
        mapped |= {
            o + "self_attn.w_q.weight": sd[h + "attn.c_q.weight"],
            o + "self_attn.w_k.weight": sd[h + "attn.c_k.weight"],
            o + "self_attn.w_v.weight": sd[h + "attn.c_v.weight"],
            o + "self_attn.w_o.weight": sd[h + "attn.c_proj.weight"],
            o + "feed_forward.w1.weight": sd[h + "mlp.c_fc.weight"],
            o + "feed_forward.w2.weight": sd[h + "mlp.c_proj.weight"],
        }
    ours.load_state_dict(mapped, strict=True)
    # nanochat keeps its rotary tables in bfloat16 (asserted in its forward) and turns by -theta; ours are float32
    # and turn by +theta. Giving ours nanochat's rounded values, with sin negated, makes the two rotations equal
    # (the tables are a cache of `RotaryEmbedding`, not parameters: this changes no timing).
    cos = theirs.cos[0, :BLOCK, 0, :].float()  # (block, d_k / 2)
    sin = theirs.sin[0, :BLOCK, 0, :].float()
    rotary = ours.layers[0].self_attn.rotary
    rotary._tables[(torch.float32, torch.device("cpu"))] = (cos, -sin)
    # nanochat normalises q and k after rotating them, ours before: the same, since a rotation keeps the sum of
    # squares of a head and the norms have no weight.
    return ours, theirs


# --- Training steps and timing ---


def training_step(
    model: nn.Module, loss_of: Callable[[Tensor, Tensor], Tensor], optimizer: torch.optim.Optimizer, batches: list
) -> tuple[Callable[[], None], list[float]]:
    """One training step per call on the next batch (cycled), and the list of the losses it appends to."""
    losses: list[float] = []

    def step() -> None:
        x, y = batches[len(losses) % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    return step, losses


def ours_loss(model: GPT) -> Callable[[Tensor, Tensor], Tensor]:
    record_attention(model, False)  # the fast path, as train_gpt trains

    def loss_of(x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # train_gpt's loss

    return loss_of


def nanogpt_loss(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda x, y: model(x, y)[1]  # (logits, loss)


def nanochat_loss(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda x, y: model(x, y)  # the loss, when given targets


def interleaved(
    steps: dict[str, Callable[[], None]], repeats: int, warmup: int
) -> dict[str, list[tuple[float, float]]]:
    """(wall, thread CPU) seconds of each step per repeat; each repeat runs all, in an order rotating between
    repeats. With one torch thread the work runs on this thread, so its CPU time is what the step costs even
    when other processes share the cores (the wall time then also counts waiting)."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cpu, wall = time.thread_time(), time.perf_counter()
            steps[name]()
            times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    return times


def profile_steps(steps: dict[str, Callable[[], None]], n: int) -> dict[str, str]:
    """torch.profiler's table of the busiest operators over n steps of each model (self CPU time)."""
    tables = {}
    for name, step in steps.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                step()
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40)
    return tables


# --- Report ---


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.1f}"


def pair_rows(label: str, ours: str, theirs: str, times: dict, losses: dict) -> list[str]:
    rows = []
    first = abs(losses[ours][0] - losses[theirs][0])
    drift = max(abs(a - b) for a, b in zip(losses[ours], losses[theirs], strict=True))
    for clock, i in (("wall", 0), ("CPU", 1)):
        mine, other = [t[i] for t in times[ours]], [t[i] for t in times[theirs]]
        ratios = [a / b for a, b in zip(mine, other, strict=True)]  # within each repeat
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        rows.append(
            f"| {label} | {clock} | {_ms(mine)} | {_ms(other)} | **{statistics.median(ratios):.3f}** "
            f"({q1:.3f}-{q3:.3f}) | {first:.1e} | {drift:.1e} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, default=None, help="nanoGPT's model.py, a clone, or its git directory")
    parser.add_argument("--nanogpt-rev", default="HEAD", help="the revision read from a git directory (default HEAD)")
    parser.add_argument("--nanochat", type=Path, default=None, help="a nanochat clone at 11e68bf, or its git directory")
    parser.add_argument("--nanochat-rev", default=NANOCHAT_REV, help="the revision read from a git directory")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--repeats", type=int, default=40, help="timed steps per model (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    parser.add_argument("--profile", type=int, default=0, help="also profile this many steps of each model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="results file (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 4 or args.warmup < 0 or args.profile < 0:
        parser.error("--threads must be >= 1, --repeats >= 4 (for quartiles), --warmup and --profile >= 0")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    scratch = tempfile.TemporaryDirectory(prefix="nanogpt_speed_")  # extracted files; removed at exit
    workdir = Path(scratch.name)
    nanogpt_source = args.nanogpt or _default_source("NANOGPT_GIT_DIR", "karpathy+nanoGPT")
    nanochat_source = args.nanochat or _default_source("NANOCHAT_GIT_DIR", "karpathy+nanochat")
    if nanogpt_source is None and nanochat_source is None:
        print("skipped: found neither nanoGPT nor nanochat; pass --nanogpt PATH and/or --nanochat PATH (see --help)")
        return 0

    g = torch.Generator().manual_seed(args.seed)
    batches = []
    for _ in range(N_BATCHES):
        tokens = torch.randint(VOCAB, (BATCH, BLOCK + 1), generator=g)  # (B, T + 1)
        # inputs and next-token targets, (B, T) each; contiguous, as nanoGPT's get_batch makes them (its loss views)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))

    steps: dict[str, Callable[[], None]] = {}
    losses: dict[str, list[float]] = {}
    pairs: list[tuple[str, str, str]] = []
    sources: list[str] = []

    def add(name: str, model: nn.Module, loss_of: Callable, optimizer: torch.optim.Optimizer) -> None:
        model.train()
        steps[name], losses[name] = training_step(model, loss_of, optimizer, batches)

    if nanogpt_source is None:
        print("skipped nanoGPT: no snapshot found; pass --nanogpt PATH (model.py, a clone, or a git directory)")
    else:
        path = nanogpt_model_file(nanogpt_source, args.nanogpt_rev, workdir)
        torch.manual_seed(args.seed)
        ours, theirs = gpt2_pair(load_nanogpt(path))
        plain = copy.deepcopy(ours)  # the same weights, trained with the plain AdamW as nanoGPT's on a CPU
        add("ours, GPT-2 switches", ours, ours_loss(ours), make_adamw(ours, LR, WEIGHT_DECAY, BETAS))
        add(PLAIN, plain, ours_loss(plain), make_adamw(plain, LR, WEIGHT_DECAY, BETAS, fused=False))
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter groups
            their_opt = theirs.configure_optimizers(WEIGHT_DECAY, LR, BETAS, "cpu")
        add("nanoGPT", theirs, nanogpt_loss(theirs), their_opt)
        pairs.append(("GPT-2 (exact GELU)", "ours, GPT-2 switches", "nanoGPT"))
        pairs.append(("GPT-2, both plain AdamW", PLAIN, "nanoGPT"))
        rev = f" at {args.nanogpt_rev}" if _is_git_dir(nanogpt_source) else ""
        sources.append(f"nanoGPT: `model.py` from {nanogpt_source}{rev}")
    if nanochat_source is None:
        print("skipped nanochat: no snapshot found; pass --nanochat PATH (a clone at 11e68bf, or a git directory)")
    else:
        root = nanochat_root(nanochat_source, args.nanochat_rev, workdir)
        torch.manual_seed(args.seed)
        ours, theirs = modern_pair(load_nanochat(root))
        add("ours, nanochat switches", ours, ours_loss(ours), make_adamw(ours, LR, WEIGHT_DECAY, BETAS))
        add("nanochat", theirs, nanochat_loss(theirs), make_adamw(theirs, LR, WEIGHT_DECAY, BETAS))
        pairs.append(("modern (nanochat)", "ours, nanochat switches", "nanochat"))
        rev = f" at {args.nanochat_rev[:7]}" if _is_git_dir(nanochat_source) else ""
        sources.append(f"nanochat: `nanochat/gpt.py` from {nanochat_source}{rev}")

    # The first step of each pair, before any timing: equal losses prove the models compute the same thing.
    for name in steps:
        steps[name]()
    for label, ours_name, their_name in pairs:
        a, b = losses[ours_name][0], losses[their_name][0]
        if abs(a - b) > LOSS_TOLERANCE:
            raise SystemExit(f"{label}: first losses differ: ours {a:.7f}, theirs {b:.7f}; the models are not alike")

    load_before = _load()
    times = interleaved(steps, args.repeats, args.warmup)
    load_after = _load()
    tables = profile_steps(steps, args.profile) if args.profile else {}

    lines = [
        "# A training step of our GPT against nanoGPT's and nanochat's (issue 24, item 8)",
        "",
        f"- date (UTC): {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        f"- command: `{' '.join(['python benchmarks/nanogpt_speed.py', *sys.argv[1:]])}`",
        device_line(device),
        f"- torch {torch.__version__}, Python {platform.python_version()}, torch threads {torch.get_num_threads()}",
        *(f"- {s}" for s in sources),
        f"- vocabulary {VOCAB}, block {BLOCK}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, batch {BATCH}, "
        f"dropout 0, no biases; AdamW lr {LR}, weight decay {WEIGHT_DECAY}, betas {BETAS}",
        f"- a step: zero_grad, forward, cross-entropy, backward, AdamW step; {args.repeats} interleaved repeats "
        f"(median), {args.warmup} warm-up rounds; {N_BATCHES} batches cycled, the same for every model",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
        "",
        "| pair | clock | ours (ms) | theirs (ms) | ours / theirs, median (quartiles) | first-loss diff | "
        "largest loss diff |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, ours_name, their_name in pairs:
        lines += pair_rows(label, ours_name, their_name, times, losses)
    lines += [
        "",
        "The ratio is taken within each repeat (the two steps ran seconds apart), then the median over repeats. "
        "The loss differences compare the same step of the two models of a pair over the whole run (warm-up "
        "included): both train on the same batches from the same weights.",
    ]
    for name, table in tables.items():
        lines += ["", f"## Profile: {name}, {args.profile} steps, self CPU time", "", "```", table.rstrip(), "```"]
    report = "\n".join(lines) + "\n"
    print(report)
    out = args.out or ROOT / "benchmarks" / "results" / f"nanogpt-speed-{machine_name(device)}.md"
    out.write_text(report, encoding="utf-8")
    print(f"written to {out}")
    return 0


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
