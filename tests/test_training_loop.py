"""Tests of transformer_lab.loop: the one training loop of chapters 09, 10 and 11.

`run_steps` is driven directly with a small model, a fake clock and a stand-in for `tl.distributed.DataParallel`
(which records how the run joins and leaves it), then through both chapters' trainers: `train` and `train_gpt`
call it, and take exactly the steps of a loop written out by hand.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab import data, gpt_training, loop, training
from transformer_lab.data import TextTokenizer, random_windows


class OneProcess:
    """A stand-in for `DataParallel` without torchrun that records the loop's calls on it."""

    rank, world_size, active, is_main = 0, 1, False, True

    def __init__(self) -> None:
        self.wrapped: list[nn.Module] = []
        self.closed: list[bool] = []  # the `wait` of each close()

    def wrap(self, model: nn.Module) -> nn.Module:
        self.wrapped.append(model)
        return model

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def close(self, wait: bool = True) -> None:
        self.closed.append(wait)


class Record:
    """A history with the fields `run_steps` fills (a `loop.StepHistory`)."""

    def __init__(self) -> None:
        self.step: list[int] = []
        self.lr: list[float] = []
        self.loss: list[float] = []
        self.seconds = 0.0


class FakeClock:
    """A clock that moves only when told to: `tick(s)` adds s seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def tick(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def toy_model() -> nn.Module:
    """A Linear, a LayerNorm of the course (its `fused` flag) and an attention module (its `record_weights`)."""
    torch.manual_seed(0)
    return nn.ModuleDict(dict(linear=nn.Linear(4, 4), norm=tl.LayerNorm(4), attention=tl.MultiHeadAttention(4, 2)))


def toy_loss(model: nn.Module, clock: FakeClock | None = None, seconds_per_step: float = 1.0):  # noqa: ANN201
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

    def loss(net: nn.Module) -> torch.Tensor:
        if clock is not None:
            clock.tick(seconds_per_step)
        return net["norm"](net["linear"](x)).pow(2).mean()

    return loss


def two_groups(model: nn.Module) -> torch.optim.Optimizer:
    """Two groups built at different peaks: the weights at 0.1 (the base), the bias at 0.3 (scale 3)."""
    linear = model["linear"]
    rest = [p for name, p in model.named_parameters() if not name.startswith("linear.")]
    return torch.optim.SGD([{"params": [linear.weight, *rest], "lr": 0.1}, {"params": [linear.bias], "lr": 0.3}])


def test_the_schedule_sets_every_group_at_every_step_by_its_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    model = toy_model()
    optimizer = two_groups(model)
    seen: list[list[float]] = []
    original = torch.optim.SGD.step

    def recording_step(self: torch.optim.SGD, closure: object = None) -> object:
        seen.append([group["lr"] for group in self.param_groups])
        return original(self, closure)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.optim.SGD, "step", recording_step)
    history = loop.run_steps(
        model, OneProcess(), optimizer, Record(), steps=5, rate=lambda step, trained: 0.01 * step, base_lr=0.1,
        loss=toy_loss(model), clip_norm=None, progress=False,
    )  # fmt: skip
    assert history.step == [1, 2, 3, 4, 5]
    assert history.lr == [0.01 * step for step in range(1, 6)]  # the rate itself, as the trainers record it
    assert seen == [[0.01 * step * (0.1 / 0.1), 0.01 * step * (0.3 / 0.1)] for step in range(1, 6)]
    assert all(math.isfinite(x) for x in history.loss) and history.loss[-1] < history.loss[0]


def test_gradients_are_clipped_before_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = toy_model()
    norms: list[float] = []
    original = torch.optim.SGD.step

    def recording_step(self: torch.optim.SGD, closure: object = None) -> object:
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        return original(self, closure)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.optim.SGD, "step", recording_step)
    loop.run_steps(
        model, OneProcess(), two_groups(model), Record(), steps=3, rate=lambda step, trained: 1.0, base_lr=0.1,
        loss=lambda net: 100 * toy_loss(model)(net), clip_norm=0.01, progress=False,
    )  # fmt: skip
    assert len(norms) == 3 and all(norm <= 0.01 * (1 + 1e-5) for norm in norms)


def test_evaluation_runs_in_eval_mode_and_its_time_is_left_out_of_the_training_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step takes 1 s, each evaluation 100 s: the training time the schedule, the evaluations and the
    budget see counts the steps only; the run's `seconds` counts everything."""
    clock = FakeClock()
    monkeypatch.setitem(loop.TRAINING_CLOCKS, "wall", clock)
    model = toy_model()
    rates: list[tuple[int, float]] = []
    evaluations: list[tuple[int, float, bool]] = []

    def rate(step: int, trained: float) -> float:
        rates.append((step, trained))
        return 0.1

    def evaluate(step: int, trained: float) -> dict[str, float]:
        evaluations.append((step, trained, model.training))
        clock.tick(100.0)
        return {"val": 0.0}

    history = loop.run_steps(
        model, OneProcess(), two_groups(model), Record(), steps=1000, rate=rate, base_lr=0.1,
        loss=toy_loss(model, clock), clip_norm=1.0, evaluate=evaluate, eval_every=2, seconds=5.0, progress=False,
    )  # fmt: skip
    assert rates == [(step, step - 1.0) for step in range(1, 6)]  # before step s: s - 1 steps of 1 s
    assert history.step == [1, 2, 3, 4, 5]  # stopped by the budget (5 s of training), not by steps=1000
    assert evaluations == [(2, 2.0, False), (4, 4.0, False), (5, 5.0, False)]  # every 2 steps and the last
    assert history.seconds == 5.0 + 3 * 100.0
    assert not model.training  # left in eval mode


