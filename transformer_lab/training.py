"""Training a Transformer on a toy task (chapter 09): label smoothing, the Noam schedule, the loop.

- `label_smoothed_loss`: cross-entropy against a smoothed target distribution, written out
  (paper section 5.4, eps_ls = 0.1). The smoothing mass is spread over the real vocabulary:
  PAD never receives probability, and PAD target positions are ignored.
- `noam_lr`: the paper's learning-rate schedule (section 5.3), linear warm-up then 1/sqrt(step).
- `make_optimizer`: Adam with the paper's betas (0.9, 0.98) and eps 1e-9, driven by the schedule.
- `train`: the loop (gradient clipping, a tqdm progress bar, a returned `History`).
- `translate`, `exact_match`: decode greedily (or by beam search) and score whole answers.
- Chapter 10: `train_gpt` (AdamW, warm-up and cosine decay: `cosine_lr`), `evaluate_text` (the loss over a
  whole text), `save_gpt` / `load_gpt` (weights_only checkpoints with the tokenizer). Chapter 11:
  `train_gpt(..., optimizer="muon")` trains the blocks' matrices with Muon (`tl.muon`); GPT checkpoints record
  its switches. Chapter 12: `save_gpt` / `load_gpt` also carry a byte-level BPE tokenizer (`tl.bpe.ByteBPE`).
Both trainers run under `torchrun` with DistributedDataParallel (`tl.distributed`).

Shape legend: B batch, S source length, T target length, V vocabulary size, N = B * T.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    as_device,
    check_bool,
    check_has_values,
    check_int,
    check_integer_vector,
    check_number,
    check_plain_data,
    check_positive_int,
    check_probability,
    check_tensor,
    check_token_dtype,
    trusted,
    unreadable_checkpoint,
)
from transformer_lab.data import CharTokenizer, Example, Task, make_batch
from transformer_lab.distributed import DataParallel
from transformer_lab.model import Transformer, TransformerConfig
from transformer_lab.multihead import record_attention

__all__ = [
    "smoothed_targets",
    "label_smoothed_loss",
    "noam_lr",
    "make_optimizer",
    "History",
    "train",
    "translate",
    "exact_match",
    "exact_match_by_kind",
    "build_model",
    "cosine_lr",
    "make_adamw",
    "evaluate_text",
    "TextHistory",
    "train_gpt",
    "save_gpt",
    "load_gpt",
]

# Seconds between two redraws of a progress bar. In a notebook every redraw is a few kernel messages;
# a run of minutes redrawn ten times a second sends thousands, and a client that reads them only
# when the cell ends (nbval, papermill) loses the overflow, the cell's end included.
PROGRESS_SECONDS = 1.0


# ---------------------------------------------------------------------------------------------
# Label smoothing
# ---------------------------------------------------------------------------------------------


def smoothed_targets(target: Tensor, vocab_size: int, pad_id: int, smoothing: float) -> Tensor:
    """The smoothed target distribution q of each position (chapter 09).

    q puts 1 - smoothing on the true token and spreads `smoothing` evenly over the other real
    tokens (every id except the true one and PAD, so vocab_size - 2 of them); the PAD column is 0.
    Rows whose target is PAD are all zero (they do not count in the loss).

    Shape:
        target (...) integer ids -> q (..., vocab_size), each non-PAD row summing to 1.
    """
    check_tensor("target", target)
    check_token_dtype("target", target)
    check_has_values("target", target)
    check_positive_int("vocab_size", vocab_size)
    check_probability("smoothing", smoothing)
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be at least 3 (PAD, the true token and one other), got {vocab_size}")
    check_int("pad_id", pad_id, 0, vocab_size)
    if target.numel() > 0:
        low, high = torch.stack(torch.aminmax(target)).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"target contains id {low if low < 0 else high}, outside [0, {vocab_size}) (the logits' last "
                "dimension V); check the tokenizer and the model's tgt_vocab_size"
            )
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2), dtype=torch.float32)
    q = q.to(target.device)
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - smoothing)  # the true token
    q[..., pad_id] = 0.0  # PAD is never a right answer
    q[target == pad_id] = 0.0  # padded positions are ignored
    return q


def label_smoothed_loss(logits: Tensor, target: Tensor, pad_id: int, smoothing: float = 0.1) -> Tensor:
    """Cross-entropy against `smoothed_targets`, averaged over the non-PAD target positions (chapter 09).

        loss = - sum_c q_c log p_c,   q = (1 - eps) on the true token, eps / (V - 2) on every other non-PAD token

    Differs from `F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=eps)`, which
    mixes the one-hot target with a uniform distribution over *all* V classes: q_c = (1 - eps) [c = y]
    + eps / V, so the true token and PAD get eps / V too. Per position the two are related exactly by

        ours = (1 - eps) nll + eps / (V - 2) * (S + log p_pad + log p_y),   S = sum_c -log p_c,
        torch = (1 - eps) nll + eps / V * S.

    With smoothing=0 both are the plain cross-entropy.

    Args:
        logits: (B, T, V) (or (N, V)) unnormalised scores.
        target: (B, T) (or (N,)) true ids; positions equal to `pad_id` are ignored.
        pad_id: the padding id.
        smoothing: eps_ls in [0, 1) (the paper uses 0.1).

    Returns:
        a scalar tensor (0 when every target is PAD).
    """
    check_tensor("logits", logits, min_dim=2)
    check_tensor("target", target)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor of scores, got dtype {logits.dtype}")
    check_token_dtype("target", target)
    if logits.device != target.device:
        raise ValueError(f"target is on {target.device} but logits are on {logits.device}; move it with .to()")
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits (..., V) and target (...) must agree: got logits {tuple(logits.shape)}, "
            f"target {tuple(target.shape)}"
        )
    vocab_size = logits.shape[-1]
    if vocab_size < 3:
        raise ValueError(
            f"logits must score at least 3 tokens (PAD, the true token and one other) in their last dimension V, "
            f"got shape {tuple(logits.shape)}"
        )
    log_p = F.log_softmax(logits.float(), dim=-1)  # (..., V)
    q = smoothed_targets(target, vocab_size, pad_id, smoothing).to(log_p.device)  # (..., V)
    per_position = -(q * log_p).sum(-1)  # (...)
    n_real = (target != pad_id).sum()
    return per_position.sum() / n_real.clamp(min=1)


# ---------------------------------------------------------------------------------------------
# The Noam schedule and the optimiser
# ---------------------------------------------------------------------------------------------


def noam_lr(step: int | Tensor, d_model: int, warmup: int = 4000, factor: float = 1.0) -> float | Tensor:
    """The paper's learning rate at `step` (section 5.3, chapter 09).

        lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

    It rises linearly for `warmup` steps, peaks at factor * (d_model * warmup)^-0.5, then decays as
    1/sqrt(step). Steps count from 1. A tensor of steps gives a tensor of rates.
    """
    check_positive_int("d_model", d_model)
    check_positive_int("warmup", warmup)
    check_number("factor", factor, positive=True)
    if isinstance(step, Tensor):
        check_has_values("step", step)
        if (step < 1).any():
            raise ValueError("step must be >= 1 (steps count from 1)")
        s = step.double()
        return factor * d_model**-0.5 * torch.minimum(s**-0.5, s * warmup**-1.5)
    check_positive_int("step", step)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(
    model: nn.Module, d_model: int, warmup: int = 4000, factor: float = 1.0
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam(betas=(0.9, 0.98), eps=1e-9) with the Noam schedule (paper section 5.3).

    Returns (optimizer, scheduler); call `scheduler.step()` after each `optimizer.step()`.
    The optimiser's base lr is 1, so the schedule's value *is* the learning rate.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_positive_int("d_model", d_model)
    check_positive_int("warmup", warmup)
    check_number("factor", factor, positive=True)  # a negative factor would be gradient ascent
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: noam_lr(i + 1, d_model, warmup, factor)
    )  # LambdaLR counts from 0
    return optimizer, scheduler


# ---------------------------------------------------------------------------------------------
# Decoding and scoring
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def translate(
    model: Transformer,
    sources: Sequence[str],
    tokenizer: CharTokenizer,
    max_len: int = 32,
    beam_size: int | None = None,
    batch_size: int = 512,
) -> list[str]:
    """Decode each source string with the model: greedy (beam_size=None) or beam search (chapter 09).

    Uses `tl.decoding.greedy_decode` / `tl.decoding.beam_search`; the model is put in eval mode and
    restored to its previous mode afterwards.
    """
    from transformer_lab.decoding import beam_search, greedy_decode

    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    _check_sources(sources)
    _check_tokenizer(tokenizer)
    check_positive_int("batch_size", batch_size)
    if beam_size is not None:
        check_positive_int("beam_size", beam_size)
    check_positive_int("max_len", max_len)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, max_len=max_len)
    try:
        for start in range(0, len(sources), batch_size):
            chunk = list(sources[start : start + batch_size])
            batch = make_batch([(s, "") for s in chunk], tokenizer, device)
            if beam_size is None:
                decoded = greedy_decode(model, batch.src, batch.src_mask, **ids)  # (B, 1 + n)
            else:
                decoded = beam_search(model, batch.src, batch.src_mask, beam_size=beam_size, **ids)
            out += [tokenizer.decode(row) for row in decoded.cpu()]
    finally:
        model.train(was_training)
    return out


def exact_match(
    model: Transformer,
    examples: Sequence[Example],
    tokenizer: CharTokenizer,
    beam_size: int | None = None,
    max_len: int = 32,
) -> float:
    """The share of examples whose whole decoded answer equals the target (chapter 09).

    Greedy decoding unless `beam_size` is given (then `tl.decoding.beam_search`).
    """
    _check_examples(examples)
    predictions = translate(model, [e.source for e in examples], tokenizer, max_len, beam_size)
    return sum(p == e.target for p, e in zip(predictions, examples, strict=True)) / len(examples)


def exact_match_by_kind(
    model: Transformer,
    examples: Sequence[Example],
    tokenizer: CharTokenizer,
    beam_size: int | None = None,
    max_len: int = 32,
) -> dict[str, tuple[int, int]]:
    """{kind: (correct, total)} for each kind of example (e.g. each date format), plus "all"."""
    _check_examples(examples)
    predictions = translate(model, [e.source for e in examples], tokenizer, max_len, beam_size)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p, e in zip(predictions, examples, strict=True):
        for key in (e.kind, "all"):
            counts[key][0] += p == e.target
            counts[key][1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def build_model(config: TransformerConfig, seed: int = 0, device: torch.device | str = "cpu") -> Transformer:
    """A `Transformer` whose initial weights depend only on `seed` (chapter 09)."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    check_int("seed", seed, 0)
    device = as_device("device", device)
    torch.manual_seed(seed)
    return Transformer(config).to(device)


