"""Exercises of chapter 11, from GPT-2 to a modern decoder (现代解码器): notebooks/11_modern_decoder.ipynb.

1. `soft_cap_logits`: Gemma 2's and nanochat's logit soft-cap, c tanh(z / c) (easy, build).
2. `predict_kv_cache_bytes`: the KV cache of Llama 3 8B's grouped-query attention at 8192 tokens (medium,
   predict).
3. `sliding_window_mask`: the mask of sliding-window attention, query i sees keys i - window < j <= i (medium,
   build).
4. `pairs_to_halves`: the rows of W^Q (or W^K) of a model trained with rotary pairs (2i, 2i+1), moved for the
   halves layout (i, i + d_k/2) of Hugging Face's checkpoints (medium, transfer).
5. `muon_update`: one Muon step for one weight matrix: momentum, Newton-Schulz, shape scaling (harder, build);
   checked in float64 against the published update and in float32 against `torch.optim.Muon` (bfloat16).

Used in the notebook as `from transformer_lab.exercises import ch11_modern as exercises`.
Shape legend: B batch, T positions, V vocabulary size, H heads, d_k head size, D d_model; a weight is
(out, in) as nn.Linear stores it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.hf import _halves_to_pairs
from transformer_lab.modern import sliding_window_mask as _library_window_mask
from transformer_lab.modern import soft_cap
from transformer_lab.muon import Muon, MuonAdamW, _reference_step, make_muon, muon_lr_scale, newton_schulz

__all__ = ["soft_cap_logits", "predict_kv_cache_bytes", "sliding_window_mask", "pairs_to_halves", "muon_update"]


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- 1. build: the logit soft-cap ------------------------------------------------------------------


def _soft_cap_reference(logits: Tensor, cap: float) -> Tensor:
    # tanh squashes into (-1, 1) and is close to the identity near 0: tanh(u) ~ u for small u.
    # Dividing by cap first and multiplying by cap after keeps small logits as they are and bends large
    # ones smoothly towards +-cap, never past it.
    return cap * torch.tanh(logits / cap)  # (..., V), the same shape


def _soft_cap_not_scaled_back(logits, cap):  # noqa: ANN001, ANN202
    return torch.tanh(logits / cap)


def _soft_cap_raw_tanh(logits, cap):  # noqa: ANN001, ANN202
    return cap * torch.tanh(logits)


def _soft_cap_clamped(logits, cap):  # noqa: ANN001, ANN202
    return torch.clamp(logits, -cap, cap)


def _soft_cap_multiplied_inside(logits, cap):  # noqa: ANN001, ANN202
    return cap * torch.tanh(logits * cap)


def _soft_cap_in_float32(logits, cap):  # noqa: ANN001, ANN202
    return (cap * torch.tanh(logits / cap)).float()


def _soft_cap_with_library(logits, cap):  # noqa: ANN001, ANN202
    return soft_cap(logits, cap)


soft_cap_logits = Exercise(
    "soft_cap_logits",
    reference=_soft_cap_reference,
    cases=[
        Case("small logits, cap 15", lambda: (torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0]), 15.0)),
        # -3 lies inside the cap: there a hard clip (which keeps it) and tanh of the raw logits (which gives
        # 15 tanh(-3), almost -15) part, so each of the two mistakes is told apart from the other here too.
        Case(
            "logits far beyond the cap, and one inside it",
            lambda: (torch.tensor([-300.0, -40.0, -3.0, 16.0, 60.0, 1000.0]), 15.0),
        ),
        Case("a row of logits (1, V), cap 30 as Gemma 2", lambda: (_randn(1, 12, seed=1100) * 40, 30.0)),
        Case(  # to float64's precision: an answer computed or returned in float32 fails here
            "(B, T, V) logits in float64",
            lambda: (_randn(2, 3, 7, seed=1101, dtype=torch.float64) * 20, 15.0),
            atol=1e-12,
            rtol=1e-10,
        ),
        Case("a small cap, 1.0", lambda: (_randn(4, 5, seed=1102) * 3, 1.0)),
    ],
    hints=[
        "torch.tanh squashes any number into (-1, 1), and near 0 it is almost the identity: tanh(u) ~ u.",
        "To squash into (-cap, cap) instead, scale the output of tanh by cap. What must the input of tanh be so "
        "that a small logit z comes out as about z again?",
        "Divide the logits by cap before tanh, multiply by cap after. Keep the shape and the dtype.",
    ],
    level="easy",
    kind="build",
    mistakes=[
        Mistake(
            _soft_cap_not_scaled_back,
            "every result lies in (-1, 1): the output of tanh was not scaled back by the cap.",
        ),
        Mistake(
            _soft_cap_raw_tanh,
            "tanh was taken of the raw logits: a logit of 2 became cap tanh(2), almost the cap itself, so small "
            "logits are no longer kept as they are.",
        ),
        Mistake(
            _soft_cap_multiplied_inside,
            "the logits were multiplied by the cap inside tanh: divide them by it instead, so that z / c is small for "
            "ordinary logits and the cap leaves them almost as they are.",
        ),
        Mistake(
            _soft_cap_in_float32,
            "the result is float32 while the logits were float64: keep the logits' dtype (no .float(), no float32 "
            "tensor made along the way).",
        ),
        Mistake(
            _soft_cap_clamped,
            "the logits were clipped at the cap (a hard clip, as torch.clamp does): every logit inside the cap came "
            "back unchanged and every one beyond it became exactly +-cap, with a zero gradient there. The soft-cap "
            "bends every logit a little, small ones hardly at all, and never has a corner.",
        ),
    ],
    forbidden=[soft_cap],
    why=(
        "For |z| much smaller than c the cap changes almost nothing (tanh(u) ~ u - u^3/3), and no logit gets past "
        "+-c, however large. nanochat caps its logits at 15; Gemma 2 caps its final logits at 30 and its attention "
        "scores at 50."
    ),
    shortcuts=[_soft_cap_with_library],
)


# --- 2. predict: the KV cache of a grouped-query model ----------------------------------------------


def _kv_cache_bytes_reference() -> int:
    layers, kv_heads, head_dim, tokens, bytes_per_number = 32, 8, 128, 8192, 2  # bfloat16: 2 bytes
    # Each layer keeps a key AND a value for every key/value head at every position: 2 x 8 x 8192 x 128 numbers.
    # The 32 query heads share the 8 key/value heads (4 each): the cache holds only the 8.
    return 2 * layers * kv_heads * tokens * head_dim * bytes_per_number  # 1,073,741,824 = 1 GiB


_KV_GIB = 1 << 30

predict_kv_cache_bytes = Exercise(
    "predict_kv_cache_bytes",
    reference=_kv_cache_bytes_reference,
    cases=[Case("your bytes for Llama 3 8B, one sequence of 8192 tokens, bfloat16", lambda: ())],
    hints=[
        "The cache keeps, in every layer, the keys and the values of every position so far. Which heads does it "
        "keep them for: the 32 query heads or the 8 key/value heads?",
        "Count the numbers of one layer first: (keys and values) x (key/value heads) x (positions) x (head size). "
        "Then all layers, then bytes: a bfloat16 number takes 2 bytes.",
        "2 x 8 x 8192 x 128 numbers per layer, times 32 layers, times 2 bytes.",
    ],
    level="medium",
    kind="predict",
    wrong=[
        lambda: 4 * _KV_GIB,
        lambda: _KV_GIB // 2,
        lambda: 2 * _KV_GIB,
        lambda: _KV_GIB // 32,
        lambda: _KV_GIB // 8,
        lambda: 1.0,
        lambda: _KV_GIB / 1e9,
    ],
    why=(
        "1,073,741,824 bytes, 1 GiB: 2 (keys, values) x 32 layers x 8 key/value heads x 8192 positions x 128 "
        "features x 2 bytes. With one key/value head per query head (multi-head attention) it would be 4 GiB; "
        "grouped-query attention shares each key/value head among 4 query heads and divides the cache by 4. "
        "The weights themselves take about 16 GB (15 GiB) in bfloat16, so about fifteen sequences of 8,192 tokens "
        "at once would need as much memory for their cache as the weights."
    ),
    explain={
        4 * _KV_GIB: "that is the cache of multi-head attention, one key/value head per query head: Llama 3 8B "
        "keeps keys and values for its 8 key/value heads only.",
        _KV_GIB // 2: "one factor of 2 is missing: either the values were left out (the cache keeps a key and a "
        "value for every key/value head and position), or this counts numbers, not bytes (a bfloat16 number takes "
        "2 bytes).",
        2 * _KV_GIB: "twice the cache: either 4 bytes a number (float32's; bfloat16 takes 2), or the keys alone of "
        "all 32 query heads, where the cache keeps a key and a value for each of the 8 key/value heads.",
        _KV_GIB // 32: "that is one layer's cache; each of the 32 layers has its own keys and values.",
        _KV_GIB // 8: "each of the 8 key/value heads keeps keys and values of its own: count every head.",
        1.0: "that is the size in GiB (gibibytes, 2^30 bytes each), not in bytes: the question asks for the number "
        "of bytes, an int, so leave out the conversion to GiB.",
        _KV_GIB / 1e9: "that is the size in GB (10^9 bytes each), not in bytes: the question asks for the number of "
        "bytes, an int, so leave out the conversion to GB.",
    },
)


# --- 3. build: the sliding-window mask ---------------------------------------------------------------


def _window_reference(size: int, window: int) -> Tensor:
    i = torch.arange(size).unsqueeze(1)  # (T, 1): each query's position
    j = torch.arange(size).unsqueeze(0)  # (1, T): each key's position
    # Two conditions: causal (no key after the query) and recent (the key is one of the `window` latest, the
    # query's own included: i - window + 1, ..., i).
    return (j <= i) & (j > i - window)  # (T, T) bool, True = may attend


def _positions(size: int) -> tuple[Tensor, Tensor]:
    return torch.arange(size).unsqueeze(1), torch.arange(size).unsqueeze(0)


def _window_one_too_wide(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return (j <= i) & (j >= i - window)  # window + 1 keys: the window counted without the query


def _window_one_too_narrow(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return (j <= i) & (j > i - window + 1)  # window - 1 keys


def _window_both_sides(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return (i - j).abs() < window  # a band around the diagonal: the future inside the window too


def _window_far_edge_only(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return j > i - window  # the window's far edge, and no causal condition: every later key too


def _window_ahead(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return (j >= i) & (j < i + window)  # the band above the diagonal: the query and the keys after it


def _window_strictly_before(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return (j < i) & (j >= i - window)  # the `window` keys strictly before the query: its own key left out


def _window_causal_only(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return j <= i  # the plain causal mask: the window forgotten


def _window_blocked(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    return ~((j <= i) & (j > i - window))  # True where the query may NOT look (PyTorch's "blocked" meaning)


def _window_additive(size, window):  # noqa: ANN001, ANN202
    i, j = _positions(size)
    allowed = (j <= i) & (j > i - window)
    return torch.zeros(size, size).masked_fill(~allowed, float("-inf"))  # a float mask added to the scores


def _window_with_library(size, window):  # noqa: ANN001, ANN202
    return _library_window_mask(size, window)


sliding_window_mask = Exercise(
    "sliding_window_mask",
    reference=_window_reference,
    cases=[
        Case("8 positions, a window of 3", lambda: (8, 3)),
        Case("6 positions, a window of 1: each token alone", lambda: (6, 1)),
        Case("5 positions, a window of 2", lambda: (5, 2)),
        Case("a window as long as the context, 6 of 6: the causal mask", lambda: (6, 6)),
        Case("a window longer than the context, 10 for 4", lambda: (4, 10)),
        Case("the modern model's: 64 positions, a window of 16", lambda: (64, 16)),
    ],
    hints=[
        "Compare positions, as for the causal mask: a column of query positions i, shape (size, 1), against a row "
        "of key positions j, shape (1, size). Two conditions must both hold for query i to see key j.",
        "One condition is causality: no key after the query. The other keeps only the `window` most recent keys, "
        "the query's own among them: with a window of 3, query 5 sees keys 3, 4 and 5, and not key 2.",
        "Combine the two boolean tensors with & (both must hold). Check row 5 of (8, 3): exactly three True, at "
        "columns 3, 4 and 5; and a window of 1 keeps the diagonal alone.",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _window_one_too_wide,
            "each query sees window + 1 keys: the window was counted as the keys before the query, and the query's "
            "own key came on top. Here the window counts the query itself (as Hugging Face's sliding_window does): "
            "a window of 3 is the query and the 2 keys before it.",
        ),
        Mistake(
            _window_one_too_narrow,
            "each query sees only window - 1 keys: the far edge of the window is one position too close. A window "
            "of 3 is the query and the 2 keys before it; a window of 1 is the query alone.",
        ),
        Mistake(
            _window_both_sides,
            "the window reaches into the future: query i also sees the keys after it, up to window - 1 positions "
            "ahead. A decoder's window lies only behind the query: keep the causal condition too.",
        ),
        Mistake(
            _window_far_edge_only,
            "every query sees every key after it: only the window's far edge was kept, and the causal condition "
            "(no key after the query) was lost.",
        ),
        Mistake(
            _window_ahead,
            "the band lies on the wrong side of the diagonal: each query sees itself and the keys AFTER it, the "
            "future. The window is the query and the keys just before it (rows are queries, columns keys).",
        ),
        Mistake(
            _window_strictly_before,
            "the diagonal is False: each query must see its own key, and the window counts it. A window of 3 is "
            "the query and the 2 keys before it, a window of 1 the query alone; yours holds the `window` keys before "
            "the query and not the query.",
        ),
        Mistake(
            _window_causal_only,
            "every query sees all the keys before it: this is the plain causal mask. The window also hides every "
            "key more than window - 1 positions back.",
        ),
        Mistake(
            _window_blocked,
            "True marks the keys a query may NOT see (PyTorch's \"blocked\" meaning): in the library's "
            'convention, as in every mask of this course, True means "may attend".',
        ),
        Mistake(
            _window_additive,
            "this is a float mask to add to the scores (0 where allowed, -inf elsewhere): the exercise asks for "
            "the boolean mask, True where the query may attend, as the library's masks are.",
        ),
    ],
    forbidden=[_library_window_mask],
    why=(
        "A window layer reads only the last `window` positions, so a cache for it needs only `window` keys and "
        "values, however long the text. What lies further back still reaches the query, through a full layer or "
        'through the windowed layers in turn: each reaches window - 1 positions further. nanochat\'s "SSSL" '
        "windows three layers of every four and keeps the last layer full; Mistral 7B windows every layer."
    ),
    shortcuts=[_window_with_library],
)


# --- 4. transfer: rotary pairs -> halves, rows of W^Q ------------------------------------------------


def _pairs_to_halves_reference(weight: Tensor, n_heads: int) -> Tensor:
    rows = weight.shape[0]
    d_k = rows // n_heads
    # Row h * d_k + 2i + m is member m (0 or 1) of pair i of head h: split the rows into those three indices.
    w = weight.reshape(n_heads, d_k // 2, 2, *weight.shape[1:])  # (H, d_k/2 pairs, 2 members, ...)
    # The halves layout keeps every head's first members first, then its second members: (H, 2, d_k/2, ...),
    # so member m of pair i moves to row m * d_k/2 + i of its head.
    return w.transpose(1, 2).reshape(weight.shape)  # (H * d_k, ...), within each head: 0, 2, 4, ..., 1, 3, 5, ...


def _halves_to_pairs_by_hand(weight, n_heads):  # noqa: ANN001, ANN202
    d_k = weight.shape[0] // n_heads
    w = weight.reshape(n_heads, 2, d_k // 2, *weight.shape[1:])  # the inverse: reads halves, writes pairs
    return w.transpose(1, 2).reshape(weight.shape)


def _pairs_to_halves_one_head(weight, n_heads):  # noqa: ANN001, ANN202
    rows = weight.shape[0]
    w = weight.reshape(rows // 2, 2, *weight.shape[1:])  # the whole matrix as one head
    return w.transpose(0, 1).reshape(weight.shape)


def _pairs_to_halves_heads_minor(weight, n_heads):  # noqa: ANN001, ANN202
    d_k = weight.shape[0] // n_heads
    w = weight.reshape(d_k, n_heads, *weight.shape[1:])  # the heads as the fast axis: row r is head r % n_heads
    return torch.cat([w[0::2], w[1::2]]).reshape(weight.shape)


def _pairs_to_halves_unchanged(weight, n_heads):  # noqa: ANN001, ANN202
    d_k = weight.shape[0] // n_heads
    return weight.reshape(n_heads, d_k // 2, 2, *weight.shape[1:]).reshape(weight.shape)  # no axis swapped


def _pairs_to_halves_columns(weight, n_heads):  # noqa: ANN001, ANN202
    if weight.dim() < 2:
        return weight.clone()
    return torch.cat([weight[:, 0::2], weight[:, 1::2]], dim=1)  # moves columns, for any number of them


def _pairs_to_halves_with_library(weight, n_heads):  # noqa: ANN001, ANN202
    d_k = weight.shape[0] // n_heads
    order = _halves_to_pairs(torch.arange(d_k, dtype=torch.float64), 1, d_k).long()  # the inverse's order
    inverse = torch.argsort(order)
    return weight.reshape(n_heads, d_k, *weight.shape[1:])[:, inverse].reshape(weight.shape)


pairs_to_halves = Exercise(
    "pairs_to_halves",
    reference=_pairs_to_halves_reference,
    cases=[
        Case("one head, d_k = 8, D = 3", lambda: (_randn(8, 3, seed=1110), 1)),
        Case("two heads, d_k = 8", lambda: (_randn(16, 5, seed=1111), 2)),
        Case("four heads, d_k = 6 (W^Q of a small model)", lambda: (_randn(24, 8, seed=1112), 4)),
        Case("a QK-norm gain (d_k,), one head, d_k = 12", lambda: (_randn(12, seed=1113) + 1, 1)),
        Case("W^K of 2 key/value heads, d_k = 10, float64", lambda: (_randn(20, 7, seed=1114, dtype=torch.float64), 2)),
    ],
    hints=[
        "Only the order of the rows changes, and only within each head: head h owns rows h * d_k to "
        "(h + 1) * d_k - 1, before and after.",
        "In the pairs layout, row 2i + m of a head is member m of pair i; in the halves layout, member m of pair i "
        "is row m * d_k/2 + i. Where do rows 0, 1, 2, 3 of a head with d_k = 8 go?",
        "reshape the rows into (heads, d_k/2 pairs, 2 members, ...), swap the pair and member axes, and reshape "
        "back to the weight's shape.",
    ],
    level="medium",
    kind="transfer",
    mistakes=[
        Mistake(
            _halves_to_pairs_by_hand,
            "the rows moved the other way round: this is the permutation from the halves layout to the pairs "
            "one (what tl.hf does when it reads a Hugging Face checkpoint into the pairs layout).",
        ),
        Mistake(
            _pairs_to_halves_one_head,
            "the whole matrix was treated as one head: each head's rows must stay inside that head's block, and "
            "each head has its own pairs.",
        ),
        Mistake(
            _pairs_to_halves_heads_minor,
            "the rows were split into heads the wrong way: head h owns the consecutive rows h * d_k to "
            "(h + 1) * d_k - 1, so reshape to (n_heads, d_k, ...), the heads first; (d_k, n_heads, ...) deals the "
            "rows out to the heads in turn.",
        ),
        Mistake(
            _pairs_to_halves_unchanged,
            "the rows came back in the order they came in: reshaping into pairs and back moves nothing until two "
            "axes are swapped. Within each head, the pairs' first members (rows 0, 2, 4, ...) go first, then their "
            "second members (rows 1, 3, 5, ...).",
        ),
        Mistake(
            _pairs_to_halves_columns,
            "the columns moved: RoPE turns pairs of output features of W^Q, which are its rows; its columns are "
            "the model's input features and stay where they are.",
        ),
    ],
    forbidden=[_halves_to_pairs],
    why=(
        "Moving the rows of W^Q and W^K the same way in every head leaves every score q . k unchanged, "
        "since both sides of the dot product move alike: the model is the same, only its features are stored in "
        "another order. W^V and W^O do not move. tl.hf applies the inverse permutation when it reads a Hugging "
        "Face checkpoint into the pairs layout."
    ),
    shortcuts=[_pairs_to_halves_with_library],
)


# --- 5. build: one Muon step -------------------------------------------------------------------------

#: torch.optim.Muon rounds Newton-Schulz to bfloat16: its update is 1-2 % (relative, Frobenius norm) away from the
#: exact one on these shapes (measured; tests/test_muon.py). A float32 update counts as torch's within 3 %.
TORCH_RTOL = 3e-2


def _muon_reference(weight: Tensor, grad: Tensor, buffer: Tensor, lr: float, momentum: float = 0.95) -> tuple:
    a, b, c = 3.4445, -4.7750, 2.0315  # the quintic's coefficients
    new_buffer = momentum * buffer + (1 - momentum) * grad  # M <- beta M + (1 - beta) G
    update = (1 - momentum) * grad + momentum * new_buffer  # Nesterov: U = (1 - beta) G + beta M
    tall = update.shape[0] > update.shape[1]
    x = update.T if tall else update  # (n, m) with n <= m: the Gram matrix x x^T is the smaller one
    x = x / (torch.sqrt((x * x).sum()) + 1e-7)  # Frobenius norm >= every singular value: now all <= 1
    for _ in range(5):
        gram = x @ x.T  # A = X X^T, (n, n)
        x = a * x + (b * gram + c * gram @ gram) @ x  # p(s) = a s + b s^3 + c s^5 on every singular value
    ortho = x.T if tall else x  # O ~ the orthogonal factor of U, (out, in)
    scale = math.sqrt(max(1.0, weight.shape[0] / weight.shape[1]))  # sqrt(max(1, out / in))
    return weight - lr * scale * ortho, new_buffer  # W <- W - lr s O, and the new momentum


def _muon_no_nesterov(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    return weight - lr * _scale(weight) * _ns(m), m  # steps along M itself


def _muon_gradient_only(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    return weight - lr * _scale(weight) * _ns(grad), m  # the momentum computed, then the step along G alone


def _muon_outputs_swapped(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return m, weight - lr * _scale(weight) * _ns(u)  # the right step, the pair in the other order


def _muon_swapped_momentum(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = (1 - momentum) * buffer + momentum * grad  # the weights of the average swapped
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * _scale(weight) * _ns(u), m


def _muon_not_normalised(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * _scale(weight) * _ns(u, normalise=False), m


def _muon_sgd_momentum(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + grad  # SGD's momentum: the whole gradient added, not (1 - beta) of it
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * _scale(weight) * _ns(u), m


def _muon_sgd_momentum_nesterov(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + grad  # as torch.optim.SGD(momentum=beta, nesterov=True) does it
    u = grad + momentum * m
    return weight - lr * _scale(weight) * _ns(u), m


_SGD_MOMENTUM_SAYS = (
    "the momentum added the whole gradient, beta M + G, as torch.optim.SGD's momentum does: Muon's momentum is an "
    "average, beta M + (1 - beta) G, the size of one gradient. Run from the start, yours grows to 1 / (1 - beta) "
    "times that (20 times for beta = 0.95): the buffer you return is too large, and next to a buffer kept as an "
    "average the new gradient weighs far too much in the update."
)
_SGD_NESTEROV_SAYS = _SGD_MOMENTUM_SAYS + (
    " Its Nesterov step, G + beta M as torch.optim.SGD(nesterov=True) takes it, adds the whole gradient again: "
    "Muon's is (1 - beta) G + beta M."
)


def _muon_no_scaling(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * _ns(u), m  # every shape moved by lr alone


def _muon_factor_inverted(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * math.sqrt(max(1.0, weight.shape[1] / weight.shape[0])) * _ns(u), m  # in / out


def _muon_factor_no_sqrt(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * max(1.0, weight.shape[0] / weight.shape[1]) * _ns(u), m


def _muon_factor_no_max(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * math.sqrt(weight.shape[0] / weight.shape[1]) * _ns(u), m


def _muon_through_float32(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    """The published step computed in float32 all along. Recognising a learner's wrong result in a float64 case, a
    check runs it right after the learner's answer on the same inputs: where that answer's result (`_LAST_FLOAT64`,
    kept by `_run_muon`, its inputs equal to these) is within float32's rounding of this step (rtol 1e-5), it
    returns that result, so that any float32 slip is named (a .float() anywhere, a float32 constant), whatever
    order its arithmetic ran in; otherwise this float32 step, which no float64 case accepts."""
    m = momentum * buffer.float() + (1 - momentum) * grad.float()
    u = (1 - momentum) * grad.float() + momentum * m
    slip = (weight.float() - lr * _scale(weight) * _ns(u), m)  # float32 from the first operation to the last
    last = _LAST_FLOAT64
    if not last or not all(torch.equal(a, b) for a, b in zip(last["inputs"][:3], (weight, grad, buffer), strict=True)):
        return slip
    if last["inputs"][3:] != (lr, momentum):
        return slip
    got = last["got"]
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, Tensor) for t in got)):
        return slip
    if not all(t.shape == weight.shape and t.is_floating_point() for t in got):
        return slip
    near = all(
        torch.allclose(t.detach().double(), s.double(), rtol=1e-5, atol=1e-7) for t, s in zip(got, slip, strict=True)
    )
    return tuple(got) if near else slip


def _muon_ascent(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight + lr * _scale(weight) * _ns(u), m  # uphill


def _scale(weight: Tensor) -> float:
    return math.sqrt(max(1.0, weight.shape[0] / weight.shape[1]))


def _ns(update: Tensor, normalise: bool = True) -> Tensor:
    """Five quintic Newton-Schulz steps, for the wrong answers above (each keeps its own mistake)."""
    x = update.T if update.shape[0] > update.shape[1] else update
    if normalise:
        x = x / (x.norm() + 1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    return x.T if update.shape[0] > update.shape[1] else x


def _muon_with_package(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    p = torch.nn.Parameter(weight.clone())
    optimizer = Muon([p], lr=lr, momentum=momentum)
    optimizer.state[p]["momentum_buffer"] = buffer.clone()
    p.grad = grad.clone()
    optimizer.step()
    return p.detach(), optimizer.state[p]["momentum_buffer"]


def _muon_with_torch(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    p = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.Muon([p], lr=lr, weight_decay=0.0, momentum=momentum)
    optimizer.state[p]["momentum_buffer"] = buffer.clone()
    p.grad = grad.clone()
    optimizer.step()
    return p.detach(), optimizer.state[p]["momentum_buffer"]


def _muon_with_newton_schulz(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    return weight - lr * muon_lr_scale(weight.shape) * newton_schulz(u), m


def _muon_with_reference(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    w, m = _reference_step(weight, grad, buffer, lr=lr, momentum=momentum)
    return w.to(weight.dtype), m.to(weight.dtype)


@functools.cache
def _torch_muon_result(shape: tuple[int, int], seed: int, later: bool, lr: float, momentum: float) -> tuple:
    """torch.optim.Muon's step (Newton-Schulz in bfloat16) on the float32 problem `_muon_problem` makes."""
    weight, grad, buffer = _muon_problem(shape, seed, later, torch.float32)
    p = torch.nn.Parameter(weight)
    optimizer = torch.optim.Muon([p], lr=lr, weight_decay=0.0, momentum=momentum)  # torch's default decay is 0.1
    optimizer.state[p]["momentum_buffer"] = buffer
    p.grad = grad
    optimizer.step()
    return p.detach().clone(), optimizer.state[p]["momentum_buffer"].clone()


