"""DecoderLayer and Decoder against PyTorch's decoder modules, weights copied (chapter 07).

The KV cache is tested in tests/test_kv_cache.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch_reference import (
    assert_same_grads,
    copy_into,
    decoder_layer_state,
    grad,
    reference_grads,
    stack_state,
    torch_key_padding_mask,
)

import transformer_lab as tl

B, T, S, D, H, FF, N = 3, 4, 5, 8, 2, 16, 2
TGT_LENGTHS, SRC_LENGTHS = [4, 2, 3], [5, 3, 1]


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _padding(lengths: list[int], size: int) -> torch.Tensor:
    return (torch.arange(size)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]  # (B, 1, 1, size)


def _reference_layer(norm_first: bool) -> nn.TransformerDecoderLayer:
    return nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).double()


def _reference_stack(norm_first: bool) -> nn.TransformerDecoder:
    if norm_first:  # nn.Transformer's decoder: Pre-Norm layers and a final LayerNorm
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            full = nn.Transformer(D, H, 1, N, FF, dropout=0.0, batch_first=True, norm_first=True).double()
        return full.decoder
    return nn.TransformerDecoder(_reference_layer(False), N, norm=None).double()


def _compare(ours: nn.Module, theirs: nn.Module, state_fn, masked: bool) -> None:  # noqa: ANN001
    copy_into(theirs, state_fn(ours))
    ours.train(), theirs.train()  # dropout is 0
    causal = tl.causal_mask(T)
    if masked:
        tgt_pad, src_pad = _padding(TGT_LENGTHS, T), _padding(SRC_LENGTHS, S)
        tgt_mask, memory_mask = causal & tgt_pad, src_pad  # (B, 1, T, T), (B, 1, 1, S)
        kwargs = {
            "tgt_key_padding_mask": torch_key_padding_mask(tgt_pad),
            "memory_key_padding_mask": torch_key_padding_mask(src_pad),
        }
    else:
        tgt_mask, memory_mask, kwargs = causal, None, {}
    x, memory = _x(B, T, D, seed=1).requires_grad_(), _x(B, S, D, seed=2).requires_grad_()
    x2, memory2 = (t.detach().clone().requires_grad_() for t in (x, memory))
    out = ours(x, memory, tgt_mask, memory_mask)
    ref = theirs(x2, memory2, tgt_mask=tl.invert_mask(causal), **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    upstream = _x(B, T, D, seed=3)
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(memory.grad, memory2.grad, atol=1e-10, rtol=0)
    assert_same_grads(state_fn(ours, grad), reference_grads(theirs))


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["prenorm", "postnorm"])
def test_layer_matches_pytorch(norm_first: bool, masked: bool) -> None:
    torch.manual_seed(0)
    ours = tl.DecoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first).double()
    _compare(ours, _reference_layer(norm_first), decoder_layer_state, masked)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["prenorm", "postnorm"])
def test_stack_matches_pytorch(norm_first: bool, masked: bool) -> None:
    torch.manual_seed(0)
    ours = tl.Decoder(D, H, FF, N, dropout=0.0, norm_first=norm_first).double()
    _compare(ours, _reference_stack(norm_first), stack_state, masked)


def test_structure() -> None:
    pre = tl.Decoder(D, H, FF, 3, norm_first=True)
    post = tl.Decoder(D, H, FF, 3, norm_first=False)
    assert len(pre.layers) == 3 and isinstance(pre.norm, tl.LayerNorm) and isinstance(post.norm, nn.Identity)
    layer = pre.layers[0]
    assert isinstance(layer.self_attn, tl.MultiHeadAttention) and isinstance(layer.cross_attn, tl.MultiHeadAttention)
    assert layer.self_attn is not layer.cross_attn
    assert all(isinstance(n, tl.LayerNorm) for n in (layer.norm1, layer.norm2, layer.norm3))


def test_causal_mask_hides_the_future_and_cross_attention_sees_the_memory() -> None:
    torch.manual_seed(0)
    dec = tl.Decoder(D, H, FF, N, dropout=0.0).double().eval()
    x, memory = _x(1, T, D, seed=1), _x(1, S, D, seed=2)
    out = dec(x, memory, tl.causal_mask(T))
    later = x.clone()
    later[:, 2:] += _x(1, T - 2, D, seed=9)  # (a constant shift would vanish in the LayerNorms)
    torch.testing.assert_close(dec(later, memory, tl.causal_mask(T))[:, :2], out[:, :2], atol=1e-10, rtol=0)
    assert not torch.allclose(dec(later, memory, tl.causal_mask(T))[:, 2:], out[:, 2:])
    # Without the mask the earlier positions would change.
    assert not torch.allclose(dec(later, memory)[:, :2], dec(x, memory)[:, :2])
    # Every position depends on the memory.
    assert not torch.allclose(dec(x, memory + _x(1, S, D, seed=8), tl.causal_mask(T))[:, 0], out[:, 0])
    # The cross-attention weights of the last layer have the (B, H, T, S) shape.
    assert dec.layers[-1].cross_attn.attention_weights.shape == (1, H, T, S)
    torch.testing.assert_close(
        dec.layers[0].self_attn.attention_weights[0, 0].triu(1), torch.zeros(T, T, dtype=torch.float64)
    )