def _check_sources(sources: object) -> None:
    if isinstance(sources, str):
        raise TypeError(
            "sources must be a list of strings, got one str (it would be read as one source per character); "
            f"wrap it in a list: [{sources[:20]!r}]"
        )
    if not isinstance(sources, Sequence) or not all(isinstance(s, str) for s in sources):
        raise TypeError(f"sources must be a list of strings, got {type(sources).__name__} {str(sources)[:60]}")
    if not all(sources):
        raise ValueError(f"sources[{list(sources).index('')}] is an empty string: there is nothing to translate")


def _check_tokenizer(tokenizer: object) -> None:
    if not isinstance(tokenizer, CharTokenizer):
        raise TypeError(f"tokenizer must be a tl.data.CharTokenizer, got {type(tokenizer).__name__}")


def _check_examples(examples: object) -> None:
    if isinstance(examples, str) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a list of tl.data.Example, got {type(examples).__name__}")
    if not examples:
        raise ValueError("examples must not be empty")
    if not all(isinstance(e, Example) for e in examples):
        bad = next(e for e in examples if not isinstance(e, Example))
        raise TypeError(f"examples must be a list of tl.data.Example (task.examples(...)), got an item {bad!r}")


@dataclass
class History:
    """What `train` measured: per step the loss and lr, per evaluation the validation exact match."""

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    val_exact_match: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def train(
    model: Transformer,
    task: Task,
    tokenizer: CharTokenizer,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    warmup: int = 200,
    lr_factor: float = 1.0,
    smoothing: float = 0.1,
    clip_norm: float | None = 1.0,
    eval_every: int = 200,
    eval_examples: int = 200,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    max_len: int | None = None,
) -> History:
    """Train `model` on `task` with teacher forcing; returns the `History` (chapter 09).

    Each step draws a fresh batch of training examples, computes `label_smoothed_loss` on the
    decoder's predictions of target + EOS from BOS + target, clips the gradient norm, and takes
    an Adam step with the Noam learning rate. Every `eval_every` steps (and at the end) it measures
    the greedy exact match on `eval_examples` validation examples. Same seed, same run (on one
    device and thread count). Attention weights are not recorded while training (the fast path);
    the previous setting is restored at the end.

    Args:
        steps, batch_size: how long and on how many examples per step.
        warmup, lr_factor: the Noam schedule (`noam_lr`).
        smoothing: label smoothing eps (0 for plain cross-entropy).
        clip_norm: maximum gradient norm (None: no clipping).
        eval_every, eval_examples: how often and on how many validation examples to measure exact match.
        device: where to train (default: where the model is).
        progress: show a tqdm progress bar.
        max_len: longest answer to decode when evaluating (default: the task's longest target + 2).
    """
    from tqdm.auto import tqdm

    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (e.g. tl.data.make_task('dates')), got {type(task).__name__}")
    for name, value in (("steps", steps), ("batch_size", batch_size), ("warmup", warmup)):
        check_positive_int(name, value)
    check_positive_int("eval_every", eval_every)
    check_positive_int("eval_examples", eval_examples)
    check_probability("smoothing", smoothing)
    _check_tokenizer(tokenizer)
    smallest = min(model.config.src_vocab_size, model.config.tgt_vocab_size)
    if tokenizer.vocab_size > smallest:  # found here, not at the first batch that holds a high id
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocabularies hold {smallest}: build the "
            "TransformerConfig with src_vocab_size = tgt_vocab_size = tokenizer.vocab_size"
        )
    check_number("lr_factor", lr_factor, positive=True)  # a negative factor would be gradient ascent
    check_int("seed", seed, 0)
    if clip_norm is not None:
        check_number("clip_norm", clip_norm, positive=True)
    if max_len is not None:
        check_positive_int("max_len", max_len)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    if device is not None:
        model.to(as_device("device", device))
    device = next(model.parameters()).device
    max_len = max_len or task.max_target_len + 2
    # Under torchrun: one process per device, each taking its rows of every global batch (tl.distributed).
    parallel = DataParallel(device)
    device = parallel.device
    model.to(device)
    net = parallel.wrap(model)
    rows = parallel.rows(batch_size)

    torch.manual_seed(seed)
    rng = random.Random(f"train/{task.name}/{seed}")
    validation = task.examples("validation", eval_examples, seed=seed)
    optimizer, scheduler = make_optimizer(model, model.config.d_model, warmup, lr_factor)
    flags = _fast_path_flags(model)  # restored at the end
    record_attention(model, False)
    history = History()
    start = time.perf_counter()
    model.train()
    bar = tqdm(
        range(1, steps + 1),
        desc=f"training on {task.name}",
        disable=not progress or not parallel.is_main,
        leave=True,
        mininterval=PROGRESS_SECONDS,
    )
    finished = False
    try:
        for step in bar:
            batch = make_batch([task.sample(rng, "train") for _ in range(batch_size)], tokenizer, device)
            src, tgt_in, tgt_out = batch.src[rows], batch.tgt_in[rows], batch.tgt_out[rows]  # this process's rows
            logits = net(src, tgt_in, batch.src_mask[rows])  # (B, T, V)
            loss = label_smoothed_loss(logits, tgt_out, tokenizer.pad_id, smoothing)
            if parallel.active:  # weighted so that DDP's average gradient is the global batch's gradient
                counted = (tgt_out != tokenizer.pad_id).sum().item(), (batch.tgt_out != tokenizer.pad_id).sum().item()
                loss = loss * parallel.weight(*counted)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            history.lr.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            history.step.append(step)
            history.loss.append((parallel.sum(loss) / parallel.world_size).item())  # the global batch's loss
            if not math.isfinite(history.loss[-1]):
                raise FloatingPointError(f"the loss became {history.loss[-1]} at step {step}; lower lr_factor")
            if step % eval_every == 0 or step == steps:
                history.eval_step.append(step)
                history.val_exact_match.append(exact_match(model, validation, tokenizer, max_len=max_len))
                model.train()
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", val_em=f"{history.val_exact_match[-1]:.3f}")
        finished = True
    finally:
        bar.close()
        _restore_flags(flags)
        model.eval()
        parallel.close(wait=finished)
    history.seconds = time.perf_counter() - start
    return history


