"""Exercises of chapter 08: embeddings and positional encoding.

    from transformer_lab.exercises import ch08_embeddings as exercises
    exercises.scaled_embedding.check(scaled_embedding)

1. `scaled_embedding(tokens, table)`: look up each token's row and scale it by sqrt(d_model).
2. `positional_encoding_table(max_len, d_model)`: the sinusoidal table from the formula, odd d_model included.
3. `offset_rotation(d_model, offset)`: the block-diagonal matrix R_k with PE(pos + k) = R_k @ PE(pos).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_lab.embedding import rotation_matrix, sinusoidal_encoding
from transformer_lab.exercises.core import Case, Exercise

__all__ = ["scaled_embedding", "positional_encoding_table", "offset_rotation"]


# --- 1. the embedding as a scaled look-up -------------------------------------------------------


def _scaled_embedding_reference(tokens: Tensor, table: Tensor) -> Tensor:
    """tokens (...) integer ids, table (V, D) -> (..., D): table[tokens] * sqrt(D)."""
    d_model = table.shape[-1]
    return table[tokens] * math.sqrt(d_model)  # (..., D)


def _table(vocab: int, d_model: int, seed: int) -> Tensor:
    return torch.randn(vocab, d_model, generator=torch.Generator().manual_seed(seed))


def _embedding_no_scale(tokens: Tensor, table: Tensor) -> Tensor:
    return table[tokens]


def _embedding_times_d(tokens: Tensor, table: Tensor) -> Tensor:
    return table[tokens] * table.shape[-1]


def _embedding_scale_by_vocab(tokens: Tensor, table: Tensor) -> Tensor:
    return table[tokens] * math.sqrt(table.shape[0])


scaled_embedding = Exercise(
    name="scaled_embedding",
    reference=_scaled_embedding_reference,
    cases=[
        Case("a batch of two sentences, D = 4", lambda: (torch.tensor([[1, 0, 3], [2, 2, 4]]), _table(5, 4, 0))),
        Case("one sentence without a batch axis (L,)", lambda: (torch.tensor([4, 1, 1, 0]), _table(6, 8, 1))),
        Case("a vocabulary much larger than d_model", lambda: (torch.tensor([[99, 0, 57]]), _table(100, 6, 2))),
        Case("an odd d_model (D = 5)", lambda: (torch.tensor([[0, 1], [2, 0]]), _table(3, 5, 3))),
        Case("d_model = 1", lambda: (torch.tensor([[2, 1, 0]]), _table(3, 1, 4))),
        Case("an empty sequence (B, 0)", lambda: (torch.zeros(2, 0, dtype=torch.long), _table(4, 4, 5))),
    ],
    hints=[
        """
    Indexing the (V, D) table with a tensor of ids picks one row per id: table[tokens] has shape
    tokens.shape + (D,). It is the same as one_hot(tokens, V).float() @ table. Then multiply by
    math.sqrt(D), where D is the table's last dimension (not the vocabulary size, not D itself).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_embedding_no_scale, _embedding_times_d, _embedding_scale_by_vocab],
)


# --- 2. the sinusoidal table from the formula ----------------------------------------------------


def _positional_encoding_reference(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model) float32: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(same)."""
    return sinusoidal_encoding(max_len, d_model, dtype=torch.float32)


def _pe_sin_cos_swapped(max_len: int, d_model: int) -> Tensor:
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    angles = position / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.cos(angles)
    pe[:, 1::2] = torch.sin(angles[:, : d_model // 2])
    return pe.float()


def _pe_i_instead_of_2i(max_len: int, d_model: int) -> Tensor:
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(0, (d_model + 1) // 2, dtype=torch.float64)  # i, where the formula has 2i
    angles = position / 10000 ** (i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _pe_notes_even_only(max_len: int, d_model: int) -> Tensor:
    """Note 000's recipe: right for even d_model, a shape error for odd d_model."""
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def _pe_every_dimension_its_own_frequency(max_len: int, d_model: int) -> Tensor:
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(d_model, dtype=torch.float64)  # each column k gets 10000^(k/D), pairs not shared
    angles = position / 10000 ** (k / d_model)
    pe = torch.where(k.long() % 2 == 0, torch.sin(angles), torch.cos(angles))
    return pe.float()


