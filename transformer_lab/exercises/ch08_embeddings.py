"""Exercises of chapter 08, embeddings and positional encoding (词嵌入与位置编码):
notebooks/08_embeddings_and_positional_encoding.ipynb.

1. `predict_notes_shape`: the shape note 000's forward gives for ids shaped (batch, seq_len, 1) (easy, predict).
2. `embedding_grad`: the gradient a look-up table receives, repeated ids included (medium, build).
3. `embed_and_encode`: note 000's model input (no sqrt(d_model), a table that breaks on an odd d_model) fixed
   (medium, debug the notes).
4. `rotary`: the rotation of section 5 applied to queries and keys instead of added to the input: rotary
   position embeddings (RoPE) (harder, transfer).

Used in the notebook as `from transformer_lab.exercises import ch08_embeddings as exercises`.
Shape legend: B batch, L positions, D d_model, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import transformer_lab as tl
from transformer_lab.embedding import PositionalEncoding, TokenEmbedding, rotation_matrix, sinusoidal_encoding
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.modern import RotaryEmbedding, rotate_halves, rotate_pairs

__all__ = ["predict_notes_shape", "embedding_grad", "embed_and_encode", "rotary"]


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- 1. predict: ids shaped (batch, seq_len, 1), as notes 000 and 001 describe them -------------------


def _notes_shape_reference() -> tuple[int, int, int, int]:
    # ids (2, 3, 1) -> the embedding appends D: (2, 3, 1, 8)
    # pe[:, :3] is (1, 3, 8); lined up from the right it is (1, 1, 3, 8)
    # broadcasting stretches every 1: (2, 3, 3, 8)
    return (2, 3, 3, 8)


predict_notes_shape = Exercise(
    "predict_notes_shape",
    reference=_notes_shape_reference,
    cases=[Case("your shape for table(ids) + pe[:, : 3], ids of shape (2, 3, 1)", lambda: ())],
    hints=[
        "Two steps: first the shape of table(ids), then the shape of that plus pe[:, : 3].",
        "nn.Embedding returns ids.shape + (D,): every id, wherever it sits, becomes a vector of D numbers. "
        "pe[:, : 3] has shape (1, 3, 8).",
        "The embedding is (2, 3, 1, 8). Broadcasting lines the two shapes up from the right, pads the shorter one "
        "with 1s in front, and stretches every axis of size 1: write (1, 3, 8) under (2, 3, 1, 8) and read off "
        "each axis.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: (2, 3, 8), lambda: (2, 3, 1, 8), lambda: (1, 3, 8), lambda: (2, 3, 1)],
    why=(
        "(2, 3, 3, 8): the embedding gives (2, 3, 1, 8), and the (1, 3, 8) slice of the encoding, read from the "
        "right as (1, 1, 3, 8), is stretched against it: every token of every sentence gets all three positions' "
        "encodings, a 3 x 3 grid of vectors per sentence. Nothing fails here; the error, if any, comes layers later."
    ),
    explain={
        (2, 3, 8): (
            "that is what ids of shape (batch, seq_len) = (2, 3) give. These ids have a trailing 1: what shape "
            "does the embedding return for them?"
        ),
        (2, 3, 1, 8): (
            "that is the embedding of the (2, 3, 1) ids, right. Now add pe[:, : 3], shape (1, 3, 8): broadcasting "
            "lines the shapes up from the right."
        ),
        (1, 3, 8): "that is the slice of the encoding that is added. What is it added to?",
        (2, 3, 1): "that is the ids themselves. The embedding turns every id into a vector of D = 8 numbers.",
    },
)


# --- 2. build: the gradient of a look-up table -------------------------------------------------------


def _embedding_grad_reference(tokens: Tensor, grad_out: Tensor, vocab_size: int) -> Tensor:
    d_model = grad_out.shape[-1]
    flat_ids = tokens.reshape(-1)  # (N,): every id used, repeats included
    flat_grad = grad_out.reshape(-1, d_model)  # (N, D): the gradient that reached each of those look-ups
    grad = torch.zeros(vocab_size, d_model, dtype=grad_out.dtype)  # (V, D): one row per row of the table
    # row v of the table was copied to every place where id v occurs, so its gradient is the SUM of theirs
    grad.index_add_(0, flat_ids, flat_grad)  # (V, D); rows of ids that never occur stay 0
    return grad


def _grad_overwrite(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    grad = torch.zeros(vocab_size, grad_out.shape[-1], dtype=grad_out.dtype)
    grad[tokens.reshape(-1)] = grad_out.reshape(-1, grad_out.shape[-1])  # a repeated id keeps one row only
    return grad


def _grad_mean(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    grad = _grad_reference_copy(tokens, grad_out, vocab_size)
    counts = torch.bincount(tokens.reshape(-1), minlength=vocab_size).clamp(min=1)  # (V,)
    return grad / counts.unsqueeze(1).to(grad.dtype)  # the mean over repeats, not the sum


def _grad_every_row(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    total = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)  # (D,)
    return total.expand(vocab_size, -1).clone()  # as if every row took part in every look-up


def _grad_scaled(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    d_model = grad_out.shape[-1]
    one_hot = nn.functional.one_hot(tokens.reshape(-1), vocab_size).to(grad_out.dtype)  # (N, V)
    return one_hot.T @ grad_out.reshape(-1, d_model) * math.sqrt(d_model)  # TokenEmbedding's scale: not here


def _grad_per_sentence(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    one_hot = nn.functional.one_hot(tokens, vocab_size).to(grad_out.dtype)  # (..., L, V): the batch axis kept
    return one_hot.transpose(-2, -1) @ grad_out  # (..., V, D): one gradient per sentence, never added up


def _copy(function):  # noqa: ANN001, ANN202
    """A distinct function with the reference's code: what a wrong answer that reuses it looks like."""
    return type(function)(function.__code__.replace(), function.__globals__, function.__name__)


