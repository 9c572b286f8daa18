"""The one training loop of the course: chapter 09's `train`, chapter 10's `train_gpt` and chapter 11's runs.

Every trainer of the course takes the same steps; what differs between the chapters is what a step trains on,
what loss it minimises and how it is evaluated. So a chapter's trainer checks its arguments, builds its model's
optimizer, says those three things as small functions, and hands them to `run_steps`:

    the chapter says                              `run_steps` does, at each step
    ------------------------------------------    -------------------------------------------------------------
    rate(step, trained): the learning rate        set every parameter group's lr to rate * the group's scale
    loss(net): the loss of a fresh batch          zero_grad, backward, clip the gradient norm, optimizer.step
                                                  record step, lr and the global batch's loss; stop with an
                                                  error naming the step if that loss is not finite
    evaluate(step, trained): measure, record      every `eval_every` steps and at the last, in eval mode, off
                                                  the training clock

and around the steps: the model's attention on the fast path (its flags restored afterwards, also after an
error), a tqdm progress bar on the main process, DistributedDataParallel under torchrun (`tl.distributed`,
wrapped before the first step, the process group left after the last), the model left in eval mode.

Training time. `trained` is the time spent training so far, evaluations excluded, on the clock the caller
names (`TRAINING_CLOCKS`): the time-budget runs of chapter 11 (`seconds`) stop and decay their schedule by it,
so a recipe that evaluates more often is not charged for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

import torch
from torch import Tensor, nn

from transformer_lab._checks import as_device
from transformer_lab.distributed import DataParallel
from transformer_lab.multihead import record_attention

__all__ = ["TRAINING_CLOCKS", "PROGRESS_SECONDS", "StepHistory", "data_parallel", "run_steps"]

#: The clocks training time can be counted with (`train_gpt(clock=...)`): the wall clock, or the process's CPU
#: time (on one thread the same as the wall clock of a quiet machine, and unaffected by programs sharing it).
TRAINING_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

# Seconds between two redraws of a progress bar. In a notebook every redraw is a few kernel messages;
# a run of minutes redrawn ten times a second sends thousands, and a client that reads them only
# when the cell ends (nbval, papermill) loses the overflow, the cell's end included.
PROGRESS_SECONDS = 1.0


class StepHistory(Protocol):
    """What `run_steps` records in a chapter's history (`tl.training.History`, `tl.training.TextHistory`)."""

    step: list[int]
    lr: list[float]
    loss: list[float]
    seconds: float


HistoryT = TypeVar("HistoryT", bound=StepHistory)


def data_parallel(model: nn.Module, device: torch.device | str | None) -> DataParallel:
    """Move `model` where it trains and return this process's `DataParallel` (`tl.distributed`).

    `device` None: where the model is. Under torchrun this joins the process group (a CUDA device becomes this
    process's own GPU); `run_steps` wraps the model and leaves the group. Without torchrun it changes nothing.
    """
    if device is not None:
        model.to(as_device("device", device))
    parallel = DataParallel(next(model.parameters()).device)
    model.to(parallel.device)
    return parallel


def fast_path_flags(model: nn.Module) -> list[tuple[nn.Module, str, object]]:
    """Every module's own path flag (attention's record_weights, LayerNorm's fused), to restore later."""
    return [
        (m, name, getattr(m, name)) for m in model.modules() for name in ("record_weights", "fused") if hasattr(m, name)
    ]


def restore_flags(flags: list[tuple[nn.Module, str, object]]) -> None:
    """Put back what `fast_path_flags` saved."""
    for module, name, value in flags:
        setattr(module, name, value)


