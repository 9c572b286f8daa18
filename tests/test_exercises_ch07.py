"""Chapter 07's exercises: each reference agrees with the library and with PyTorch's own modules."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab.exercises import ch07_decoder as ex


def test_predicted_cross_attention_shape_is_the_layers() -> None:
    torch.manual_seed(0)
    layer = tl.DecoderLayer(d_model=8, n_heads=2, d_ff=32, dropout=0.0).eval()
    layer(torch.randn(2, 4, 8), torch.randn(2, 6, 8), tgt_mask=tl.causal_mask(4))
    assert tuple(layer.cross_attn.attention_weights.shape) == ex.predict_cross_attention_shape.reference()
    assert ex.predict_cross_attention_shape.reference() not in ex.predict_cross_attention_shape.explain


def _copy_attention(ours: tl.MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.load_state_dict(ours.w_o.state_dict())


def test_post_norm_reference_equals_the_library_and_pytorch() -> None:
    x, memory, sa, ca, ff, n1, n2, n3, tgt_mask, memory_mask = ex._decoder_case(3, 5, 7, 1, True)
    parts = [sa, ca, ff, n1, n2, n3]
    x, memory = x.double(), memory.double()
    for part in parts:
        part.double()
    got = ex._post_norm_reference(x, memory, *parts, tgt_mask, memory_mask)
    layer = tl.DecoderLayer(8, 2, 16, dropout=0.0, norm_first=False).double().eval()
    for name, part in zip(("self_attn", "cross_attn", "feed_forward", "norm1", "norm2", "norm3"), parts, strict=True):
        getattr(layer, name).load_state_dict(part.state_dict())
    torch.testing.assert_close(got, layer(x, memory, tgt_mask, memory_mask), rtol=0, atol=1e-10)
    theirs = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=False).double().eval()
    _copy_attention(sa, theirs.self_attn)
    _copy_attention(ca, theirs.multihead_attn)
    theirs.linear1.load_state_dict(ff.w1.state_dict())
    theirs.linear2.load_state_dict(ff.w2.state_dict())
    for k, norm in enumerate((n1, n2, n3), start=1):
        getattr(theirs, f"norm{k}").load_state_dict(norm.state_dict())
    expected = theirs(x, memory, tgt_mask=~tgt_mask, memory_key_padding_mask=~memory_mask[:, 0, 0, :])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", range(4))
def test_transformer_forward_reference_equals_the_model(case: int) -> None:
    model, src, tgt_in, src_mask = ex.transformer_forward.cases[case].inputs()
    model.double()
    with torch.no_grad():
        torch.testing.assert_close(
            ex._forward_reference(model, src, tgt_in, src_mask), model(src, tgt_in, src_mask), rtol=0, atol=1e-10
        )


def test_notes_forward_ignores_the_target() -> None:
    model, src, tgt_in, _ = ex.transformer_forward.cases[0].inputs()
    with torch.no_grad():
        out = ex.notes_forward(model, src, tgt_in)
        assert out.shape[1] == src.shape[1] != tgt_in.shape[1]
        torch.testing.assert_close(out, ex.notes_forward(model, src, tgt_in.flip(1)))


def test_best_loss_of_a_per_position_model_is_four_ln_2() -> None:
    """The best factorised model predicts each position's marginal: its expected loss is the sum of their entropies."""
    src = torch.tensor([2, 5, 3, 7])
    targets = torch.stack([src, src.flip(0)])  # copy or reverse, 1/2 each
    vocab = 10
    marginals = torch.stack([F.one_hot(t, vocab).double() for t in targets]).mean(0)  # (4, V): the best per position
    loss = -(marginals.clamp_min(1e-300).log() * F.one_hot(targets, vocab)).sum(-1).sum(-1).mean()
    assert math.isclose(loss.item(), ex.predict_best_loss_like_000.reference(), rel_tol=1e-12)
    assert math.isclose(ex.predict_best_loss_like_000.reference(), 4 * math.log(2))


@pytest.mark.parametrize("case", range(4))
def test_cached_step_equals_the_full_causal_pass(case: int) -> None:
    attn, h_new, k_cache, v_cache = ex.cached_self_attention.cases[case].inputs()
    attn.double()
    h_new, k_cache, v_cache = h_new.double(), k_cache.double(), v_cache.double()
    with torch.no_grad():
        out, k, v = ex._cached_reference(attn, h_new, k_cache, v_cache)
        cache = tl.LayerCache(k_cache, v_cache)
        layer = tl.DecoderLayer(attn.d_model, attn.n_heads, 4, dropout=0.0).double()
        layer.self_attn = attn
        expected = layer._self_attention(h_new, None, cache)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(k, cache.self_k, rtol=0, atol=0)
    torch.testing.assert_close(v, cache.self_v, rtol=0, atol=0)


