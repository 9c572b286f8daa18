"""Training a GPT on text (chapters 10 and 11): nanoGPT's recipe, the loss over a whole text, checkpoints.

- `cosine_lr`: nanoGPT's learning rate, a linear warm-up then a cosine decay to min_lr.
- `make_adamw`: AdamW as nanoGPT configures it (weight decay on the matrices only), PyTorch's fused kernel where it
  has one (`adamw_fused`); defined with Muon in `tl.optim`, the course's one optimizer module, and re-exported.
- `evaluate_text`: the mean cross-entropy over a WHOLE split (every token predicted once), a fixed number.
- `TextHistory`, `train_gpt`: chapter 10's trainer. Chapter 11 adds `optimizer="muon"` (the blocks' matrices
  trained with Muon, `tl.muon`) and a training-time budget (`seconds=`, `clock=`) for its comparisons at
  equal time. The steps themselves are the course's one loop, `tl.loop.run_steps`, which chapter 09's
  `tl.training.train` uses too: this module says only what is the GPT's (its batches, its loss, its
  evaluation, its schedule).
- `save_gpt`, `load_gpt`: weights_only checkpoints that carry the tokenizer (characters, or chapter 12's
  byte-level BPE `tl.bpe.ByteBPE`) and every switch of chapter 11's GPTConfig.

The chapters call these names from `transformer_lab.training` (`tl.training.train_gpt`), which re-exports them.

Shape legend: B batch (b: this process's rows of it), T window length (block), V vocabulary size, W windows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    as_device,
    check_bool,
    check_int,
    check_integer_vector,
    check_number,
    check_plain_data,
    check_positive_int,
    trusted,
    unreadable_checkpoint,
)
from transformer_lab.loop import TRAINING_CLOCKS, data_parallel, fast_path_flags, restore_flags, run_steps
from transformer_lab.multihead import record_attention
from transformer_lab.optim import FUSED_ADAMW_DEVICES, adamw_fused, make_adamw, make_muon

__all__ = [
    "cosine_lr",
    "make_adamw",
    "adamw_fused",
    "FUSED_ADAMW_DEVICES",
    "GPT_OPTIMIZERS",
    "evaluate_text",
    "TextHistory",
    "train_gpt",
    "save_gpt",
    "load_gpt",
    "ablation_summary",
    "EQUAL_STEPS_GAP",
    "PER_STEP_GROUPS",
    "change_step_cost",
    "per_step_group",
]


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """nanoGPT's learning rate at iteration `step` (counted from 0): linear warm-up, then cosine decay.

        step < warmup:                lr * (step + 1) / warmup                    (rises to lr)
        warmup <= step < decay_steps: min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2
                                      with r = (step - warmup) / (decay_steps - warmup) in [0, 1)
        step >= decay_steps:          min_lr

    Args:
        step: the iteration, >= 0.
        lr: the peak rate, reached at the end of the warm-up.
        min_lr: the rate at and after decay_steps (0 <= min_lr <= lr).
        warmup: warm-up iterations (0: none).
        decay_steps: the iteration where the cosine reaches min_lr (>= warmup).
    """
    check_int("step", step, 0)
    check_number("lr", lr, positive=True)
    check_number("min_lr", min_lr, non_negative=True)
    check_int("warmup", warmup, 0)
    check_int("decay_steps", decay_steps, 0)
    if min_lr > lr:
        raise ValueError(f"min_lr ({min_lr}) must not exceed lr ({lr}): the schedule decays from lr to min_lr")
    if decay_steps < warmup:
        raise ValueError(f"decay_steps ({decay_steps}) must be >= warmup ({warmup}): the decay follows the warm-up")
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup) / (decay_steps - warmup)  # 0 -> 1
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def _gpt_class() -> type:
    from transformer_lab.gpt import GPT

    return GPT


def _check_gpt(model: object) -> None:
    if not isinstance(model, _gpt_class()):
        raise TypeError(f"model must be a tl.gpt.GPT, got {type(model).__name__}")


def _check_stream_for(name: str, data: object, block: int, vocab_size: int) -> None:
    check_integer_vector(name, data, "token ids (tokenizer.encode(text))")
    assert isinstance(data, Tensor)
    if data.numel() < block + 1:
        raise ValueError(f"{name} has {data.numel()} tokens, fewer than block + 1 = {block + 1}: one window needs that")
    low, high = torch.stack(torch.aminmax(data)).tolist()  # one read-back, once per call (not per batch)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab_size}): "
            "build the GPTConfig with the tokenizer's vocab_size"
        )


@torch.no_grad()
def _text_loss_sum(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> Tensor:
    """The SUM of the cross-entropies of every position of the windows x -> y (float64 on x's device)."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], batch_size):
        logits = model(x[start : start + batch_size])  # (b, T, V)
        target = y[start : start + batch_size]  # (b, T)
        total += F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").double()
    return total


@torch.no_grad()
def evaluate_text(model: nn.Module, data: Tensor, block: int | None = None, batch_size: int = 256) -> float:
    """The mean cross-entropy (nats per character) of `model` over the WHOLE stream `data` (chapter 10).

    `data` is cut into consecutive windows of `block` tokens (`tl.data.consecutive_windows`): every token
    but the first, and the tail that fills no whole window, is predicted exactly once, from the 0 ... block - 1
    tokens before it in its window. Unlike nanoGPT's estimate (the mean over a few random batches) this is a
    fixed number for a given model: no sampling noise between two evaluations or two recipes.

    Args:
        model: a `tl.gpt.GPT`; evaluated in eval mode on the fast path, its mode and flags restored afterwards.
        data: a 1-D tensor of token ids (e.g. the validation split, `tokenizer.encode(text)`), on any device.
        block: the window length, at most the model's block_size (default: block_size).
        batch_size: windows per forward pass (memory only; the result does not depend on it beyond rounding).

    Returns:
        the mean over the W * block predicted tokens, a float.
    """
    from transformer_lab.data import consecutive_windows

    _check_gpt(model)
    block = model.config.block_size if block is None else block
    check_positive_int("block", block)
    if block > model.config.block_size:
        raise ValueError(f"block ({block}) must be at most the model's block_size ({model.config.block_size})")
    check_positive_int("batch_size", batch_size)
    _check_stream_for("data", data, block, model.config.vocab_size)
    device = next(model.parameters()).device
    x, y = consecutive_windows(data.to(device), block)  # (W, block) each
    flags, was_training = fast_path_flags(model), model.training
    record_attention(model, False)
    model.eval()
    try:
        total = _text_loss_sum(model, x, y, batch_size)
    finally:
        restore_flags(flags)
        model.train(was_training)
    return total.item() / y.numel()


@dataclass
class TextHistory:
    """What `train_gpt` measured: per step the training loss and lr; per evaluation the validation loss.

    `eval_seconds[i]` is the training time (evaluations excluded) when `val_loss[i]` was measured, so that
    two recipes can be compared by the time they take to reach a loss. `seconds` is the whole run's time,
    evaluations included.
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    eval_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def time_to_loss(self, target: float) -> float | None:
        """Training seconds at the first evaluation with val_loss <= target (None if never reached)."""
        check_number("target", target)  # NaN would never be reached: None, as if the run were too short
        for seconds, loss in zip(self.eval_seconds, self.val_loss, strict=True):
            if loss <= target:
                return seconds
        return None


#: The optimizers `train_gpt` can use (its `optimizer` argument, gpt-train's --optimizer).
GPT_OPTIMIZERS = ("adamw", "muon")


def _gpt_optimizer(
    name: str,
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    muon_lr: float,
    muon_weight_decay: float,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer `train_gpt`'s `optimizer` argument names: AdamW (chapter 10), or Muon + AdamW (chapter 11);
    `fused` is AdamW's (`make_adamw`)."""
    if name == "adamw":
        return make_adamw(model, lr, weight_decay, betas, fused=fused)
    return make_muon(
        model,
        muon_lr,
        lr,
        weight_decay=muon_weight_decay,
        adamw_weight_decay=weight_decay,
        betas=betas,
        adamw_fused=fused,
    )


def train_gpt(
    model: nn.Module,
    train_data: Tensor,
    val_data: Tensor | None = None,
    *,
    steps: int = 2000,
    batch_size: int = 12,
    block: int | None = None,
    lr: float = 1e-3,
    min_lr: float = 1e-4,
    warmup: int = 100,
    decay_steps: int | None = None,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    clip_norm: float | None = 1.0,
    eval_every: int = 250,
    eval_batch_size: int = 256,
    seed: int = 0,
    starts: Tensor | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    optimizer: str = "adamw",
    muon_lr: float = 0.02,
    muon_weight_decay: float = 0.0,
    seconds: float | None = None,
    clock: str = "wall",
    fused: bool | None = None,
) -> TextHistory:
    """Train a `GPT` to predict the next token of `train_data`; returns the `TextHistory` (chapter 10).

    The defaults are nanoGPT's Shakespeare-character recipe (config/train_shakespeare_char.py, with its
    CPU settings: batch 12, block 64, 2000 steps, no dropout): AdamW (`make_adamw`: betas (0.9, 0.99),
    weight decay 0.1 on the matrices), lr 1e-3 with 100 warm-up steps and a cosine decay to 1e-4 at the last
    step (`cosine_lr`), gradients clipped to norm 1. Each step draws `batch_size` windows at random offsets
    (`tl.data.random_windows`) and minimises the mean cross-entropy of every next token. Every `eval_every`
    steps and at the end, `evaluate_text` measures the loss over the whole of `val_data`.

    Deterministic: the same seed gives the same run (on one device and thread count). The weights are not
    initialised here: build the model after `torch.manual_seed(seed)` for a reproducible start.

    Under `torchrun --nproc_per_node=N` (see `tl.distributed`) the model is wrapped in
    DistributedDataParallel, `batch_size` is the GLOBAL batch (each process trains on its rows), the
    validation windows are shared out and their losses summed over the processes, and only rank 0 shows
    the progress bar; the weights after each step equal those of one process trained on the global batch.

    Args:
        model: a `tl.gpt.GPT`.
        train_data, val_data: 1-D tensors of token ids (`tl.data.split_text(tokenizer.encode(text))`);
            val_data None: no evaluation.
        steps, batch_size: how long, and windows per step.
        block: the window length (default: the model's block_size; at most that).
        lr, min_lr, warmup, decay_steps: the schedule (`cosine_lr`); decay_steps defaults to `steps`.
        weight_decay, betas: AdamW's (`make_adamw`).
        clip_norm: maximum gradient norm (None: no clipping).
        eval_every, eval_batch_size: how often to evaluate, and windows per forward pass when evaluating.
        seed: the seed of the batches.
        starts: the offsets of train_data where a window may begin (`tl.data.token_starts`, e.g. every
            newline of a text of one poem per line); None, any offset.
        device: where to train (default: where the model is).
        progress: show a tqdm progress bar.
        optimizer: "adamw" (`make_adamw`, chapter 10) or "muon" (chapter 11, `tl.muon.make_muon`): Muon for
            the blocks' matrices, AdamW as above (lr, weight_decay, betas) for the embeddings, head and gains.
        muon_lr, muon_weight_decay: Muon's peak learning rate and weight decay; the schedule scales it as it
            scales lr (Muon's rate at each step is muon_lr / lr times AdamW's).
        seconds: a training-time budget (chapter 11's comparisons at equal time). None: train `steps` steps.
            Given: train until `seconds` of training time have passed (evaluations excluded), `steps` being
            only an upper bound; after the `warmup` steps the cosine runs over time, not steps: the rate is
            min_lr + (lr - min_lr) * (1 + cos(pi * t / seconds)) / 2 at training time t, so every run ends
            at min_lr whatever its step time, and a slower step pays with fewer steps. decay_steps must then
            be None. The last step is evaluated (when val_data is given).
        clock: what `seconds` and `eval_seconds` count: "wall" (`time.perf_counter`) or "cpu"
            (`time.process_time`, the process's CPU time: on one thread the same as the wall clock of a
            quiet machine, and unaffected by other programs sharing the cores).
        fused: AdamW's implementation (`make_adamw`): None, PyTorch's fused kernel on a CPU or a CUDA GPU; False,
            the plain one (as chapter 11's ablation and the shipped checkpoints were trained).

    Returns:
        a `TextHistory`; the model is left in eval mode, its attention flags as they were.
    """
    from transformer_lab.data import _check_starts, consecutive_windows, random_windows

    _check_gpt(model)
    block = model.config.block_size if block is None else block
    for name, value in (("steps", steps), ("batch_size", batch_size), ("block", block), ("eval_every", eval_every)):
        check_positive_int(name, value)
    check_positive_int("eval_batch_size", eval_batch_size)
    if block > model.config.block_size:
        raise ValueError(f"block ({block}) must be at most the model's block_size ({model.config.block_size})")
    decay_steps = steps if decay_steps is None else decay_steps
    cosine_lr(0, lr, min_lr, warmup, decay_steps)  # checks lr, min_lr, warmup and decay_steps
    check_number("weight_decay", weight_decay, non_negative=True)
    if clip_norm is not None:
        check_number("clip_norm", clip_norm, positive=True)
    check_int("seed", seed, 0)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    if optimizer not in GPT_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {GPT_OPTIMIZERS}, got {optimizer!r}")
    check_number("muon_lr", muon_lr, positive=True)
    check_number("muon_weight_decay", muon_weight_decay, non_negative=True)
    if seconds is not None:
        check_number("seconds", seconds, positive=True)
        if decay_steps is not None and decay_steps != steps:
            raise ValueError(
                f"decay_steps ({decay_steps}) cannot be given with seconds ({seconds}): with a time budget the "
                "cosine decays over the time; leave decay_steps None"
            )
    if clock not in TRAINING_CLOCKS:
        raise ValueError(f"clock must be one of {tuple(TRAINING_CLOCKS)}, got {clock!r}")
    _check_stream_for("train_data", train_data, block, model.config.vocab_size)
    if starts is not None:
        _check_starts(starts, train_data.numel(), block)
        starts = starts.cpu()
    if val_data is not None:
        _check_stream_for("val_data", val_data, block, model.config.vocab_size)
    parallel = data_parallel(model, device)  # under torchrun: this process's part of the run
    device = parallel.device
    rows = parallel.rows(batch_size)
    optimizer = _gpt_optimizer(optimizer, model, lr, weight_decay, betas, muon_lr, muon_weight_decay, fused)
    generator = torch.Generator().manual_seed(seed)  # the batches: the same on every process
    train_data = train_data.cpu()
    if val_data is not None:
        vx, vy = consecutive_windows(val_data.to(device), block)  # (W, block) each
        vx, vy = vx[parallel.rank :: parallel.world_size], vy[parallel.rank :: parallel.world_size]
        n_val = (val_data.numel() - 1) // block * block
    history = TextHistory()

    def rate(step: int, trained: float) -> float:
        """The peak-lr group's rate at `step` (from 1; `cosine_lr` counts from 0), by steps or by time."""
        if seconds is None:
            return cosine_lr(step - 1, lr, min_lr, warmup, decay_steps)
        return _timed_cosine_lr(step - 1, trained, seconds, lr, min_lr, warmup)

    def batch_loss(net: nn.Module) -> Tensor:
        """The mean next-token cross-entropy of a fresh batch of random windows."""
        with trusted():  # train_data and starts were checked above
            x, y = random_windows(train_data, block, batch_size, generator, starts)  # (B, block) each: global
        x, y = x[rows].to(device), y[rows].to(device)  # this process's rows
        logits = net(x)  # (b, block, V)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())  # mean over b * block positions
        if parallel.active:  # weighted so that DDP's average gradient is the global batch's gradient
            loss = loss * parallel.weight(x.shape[0], batch_size)
        return loss

    def validate(step: int, trained: float) -> dict[str, float]:
        """The loss over the whole validation split (each process sums its share of the windows)."""
        history.eval_step.append(step)
        history.eval_seconds.append(trained)
        history.val_loss.append(parallel.sum(_text_loss_sum(model, vx, vy, eval_batch_size)).item() / n_val)
        return {"val": history.val_loss[-1]}

    return run_steps(
        model,
        parallel,
        optimizer,
        history,
        steps=steps,
        rate=rate,
        base_lr=lr,  # AdamW's groups train at the rate, Muon's at muon_lr / lr times it
        loss=batch_loss,
        clip_norm=clip_norm,
        evaluate=None if val_data is None else validate,
        eval_every=eval_every,
        seconds=seconds,
        clock=clock,
        description="training the GPT",
        progress=progress,
    )


def _timed_cosine_lr(step: int, elapsed: float, seconds: float, lr: float, min_lr: float, warmup: int) -> float:
    """`train_gpt`'s rate under a time budget: `cosine_lr`'s warm-up by steps, then a cosine over the time."""
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = min(max(elapsed / seconds, 0.0), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def save_gpt(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: object, *, half: bool = False, **extra: Any
) -> None:
    """Write a GPT checkpoint that `torch.load(path, weights_only=True)` reads: plain data and tensors only.

    It holds {"kind": "gpt", "config": the GPTConfig as a dict (every switch of chapter 11 with it),
    "tokenizer": the tokenizer's `to_dict()`, "state_dict": the weights, **extra} (extra: plain data such as
    the training options and history). The tokenizer is {"chars": ...} for characters, or a byte-level BPE's
    {"pattern", "byte_ids", "merges", "special_tokens"} (chapter 12): the merges travel with the model, so
    its ids are always read back as the text it was trained on.

    Args:
        model: a `tl.gpt.GPT`.
        path: the file to write; its folder must exist.
        tokenizer: the model's `tl.data.TextTokenizer` or `tl.bpe.ByteBPE`.
        half: store the floating-point weights in float16 (half the size; `load_gpt` returns float32).
    """
    from transformer_lab.bpe import ByteBPE
    from transformer_lab.data import TextTokenizer

    _check_gpt(model)
    if not isinstance(tokenizer, (TextTokenizer, ByteBPE)):
        raise TypeError(
            f"tokenizer must be a tl.data.TextTokenizer or a tl.bpe.ByteBPE, got {type(tokenizer).__name__}"
        )
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model.config.vocab_size}: they must be the pair that was trained together"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    check_bool("half", half)
    for key in ("kind", "config", "tokenizer", "state_dict"):
        if key in extra:
            raise ValueError(f"extra data may not be called {key!r}: the checkpoint uses that key itself")
    for key, value in extra.items():
        check_plain_data(key, value)
    if os.path.isdir(path):
        raise ValueError(f"path {os.fspath(path)!r} is a folder; give a file name such as 'gpt.pt' inside it")
    folder = os.path.dirname(os.fspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"path {os.fspath(path)!r}: the folder {folder!r} does not exist; create it first")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if half:
        state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    checkpoint = {
        "kind": "gpt",
        "config": model.config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "state_dict": state,
        **extra,
    }
    torch.save(checkpoint, path)


def load_gpt(path: str | os.PathLike[str], map_location: torch.device | str = "cpu") -> tuple[nn.Module, Any]:
    """Rebuild (model, tokenizer) from a file written by `save_gpt`: a float32 `GPT` in eval mode.

    The tokenizer is the one the checkpoint embeds: a `tl.data.TextTokenizer` (characters, chapter 10) or a
    `tl.bpe.ByteBPE` (chapter 12). The file is read with `weights_only=True` (never code); a missing file, a
    file that is not a checkpoint, a checkpoint of another kind (chapter 09's Transformer) or weights that do
    not fit the config are refused with an error that says which. A config saved before chapter 11's switches
    existed lacks them and gets their defaults, GPT-2's: chapter 10's model.
    """
    device = as_device("map_location", map_location)
    data = read_checkpoint_file(
        path, "GPT", "load it where it was made and save it with tl.training.save_gpt(model, path, tokenizer)"
    )
    if not isinstance(data, dict) or data.get("kind") != "gpt":
        what = "chapter 09's Transformer" if isinstance(data, dict) and "task" in data else "something else"
        raise ValueError(
            f"path {os.fspath(path)!r} is not a GPT checkpoint (it holds {what}); write one with "
            "tl.training.save_gpt or `python -m transformer_lab.cli gpt-train`"
        )
    config, tokenizer = gpt_checkpoint_parts(path, data, "GPT")
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{os.fspath(path)!r}: the tokenizer has {tokenizer.vocab_size} tokens, the config "
            f"vocab_size={config.vocab_size}"
        )
    model = load_gpt_weights(path, _gpt_class()(config), data["state_dict"])
    return model.to(device).eval(), tokenizer