_grad_reference_copy = _copy(_embedding_grad_reference)


def _grad_by_autograd(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    table = torch.zeros(vocab_size, grad_out.shape[-1], dtype=grad_out.dtype, requires_grad=True)
    with torch.enable_grad():
        (table[tokens] * grad_out).sum().backward()  # autograd's finished gradient
    return table.grad


def _grad_by_autograd_grad(tokens, grad_out, vocab_size):  # noqa: ANN001, ANN202
    layer = nn.Embedding(vocab_size, grad_out.shape[-1]).to(grad_out.dtype)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad((layer(tokens) * grad_out).sum(), layer.weight)
    return grad


def _grad_case(shape: tuple[int, ...], ids: list[int] | None, vocab: int, d_model: int, seed: int):  # noqa: ANN202
    def inputs() -> tuple[Tensor, Tensor, int]:
        generator = torch.Generator().manual_seed(seed)
        if ids is None:
            tokens = torch.randint(0, vocab, shape, generator=generator)
        else:
            tokens = torch.tensor(ids).reshape(shape)
        grad_out = torch.randn(*shape, d_model, generator=generator)  # (..., D)
        return tokens, grad_out, vocab

    return inputs


embedding_grad = Exercise(
    "embedding_grad",
    reference=_embedding_grad_reference,
    cases=[
        Case("every id once: (1, 4) ids, V = 6, D = 3", _grad_case((1, 4), [1, 2, 3, 4], 6, 3, seed=80)),
        Case("a repeated id: 'the cat and the dog'", _grad_case((1, 5), [1, 2, 3, 1, 4], 5, 4, seed=81)),
        Case("a batch (2, 6) with repeats across sentences", _grad_case((2, 6), None, 7, 5, seed=82)),
        Case("one id everywhere", _grad_case((3, 4), [2] * 12, 4, 2, seed=83)),
        Case("ids without a batch axis (L,), D = 1", _grad_case((5,), [0, 3, 0, 3, 3], 4, 1, seed=84)),
        Case("a vocabulary much larger than the batch", _grad_case((2, 3), None, 50, 4, seed=85)),
    ],
    hints=[
        "Forget autograd for a moment: which rows of the table did the forward pass read, and where did each "
        "one end up? Only those rows can have a gradient.",
        "Section 1 wrote the look-up as one_hot @ table. For a product out = A @ W, the gradient of W is "
        "A^T @ grad_out. Think about what A^T @ grad_out does when the same id occurs twice.",
        "Flatten the ids to (N,) and grad_out to (N, D). Start from a (V, D) zero tensor and ADD row n of the "
        "flat gradient into row ids[n], for every n: either one_hot(ids, V).T @ flat_grad, or the in-place "
        "index_add_ along dim 0 (plain assignment grad[ids] = ... keeps only one of the repeats).",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _grad_overwrite,
            "a repeated id kept the gradient of only one of its occurrences, as if the word had been read once: "
            "its row was copied to every place the id occurs, and each copy passed a gradient back.",
        ),
        Mistake(
            _grad_mean,
            "the gradients of a repeated id were averaged, as if its occurrences had shared one use of the row: "
            "each occurrence is a use of its own.",
        ),
        Mistake(
            _grad_every_row,
            "every row of the table received the gradient of every look-up: a row that was never read did not "
            "change the loss, so its gradient is zero.",
        ),
        Mistake(
            _grad_scaled,
            "the gradient was multiplied by sqrt(d_model): that factor belongs to tl.TokenEmbedding's forward, not "
            "to the plain look-up whose gradient is asked for here.",
        ),
        Mistake(
            _grad_per_sentence,
            "the gradient came back with one table per sentence: the whole batch reads one and the same table, so "
            "the answer is a single (V, D) gradient.",
        ),
    ],
    forbidden=["backward", "grad", "embedding", "embedding_backward", "embedding_dense_backward"],
    shortcuts=[_grad_by_autograd, _grad_by_autograd_grad],
)