def _muon_problem(shape: tuple[int, int], seed: int, later: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """A weight (0.1 scale), a gradient of norm well above 1e-7 and a momentum buffer (zero at the first step)."""
    g = torch.Generator().manual_seed(seed)
    weight = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
    grad = 20.0 * torch.randn(shape, generator=g, dtype=torch.float64)
    buffer = torch.zeros(shape, dtype=torch.float64)
    if later:  # a step after the first: the buffer holds an average of earlier gradients
        buffer = 2.0 * torch.randn(shape, generator=g, dtype=torch.float64)
    return weight.to(dtype), grad.to(dtype), buffer.to(dtype)


def _muon_case(name: str, shape: tuple[int, int], seed: int, later: bool = True, momentum: float = 0.95) -> Case:
    """float64: compared with the published update to 1e-9."""
    return Case(
        name,
        lambda: (*_muon_problem(shape, seed, later, torch.float64), 0.02, momentum),
        atol=1e-9,
        rtol=1e-9,
    )


def _torch_case(name: str, shape: tuple[int, int], seed: int, later: bool = True, momentum: float = 0.95) -> Case:
    """float32: compared with torch.optim.Muon's own step (see `_run_muon`); its inputs stay as they are in a
    graded class's hidden case, since torch's result is computed for them."""
    return Case(
        name,
        lambda: (
            *_muon_problem(shape, seed, later, torch.float32),
            0.02,
            momentum,
            tuple(t.clone() for t in _torch_muon_result(shape, seed, later, 0.02, momentum)),
        ),
        atol=1e-7,
        rtol=1e-6,
        hidden="same",
    )


#: The learner's last result in a float64 case and the inputs it came from (clones), kept by `_run_muon` for the
#: float32 slip's recogniser (`_muon_through_float32`): recognising a slip of float32's rounding needs a tolerance
#: of about 1e-5, where the case compares to 1e-9.
_LAST_FLOAT64: dict[str, Any] = {}


def _run_muon(
    candidate: Any,
    weight: Tensor,
    grad: Tensor,
    buffer: Tensor,
    lr: float,
    momentum: float,
    torch_result: tuple[Tensor, Tensor] | None = None,
) -> Any:
    """Call `candidate(weight, grad, buffer, lr, momentum)`.

    In a float64 case the result is also kept in `_LAST_FLOAT64`, with clones of its inputs, until the next call
    (the reference's is not kept): a check runs the learner's answer on a case, then the reference, then (where the
    answer failed) the known mistakes on the same inputs, the float32 slip (`_muon_through_float32`, which reads
    it) first of them.

    In a torch.optim.Muon case (`torch_result` given: torch's new weight and buffer) an answer within bfloat16's
    precision of torch's step counts as torch's step: when its update (new weight - weight) is within TORCH_RTOL of
    torch's (relative, Frobenius norm) and its buffer equals torch's to float32 rounding, torch's result is returned,
    which is what the check then compares (the reference's float32 step is such an answer: tested). Any other
    answer is returned as it is, and the check shows where it differs from torch's."""
    got = candidate(weight, grad, buffer, lr, momentum)
    if torch_result is None:
        # kept for the float32 slip's recogniser, which a check runs first of the mistakes after the learner's answer
        # and the reference (whose result, the expected one, is not kept: it is named, not reached, from here)
        if getattr(candidate, "__qualname__", None) != "_muon_reference" or candidate.__module__ != __name__:
            _LAST_FLOAT64.update(inputs=(weight.clone(), grad.clone(), buffer.clone(), lr, momentum), got=got)
        return got
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, Tensor) for t in got)):
        return got
    new_weight, new_buffer = got
    if new_weight.shape != weight.shape or new_buffer.shape != buffer.shape or new_weight.device != weight.device:
        return got
    if not (new_weight.is_floating_point() and new_buffer.is_floating_point()):
        return got
    torch_weight, torch_buffer = torch_result
    theirs = torch_weight.double() - weight.double()  # torch's update, (out, in)
    mine = new_weight.detach().double() - weight.double()
    close_update = bool((mine - theirs).norm() <= TORCH_RTOL * theirs.norm())
    close_buffer = torch.allclose(new_buffer.detach().double(), torch_buffer.double(), rtol=1e-5, atol=1e-6)
    return (torch_weight.clone(), torch_buffer.clone()) if close_update and close_buffer else got


