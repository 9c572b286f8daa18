"""Chapter 11's measurements: each modern change at equal training time, and the full modern model's headline.

    python benchmarks/modern_decoder.py ablation              # every variant x 3 seeds, two at a time (CPU-hours)
    python benchmarks/modern_decoder.py ablation --jobs 1     # one at a time, on a quiet machine
    python benchmarks/modern_decoder.py ablation --budget equal-steps --variants "full modern" "+ Muon"
                                                              # the equal-steps column: 1400 steps each (CPU-hours)
    python benchmarks/modern_decoder.py table                 # the table of the log (mean, spread, verdict)
    python benchmarks/modern_decoder.py headline              # chapter 10 against the full modern model (minutes)

The model is chapter 10's (d_model 128, 4 layers, 4 heads, context 64, batch 12, Tiny Shakespeare characters,
the loss `tl.training.evaluate_text` over the whole validation split). Every run trains on one thread.

**ablation**: first chapter 10's own recipe (`gpt_recipe.CHAPTER_RECIPE`, 1400 AdamW steps) once per seed; the
mean of their training times is the budget T. Then every other variant trains for exactly T of training time
(`train_gpt(seconds=T)`: evaluation excluded, the cosine decays over the time, so a change that makes a step
slower pays with fewer steps): each change alone added to chapter 10's model ("+ ..."), each removed from the
full modern model ("- ..."), and the full model. One line per run goes to the log (JSON lines, resumable: a run
already in the log with the same settings is not repeated). `--clock cpu` counts the process's CPU time instead of
the wall clock: on one thread the two agree on a quiet machine (each line records both), and CPU time stays fair
when other programs share the cores.

**ablation --budget equal-steps**: the variants whose step cost (the costs file) differs from chapter 10's by more
than 3 %, each trained for chapter 10's 1400 steps whatever a step costs, into their own log
(`transformer_lab/assets/modern_ablation_steps.jsonl`), every seed of one variant before the next: quality per step,
apart from the cost of a step.

**table**: per variant the mean final validation loss over the seeds, the spread (max - min), the mean steps,
and the change against its reference (chapter 10 for "+", the full model for "-"); a change counts as helping
only when its gain exceeds the larger of the two seed spreads. Writes `benchmarks/results/modern-ablation.md`, with the
equal-steps column's table after it where that log has runs, with the changes sorted by what is left of them
at equal steps (`PER_STEP_GROUPS`, as chapter 11 prints them).

**headline**: one process, one thread: chapter 10's recipe (its 1400 steps, evaluated every 100), then the full
modern model with its own recipe given half of that training time, then given all of it. Prints the time the
modern model needs to reach chapter 10's final loss of this run, over chapter 10's time (the issue's target:
at most 0.5), and its loss at chapter 10's full time (target: 1.70 or lower); exits 1 if the ratio is above 0.5.
With --write it saves the full-time model as `transformer_lab/assets/gpt_modern_shakespeare.pt` (float16, with
both histories) and the figures as `transformer_lab/assets/modern_headline.json`, which chapter 11 reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench import bfloat16_flags, processor_name  # noqa: E402 - beside this file: the machine's name as the other benchmarks read it
from gpt_recipe import CHAPTER_RECIPE, MODEL  # noqa: E402

from transformer_lab.gpt_training import (  # noqa: E402 - the equal-steps rule, shared with chapter 11's cell
    ABLATION_SEEDS,
    EQUAL_STEPS_GAP,
    PER_STEP_GROUPS,
    ablation_summary,
    change_step_cost,
    per_step_group,
)

ASSETS = ROOT / "transformer_lab" / "assets"
LOG = ASSETS / "modern_ablation.jsonl"
TABLE = ROOT / "benchmarks" / "results" / "modern-ablation.md"
COSTS = ROOT / "benchmarks" / "results" / "modern-step-costs.json"
#: Where finished runs of later "full + X" variants (`FULL_PLUS`) may wait, three seeds each, to join LOG when chapter
#: 11 is executed again (the chapter prints every run of LOG): `cat` them onto LOG, then delete this file. Empty now:
#: the four variants' runs are in LOG.
LATER = ROOT / "benchmarks" / "results" / "modern-ablation-later.jsonl"
#: The equal-steps column: the variants whose step cost differs from chapter 10's by more than `EQUAL_STEPS_GAP`,
#: each trained for chapter 10's 1400 steps (not its time), so that quality per step and cost per step are told apart;
#: and chapter 10 itself (`--variants "chapter 10"`), their reference, on the same machine.
STEPS_LOG = ASSETS / "modern_ablation_steps.jsonl"

#: The full modern model: nanochat's choices on chapter 10's model (no biases, untied head, rotary positions,
#: RMSNorm without a weight everywhere and after the embedding, QK norm, ReLU^2, soft-capped logits, zero-initialised
#: output projections), trained with Muon.
MODERN: dict[str, Any] = dict(
    bias=False,
    tie_embeddings=False,
    positions="rope",
    norm="rms_no_weight",
    embedding_norm=True,
    qk_norm="rms_no_weight",
    activation="relu2",
    logit_softcap=15.0,
    zero_init_output=True,
)
#: Chapter 10's recipe, as a time-budgeted run (its step count replaced by the budget). AdamW runs its plain
#: implementation (fused=False), with which the published table and step costs were measured; the package has
#: used PyTorch's fused AdamW by default since (`make_adamw`), which makes a training step 1-4 % cheaper.
ADAMW_RECIPE: dict[str, Any] = dict(
    batch_size=12, lr=3e-3, min_lr=1e-4, warmup=30, weight_decay=0.1, clip_norm=1.0, fused=False
)
#: Chapter 10's recipe itself (its 1400 steps): the reference, and what sets the budget.
CHAPTER_10: dict[str, Any] = dict(ADAMW_RECIPE, steps=CHAPTER_RECIPE["steps"])
#: The full modern model's recipe: Muon for the blocks' matrices, AdamW (as chapter 10) for the rest.
MUON_RECIPE: dict[str, Any] = dict(ADAMW_RECIPE, optimizer="muon", muon_lr=0.02, warmup=10)

#: Each change: its name, and the config fields that make it (on top of chapter 10's / removed from the full model).
#: GQA and SwiGLU are not in the full model (nanochat uses neither): they are measured added to both.
CHANGES: dict[str, dict[str, Any]] = {
    "rotary positions": dict(positions="rope"),
    "RMSNorm (no weight)": dict(norm="rms_no_weight"),
    "norm after embedding": dict(embedding_norm=True),
    "QK norm": dict(qk_norm="rms_no_weight"),
    "ReLU^2 MLP": dict(activation="relu2"),
    "no biases": dict(bias=False),
    "untied head": dict(tie_embeddings=False),
    "logit soft-cap 15": dict(logit_softcap=15.0),
    "zero-init projections": dict(zero_init_output=True),
    "Muon": {},  # the optimizer, not the config
    "SwiGLU MLP": dict(activation="swiglu"),
    "GQA (2 KV heads)": dict(n_kv_heads=2),
}
#: What a change becomes when removed from the full model (GPT-2's setting).
GPT2_SETTING: dict[str, dict[str, Any]] = {
    "rotary positions": dict(positions="learned"),
    "RMSNorm (no weight)": dict(norm="layer"),
    "norm after embedding": dict(embedding_norm=False),
    "QK norm": dict(qk_norm=None),
    "ReLU^2 MLP": dict(activation="gelu_tanh"),
    "no biases": dict(bias=True),
    "untied head": dict(tie_embeddings=True),
    "logit soft-cap 15": dict(logit_softcap=None),
    "zero-init projections": dict(zero_init_output=False),
    "Muon": {},
}
ALTERNATIVES = ("SwiGLU MLP", "GQA (2 KV heads)")
#: Chapter 11's later switches, each added to the full model ("full + X"), with the config fields that make it.
#: nanochat's initialisation is measured with and without the norm after the embedding: with GPT-2's 0.02-scale
#: embedding that norm multiplies the stream by about 50, with nanochat's N(0, 1) embedding by about 1.
FULL_PLUS: dict[str, dict[str, Any]] = {
    "nanochat init": dict(init="nanochat"),
    "nanochat init, no norm after embedding": dict(init="nanochat", embedding_norm=False),
    "sliding window (SSSL)": dict(window_pattern="SSSL"),
    "QK norm gain": dict(qk_norm="rms"),
}
#: Variants whose training step is the same arithmetic as another variant's (only the initial values differ): their
#: step cost is that variant's, not timed again (`costs` copies it).
SAME_STEP_AS: dict[str, str] = {
    "full + nanochat init": "full modern",
    "full + nanochat init, no norm after embedding": "- norm after embedding",
}
TIMED_REFERENCE = "chapter 10, timed"  # added to the full model too, not removed from it


def variants() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Every variant of the ablation: name -> (config overrides, recipe)."""
    # chapter 10's recipe once more, as a timed run: the reference of the "+" rows, measured as they are (its own
    # 1400-step runs set the budget, but ran under other conditions of the machine than the timed ones may)
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {"chapter 10": ({}, ADAMW_RECIPE)}
    out[TIMED_REFERENCE] = ({}, ADAMW_RECIPE)
    for name, fields in CHANGES.items():
        out[f"+ {name}"] = (dict(fields), MUON_RECIPE if name == "Muon" else ADAMW_RECIPE)
    out["full modern"] = (dict(MODERN), MUON_RECIPE)
    for name, fields in GPT2_SETTING.items():
        out[f"- {name}"] = (dict(MODERN, **fields), ADAMW_RECIPE if name == "Muon" else MUON_RECIPE)
    for name in ALTERNATIVES:
        out[f"full + {name}"] = (dict(MODERN, **CHANGES[name]), MUON_RECIPE)
    for name, fields in FULL_PLUS.items():
        out[f"full + {name}"] = (dict(MODERN, **fields), MUON_RECIPE)
    return out


