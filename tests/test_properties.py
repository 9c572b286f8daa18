"""Properties that must hold for any small shape (hypothesis, derandomized so every run is the same)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lab as tl

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True)
VOCAB, PAD = 11, 0


@functools.cache
def _model(norm_first: bool) -> tl.Transformer:
    torch.manual_seed(0)
    config = tl.TransformerConfig(
        VOCAB, VOCAB, d_model=8, n_heads=2, d_ff=16, n_layers=2, max_len=24, dropout=0.1, norm_first=norm_first
    )
    return tl.Transformer(config).double().eval()


@functools.cache
def _encoder() -> tl.Encoder:
    torch.manual_seed(1)
    return tl.Encoder(8, 2, 16, 2, dropout=0.1).double().eval()


def _tokens(seed: int, batch: int, length: int, low: int = 1) -> torch.Tensor:
    return torch.randint(low, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


seeds = st.integers(0, 2**16)


@PROPERTY
@given(
    seed=seeds,
    batch=st.integers(1, 3),
    src_len=st.integers(1, 6),
    tgt_len=st.integers(2, 7),
    data=st.data(),
    norm_first=st.booleans(),
)
def test_forward_without_tgt_mask_is_causal(
    seed: int, batch: int, src_len: int, tgt_len: int, data: st.DataObject, norm_first: bool
) -> None:
    """Changing target tokens from position k on leaves the logits before k unchanged."""
    model = _model(norm_first)
    k = data.draw(st.integers(1, tgt_len - 1), label="k")
    src, tgt = _tokens(seed, batch, src_len), _tokens(seed + 1, batch, tgt_len)
    changed = tgt.clone()
    changed[:, k:] = _tokens(seed + 2, batch, tgt_len - k)
    with torch.no_grad():
        before, after = model(src, tgt), model(src, changed)
    torch.testing.assert_close(after[:, :k], before[:, :k], atol=1e-10, rtol=0)


@PROPERTY
@given(seed=seeds, batch=st.integers(1, 3), src_len=st.integers(1, 6), tgt_len=st.integers(2, 7), data=st.data())
def test_decode_with_target_mask_is_causal(
    seed: int, batch: int, src_len: int, tgt_len: int, data: st.DataObject
) -> None:
    model = _model(True)
    k = data.draw(st.integers(1, tgt_len - 1), label="k")
    src, tgt = _tokens(seed, batch, src_len), _tokens(seed + 1, batch, tgt_len)
    changed = tgt.clone()
    changed[:, k:] = _tokens(seed + 2, batch, tgt_len - k, low=0)  # later tokens, padding included
    with torch.no_grad():
        memory = model.encode(src)
        before = model.decode(tgt, memory, tgt_mask=tl.target_mask(tgt, PAD))
        after = model.decode(changed, memory, tgt_mask=tl.target_mask(changed, PAD))
    torch.testing.assert_close(after[:, :k], before[:, :k], atol=1e-10, rtol=0)


@PROPERTY
@given(seed=seeds, lengths=st.lists(st.integers(1, 5), min_size=1, max_size=3), extra=st.integers(1, 4))
def test_appending_padding_leaves_encoder_outputs_unchanged(seed: int, lengths: list[int], extra: int) -> None:
    encoder = _encoder()
    batch, width = len(lengths), max(lengths)
    real = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    x = _x(seed, batch, width, 8)
    longer = torch.cat([x, _x(seed + 1, batch, extra, 8)], dim=1)  # padded positions with arbitrary content
    longer_real = torch.cat([real, torch.zeros(batch, extra, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        out = encoder(x, real[:, None, None, :])
        out_longer = encoder(longer, longer_real[:, None, None, :])
    torch.testing.assert_close(out_longer[:, :width][real], out[real], atol=1e-10, rtol=0)


@PROPERTY
@given(
    seed=seeds,
    batch=st.integers(1, 3),
    src_len=st.integers(1, 5),
    tgt_len=st.integers(1, 5),
    extra_src=st.integers(1, 3),
    extra_tgt=st.integers(0, 3),
    norm_first=st.booleans(),
)
def test_appending_padding_leaves_model_outputs_unchanged(
    seed: int, batch: int, src_len: int, tgt_len: int, extra_src: int, extra_tgt: int, norm_first: bool
) -> None:
    model = _model(norm_first)
    src, tgt = _tokens(seed, batch, src_len), _tokens(seed + 1, batch, tgt_len)
    src_padded = torch.cat([src, torch.full((batch, extra_src), PAD)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((batch, extra_tgt), PAD)], dim=1)
    with torch.no_grad():
        out = model(src, tgt, tl.padding_mask(src, PAD), tl.target_mask(tgt, PAD))
        out_padded = model(src_padded, tgt_padded, tl.padding_mask(src_padded, PAD), tl.target_mask(tgt_padded, PAD))
    torch.testing.assert_close(out_padded[:, :tgt_len], out, atol=1e-10, rtol=0)


@PROPERTY
@given(
    seed=seeds,
    lead=st.lists(st.integers(1, 3), max_size=2),
    t=st.integers(1, 6),
    s=st.integers(1, 6),
    d_k=st.integers(1, 5),
    p_masked=st.floats(0.0, 0.9),
)
def test_attention_rows_sum_to_one_with_zero_weight_on_masked_keys(
    seed: int, lead: list[int], t: int, s: int, d_k: int, p_masked: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, t, d_k, dtype=torch.float64, generator=g)
    k = torch.randn(*lead, s, d_k, dtype=torch.float64, generator=g) * 3
    v = torch.randn(*lead, s, 2, dtype=torch.float64, generator=g)
    mask = torch.rand(*lead, t, s, generator=g) >= p_masked
    _, weights = tl.scaled_dot_product_attention(q, k, v, mask)
    assert not weights.isnan().any()
    assert torch.equal(weights[~mask], torch.zeros_like(weights[~mask]))
    assert (weights[mask] > 0).all()
    visible = mask.any(-1)  # rows with at least one key
    sums = weights.sum(-1)
    torch.testing.assert_close(sums[visible], torch.ones_like(sums[visible]), atol=1e-12, rtol=0)
    assert torch.equal(sums[~visible], torch.zeros_like(sums[~visible]))


@PROPERTY
@given(seed=seeds, batch=st.integers(1, 2), length=st.integers(2, 7), masked=st.booleans())
def test_encoder_without_positions_is_permutation_equivariant(seed: int, batch: int, length: int, masked: bool) -> None:
    encoder = _encoder()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, 8, dtype=torch.float64, generator=g)
    perm = torch.randperm(length, generator=g)
    mask = None
    if masked:
        mask = torch.rand(batch, 1, 1, length, generator=g) > 0.3
        mask[..., 0] = True
    with torch.no_grad():
        out = encoder(x, mask)
        out_perm = encoder(x[:, perm], None if mask is None else mask[..., perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-10, rtol=0)


@pytest.mark.parametrize("record", [True, False], ids=["record_weights", "fast_path"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    seed=seeds,
    bias=st.booleans(),
    t=st.integers(1, 5),
    s=st.integers(1, 5),
    data=st.data(),
)
def test_fully_masked_query_row_gives_zero_weights_and_output(
    dtype: torch.dtype, record: bool, seed: int, bias: bool, t: int, s: int, data: st.DataObject
) -> None:
    row = data.draw(st.integers(0, t - 1), label="row")
    torch.manual_seed(seed)
    mha = tl.MultiHeadAttention(8, 2, bias=bias, record_weights=record).to(dtype)
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(2, t, 8, generator=g).to(dtype).requires_grad_()
    memory = torch.randn(2, s, 8, generator=g).to(dtype).requires_grad_()
    mask = torch.ones(2, 1, t, s, dtype=torch.bool)
    mask[0, 0, row] = False
    out = mha(query, memory, memory, mask)
    assert not out.isnan().any()
    # The heads of that row are zero, so the output row is W^O's bias alone (zero without biases).
    expected = mha.w_o.bias.detach() if bias else torch.zeros(8, dtype=dtype)
    assert torch.equal(out[0, row], expected)
    if record:
        assert torch.equal(mha.attention_weights[0, :, row], torch.zeros(2, s, dtype=dtype))
    else:
        assert mha.attention_weights is None
    out.float().sum().backward()
    assert not query.grad.isnan().any() and not memory.grad.isnan().any()
    assert all(not p.grad.isnan().any() for p in mha.parameters())
    # The bare function: zero weights and a zero output on that row.
    q, k = torch.randn(2, t, 4, generator=g).to(dtype), torch.randn(2, s, 4, generator=g).to(dtype)
    output, weights = tl.scaled_dot_product_attention(q, k, k, mask[:, 0])
    assert torch.equal(output[0, row], torch.zeros(4, dtype=dtype))
    assert torch.equal(weights[0, row], torch.zeros(s, dtype=dtype))
