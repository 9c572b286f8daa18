"""MultiHeadAttention against nn.MultiheadAttention, weights copied (chapter 03).

The explicit path (record_weights=True) is compared here; tests/test_fast_path.py compares the fused path.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_reference import assert_same_grads, copy_into, grad, mha_state, reference_grads, torch_key_padding_mask

import transformer_lab as tl

B, T, S, D, H = 2, 4, 5, 12, 3


def _pair(seed: int = 0) -> tuple[tl.MultiHeadAttention, nn.MultiheadAttention]:
    torch.manual_seed(seed)
    ours = tl.MultiHeadAttention(D, H).double()
    theirs = nn.MultiheadAttention(D, H, batch_first=True).double()
    copy_into(theirs, mha_state(ours))
    return ours, theirs


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _padding(lengths: list[int], size: int) -> torch.Tensor:
    """(B, 1, 1, size) True for the first lengths[b] positions."""
    return (torch.arange(size)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def _run_both(self_attention: bool, mask: torch.Tensor | None, torch_kwargs: dict[str, torch.Tensor]) -> None:
    ours, theirs = _pair()
    q = _x(B, T, D, seed=1).requires_grad_()
    kv = q if self_attention else _x(B, S, D, seed=2).requires_grad_()
    q2 = q.detach().clone().requires_grad_()
    kv2 = q2 if self_attention else kv.detach().clone().requires_grad_()
    out = ours(q, kv, kv, mask)
    ref, ref_weights = theirs(q2, kv2, kv2, average_attn_weights=False, **torch_kwargs)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.attention_weights, ref_weights, atol=1e-10, rtol=0)
    upstream = _x(*out.shape, seed=3)
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(q.grad, q2.grad, atol=1e-10, rtol=0)
    if not self_attention:
        torch.testing.assert_close(kv.grad, kv2.grad, atol=1e-10, rtol=0)
    assert_same_grads(mha_state(ours, grad), reference_grads(theirs))


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_no_mask(self_attention: bool) -> None:
    _run_both(self_attention, None, {})


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_padding_mask(self_attention: bool) -> None:
    size = T if self_attention else S
    mask = _padding([size, 2], size)  # (B, 1, 1, size)
    _run_both(self_attention, mask, {"key_padding_mask": torch_key_padding_mask(mask)})


def test_causal_mask_self_attention() -> None:
    mask = tl.causal_mask(T)
    _run_both(True, mask, {"attn_mask": tl.invert_mask(mask)})


def test_causal_and_padding_together() -> None:
    mask = tl.causal_mask(T) & _padding([T, 3], T)  # (B, 1, T, T)
    _run_both(
        True,
        mask,
        {
            "attn_mask": tl.invert_mask(tl.causal_mask(T)),
            "key_padding_mask": torch_key_padding_mask(_padding([T, 3], T)),
        },
    )


def test_per_head_mask_cross_attention() -> None:
    mask = torch.rand(B, H, T, S, generator=torch.Generator().manual_seed(4)) > 0.5
    mask[..., 1] = True  # every query sees at least one key
    # nn.MultiheadAttention takes a per-head mask as (B * H, T, S) with True = blocked.
    _run_both(False, mask, {"attn_mask": tl.invert_mask(mask).reshape(B * H, T, S)})


def test_fully_masked_rows_are_zero_where_pytorch_gives_nan() -> None:
    ours, theirs = _pair()
    q, kv = _x(B, T, D, seed=1), _x(B, S, D, seed=2)
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    mask[0, 0, 2] = False  # query 2 of example 0 may see no key
    mask[1, 0, :, 3:] = False
    out = ours(q, kv, kv, mask)
    ref, _ = theirs(q, kv, kv, attn_mask=tl.invert_mask(mask).expand(B, H, T, S).reshape(B * H, T, S))
    assert torch.isnan(ref[0, 2]).all()
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, 2] = False
    torch.testing.assert_close(out[real], ref[real], atol=1e-10, rtol=0)
    assert torch.equal(ours.attention_weights[0, :, 2], torch.zeros(H, S, dtype=torch.float64))
    # No key to mix: the heads are zero, so the row is W^O's bias.
    torch.testing.assert_close(out[0, 2], ours.w_o.bias, atol=1e-12, rtol=0)


def test_attention_weights_recorded_detached_and_cleared() -> None:
    ours, _ = _pair()
    x = _x(B, T, D, seed=1).requires_grad_()
    ours(x, x, x)
    weights = ours.attention_weights
    assert weights is not None and weights.shape == (B, H, T, T) and not weights.requires_grad
    ours.record_weights = False
    ours(x, x, x)
    assert ours.attention_weights is None
    assert tl.MultiHeadAttention(D, H, record_weights=False).record_weights is False


def test_four_separate_projections() -> None:
    m = tl.MultiHeadAttention(D, H)
    weights = [m.w_q.weight, m.w_k.weight, m.w_v.weight, m.w_o.weight]
    assert len({id(w) for w in weights}) == 4
    assert all(w.shape == (D, D) for w in weights)
    assert sum(p.numel() for p in m.parameters()) == 4 * (D * D + D)
    assert sum(p.numel() for p in tl.MultiHeadAttention(D, H, bias=False).parameters()) == 4 * D * D


def test_split_and_merge_heads_are_inverse_and_slice_features() -> None:
    m = tl.MultiHeadAttention(D, H)
    x = _x(B, T, D, seed=0)
    heads = m.split_heads(x)
    assert heads.shape == (B, H, T, D // H)
    assert torch.equal(heads[:, 1], x[..., D // H : 2 * D // H])  # head 1 owns features d_k..2 d_k
    assert torch.equal(m.merge_heads(heads), x)


def test_record_attention_switches_every_module() -> None:
    config = tl.TransformerConfig(11, 11, d_model=8, n_heads=2, d_ff=16, n_layers=2, max_len=16)
    model = tl.Transformer(config).eval()
    modules = [m for m in model.modules() if isinstance(m, tl.MultiHeadAttention)]
    assert len(modules) == 2 + 2 * 2  # encoder self, decoder self and cross, per layer
    src, tgt = torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 3))
    model(src, tgt)
    assert all(m.attention_weights is not None for m in modules)
    assert tl.record_attention(model, False) is model
    assert all(m.record_weights is False and m.attention_weights is None for m in modules)
    model(src, tgt)
    assert all(m.attention_weights is None for m in modules)
    tl.record_attention(model, True)
    model(src, tgt)
    assert all(m.record_weights and m.attention_weights is not None for m in modules)
    shapes = {tuple(m.attention_weights.shape) for m in modules}
    assert shapes == {(2, 2, 5, 5), (2, 2, 3, 3), (2, 2, 3, 5)}
