"""Chapter 08 extras of embedding.py: note 002's three frequency formulas, the rotation R_k, learned positions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.embedding import (
    FREQUENCY_METHODS,
    LearnedPositionalEmbedding,
    inverse_frequencies,
    rotation_matrix,
)

torch.set_num_threads(1)


def _formula(d_model: int) -> torch.Tensor:
    """1 / 10000^(2i / D) element by element with Python floats (double precision), independent of torch."""
    return torch.tensor([1.0 / 10000.0 ** (two_i / d_model) for two_i in range(0, d_model, 2)], dtype=torch.float64)


@pytest.mark.parametrize("method", FREQUENCY_METHODS)
@pytest.mark.parametrize("d_model", [1, 2, 5, 64, 513])
def test_frequencies_match_the_formula(method: str, d_model: int) -> None:
    expected = _formula(d_model)
    torch.testing.assert_close(inverse_frequencies(d_model, method, torch.float64), expected, rtol=1e-14, atol=0)
    got32 = inverse_frequencies(d_model, method, torch.float32)
    assert got32.dtype == torch.float32 and got32.shape == ((d_model + 1) // 2,)
    # float32 agrees only to float32 rounding: a few units in the last place, never exactly everywhere
    torch.testing.assert_close(got32.double(), expected, rtol=2e-6, atol=0)


def test_the_two_pow_forms_are_the_same_computation_and_exp_log_is_not() -> None:
    a, b = inverse_frequencies(512, "torch_pow"), inverse_frequencies(512, "pow_operator")
    assert torch.equal(a, b)
    c = inverse_frequencies(512, "exp_log")
    assert not torch.equal(a, c)
    rel = ((c.double() - _formula(512)).abs() / _formula(512)).max().item()
    assert 2.0**-24 < rel < 2e-6  # exp_log in float32 is off by more than half an ulp, but not by much


def test_frequency_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="method"):
        inverse_frequencies(8, "log_exp")
    with pytest.raises(TypeError, match="dtype"):
        inverse_frequencies(8, "exp_log", torch.float16)
    with pytest.raises(ValueError, match="d_model"):
        inverse_frequencies(0)


@pytest.mark.parametrize("d_model", [2, 4, 16, 64])
@pytest.mark.parametrize("offset", [0, 1, 7, 40, -3])
def test_rotation_moves_every_position_by_the_offset(d_model: int, offset: int) -> None:
    pe = tl.sinusoidal_encoding(200, d_model, dtype=torch.float64)
    rotation = rotation_matrix(d_model, offset)
    start = max(0, -offset)
    positions = torch.arange(start, 150)
    moved = pe[positions] @ rotation.T  # rows: (P, D) @ (D, D) == (R @ PE(pos)^T)^T
    torch.testing.assert_close(moved, pe[positions + offset], rtol=0, atol=1e-12)


def test_rotation_is_orthogonal_and_composes() -> None:
    r3, r5 = rotation_matrix(10, 3), rotation_matrix(10, 5)
    torch.testing.assert_close(r3 @ r3.T, torch.eye(10, dtype=torch.float64), rtol=0, atol=1e-14)
    torch.testing.assert_close(rotation_matrix(10, -3), r3.T, rtol=0, atol=1e-14)
    torch.testing.assert_close(r5 @ r3, rotation_matrix(10, 8), rtol=0, atol=1e-12)
    torch.testing.assert_close(rotation_matrix(10, 0), torch.eye(10, dtype=torch.float64), rtol=0, atol=0)
    off_block = rotation_matrix(10, 3).clone()
    for i in range(5):
        off_block[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
    assert torch.count_nonzero(off_block) == 0  # block-diagonal
    assert rotation_matrix(4, 1, dtype=torch.float32).dtype == torch.float32


def test_rotation_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="even"):
        rotation_matrix(5, 1)
    with pytest.raises(TypeError, match="offset"):
        rotation_matrix(4, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="d_model"):
        rotation_matrix(-2, 1)


def test_learned_positions_equal_an_embedding_of_positions() -> None:
    torch.manual_seed(0)
    module = LearnedPositionalEmbedding(max_len=12, d_model=6).double()
    reference = nn.Embedding(12, 6).double()
    reference.load_state_dict(module.embedding.state_dict())
    x = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    out = module(x, start=4)
    expected = x + reference(torch.arange(4, 9))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)
    out.sum().backward()
    # each used row of the table gets gradient B (three sentences), unused rows none
    grad = module.embedding.weight.grad
    torch.testing.assert_close(grad[4:9], torch.full((5, 6), 3.0, dtype=torch.float64))
    assert grad[:4].abs().sum() == 0 and grad[9:].abs().sum() == 0
    assert [name for name, _ in module.named_parameters()] == ["embedding.weight"]
    assert 0.01 < module.embedding.weight.std().item() < 0.04  # nanoGPT's N(0, 0.02^2)


def test_learned_positions_refuse_unseen_positions_and_bad_input() -> None:
    module = LearnedPositionalEmbedding(max_len=8, d_model=4)
    module(torch.zeros(1, 8, 4))
    with pytest.raises(ValueError, match="max_len=8"):
        module(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match="max_len=8"):
        module(torch.zeros(1, 2, 4), start=7)
    with pytest.raises(ValueError, match="d_model=4"):
        module(torch.zeros(1, 2, 5))
    with pytest.raises(TypeError, match="floating-point"):
        module(torch.zeros(1, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        LearnedPositionalEmbedding(0, 4)
