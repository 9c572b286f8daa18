"""Chapter 13's measurements: from chapter 10's Tang model to one that writes 藏头诗 (acrostic quatrains).

    python benchmarks/finetune.py run --seed 0            # stages (a)-(e) and (c') for one seed (about 15 CPU minutes)
    python benchmarks/finetune.py run --seed 0 --write    # ... and ship its checkpoints and log (seed 0's)
    python benchmarks/finetune.py hack --seed 0           # reward hacking: RL on the rhyme alone, on the three checks
                                                          # without KL ("distinct"), mended (stage e's recipe), and
                                                          # mended with a stronger KL penalty ("stronger_kl", 0.3)
    python benchmarks/finetune.py hack --reward distinct  # only some of those runs
    python benchmarks/finetune.py table                   # the rates' table of the log: mean and spread over seeds
    python benchmarks/finetune.py ship                    # the log -> transformer_lab/assets/finetune_log.json
    python benchmarks/finetune.py curve --steps 2000      # a longer SFT (--lora: LoRA; --rank, --lr, --data replace
                                                          # the recipe's), rates every 250 steps

Base: `transformer_lab/assets/gpt_tang.pt` (chapter 10's, 1.53 M parameters), grown by the three format tokens
(`tl.finetune.add_special_tokens`). Every stage is measured the same way on two sets of 500 heads: heads of
poems neither pretraining nor SFT saw ("held-out": the test split's 藏头 examples, 500 drawn with a fixed seed;
the corpus is sorted by first character, so these heads are skewed towards the end of that order), and sets of
four characters drawn at random from the 300 most common line-initial characters of the seen poems ("random").
One poem per heads, unconstrained sampling at temperature 0.8 (`tl.finetune.evaluate_poems`), the same sampling
seed for every stage.

Stages:
  (a) the base model prompted with one example: "藏头" + heads + the example poem + newline + "藏头" + heads;
      the text up to the next newline is its answer (the context is 64 tokens; this fills 63 of them);
  (b) the base model, each line's first character forced (constrained decoding): every line that starts gets its
      head, though the model still chooses where lines end;
  (c) SFT, all weights, on both instruction kinds (藏头 and 续写) of the seen poems' quatrains that rhyme on lines 2
      and 4 (`sft_splits(rhyming_only=True)`: 44,094 of the 54,726 training examples; the recipe's "data"). The
      recipe's first version trained on every quatrain: its 3 seeds are kept in
      benchmarks/results/finetune-all-quatrains.jsonl, and `ship` adds its (c) and (d) to the shipped log;
  (c') from (c): rejection sampling on the training poems' heads (4 samples each, those passing all three checks
      kept) and SFT on them;
  (d) SFT with LoRA (rank 8 on every Linear of the blocks, the added tokens' 3 rows trained too), the same data;
  (e) from (c): RL with the group-relative policy gradient, reward = share of the three checks passed (a rhyme on
      one character twice does not count), with a KL penalty to the SFT model (kl_coef 0.1: without it the
      policy ends more and more poems on the same few rhyme characters, `hack`'s "distinct" run; `hack`'s
      "stronger_kl" run, kl_coef 0.3, shows what a stronger penalty trades).

Each line of the log (benchmarks/results/finetune.jsonl) is one stage of one seed: the recipe it ran (`settings`,
which `table` and `ship` require to be `SETTINGS` on every line) and where (`made_on`), its rates on both head sets,
its CPU time (`time.process_time`, one thread), its trainable parameters, the training state's memory, its curves,
and 8 samples. The CPU time is: for (a) and (b), which only sample, that of their sampling of the 1,000 heads; for
the other stages the stage's own work, the final measurement on the 1,000 heads left out, but the evaluations the
run makes along the way included: (c) and (d) the SFT run with its curve (validation loss and the rates on 200
held-out heads every 250 steps), (c') the
rejection sampling and its SFT run with its validation, (e) the RL run with its curve's evaluations (100
validation heads every 25 steps and at step 0). So (c), (d), (c') and (e) are more than their training alone.
`--write` also saves seed 0's checkpoints (float16) to
transformer_lab/assets/: finetune_sft.pt (c), finetune_lora.pt (the adapter of d), finetune_rl.pt (e), and the
log as transformer_lab/assets/finetune_log.json, which chapter 13 reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench import processor_name  # noqa: E402 - beside this file: the machine's name as the other benchmarks read it

from transformer_lab import data  # noqa: E402
from transformer_lab import finetune as ft  # noqa: E402
from transformer_lab.cli import FINETUNE_DEFAULTS  # noqa: E402
from transformer_lab.gpt_training import load_gpt  # noqa: E402

LOG = ROOT / "benchmarks" / "results" / "finetune.jsonl"
#: The recipe's first version, SFT on every quatrain (no "data" in its settings), 3 seeds: kept for the comparison.
ALL_QUATRAINS_LOG = ROOT / "benchmarks" / "results" / "finetune-all-quatrains.jsonl"
HACK_LOG = ROOT / "benchmarks" / "results" / "finetune-hacking.jsonl"
ASSETS = ROOT / "transformer_lab" / "assets"
BASE = ASSETS / "gpt_tang.pt"

#: Every stage's settings: the command line's recipes (`transformer-lab sft` / `rl`), and the benchmark's own.
SETTINGS = {
    "heads": 500,
    "temperature": 0.8,
    "sft": FINETUNE_DEFAULTS["sft"],
    "lora": FINETUNE_DEFAULTS["lora"],
    "rejection": {"prompts": 400, "samples": 4, "steps": 80, "batch_size": 32, "lr": 5e-4, "warmup": 10},
    "rl": {**FINETUNE_DEFAULTS["rl"], "eval_every": 25, "eval_heads": 100},
    # the SFT and LoRA runs' curves: validation loss and the rates on the first 200 held-out heads every 250 steps
    "sft_curve": {"every": 250, "heads": 200},
}
SAMPLES = 8


def setup() -> dict:
    """The base, its tokenizer, the data and both sets of heads (the same for every seed)."""
    base, tokenizer = load_gpt(BASE)
    text = data.load_corpus("tang")
    splits = ft.sft_splits(text)
    seen, _ = ft.pretraining_poems(text)
    held_out = ft.held_out_heads(splits, SETTINGS["heads"], seed=0)
    random_heads = ft.common_heads(seen, SETTINGS["heads"], seed=0)
    train_heads = [e.argument for e in splits["train"] if e.kind == "acrostic"]
    valid_heads = [e.argument for e in splits["validation"] if e.kind == "acrostic"]
    training_lines = {line for poem in seen for line in ft.poem_lines(poem) if line}
    example = splits["train"][0]  # the one-shot example of stage (a)
    # what SFT trains and validates on: the recipe's quatrains (those that rhyme, `sft_splits(rhyming_only=True)`)
    sft_data = ft.sft_splits(text, rhyming_only=SETTINGS["sft"]["data"] == "rhyming")
    return dict(
        base=base,
        tokenizer=tokenizer,
        text=text,
        splits=splits,
        sft_data=sft_data,
        heads={"held_out": held_out, "random": random_heads},
        train_heads=train_heads,
        valid_heads=valid_heads,
        training_lines=training_lines,
        example=example,
    )


def rates_of(texts: list, heads: list, lines: set) -> dict:
    return {**ft.poem_rates(texts, heads), **ft.diversity(texts, lines)}


def evaluate(model, fmt, s: dict, seed: int) -> dict:
    out = {}
    for name, heads in s["heads"].items():
        result = ft.evaluate_poems(
            model, fmt, s["tokenizer"], heads, s["training_lines"], temperature=SETTINGS["temperature"], seed=seed
        )
        texts = result.pop("texts")
        out[name] = result
        out[name + "_samples"] = [f"{h} {t}" for h, t in zip(heads[:SAMPLES], texts[:SAMPLES], strict=True)]
    return out


def curve(s: dict, fmt, seed: int):
    """The RL curves' measure: the rates on the first `eval_heads` validation heads (seen poems SFT left out)."""
    heads = s["valid_heads"][: SETTINGS["rl"]["eval_heads"]]

    def point(model) -> dict:
        r = ft.evaluate_poems(
            model, fmt, s["tokenizer"], heads, s["training_lines"], temperature=SETTINGS["temperature"], seed=seed
        )
        r.pop("texts")
        return {k: round(v, 4) for k, v in r.items()}

    return point


