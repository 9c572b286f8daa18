"""scaled_dot_product_attention against F.scaled_dot_product_attention (chapter 01)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lab as tl

B, H, T, S, DK, DV = 2, 3, 4, 5, 6, 7


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, DK, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(B, H, S, DK, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(B, H, S, DV, dtype=torch.float64, generator=g, requires_grad=True)
    return q, k, v


def _random_mask(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    """A random bool mask of `shape` whose broadcast has at least one visible key in every row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) > 0.4
    mask[..., 0] = True
    return mask


MASK_SHAPES = [
    None,
    (1, S),  # one row for everything
    (T, S),  # the same (T, S) pattern for every batch and head
    (B, 1, 1, S),  # a padding mask
    (B, 1, T, S),  # per example, shared by heads
    (1, H, T, S),  # per head, shared by examples
    (B, H, T, S),  # full
]


@pytest.mark.parametrize("mask_shape", MASK_SHAPES, ids=str)
def test_matches_pytorch_outputs_and_gradients(mask_shape: tuple[int, ...] | None) -> None:
    mask = None if mask_shape is None else _random_mask(mask_shape)
    q, k, v = _inputs()
    out, weights = tl.scaled_dot_product_attention(q, k, v, mask)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask)
    assert out.shape == (B, H, T, DV) and weights.shape == (B, H, T, S)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    upstream = torch.randn(B, H, T, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    for ours, theirs in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-10, rtol=0)


def test_weights_are_the_scaled_softmax() -> None:
    q, k, v = _inputs()
    out, weights = tl.scaled_dot_product_attention(q, k, v)
    # Written differently from the module: einsum and an explicit exp / sum.
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(DK)
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected = e / e.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)


def test_weights_are_detached_from_nothing_but_returned_before_dropout() -> None:
    q, k, v = _inputs()
    torch.manual_seed(0)
    dropout = torch.nn.Dropout(0.5)
    out, weights = tl.scaled_dot_product_attention(q, k, v, dropout=dropout)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))
    # The output uses the dropped weights: recompute with the same random stream.
    torch.manual_seed(0)
    dropped = dropout(weights)
    torch.testing.assert_close(out, dropped @ v, atol=1e-12, rtol=0)
    assert not torch.allclose(out, weights @ v)


def test_dropout_in_eval_mode_changes_nothing() -> None:
    q, k, v = _inputs()
    dropout = torch.nn.Dropout(0.5).eval()
    out, _ = tl.scaled_dot_product_attention(q, k, v, dropout=dropout)
    torch.testing.assert_close(out, tl.scaled_dot_product_attention(q, k, v)[0], atol=0, rtol=0)


def test_unbatched_2d_inputs() -> None:
    q, k, v = (t[0, 0] for t in _inputs())
    out, weights = tl.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-10, rtol=0)
    assert weights.shape == (T, S)


def test_additive_mask_gives_the_same_attention_as_the_bool_mask() -> None:
    mask = _random_mask((B, 1, T, S))
    q, k, v = _inputs()
    additive = tl.to_additive_mask(mask, dtype=torch.float64)
    ours, _ = tl.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=additive), ours, atol=1e-10, rtol=0)
    # And by hand: add the float mask to the scores (note 001's way).
    scores = q @ k.transpose(-2, -1) / math.sqrt(DK) + additive
    torch.testing.assert_close(torch.softmax(scores, -1) @ v, ours, atol=1e-10, rtol=0)