muon_update = Exercise(
    "muon_update",
    reference=_muon_reference,
    cases=[
        _muon_case("the first step (zero momentum), a square matrix (float64)", (8, 8), seed=1120, later=False),
        _muon_case("a later step, a wide matrix (6, 12) (float64)", (6, 12), seed=1121),
        _muon_case("a tall matrix (12, 6) (float64)", (12, 6), seed=1122),
        _muon_case("momentum 0.9 (float64)", (10, 10), seed=1123, momentum=0.9),
        _torch_case("as torch.optim.Muon computes it, square (float32, bfloat16 Newton-Schulz)", (16, 16), seed=1124),
        _torch_case("as torch.optim.Muon computes it, tall (24, 8)", (24, 8), seed=1125),
    ],
    hints=[
        "Three steps, in this order: the momentum (an average of the gradients), the Newton-Schulz iteration on "
        "the Nesterov update, the step itself. Return new tensors; do not change weight, grad or buffer in place.",
        "Momentum: M = beta buffer + (1 - beta) grad, and the update U = (1 - beta) grad + beta M. Newton-Schulz: "
        "if U is tall, work on U.T; divide by its Frobenius norm + 1e-7; five times A = X X^T, "
        "X = a X + (b A + c A A) X with (a, b, c) = (3.4445, -4.7750, 2.0315); transpose back.",
        "The step: weight - lr * sqrt(max(1, out / in)) * O, where (out, in) is the weight's shape. Compute in "
        "the inputs' dtype (the float64 cases compare to 1e-9).",
    ],
    level="harder",
    kind="build",
    run=_run_muon,
    mistakes=[
        # first: a check tries the mistakes in this order, and this one reads the learner's result (_run_muon)
        Mistake(
            _muon_through_float32,
            "your step agrees with the published one to about seven digits, float32's precision, and no further: "
            "somewhere it went through float32 (a .float(), or a tensor made without dtype=, such as "
            "torch.tensor(3.4445) or torch.zeros(n), which are float32). Compute in the inputs' dtype: the float64 "
            "cases compare to 1e-9.",
        ),
        Mistake(
            _muon_no_nesterov,
            "the step followed the momentum M itself: the published update (Nesterov momentum, torch's default) "
            "orthogonalises (1 - beta) G + beta M, which looks one step ahead, with the M of this step (the new "
            "buffer, the gradient already averaged in): (1 - beta) G + beta times the OLD buffer is M itself.",
        ),
        Mistake(
            _muon_gradient_only,
            "the momentum was computed but not used: Newton-Schulz ran on the gradient alone. It runs on the "
            "update U = (1 - beta) G + beta M, which mixes the new gradient with the momentum (at the first step, "
            "with a zero buffer, the two point the same way, which is why that case passed).",
        ),
        Mistake(
            _muon_outputs_swapped,
            "your first output is the momentum buffer and your second the weight: return (new_weight, new_buffer).",
        ),
        Mistake(
            _muon_swapped_momentum,
            "the momentum kept 1 - beta of the old average and beta of the new gradient: the other way round, so "
            "it forgets almost everything at each step.",
        ),
        Mistake(_muon_sgd_momentum, _SGD_MOMENTUM_SAYS),
        Mistake(_muon_sgd_momentum_nesterov, _SGD_NESTEROV_SAYS),
        Mistake(
            _muon_not_normalised,
            "Newton-Schulz started from the unscaled update: its singular values must first be brought below 1 "
            "(divide by the Frobenius norm), or the polynomial drives them away from 1 instead of towards it.",
        ),
        Mistake(
            _muon_no_scaling,
            "the tall matrix moved by lr alone: Muon multiplies the step of a matrix with more rows than columns "
            "by sqrt(out / in), rows over columns, so that its update has a comparable size.",
        ),
        Mistake(
            _muon_factor_inverted,
            "the wide matrix's step was scaled up: the factor is sqrt(max(1, out / in)), rows over columns, so a "
            "matrix with fewer rows than columns keeps a factor of 1; columns over rows inverts it.",
        ),
        Mistake(
            _muon_factor_no_sqrt,
            "the tall matrix's factor is too large: it is the square root of out / in (rows over columns), not "
            "the ratio itself.",
        ),
        Mistake(
            _muon_factor_no_max,
            "the wide matrix's step was scaled down: the factor never goes below 1, sqrt(max(1, out / in)); a "
            "matrix with fewer rows than columns keeps 1.",
        ),
        Mistake(
            _muon_ascent,
            "the weight moved uphill: the step is subtracted, as in gradient descent.",
        ),
    ],
    forbidden=[Muon, MuonAdamW, make_muon, newton_schulz, muon_lr_scale, _reference_step, torch.optim.Muon],
    output_names=["your new weight", "your new momentum buffer"],
    why=(
        "The momentum averages the gradients; Newton-Schulz moves every singular value of the update towards 1, "
        "so the step moves the matrix along all its directions alike rather than mostly along the few largest; "
        "the shape factor gives tall and wide matrices steps of comparable size. torch.optim.Muon computes the "
        "same five steps in bfloat16, which is why it agrees with you only to about 2 %."
    ),
    shortcuts=[_muon_with_package, _muon_with_torch, _muon_with_newton_schulz, _muon_with_reference],
)