def sft_curve_point(s: dict, fmt, seed: int):
    """The SFT and LoRA runs' curve: the rates on the first SETTINGS["sft_curve"]["heads"] held-out heads, called
    by `tl.finetune.sft` as evaluate(model, step)."""
    heads = s["heads"]["held_out"][: SETTINGS["sft_curve"]["heads"]]

    def point(model, step: int) -> dict:
        r = ft.evaluate_poems(
            model, fmt, s["tokenizer"], heads, s["training_lines"], temperature=SETTINGS["temperature"], seed=seed
        )
        texts = r.pop("texts")
        begun = [ft.heads_begun(t, h) for t, h in zip(texts, heads, strict=True)]
        r["lines"] = [sum(b[i] for b in begun) / len(heads) for i in range(4)]  # which line the acrostic misses
        print(f"[seed {seed}] step {step}: {r}", flush=True)
        return {k: (round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v]) for k, v in r.items()}

    return point


def base_one_shot(s: dict, seed: int) -> dict:
    """Stage (a): the base model, prompted with one worked example."""
    model, tok, ex = s["base"], s["tokenizer"], s["example"]
    out = {}
    generator = torch.Generator().manual_seed(seed)
    for name, heads in s["heads"].items():
        prompts = [ex.prompt + ex.response + "\n" + ft.acrostic_prompt(h) for h in heads]
        idx = torch.tensor([list(tok.encode(p)) for p in prompts])
        length = idx.shape[1]
        new = model.generate(
            idx, model.config.block_size - length, temperature=SETTINGS["temperature"], generator=generator
        )[:, length:]
        texts = [ft.four_lines(tok.decode(row.tolist())) for row in new]
        out[name] = rates_of(texts, heads, s["training_lines"])
        out[name + "_samples"] = [f"{h} {t}" for h, t in zip(heads[:SAMPLES], texts[:SAMPLES], strict=True)]
    return out


