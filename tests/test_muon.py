"""Tests of tl.muon (chapter 11): the Muon optimizer against torch.optim.Muon and the published update in float64.

Three references, three tolerances:

- `Muon(ns_dtype=torch.bfloat16)` runs the same operations as torch.optim.Muon (PyTorch 2.13), in the same
  order and precision: the weights must be EQUAL, bit for bit. This pins everything but the precision:
  momentum, Nesterov, the coefficients, the transposition of tall matrices, the shape scaling, the weight decay.
- `Muon` as used (Newton-Schulz in float32) against torch.optim.Muon (bfloat16): each step's update agrees to
  3e-2 relative (Frobenius norm). bfloat16 keeps 8 significant bits (machine epsilon 2^-8 = 3.9e-3); the
  iteration rounds X to bfloat16 after each of its steps and its polynomial (slope up to a = 3.4) amplifies
  earlier rounding, so torch's own update is off the exact one by 0.9e-2 to 1.9e-2 on these shapes
  (measured against the float64 reference below, which our float32 update matches to 5e-6): 3e-2 leaves
  room above that, and the variants a mistake would produce (no Nesterov, 4 or 6 steps, another
  coefficient, the other shape scaling) are off by 0.15 or more, which the guard test checks.
- `_reference_step`, the published update written out plainly in float64: our float64 run agrees to 1e-12
  relative (measured 6e-15), our float32 run to 2e-5 relative (measured 2e-6 to 5e-6: float32's epsilon,
  1.2e-7, amplified by the iteration as above).
"""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from transformer_lab import training
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.muon import (
    Muon,
    MuonAdamW,
    _reference_step,
    make_muon,
    muon_lr_scale,
    newton_schulz,
    parameter_roles,
)

ROOT = Path(__file__).resolve().parents[1]
#: square, tall (as the MLP's W1), wide (as its W2), and neither square nor a power of two; small, because
#: torch.optim.Muon's bfloat16 matrix products are slow on CPUs (4 s for 5 steps at chapter 10's shapes)
SHAPES = [(64, 64), (192, 48), (48, 192), (40, 24)]
STEPS = 5
TEXT = "the cat sat on the mat; the dog sat on the log. " * 40


def _problem(seed: int = 0) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial weights and STEPS gradients per weight, in float64; the gradients' scales span 1e-4 to 1."""
    g = torch.Generator().manual_seed(seed)
    weights = [0.02 * torch.randn(shape, generator=g, dtype=torch.float64) for shape in SHAPES]
    grads = [
        [
            torch.randn(shape, generator=g, dtype=torch.float64) * 10 ** (-4 * torch.rand((), generator=g).item())
            for shape in SHAPES
        ]
        for _ in range(STEPS)
    ]
    return weights, grads


def _updates(make: object, dtype: torch.dtype, seed: int = 0, **options: object) -> list[list[torch.Tensor]]:
    """Each step's change of each weight when the optimizer `make(params, **options)` is fed `_problem`'s grads."""
    weights, grads = _problem(seed)
    params = [nn.Parameter(w.to(dtype)) for w in weights]
    optimizer = make(params, **options)  # type: ignore[operator]
    steps = []
    for step_grads in grads:
        before = [p.detach().clone() for p in params]
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.to(dtype)
        optimizer.step()
        steps.append([p.detach() - b for p, b in zip(params, before, strict=True)])
    return steps


@functools.cache
def _torch_updates(options: tuple[tuple[str, object], ...]) -> list[list[torch.Tensor]]:
    """torch.optim.Muon's updates on `_problem`, computed once per set of options (they are slow)."""
    return _updates(torch.optim.Muon, torch.float32, **dict(options))


def _reference_updates(**options: object) -> list[list[torch.Tensor]]:
    weights, grads = _problem()
    buffers = [torch.zeros_like(w) for w in weights]
    steps = []
    for step_grads in grads:
        new = [_reference_step(w, g, m, **options) for w, g, m in zip(weights, step_grads, buffers, strict=True)]
        steps.append([n[0] - w for n, w in zip(new, weights, strict=True)])
        weights, buffers = [n[0] for n in new], [n[1] for n in new]
    return steps


def _largest_relative_error(ours: list[list[torch.Tensor]], expected: list[list[torch.Tensor]]) -> float:
    """max over steps and weights of ||ours - expected||_F / ||expected||_F, computed in float64."""
    return max(
        ((a.double() - b.double()).norm() / b.double().norm()).item()
        for step_a, step_b in zip(ours, expected, strict=True)
        for a, b in zip(step_a, step_b, strict=True)
    )


