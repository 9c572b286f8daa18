"""Masks and conversions between mask conventions (chapter 02)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import transformer_lab as tl


def test_causal_mask_values() -> None:
    mask = tl.causal_mask(4)
    assert mask.shape == (4, 4) and mask.dtype == torch.bool
    for i in range(4):
        for j in range(4):
            assert bool(mask[i, j]) == (j <= i), (i, j)


def test_causal_mask_of_size_one() -> None:
    assert tl.causal_mask(1).tolist() == [[True]]


def test_padding_mask_shape_and_values() -> None:
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9]])
    mask = tl.padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, True]]


def test_padding_mask_with_another_pad_id() -> None:
    tokens = torch.tensor([[1, 2, 3]])
    assert tl.padding_mask(tokens, pad_id=3)[0, 0, 0].tolist() == [True, True, False]


def test_target_mask_combines_causal_and_padding() -> None:
    tokens = torch.tensor([[4, 5, 6, 0], [4, 0, 0, 0]])
    mask = tl.target_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 4, 4) and mask.dtype == torch.bool
    for b in range(2):
        for i in range(4):
            for j in range(4):
                expected = j <= i and int(tokens[b, j]) != 0
                assert bool(mask[b, 0, i, j]) == expected, (b, i, j)


def test_invert_mask_flips_and_round_trips() -> None:
    mask = tl.causal_mask(3)
    inverted = tl.invert_mask(mask)
    assert torch.equal(inverted, torch.ones(3, 3, dtype=torch.bool).triu(1))
    assert torch.equal(tl.invert_mask(inverted), mask)


def test_additive_mask_values_and_round_trip() -> None:
    mask = tl.padding_mask(torch.tensor([[1, 2, 0]]), 0)
    additive = tl.to_additive_mask(mask, dtype=torch.float64)
    assert additive.dtype == torch.float64 and additive.shape == mask.shape
    assert additive[0, 0, 0].tolist() == [0.0, 0.0, float("-inf")]
    assert torch.equal(tl.from_additive_mask(additive), mask)
    # A large negative number (some code uses -1e9) is read as "blocked" too.
    assert torch.equal(tl.from_additive_mask(torch.tensor([0.0, -1e9])), torch.tensor([True, False]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_additive_mask_reproduces_the_bool_masks_attention(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g).to(dtype) for _ in range(3))
    mask = tl.causal_mask(4) & tl.padding_mask(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), 0)  # (2, 1, 4, 4)
    ours, _ = tl.scaled_dot_product_attention(q, k, v, mask)
    via_additive = F.scaled_dot_product_attention(q, k, v, attn_mask=tl.to_additive_mask(mask, dtype))
    # bfloat16 keeps 8 bits of mantissa: the two computations round differently.
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(via_additive, ours, atol=tol, rtol=tol)


def test_inverted_mask_is_what_nn_multihead_attention_wants() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    _, weights = mha(x, x, x, attn_mask=tl.invert_mask(tl.causal_mask(3)))
    assert torch.equal(weights[0] > 0, tl.causal_mask(3))


def test_masks_follow_the_device_and_do_not_need_grad() -> None:
    tokens = torch.tensor([[1, 0]])
    for mask in (tl.causal_mask(2, device="cpu"), tl.padding_mask(tokens, 0), tl.target_mask(tokens, 0)):
        assert mask.device.type == "cpu" and not mask.requires_grad