# --- 3. debug the notes: note 000's model input ---------------------------------------------------


def notes_000_inputs(tokens: Tensor, weight: Tensor) -> Tensor:
    """Note 000's model input in the course's words: `wte(idx)`, then its PositionalEncoding's forward."""
    max_len, d_model = tokens.shape[1], weight.shape[1]
    tok_emb = weight[tokens]  # (B, L, D): wte(idx)
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)  # (L, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return tok_emb + pe[:max_len]  # x + pe[:, : x.size(1)]


def _embed_and_encode_reference(tokens: Tensor, weight: Tensor) -> Tensor:
    length, d_model = tokens.shape[1], weight.shape[1]
    tok_emb = weight[tokens] * math.sqrt(d_model)  # (B, L, D): the paper's scale (section 3.4)
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),): 0, 2, 4, ...
    angles = position / 10000 ** (two_i / d_model)  # (L, ceil(D/2))
    pe = torch.zeros(length, d_model, dtype=torch.float64)  # (L, D)
    pe[:, 0::2] = torch.sin(angles)  # ceil(D/2) even columns
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # floor(D/2) odd columns: an odd D ends on a sine
    return tok_emb + pe.to(weight.dtype)  # (B, L, D) + (L, D) -> (B, L, D)


def _inputs_scale_only(tokens, weight):  # noqa: ANN001, ANN202
    return notes_000_inputs(tokens, weight * math.sqrt(weight.shape[1]))  # still breaks on an odd d_model


def _inputs_odd_only(tokens, weight):  # noqa: ANN001, ANN202
    return _inputs_reference_copy(tokens, weight / math.sqrt(weight.shape[1]))  # no scale


def _inputs_scale_everything(tokens, weight):  # noqa: ANN001, ANN202
    d_model = weight.shape[1]
    unscaled = _inputs_reference_copy(tokens, weight / math.sqrt(d_model))
    return unscaled * math.sqrt(d_model)  # the encoding scaled as well


def _inputs_scale_by_vocab(tokens, weight):  # noqa: ANN001, ANN202
    v, d = weight.shape
    return _inputs_reference_copy(tokens, weight * math.sqrt(v) / math.sqrt(d))