def _machine() -> str:
    """The processor's model name, how many CPUs this process sees and its bfloat16 instructions, as the log records
    them (runs before the flags were recorded name only the processor and the CPUs)."""
    return f"{processor_name()} ({os.cpu_count()} CPUs; {bfloat16_flags()})"


# ---------------------------------------------------------------- one run (in a worker process)

_DATA: dict[str, Any] = {}


def _init_worker() -> None:
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


def _data() -> tuple[Any, Any, Any]:
    if not _DATA:
        from transformer_lab.data import TextTokenizer, load_corpus, split_text

        text = load_corpus("shakespeare")
        tokenizer = TextTokenizer.from_text(text)
        _DATA["tokenizer"] = tokenizer
        _DATA["train"], _DATA["val"] = split_text(tokenizer.encode(text))
    return _DATA["tokenizer"], _DATA["train"], _DATA["val"]


def train_one(
    overrides: dict[str, Any],
    recipe: dict[str, Any],
    seed: int,
    seconds: float | None,
    clock: str,
    eval_every: int | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train one variant from seed `seed`; returns (model, history, the log line's measurements)."""
    from transformer_lab.gpt import GPT, GPTConfig
    from transformer_lab.training import train_gpt

    tokenizer, train_data, val_data = _data()
    torch.manual_seed(seed)
    model = GPT(GPTConfig(tokenizer.vocab_size, **MODEL, **overrides))
    kwargs = dict(recipe)
    if seconds is not None:
        kwargs.update(steps=10**6, seconds=seconds)
    wall, cpu = time.perf_counter(), time.process_time()
    history = train_gpt(
        model, train_data, val_data, seed=seed, progress=False, clock=clock, eval_every=eval_every or 10**7, **kwargs
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    line = dict(
        steps=history.step[-1],
        train_seconds=round(history.eval_seconds[-1], 3),
        val_loss=round(history.val_loss[-1], 5),
        run_wall_seconds=round(wall, 2),
        run_cpu_seconds=round(cpu, 2),
    )
    return model, history, line


def _job(job: dict[str, Any]) -> dict[str, Any]:
    clock = "wall" if job["clock"] == "steps" else job["clock"]
    _, _, line = train_one(job["overrides"], job["recipe"], job["seed"], job["seconds"], clock)
    if job.get("step_cost_ms") is not None:
        # the training time this many steps take at the step cost measured side by side with chapter 10's (the
        # budget), kept apart from the time this run happened to take on the machine it ran on
        line["run_train_seconds"] = line["train_seconds"]
        line["train_seconds"] = round(line["steps"] * job["step_cost_ms"] / 1000, 3)
    return dict(job, **line)


# ---------------------------------------------------------------- step costs, side by side


def _synchronize(device: torch.device) -> None:
    """Wait until `device` has finished the work queued on it: a GPU runs kernels asynchronously, so a clock read
    without this measures how fast Python queued the step, not the step. On the CPU there is nothing to wait for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def device_name(device: torch.device) -> str:
    """The accelerator's name as the result file records it: the GPU's (CUDA), else the processor's (the CPU, or
    the Apple chip whose GPU MPS is)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return processor_name()


def costs_path(device: torch.device) -> Path:
    """Where `costs` writes by default: the CPU's file (`COSTS`, which chapter 11 and the ablation read), or beside
    it one per accelerator, e.g. `modern-step-costs-cuda-nvidia-h200.json`, which never replaces the CPU's."""
    if device.type == "cpu":
        return COSTS
    slug = "-".join("".join(c if c.isalnum() else " " for c in f"{device.type} {device_name(device)}".lower()).split())
    return COSTS.with_name(f"modern-step-costs-{slug}.json")


def step_costs(
    names: list[str], rounds: int, steps: int, seed: int = 0, device: torch.device | str = "cpu"
) -> dict[str, list[float]]:
    """Each variant's training step, timed in turn in this process: {name: [ms per step of each round]}.

    Every variant gets its own model and optimizer, which live through all the rounds; a round times `steps`
    training steps of each variant in turn (`tl.loop.run_steps`, the training loop itself, at a constant rate), in
    an order shuffled anew each round, so that a slow minute of the machine falls on all of them alike and no
    variant is always first. A first round, not timed, warms them up.

    `device` ("cpu", "cuda", "cuda:1", "mps"): where the models train. The batches are drawn on the CPU and moved
    there inside the step, as `train_gpt` does; on a GPU the timed region begins and ends with the device
    synchronised (`_synchronize`), so that each step's kernels are counted in full.
    """
    from transformer_lab._checks import as_device
    from transformer_lab.data import random_windows
    from transformer_lab.gpt import GPT, GPTConfig
    from transformer_lab.gpt_training import TextHistory, _gpt_optimizer
    from transformer_lab.loop import data_parallel, run_steps

    device = as_device("device", device)
    tokenizer, train_data, _ = _data()
    table = variants()
    state = {}
    for name in names:
        overrides, recipe = table[name]
        torch.manual_seed(seed)
        model = GPT(GPTConfig(tokenizer.vocab_size, **MODEL, **overrides)).to(device)
        optimizer = _gpt_optimizer(
            recipe.get("optimizer", "adamw"),
            model,
            recipe["lr"],
            recipe["weight_decay"],
            (0.9, 0.99),
            recipe.get("muon_lr", 0.02),
            0.0,
            recipe["fused"],
        )
        state[name] = (model, optimizer, torch.Generator().manual_seed(seed), recipe)
    block, batch = MODEL["block_size"], ADAMW_RECIPE["batch_size"]
    costs: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 1):
        order = list(names)
        random.Random(r).shuffle(order)  # no variant always first in its round, or always after the same one
        for name in order:
            model, optimizer, generator, recipe = state[name]
            lr = recipe["lr"] / 3  # a mid-schedule rate: the timing does not depend on it

            def loss(net: torch.nn.Module, generator: torch.Generator = generator) -> torch.Tensor:
                x, y = random_windows(train_data, block, batch, generator)
                x, y = x.to(device), y.to(device)  # as train_gpt: drawn on the CPU, moved within the step
                return torch.nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten())

            _synchronize(device)  # nothing of the previous variant still running on a GPU
            start = time.perf_counter()
            run_steps(
                model,
                data_parallel(model, None),
                optimizer,
                TextHistory(),
                steps=steps,
                rate=lambda step, trained, lr=lr: lr,
                base_lr=recipe["lr"],
                loss=loss,
                clip_norm=recipe["clip_norm"],
                progress=False,
            )
            _synchronize(device)  # every kernel of these steps done
            if r:  # round 0 warms up
                costs[name].append((time.perf_counter() - start) / steps * 1000)
        if r:
            print(f"round {r}/{rounds}: " + ", ".join(f"{n} {c[-1]:.1f}" for n, c in costs.items()), flush=True)
    return costs


