"""Training a Transformer on a toy task (chapter 09): label smoothing, the Noam schedule, the trainer.

- `label_smoothed_loss`: cross-entropy against a smoothed target distribution, written out
  (paper section 5.4, eps_ls = 0.1). The smoothing mass is spread over the real vocabulary:
  PAD never receives probability, and PAD target positions are ignored.
- `noam_lr`: the paper's learning-rate schedule (section 5.3), linear warm-up then 1/sqrt(step).
- `make_optimizer`: Adam with the paper's betas (0.9, 0.98) and eps 1e-9, driven by the schedule.
- `train`: chapter 09's trainer (gradient clipping, a tqdm progress bar, a returned `History`). It says what
  is the task's (its batches, the smoothed loss, exact match as evaluation, the Noam rate); the steps are the
  course's one loop, `tl.loop.run_steps`, shared with chapter 10's `train_gpt`.
- `translate`, `exact_match`: decode greedily (or by beam search) and score whole answers.

Chapters 10 and 11 call their trainer and checkpoints from here too: `train_gpt` (AdamW or Muon, warm-up and
cosine decay: `cosine_lr`, a training-time budget), `evaluate_text` (the loss over a whole text), `save_gpt` /
`load_gpt`, `make_adamw`, `TextHistory`. They are written in `tl.gpt_training` and re-exported here.
Both trainers run under `torchrun` with DistributedDataParallel (`tl.distributed`).

Shape legend: B batch, S source length, T target length, V vocabulary size, N = B * T.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    as_device,
    check_has_values,
    check_int,
    check_number,
    check_positive_int,
    check_probability,
    check_tensor,
    check_token_dtype,
)
from transformer_lab.data import CharTokenizer, Example, Task, make_batch

# Chapters 10 and 11's trainer and checkpoints, written in gpt_training.py, called from here by the chapters.
from transformer_lab.gpt_training import (
    GPT_OPTIMIZERS,  # noqa: F401 - gpt-train's --optimizer choices, imported from here
    TextHistory,
    ablation_summary,
    adamw_fused,
    cosine_lr,
    evaluate_text,
    load_gpt,
    make_adamw,
    save_gpt,
    train_gpt,
)
from transformer_lab.loop import (
    PROGRESS_SECONDS,  # noqa: F401 - importable from here, as before the loop had its own module
    TRAINING_CLOCKS,  # noqa: F401
    data_parallel,
    run_steps,
)
from transformer_lab.model import Transformer, TransformerConfig

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
    "adamw_fused",
    "evaluate_text",
    "TextHistory",
    "train_gpt",
    "save_gpt",
    "load_gpt",
    "ablation_summary",
]

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
    optimizer = _paper_adam(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: noam_lr(i + 1, d_model, warmup, factor)
    )  # LambdaLR counts from 0
    return optimizer, scheduler


def _paper_adam(model: nn.Module) -> torch.optim.Adam:
    """Adam(betas=(0.9, 0.98), eps=1e-9) at lr 1: the Noam schedule's value is then the learning rate."""
    return torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)


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
    max_len = max_len or task.max_target_len + 2
    # Under torchrun: one process per device, each taking its rows of every global batch (tl.distributed).
    parallel = data_parallel(model, device)
    device = parallel.device
    rows = parallel.rows(batch_size)

    torch.manual_seed(seed)
    rng = random.Random(f"train/{task.name}/{seed}")
    validation = task.examples("validation", eval_examples, seed=seed)
    optimizer = _paper_adam(model)  # make_optimizer's Adam; run_steps sets its lr to the Noam rate each step
    history = History()

    def noam(step: int, trained: float) -> float:
        """The paper's rate at `step` (from 1), whatever the time."""
        return noam_lr(step, model.config.d_model, warmup, lr_factor)

    def batch_loss(net: nn.Module) -> Tensor:
        """The smoothed loss of a fresh batch: target + EOS predicted from BOS + target (teacher forcing)."""
        batch = make_batch([task.sample(rng, "train") for _ in range(batch_size)], tokenizer, device)
        src, tgt_in, tgt_out = batch.src[rows], batch.tgt_in[rows], batch.tgt_out[rows]  # this process's rows
        logits = net(src, tgt_in, batch.src_mask[rows])  # (B, T, V)
        loss = label_smoothed_loss(logits, tgt_out, tokenizer.pad_id, smoothing)
        if parallel.active:  # weighted so that DDP's average gradient is the global batch's gradient
            counted = (tgt_out != tokenizer.pad_id).sum().item(), (batch.tgt_out != tokenizer.pad_id).sum().item()
            loss = loss * parallel.weight(*counted)
        return loss

    def validate(step: int, trained: float) -> dict[str, float]:
        """Greedy exact match on the validation examples."""
        history.eval_step.append(step)
        history.val_exact_match.append(exact_match(model, validation, tokenizer, max_len=max_len))
        return {"val_em": history.val_exact_match[-1]}

    return run_steps(
        model,
        parallel,
        optimizer,
        history,
        steps=steps,
        rate=noam,
        base_lr=1.0,  # the lr Adam was built with
        loss=batch_loss,
        clip_norm=clip_norm,
        evaluate=validate,
        eval_every=eval_every,
        description=f"training on {task.name}",
        progress=progress,
        lower="lr_factor",
    )