def _inputs_divided(tokens, weight):  # noqa: ANN001, ANN202
    d_model = weight.shape[1]
    return _inputs_reference_copy(tokens, weight / d_model)  # the embedding shrunk by sqrt(d_model)


def _inputs_sin_cos_swapped(tokens, weight):  # noqa: ANN001, ANN202
    length, d_model = tokens.shape[1], weight.shape[1]
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    angles = position / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.cos(angles)  # cosines in the even columns
    pe[:, 1::2] = torch.sin(angles[:, : d_model // 2])
    return weight[tokens] * math.sqrt(d_model) + pe.to(weight.dtype)


def _inputs_no_lone_sine(tokens, weight):  # noqa: ANN001, ANN202
    length, d_model = tokens.shape[1], weight.shape[1]
    pairs = d_model // 2  # only the complete (sin, cos) pairs
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    angles = position / 10000 ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / d_model)  # (L, D // 2)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0 : 2 * pairs : 2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)  # an odd d_model's last column stays 0
    return weight[tokens] * math.sqrt(d_model) + pe.to(weight.dtype)


_inputs_reference_copy = _copy(_embed_and_encode_reference)


def _inputs_with_library(tokens, weight):  # noqa: ANN001, ANN202
    d_model = weight.shape[1]
    return weight[tokens] * math.sqrt(d_model) + tl.sinusoidal_encoding(tokens.shape[1], d_model).to(weight.dtype)


def _inputs_with_modules(tokens, weight):  # noqa: ANN001, ANN202
    vocab, d_model = weight.shape
    embed = TokenEmbedding(vocab, d_model).to(weight.dtype)
    with torch.no_grad():
        embed.embedding.weight.copy_(weight)
    return PositionalEncoding(d_model, max_len=tokens.shape[1]).to(weight.dtype)(embed(tokens))


def _inputs_case(batch: int, length: int, vocab: int, d_model: int, seed: int):  # noqa: ANN202
    def inputs() -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, vocab, (batch, length), generator=generator)  # (B, L)
        weight = torch.randn(vocab, d_model, generator=generator) * d_model**-0.5  # (V, D), tl's initialisation
        return tokens, weight

    return inputs


embed_and_encode = Exercise(
    "embed_and_encode",
    reference=_embed_and_encode_reference,
    cases=[
        Case("B = 2, L = 5, D = 8", _inputs_case(2, 5, 10, 8, seed=90)),
        Case("one sentence, L = 12, D = 16", _inputs_case(1, 12, 30, 16, seed=91)),
        Case("an odd d_model, D = 5", _inputs_case(2, 4, 7, 5, seed=92)),
        Case("D = 1: a single sine", _inputs_case(3, 6, 4, 1, seed=93)),
        Case("D = 2 and one position", _inputs_case(2, 1, 5, 2, seed=94)),
        Case("D = 7, L = 30", _inputs_case(1, 30, 9, 7, seed=95)),
    ],
    hints=[
        "There are two things to fix. Compare notes_000_inputs line by line with what sections 2 and 3 say goes "
        "into the encoder, and run it for a few values of d_model, odd ones too.",
        "One fix is in the token embedding (what does the paper do to it before the encoding is added?). The other "
        "shows up only when d_model is odd: count the columns pe[:, 0::2] and pe[:, 1::2] select, and the angles "
        "there are.",
        "Multiply weight[tokens] by sqrt(d_model). Build the angles pos / 10000^(2i / d_model) for the "
        "ceil(d_model / 2) even columns as note 000 does (float64 is safer); the sines fill every even column, and "
        "the cosines need only the first d_model // 2 columns of the angles.",
    ],
    level="medium",
    kind="debug",
    wrong=[notes_000_inputs, _inputs_scale_only],  # they fail as the no-scale mistake does, or raise
    mistakes=[
        Mistake(
            _inputs_odd_only,
            "the token embedding went in unscaled, as in note 000: without the factor of section 3.4 of the paper "
            "(section 2 here) the small embedding is drowned by the encoding.",
        ),
        Mistake(
            _inputs_divided,
            "the embedding was made smaller instead of larger: its entries have a standard deviation of about "
            "1/sqrt(d_model), and the paper's factor brings them up to the size of the encoding (section 2).",
        ),
        Mistake(
            _inputs_scale_everything,
            "the positional encoding was scaled too: the paper's factor applies to the token embedding only, and "
            "the encoding keeps its values between -1 and 1.",
        ),
        Mistake(
            _inputs_scale_by_vocab,
            "the embedding was scaled by the size of the vocabulary: the factor of section 3.4 depends on d_model, "
            "the length of a vector, not on how many rows the table has.",
        ),
        Mistake(
            _inputs_no_lone_sine,
            "the last column of an odd d_model got no value: it is the even column d_model - 1, which holds the sine "
            "of its pair; only its cosine partner is missing.",
        ),
        Mistake(
            _inputs_sin_cos_swapped,
            "the sines and the cosines changed places: in the paper's formula dimension 2i of each pair holds the "
            "sine and dimension 2i + 1 the cosine.",
        ),
    ],
    forbidden=[sinusoidal_encoding, PositionalEncoding, TokenEmbedding],
    shortcuts=[_inputs_with_library, _inputs_with_modules],
)