def base_forced(s: dict, seed: int) -> dict:
    """Stage (b): the base model, each line's first character forced, after one example poem and a newline."""
    model, tok, ex = s["base"], s["tokenizer"], s["example"]
    out = {}
    generator = torch.Generator().manual_seed(seed)
    for name, heads in s["heads"].items():
        idx = torch.tensor([list(tok.encode(ex.response + "\n"))] * len(heads))
        tokens = ft.generate_forced_heads(
            model, idx, heads, tok, 25, temperature=SETTINGS["temperature"], generator=generator
        )
        texts = [ft.four_lines(tok.decode(row.tolist())) for row in tokens[:, idx.shape[1] :]]
        out[name] = rates_of(texts, heads, s["training_lines"])
        out[name + "_samples"] = [f"{h} {t}" for h, t in zip(heads[:SAMPLES], texts[:SAMPLES], strict=True)]
    return out


@torch.no_grad()
def round_to_half(model) -> None:
    """Round every weight to float16 and back: the model becomes exactly what its float16 checkpoint holds."""
    for p in model.state_dict().values():
        if p.is_floating_point():
            p.copy_(p.half().float())


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def state_bytes(count: int) -> int:
    """The training state a parameter count costs: its gradient and AdamW's two moments, float32 each. For the LoRA
    run this counts A, B and the 3 token rows; the run itself holds more, since the rows belong to the tied
    embedding, which AdamW gets whole (9.21 MiB measured in chapter 13, against 17.54 MiB for full SFT)."""
    return 3 * 4 * count