def costs_command(args: argparse.Namespace) -> int:
    from transformer_lab._checks import as_device

    try:
        device = as_device("--device", args.device)
    except ValueError as error:
        print(f"costs: {error} (torch {torch.__version__})", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else costs_path(device)
    if device.type != "cpu" and out.resolve() == COSTS.resolve():
        print(
            f"costs: --out {_shown(out)} is the CPU's step costs, which chapter 11 and the ablation read; "
            f"leave --out out with --device {args.device} (it writes {_shown(costs_path(device))})",
            file=sys.stderr,
        )
        return 2
    _init_worker()
    names = [name for name in variants() if name != TIMED_REFERENCE]  # the same run as chapter 10's
    measured = step_costs([name for name in names if name not in SAME_STEP_AS], args.rounds, args.steps, device=device)
    measured.update({name: measured[twin] for name, twin in SAME_STEP_AS.items() if name in names})
    median = {name: statistics.median(values) for name, values in measured.items()}
    reference = median["chapter 10"]
    chapter_steps = CHAPTER_10["steps"]
    budget = {name: max(1, round(chapter_steps * reference / cost)) for name, cost in median.items()}
    result = dict(
        made_by="python benchmarks/modern_decoder.py costs",
        made_on=f"{datetime.date.today()}, "
        + ("" if device.type == "cpu" else f"{device_name(device)} ({device.type}), host ")
        + f"{_machine()}, torch {torch.__version__}",
        device=str(device),
        device_name=device_name(device),
        torch=torch.__version__,
        cuda=torch.version.cuda if device.type == "cuda" else None,
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        rounds=args.rounds,
        steps_per_round=args.steps,
        budget_seconds=round(chapter_steps * reference / 1000, 2),
        step_ms={name: round(c, 3) for name, c in median.items()},
        spread_ms={name: [round(min(v), 3), round(max(v), 3)] for name, v in measured.items()},
        steps=budget,
        same_step_as={name: twin for name, twin in SAME_STEP_AS.items() if name in names},
    )
    print(f"{'variant':>28}  ms/step (median; min-max over rounds)  steps in chapter 10's time")
    for name in names:
        low, high = result["spread_ms"][name]
        print(f"{name:>28}  {median[name]:7.2f} ({low:.2f}-{high:.2f})  {budget[name]:5d}")
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {_shown(out)}: chapter 10's 1400 steps = {result['budget_seconds']} s here ({device_name(device)})")
    return 0


# ---------------------------------------------------------------- ablation


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The log's runs. A last line that does not parse is skipped: a run still appending to the log may have
    written only part of it. Any other line that does not parse is an error."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    runs = []
    for i, line in enumerate(lines):
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise
    return runs


def _key(job: dict[str, Any]) -> tuple[str, int, str]:
    return job["variant"], job["seed"], json.dumps([job["overrides"], job["recipe"], job["clock"]], sort_keys=True)


def _run_jobs(jobs: list[dict[str, Any]], n_jobs: int, log: Path) -> list[dict[str, Any]]:
    done = {_key(line): line for line in _read_log(log)}
    todo = [job for job in jobs if _key(job) not in done]
    results = [done[_key(job)] for job in jobs if _key(job) in done]
    if not todo:
        return results
    machine = f"{_machine()}, torch {torch.__version__}"
    context = multiprocessing.get_context("spawn")
    with context.Pool(n_jobs, initializer=_init_worker, maxtasksperchild=1) as pool:
        for line in pool.imap_unordered(_job, todo):
            line.update(made_on=f"{datetime.date.today()}, {machine}", made_by="python benchmarks/modern_decoder.py")
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
            results.append(line)
            print(
                f"{line['variant']:>28} seed {line['seed']}: val {line['val_loss']:.4f} after {line['steps']} steps"
                f" ({line['train_seconds']:.1f} s)",
                flush=True,
            )
    return results


def equal_steps_variants(costs: dict[str, Any]) -> list[str]:
    """The variants whose step cost (`costs` file) differs from chapter 10's by more than `EQUAL_STEPS_GAP`, in the
    table's order: only for them does a run of chapter 10's step count differ from the equal-time run."""
    reference = costs["step_ms"]["chapter 10"]
    return [
        name
        for name in variants()
        if name in costs["step_ms"] and abs(costs["step_ms"][name] / reference - 1) > EQUAL_STEPS_GAP
    ]


def equal_steps(args: argparse.Namespace) -> int:
    """Train the chosen variants for chapter 10's number of steps (variant by variant, every seed of one before
    the next), into their own log (`STEPS_LOG` by default). "chapter 10" (its own recipe, no overrides) may be chosen
    too, and comes first by default: the reference of the "+ X" rows and the full model, run on the same machine as
    they are."""
    costs = json.loads(Path(args.costs).read_text(encoding="utf-8"))
    eligible = ["chapter 10"] + equal_steps_variants(costs)
    chosen = args.variants or eligible
    unknown = [name for name in chosen if name not in eligible]
    if unknown:
        print(
            f"--variants: {unknown} are neither chapter 10 nor variants whose step cost differs from chapter 10's by "
            f"more than {EQUAL_STEPS_GAP:.0%}; choose among {eligible}",
            file=sys.stderr,
        )
        return 2
    table = variants()
    jobs = [
        dict(
            variant=name,
            overrides=table[name][0],
            recipe=dict(table[name][1], steps=CHAPTER_10["steps"]),
            seed=s,
            seconds=None,
            clock="steps",
            step_cost_ms=costs["step_ms"][name],
            costs_made_on=costs["made_on"],
        )
        for name in chosen
        for s in args.seeds
    ]
    _run_jobs(jobs, args.jobs, Path(args.log))
    return 0


def ablation(args: argparse.Namespace) -> int:
    log = Path(args.log)
    table = variants()
    if args.budget == "equal-steps":
        if args.log == str(LOG):
            args.log = str(STEPS_LOG)
        return equal_steps(args)
    if args.budget == "steps":
        costs = json.loads(Path(args.costs).read_text(encoding="utf-8"))
        missing = [name for name in table if name != TIMED_REFERENCE and name not in costs["steps"]]
        if missing:
            print(f"{args.costs} has no step cost for {missing}: run `costs` again", file=sys.stderr)
            return 1
        # each variant's share of chapter 10's training time, in steps: no clock is read while training, so a run
        # gives the same result at any hour on any machine (to its float rounding)
        jobs = [
            dict(
                variant=name,
                overrides=overrides,
                recipe=dict(recipe, steps=costs["steps"][name]),
                seed=s,
                seconds=None,
                clock="steps",
                step_cost_ms=costs["step_ms"][name],
                costs_made_on=costs["made_on"],
            )
            for s in args.seeds
            for name, (overrides, recipe) in table.items()
            if name != TIMED_REFERENCE
        ]
        if args.only is not None:
            jobs = jobs[args.only[0] :: args.only[1]]
        _run_jobs(jobs, args.jobs, log)
        return 0 if args.no_table else summarise(args)
    base_jobs = [
        dict(variant="chapter 10", overrides={}, recipe=CHAPTER_10, seed=s, seconds=None, clock=args.clock)
        for s in args.seeds
    ]
    base = _run_jobs(base_jobs, args.jobs, log)
    budget = round(statistics.mean(line["train_seconds"] for line in base), 1)
    print(f"the budget: chapter 10's mean training time, {budget} s ({args.clock} clock)", flush=True)
    jobs = [
        dict(variant=name, overrides=overrides, recipe=recipe, seed=s, seconds=budget, clock=args.clock)
        for s in args.seeds
        for name, (overrides, recipe) in table.items()
        if name != "chapter 10"
    ]
    _run_jobs(jobs, args.jobs, log)
    return summarise(args)


def _shown(path: Path) -> str:
    """A path relative to the repository where it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def summarise(args: argparse.Namespace) -> int:
    lines = _read_log(Path(args.log))
    if not lines:
        print(f"no runs in {args.log}: run the ablation first", file=sys.stderr)
        return 1
    rows = ablation_summary(lines)
    clock = lines[0]["clock"]
    if clock == "steps":
        machines = sorted({line["made_on"].split(", ", 1)[1] for line in lines})
        made = (
            f"one thread per run, each variant trained for its share of chapter 10's 1400 steps of training time "
            f"in steps, from step costs measured side by side ({lines[0]['costs_made_on']}, "
            f"`benchmarks/results/modern-step-costs.json`); the seconds column is steps x that cost. Runs made on: "
            + "; ".join(machines)
        )
    else:
        made = f"one thread per run, {clock} clock; {lines[0]['made_on']}"
    out = [
        "# Chapter 11's ablation at equal training time",
        "",
        f"Made by `python benchmarks/modern_decoder.py ablation` (log: `{_shown(Path(args.log))}`), {made}.",
        "Validation loss over the whole split after each variant's training time; spread = max - min over the "
        "seeds. Gain: for '+ X' and 'full + X', the reference's loss minus the variant's (positive helps); for "
        "'- X', the variant's minus the full model's (positive: X was helping). 'helps' only when the gain "
        "exceeds the larger of the two seed spreads.",
        "",
        "| variant | seeds | val loss (mean) | spread | steps | seconds | gain | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in variants():
        if name not in rows:
            continue
        r = rows[name]
        verdict = r.get("verdict", "")
        gain = "" if "gain" not in r else f"{r['gain']:+.4f}"
        out.append(
            f"| {name} | {r['n']} | {r['mean']:.4f} | {r['spread']:.4f} | {r['steps']:.0f} | {r['seconds']:.1f} "
            f"| {gain} | {verdict} |"
        )
    out += _equal_steps_table(lines)
    text = "\n".join(out) + "\n"
    print(text)
    if not args.no_write:
        TABLE.write_text(text, encoding="utf-8")
    return 0


def _equal_steps_table(lines: list[dict[str, Any]]) -> list[str]:
    """The equal-steps column (`STEPS_LOG`), where it has runs: each variant there at chapter 10's 1400 steps beside
    its equal-time row, the changes sorted into `PER_STEP_GROUPS` (`per_step_group`, which chapter 11 calls too),
    the variants whose step cost differs by more than 3 % that are not in the log yet, and those left out (within
    3 %). The reference of "+ X" and "full modern" is chapter 10's 1400-step runs of the same log (the same machine)
    where it has them, else those of the main log (`lines`, other machines), which the text then says."""
    steps_runs = _read_log(STEPS_LOG)
    if not steps_runs or not any(line["variant"] == "chapter 10" for line in lines):
        return []
    timed = ablation_summary(lines)
    own = [line for line in steps_runs if line["variant"] == "chapter 10"]
    main = [line for line in lines if line["variant"] == "chapter 10"]
    rows = ablation_summary(steps_runs if own else main + steps_runs)
    if own:
        where = (
            f"against chapter 10's own {CHAPTER_10['steps']}-step runs of this log ({len(own)} of {ABLATION_SEEDS} "
            "seeds, the same machine) for '+ X' and 'full modern'"
        )
    else:
        where = (
            f"against chapter 10's {CHAPTER_10['steps']}-step runs of the main log for '+ X' and 'full modern' (this "
            "log has no chapter 10 runs yet; those ran on other machines, whose rounding alone can move a run by "
            "about 0.01)"
        )
    cost = {line["variant"]: line["step_cost_ms"] for line in lines if "step_cost_ms" in line}
    reference = cost["chapter 10"]
    differs = [name for name in cost if abs(cost[name] / reference - 1) > EQUAL_STEPS_GAP]
    same = [name for name in cost if name not in differs and name not in ("chapter 10", TIMED_REFERENCE)]
    seeds = sorted({line["seed"] for line in steps_runs})
    machines = sorted({line["made_on"].split(", ", 1)[1] for line in steps_runs})
    out = [
        "",
        "## The equal-steps column",
        "",
        f"The variants whose step cost differs from chapter 10's by more than {EQUAL_STEPS_GAP:.0%}, trained for "
        f"chapter 10's {CHAPTER_10['steps']} steps (`ablation --budget equal-steps`, log: `{_shown(STEPS_LOG)}`, "
        f"{len(steps_runs)} runs, seeds {', '.join(map(str, seeds))}; made on: {'; '.join(machines)}): quality per "
        f"step, apart from the cost of a step. Gain and verdict as above, {where}, against 'full modern' at equal "
        "steps for the others. The change's step cost is its step with the change over its step without it (for "
        "'- X', the full model's over the variant's). A change within noise at equal steps helped (hurt) at equal "
        f"time through its cheaper (dearer) step only if that cost is below (above) 1 by more than "
        f"{EQUAL_STEPS_GAP:.0%}. A row with fewer than {ABLATION_SEEDS} seeds (or whose reference has fewer) has no "
        "verdict yet: it is sorted provisionally (marked), its noise the larger of the reference's spread and the "
        "variant's own spread at equal time.",
        "",
        "| variant | step cost / chapter 10's | the change's step cost | equal time: loss (steps) | gain | verdict "
        "| equal steps: seeds | loss (mean) | spread | gain | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    groups: dict[str, list[str]] = {group: [] for group in PER_STEP_GROUPS}
    for name in differs:
        if name in rows and "gain" in rows[name]:
            r, t = rows[name], timed[name]
            group, provisional = per_step_group(name, t, r, cost)
            groups[group].append(f"{name} ({r['n']} of {ABLATION_SEEDS} seeds)" if provisional else name)
            out.append(
                f"| {name} | {cost[name] / reference:.2f} | {change_step_cost(name, cost):.2f} "
                f"| {t['mean']:.4f} ({t['steps']:.0f}) | {t['gain']:+.4f} | {t['verdict']} | {r['n']} "
                f"| {r['mean']:.4f} | {r['spread']:.4f} | {r['gain']:+.4f} | {r['verdict']} |"
            )
    out += ["", "What is left of each change at equal steps:", ""]
    out += [f"- {group} ({len(names)}): {', '.join(names) or 'none'}" for group, names in groups.items()]
    left = [name for name in differs if name not in rows]
    if left:
        out += ["", f"Not in the equal-steps log yet ({len(left)} variants): " + "; ".join(left) + "."]
    if same:
        out += [
            "",
            f"Left out of the column ({len(same)} variants, a step within {EQUAL_STEPS_GAP:.0%} of chapter 10's): "
            + "; ".join(same)
            + f". Their equal-time runs already take within {EQUAL_STEPS_GAP:.0%} of chapter 10's "
            f"{CHAPTER_10['steps']} steps.",
        ]
    return out


# ---------------------------------------------------------------- headline


def headline(args: argparse.Namespace) -> int:
    from transformer_lab.training import save_gpt

    _init_worker()
    tokenizer, _, _ = _data()
    _, chapter, line = train_one({}, CHAPTER_10, args.seed, None, args.clock, 100)
    budget = chapter.eval_seconds[-1]
    target = chapter.val_loss[-1]
    print(f"chapter 10: validation loss {target:.4f} after {line['steps']} steps, {budget:.1f} s", flush=True)
    runs = {}
    for share in (0.5, 1.0):
        model, history, line = train_one(MODERN, MUON_RECIPE, args.seed, share * budget, args.clock, args.eval_every)
        runs[share] = (model, history, line)
        print(
            f"full modern, {share:.0%} of that time: validation loss {history.val_loss[-1]:.4f} after "
            f"{line['steps']} steps ({history.eval_seconds[-1]:.1f} s)",
            flush=True,
        )
    half = runs[0.5][1]
    reached = half.time_to_loss(target)
    ratio = math.inf if reached is None else reached / budget
    result = dict(
        clock=args.clock,
        seed=args.seed,
        target=round(target, 5),
        chapter_seconds=round(budget, 2),
        chapter_steps=chapter.step[-1],
        modern_seconds_to_target=None if reached is None else round(reached, 2),
        ratio=round(ratio, 4) if math.isfinite(ratio) else None,
        half_time_loss=round(half.val_loss[-1], 5),
        full_time_loss=round(runs[1.0][1].val_loss[-1], 5),
        steps={"half": half.step[-1], "full": runs[1.0][1].step[-1]},
        recipe={"chapter 10": CHAPTER_10, "modern": MUON_RECIPE},
        config=MODERN,
        made_by=_headline_command(args),
        made_on=f"{datetime.date.today()}, {_machine()}, torch {torch.__version__}",
        histories={
            "chapter 10": _curve(chapter),
            "modern, half the time": _curve(half),
            "modern, the same time": _curve(runs[1.0][1]),
        },
    )
    shown = {k: v for k, v in result.items() if k != "histories"}
    print(json.dumps(shown, indent=2))
    ok = math.isfinite(ratio) and ratio <= 0.5
    print(
        f"headline: time to chapter 10's loss {target:.4f}, modern / chapter 10 = {ratio:.3f} (target <= 0.5): "
        f"{'met' if ok else 'NOT met'}; loss at chapter 10's full time {result['full_time_loss']:.4f} "
        f"(target <= 1.70): {'met' if result['full_time_loss'] <= 1.70 else 'NOT met'}"
    )
    if args.write:
        (ASSETS / "modern_headline.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
        model = runs[1.0][0]
        save_gpt(
            model,
            ASSETS / "gpt_modern_shakespeare.pt",
            tokenizer,
            half=True,
            recipe=dict(MUON_RECIPE, seconds=round(budget, 2), clock=args.clock),
            history=_curve(runs[1.0][1]),
            made_by=_headline_command(args),
        )
        print(f"wrote {ASSETS / 'modern_headline.json'} and {ASSETS / 'gpt_modern_shakespeare.pt'}")
    return 0 if ok else 1


def _headline_command(args: argparse.Namespace) -> str:
    """The command that reproduces a headline run: every option spelled out (the shipped files record it)."""
    write = " --write" if args.write else ""
    return (
        f"python benchmarks/modern_decoder.py headline --seed {args.seed} --clock {args.clock} "
        f"--eval-every {args.eval_every}{write}"
    )


def _curve(history: Any) -> dict[str, list[float]]:
    return dict(
        eval_step=history.eval_step,
        eval_seconds=[round(s, 3) for s in history.eval_seconds],
        val_loss=[round(v, 5) for v in history.val_loss],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("ablation", help="every variant at chapter 10's training time, over seeds")
    a.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    a.add_argument(
        "--budget",
        choices=("steps", "time", "equal-steps"),
        default="steps",
        help="steps (default): each variant trains for its share of chapter 10's time in steps, from the costs "
        "file; time: each trains until the clock says chapter 10's time has passed (drifts on a shared machine); "
        "equal-steps: the variants whose step cost differs from chapter 10's by more than 3 %% train for chapter "
        "10's 1400 steps, into their own log (default transformer_lab/assets/modern_ablation_steps.jsonl)",
    )
    a.add_argument(
        "--variants", nargs="+", help="with --budget equal-steps: only these variants, in this order (default: all)"
    )
    a.add_argument("--costs", default=str(COSTS), help="the step costs (`costs`) the step budgets come from")
    a.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="with --budget time: the clock")
    a.add_argument("--only", type=int, nargs=2, metavar=("I", "N"), help="only every N-th job from the I-th")
    a.add_argument("--log", default=str(LOG))
    a.add_argument("--no-write", action="store_true", help="do not write the markdown table")
    a.add_argument("--no-table", action="store_true", help="do not summarise at the end")
    c = sub.add_parser("costs", help="every variant's step cost, timed side by side in one process")
    c.add_argument("--rounds", type=int, default=60)
    c.add_argument("--steps", type=int, default=2, help="steps of each variant per round")
    c.add_argument(
        "--device",
        default="cpu",
        help="where to train: cpu (default), cuda, cuda:N or mps; the GPU is synchronised around each timed round",
    )
    c.add_argument(
        "--out",
        help="default: benchmarks/results/modern-step-costs.json on the CPU (chapter 11's), else "
        "modern-step-costs-<device and its name>.json beside it, e.g. ...-cuda-nvidia-h200.json",
    )
    t = sub.add_parser("table", help="the table of the ablation's log")
    t.add_argument("--log", default=str(LOG))
    t.add_argument("--no-write", action="store_true")
    h = sub.add_parser("headline", help="the full modern model against chapter 10, one process")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    h.add_argument("--eval-every", type=int, default=20, help="the modern runs' steps between evaluations")
    h.add_argument("--write", action="store_true", help="write the chapter's shipped files")
    args = parser.parse_args(argv)
    if args.command == "ablation":
        return ablation(args)
    if args.command == "table":
        return summarise(args)
    if args.command == "costs":
        return costs_command(args)
    return headline(args)


if __name__ == "__main__":
    sys.exit(main())
