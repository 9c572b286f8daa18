"""Token embeddings (词嵌入) and sinusoidal positional encoding (位置编码) (chapter 08).

TokenEmbedding: a look-up table of vocab_size vectors, multiplied by sqrt(d_model)
(paper, section 3.4).

PositionalEncoding (paper, section 3.5):
    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
kept in a buffer `pe`: saved in the state dict and moved by `.to()`, but not a parameter.

Shape legend: B batch, L sequence length, D d_model, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lab._checks import (
    check_float,
    check_last_dim,
    check_positive_int,
    check_probability,
    check_tensor,
    check_tokens,
)

__all__ = ["TokenEmbedding", "PositionalEncoding", "sinusoidal_encoding"]


class TokenEmbedding(nn.Module):
    """Look up each token id's vector and scale it by sqrt(d_model) (chapter 08).

    Shape:
        tokens (B, L) integer ids in [0, vocab_size) -> (B, L, D).
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("d_model", d_model)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)  # the table, (V, D)

    def forward(self, tokens: Tensor) -> Tensor:
        check_tokens("tokens", tokens, self.vocab_size)
        return self.embedding(tokens) * math.sqrt(self.d_model)  # (B, L, D)


def sinusoidal_encoding(max_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The (max_len, d_model) table of sinusoidal positional encodings (chapter 08).

    The frequencies 1 / 10000^(2i / d_model) are computed as exp(-2i * ln(10000) / d_model), one of
    note 002's three ways; chapter 08 compares the three. Computed in float64, then cast to `dtype`.
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    inv_freq = torch.exp(-two_i * math.log(10000.0) / d_model)  # 1 / 10000^(2i/D)
    angles = position * inv_freq  # (max_len, ceil(D/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(dtype)


class PositionalEncoding(nn.Module):
    """Add the sinusoidal positional encoding, then dropout (chapter 08).

    Args:
        d_model: D.
        max_len: the longest sequence it can encode.
        dropout: dropout after adding the encoding (0.1 in the paper).

    Shape:
        x (B, L, D) with L + start <= max_len -> (B, L, D). `start` is the position of x's first
        vector (non-zero when decoding one token at a time with a cache).
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        check_probability("dropout", dropout)
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model))  # (max_len, D)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        check_tensor("x", x, dim=3)
        check_float("x", x)
        check_last_dim("x", x, self.d_model)
        length = x.shape[1]
        if isinstance(start, bool) or not isinstance(start, int):
            raise TypeError(f"start must be an int (the position of x's first vector), got {start!r}")
        if start < 0 or start + length > self.max_len:
            raise ValueError(
                f"sequence of length {length} starting at position {start} is longer than max_len={self.max_len}; "
                "build the model with a larger max_len"
            )
        return self.dropout(x + self.pe[start : start + length].to(x.dtype))  # (B, L, D)