# --- 4. transfer: rotary position embeddings ------------------------------------------------------


def _rotary_reference(x: Tensor) -> Tensor:
    *_, length, d_model = x.shape
    if d_model % 2:
        raise ValueError(f"rotary needs an even d_model (pairs of dimensions), got {d_model}")
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,): omega_i
    theta = position * omega  # (L, D/2): the angle of pair i at position t
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    first, second = x[..., 0::2], x[..., 1::2]  # (..., L, D/2) each: the two members of every pair
    out = torch.empty_like(x)  # (..., L, D)
    out[..., 0::2] = first * cos - second * sin  # each pair turned by its angle, counter-clockwise
    out[..., 1::2] = first * sin + second * cos
    return out


def _rotary_parts(x):  # noqa: ANN001, ANN202
    *_, length, d_model = x.shape
    if d_model % 2:
        raise ValueError("d_model must be even")
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.arange(length, dtype=torch.float64).unsqueeze(1), omega


def _rotate_pairs(x, theta, sign=1.0):  # noqa: ANN001, ANN202
    cos, sin = theta.cos().to(x.dtype), (sign * theta.sin()).to(x.dtype)
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def _rotary_clockwise(x):  # noqa: ANN001, ANN202
    position, omega = _rotary_parts(x)
    return _rotate_pairs(x, position * omega, sign=-1.0)  # R_t of section 5 itself: turns the other way


def _rotary_halves(x):  # noqa: ANN001, ANN202
    position, omega = _rotary_parts(x)
    theta = position * omega
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]  # pairs (i, i + D/2): another layout than the chapter's
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def _rotary_from_one(x):  # noqa: ANN001, ANN202
    position, omega = _rotary_parts(x)
    return _rotate_pairs(x, (position + 1) * omega)  # positions counted from 1


def _rotary_one_frequency(x):  # noqa: ANN001, ANN202
    position, omega = _rotary_parts(x)
    return _rotate_pairs(x, position * torch.ones_like(omega))  # every pair turns by t radians


def _rotary_i_not_2i(x):  # noqa: ANN001, ANN202
    position, _ = _rotary_parts(x)
    d_model = x.shape[-1]
    omega = 10000 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)  # i where the formula has 2i
    return _rotate_pairs(x, position * omega)


def _rotary_overwritten(x):  # noqa: ANN001, ANN202
    position, omega = _rotary_parts(x)
    theta = position * omega
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    out = x.clone()
    out[..., 0::2] = out[..., 0::2] * cos - out[..., 1::2] * sin
    out[..., 1::2] = out[..., 0::2] * sin + out[..., 1::2] * cos  # reads the first member already turned
    return out