def train_sft(base, train, valid, seed: int, lora: bool = False, log=print, evaluate=None, **override):
    """Stage (c) (`lora=False`) or (d): the command line's `sft` recipe (SETTINGS, `override` replacing some of it:
    the tests' short runs) on `base` grown by the format tokens, then rounded to float16 as shipped. `evaluate`
    (model, step) -> rates is called with the validation loss every SETTINGS["sft_curve"]["every"] steps (the
    curve; it samples with its own generator, so the weights are those of a run without it). Returns (model,
    history, trainable parameters)."""
    c = {**SETTINGS["lora" if lora else "sft"], **override}
    model, hist = ft.fine_tune(
        base,
        train,
        valid,
        seed=seed,
        lora_rank=c["rank"] if lora else 0,
        lora_alpha=c["alpha"] if lora else None,
        lora_targets=c["targets"] if lora else (),
        steps=c["steps"],
        batch_size=c["batch_size"],
        lr=c["lr"],
        warmup=c["warmup"],
        eval_every=SETTINGS["sft_curve"]["every"],
        log=log,
        evaluate=evaluate,
    )
    count = trainable(model) + (3 * model.config.d_model if lora else 0)
    if lora:
        with torch.no_grad():  # as shipped: A, B and the rows in float16 (the adapter is saved so)
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(p.half().float())
            model.token_embedding.weight[-3:] = model.token_embedding.weight[-3:].half().float()
    else:
        round_to_half(model)  # the model as shipped (float16): (c'), (e) and the CLI start from the same weights
    return model, hist, count


def train_rl(sft_model, fmt, tok, heads: list, seed: int, evaluate=None, log=print, **override):
    """Stage (e): the command line's `rl` recipe (SETTINGS, `override` replacing some of it) on a copy of the SFT
    model, with the poem's reward (a rhyme on one character twice does not count) and the recipe's KL penalty
    to the SFT model itself (kl_coef), rounded to float16 as shipped. Returns (model, history)."""
    return _train_rl_with(
        sft_model, fmt, tok, heads, seed, lambda text, h: ft.poem_reward(text, h, True), evaluate, override, log
    )


def _train_rl_with(sft_model, fmt, tok, heads: list, seed: int, reward, evaluate, override: dict, log=print):
    import copy

    c = {**SETTINGS["rl"], **override}
    model = copy.deepcopy(sft_model)
    reference = copy.deepcopy(sft_model) if c["kl_coef"] else None
    hist = ft.rl(
        model,
        fmt,
        tok,
        heads,
        reward,
        steps=c["steps"],
        prompts_per_step=c["prompts_per_step"],
        group_size=c["group_size"],
        lr=c["lr"],
        temperature=c["temperature"],
        kl_coef=c["kl_coef"],
        reference=reference,
        seed=seed,
        evaluate=evaluate,
        eval_every=c["eval_every"],
        log=log,
    )
    round_to_half(model)
    return model, hist


STAGES = ("a", "b", "c", "d", "c2", "e")