OPTIONS = [
    dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1, adjust_lr_fn=None),
    dict(lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.0, adjust_lr_fn="original"),
    dict(lr=1e-3, momentum=0.95, nesterov=True, weight_decay=0.1, adjust_lr_fn="match_rms_adamw", ns_steps=3),
]


# ---------------------------------------------------------------------------------------------
# The update against torch.optim.Muon and the float64 reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS)
def test_with_bfloat16_newton_schulz_it_is_torch_optim_muon_exactly(options: dict) -> None:
    ours = _updates(Muon, torch.float32, ns_dtype=torch.bfloat16, **options)
    theirs = _torch_updates(tuple(options.items()))
    for step_ours, step_theirs in zip(ours, theirs, strict=True):
        for a, b in zip(step_ours, step_theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("options", OPTIONS)
def test_float32_updates_are_within_bfloat16_precision_of_torch_optim_muon(options: dict) -> None:
    ours = _updates(Muon, torch.float32, **options)
    theirs = _torch_updates(tuple(options.items()))
    assert _largest_relative_error(ours, theirs) < 3e-2


def test_the_bfloat16_tolerance_still_tells_mistakes_apart() -> None:
    """Each variant a slip would produce is off torch's update by more than three times the 3e-2 allowed above.

    (A wrong weight decay changes the update by lr * weight_decay * W only, too little to see here: the exact
    bfloat16 test and the float64 reference pin it.)
    """
    options = OPTIONS[0]
    theirs = _torch_updates(tuple(options.items()))
    mistakes = [
        dict(nesterov=False),
        dict(ns_steps=4),
        dict(ns_steps=6),
        dict(ns_coefficients=(3.4445, -4.7750, 2.0)),
        dict(adjust_lr_fn="match_rms_adamw"),
    ]
    for mistake in mistakes:
        assert _largest_relative_error(_updates(Muon, torch.float32, **{**options, **mistake}), theirs) > 0.1, mistake


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_equals_the_published_update_in_float64(options: dict, dtype: torch.dtype, rtol: float) -> None:
    reference_options = {("coefficients" if k == "ns_coefficients" else k): v for k, v in options.items()}
    expected = _reference_updates(**reference_options)
    assert _largest_relative_error(_updates(Muon, dtype, **options), expected) < rtol


def test_torch_optim_muon_is_only_bfloat16_close_to_the_published_update() -> None:
    """Why the comparison with torch needs a looser tolerance: its own error against the float64 update."""
    error = _largest_relative_error(_torch_updates(tuple(OPTIONS[0].items())), _reference_updates(**OPTIONS[0]))
    assert 2e-3 < error < 3e-2  # more than bfloat16's half-epsilon, within the tolerance of the test above


def test_newton_schulz_pushes_singular_values_towards_one_and_keeps_the_directions() -> None:
    g = torch.Generator().manual_seed(1)
    # singular values spread over two decades, all above 1/100 of the Frobenius norm
    u, _ = torch.linalg.qr(torch.randn(96, 64, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))
    s = torch.logspace(0, -1, 64, dtype=torch.float64)
    m = u @ torch.diag(s) @ v.T  # (96, 64)
    o = newton_schulz(m)
    assert o.dtype == torch.float64 and o.shape == m.shape
    singular = torch.linalg.svdvals(o)
    assert 0.68 < singular.min() and singular.max() < 1.21
    # the same singular vectors: U^T O V is diagonal
    inner = u.T @ o @ v  # (64, 64)
    assert (inner - torch.diag(torch.diagonal(inner))).abs().max() < 1e-10
    # a tall matrix is orthogonalised as its transpose; a zero matrix stays zero; float32 in, float32 out
    torch.testing.assert_close(newton_schulz(m.T), o.T, rtol=0, atol=1e-14)
    assert not newton_schulz(torch.zeros(4, 6)).any()
    assert newton_schulz(m.float()).dtype == torch.float32
    assert newton_schulz(m.float(), dtype=torch.bfloat16).dtype == torch.bfloat16


def test_shape_scaling() -> None:
    assert muon_lr_scale((512, 128)) == muon_lr_scale((512, 128), "original") == 2.0
    assert muon_lr_scale((128, 512)) == 1.0
    assert muon_lr_scale((128, 512), "match_rms_adamw") == pytest.approx(0.2 * math.sqrt(512))
    with pytest.raises(ValueError, match="adjust_lr_fn must be one of"):
        muon_lr_scale((2, 2), "spectral")


def test_parameters_without_a_gradient_are_left_alone() -> None:
    a, b = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(5, 4))
    before = b.detach().clone()
    optimizer = Muon([a, b], lr=0.1, weight_decay=0.5)
    a.grad = torch.randn(4, 3)
    optimizer.step()
    assert torch.equal(b, before) and b not in optimizer.state
    grad = a.grad.clone()
    optimizer.step()
    assert torch.equal(a.grad, grad)  # the gradient is read, not overwritten (Keller Jordan's code lerps into it)