def read_checkpoint_file(path: str | os.PathLike[str], what: str, advice: str) -> Any:
    """What a checkpoint file holds, read with `weights_only=True` (never code): the path's type, a folder, a
    missing file and an unreadable one are refused with an error that names `what` (e.g. "GPT") and `advice`.
    Shared by `load_gpt` and chapter 13's `tl.finetune.load_sft`."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    if os.path.isdir(path):
        raise ValueError(f"path {os.fspath(path)!r} is a folder; give the checkpoint file inside it (e.g. gpt.pt)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {what} checkpoint at path {os.fspath(path)!r}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - a corrupt file can fail anywhere in the unpickler (KeyError, ...)
        raise unreadable_checkpoint(path, error, f"a {what} checkpoint", advice) from None


def gpt_checkpoint_parts(
    path: str | os.PathLike[str], data: dict, what: str, extra_keys: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """(GPTConfig, tokenizer) of a GPT checkpoint's dict, after checking that it has "config", "tokenizer", a dict
    "state_dict" and `extra_keys`. A config saved before chapter 11's switches existed gets their defaults."""
    from transformer_lab.gpt import GPTConfig

    missing = [key for key in ("config", "tokenizer", "state_dict", *extra_keys) if key not in data]
    if missing:
        raise ValueError(f"{os.fspath(path)!r} is not a complete {what} checkpoint: it has no {missing}")
    try:
        config = GPTConfig(**data["config"])
        tokenizer = _gpt_tokenizer_from_dict(data["tokenizer"])
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{os.fspath(path)!r} holds a bad config or tokenizer: {error}") from None
    if not isinstance(data["state_dict"], dict):
        raise ValueError(
            f"{os.fspath(path)!r}: the state_dict must be a dict of weights, got {type(data['state_dict']).__name__}"
        )
    return config, tokenizer