def run(seed: int, write: bool, log_path: Path, stages: tuple[str, ...] = STAGES) -> None:
    """The stages of one seed (`stages`: some of STAGES, e.g. ("a", "b", "c", "e") for the pipeline without LoRA
    and rejection sampling: each stage's result does not depend on the others run beside it). `write` (all
    stages) ships the checkpoints."""
    if write and tuple(stages) != STAGES:
        raise ValueError("--write ships every stage's checkpoint: run all the stages")
    torch.set_num_threads(1)
    s = setup()
    tok = s["tokenizer"]
    fmt = ft.SFTFormat(tok.vocab_size)
    records = []

    def record(stage: str, seconds: float, extra: dict, model=None) -> None:
        line = {"stage": stage, "seed": seed, "cpu_seconds": round(seconds, 2), **extra, **_provenance()}
        records.append(line)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        short = {k: {m: round(v, 3) for m, v in line[k].items()} for k in ("held_out", "random")}
        print(f"[seed {seed}] {stage}: {seconds:.1f} s CPU {short}", flush=True)

    torch.manual_seed(seed)
    if "a" in stages:
        t = time.process_time()
        result = base_one_shot(s, seed)  # sampling only: the CPU time of the 1,000 samples
        record("a_base_one_shot", time.process_time() - t, result)
    if "b" in stages:
        t = time.process_time()
        result = base_forced(s, seed)
        record("b_forced_heads", time.process_time() - t, result)

    train = ft.encode_examples(s["sft_data"]["train"], fmt, tok)
    valid = ft.encode_examples(s["sft_data"]["validation"], fmt, tok)

    # (c) SFT, all weights
    sft_model, hist, count = train_sft(s["base"], train, valid, seed, evaluate=sft_curve_point(s, fmt, seed))
    record(
        "c_sft",
        hist["seconds"][0],
        {
            "trainable": count,
            "state_bytes": state_bytes(count),
            "curve": {k: hist[k] for k in ("eval_step", "val_loss", "eval")},
            **evaluate(sft_model, fmt, s, seed),
        },
    )
    if write:  # at once: the reward-hacking run starts from it
        ft.save_sft(sft_model, ASSETS / "finetune_sft.pt", tok, fmt, half=True, settings=SETTINGS["sft"])

    # (d) SFT with LoRA
    if "d" in stages:
        lora_model, hist, count = train_sft(
            s["base"], train, valid, seed, lora=True, evaluate=sft_curve_point(s, fmt, seed)
        )
        record(
            "d_lora",
            hist["seconds"][0],
            {
                "trainable": count,
                "state_bytes": state_bytes(count),
                "trainable_share": count / sum(p.numel() for p in s["base"].parameters()),
                "curve": {k: hist[k] for k in ("eval_step", "val_loss", "eval")},
                **evaluate(lora_model, fmt, s, seed),
            },
        )

    # (c') rejection sampling from (c), then SFT on the kept poems
    if "c2" in stages:
        import copy

        c = SETTINGS["rejection"]
        rft_model = copy.deepcopy(sft_model)
        t = time.process_time()
        prompts = random.Random(seed).sample(s["train_heads"], c["prompts"])
        pairs = ft.rejection_sample(rft_model, fmt, tok, prompts, samples=c["samples"], seed=seed)
        sampling = time.process_time() - t
        hist = ft.sft(
            rft_model,
            ft.encode_examples(pairs, fmt, tok),
            valid,
            steps=c["steps"],
            batch_size=c["batch_size"],
            lr=c["lr"],
            warmup=c["warmup"],
            seed=seed,
            eval_every=80,
        )
        record(
            "c2_rejection",
            sampling + hist["seconds"][0],
            {"kept": len(pairs), "sampled": c["prompts"] * c["samples"], **evaluate(rft_model, fmt, s, seed)},
        )

    # (e) RL from (c)
    if "e" not in stages:
        return
    rl_model, hist = train_rl(sft_model, fmt, tok, s["train_heads"], seed, evaluate=curve(s, fmt, seed))
    record(
        "e_rl",
        hist["seconds"][0],
        {
            "curve": {
                "step": hist["step"],
                "reward": hist["reward"],
                "eval_step": hist["eval_step"],
                "eval": hist["eval"],
            },
            **evaluate(rl_model, fmt, s, seed),
        },
    )

    if write:
        ft.save_sft(rl_model, ASSETS / "finetune_rl.pt", tok, fmt, half=True, settings=SETTINGS["rl"])
        ft.save_lora(lora_model, ASSETS / "finetune_lora.pt", new_rows=3, half=True, settings=SETTINGS["lora"])
    print(f"[seed {seed}] total CPU {time.process_time():.0f} s")


#: The reward-hacking runs (`hack`): name -> (reward, KL penalty to the SFT model). "rhyme_only" is the reward a
#: policy games (the same last character at the end of lines 2 and 4); "distinct" the three checks with 重韵 not
#: counted, no KL (each poem is then fine, but the policy ends nearly every poem on a few rhyme characters);
#: "mended" stage (e)'s recipe: the same reward with the KL penalty (`SETTINGS["rl"]["kl_coef"]`); "stronger_kl" the
#: same with a penalty three times as strong (what the penalty trades: reward for variety).
HACK_RUNS = {
    "rhyme_only": (ft.rhyme_reward, 0.0),
    "distinct": (lambda text, heads: ft.poem_reward(text, heads, True), 0.0),
    "mended": (lambda text, heads: ft.poem_reward(text, heads, True), None),
    "stronger_kl": (lambda text, heads: ft.poem_reward(text, heads, True), 0.3),
}