# ---------------------------------------------------------------------------------------------
# Roles, the combined optimizer, checkpoints
# ---------------------------------------------------------------------------------------------


def _gpt(**switches: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(17, block_size=16, d_model=16, n_heads=2, n_layers=2, **switches))


@pytest.mark.parametrize("tied", [True, False])
def test_roles_split_by_role_not_by_shape(tied: bool) -> None:
    model = _gpt(tie_embeddings=tied)
    roles = parameter_roles(model)
    assert list(roles) == [name for name, _ in model.named_parameters()]  # every parameter, once
    named = dict(model.named_parameters())
    block_linears = {f"layers.{name}.weight" for name, m in model.layers.named_modules() if isinstance(m, nn.Linear)}
    assert {n for n, r in roles.items() if r == "muon"} == block_linears and len(block_linears) == 2 * 6
    # the embeddings and the head are 2-D, yet AdamW's
    assert roles["token_embedding.weight"] == "adamw" and named["token_embedding.weight"].dim() == 2
    assert roles["position_embedding.embedding.weight"] == "adamw"
    if tied:
        assert "lm_head.weight" not in roles  # the same tensor as the token embedding
    else:
        assert roles["lm_head.weight"] == "adamw" and named["lm_head.weight"].dim() == 2
    assert all(r == "adamw_no_decay" for n, r in roles.items() if named[n].dim() < 2)
    assert "layers.0.norm1.weight" in roles and "layers.0.self_attn.w_q.bias" in roles


def test_a_matrix_tied_to_one_outside_the_blocks_keeps_adamw_and_frozen_ones_are_left_out() -> None:
    model = _gpt(bias=False)
    model.layers[0].self_attn.w_q.weight = model.lm_head.weight = nn.Parameter(torch.randn(16, 16))
    model.layers[1].norm1.weight.requires_grad_(False)
    roles = parameter_roles(model)
    assert roles["layers.0.self_attn.w_q.weight"] == "adamw" and "layers.1.norm1.weight" not in roles


def test_other_models_name_their_blocks() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), nn.Linear(8, 10))
    assert parameter_roles(model, blocks="1") == {
        "0.weight": "adamw",
        "1.0.weight": "muon",
        "1.0.bias": "adamw_no_decay",
        "1.1.weight": "adamw_no_decay",
        "1.1.bias": "adamw_no_decay",
        "2.weight": "adamw",
        "2.bias": "adamw_no_decay",
    }
    with pytest.raises(ValueError, match="no submodule 'layers'.*blocks="):
        parameter_roles(model)


