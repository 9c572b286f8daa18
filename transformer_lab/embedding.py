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
import numbers

import torch
from torch import Tensor, nn

from transformer_lab._checks import (
    check_float,
    check_last_dim,
    check_like_module,
    check_positive_int,
    check_probability,
    check_tensor,
    check_tokens,
    is_trusted,
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
        if not is_trusted():  # a model's public call has checked the ids already
            check_tokens("tokens", tokens, self.vocab_size, device=self.embedding.weight.device)
        return self.embedding(tokens) * math.sqrt(self.d_model)  # (B, L, D)


def sinusoidal_encoding(max_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The (max_len, d_model) table of sinusoidal positional encodings (chapter 08).

    The frequencies 1 / 10000^(2i / d_model) are computed as exp(-2i * ln(10000) / d_model), one of
    note 002's three ways; chapter 08 compares the three. Computed in float64, then cast to `dtype`.
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
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
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model))  # (max_len, D)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        if not is_trusted():
            check_tensor("x", x, dim=3)
            check_float("x", x)
            check_last_dim("x", x, self.d_model)
            if x.device != self.pe.device:
                raise ValueError(
                    f"x is on {x.device} but the encoding table is on {self.pe.device}; move one with .to()"
                )
        length = x.shape[1]
        start = _position(start)
        if start < 0 or start + length > self.max_len:
            raise ValueError(
                f"sequence of length {length} starting at position {start} is longer than max_len={self.max_len}; "
                "build the model with a larger max_len"
            )
        return self.dropout(x + self.pe[start : start + length].to(x.dtype))  # (B, L, D)


def _position(start: object) -> int:
    """`start`, the position of a sequence's first vector, as an int: a Python or numpy int, or a 0-d integer
    tensor (read back once). A float, even 2.0, or a bool is refused: a position is a whole number."""
    if isinstance(start, Tensor) and start.dim() == 0 and not start.is_floating_point() and start.dtype != torch.bool:
        return int(start)
    if isinstance(start, bool) or not isinstance(start, numbers.Integral):
        raise TypeError(f"start must be an int (the position of x's first vector), got {start!r}")
    return int(start)


# --- Chapter 08 extras: the three denominators of note 002, the rotation of PE, learned positions ---

__all__ += ["FREQUENCY_METHODS", "inverse_frequencies", "rotation_matrix", "LearnedPositionalEmbedding"]

#: The three ways note 002 computes the frequencies 1 / 10000^(2i / d_model), by name.
FREQUENCY_METHODS = ("exp_log", "torch_pow", "pow_operator")


def inverse_frequencies(d_model: int, method: str = "exp_log", dtype: torch.dtype = torch.float32) -> Tensor:
    """The frequencies 1 / 10000^(2i / d_model) of the sinusoidal encoding, one per pair of dimensions (chapter 08).

    Note 002 lists three ways to compute them; all three are here, computed in `dtype` throughout so
    chapter 08 can compare them digit by digit:

    - "exp_log":      exp(2i * -(ln 10000 / d_model))       (the Annotated Transformer's form)
    - "torch_pow":    torch.pow(10000, -2i / d_model)
    - "pow_operator": 10000 ** (-2i / d_model)               (Python's `**`, which calls torch.pow)

    Args:
        d_model: D, any positive int (odd works: the last dimension gets a sine only).
        method: one of FREQUENCY_METHODS.
        dtype: torch.float32 (what note 002 uses) or torch.float64.

    Shape:
        -> (ceil(D / 2),): entry i is the frequency of dimensions 2i and 2i + 1.
    """
    check_positive_int("d_model", d_model)
    if method not in FREQUENCY_METHODS:
        raise ValueError(f"method must be one of {FREQUENCY_METHODS}, got {method!r}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    two_i = torch.arange(0, d_model, 2, dtype=dtype)  # (ceil(D/2),) the even indices 0, 2, 4, ...
    if method == "exp_log":
        return torch.exp(two_i * -(math.log(10000.0) / d_model))
    if method == "torch_pow":
        return torch.pow(10000, -two_i / d_model)
    return 10000 ** (-two_i / d_model)


def rotation_matrix(d_model: int, offset: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """The (D, D) matrix R_k with PE(pos + k) = R_k @ PE(pos) for every pos (chapter 08).

    Dimensions 2i and 2i + 1 hold (sin(pos * w_i), cos(pos * w_i)); moving k positions on turns that
    pair by the angle k * w_i, so R_k is block-diagonal with one 2 x 2 block per pair:
        [[ cos(k w_i), sin(k w_i)],
         [-sin(k w_i), cos(k w_i)]]
    R_k depends on k only, not on pos: this is why a linear map can attend by relative position.

    Args:
        d_model: D, even (with an odd D the last dimension is a sine without its cosine partner, and no
            matrix maps PE(pos) to PE(pos + k)).
        offset: k, any int (negative moves back; R_{-k} is the inverse, and the transpose, of R_k).
        dtype: dtype of the result (the frequencies are computed in float64 first).

    Shape:
        -> (D, D).
    """
    check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(
            f"d_model must be even for the rotation, got {d_model}: the last dimension of an odd d_model is a sine "
            "without its cosine partner, so PE(pos + k) is not a linear function of PE(pos) there"
        )
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {offset!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float64, got {dtype!r}")
    angles = offset * inverse_frequencies(d_model, "exp_log", torch.float64)  # (D/2,) k * w_i
    cos, sin = torch.cos(angles), torch.sin(angles)
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    rotation[0::2, 0::2] = torch.diag(cos)  # new sin <- cos(k w) * sin
    rotation[0::2, 1::2] = torch.diag(sin)  #          + sin(k w) * cos
    rotation[1::2, 0::2] = torch.diag(-sin)  # new cos <- -sin(k w) * sin
    rotation[1::2, 1::2] = torch.diag(cos)  #           + cos(k w) * cos
    return rotation.to(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Learned position embeddings: one trainable vector per position, as in GPT / nanoGPT's `wpe` (chapter 08).

    Note 004 reads nanoGPT, whose positions are an `nn.Embedding(block_size, n_embd)` added to the token
    embeddings. Unlike the sinusoidal table it is a parameter (trained, in the optimizer) and has nothing
    to say about positions >= max_len: there is no row for them.

    Args:
        max_len: the number of positions (nanoGPT's block_size).
        d_model: D.

    Shape:
        x (B, L, D) with start + L <= max_len -> (B, L, D).
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        check_positive_int("max_len", max_len)
        check_positive_int("d_model", d_model)
        self.max_len = max_len
        self.d_model = d_model
        self.embedding = nn.Embedding(max_len, d_model)  # (max_len, D), one row per position
        nn.init.normal_(self.embedding.weight, mean=0.0, std=0.02)  # nanoGPT's initialisation

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        if not is_trusted():  # a GPT's forward has checked its ids and the device already
            check_tensor("x", x, dim=3)
            check_float("x", x)
            check_last_dim("x", x, self.d_model)
            check_like_module("x", x, self, dtype=False)  # another float dtype is fine: the vectors are cast
        length = x.shape[1]
        start = _position(start)
        if start < 0 or start + length > self.max_len:
            raise ValueError(
                f"positions {start}..{start + length - 1} are beyond the {self.max_len} learned positions "
                f"(max_len={self.max_len}): a learned embedding has no vector for an unseen position"
            )
        positions = torch.arange(start, start + length, device=x.device)  # (L,)
        return x + self.embedding(positions).to(x.dtype)  # (B, L, D) + (L, D) broadcast