def run_steps(
    model: nn.Module,
    parallel: DataParallel,
    optimizer: torch.optim.Optimizer,
    history: HistoryT,
    *,
    steps: int,
    rate: Callable[[int, float], float],
    base_lr: float,
    loss: Callable[[nn.Module], Tensor],
    clip_norm: float | None,
    evaluate: Callable[[int, float], Mapping[str, float]] | None = None,
    eval_every: int = 1,
    seconds: float | None = None,
    clock: str = "wall",
    description: str = "training",
    progress: bool = True,
    lower: str = "lr",
) -> HistoryT:
    """Train `model` for `steps` steps (or `seconds` of training time), recording into `history`; return it.

    The caller has checked the arguments (each chapter's trainer does, before it moves the model).

    Args:
        model: the module to train (evaluated and returned as itself, never as its DDP wrapper).
        parallel: this process's part of the run (`data_parallel`); its process group is left at the end.
        optimizer: built on `model`'s parameters, each group's lr set to its peak: `base_lr` times its scale.
        history: where the steps go: `step`, `lr` (the schedule's rate) and `loss` (the global batch's) are
            appended at each step, `seconds` set at the end to the whole run's time, evaluations included.
        steps: the most steps to take (counted from 1).
        rate: the learning rate of step `step` (from 1) after `trained` seconds of training time.
        base_lr: the rate the optimizer's groups were built for: group g trains at rate * (g's lr / base_lr)
            (1 for AdamW's groups; muon_lr / lr for Muon's; chapter 09's Adam is built with lr 1).
        loss: the mean loss of a fresh batch, computed by calling the module it is given (the model, or its
            DistributedDataParallel wrapper) and, under torchrun, weighted by `parallel.weight` so that DDP's
            averaged gradient is the global batch's.
        clip_norm: the largest gradient norm (None: no clipping).
        evaluate: measures the model after step `step`, `trained` seconds of training in, records what it
            measured in the history and returns it by name for the progress bar (None: no evaluation).
            It runs in eval mode; training resumes in train mode.
        eval_every: evaluate every that many steps, and after the last step.
        seconds: a training-time budget: stop at the first step that ends with at least that much training
            time (`steps` then only an upper bound). None: take `steps` steps.
        clock: the name in `TRAINING_CLOCKS` that `trained`, `seconds` and `history.seconds` count on.
        description: the progress bar's label.
        progress: show the progress bar (on the main process only).
        lower: the argument to lower when the loss is not finite, for the error message ("lr", "lr_factor").

    Raises:
        FloatingPointError: the loss became inf or NaN at some step (named in the message).
    """
    from tqdm.auto import tqdm

    now = TRAINING_CLOCKS[clock]
    net = parallel.wrap(model)  # DistributedDataParallel under torchrun, else the model itself
    # Each group's peak rate over the schedule's: 1 for AdamW's groups, muon_lr / lr for Muon's.
    scales = [group["lr"] / base_lr for group in optimizer.param_groups]
    flags = fast_path_flags(model)  # restored at the end
    record_attention(model, False)
    start = now()
    evaluating = 0.0  # seconds spent evaluating, left out of the training time
    model.train()
    bar = tqdm(
        range(1, steps + 1),
        desc=description,
        disable=not progress or not parallel.is_main,
        mininterval=PROGRESS_SECONDS,
    )
    finished = False
    try:
        for step in bar:
            step_rate = rate(step, now() - start - evaluating)
            for group, scale in zip(optimizer.param_groups, scales, strict=True):
                group["lr"] = step_rate * scale
            step_loss = loss(net)
            optimizer.zero_grad(set_to_none=True)
            step_loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            history.step.append(step)
            history.lr.append(step_rate)
            history.loss.append((parallel.sum(step_loss.detach()) / parallel.world_size).item())  # the global loss
            if not math.isfinite(history.loss[-1]):
                raise FloatingPointError(f"the loss became {history.loss[-1]} at step {step}; lower {lower}")
            trained = now() - start - evaluating
            last = step == steps or (seconds is not None and trained >= seconds)
            if evaluate is not None and (step % eval_every == 0 or last):
                begun = now()
                model.eval()
                shown = evaluate(step, begun - start - evaluating)
                model.train()
                evaluating += now() - begun
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", **{k: f"{v:.3f}" for k, v in shown.items()})
            if last:
                break
        finished = True
    finally:
        bar.close()
        restore_flags(flags)
        model.eval()
        parallel.close(wait=finished)  # after an error the other processes may never reach the barrier
    history.seconds = now() - start
    return history