def test_a_step_cap_ends_a_run_within_its_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setitem(loop.TRAINING_CLOCKS, "cpu", clock)
    model = toy_model()
    evaluated: list[int] = []
    history = loop.run_steps(
        model, OneProcess(), two_groups(model), Record(), steps=3, rate=lambda step, trained: 0.1, base_lr=0.1,
        loss=toy_loss(model, clock), clip_norm=None, evaluate=lambda step, trained: evaluated.append(step) or {},
        eval_every=10, seconds=60.0, clock="cpu", progress=False,
    )  # fmt: skip
    assert history.step == [1, 2, 3] and evaluated == [3]


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step() -> None:
    model = toy_model()
    losses = iter([1.0, 2.0, float("nan")])

    def loss(net: nn.Module) -> torch.Tensor:
        return toy_loss(model)(net) * 0 + next(losses)

    with pytest.raises(FloatingPointError, match=r"the loss became nan at step 3; lower lr_factor"):
        loop.run_steps(
            model, OneProcess(), two_groups(model), Record(), steps=5, rate=lambda step, trained: 0.1, base_lr=0.1,
            loss=loss, clip_norm=None, progress=False, lower="lr_factor",
        )  # fmt: skip


def path_flags(model: nn.Module) -> list[tuple[str, str, object]]:
    return [(name, flag, getattr(m, flag)) for name, m in model.named_modules() for flag in ("record_weights", "fused")
            if hasattr(m, flag)]  # fmt: skip


@pytest.mark.parametrize("fails_in", ["loss", "evaluate"])
def test_flags_mode_and_the_process_group_are_restored_after_an_error(fails_in: str) -> None:
    model = tl.record_attention(toy_model(), True)  # the explicit path: attention weights kept, LayerNorm unfused
    flags = path_flags(model)
    parallel = OneProcess()
    seen_in_training: list[tuple[bool, bool]] = []
    base = toy_loss(model)

    def loss(net: nn.Module) -> torch.Tensor:
        seen_in_training.append((model["attention"].record_weights, model["norm"].fused))
        if fails_in == "loss" and len(seen_in_training) == 2:
            raise RuntimeError("out of memory, say")
        return base(net)

    def evaluate(step: int, trained: float) -> dict[str, float]:
        raise RuntimeError("out of memory, say")

    with pytest.raises(RuntimeError, match="out of memory"):
        loop.run_steps(
            model, parallel, two_groups(model), Record(), steps=5, rate=lambda step, trained: 0.1, base_lr=0.1,
            loss=loss, clip_norm=None, evaluate=evaluate if fails_in == "evaluate" else None, progress=False,
        )  # fmt: skip
    assert seen_in_training[0] == (False, True)  # trained on the fast path
    assert path_flags(model) == flags and model["attention"].record_weights and not model["norm"].fused
    assert not model.training
    assert parallel.wrapped == [model] and parallel.closed == [False]  # left without waiting for the others


def test_a_finished_run_waits_for_the_other_processes_before_leaving_the_group() -> None:
    model = toy_model()
    parallel = OneProcess()
    loop.run_steps(
        model, parallel, two_groups(model), Record(), steps=2, rate=lambda step, trained: 0.1, base_lr=0.1,
        loss=toy_loss(model), clip_norm=None, progress=False,
    )  # fmt: skip
    assert parallel.closed == [True]