positional_encoding_table = Exercise(
    name="positional_encoding_table",
    reference=_positional_encoding_reference,
    cases=[
        Case("max_len = 6, d_model = 4", lambda: (6, 4)),
        Case("max_len = 50, d_model = 16", lambda: (50, 16), atol=1e-5),
        Case("a single position (max_len = 1)", lambda: (1, 8)),
        Case("an odd d_model (D = 5): the last column is a sine", lambda: (10, 5)),
        Case("d_model = 1", lambda: (7, 1)),
        Case("d_model = 2: one sine and one cosine", lambda: (9, 2)),
    ],
    hints=[
        """
    Make positions pos = 0..max_len-1 as a (max_len, 1) column and the even indices 2i = 0, 2, 4, ...
    as a row (torch.arange(0, d_model, 2)); the angle is pos / 10000 ** (2i / d_model), a
    (max_len, ceil(D/2)) table by broadcasting. Even columns pe[:, 0::2] get the sine, odd columns
    pe[:, 1::2] the cosine. With an odd d_model there is one fewer odd column than angles: use
    angles[:, : d_model // 2] for the cosines. Compute in float64, return float32.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_pe_sin_cos_swapped, _pe_i_instead_of_2i, _pe_notes_even_only, _pe_every_dimension_its_own_frequency],
)


# --- 3. the rotation that moves PE(pos) to PE(pos + k) --------------------------------------------


def _offset_rotation_reference(d_model: int, offset: int) -> Tensor:
    """(D, D) float64 R with PE(pos + offset) = R @ PE(pos); ValueError for an odd d_model."""
    return rotation_matrix(d_model, offset, dtype=torch.float64)


def _rotation_blocks(d_model: int, offset: int, transpose: bool, same_frequency: bool) -> Tensor:
    if d_model % 2:
        raise ValueError("d_model must be even")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    freqs = torch.ones_like(two_i) if same_frequency else 10000 ** (-two_i / d_model)
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(freqs.tolist()):
        c, s = math.cos(offset * w), math.sin(offset * w)
        block = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = block.T if transpose else block
    return rotation


def _rotation_backwards(d_model: int, offset: int) -> Tensor:
    return _rotation_blocks(d_model, offset, transpose=True, same_frequency=False)


def _rotation_one_frequency(d_model: int, offset: int) -> Tensor:
    return _rotation_blocks(d_model, offset, transpose=False, same_frequency=True)


def _rotation_no_odd_check(d_model: int, offset: int) -> Tensor:
    """Right for even d_model, but builds a matrix (ignoring the lone sine) instead of refusing an odd one."""
    even = d_model - d_model % 2
    rotation = torch.eye(d_model, dtype=torch.float64)
    rotation[:even, :even] = _rotation_blocks(even, offset, transpose=False, same_frequency=False)
    return rotation


offset_rotation = Exercise(
    name="offset_rotation",
    reference=_offset_rotation_reference,
    cases=[
        Case("d_model = 4, offset 1", lambda: (4, 1), atol=1e-10, rtol=1e-8),
        Case("d_model = 8, offset 5", lambda: (8, 5), atol=1e-10, rtol=1e-8),
        Case("offset 0 is the identity", lambda: (6, 0), atol=1e-10, rtol=1e-8),
        Case("a negative offset moves back", lambda: (8, -3), atol=1e-10, rtol=1e-8),
        Case("d_model = 2: a single 2 x 2 block", lambda: (2, 7), atol=1e-10, rtol=1e-8),
        Case("an odd d_model has no rotation: raise ValueError", lambda: (5, 2), raises=ValueError),
    ],
    hints=[
        """
    Pair i holds (sin(pos w_i), cos(pos w_i)) with w_i = 1 / 10000^(2i / d_model). The angle-addition
    formulas give sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b,
    so with b = offset * w_i the 2 x 2 block for rows/columns (2i, 2i + 1) is
        [[ cos b, sin b],
         [-sin b, cos b]].
    Put one block per pair on the diagonal of a (d_model, d_model) float64 zero matrix. An odd d_model
    leaves a sine without its cosine: raise ValueError.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_rotation_backwards, _rotation_one_frequency, _rotation_no_odd_check],
)