def hack(seed: int, log_path: Path, names: list[str] | None = None) -> None:
    """RL from seed `seed`'s SFT model (finetune_sft.pt, as shipped) with each reward of `HACK_RUNS` (all by
    default); "mended" is stage (e)'s recipe, the same run as the stage's of that seed."""
    torch.set_num_threads(1)
    s = setup()
    for name in names or list(HACK_RUNS):
        reward, kl_coef = HACK_RUNS[name]
        sft_model, tok, fmt = ft.load_sft(ASSETS / "finetune_sft.pt")
        override = {} if kl_coef is None else {"kl_coef": kl_coef}
        model, hist = _train_rl_with(sft_model, fmt, tok, s["train_heads"], seed, reward, curve(s, fmt, seed), override)
        line = {
            "reward": name,
            "seed": seed,
            "kl_coef": SETTINGS["rl"]["kl_coef"] if kl_coef is None else kl_coef,
            "cpu_seconds": round(hist["seconds"][0], 2),
            "curve": {
                "step": hist["step"],
                "reward": hist["reward"],
                "eval_step": hist["eval_step"],
                "eval": hist["eval"],
            },
            **evaluate(model, fmt, s, seed),
        }
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        print(name, line["held_out"], line["held_out_samples"], flush=True)


def _provenance() -> dict:
    """What a log line records of how it was made: the recipe (`SETTINGS`), the machine and torch."""
    return {
        "settings": SETTINGS,
        "made_on": f"{time.strftime('%Y-%m-%d')}, {processor_name()}, torch {torch.__version__}",
    }


def check_one_recipe(rows: list[dict]) -> None:
    """Refuse a log whose lines ran another recipe than `SETTINGS` (the command line's defaults and the benchmark's
    own), or do not say which: their rates would be averaged with the others' as if they were more seeds of it."""
    for r in rows:
        if r.get("settings") != SETTINGS:
            said = "records no recipe" if "settings" not in r else "ran another recipe than SETTINGS"
            raise SystemExit(
                f"the log's line for stage {r.get('stage')!r}, seed {r.get('seed')!r} {said}: its rates cannot "
                "be averaged with the others'. Run that stage and seed again with `run --seed N --stages ...` "
                "(into a fresh log), or take the line out."
            )


STAGE_NAMES = {
    "a_base_one_shot": "(a) base, one example",
    "b_forced_heads": "(b) base, heads forced",
    "c_sft": "(c) SFT, all weights",
    "c2_rejection": "(c') (c) + rejection sampling",
    "d_lora": "(d) SFT with LoRA",
    "e_rl": "(e) (c) + RL",
}


def table(log_path: Path) -> str:
    """The rates' table (markdown): per stage and head set, each measure's mean ± spread (max - min) over the
    seeds in % (a stage may have fewer seeds than another: its "seeds" column), and the CPU seconds (mean)."""
    rows = [json.loads(line) for line in open(log_path, encoding="utf-8") if line.strip()]
    check_one_recipe(rows)
    stages = [s for s in STAGE_NAMES if any(r["stage"] == s for r in rows)]
    keys = ("form", "acrostic", "rhyme", "all", "distinct", "copied", "last_chars")
    lines = []
    for heads in ("held_out", "random"):
        seeds = sorted({r["seed"] for r in rows})
        lines.append(f"\n{heads.replace('_', '-')} heads, 500, seeds {seeds}: mean ± spread (max - min), %\n")
        lines.append("| stage | seeds | " + " | ".join(keys) + " | CPU s |")
        lines.append("|---" * (len(keys) + 3) + "|")
        for stage in stages:
            rs = [r for r in rows if r["stage"] == stage]
            cells = []
            for k in keys:
                v = [100 * r[heads][k] for r in rs]
                cells.append(f"{sum(v) / len(v):.1f} ± {max(v) - min(v):.1f}")
            sec = [r["cpu_seconds"] for r in rs]
            seeds_of = ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"]))
            lines.append(
                f"| {STAGE_NAMES[stage]} | {seeds_of} | " + " | ".join(cells) + f" | {sum(sec) / len(sec):.0f} |"
            )
    return "\n".join(lines)


