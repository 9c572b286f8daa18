"""Tests of chapter 05's diagnostics: per-layer gradient norms, the deep stack, and the Post/Pre-Norm run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab import diagnostics as dg


def test_gradient_norms_equal_the_norm_of_all_gradients() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(3, 3), nn.Linear(3, 2), nn.Linear(2, 2)]
    x = torch.randn(4, 3)
    for layer in layers[:2]:
        x = layer(x)
    x.pow(2).sum().backward()  # the third layer gets no gradient
    norms = dg.gradient_norms(layers)
    expected = torch.cat([layers[0].weight.grad.flatten(), layers[0].bias.grad]).norm().item()
    assert math.isclose(norms[0], expected, rel_tol=1e-6)
    assert norms[2] == 0.0


def test_gradient_norms_reject_a_single_module() -> None:
    with pytest.raises(TypeError, match="sequence of nn.Module"):
        dg.gradient_norms(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"modules\[1\]"):
        dg.gradient_norms([nn.Linear(2, 2), "layer"])


def test_feed_forward_stack_computes_residual_or_plain_blocks() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    for residual in (True, False):
        stack = dg.FeedForwardStack(8, 16, 3, residual).double()
        h = x
        for norm, ffn in zip(stack.norms, stack.layers, strict=True):
            update = ffn.w2(F.relu(ffn.w1(F.layer_norm(h, (8,), norm.weight, norm.bias, 1e-5))))
            h = h + update if residual else update
        torch.testing.assert_close(stack(x), h, rtol=0, atol=1e-12)


def test_residual_keeps_gradients_alive_through_a_deep_stack() -> None:
    with_res = dg.deep_stack_gradient_norms(16, residual=True)
    without = dg.deep_stack_gradient_norms(16, residual=False)
    assert len(with_res) == len(without) == 16
    # the first block's gradient, relative to the last one's: the residual path keeps it of the same order
    assert with_res[0] / with_res[-1] > 0.5
    assert without[0] / without[-1] < with_res[0] / with_res[-1]
    assert dg.deep_stack_gradient_norms(16, residual=True) == with_res  # deterministic


def test_reverse_task_targets_are_the_reversed_inputs() -> None:
    tokens, targets = dg.reverse_task_batch(3, 5, 7, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 5) and tokens.dtype == torch.int64
    assert torch.equal(targets[:, 0], tokens[:, -1]) and torch.equal(targets.flip(1), tokens)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 7


def test_train_norm_placement_same_start_and_deterministic() -> None:
    kw = dict(steps=3, n_layers=2, d_model=8, n_heads=2, d_ff=16, length=4, batch_size=4, vocab_size=5)
    post = dg.train_norm_placement(False, 1e-3, **kw)
    pre = dg.train_norm_placement(True, 1e-3, **kw)
    assert len(post["loss"]) == 3 and len(post["grad_norms"]) == 3 and len(post["grad_norms"][0]) == 2
    assert dg.train_norm_placement(False, 1e-3, **kw) == post
    assert post["loss"][0] != pre["loss"][0]  # same weights, different placement of the norms
    assert 0.0 <= post["accuracy"][0] <= 1.0


def test_train_norm_placement_models_share_initial_weights() -> None:
    torch.manual_seed(0)
    a = dg.ReverseTaskModel(5, 8, 2, 16, 2, norm_first=False, max_len=4)
    torch.manual_seed(0)
    b = dg.ReverseTaskModel(5, 8, 2, 16, 2, norm_first=True, max_len=4)
    pre = dict(b.named_parameters())
    for name, p in a.named_parameters():  # Pre-Norm has two more: the final LayerNorm's
        assert torch.equal(p, pre[name]), name
    assert set(pre) - set(dict(a.named_parameters())) == {"encoder.norm.weight", "encoder.norm.bias"}
    assert isinstance(b.encoder.norm, tl.LayerNorm) and isinstance(a.encoder.norm, nn.Identity)


def test_warmup_changes_the_first_step() -> None:
    kw = dict(steps=2, n_layers=1, d_model=8, n_heads=2, d_ff=16, length=4, batch_size=4, vocab_size=5)
    plain = dg.train_norm_placement(True, 1e-2, **kw)
    warm = dg.train_norm_placement(True, 1e-2, warmup_steps=10, **kw)
    assert plain["loss"][0] == warm["loss"][0] and plain["loss"][1] != warm["loss"][1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"lr": 0.0}, "lr"), ({"lr": 1e-3, "steps": 0}, "steps"), ({"lr": 1e-3, "warmup_steps": -1}, "warmup")],
)
def test_train_norm_placement_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dg.train_norm_placement(True, **kwargs)


def test_compare_norm_placement_runs_every_arm_for_every_seed() -> None:
    kw = dict(steps=2, n_layers=1, d_model=8, n_heads=2, d_ff=16, length=4, batch_size=4, vocab_size=5)
    arms = {
        "post": {"norm_first": False, "lr": 1e-2},
        "post, warm": {"norm_first": False, "lr": 1e-2, "warmup_steps": 5},
    }
    runs = dg.compare_norm_placement(arms, seeds=(0, 3), **kw)
    assert list(runs) == ["post", "post, warm"] and all(len(r) == 2 for r in runs.values())
    # each run is train_norm_placement's, with its seed
    assert runs["post"][1] == dg.train_norm_placement(False, 1e-2, seed=3, **kw)
    assert runs["post, warm"][0] == dg.train_norm_placement(False, 1e-2, warmup_steps=5, seed=0, **kw)
    # one seed: the arms start from the same weights and data (same first loss); seeds differ
    assert runs["post"][0]["loss"][0] == runs["post, warm"][0]["loss"][0] != runs["post"][1]["loss"][0]


@pytest.mark.parametrize(
    ("arms", "seeds", "setting", "error", "match"),
    [
        ({}, (0,), {}, TypeError, "arms"),
        ({"a": {"norm_first": True}}, (0,), {}, ValueError, "norm_first and lr"),
        ({"a": {"norm_first": True, "lr": 1e-3}}, (), {}, TypeError, "seeds"),
        ({"a": {"norm_first": True, "lr": 1e-3}}, (0.5,), {}, TypeError, "seeds must be ints"),
        ({"a": {"norm_first": True, "lr": 1e-3}}, (0,), {"seed": 1}, ValueError, "seeds=\\(...\\)"),
        ({"a": {"norm_first": True, "lr": 1e-3, "steps": 2}}, (0,), {"steps": 3}, ValueError, "steps"),
    ],
)
def test_compare_norm_placement_rejects_bad_arguments(arms, seeds, setting, error, match) -> None:
    with pytest.raises(error, match=match):
        dg.compare_norm_placement(arms, seeds, **setting)


def test_reverse_task_model_embeds_tokens_at_the_scale_of_the_positions() -> None:
    torch.manual_seed(0)
    model = dg.ReverseTaskModel(50, 64, 2, 16, 1, norm_first=True, max_len=8)
    embedded = model.embed(torch.arange(50).unsqueeze(0))  # (1, 50, 64), times sqrt(d_model)
    assert 0.8 < float(embedded.detach().pow(2).mean()) < 1.2  # unit variance, like the positional encoding's entries