def test_make_muon_groups_and_a_schedule_drives_both_halves() -> None:
    model = _gpt(tie_embeddings=False)
    optimizer = make_muon(model, lr=0.02, adamw_lr=1e-3, weight_decay=0.01, adamw_weight_decay=0.1)
    assert isinstance(optimizer, torch.optim.Optimizer)
    muon_group, decay_group, no_decay_group = optimizer.param_groups
    assert muon_group is optimizer.muon.param_groups[0] and decay_group is optimizer.adamw.param_groups[0]
    assert (muon_group["lr"], muon_group["weight_decay"]) == (0.02, 0.01)
    assert (decay_group["lr"], decay_group["weight_decay"], no_decay_group["weight_decay"]) == (1e-3, 0.1, 0.0)
    assert "lm_head.weight" in decay_group["param_names"] and "token_embedding.weight" in decay_group["param_names"]
    assert decay_group["betas"] == (0.9, 0.99)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model(torch.randint(0, 17, (2, 8))).sum().backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.01)
    assert optimizer.adamw.param_groups[1]["lr"] == pytest.approx(5e-4)
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def _train_steps(model: GPT, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 17, (4, 16), generator=g)
        loss = nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_state_dict_round_trip_continues_the_same_run(tmp_path: Path) -> None:
    model = _gpt(tie_embeddings=False)
    optimizer = make_muon(model)
    _train_steps(model, optimizer, 3, seed=0)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "run.pt")
    saved = torch.load(tmp_path / "run.pt", weights_only=True)  # plain data and tensors only
    assert set(saved["optimizer"]) == {"muon", "adamw"}
    assert len(saved["optimizer"]["muon"]["state"]) == 12  # a momentum buffer per hidden matrix

    resumed = _gpt(tie_embeddings=False)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = make_muon(resumed)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    assert resumed_optimizer.param_groups[0] is resumed_optimizer.muon.param_groups[0]  # shared again after loading
    copied_model, copied_optimizer = copy.deepcopy((model, optimizer))  # one deepcopy: the pair stays linked
    _train_steps(model, optimizer, 2, seed=1)
    _train_steps(resumed, resumed_optimizer, 2, seed=1)
    _train_steps(copied_model, copied_optimizer, 2, seed=1)
    for name, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
        assert torch.equal(copied_model.state_dict()[name], value), name

    fresh_model = _gpt(tie_embeddings=False)  # without the optimizer's state the run differs (momentum restarts)
    fresh_model.load_state_dict(saved["model"])
    fresh = make_muon(fresh_model)
    _train_steps(fresh_model, fresh, 2, seed=1)
    assert not torch.equal(fresh_model.layers[0].self_attn.w_q.weight, model.layers[0].self_attn.w_q.weight)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_parameters_and_hyperparameters_are_refused_clearly() -> None:
    w = nn.Parameter(torch.randn(4, 4))
    with pytest.raises(
        ValueError, match=r"2-D weight matrices only, but params\[1\] of group 0 has shape \(4,\).*AdamW"
    ):
        Muon([w, nn.Parameter(torch.randn(4))])
    with pytest.raises(ValueError, match=r"but gain has shape \(4,\)"):
        Muon([("w", w), ("gain", nn.Parameter(torch.randn(4)))])
    with pytest.raises(ValueError, match="shape \\(2, 3, 4\\)"):
        Muon([nn.Parameter(torch.randn(2, 3, 4))])
    with pytest.raises(TypeError, match="iterable of parameters"):
        Muon(w)
    bad = [
        (dict(lr=-0.1), ValueError, "lr must be >= 0"),
        (dict(lr=float("nan")), ValueError, "lr must be a finite number"),
        (dict(momentum=1.0), ValueError, "momentum must be in \\[0, 1\\)"),
        (dict(nesterov="yes"), TypeError, "nesterov must be True or False"),
        (dict(weight_decay=-1.0), ValueError, "weight_decay must be >= 0"),
        (dict(ns_steps=0), ValueError, "ns_steps must be a positive int"),
        (dict(ns_steps=2.5), TypeError, "ns_steps must be a positive int"),
        (dict(adjust_lr_fn="spectral"), ValueError, "adjust_lr_fn must be one of"),
        (dict(ns_coefficients=(3.4, -4.7)), ValueError, "ns_coefficients must be three finite numbers"),
        (dict(eps=0.0), ValueError, "eps must be > 0"),
        (dict(ns_dtype=torch.int32), TypeError, "ns_dtype must be None"),
        (dict(ns_dtype="bfloat16"), TypeError, "ns_dtype must be None"),
    ]
    for options, error, message in bad:
        with pytest.raises(error, match=message):
            Muon([w], **options)
    with pytest.raises(ValueError, match="update must be a 2-D matrix"):
        newton_schulz(torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        newton_schulz(torch.ones(3, 3, dtype=torch.long))
    optimizer = make_muon(_gpt())
    with pytest.raises(ValueError, match="keys 'muon' and 'adamw'"):
        optimizer.load_state_dict(optimizer.muon.state_dict())
    with pytest.raises(TypeError, match="muon must be a tl.muon.Muon or a torch.optim.Muon"):
        MuonAdamW(torch.optim.AdamW([w]), torch.optim.AdamW([w]))
    with pytest.raises(ValueError, match="betas must be two numbers"):
        make_muon(_gpt(), betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        make_muon("gpt")  # type: ignore[arg-type]


def test_sparse_gradients_are_refused() -> None:
    w = nn.Parameter(torch.randn(5, 3))
    optimizer = Muon([w])
    w.grad = torch.randn(5, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        optimizer.step()


# ---------------------------------------------------------------------------------------------
# The trainer and the command line
# ---------------------------------------------------------------------------------------------


def _text() -> tuple[object, torch.Tensor, torch.Tensor]:
    from transformer_lab.data import TextTokenizer, split_text

    tokenizer = TextTokenizer.from_text(TEXT)
    return tokenizer, *split_text(tokenizer.encode(TEXT))


def test_train_gpt_with_muon_lowers_the_loss() -> None:
    tokenizer, train_data, val_data = _text()
    torch.manual_seed(0)
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=16, d_model=32, n_heads=2, n_layers=2))
    history = training.train_gpt(
        model, train_data, val_data, steps=60, batch_size=8, lr=3e-3, min_lr=3e-4, warmup=5, eval_every=30,
        optimizer="muon", muon_lr=0.02, progress=False,
    )  # fmt: skip
    assert history.val_loss[-1] < history.val_loss[0] - 0.3 and history.val_loss[0] < math.log(tokenizer.vocab_size)
    assert history.loss[-1] < history.loss[0] - 1.0


def test_train_gpt_with_muon_schedules_the_muon_group_by_the_same_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    original = MuonAdamW.step

    def recording_step(self: MuonAdamW, closure: object = None) -> object:
        seen.append([group["lr"] for group in self.param_groups])
        return original(self, closure)  # type: ignore[arg-type]

    monkeypatch.setattr(MuonAdamW, "step", recording_step)
    tokenizer, train_data, _ = _text()
    torch.manual_seed(0)
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=1))
    training.train_gpt(
        model, train_data, steps=4, batch_size=2, lr=1e-3, min_lr=1e-4, warmup=2, optimizer="muon", muon_lr=0.05,
        progress=False,
    )  # fmt: skip
    assert len(seen) == 4
    for muon_rate, *adamw_rates in seen:
        assert all(rate == adamw_rates[0] for rate in adamw_rates)
        assert muon_rate == pytest.approx(adamw_rates[0] * 50)
    assert [rates[1] for rates in seen] == [training.cosine_lr(i, 1e-3, 1e-4, 2, 4) for i in range(4)]


