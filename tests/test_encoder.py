"""EncoderLayer and Encoder against PyTorch's encoder modules, weights copied (chapter 06)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch_reference import (
    assert_same_grads,
    copy_into,
    encoder_layer_state,
    grad,
    reference_grads,
    stack_state,
    torch_key_padding_mask,
)

import transformer_lab as tl

B, S, D, H, FF, N = 3, 5, 8, 2, 16, 2
LENGTHS = [5, 3, 1]


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, S, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _padding() -> torch.Tensor:
    return (torch.arange(S)[None, :] < torch.tensor(LENGTHS)[:, None])[:, None, None, :]  # (B, 1, 1, S)


def _reference_layer(norm_first: bool) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).double()


def _reference_stack(norm_first: bool) -> nn.TransformerEncoder:
    if norm_first:  # nn.Transformer's encoder: Pre-Norm layers and a final LayerNorm
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first was True"
            warnings.simplefilter("ignore", UserWarning)
            full = nn.Transformer(D, H, N, 1, FF, dropout=0.0, batch_first=True, norm_first=True).double()
        return full.encoder
    return nn.TransformerEncoder(_reference_layer(False), N, norm=None, enable_nested_tensor=False).double()


def _compare(ours: nn.Module, theirs: nn.Module, state_fn, masked: bool) -> None:  # noqa: ANN001
    copy_into(theirs, state_fn(ours))
    ours.train(), theirs.train()  # dropout is 0; train mode keeps PyTorch off its fast path
    mask = _padding() if masked else None
    kwargs = {"src_key_padding_mask": torch_key_padding_mask(mask)} if masked else {}
    x = _x().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    out, ref = ours(x, mask), theirs(x2, **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    upstream = _x(seed=2)
    (out * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    assert_same_grads(state_fn(ours, grad), reference_grads(theirs))


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["prenorm", "postnorm"])
def test_layer_matches_pytorch(norm_first: bool, masked: bool) -> None:
    torch.manual_seed(0)
    ours = tl.EncoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first).double()
    _compare(ours, _reference_layer(norm_first), encoder_layer_state, masked)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["prenorm", "postnorm"])
def test_stack_matches_pytorch(norm_first: bool, masked: bool) -> None:
    torch.manual_seed(0)
    ours = tl.Encoder(D, H, FF, N, dropout=0.0, norm_first=norm_first).double()
    _compare(ours, _reference_stack(norm_first), stack_state, masked)


@pytest.mark.parametrize("norm_first", [True, False], ids=["prenorm", "postnorm"])
def test_eval_mode_real_positions_match_pytorch(norm_first: bool) -> None:
    # In eval mode PyTorch may take its fast path, which writes zeros at padded positions.
    torch.manual_seed(0)
    ours = tl.Encoder(D, H, FF, N, dropout=0.1, norm_first=norm_first).double().eval()
    theirs = _reference_stack(norm_first).eval()
    copy_into(theirs, stack_state(ours))
    mask = _padding()
    with torch.no_grad():
        out = ours(_x(), mask)
        ref = theirs(_x(), src_key_padding_mask=torch_key_padding_mask(mask))
    real = mask[:, 0, 0]  # (B, S)
    torch.testing.assert_close(out[real], ref[real], atol=1e-10, rtol=0)


def test_structure() -> None:
    pre = tl.Encoder(D, H, FF, 3, norm_first=True)
    post = tl.Encoder(D, H, FF, 3, norm_first=False)
    assert len(pre.layers) == 3 and isinstance(pre.layers, nn.ModuleList)
    assert isinstance(pre.norm, tl.LayerNorm) and isinstance(post.norm, nn.Identity)
    layer = pre.layers[0]
    assert isinstance(layer.self_attn, tl.MultiHeadAttention) and isinstance(layer.feed_forward, tl.FeedForward)
    assert isinstance(layer.norm1, tl.LayerNorm) and isinstance(layer.norm2, tl.LayerNorm)
    # The layers are independent copies, not one layer repeated.
    assert pre.layers[0].self_attn.w_q.weight is not pre.layers[1].self_attn.w_q.weight


def test_padded_positions_do_not_change_real_outputs() -> None:
    torch.manual_seed(0)
    enc = tl.Encoder(D, H, FF, N, dropout=0.0).double().eval()
    x, mask = _x(), _padding()
    other = x.clone()
    other[~mask[:, 0, 0]] = 123.0  # different content at padded positions
    real = mask[:, 0, 0]
    torch.testing.assert_close(enc(x, mask)[real], enc(other, mask)[real], atol=1e-10, rtol=0)
