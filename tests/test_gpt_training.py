"""Tests of chapter 10's training code: cosine_lr, evaluate_text, train_gpt, save_gpt / load_gpt, DataParallel."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import transformer_lab as tl
from transformer_lab import training
from transformer_lab.data import TextTokenizer, split_text
from transformer_lab.distributed import DataParallel
from transformer_lab.gpt import GPT, GPTConfig

TEXT = "to be or not to be, that is the question; whether 'tis nobler in the mind to suffer. " * 12


def _setup(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[GPT, TextTokenizer, torch.Tensor, torch.Tensor]:
    tokenizer = TextTokenizer.from_text(TEXT)
    train_data, val_data = split_text(tokenizer.encode(TEXT))
    torch.manual_seed(seed)
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=2)).to(dtype)
    return model, tokenizer, train_data, val_data


# ------------------------------------------------------------------ the schedule


def test_cosine_lr_warms_up_then_decays_to_min_lr() -> None:
    lr, low, warmup, decay = 1e-3, 1e-4, 10, 110
    rates = [training.cosine_lr(s, lr, low, warmup, decay) for s in range(130)]
    assert rates[0] == pytest.approx(lr / warmup) and rates[warmup - 1] == pytest.approx(lr)
    assert all(a < b for a, b in zip(rates[:warmup], rates[1:warmup], strict=False))  # rising
    assert rates[warmup] == pytest.approx(lr)  # the cosine starts at the peak
    assert rates[60] == pytest.approx((lr + low) / 2)  # half way: the mean of the two
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1 :], strict=False))  # falling
    assert rates[decay] == rates[-1] == low
    assert training.cosine_lr(0, 1e-3, 1e-4, 0, 100) == pytest.approx(1e-3)  # no warm-up


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lr=-1.0), "lr"),
        (dict(min_lr=2e-3), "min_lr"),
        (dict(warmup=-1), "warmup"),
        (dict(decay_steps=5), "decay_steps"),
        (dict(step=-1), "step"),
    ],
)
def test_cosine_lr_refuses_bad_settings(kwargs: dict, match: str) -> None:
    settings = dict(step=0, lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=100) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        training.cosine_lr(**settings)


# ------------------------------------------------------------------ the validation loss


def test_evaluate_text_is_the_mean_over_consecutive_windows() -> None:
    model, _, _, val_data = _setup(dtype=torch.float64)
    block = 7
    # By the definition, window by window, without consecutive_windows or batching.
    total, count, start = 0.0, 0, 0
    while start + block + 1 <= len(val_data):
        context, nxt = val_data[start : start + block], val_data[start + 1 : start + block + 1]
        log_p = torch.log_softmax(model(context[None])[0], dim=-1)  # (block, V)
        total += -log_p[torch.arange(block), nxt].sum().item()
        count += block
        start += block
    assert count == (len(val_data) - 1) // block * block  # the tail is left out
    for batch_size in (1, 4, 256):
        assert training.evaluate_text(model, val_data, block, batch_size=batch_size) == pytest.approx(
            total / count, abs=1e-10
        )


def test_evaluate_text_restores_the_mode_and_the_flags() -> None:
    model, _, _, val_data = _setup()
    tl.record_attention(model, True)
    model.train()
    training.evaluate_text(model, val_data)
    assert model.training and all(layer.self_attn.record_weights for layer in model.layers)


def test_evaluate_text_refuses_bad_input() -> None:
    model, _, _, val_data = _setup()
    with pytest.raises(ValueError, match="block_size"):
        training.evaluate_text(model, val_data, 17)
    with pytest.raises(TypeError, match="1-D integer"):
        training.evaluate_text(model, val_data.float(), 8)
    with pytest.raises(ValueError, match="fewer than block"):
        training.evaluate_text(model, val_data[:5], 8)
    with pytest.raises(TypeError, match="GPT"):
        training.evaluate_text(torch.nn.Linear(2, 2), val_data, 8)


# ------------------------------------------------------------------ the trainer


@pytest.mark.parametrize("aligned, fused", [(False, None), (True, None), (False, False)])
def test_train_gpt_is_adamw_with_the_schedule_and_clipping(aligned: bool, fused: bool | None) -> None:
    """Three steps of train_gpt equal a loop written with PyTorch's AdamW and clip_grad_norm_ directly, with
    windows at any offset or (aligned) only where one token stands; its AdamW is PyTorch's fused one on a CPU
    unless fused=False asks for the plain one."""
    model, _, train_data, _ = _setup(dtype=torch.float64)
    reference, *_ = _setup(dtype=torch.float64)
    starts = tl.data.token_starts(train_data, int(train_data[3]), 16) if aligned else None
    settings = dict(steps=3, batch_size=4, lr=3e-3, min_lr=1e-4, warmup=2, weight_decay=0.1, clip_norm=0.5)
    history = training.train_gpt(
        model, train_data, None, block=16, seed=5, starts=starts, progress=False, fused=fused, **settings
    )

    decay = [p for p in reference.parameters() if p.dim() >= 2]
    rest = [p for p in reference.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        betas=(0.9, 0.99),
        fused=fused is None,
    )
    generator = torch.Generator().manual_seed(5)
    losses = []
    for i in range(3):
        lr = 3e-3 * (i + 1) / 2 if i < 2 else 1e-4 + (3e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * 0 / 1))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = tl.data.random_windows(train_data, 16, 4, generator, starts)
        if aligned:
            assert torch.all(x[:, 0] == train_data[3])
        loss = F.cross_entropy(reference(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        optimizer.step()
        losses.append(loss.item())
    assert history.loss == pytest.approx(losses, abs=1e-12)
    assert history.lr == pytest.approx([1.5e-3, 3e-3, 3e-3])
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12, msg=name)


def test_make_adamw_runs_pytorchs_fused_kernel_on_a_cpu_unless_told_not_to() -> None:
    """fused=None (the default) is PyTorch's fused AdamW on a CPU, with nanoGPT's groups; fused=False the plain
    one. Both make the same update: over ten float32 steps the losses agree to float32's rounding and no weight
    moves apart by a tenth of one step (lr), and each is exactly the torch.optim.AdamW it says it is."""
    models = [_setup()[0] for _ in range(4)]
    fused, plain = training.make_adamw(models[0], 1e-2), training.make_adamw(models[1], 1e-2, fused=False)
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in fused.param_groups] == [len(g["params"]) for g in plain.param_groups]
    by_hand = {}
    for model, flag in zip(models[2:], (True, False), strict=True):
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
        by_hand[flag] = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.99), fused=flag)
    pairs = [(models[0], fused), (models[1], plain), (models[2], by_hand[True]), (models[3], by_hand[False])]
    x = torch.randint(models[0].config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    losses: list[list[float]] = [[] for _ in pairs]
    for _ in range(10):
        for (model, optimizer), record in zip(pairs, losses, strict=True):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            record.append(loss.item())
    weights = [torch.cat([p.detach().flatten() for p in model.parameters()]) for model in models]
    assert torch.equal(weights[0], weights[2]) and torch.equal(weights[1], weights[3])  # each is what it says
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # the same update, rounded apart
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=1e-3)
    assert not torch.equal(weights[0], weights[1])  # (and so not to the bit: the two are different code)


@pytest.mark.parametrize(
    "fused, error, match",
    [("yes", TypeError, "fused must be None"), (1, TypeError, "fused must be None")],
)
def test_make_adamw_refuses_a_fused_that_is_not_a_bool(fused: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        training.make_adamw(_setup()[0], 1e-3, fused=fused)  # type: ignore[arg-type]


def test_fused_true_is_refused_where_pytorch_has_no_fused_kernel_for_the_course() -> None:
    """A model on the meta device (or an integer parameter) cannot take fused=True: a clear error naming fused;
    the default then falls back to the plain AdamW."""
    with torch.device("meta"):
        model = GPT(GPTConfig(11, block_size=8, d_model=8, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match=r"fused=True needs floating-point parameters on cpu or cuda, got \['meta"):
        training.make_adamw(model, 1e-3, fused=True)
    assert not training.make_adamw(model, 1e-3).defaults["fused"]
    assert not training.adamw_fused([torch.zeros(2, dtype=torch.int64)])


def test_make_muon_runs_adamw_fused_like_make_adamw() -> None:
    model = _setup()[0]
    assert tl.muon.make_muon(model).adamw.defaults["fused"] is True
    assert not tl.muon.make_muon(model, adamw_fused=False).adamw.defaults["fused"]
    with pytest.raises(TypeError, match="fused must be None"):
        tl.muon.make_muon(model, adamw_fused="no")  # type: ignore[arg-type]


def test_train_gpt_learns_and_records_its_history() -> None:
    model, _, train_data, val_data = _setup()
    before = training.evaluate_text(model, val_data, 16)
    history = training.train_gpt(
        model, train_data, val_data, steps=60, batch_size=8, lr=1e-2, warmup=5, eval_every=25, progress=False
    )
    assert history.step == list(range(1, 61)) and len(history.loss) == len(history.lr) == 60
    assert history.eval_step == [25, 50, 60]
    assert len(history.val_loss) == len(history.eval_seconds) == 3
    assert history.val_loss[-1] == pytest.approx(training.evaluate_text(model, val_data, 16), abs=1e-5)
    assert history.val_loss[-1] < before - 1.0  # a repeated sentence is quickly learnt (3.1 -> 1.7 nats)
    assert history.eval_seconds == sorted(history.eval_seconds) and history.seconds >= history.eval_seconds[-1]
    assert history.time_to_loss(history.val_loss[-1]) is not None and history.time_to_loss(-1.0) is None
    assert not model.training


def test_train_gpt_is_deterministic_for_a_seed() -> None:
    states = []
    for seed in (3, 3, 4):
        model, _, train_data, _ = _setup()
        training.train_gpt(model, train_data, None, steps=4, batch_size=3, warmup=1, seed=seed, progress=False)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(steps=0), ValueError, "steps"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(block=17), ValueError, "block_size"),
        (dict(lr=-1e-3), ValueError, "lr"),
        (dict(min_lr=1.0), ValueError, "min_lr"),
        (dict(warmup=500), ValueError, "decay_steps"),
        (dict(clip_norm=0.0), ValueError, "clip_norm"),
        (dict(weight_decay=-0.1), ValueError, "weight_decay"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(progress="yes"), TypeError, "progress"),
        (dict(starts=[0, 5]), TypeError, "starts must be a 1-D integer tensor"),
        (dict(starts=torch.tensor([0, 10**6])), ValueError, "starts must lie in"),
    ],
)
def test_train_gpt_refuses_bad_settings(kwargs: dict, error: type, match: str) -> None:
    model, _, train_data, val_data = _setup()
    with pytest.raises(error, match=match):
        training.train_gpt(model, train_data, val_data, **{"steps": 2, "warmup": 1, **kwargs})


def test_train_gpt_refuses_bad_data() -> None:
    model, _, train_data, val_data = _setup()
    with pytest.raises(TypeError, match="train_data"):
        training.train_gpt(model, TEXT, val_data, steps=1, warmup=0)
    with pytest.raises(ValueError, match="val_data has 5 tokens"):
        training.train_gpt(model, train_data, val_data[:5], steps=1, warmup=0)
    with pytest.raises(ValueError, match="vocabulary"):
        training.train_gpt(model, train_data + 100, val_data, steps=1, warmup=0)
    with pytest.raises(TypeError, match="GPT"):
        training.train_gpt(torch.nn.Linear(2, 2), train_data, val_data, steps=1, warmup=0)


# ------------------------------------------------------------------ checkpoints


def test_save_and_load_gpt_round_trip(tmp_path: Path) -> None:
    model, tokenizer, _, val_data = _setup(seed=2)
    path = tmp_path / "gpt.pt"
    training.save_gpt(model, path, tokenizer, history={"val_loss": [1.0]})
    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["kind"] == "gpt" and raw["tokenizer"]["chars"] == tokenizer.chars and raw["history"]["val_loss"] == [1.0]
    loaded, loaded_tokenizer = training.load_gpt(path)
    assert loaded.config == model.config and loaded_tokenizer.chars == tokenizer.chars and not loaded.training
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True)
    )
    assert loaded.lm_head.weight is loaded.token_embedding.weight  # still tied
    half = tmp_path / "half.pt"
    training.save_gpt(model, half, tokenizer, half=True)
    assert torch.load(half, weights_only=True)["state_dict"]["token_embedding.weight"].dtype == torch.float16
    from_half, _ = training.load_gpt(half)
    assert from_half.token_embedding.weight.dtype == torch.float32
    torch.testing.assert_close(from_half.token_embedding.weight, model.token_embedding.weight, atol=1e-3, rtol=1e-3)


def test_load_gpt_refuses_bad_files(tmp_path: Path) -> None:
    model, tokenizer, _, _ = _setup()
    with pytest.raises(FileNotFoundError, match="no GPT checkpoint"):
        training.load_gpt(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="could not be read"):
        training.load_gpt(garbage)
    pickled = tmp_path / "pickled.pt"
    torch.save(model, pickled)  # a whole module: Python objects, refused by weights_only
    with pytest.raises(ValueError, match="could not be read"):
        training.load_gpt(pickled)
    other = tmp_path / "other.pt"
    torch.save({"config": {}, "state_dict": {}, "task": {"name": "copy"}}, other)
    with pytest.raises(ValueError, match="chapter 09"):
        training.load_gpt(other)
    bad = tmp_path / "bad.pt"
    training.save_gpt(model, bad, tokenizer)
    data = torch.load(bad, weights_only=True)
    data["config"]["d_model"] = 32
    torch.save(data, bad)
    with pytest.raises(ValueError, match="do not fit"):
        training.load_gpt(bad)
    with pytest.raises(ValueError, match="folder"):
        training.save_gpt(model, tmp_path / "nowhere" / "x.pt", tokenizer)
    with pytest.raises(ValueError, match="vocab_size"):
        training.save_gpt(model, tmp_path / "x.pt", TextTokenizer("ab"))


# ------------------------------------------------------------------ data parallel, without processes


def test_data_parallel_is_a_no_op_for_one_process() -> None:
    parallel = DataParallel(torch.device("cpu"))
    model = torch.nn.Linear(2, 2)
    assert not parallel.active and parallel.is_main and parallel.wrap(model) is model
    assert parallel.rows(5) == slice(0, 5) and parallel.weight(3, 5) == 1.0


@pytest.mark.parametrize("batch_size, world", [(5, 2), (7, 3), (12, 4), (4, 4)])
def test_each_process_takes_a_disjoint_share_of_the_global_batch(batch_size: int, world: int) -> None:
    taken = []
    weights = 0.0
    for rank in range(world):
        parallel = DataParallel(torch.device("cpu"))
        parallel.rank, parallel.world_size, parallel.active = rank, world, True
        rows = list(range(batch_size))[parallel.rows(batch_size)]
        assert rows, "every process gets at least one row"
        taken += rows
        weights += parallel.weight(len(rows), batch_size) / world  # DDP averages over the processes
    assert taken == list(range(batch_size))  # disjoint, in order, covering the batch
    assert weights == pytest.approx(1.0)
    parallel.world_size = batch_size + 1
    with pytest.raises(ValueError, match="at least"):
        parallel.rows(batch_size)
