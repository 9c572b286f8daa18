"""Chapter 10's GPT against Hugging Face's GPT-2, and one training recipe against another (issue 16).

    python benchmarks/gpt_bench.py [--threads 2] [--repeats 7] [--quick] [--device cpu|cuda] [--out PATH]
    python benchmarks/gpt_bench.py --time-to-loss --recipe '{"lr": 2e-3, "batch_size": 16}'

Measures, in one process, each as a ratio:

1. training step (forward, cross-entropy, backward, AdamW) of `tl.gpt.GPT` on the fast path
   (`tl.record_attention(model, False)`) against `transformers.GPT2LMHeadModel` with the same config, at
   B 12, T 64, d_model 128, 4 layers, 4 heads (chapter 10's model) and B 8, T 256, d_model 384, 6 layers,
   6 heads; the variants run interleaved (each repeat runs both, in a rotating order) and the table gives
   medians; target ours / HF <= 1.0;
2. generation: a 16-token prompt, 256 new tokens (greedy, so both sides do the same work), batch 1 and 8:
   tokens per second of `GPT.generate` with its KV cache against HF's `generate` with its cache (target
   ours / HF >= 1) and against our own recomputation without the cache (target >= 5);
3. with --time-to-loss only (minutes): `time_to_loss`, the training seconds a recipe needs to reach the
   validation loss that a reference recipe (nanoGPT's, by default) ends with, same model, same run.

See benchmarks/README.md for the method. Needs `transformers` (requirements-test.txt pins it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import time_once  # noqa: E402 - beside this file: the same timing as the layer benchmarks

import transformer_lab as tl  # noqa: E402
from transformer_lab.data import TextTokenizer, load_corpus, split_text  # noqa: E402
from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402
from transformer_lab.training import train_gpt  # noqa: E402

VOCAB = 65  # Tiny Shakespeare's characters
#: (name, B, T, d_model, n_layers, n_heads)
TRAIN_SHAPES = [("chapter 10", 12, 64, 128, 4, 4), ("bigger", 8, 256, 384, 6, 6)]
PROMPT, NEW_TOKENS = 16, 256
TARGET_STEP, TARGET_HF_GENERATE, TARGET_CACHE = 1.0, 1.0, 5.0
#: nanoGPT's Shakespeare-character recipe on a CPU (config/train_shakespeare_char.py), train_gpt's defaults.
NANOGPT_RECIPE: dict[str, Any] = dict(
    steps=2000, batch_size=12, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.1, betas=(0.9, 0.99), clip_norm=1.0
)


def interleaved(variants: dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device) -> dict:
    """Median seconds of each variant: after `warmup` untimed rounds, each repeat runs every variant once,
    the order rotating between repeats, so that load from other processes hits all variants alike."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(time_once(variants[name], device))
    return {name: statistics.median(values) for name, values in times.items()}


