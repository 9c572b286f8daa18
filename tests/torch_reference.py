"""Weight copying between transformer_lab modules and PyTorch's reference modules (used by several tests).

One function per module kind maps a transformer_lab module to the state dict of its PyTorch counterpart.
`get` picks what is read from each parameter: the value (to copy weights) or `.grad` (to compare gradients
in PyTorch's layout), so the same mapping serves both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

import transformer_lab as tl

Getter = Callable[[nn.Parameter], Tensor]


def value(p: nn.Parameter) -> Tensor:
    return p.detach().clone()


def grad(p: nn.Parameter) -> Tensor:
    assert p.grad is not None, "parameter has no gradient"
    return p.grad


def mha_state(m: tl.MultiHeadAttention, get: Getter = value) -> dict[str, Tensor]:
    """nn.MultiheadAttention keys: W^Q, W^K, W^V stacked into in_proj_weight (3D, D), W^O is out_proj."""
    return {
        "in_proj_weight": torch.cat([get(m.w_q.weight), get(m.w_k.weight), get(m.w_v.weight)]),  # (3D, D)
        "in_proj_bias": torch.cat([get(m.w_q.bias), get(m.w_k.bias), get(m.w_v.bias)]),  # (3D,)
        "out_proj.weight": get(m.w_o.weight),
        "out_proj.bias": get(m.w_o.bias),
    }


def norm_state(m: tl.LayerNorm, get: Getter = value) -> dict[str, Tensor]:
    return {"weight": get(m.weight), "bias": get(m.bias)}


def ffn_state(m: tl.FeedForward, get: Getter = value) -> dict[str, Tensor]:
    """nn.TransformerEncoderLayer names the FFN's two Linear layers linear1 and linear2."""
    return {
        "linear1.weight": get(m.w1.weight),
        "linear1.bias": get(m.w1.bias),
        "linear2.weight": get(m.w2.weight),
        "linear2.bias": get(m.w2.bias),
    }


def _prefixed(prefix: str, state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{prefix}.{k}": v for k, v in state.items()}


def encoder_layer_state(m: tl.EncoderLayer, get: Getter = value) -> dict[str, Tensor]:
    return {
        **_prefixed("self_attn", mha_state(m.self_attn, get)),
        **ffn_state(m.feed_forward, get),
        **_prefixed("norm1", norm_state(m.norm1, get)),
        **_prefixed("norm2", norm_state(m.norm2, get)),
    }


def decoder_layer_state(m: tl.DecoderLayer, get: Getter = value) -> dict[str, Tensor]:
    return {
        **_prefixed("self_attn", mha_state(m.self_attn, get)),
        **_prefixed("multihead_attn", mha_state(m.cross_attn, get)),
        **ffn_state(m.feed_forward, get),
        **_prefixed("norm1", norm_state(m.norm1, get)),
        **_prefixed("norm2", norm_state(m.norm2, get)),
        **_prefixed("norm3", norm_state(m.norm3, get)),
    }


def stack_state(m: tl.Encoder | tl.Decoder, get: Getter = value) -> dict[str, Tensor]:
    """nn.TransformerEncoder / nn.TransformerDecoder: layers.i.* plus norm.* when there is a final norm."""
    layer_state = encoder_layer_state if isinstance(m, tl.Encoder) else decoder_layer_state
    state: dict[str, Tensor] = {}
    for i, layer in enumerate(m.layers):
        state.update(_prefixed(f"layers.{i}", layer_state(layer, get)))
    if isinstance(m.norm, tl.LayerNorm):
        state.update(_prefixed("norm", norm_state(m.norm, get)))
    return state


def copy_into(reference: nn.Module, state: dict[str, Tensor]) -> None:
    """Load `state` into the PyTorch module, every key required (strict)."""
    reference.load_state_dict(state, strict=True)


def reference_grads(reference: nn.Module) -> dict[str, Tensor]:
    return {name: grad(p) for name, p in reference.named_parameters()}


def assert_same_grads(ours: dict[str, Tensor], theirs: dict[str, Tensor], atol: float = 1e-10) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def torch_key_padding_mask(mask: Tensor) -> Tensor:
    """Our (B, 1, 1, S) True = real token -> PyTorch's (B, S) True = padding."""
    return tl.invert_mask(mask[:, 0, 0, :])