def _rotary_with_matrices(x):  # noqa: ANN001, ANN202
    d_model = x.shape[-1]
    rows = [x[..., t, :] @ rotation_matrix(d_model, -t).to(x.dtype).T for t in range(x.shape[-2])]
    return torch.stack(rows, dim=-2)


def _rotary_with_matrices_by_name(x):  # noqa: ANN001, ANN202
    rotation = getattr(tl.embedding, "rotation" + "_matrix")
    d_model = x.shape[-1]
    return torch.stack([rotation(d_model, -t).to(x.dtype) @ x[..., t, :, None] for t in range(x.shape[-2])], -3)[..., 0]


def _rotary_with_course_module(x):  # noqa: ANN001, ANN202 - chapter 11's rotary embedding
    return RotaryEmbedding(x.shape[-1], max_len=x.shape[-2])(x)


rotary = Exercise(
    "rotary",
    reference=_rotary_reference,
    cases=[
        Case("one vector per position, L = 4, D = 4", lambda: (_randn(4, 4, seed=70),)),
        Case("a batch (B, L, D) = (2, 5, 8)", lambda: (_randn(2, 5, 8, seed=71),)),
        Case("heads (B, H, L, d_k) = (2, 3, 6, 8)", lambda: (_randn(2, 3, 6, 8, seed=72),)),
        Case("D = 2: a single pair", lambda: (_randn(1, 7, 2, seed=73),)),
        Case("one position: nothing turns", lambda: (_randn(3, 1, 6, seed=74),)),
        Case("float64, L = 50, D = 16", lambda: (_randn(1, 50, 16, seed=75, dtype=torch.float64),), atol=1e-10),
        Case("an odd D has no pairs: raise ValueError", lambda: (_randn(1, 3, 5, seed=76),), raises=ValueError),
    ],
    hints=[
        "Section 5 turned the pair (sin a, cos a) by an angle. Here the pair is (x[..., 2i], x[..., 2i + 1]), any "
        "two numbers, and the angle of pair i at position t is t * omega_i, with the omega_i of the encoding.",
        "Build a (L, D/2) table of angles theta = position * omega by broadcasting, as the encoding does, and take "
        "its cos and sin. x[..., 0::2] and x[..., 1::2] are the first and second members of all pairs at once, "
        "shape (..., L, D/2), and they broadcast against (L, D/2).",
        "A turn by theta maps (a, b) to (a cos theta - b sin theta, a sin theta + b cos theta). Write the two "
        "results into the even and odd columns of a new tensor of x's shape and dtype (do not change x). Check "
        "the last axis first: an odd d_model raises ValueError.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _rotary_clockwise,
            "every pair turned the other way round, clockwise: section 5's R_k acts on (sin, cos) pairs and has its "
            "sines in the other places; the matrix of this exercise turns (x_2i, x_2i+1) counter-clockwise.",
        ),
        Mistake(
            _rotary_halves,
            "the pairs were made of dimensions i and i + D/2 (the split-in-halves layout of some libraries): this "
            "chapter pairs neighbours, dimensions 2i and 2i + 1.",
        ),
        Mistake(
            _rotary_from_one,
            "the positions were counted from 1: the first position is 0 and does not turn at all.",
        ),
        Mistake(
            _rotary_one_frequency,
            "every pair turned by the same angle t: each pair i has its own frequency omega_i, the first pair "
            "turning fastest.",
        ),
        Mistake(
            _rotary_i_not_2i,
            "the frequencies used i where the encoding's exponent has 2i, so every pair after the first turned too "
            "fast.",
        ),
        Mistake(
            _rotary_overwritten,
            "the second member of each pair was computed from the first member after it had already been turned: "
            "both new values come from the pair as it was.",
        ),
    ],
    forbidden=[rotation_matrix, RotaryEmbedding, rotate_pairs, rotate_halves],
    shortcuts=[_rotary_with_matrices, _rotary_with_matrices_by_name, _rotary_with_course_module],
)