def load_gpt_weights(path: str | os.PathLike[str], model: nn.Module, state_dict: dict) -> nn.Module:
    """`model` with a checkpoint's weights copied into its float32 parameters (also from float16); weights that do
    not fit its config are refused, naming the file."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:
        raise ValueError(f"{os.fspath(path)!r}: the weights do not fit the config: {str(error)[:300]}") from None
    return model


def _gpt_tokenizer_from_dict(data: object) -> Any:
    """The tokenizer a GPT checkpoint embeds: characters ({"chars": ...}) or a ByteBPE (its "merges" ...)."""
    from transformer_lab.bpe import ByteBPE
    from transformer_lab.data import TextTokenizer

    if isinstance(data, dict) and "merges" in data:
        return ByteBPE.from_dict(data)
    return TextTokenizer.from_dict(data)  # type: ignore[arg-type]


#: The seeds a variant of chapter 11's ablation needs before `ablation_summary` gives it a verdict.
ABLATION_SEEDS = 3


def ablation_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Chapter 11's ablation table from its runs: per variant the mean and spread over seeds, and the verdict.

    Each run is one line of `benchmarks/modern_decoder.py`'s log: a dict with at least "variant", "seed",
    "val_loss", "steps" and "train_seconds". Variants are named "chapter 10", "full modern", "+ X" (X added to
    chapter 10's model), "- X" (X removed from the full modern model) and "full + X" (X added to the full model).

    Returns {variant: row}, in the order the variants first appear, each row with: n (seeds), mean (the mean
    validation loss), spread (max - min over the seeds), steps and seconds (means); and, where the variant's
    reference is in the log, reference, gain, noise, helps and hurts. The reference of "+ X" and "full modern" is
    "chapter 10, timed" (chapter 10's recipe trained for the same time as the variants), or "chapter 10" (its own
    1400-step runs) where the log has no timed one; that of "- X" and "full + X" is "full modern". gain is how
    much X lowers the loss: the reference's mean minus the variant's for an added X, the variant's minus the
    reference's for a removed one. noise is the larger of the two spreads; helps / hurts say whether the gain, or
    the loss, exceeds it. A change "helps" only when its gain exceeds the seed spread; anything smaller is within
    noise, whatever its sign. verdict says it in words: "helps", "hurts", "within noise", or "fewer than 3 seeds"
    while the variant or its reference has fewer than `ABLATION_SEEDS` runs (a spread of one or two says little).
    """
    if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Sequence):
        raise TypeError(f"runs must be a list of run dicts (the log's lines), got {type(runs).__name__}")
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping) or not {"variant", "val_loss", "steps", "train_seconds"} <= run.keys():
            raise ValueError(
                f"runs[{i}] must be a dict with variant, val_loss, steps and train_seconds (a line of the "
                f"ablation's log), got {run!r}"
            )
        groups.setdefault(str(run["variant"]), []).append(run)
    table: dict[str, dict[str, Any]] = {}
    for name, group in groups.items():
        losses = [float(run["val_loss"]) for run in group]
        table[name] = dict(
            n=len(group),
            mean=sum(losses) / len(losses),
            spread=max(losses) - min(losses),
            steps=sum(float(run["steps"]) for run in group) / len(group),
            seconds=sum(float(run["train_seconds"]) for run in group) / len(group),
        )
    for name, row in table.items():
        if name in ("chapter 10", "chapter 10, timed"):
            continue
        removed = name.startswith("- ")
        if name.startswith("+ ") or name == "full modern":
            # chapter 10's recipe trained for the same time as the variant, if the log has it (the benchmark's
            # "chapter 10, timed"); else its own 1400-step runs, which set that time
            reference = "chapter 10, timed" if "chapter 10, timed" in table else "chapter 10"
        else:
            reference = "full modern"
        if reference not in table:
            continue
        ref = table[reference]
        gain = row["mean"] - ref["mean"] if removed else ref["mean"] - row["mean"]
        noise = max(row["spread"], ref["spread"])
        helps, hurts = gain > noise, -gain > noise
        if min(row["n"], ref["n"]) < ABLATION_SEEDS:
            verdict = f"fewer than {ABLATION_SEEDS} seeds"  # too few to know the noise
        else:
            verdict = "helps" if helps else "hurts" if hurts else "within noise"
        row.update(reference=reference, gain=gain, noise=noise, helps=helps, hurts=hurts, verdict=verdict)
    return table


