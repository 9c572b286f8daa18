"""The fast attention path (record_weights=False, F.scaled_dot_product_attention) equals the
explicit teaching path (record_weights=True): outputs and gradients, float64, 1e-10 (issue 8)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import transformer_lab as tl

TOL = dict(rtol=1e-10, atol=1e-10)
B, T, S, D, H, FF = 3, 5, 6, 16, 4, 32


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run_both(
    module: nn.Module, make_inputs: Callable[[], tuple[Tensor, ...]], call: Callable[..., Tensor]
) -> tuple[tuple, tuple]:
    """Run `call(copy, *inputs)` on two copies of `module` (explicit, fast); return for each
    (output, input gradients, parameter gradients) after backward of a fixed random upstream gradient."""
    results = []
    upstream = None
    for explicit in (True, False):
        m = tl.record_attention(copy.deepcopy(module), explicit)
        inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in make_inputs()]
        out = call(m, *inputs)
        if upstream is None:
            upstream = torch.randn_like(out)
        (out * upstream).sum().backward()
        input_grads = tuple(x.grad for x in inputs if x.is_floating_point())
        param_grads = {name: p.grad for name, p in m.named_parameters()}
        results.append((out, input_grads, param_grads, m))
    return results[0], results[1]


def assert_same(explicit: tuple, fast: tuple) -> None:
    out_e, in_e, par_e, _ = explicit
    out_f, in_f, par_f, _ = fast
    assert torch.isfinite(out_e).all()
    torch.testing.assert_close(out_f, out_e, **TOL)
    assert len(in_e) == len(in_f)
    for ge, gf in zip(in_e, in_f, strict=True):
        torch.testing.assert_close(gf, ge, **TOL)
    assert par_e.keys() == par_f.keys()
    for name in par_e:
        assert par_e[name] is not None, name
        torch.testing.assert_close(par_f[name], par_e[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def attention_modules(m: nn.Module) -> list[tl.MultiHeadAttention]:
    return [x for x in m.modules() if isinstance(x, tl.MultiHeadAttention)]


def assert_weights_recorded(explicit: tuple, fast: tuple) -> None:
    for mha in attention_modules(explicit[3]):
        assert mha.record_weights and mha.attention_weights is not None
    for mha in attention_modules(fast[3]):
        assert not mha.record_weights and mha.attention_weights is None


def padding(lengths: list[int], size: int) -> Tensor:
    """(B, 1, 1, size) True = real position, rows of the given lengths (0 = a fully masked row)."""
    return (torch.arange(size)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def random_mask(shape: tuple[int, ...], seed: int) -> Tensor:
    """A random bool mask in which the first query row of every (b, h) sees no key at all."""
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5
    mask[..., 0, :] = False
    return mask


SELF_MASKS = {
    "none": None,
    "padding": padding([5, 3, 1], T),
    "causal": tl.causal_mask(T),
    "combined": padding([5, 3, 2], T) & tl.causal_mask(T),
    "fully_masked_batch_row": padding([5, 0, 2], T),
    "fully_masked_query_rows": random_mask((B, H, T, T), 1),  # some (b, h, t) rows see nothing
}
CROSS_MASKS = {
    "none": None,
    "padding": padding([6, 4, 1], S),
    "fully_masked_batch_row": padding([6, 0, 3], S),
    "per_query": random_mask((B, 1, T, S), 2),
}


def test_random_masks_have_fully_masked_and_partly_masked_rows() -> None:
    for mask in (SELF_MASKS["fully_masked_query_rows"], CROSS_MASKS["per_query"]):
        seen = mask.sum(-1)
        assert (seen == 0).any() and ((seen > 0) & (seen < mask.shape[-1])).any()


@pytest.mark.parametrize("mask_name", SELF_MASKS)
def test_multihead_self_attention(mask_name: str) -> None:
    mha = tl.MultiHeadAttention(D, H, dropout=0.0).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = SELF_MASKS[mask_name]
    explicit, fast = run_both(mha, lambda: (x,), lambda m, h: m(h, h, h, mask))
    assert_same(explicit, fast)
    assert_weights_recorded(explicit, fast)
    assert explicit[3].attention_weights.shape == (B, H, T, T)


@pytest.mark.parametrize("mask_name", SELF_MASKS)
def test_multihead_self_attention_with_distinct_but_equal_tensors(mask_name: str) -> None:
    """Self-attention called with three different tensors holding the same values (no aliasing)."""
    mha = tl.MultiHeadAttention(D, H, dropout=0.0).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = SELF_MASKS[mask_name]
    explicit, fast = run_both(mha, lambda: (x, x, x), lambda m, q, k, v: m(q, k, v, mask))
    assert_same(explicit, fast)


@pytest.mark.parametrize("mask_name", CROSS_MASKS)
def test_multihead_cross_attention(mask_name: str) -> None:
    mha = tl.MultiHeadAttention(D, H, dropout=0.0).double()
    query = torch.randn(B, T, D, dtype=torch.float64)
    key = torch.randn(B, S, D, dtype=torch.float64)
    value = torch.randn(B, S, D, dtype=torch.float64)
    mask = CROSS_MASKS[mask_name]
    explicit, fast = run_both(mha, lambda: (query, key, value), lambda m, q, k, v: m(q, k, v, mask))
    assert_same(explicit, fast)
    assert_weights_recorded(explicit, fast)


def test_multihead_key_is_value() -> None:
    """Cross-attention as the decoder calls it: key and value are the same tensor (the memory)."""
    mha = tl.MultiHeadAttention(D, H, dropout=0.0).double()
    query = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    explicit, fast = run_both(mha, lambda: (query, memory), lambda m, q, mem: m(q, mem, mem, CROSS_MASKS["padding"]))
    assert_same(explicit, fast)


def test_multihead_without_bias() -> None:
    mha = tl.MultiHeadAttention(D, H, dropout=0.0, bias=False).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    explicit, fast = run_both(mha, lambda: (x,), lambda m, h: m(h, h, h, SELF_MASKS["combined"]))
    assert_same(explicit, fast)


def test_dropout_is_off_in_eval_mode_on_both_paths() -> None:
    mha = tl.MultiHeadAttention(D, H, dropout=0.5).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    explicit, fast = run_both(mha, lambda: (x,), lambda m, h: m(h, h, h, SELF_MASKS["padding"]))
    assert_same(explicit, fast)


def test_fully_masked_rows_give_bias_only_output() -> None:
    """A query that may see no key mixes nothing: its output is W^O's bias, on both paths, never NaN."""
    mha = tl.MultiHeadAttention(D, H, dropout=0.0).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = SELF_MASKS["fully_masked_batch_row"]
    for on in (True, False):
        tl.record_attention(mha, on)
        out = mha(x, x, x, mask)
        torch.testing.assert_close(out[1], mha.w_o.bias.expand(T, D), **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("mask_name", ["none", "padding", "fully_masked_batch_row", "fully_masked_query_rows"])
def test_encoder_layer(norm_first: bool, mask_name: str) -> None:
    layer = tl.EncoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = SELF_MASKS[mask_name]
    explicit, fast = run_both(layer, lambda: (x,), lambda m, h: m(h, mask))
    assert_same(explicit, fast)
    assert_weights_recorded(explicit, fast)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize(
    ("tgt_name", "memory_name"),
    [("none", "none"), ("causal", "padding"), ("combined", "fully_masked_batch_row"), ("combined", "per_query")],
)
def test_decoder_layer(norm_first: bool, tgt_name: str, memory_name: str) -> None:
    layer = tl.DecoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    tgt_mask, memory_mask = SELF_MASKS[tgt_name], CROSS_MASKS[memory_name]
    explicit, fast = run_both(layer, lambda: (x, memory), lambda m, h, mem: m(h, mem, tgt_mask, memory_mask))
    assert_same(explicit, fast)
    assert_weights_recorded(explicit, fast)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_full_transformer_with_record_attention(norm_first: bool, tie_embeddings: bool) -> None:
    config = tl.TransformerConfig(
        11, 11, d_model=D, n_heads=H, d_ff=FF, n_layers=2, dropout=0.0, norm_first=norm_first,
        tie_embeddings=tie_embeddings,
    )  # fmt: skip
    model = tl.Transformer(config).double()
    src = torch.randint(1, 11, (B, S))
    src[1, 3:] = 0  # padding
    src[2, :] = 0  # a fully padded source: its cross-attention rows see nothing
    tgt = torch.randint(1, 11, (B, T))
    src_mask = tl.padding_mask(src, 0)
    explicit, fast = run_both(model, lambda: (src, tgt), lambda m, s, t: m(s, t, src_mask))
    assert_same(explicit, fast)
    assert_weights_recorded(explicit, fast)
    assert len(attention_modules(fast[3])) == 3 * config.n_layers


def test_record_attention_switches_back_and_forth() -> None:
    config = tl.TransformerConfig(7, 7, d_model=D, n_heads=H, d_ff=FF, n_layers=1, dropout=0.0)
    model = tl.Transformer(config).double().eval()
    src, tgt = torch.randint(0, 7, (2, 4)), torch.randint(0, 7, (2, 3))
    explicit = model(src, tgt)
    assert all(m.attention_weights is not None for m in attention_modules(model))
    assert tl.record_attention(model, False) is model
    assert all(m.attention_weights is None for m in attention_modules(model))  # cleared on switching
    fast = model(src, tgt)
    assert all(m.attention_weights is None for m in attention_modules(model))
    torch.testing.assert_close(fast, explicit, **TOL)
    tl.record_attention(model, True)
    torch.testing.assert_close(model(src, tgt), explicit, **TOL)
    assert all(m.attention_weights is not None for m in attention_modules(model))


def test_fast_path_float32_close_to_explicit() -> None:
    mha = tl.MultiHeadAttention(D, H, dropout=0.0)
    x = torch.randn(B, T, D)
    explicit, fast = run_both(mha, lambda: (x,), lambda m, h: m(h, h, h, SELF_MASKS["combined"]))
    torch.testing.assert_close(fast[0], explicit[0], rtol=1e-5, atol=1e-6)


def test_packed_projection_is_used_for_self_and_cross_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path packs the projections when keys and values are one tensor; the tests above
    therefore cover both the packed route (h, h, h) / (q, mem, mem) and the separate one (q, k, v)."""
    calls = []
    original = tl.MultiHeadAttention._fast_forward

    def spy(self, query, memory, mask):  # noqa: ANN001, ANN202
        calls.append(query is memory)
        return original(self, query, memory, mask)

    monkeypatch.setattr(tl.MultiHeadAttention, "_fast_forward", spy)
    layer = tl.record_attention(tl.DecoderLayer(D, H, FF, dropout=0.0).double(), False)
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    layer(x, memory)
    assert calls == [True, False]  # self-attention packs Q, K, V; cross-attention packs K, V
    tl.record_attention(layer, True)
    layer(x, memory)
    assert calls == [True, False]  # the explicit path never takes it


def test_an_exactly_causal_mask_is_handed_to_the_kernel_as_is_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT's (T, T) causal mask reaches F.scaled_dot_product_attention as is_causal=True (as nanoGPT calls it, the
    kernel skipping the blocks above the diagonal), with the same result to the bit; any other mask, a mask of
    another shape, or dropout keeps attn_mask."""
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append((kwargs.get("is_causal", False), kwargs.get("attn_mask") is not None))
        return original(*args, **kwargs)

    mha = tl.record_attention(tl.MultiHeadAttention(D, H, dropout=0.0), False)
    x = torch.randn(B, T, D, requires_grad=True)
    causal = tl.causal_mask(T)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    out = mha(x, x, x, causal)
    assert seen == [(True, False)]
    upstream = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * upstream).sum(), x)
    # the same module with the mask given to the kernel as a mask: equal outputs and gradients, bit for bit
    monkeypatch.setattr(tl.multihead, "_is_causal", lambda *args: False)
    reference = mha(x, x, x, causal)
    (reference_grad,) = torch.autograd.grad((reference * upstream).sum(), x)
    assert seen == [(True, False), (False, True)]
    assert torch.equal(out, reference) and torch.equal(grad, reference_grad)
    monkeypatch.undo()

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    seen.clear()
    not_causal = causal.clone()
    not_causal[3, 0] = False
    mha(x, x, x, not_causal)  # one entry off: a mask like any other
    mha(x, x, x, causal.view(1, 1, T, T))  # broadcastable, but not the 2-D causal mask: kept as is
    mha(x[:, :1], x, x, causal[:1])  # fewer queries than keys
    dropping = tl.MultiHeadAttention(D, H, dropout=0.5)
    tl.record_attention(dropping, False).train()
    dropping(x, x, x, causal)  # dropout draws at random: left to the masked kernel
    assert seen == [(False, True)] * 4