def sft_curve(
    seed: int,
    steps: int,
    every: int,
    lora: bool,
    log_path: Path,
    rank: int | None = None,
    lr: float | None = None,
    data: str | None = None,
) -> None:
    """A longer SFT run (all weights, or LoRA) with the rates on the 500 held-out heads every `every` steps: how
    far a longer run, or another LoRA rank, rate or data, gets than the recipe's. `rank`, `lr`, `data` replace
    the recipe's (SETTINGS["lora"] or ["sft"]); each line appended as it comes records the run's recipe."""
    torch.set_num_threads(1)
    s = setup()
    tok = s["tokenizer"]
    fmt = ft.SFTFormat(tok.vocab_size)
    c = {**SETTINGS["lora" if lora else "sft"], "steps": steps}
    c.update({k: v for k, v in (("rank", rank), ("lr", lr), ("data", data)) if v is not None})
    if rank is not None:
        if not lora:
            raise SystemExit("--rank is LoRA's: give --lora too")
        c["alpha"] = 2.0 * rank  # the recipe's alpha / rank = 2
    splits = ft.sft_splits(s["text"], rhyming_only=c["data"] == "rhyming")
    train = ft.encode_examples(splits["train"], fmt, tok)
    valid = ft.encode_examples(splits["validation"], fmt, tok)

    def point(m, step: int) -> dict:
        result = ft.evaluate_poems(
            m, fmt, tok, s["heads"]["held_out"], s["training_lines"], temperature=SETTINGS["temperature"], seed=seed
        )
        result.pop("texts")
        line = {
            "run": "lora" if lora else "sft",
            "seed": seed,
            "recipe": c,
            "step": step,
            "cpu_seconds": round(time.process_time(), 1),
            "held_out": result,
            "made_on": _provenance()["made_on"],
        }
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        print(line, flush=True)
        return result

    ft.fine_tune(
        s["base"],
        train,
        valid,
        seed=seed,
        lora_rank=c["rank"] if lora else 0,
        lora_alpha=c["alpha"] if lora else None,
        lora_targets=c["targets"] if lora else (),
        steps=steps,
        batch_size=c["batch_size"],
        lr=c["lr"],
        warmup=c["warmup"],
        eval_every=every,
        evaluate=point,
    )


def summary(rows: list[dict]) -> dict:
    """Per stage and head set: each measure's mean, spread (max - min) and values over the seeds; CPU seconds."""
    out: dict = {}
    for stage in sorted({r["stage"] for r in rows}):
        rs = sorted((r for r in rows if r["stage"] == stage), key=lambda r: r["seed"])
        entry: dict = {"seeds": [r["seed"] for r in rs]}
        for heads in ("held_out", "random"):
            entry[heads] = {}
            for key in rs[0][heads]:
                values = [r[heads][key] for r in rs]
                entry[heads][key] = {
                    "mean": sum(values) / len(values),
                    "spread": max(values) - min(values),
                    "values": values,
                }
        sec = [r["cpu_seconds"] for r in rs]
        entry["cpu_seconds"] = {"mean": sum(sec) / len(sec), "values": sec}
        for key in ("trainable", "state_bytes", "trainable_share", "kept", "sampled"):
            if key in rs[0]:
                entry[key] = rs[0][key]
        out[stage] = entry
    return out


def all_quatrains_summary() -> dict:
    """Stages (c) and (d) of the recipe's first version, SFT on every quatrain of the seen poems (not only those
    that rhyme), from ALL_QUATRAINS_LOG: `summary` of their lines. Checked to be the recipe's SFT and LoRA but for
    the data, measured the same way (heads, temperature, curve), so the two differ by the data alone."""
    rows = [json.loads(line) for line in open(ALL_QUATRAINS_LOG, encoding="utf-8") if line.strip()]
    rows = [r for r in rows if r["stage"] in ("c_sft", "d_lora")]
    for r in rows:
        theirs = r.get("settings", {})
        for key in ("sft", "lora"):
            if theirs.get(key) != {k: v for k, v in SETTINGS[key].items() if k != "data"}:
                raise SystemExit(
                    f"{ALL_QUATRAINS_LOG.name}: seed {r['seed']}'s {key} recipe is not SETTINGS' but for the data"
                )
        if any(theirs.get(k) != SETTINGS[k] for k in ("heads", "temperature", "sft_curve")):
            raise SystemExit(f"{ALL_QUATRAINS_LOG.name}: seed {r['seed']} was measured another way")
    return summary(rows)