def build_pair(t: int, d: int, layers: int, heads: int, device: torch.device, seed: int) -> tuple[GPT, nn.Module]:
    """Our GPT and `transformers.GPT2LMHeadModel` with the same config and the same weights (no dropout)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    ours = GPT(GPTConfig(VOCAB, block_size=t, d_model=d, n_heads=heads, n_layers=layers, dropout=0.0))
    hf_config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=t,
        n_embd=d,
        n_layer=layers,
        n_head=heads,
        activation_function="gelu_new",
        bos_token_id=None,
        eos_token_id=None,  # never stop early: both sides generate every token
    )
    hf_config.resid_pdrop = hf_config.embd_pdrop = hf_config.attn_pdrop = 0.0
    hf = GPT2LMHeadModel(hf_config)
    hf.load_state_dict(_to_hf(ours.state_dict(), layers, d), strict=False)  # the same weights
    tl.record_attention(ours, False)  # the fast path
    with torch.no_grad():  # the same model: checked on every run
        probe = torch.randint(VOCAB, (2, min(t, 32)), generator=torch.Generator().manual_seed(seed))
        gap = (ours.eval()(probe) - hf.eval()(input_ids=probe).logits).abs().max().item()
    if gap > 1e-4:
        raise RuntimeError(f"the copied weights do not give HF's logits (max difference {gap:.2e})")
    return ours.to(device), hf.to(device)


def _to_hf(sd: dict[str, torch.Tensor], layers: int, d: int) -> dict[str, torch.Tensor]:
    """Our state dict in GPT-2's names and layouts (the inverse of `GPT.from_gpt2`'s conversion)."""
    out = {
        "transformer.wte.weight": sd["token_embedding.weight"],
        "transformer.wpe.weight": sd["position_embedding.embedding.weight"],
        "transformer.ln_f.weight": sd["norm.weight"],
        "transformer.ln_f.bias": sd["norm.bias"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(layers):
        o, g = f"layers.{i}.", f"transformer.h.{i}."
        q, k, v = (sd[o + f"self_attn.w_{n}.weight"] for n in "qkv")
        out[g + "attn.c_attn.weight"] = torch.cat([q, k, v]).t().contiguous()  # (D, 3D)
        out[g + "attn.c_attn.bias"] = torch.cat([sd[o + f"self_attn.w_{n}.bias"] for n in "qkv"])
        out[g + "attn.c_proj.weight"] = sd[o + "self_attn.w_o.weight"].t().contiguous()
        out[g + "attn.c_proj.bias"] = sd[o + "self_attn.w_o.bias"]
        out[g + "mlp.c_fc.weight"] = sd[o + "feed_forward.w1.weight"].t().contiguous()
        out[g + "mlp.c_fc.bias"] = sd[o + "feed_forward.w1.bias"]
        out[g + "mlp.c_proj.weight"] = sd[o + "feed_forward.w2.weight"].t().contiguous()
        out[g + "mlp.c_proj.bias"] = sd[o + "feed_forward.w2.bias"]
        for ours_name, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            out[g + theirs + ".weight"] = sd[o + ours_name + ".weight"]
            out[g + theirs + ".bias"] = sd[o + ours_name + ".bias"]
    return out


def training_steps(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for name, b, t, d, layers, heads in TRAIN_SHAPES:
        ours, hf = build_pair(t, d, layers, heads, device, args.seed)
        ours.train()
        hf.train()
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randint(VOCAB, (b, t), generator=g).to(device)  # (B, T)
        y = torch.randint(VOCAB, (b, t), generator=g).to(device)

        def step(
            model: nn.Module, logits_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
        ) -> Callable[[], None]:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)

            def run() -> None:
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(logits_of(x).flatten(0, 1), y.flatten())
                loss.backward()
                optimizer.step()

            return run

        medians = interleaved(
            {"ours": step(ours, ours, x, y), "hf": step(hf, lambda idx, hf=hf: hf(input_ids=idx).logits, x, y)},
            args.repeats,
            args.warmup,
            device,
        )
        rows.append(dict(shape=f"{name}: B {b}, T {t}, d {d}, {layers} layers, {heads} heads", **medians))
        rows[-1]["ratio"] = medians["ours"] / medians["hf"]
    return rows


def generation(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Tokens per second, greedy, 16-token prompt, 256 new tokens; block_size 512 so the cache never fills."""
    rows = []
    _, _, _, d, layers, heads = TRAIN_SHAPES[0]
    ours, hf = build_pair(512, d, layers, heads, device, args.seed)
    ours.eval()
    hf.eval()
    for batch in (1, 8):
        g = torch.Generator().manual_seed(args.seed + batch)
        prompt = torch.randint(VOCAB, (batch, PROMPT), generator=g).to(device)  # (B, 16)
        mask = torch.ones_like(prompt)

        def run_hf(prompt: torch.Tensor = prompt, mask: torch.Tensor = mask) -> None:
            with torch.no_grad():
                hf.generate(
                    input_ids=prompt,
                    attention_mask=mask,
                    max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )

        variants = {
            "ours cache": lambda prompt=prompt: ours.generate(prompt, args.new_tokens, temperature=0),
            "ours recompute": lambda prompt=prompt: ours.generate(
                prompt, args.new_tokens, temperature=0, use_cache=False
            ),
            "hf cache": run_hf,
        }
        medians = interleaved(variants, args.decoding_repeats, 1, device)
        per_second = {k: batch * args.new_tokens / v for k, v in medians.items()}
        rows.append(
            dict(
                batch=batch,
                **per_second,
                vs_hf=per_second["ours cache"] / per_second["hf cache"],
                cache_speedup=per_second["ours cache"] / per_second["ours recompute"],
            )
        )
    return rows