def test_cached_steps_one_by_one_equal_one_masked_pass() -> None:
    torch.manual_seed(0)
    attn = tl.MultiHeadAttention(16, 4).double().eval()
    h = torch.randn(2, 6, 16, dtype=torch.float64)  # (B, T, D)
    with torch.no_grad():
        full = attn(h, h, h, tl.causal_mask(6))  # (B, T, D): every position at once, causal mask
        k = v = torch.zeros(2, 4, 0, 4, dtype=torch.float64)  # an empty cache (B, H, 0, d_k)
        for t in range(6):
            out, k, v = ex._cached_reference(attn, h[:, t : t + 1], k, v)
            torch.testing.assert_close(out, full[:, t : t + 1], rtol=0, atol=1e-10)
    assert k.shape == (2, 4, 6, 4)



def test_a_loss_per_position_or_in_bits_is_told_what_it_is(capsys) -> None:  # noqa: ANN001
    """ln 2 is note 000's loss at one position as well as the correct decoder's bound; 4.0 is 4 ln 2 in bits."""
    exercise = ex.predict_best_loss_like_000
    per_position = F.cross_entropy(torch.tensor([[0.0, 0.0]]), torch.tensor([0])).item()  # two letters, 1/2 each
    assert math.isclose(per_position, math.log(2), rel_tol=1e-6)
    assert math.isclose(exercise.reference() / math.log(2), 4.0)  # the same loss counted in bits
    for wrong, words in ((math.log(2), "at ONE position"), (4.0, "in bits"), (4, "in bits")):
        assert not exercise.run(lambda wrong=wrong: wrong).passed
        exercise.check(lambda wrong=wrong: wrong)
        assert words in capsys.readouterr().out


def test_the_cache_order_shows_only_through_a_mask() -> None:
    """What exercise 5's feedback on a new key put first says: without a mask the step's output is the same for
    any order of the cached keys; a mask over the cached positions addresses them by index."""
    attn, h_new, k_cache, v_cache = ex.cached_self_attention.cases[2].inputs()  # 5 tokens cached, 4 heads
    with torch.no_grad():
        k_new, v_new = attn.project_kv(h_new, h_new)
        k_last, v_last = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        k_first, v_first = torch.cat([k_new, k_cache], 2), torch.cat([v_new, v_cache], 2)
        torch.testing.assert_close(attn.attend(h_new, k_first, v_first), attn.attend(h_new, k_last, v_last))
        blocked = torch.ones(1, 1, 1, 6, dtype=torch.bool)
        blocked[..., 0] = False  # a padded first position of the prompt
        differ = attn.attend(h_new, k_first, v_first, blocked) - attn.attend(h_new, k_last, v_last, blocked)
    assert differ.abs().max() > 1e-3

# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _post_norm_keywords(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(sa(x, x, x, mask=tgt_mask) + x)
    x = n2(x + ca(query=x, key=memory, value=memory, mask=memory_mask))
    return n3(x + ff(x))


def _forward_own_masks(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)), src_mask)
    length = tgt_in.size(1)
    causal = torch.tril(torch.ones(length, length)).bool()[None, None]  # (1, 1, T, T)
    return model.generator(model.decoder(model.positional(model.tgt_embed(tgt_in)), memory, causal, src_mask))


def _cached_einsum(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    batch, _, d_model = h_new.shape
    d_k = d_model // attn.n_heads

    def heads(t):  # noqa: ANN001, ANN202
        return t.reshape(batch, 1, attn.n_heads, d_k).permute(0, 2, 1, 3)

    q = heads(attn.w_q(h_new))
    k = torch.cat((k_cache, heads(attn.w_k(h_new))), -2)
    v = torch.cat((v_cache, heads(attn.w_v(h_new))), -2)
    weights = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d_k), -1)
    return [attn.w_o(torch.einsum("bhqk,bhkd->bqhd", weights, v).reshape(batch, 1, d_model)), k, v]


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.predict_cross_attention_shape: [lambda: torch.Size([2, 2, 4, 6]), lambda: [2, 2, 4, 6]],
        ex.decoder_layer_post_norm: [_post_norm_keywords],
        ex.transformer_forward: [_forward_own_masks],
        ex.predict_best_loss_like_000: [lambda: 2.77, lambda: 4 * 0.693],
        ex.cached_self_attention: [_cached_einsum],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()