# ---------------------------------------------------------------------------------------------
# Training a GPT on text (chapter 10)
# ---------------------------------------------------------------------------------------------


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


def _fast_path_flags(model: nn.Module) -> list[tuple[nn.Module, str, object]]:
    """Every module's own path flag (attention's record_weights, LayerNorm's fused), to restore later."""
    return [
        (m, name, getattr(m, name)) for m in model.modules() for name in ("record_weights", "fused") if hasattr(m, name)
    ]


def _restore_flags(flags: list[tuple[nn.Module, str, object]]) -> None:
    """Put back what `_fast_path_flags` saved."""
    for module, name, value in flags:
        setattr(module, name, value)


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
    flags, was_training = _fast_path_flags(model), model.training
    record_attention(model, False)
    model.eval()
    try:
        total = _text_loss_sum(model, x, y, batch_size)
    finally:
        _restore_flags(flags)
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


def make_adamw(
    model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.99)
) -> torch.optim.AdamW:
    """AdamW as nanoGPT configures it: weight decay on the matrices (Linear weights, embeddings) only.

    Biases and LayerNorm gains/shifts (the 1-D parameters) are not decayed: pulling a gain towards 0 would
    shrink the activations, not regularise a mapping. A tied matrix is one parameter, decayed once.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_number("lr", lr, positive=True)
    check_number("weight_decay", weight_decay, non_negative=True)
    if (
        not isinstance(betas, (tuple, list))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise ValueError(f"betas must be two numbers in [0, 1), e.g. (0.9, 0.99), got {betas!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(float(betas[0]), float(betas[1])))


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
) -> torch.optim.Optimizer:
    """The optimizer `train_gpt`'s `optimizer` argument names: AdamW (chapter 10), or Muon + AdamW (chapter 11)."""
    if name == "adamw":
        return make_adamw(model, lr, weight_decay, betas)
    from transformer_lab.muon import make_muon

    return make_muon(model, muon_lr, lr, weight_decay=muon_weight_decay, adamw_weight_decay=weight_decay, betas=betas)


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

    Returns:
        a `TextHistory`; the model is left in eval mode, its attention flags as they were.
    """
    from tqdm.auto import tqdm

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
    now = TRAINING_CLOCKS[clock]
    _check_stream_for("train_data", train_data, block, model.config.vocab_size)
    if starts is not None:
        _check_starts(starts, train_data.numel(), block)
        starts = starts.cpu()
    if val_data is not None:
        _check_stream_for("val_data", val_data, block, model.config.vocab_size)
    if device is not None:
        model.to(as_device("device", device))
    parallel = DataParallel(next(model.parameters()).device)
    device = parallel.device
    model.to(device)
    net = parallel.wrap(model)
    rows = parallel.rows(batch_size)
    optimizer = _gpt_optimizer(optimizer, model, lr, weight_decay, betas, muon_lr, muon_weight_decay)
    # Each group's peak rate over lr: 1 for AdamW's groups, muon_lr / lr for Muon's; the schedule scales them all.
    scales = [group["lr"] / lr for group in optimizer.param_groups]
    generator = torch.Generator().manual_seed(seed)  # the batches: the same on every process
    train_data = train_data.cpu()
    if val_data is not None:
        vx, vy = consecutive_windows(val_data.to(device), block)  # (W, block) each
        vx, vy = vx[parallel.rank :: parallel.world_size], vy[parallel.rank :: parallel.world_size]
        n_val = (val_data.numel() - 1) // block * block

    def validation_loss() -> float:
        model.eval()
        total = parallel.sum(_text_loss_sum(model, vx, vy, eval_batch_size))
        model.train()
        return total.item() / n_val

    flags = _fast_path_flags(model)
    record_attention(model, False)
    history = TextHistory()
    start = now()
    evaluating = 0.0  # seconds spent evaluating, left out of eval_seconds
    model.train()
    bar = tqdm(
        range(1, steps + 1),
        desc="training the GPT",
        disable=not progress or not parallel.is_main,
        mininterval=PROGRESS_SECONDS,
    )
    finished = False
    try:
        for step in bar:
            if seconds is None:
                rate = cosine_lr(step - 1, lr, min_lr, warmup, decay_steps)
            else:
                rate = _timed_cosine_lr(step - 1, now() - start - evaluating, seconds, lr, min_lr, warmup)
            for group, scale in zip(optimizer.param_groups, scales, strict=True):
                group["lr"] = rate * scale
            with trusted():  # train_data and starts were checked above
                x, y = random_windows(train_data, block, batch_size, generator, starts)  # (B, block) each: global
            x, y = x[rows].to(device), y[rows].to(device)  # this process's rows
            logits = net(x)  # (b, block, V)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())  # mean over b * block positions
            if parallel.active:  # weighted so that DDP's average gradient is the global batch's gradient
                loss = loss * parallel.weight(x.shape[0], batch_size)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            history.step.append(step)
            history.lr.append(rate)
            history.loss.append((parallel.sum(loss.detach()) / parallel.world_size).item())  # the global loss
            if not math.isfinite(history.loss[-1]):
                raise FloatingPointError(f"the loss became {history.loss[-1]} at step {step}; lower lr")
            trained = now() - start - evaluating
            last = step == steps or (seconds is not None and trained >= seconds)
            if val_data is not None and (step % eval_every == 0 or last):
                begun = now()
                history.eval_step.append(step)
                history.eval_seconds.append(begun - start - evaluating)
                history.val_loss.append(validation_loss())
                evaluating += now() - begun
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", val=f"{history.val_loss[-1]:.3f}")
            if last:
                break
        finished = True
    finally:
        bar.close()
        _restore_flags(flags)
        model.eval()
        parallel.close(wait=finished)
    history.seconds = now() - start
    return history


#: The clocks `train_gpt(clock=...)` can count training time with.
TRAINING_CLOCKS: dict[str, Any] = {"wall": time.perf_counter, "cpu": time.process_time}


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
    from transformer_lab.gpt import GPTConfig

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    device = as_device("map_location", map_location)
    if os.path.isdir(path):
        raise ValueError(f"path {os.fspath(path)!r} is a folder; give the checkpoint file inside it (e.g. gpt.pt)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GPT checkpoint at path {os.fspath(path)!r}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - a corrupt file can fail anywhere in the unpickler (KeyError, ...)
        advice = "load it where it was made and save it with tl.training.save_gpt(model, path, tokenizer)"
        raise unreadable_checkpoint(path, error, "a GPT checkpoint", advice) from None
    if not isinstance(data, dict) or data.get("kind") != "gpt":
        what = "chapter 09's Transformer" if isinstance(data, dict) and "task" in data else "something else"
        raise ValueError(
            f"path {os.fspath(path)!r} is not a GPT checkpoint (it holds {what}); write one with "
            "tl.training.save_gpt or `python -m transformer_lab.cli gpt-train`"
        )
    missing = [key for key in ("config", "tokenizer", "state_dict") if key not in data]
    if missing:
        raise ValueError(f"{os.fspath(path)!r} is not a complete GPT checkpoint: it has no {missing}")
    try:
        config = GPTConfig(**data["config"])
        tokenizer = _gpt_tokenizer_from_dict(data["tokenizer"])
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{os.fspath(path)!r} holds a bad config or tokenizer: {error}") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{os.fspath(path)!r}: the tokenizer has {tokenizer.vocab_size} tokens, the config "
            f"vocab_size={config.vocab_size}"
        )
    if not isinstance(data["state_dict"], dict):
        raise ValueError(
            f"{os.fspath(path)!r}: the state_dict must be a dict of weights, got {type(data['state_dict']).__name__}"
        )
    model = _gpt_class()(config)
    try:
        model.load_state_dict(data["state_dict"])  # copied into the float32 parameters (also from float16)
    except RuntimeError as error:
        raise ValueError(f"{os.fspath(path)!r}: the weights do not fit the config: {str(error)[:300]}") from None
    return model.to(device).eval(), tokenizer


def _gpt_tokenizer_from_dict(data: object) -> Any:
    """The tokenizer a GPT checkpoint embeds: characters ({"chars": ...}) or a ByteBPE (its "merges" ...)."""
    from transformer_lab.bpe import ByteBPE
    from transformer_lab.data import TextTokenizer

    if isinstance(data, dict) and "merges" in data:
        return ByteBPE.from_dict(data)
    return TextTokenizer.from_dict(data)  # type: ignore[arg-type]