#: Chapter 11's equal-steps column: a change's step cost counts as different from 1 only beyond this (3 %); the
#: variants whose step is within it of chapter 10's are left out of the column, their equal-time runs already taking
#: within 3 % of chapter 10's 1400 steps.
EQUAL_STEPS_GAP = 0.03

#: The equal-steps column's groups, as chapter 11 prints them: what is left of a change at chapter 10's 1400 steps.
PER_STEP_GROUPS = (
    "helps per step",
    "helps at equal time only, through its cheaper step",
    "hurts at equal time only, through its dearer step",
    "hurts per step",
    "within noise per step",
)


def change_step_cost(name: str, cost: Mapping[str, float]) -> float:
    """The step cost with the change over without it, from `cost` ({variant: ms a step}): against chapter 10 for
    "+ X" and the full model, against the full model for "full + X"; for "- X", the full model's step over the
    variant's (which lacks X)."""
    if name.startswith("- "):
        return cost["full modern"] / cost[name]
    return cost[name] / cost["full modern" if name.startswith("full + ") else "chapter 10"]


def per_step_group(
    name: str, timed: Mapping[str, Any], step: Mapping[str, Any], cost: Mapping[str, float]
) -> tuple[str, bool]:
    """Which of `PER_STEP_GROUPS` a change falls in: `timed` is its `ablation_summary` row at equal time, `step` its
    row at chapter 10's 1400 steps, `cost` the variants' ms a step. It helps / hurts per step when its equal-steps
    gain beats the noise. Within noise there, it helped (hurt) at equal time "through its cheaper (dearer) step"
    only when its change's step cost (`change_step_cost`) is below (above) 1 by more than `EQUAL_STEPS_GAP`: a step
    within 3 % buys or costs too few steps to make a difference beyond the noise; else "within noise per step".
    With fewer than `ABLATION_SEEDS` seeds in the row or its reference (its verdict says so) there is no verdict
    yet: the noise is then also the variant's own seed spread at equal time, a provisional reading. Returns (group,
    provisional)."""
    provisional = step["n"] < ABLATION_SEEDS or str(step.get("verdict", "")).startswith("fewer than")
    noise = max(step["noise"], timed["spread"]) if provisional else step["noise"]
    change = change_step_cost(name, cost)
    if step["gain"] > noise:
        return PER_STEP_GROUPS[0], provisional
    if -step["gain"] > noise:
        return PER_STEP_GROUPS[3], provisional
    if timed.get("helps") and change < 1 - EQUAL_STEPS_GAP:
        return PER_STEP_GROUPS[1], provisional
    if timed.get("hurts") and change > 1 + EQUAL_STEPS_GAP:
        return PER_STEP_GROUPS[2], provisional
    return PER_STEP_GROUPS[4], provisional