def test_data_parallel_moves_the_model_and_does_nothing_more_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    model = toy_model().double()
    parallel = loop.data_parallel(model, "cpu")
    assert (parallel.rank, parallel.world_size, parallel.active) == (0, 1, False)
    assert parallel.device == torch.device("cpu") and parallel.wrap(model) is model
    with pytest.raises((TypeError, ValueError), match="device"):
        loop.data_parallel(model, 3.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------- both chapters' trainers use it


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Every call of `run_steps` from the two trainers, by its keyword arguments."""
    calls: list[dict[str, object]] = []

    def recording(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return loop.run_steps(*args, **kwargs)

    monkeypatch.setattr(training, "run_steps", recording)
    monkeypatch.setattr(gpt_training, "run_steps", recording)
    return calls


def tiny_transformer() -> tuple[tl.Transformer, data.CharTokenizer]:
    tok = data.CharTokenizer()
    config = tl.TransformerConfig(
        tok.vocab_size, tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, max_len=32
    )
    return training.build_model(config, seed=0), tok


def test_chapter_09s_train_is_the_shared_loop_and_takes_the_steps_of_adam_with_noams_scheduler(
    spy: list[dict[str, object]],
) -> None:
    task = data.CopyTask(max_len=4, alphabet="abcd")
    model, tok = tiny_transformer()
    by_hand = copy.deepcopy(model)
    history = training.train(
        model, task, tok, steps=6, batch_size=8, warmup=3, lr_factor=2.0, clip_norm=0.5, eval_every=100,
        eval_examples=4, seed=2, progress=False,
    )  # fmt: skip
    assert len(spy) == 1 and spy[0]["lower"] == "lr_factor" and spy[0]["base_lr"] == 1.0
    assert history.step == list(range(1, 7)) and history.eval_step == [6] and len(history.val_exact_match) == 1

    # chapter 09's loop before it was shared: make_optimizer's Adam, its LambdaLR stepped after each step
    torch.manual_seed(2)
    rng = random.Random(f"train/{task.name}/2")
    optimizer, scheduler = training.make_optimizer(by_hand, 16, warmup=3, factor=2.0)
    tl.record_attention(by_hand, False).train()
    losses, rates = [], []
    for _ in range(6):
        batch = data.make_batch([task.sample(rng, "train") for _ in range(8)], tok)
        loss = training.label_smoothed_loss(by_hand(batch.src, batch.tgt_in, batch.src_mask), batch.tgt_out, tok.pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(by_hand.parameters(), 0.5)
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    assert history.loss == losses and history.lr == rates
    for (name, ours), theirs in zip(model.state_dict().items(), by_hand.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_chapter_10s_train_gpt_is_the_shared_loop_and_takes_nanogpts_steps(
    spy: list[dict[str, object]], optimizer: str
) -> None:
    text = "to be or not to be, that is the question. " * 10
    tokenizer = TextTokenizer.from_text(text)
    stream = tokenizer.encode(text)
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(tokenizer.vocab_size, block_size=8, d_model=16, n_heads=2, n_layers=1))
    by_hand = copy.deepcopy(model)
    settings = dict(lr=1e-2, min_lr=1e-3, warmup=2, weight_decay=0.1, betas=(0.9, 0.99))
    history = training.train_gpt(
        model, stream, stream, steps=5, batch_size=3, clip_norm=0.5, eval_every=2, eval_batch_size=4, seed=1,
        optimizer=optimizer, muon_lr=0.05, progress=False, **settings,
    )  # fmt: skip
    assert len(spy) == 1 and spy[0]["base_lr"] == 1e-2 and spy[0]["description"] == "training the GPT"
    assert history.eval_step == [2, 4, 5] and len(history.val_loss) == len(history.eval_seconds) == 3

    # chapter 10's loop before it was shared: the cosine set on every group (Muon's at muon_lr / lr times it)
    if optimizer == "adamw":
        opt = training.make_adamw(by_hand, 1e-2, 0.1, (0.9, 0.99))
    else:
        from transformer_lab.muon import make_muon

        opt = make_muon(by_hand, 0.05, 1e-2, weight_decay=0.0, adamw_weight_decay=0.1, betas=(0.9, 0.99))
    scales = [group["lr"] / 1e-2 for group in opt.param_groups]
    generator = torch.Generator().manual_seed(1)
    tl.record_attention(by_hand, False).train()
    losses = []
    for step in range(5):
        rate = training.cosine_lr(step, 1e-2, 1e-3, 2, 5)
        for group, scale in zip(opt.param_groups, scales, strict=True):
            group["lr"] = rate * scale
        x, y = random_windows(stream, 8, 3, generator)  # (3, 8) each
        loss = F.cross_entropy(by_hand(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(by_hand.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())
    assert history.loss == losses and history.lr == [training.cosine_lr(i, 1e-2, 1e-3, 2, 5) for i in range(5)]
    for (name, ours), theirs in zip(model.state_dict().items(), by_hand.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name
    assert history.val_loss[-1] == pytest.approx(training.evaluate_text(by_hand, stream, block=8), abs=1e-5)


def test_the_names_of_the_split_stay_importable_from_training() -> None:
    for name in training.__all__:
        assert hasattr(training, name), name
    assert training.TRAINING_CLOCKS is loop.TRAINING_CLOCKS and training.PROGRESS_SECONDS == loop.PROGRESS_SECONDS
    assert training.GPT_OPTIMIZERS == ("adamw", "muon")
    assert training.train_gpt is gpt_training.train_gpt and training.load_gpt is gpt_training.load_gpt
