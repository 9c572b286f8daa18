"""TokenEmbedding and the sinusoidal PositionalEncoding (chapter 08)."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_lab as tl


def test_token_embedding_is_the_table_row_times_sqrt_d_model() -> None:
    torch.manual_seed(0)
    embed = tl.TokenEmbedding(vocab_size=10, d_model=16)
    tokens = torch.tensor([[3, 0, 9], [1, 1, 2]])
    out = embed(tokens)
    assert out.shape == (2, 3, 16)
    for b in range(2):
        for t in range(3):
            row = embed.embedding.weight[tokens[b, t]]
            torch.testing.assert_close(out[b, t], row * 4.0, atol=0, rtol=0)  # sqrt(16) = 4


def test_token_embedding_gradient_reaches_only_used_rows() -> None:
    embed = tl.TokenEmbedding(5, 4)
    embed(torch.tensor([[1, 3, 1]])).sum().backward()
    g = embed.embedding.weight.grad
    assert torch.equal(g[1], torch.full((4,), 2 * math.sqrt(4))) and torch.equal(g[3], torch.full((4,), 2.0))
    assert torch.equal(g[[0, 2, 4]], torch.zeros(3, 4))


def _pe_by_loops(max_len: int, d_model: int) -> list[list[float]]:
    """The paper's formula with python loops and math.sin/cos: PE(pos, 2i) = sin(pos / 10000^(2i/d))."""
    table = []
    for pos in range(max_len):
        row = []
        for j in range(d_model):
            i = j // 2
            angle = pos / (10000 ** (2 * i / d_model))
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        table.append(row)
    return table


@pytest.mark.parametrize(("max_len", "d_model"), [(12, 8), (7, 6), (5, 5), (50, 32)])
def test_positional_encoding_matches_the_formula(max_len: int, d_model: int) -> None:
    expected = torch.tensor(_pe_by_loops(max_len, d_model), dtype=torch.float64)
    table = tl.sinusoidal_encoding(max_len, d_model, dtype=torch.float64)
    torch.testing.assert_close(table, expected, atol=1e-12, rtol=0)
    pe = tl.PositionalEncoding(d_model, max_len)
    torch.testing.assert_close(pe.pe, expected.float(), atol=1e-6, rtol=0)


def test_positional_encoding_adds_the_table_from_start() -> None:
    pe = tl.PositionalEncoding(8, max_len=20).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(pe(x), x + pe.pe[:5], atol=0, rtol=0)
    torch.testing.assert_close(pe(x, start=3), x + pe.pe[3:8], atol=0, rtol=0)
    torch.testing.assert_close(pe(x[:, :0]), x[:, :0])


def test_positional_encoding_buffer_in_state_dict_not_a_parameter() -> None:
    pe = tl.PositionalEncoding(8, max_len=20)
    assert "pe" in pe.state_dict() and pe.state_dict()["pe"].shape == (20, 8)
    assert list(pe.parameters()) == []
    other = tl.PositionalEncoding(8, max_len=20)
    other.pe.zero_()
    other.load_state_dict(pe.state_dict())
    assert torch.equal(other.pe, pe.pe)


def test_positional_encoding_buffer_moves_with_to() -> None:
    pe = tl.PositionalEncoding(8, max_len=20)
    assert pe.pe.dtype == torch.float32
    pe = pe.to(torch.float64)
    assert pe.pe.dtype == torch.float64
    torch.testing.assert_close(pe.pe, torch.tensor(_pe_by_loops(20, 8), dtype=torch.float64), atol=1e-7, rtol=0)
    assert pe(torch.zeros(1, 3, 8, dtype=torch.float64)).dtype == torch.float64


def test_positional_encoding_dropout_in_train_mode_only() -> None:
    pe = tl.PositionalEncoding(8, max_len=10, dropout=0.5)
    x = torch.zeros(4, 10, 8)
    assert torch.equal(pe.eval()(x), x + pe.pe)
    dropped = pe.train()(x)
    assert (dropped == 0).any() and not torch.equal(dropped, x + pe.pe)


def test_encodings_distinct_and_bounded() -> None:
    table = tl.sinusoidal_encoding(100, 16)
    assert table.abs().max() <= 1.0
    assert torch.cdist(table, table).fill_diagonal_(1.0).min() > 0.1  # every position has its own code