def time_to_loss(
    recipe: dict[str, Any],
    reference: dict[str, Any] | None = None,
    *,
    corpus: str = "shakespeare",
    model: dict[str, Any] | None = None,
    block: int = 64,
    target: float | None = None,
    eval_every: int = 100,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Training seconds for `recipe` to reach the validation loss `reference` ends with (or `target`).

    Both runs train the same model (the same config and the same initial weights, from `seed`) on the same
    corpus in this process, one after the other, the reference first; the validation loss is
    `tl.training.evaluate_text` over the whole validation split in windows of `block` characters, measured
    every `eval_every` steps, and the time is the training time when it first reaches the target
    (evaluations excluded: `TextHistory.time_to_loss`). `ratio` = recipe's time / reference's time (the
    issue's target: at most 0.75); None when the recipe never reaches the target.

    Args:
        recipe, reference: keyword arguments of `tl.training.train_gpt` (steps, batch_size, lr, min_lr, warmup,
            decay_steps, weight_decay, betas, clip_norm); reference defaults to `NANOGPT_RECIPE`.
        model: `GPTConfig` fields other than vocab_size and block_size (default: 4 layers, 4 heads, d_model 128).
        target: the loss to reach (default: the reference's final validation loss).
    """
    reference = dict(NANOGPT_RECIPE if reference is None else reference)
    shape = dict(d_model=128, n_heads=4, n_layers=4, dropout=0.0) | (model or {})
    text = load_corpus(corpus)
    tokenizer = TextTokenizer.from_text(text)
    train_data, val_data = split_text(tokenizer.encode(text))
    histories = {}
    for name, settings in (("reference", reference), ("recipe", dict(recipe))):
        torch.manual_seed(seed)
        gpt = GPT(GPTConfig(tokenizer.vocab_size, block_size=block, **shape)).to(device)
        histories[name] = train_gpt(
            gpt, train_data, val_data, block=block, eval_every=eval_every, seed=seed, progress=progress, **settings
        )
    goal = histories["reference"].val_loss[-1] if target is None else target
    times = {name: h.time_to_loss(goal) for name, h in histories.items()}
    ratio = None if times["recipe"] is None or not times["reference"] else times["recipe"] / times["reference"]
    return dict(
        target=goal,
        seconds=times,
        ratio=ratio,
        final_val_loss={name: h.val_loss[-1] for name, h in histories.items()},
        histories={name: h.to_dict() for name, h in histories.items()},
    )


def report(args: argparse.Namespace, device: torch.device, steps: list[dict], gen: list[dict]) -> str:
    import transformers

    lines = [
        f"# GPT benchmarks ({datetime.datetime.now():%Y-%m-%d %H:%M})",
        "",
        f"{platform.processor() or platform.machine()}, {device}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {torch.get_num_threads()} thread(s), "
        f"{args.repeats} training repeats, {args.decoding_repeats} generation repeats (medians)",
        "",
        f"| training step (fast path) | ours ms | HF ms | ours / HF (target <= {TARGET_STEP}) |",
        "| --- | --- | --- | --- |",
    ]
    for r in steps:
        lines.append(f"| {r['shape']} | {r['ours'] * 1e3:.1f} | {r['hf'] * 1e3:.1f} | {r['ratio']:.2f} |")
    lines += [
        "",
        f"| generation, {PROMPT}-token prompt, {args.new_tokens} new | ours cache tok/s | HF cache tok/s | "
        f"ours recompute tok/s | ours / HF (target >= {TARGET_HF_GENERATE}) | cache speed-up (target >= "
        f"{TARGET_CACHE}) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in gen:
        lines.append(
            f"| batch {r['batch']} | {r['ours cache']:.0f} | {r['hf cache']:.0f} | {r['ours recompute']:.0f} | "
            f"{r['vs_hf']:.2f} | {r['cache_speedup']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2, as bench.py)")
    parser.add_argument("--repeats", type=int, default=7, help="timed training steps per variant (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--decoding-repeats", type=int, default=3, help="timed generations per variant")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens to generate (default 256)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 repeats, 1 generation repeat")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--time-to-loss", action="store_true", help="run time_to_loss instead (minutes)")
    parser.add_argument("--recipe", default="{}", help="JSON: train_gpt settings of the recipe for --time-to-loss")
    args = parser.parse_args(argv)
    for option in ("threads", "repeats", "decoding_repeats", "new_tokens"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.quick:
        args.repeats, args.decoding_repeats = 3, 1
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.time_to_loss:
        result = time_to_loss(json.loads(args.recipe), device=args.device, seed=args.seed, progress=True)
        summary = {k: v for k, v in result.items() if k != "histories"}
        print(json.dumps(summary, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
        return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        parser.error("this benchmark needs transformers: pip install -r requirements-test.txt")
    table = report(args, device, training_steps(args, device), generation(args, device))
    print(table)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