def test_train_gpt_refuses_unknown_optimizers_and_bad_muon_options() -> None:
    tokenizer, train_data, _ = _text()
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=1))
    for options, message in [
        (dict(optimizer="sgd"), "optimizer must be one of \\('adamw', 'muon'\\)"),
        (dict(optimizer="muon", muon_lr=0.0), "muon_lr must be > 0"),
        (dict(optimizer="muon", muon_weight_decay=-0.1), "muon_weight_decay must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            training.train_gpt(model, train_data, steps=1, batch_size=2, warmup=1, progress=False, **options)


def test_a_chapter_10_checkpoint_loads_and_trains_on_with_muon() -> None:
    model, tokenizer = training.load_gpt(ROOT / "transformer_lab" / "assets" / "gpt_shakespeare.pt")
    data = tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 4)
    before = model.layers[0].feed_forward.w1.weight.detach().clone()
    model.train()
    training.train_gpt(model, data, steps=2, batch_size=2, block=32, warmup=1, optimizer="muon", progress=False)
    assert not torch.equal(model.layers[0].feed_forward.w1.weight, before)


def test_gpt_train_command_with_muon_records_the_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformer_lab import cli

    text = tmp_path / "verse.txt"
    text.write_text("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 10, "utf-8")
    tiny = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16", "--batch-size", "4"]
    short = ["--steps", "4", "--warmup", "2", "--eval-every", "4", "--no-progress"]
    out = tmp_path / "muon.pt"
    assert cli.main(["gpt-train", "--text", str(text), *tiny, *short, "--optimizer", "muon", "--out", str(out)]) == 0
    capsys.readouterr()
    options = torch.load(out, weights_only=True)["options"]
    assert (options["optimizer"], options["muon_lr"], options["muon_weight_decay"]) == ("muon", 0.02, 0.0)
    training.load_gpt(out)
    for argument, message in [
        (["--muon-lr", "0"], "--muon-lr must be a number > 0"),
        (["--muon-weight-decay", "-1"], "--muon-weight-decay must be >= 0"),
    ]:
        with pytest.raises(SystemExit, match=message):
            cli.main(["gpt-train", "--text", str(text), *tiny, *short, *argument, "--out", str(out)])
    with pytest.raises(SystemExit):
        cli.main(["gpt-train", "--text", str(text), "--optimizer", "sgd", "--out", str(out)])
    assert "invalid choice: 'sgd'" in capsys.readouterr().err
