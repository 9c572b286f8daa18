"""Chapter 08's exercises: each reference agrees with the library and with PyTorch's own modules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.embedding import rotation_matrix
from transformer_lab.exercises import ch08_embeddings as ex

torch.set_num_threads(1)


def test_predicted_shape_is_what_note_000s_forward_gives() -> None:
    torch.manual_seed(0)
    table = nn.Embedding(10, 8)
    ids = torch.randint(0, 10, (2, 3, 1))  # (batch, seq_len, 1) as the notes describe the input
    pe = tl.sinusoidal_encoding(16, 8).unsqueeze(0)  # note 000's buffer, (1, max_len, D)
    x = table(ids)
    assert tuple((x + pe[:, : x.size(1)]).shape) == ex.predict_notes_shape.reference()
    assert ex.predict_notes_shape.reference() not in ex.predict_notes_shape.explain


@pytest.mark.parametrize("case", range(6))
def test_embedding_grad_reference_is_autograds_gradient_of_nn_embedding(case: int) -> None:
    tokens, grad_out, vocab = ex.embedding_grad.cases[case].inputs()
    layer = nn.Embedding(vocab, grad_out.shape[-1]).double()
    layer(tokens).backward(grad_out.double())
    torch.testing.assert_close(ex._embedding_grad_reference(tokens, grad_out.double(), vocab), layer.weight.grad)
    one_hot = nn.functional.one_hot(tokens.reshape(-1), vocab).double()  # section 1's product, transposed
    expected = one_hot.T @ grad_out.double().reshape(-1, grad_out.shape[-1])
    torch.testing.assert_close(
        ex._embedding_grad_reference(tokens, grad_out.double(), vocab), expected, atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("case", range(6))
def test_embed_and_encode_reference_is_the_librarys_input_pipeline(case: int) -> None:
    tokens, weight = ex.embed_and_encode.cases[case].inputs()
    vocab, d_model = weight.shape
    embed = tl.TokenEmbedding(vocab, d_model).double()
    with torch.no_grad():
        embed.embedding.weight.copy_(weight.double())
        expected = embed(tokens) + tl.sinusoidal_encoding(tokens.shape[1], d_model, dtype=torch.float64)
    got = ex._embed_and_encode_reference(tokens, weight.double())
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    # and the modules tl.Transformer uses (their buffer is float32), in float32
    embed = tl.TokenEmbedding(vocab, d_model)
    with torch.no_grad():
        embed.embedding.weight.copy_(weight)
        modules = tl.PositionalEncoding(d_model, max_len=64)(embed(tokens))
    torch.testing.assert_close(ex._embed_and_encode_reference(tokens, weight), modules, atol=1e-6, rtol=1e-6)


def test_the_notes_inputs_lack_the_scale_and_break_on_an_odd_d_model() -> None:
    tokens, weight = ex.embed_and_encode.cases[0].inputs()  # D = 8
    torch.testing.assert_close(ex.notes_000_inputs(tokens, weight), weight[tokens] + tl.sinusoidal_encoding(5, 8))
    assert not torch.allclose(ex.notes_000_inputs(tokens, weight), ex._embed_and_encode_reference(tokens, weight))
    tokens, weight = ex.embed_and_encode.cases[2].inputs()  # D = 5
    with pytest.raises(RuntimeError):
        ex.notes_000_inputs(tokens, weight)


@pytest.mark.parametrize("case", range(6))
def test_rotary_reference_applies_the_chapters_rotation_by_minus_the_position(case: int) -> None:
    (x,) = ex.rotary.cases[case].inputs()
    x = x.double()
    length, d_model = x.shape[-2:]
    expected = torch.stack([x[..., t, :] @ rotation_matrix(d_model, -t).T for t in range(length)], dim=-2)
    torch.testing.assert_close(ex._rotary_reference(x), expected, atol=1e-12, rtol=0)


def test_rotary_reference_is_a_complex_multiplication() -> None:
    """RoPE written as LLaMA writes it: pairs as complex numbers, times e^{i t omega}."""
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    theta = torch.arange(6, dtype=torch.float64)[:, None] * 10000 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    turned = torch.view_as_complex(x.reshape(2, 3, 6, 4, 2).contiguous()) * torch.polar(torch.ones_like(theta), theta)
    torch.testing.assert_close(ex._rotary_reference(x), torch.view_as_real(turned).reshape(2, 3, 6, 8))


def test_rotary_scores_depend_only_on_the_offset() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    rows = torch.stack([q] * 60)[None], torch.stack([k] * 60)[None]  # the same q and k at every position
    rq, rk = ex._rotary_reference(rows[0]), ex._rotary_reference(rows[1])
    scores = rq[0] @ rk[0].T  # (60, 60)
    for offset in (-7, 0, 3, 20):
        diagonal = torch.diagonal(scores, offset=offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-10, rtol=0)
    assert math.isclose(scores[0, 0].item(), (q @ k).item(), rel_tol=1e-12)


def test_a_longer_sinusoidal_table_needs_no_training_and_extends_the_shorter_one() -> None:
    """What the summary says: tl.PositionalEncoding stops at its max_len (5000 by default), and a longer table is
    the same formula evaluated further, its first rows those of the shorter one."""
    assert tl.PositionalEncoding(8).pe.shape == (5000, 8)
    with pytest.raises(ValueError, match="max_len"):
        tl.PositionalEncoding(8, max_len=16)(torch.zeros(1, 20, 8))
    torch.testing.assert_close(tl.sinusoidal_encoding(64, 8)[:16], tl.sinusoidal_encoding(16, 8), rtol=0, atol=0)