def ship() -> None:
    """benchmarks/results/finetune.jsonl (every seed's lines) -> transformer_lab/assets/finetune_log.json: the
    settings, the summary, every line, the reward-hacking runs' lines, and "all_quatrains" (the summary of (c) and
    (d) trained on every quatrain, `all_quatrains_summary`). A seed whose "mended" run is not in the
    hacking log gets stage (e)'s line of that seed as it: the same run (the same SFT model as shipped in float16,
    reward, KL penalty, seed and steps), deterministic on a CPU, so it is not run twice."""
    rows = [json.loads(line) for line in open(LOG, encoding="utf-8") if line.strip()]
    check_one_recipe(rows)
    hacking = [json.loads(line) for line in open(HACK_LOG, encoding="utf-8")] if HACK_LOG.exists() else []
    for seed in sorted({h["seed"] for h in hacking}):
        if not any(h["seed"] == seed and h["reward"] == "mended" for h in hacking):
            e = next((r for r in rows if r["stage"] == "e_rl" and r["seed"] == seed), None)
            if e is not None:
                keep = {k: v for k, v in e.items() if k not in ("stage", "seed")}
                hacking.append({"reward": "mended", "seed": seed, "kl_coef": SETTINGS["rl"]["kl_coef"], **keep})
    runs = [{k: v for k, v in r.items() if k != "settings"} for r in rows]  # every line's is SETTINGS (checked)
    shipped = {
        "settings": SETTINGS,
        "base": "gpt_tang.pt",
        "summary": summary(rows),
        "runs": runs,
        "hacking": hacking,
        "all_quatrains": all_quatrains_summary(),
    }
    (ASSETS / "finetune_log.json").write_text(json.dumps(shipped, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(table(LOG))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("run", "hack", "table", "ship", "curve"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", default=",".join(STAGES), help="run: some of a,b,c,d,c2,e (c always runs)")
    parser.add_argument("--write", action="store_true", help="ship the checkpoints and the log (seed 0)")
    parser.add_argument("--log", default=None)
    parser.add_argument("--steps", type=int, default=1000, help="curve: SFT steps")
    parser.add_argument("--every", type=int, default=250, help="curve: steps between evaluations")
    parser.add_argument("--lora", action="store_true", help="curve: LoRA instead of all weights")
    parser.add_argument("--rank", type=int, default=None, help="curve: LoRA's rank (alpha = 2 rank)")
    parser.add_argument("--lr", type=float, default=None, help="curve: the peak learning rate")
    parser.add_argument("--data", choices=("rhyming", "all"), default=None, help="curve: the SFT quatrains")
    parser.add_argument("--reward", action="append", choices=list(HACK_RUNS), help="hack: only these runs")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.command == "run":
        stages = tuple(args.stages.split(","))
        if not set(stages) <= set(STAGES):
            parser.error(f"--stages must be some of {','.join(STAGES)}, got {args.stages}")
        run(args.seed, args.write, Path(args.log) if args.log else LOG, stages)
    elif args.command == "hack":
        hack(args.seed, Path(args.log) if args.log else HACK_LOG, args.reward)
    elif args.command == "curve":
        log = Path(args.log) if args.log else ROOT / "benchmarks" / "results" / "finetune-sft-curve.jsonl"
        sft_curve(args.seed, args.steps, args.every, args.lora, log, args.rank, args.lr, args.data)
    elif args.command == "ship":
        ship()
    else:
        print(table(Path(args.log) if args.log else LOG))


if __name__ == "__main__":
    main()
