"""The KV cache (DecoderCache): decoding step by step with the cache gives the logits of the full
teacher-forced decode; cross-attention keys and values are projected once; reorder keeps the
right rows (issue 8)."""

from __future__ import annotations

import pytest
import torch

import transformer_lab as tl

V, D, H, FF, LAYERS = 13, 16, 4, 32, 2
B, S, T = 3, 7, 6
TOLERANCES = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def make_model(norm_first: bool, dtype: torch.dtype, record: bool, seed: int = 0) -> tl.Transformer:
    torch.manual_seed(seed)
    config = tl.TransformerConfig(V, V, d_model=D, n_heads=H, d_ff=FF, n_layers=LAYERS, norm_first=norm_first)
    model = tl.Transformer(config).to(dtype).eval()  # eval: dropout off
    return tl.record_attention(model, record)


def make_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, V, (B, S), generator=g)
    src[0, 4:] = 0  # padded sources
    src[2, 2:] = 0
    tgt = torch.randint(1, V, (B, T), generator=g)
    return src, tl.padding_mask(src, 0), tgt


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre_norm", "post_norm"])
@pytest.mark.parametrize("record", [False, True], ids=["fast", "explicit"])
def test_step_by_step_equals_teacher_forced(dtype: torch.dtype, norm_first: bool, record: bool) -> None:
    model = make_model(norm_first, dtype, record)
    src, src_mask, tgt = make_batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V), causal mask
        cache = model.new_cache()
        steps = []
        for t in range(T):
            steps.append(model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache))  # (B, 1, V)
            assert cache.length == t + 1
            for layer in cache.layers:
                assert layer.self_k.shape == (B, H, t + 1, D // H)
                assert layer.cross_k.shape == (B, H, S, D // H)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOLERANCES[dtype])


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre_norm", "post_norm"])
def test_chunks_of_several_tokens(norm_first: bool) -> None:
    """The cache also takes several new tokens at once (e.g. a prompt), then single tokens."""
    model = make_model(norm_first, torch.float64, record=False)
    src, src_mask, tgt = make_batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        cache = model.new_cache()
        parts = [model.decode(tgt[:, a:b], memory, src_mask, cache=cache) for a, b in ((0, 3), (3, 4), (4, T))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, **TOLERANCES[torch.float64])


def count_calls(model: tl.Transformer, attribute: str) -> list[list[int]]:
    """Wrap `project_kv` of every decoder layer's `attribute` ('self_attn' or 'cross_attn'); return,
    per layer, the list of key lengths it was called with (filled in as the model runs)."""
    calls: list[list[int]] = []
    for layer in model.decoder.layers:
        attention = getattr(layer, attribute)
        seen: list[int] = []
        original = attention.project_kv

        def wrapped(key, value, original=original, seen=seen):
            seen.append(key.shape[1])
            return original(key, value)

        attention.project_kv = wrapped  # instance attribute shadows the method
        calls.append(seen)
    return calls


def test_cross_attention_keys_and_values_are_projected_once() -> None:
    model = make_model(True, torch.float64, record=False)
    src, src_mask, tgt = make_batch()
    cross = count_calls(model, "cross_attn")
    selfs = count_calls(model, "self_attn")
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        for t in range(T):
            model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache)
    assert cross == [[S]] * LAYERS  # once per layer, for the whole source
    assert selfs == [[1] * T] * LAYERS  # only the new token at each step


def test_without_cache_everything_is_projected_each_call() -> None:
    """The counting wrapper does see calls: without a cache, every step projects the memory again.

    (Explicit path: the fast path without a cache projects keys and values in one packed matmul,
    not through `project_kv`.)"""
    model = make_model(True, torch.float64, record=True)
    src, src_mask, tgt = make_batch()
    cross = count_calls(model, "cross_attn")
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        for t in range(1, 3):
            model.decode(tgt[:, :t], memory, src_mask)
    assert cross == [[S, S]] * LAYERS


def test_reorder_keeps_the_right_rows() -> None:
    model = make_model(False, torch.float64, record=False)
    src, src_mask, tgt = make_batch()
    index = torch.tensor([2, 0, 0, 1])  # reorder, duplicate and drop nothing: 4 rows from 3
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        model.decode(tgt[:, :3], memory, src_mask, cache=cache)
        before = [(layer.self_k.clone(), layer.self_v.clone(), layer.cross_k.clone()) for layer in cache.layers]
        cache.reorder(index)
        for (k, v, ck), layer in zip(before, cache.layers, strict=True):
            torch.testing.assert_close(layer.self_k, k[index], rtol=0, atol=0)
            torch.testing.assert_close(layer.self_v, v[index], rtol=0, atol=0)
            torch.testing.assert_close(layer.cross_k, ck[index], rtol=0, atol=0)
        assert cache.length == 3
        # Continuing with the reordered cache equals decoding the reordered batch from scratch.
        rest = model.decode(tgt[index, 3:], memory[index], src_mask[index], cache=cache)
        full = model.decode(tgt[index], memory[index], src_mask[index])
    torch.testing.assert_close(rest, full[:, 3:], **TOLERANCES[torch.float64])


def test_cache_with_wrong_number_of_layers_is_refused() -> None:
    model = make_model(True, torch.float64, record=False)
    src, src_mask, tgt = make_batch()
    memory = model.encode(src, src_mask)
    with pytest.raises(ValueError, match="cache has 1 layers"):
        model.decode(tgt[:, :1], memory, src_mask, cache=tl.DecoderCache.empty(1))


# ---------------------------------------------------------------- LayerCache.extend_self (buffers with room)


def _new(batch: int, length: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, H, length, D // H, generator=g, dtype=dtype), torch.randn(
        batch, H, length, D // H, generator=g, dtype=dtype
    )


def test_extend_self_equals_concatenation_and_reuses_its_buffers() -> None:
    """Step after step (several tokens at a time too) the cached keys and values are exactly those of
    torch.cat, and a step writes into the buffers it already has unless they are full."""
    cache = tl.LayerCache()
    all_k, all_v = _new(2, 5, 0)
    k, v = cache.extend_self(all_k, all_v)  # the first fill is kept as it is
    assert k is all_k and v is all_v
    reallocations, pointer = 0, None
    for step, length in enumerate([1, 1, 3, 1] + [1] * 40):
        new_k, new_v = _new(2, length, step + 1)
        all_k, all_v = torch.cat([all_k, new_k], dim=2), torch.cat([all_v, new_v], dim=2)
        k, v = cache.extend_self(new_k, new_v)
        assert k is cache.self_k and v is cache.self_v
        assert torch.equal(k, all_k) and torch.equal(v, all_v)
        reallocations += k.data_ptr() != pointer
        pointer = k.data_ptr()
    assert all_k.shape[2] == 5 + 46
    assert reallocations <= 3  # room for 16, then doubled: 5 -> 16 -> 34 -> 70 positions


def test_extend_self_after_reorder_and_in_a_copy_never_overwrites_another_cache() -> None:
    """A copy of a cache (or a reordered one) shares nothing it would write: each keeps its own values."""
    import copy

    cache = tl.DecoderCache.empty(1)
    first_k, first_v = _new(3, 4, 0)
    cache.layers[0].extend_self(first_k, first_v)
    cache.layers[0].extend_self(*_new(3, 1, 1))  # now views of buffers with room
    cache.length = 5
    copied = copy.deepcopy(cache)
    shallow = copy.copy(cache.layers[0])  # shares the buffers' tensors
    before = cache.layers[0].self_k.clone()
    a, b, c = _new(3, 1, 2), _new(3, 1, 3), _new(3, 1, 4)
    k_a, _ = cache.layers[0].extend_self(*a)
    k_b, _ = copied.layers[0].extend_self(*b)
    k_c, _ = shallow.extend_self(*c)
    for k, new in ((k_a, a), (k_b, b), (k_c, c)):
        assert torch.equal(k[:, :, :5], before)
        assert torch.equal(k[:, :, 5:], new[0])
    cache.reorder(torch.tensor([2, 0]))
    k, v = cache.layers[0].extend_self(*_new(2, 1, 5))
    assert torch.equal(k[:, :, :6], k_a[[2, 0]])
    assert torch.equal(k[:, :, 6:], _new(2, 1, 5)[0])


def test_extend_self_under_autograd_concatenates() -> None:
    """While autograd records, the step concatenates (writing in place would break the backward pass)."""
    cache = tl.LayerCache()
    k0, v0 = (t.requires_grad_() for t in _new(1, 3, 0))
    cache.extend_self(k0, v0)
    k1, v1 = (t.requires_grad_() for t in _new(1, 1, 1))
    k, v = cache.extend_self(k1, v1)
    q = torch.randn(1, H, 1, D // H, dtype=torch.float64)
    torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    assert k0.grad is not None and k1.grad is not None and v1.grad is not None


def test_extend_self_refuses_keys_of_another_shape() -> None:
    cache = tl.LayerCache()
    cache.extend_self(*_new(2, 3, 0))
    k, v = _new(3, 1, 1)
    with pytest.raises(ValueError, match=r"do not fit the cache.*new_cache"):
        cache.extend_self(k, v)


def test_extend_self_after_the_cache_was_cut_short_keeps_what_was_handed_out() -> None:
    """Keys set by hand to a shorter prefix (a rollback, say): the next step must not write over positions
    that a tensor handed out earlier still shows."""
    cache = tl.LayerCache()
    cache.extend_self(*_new(1, 4, 0))
    handed_out, _ = cache.extend_self(*_new(1, 2, 1))  # 6 positions, views of the buffers
    kept = handed_out.clone()
    cache.self_k, cache.self_v = cache.self_k[:, :, :3], cache.self_v[:, :, :3]  # cut back to 3 positions
    k, _ = cache.extend_self(*_new(1, 1, 2))
    assert torch.equal(handed_out, kept)
    assert torch.equal(k[:, :, :3], kept[:, :, :3]) and torch.equal(k[:, :, 3:], _new(1, 1, 2)[0])
