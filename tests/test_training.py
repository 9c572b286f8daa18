"""Tests of transformer_lab.training: label smoothing against PyTorch, the Noam schedule, the loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lab as tl
from transformer_lab import data, training

PAD = 0


def _logits_and_target(seed: int = 0, v: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, v, generator=g, dtype=torch.float64)
    target = torch.randint(1, v, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


def test_smoothed_targets_formula() -> None:
    v, eps = 6, 0.2
    q = training.smoothed_targets(torch.tensor([2, PAD]), v, PAD, eps)
    expected = torch.tensor([[0.0, eps / 4, 1 - eps, eps / 4, eps / 4, eps / 4], [0.0] * 6])
    torch.testing.assert_close(q, expected)
    assert q[0].sum().item() == pytest.approx(1.0)


def test_label_smoothing_zero_equals_cross_entropy() -> None:
    logits, target = _logits_and_target()
    ours = training.label_smoothed_loss(logits, target, PAD, 0.0)
    theirs = F.cross_entropy(logits.reshape(-1, 7), target.reshape(-1), ignore_index=PAD)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=1e-6)


def test_label_smoothing_matches_its_formula_written_out() -> None:
    logits, target = _logits_and_target(1)
    eps, v = 0.1, logits.shape[-1]
    log_p = logits.log_softmax(-1)
    total, count = 0.0, 0
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            y = int(target[b, t])
            if y == PAD:
                continue
            others = [c for c in range(v) if c not in (y, PAD)]
            total += -(1 - eps) * log_p[b, t, y].item() - sum(eps / (v - 2) * log_p[b, t, c].item() for c in others)
            count += 1
    ours = training.label_smoothed_loss(logits, target, PAD, eps)
    assert ours.item() == pytest.approx(total / count, rel=1e-6)


def test_label_smoothing_relation_to_pytorch_exactly() -> None:
    """PyTorch: q = (1-eps) one-hot + eps/V on *every* class (PAD and the true one included).

    Per position, with S = sum_c -log p_c:
        torch = (1-eps) nll + eps/V S;   ours = (1-eps) nll + eps/(V-2) (S + log p_pad + log p_y).
    """
    logits, target = _logits_and_target(2)
    eps, v = 0.1, logits.shape[-1]
    flat_logits, flat_target = logits.reshape(-1, v), target.reshape(-1)
    real = flat_target != PAD
    torch_per = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, label_smoothing=eps, reduction="none")
    nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="none")
    log_p = flat_logits.log_softmax(-1)
    s = (torch_per - (1 - eps) * nll) * v / eps  # recover S from PyTorch's loss
    torch.testing.assert_close(s[real], -log_p[real].sum(-1))
    log_p_y = log_p.gather(1, flat_target[:, None].clamp(min=0))[:, 0]
    ours_per = (1 - eps) * nll + eps / (v - 2) * (s + log_p[:, PAD] + log_p_y)
    ours = training.label_smoothed_loss(logits, target, PAD, eps)
    torch.testing.assert_close(ours.double(), ours_per[real].mean(), rtol=1e-6, atol=1e-7)
    # and the two losses really differ
    assert not math.isclose(ours.item(), torch_per[real].mean().item(), rel_tol=1e-3)


def test_label_smoothing_ignores_pad_targets_and_bad_input() -> None:
    logits, target = _logits_and_target(3)
    changed = logits.clone()
    changed[target == PAD] = 100.0  # whatever the model says at padded positions does not count
    torch.testing.assert_close(
        training.label_smoothed_loss(logits, target, PAD), training.label_smoothed_loss(changed, target, PAD)
    )
    assert training.label_smoothed_loss(logits, torch.zeros_like(target), PAD).item() == 0.0
    with pytest.raises(ValueError, match="must agree"):
        training.label_smoothed_loss(logits, target[:, :2], PAD)
    with pytest.raises(ValueError, match="smoothing"):
        training.label_smoothed_loss(logits, target, PAD, 1.5)


def test_noam_schedule() -> None:
    d, w = 512, 4000
    assert training.noam_lr(1, d, w) == pytest.approx(d**-0.5 * w**-1.5)
    assert training.noam_lr(w, d, w) == pytest.approx((d * w) ** -0.5)  # the peak
    assert training.noam_lr(4 * w, d, w) == pytest.approx(0.5 * (d * w) ** -0.5)
    assert training.noam_lr(100, d, w, factor=2.0) == pytest.approx(2 * training.noam_lr(100, d, w))
    steps = torch.arange(1, 3 * w)
    lrs = training.noam_lr(steps, d, w)
    assert int(lrs.argmax()) + 1 == w
    assert lrs[:w].diff().gt(0).all() and lrs[w:].diff().lt(0).all()
    with pytest.raises(ValueError, match="step"):
        training.noam_lr(0, d, w)


def test_optimizer_follows_the_schedule() -> None:
    model = torch.nn.Linear(2, 2)
    opt, sched = training.make_optimizer(model, d_model=64, warmup=10, factor=2.0)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    for step in range(1, 15):
        assert opt.param_groups[0]["lr"] == pytest.approx(training.noam_lr(step, 64, 10, 2.0))
        opt.step()
        sched.step()


def _tiny(seed: int = 0) -> tuple[tl.Transformer, data.CharTokenizer]:
    tok = data.CharTokenizer()
    config = tl.TransformerConfig(
        tok.vocab_size,
        tok.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=1,
        dropout=0.0,
        max_len=32,
        tie_embeddings=True,
    )
    return training.build_model(config, seed), tok


def test_train_is_deterministic_and_learns_copy() -> None:
    task = data.CopyTask(max_len=4, alphabet="abcd")
    runs = []
    for _ in range(2):
        model, tok = _tiny()
        history = training.train(
            model,
            task,
            tok,
            steps=60,
            batch_size=16,
            warmup=20,
            lr_factor=2.0,
            eval_every=30,
            eval_examples=20,
            progress=False,
        )
        runs.append((history, model))
    (h1, m1), (h2, m2) = runs
    assert h1.loss == h2.loss and h1.val_exact_match == h2.val_exact_match
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2)
    assert len(h1.loss) == len(h1.lr) == 60 and h1.eval_step == [30, 60]
    assert h1.loss[-1] < 0.6 * h1.loss[0]
    assert h1.lr[0] == pytest.approx(training.noam_lr(1, 16, 20, 2.0))
    # attention recording restored and eval mode at the end
    assert all(m.record_weights for m in m1.modules() if hasattr(m, "record_weights"))
    assert not m1.training


def test_train_bad_arguments() -> None:
    model, tok = _tiny()
    with pytest.raises(TypeError, match="task"):
        training.train(model, "dates", tok, steps=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        training.train(model, data.CopyTask(), tok, steps=0)


def test_translate_and_exact_match() -> None:
    model, tok = _tiny()
    examples = [data.Example("ab", "ab", "copy"), data.Example("abc", "abc", "copy")]
    preds = training.translate(model, [e.source for e in examples], tok, max_len=5)
    assert len(preds) == 2 and all(isinstance(p, str) and len(p) <= 5 for p in preds)
    expected = sum(p == e.target for p, e in zip(preds, examples, strict=True)) / 2
    assert training.exact_match(model, examples, tok, max_len=5) == expected
    counts = training.exact_match_by_kind(model, examples, tok, max_len=5)
    assert counts["all"][1] == 2 and counts["copy"][1] == 2
    # beam search of width 1 gives the same answers as greedy
    sources = ["abc", "dcba", "a", "bbbb"]
    assert training.translate(model, sources, tok, max_len=5, beam_size=1) == training.translate(
        model, sources, tok, max_len=5
    )
    assert len(training.translate(model, sources, tok, max_len=5, beam_size=3)) == 4
