"""Exercises of chapter 02 (masks), easy to harder, in notebook order.

1. `padding_mask_from_lengths` (easy, build): the (B, 1, 1, S) padding mask from sentence lengths.
2. `causal_mask_for_new_tokens` (medium, transfer): the causal mask of the T newest tokens against all S keys,
   as a decoder that keeps the keys of earlier tokens (a cache) needs it.
3. `predict_blind_query` (medium, predict): which query sees no key when our causal mask is handed to
   `nn.MultiheadAttention` (True = blocked) unchanged.
4. `masked_softmax` (medium, debug the notes): note 002's `masked_fill(mask == 0, -1e9)` leaks the future into
   a fully masked row and overflows in float16; the fixed masked softmax.
5. `is_causal` (harder, transfer): a causality tester, one position changed at a time.

The library's convention throughout: bool, True means "may attend".
Used in notebooks/02_masking.ipynb as `from transformer_lab.exercises import ch02_masking as exercises`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.masked
from torch import Tensor, nn
from torch.nn.modules import transformer as _torch_transformer

from transformer_lab import attention as _attention_module
from transformer_lab import masking as _masking
from transformer_lab.attention import attention as _attention_core
from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.masking import causal_mask, padding_mask, target_mask

__all__ = [
    "padding_mask_from_lengths",
    "causal_mask_for_new_tokens",
    "predict_blind_query",
    "masked_softmax",
    "is_causal",
]


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def _lengths(*values: int) -> Tensor:
    return torch.tensor(values, dtype=torch.long)


# --- 1. build: the padding mask from lengths ------------------------------------------------


def _lengths_reference(lengths: Tensor, max_len: int) -> Tensor:
    """True at positions 0..length-1 of each sentence: (B,) lengths -> (B, 1, 1, max_len)."""
    positions = torch.arange(max_len)  # (S,): 0, 1, ..., max_len - 1
    real = positions[None, :] < lengths[:, None]  # (1, S) < (B, 1) -> (B, S): True for real tokens
    return real[:, None, None, :]  # (B, 1, 1, S): broadcasts over heads and queries


def _lengths_off_by_one(lengths: Tensor, max_len: int) -> Tensor:
    return (torch.arange(max_len)[None, :] <= lengths[:, None])[:, None, None, :]  # one pad too many is "real"


def _lengths_flat(lengths: Tensor, max_len: int) -> Tensor:
    return torch.arange(max_len)[None, :] < lengths[:, None]  # (B, S): does not broadcast against (B, H, T, S)


def _lengths_inverted(lengths: Tensor, max_len: int) -> Tensor:
    return (torch.arange(max_len)[None, :] >= lengths[:, None])[:, None, None, :]  # True = padding


def _lengths_on_queries(lengths: Tensor, max_len: int) -> Tensor:
    return (torch.arange(max_len)[None, :] < lengths[:, None])[:, None, :, None]  # (B, 1, S, 1): masks queries


def _lengths_as_numbers(lengths: Tensor, max_len: int) -> Tensor:
    return (torch.arange(max_len)[None, :] < lengths[:, None]).long()[:, None, None, :]  # 1/0, not True/False


def _lengths_via_library(lengths: Tensor, max_len: int) -> Tensor:  # the finished version: no credit
    tokens = (torch.arange(max_len)[None, :] < lengths[:, None]).long()  # 1 = a real token, 0 = <pad>
    return padding_mask(tokens, pad_id=0)


def _lengths_via_getattr(lengths: Tensor, max_len: int) -> Tensor:
    tokens = torch.ones(len(lengths), max_len, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        tokens[b, n:] = 0
    return getattr(_masking, "padding" + "_mask")(tokens, 0)


padding_mask_from_lengths = Exercise(
    name="padding_mask_from_lengths",
    reference=_lengths_reference,
    cases=[
        Case("the batch of section 2: lengths [5, 3], max_len 5", lambda: (_lengths(5, 3), 5)),
        Case("one sentence of length 1, max_len 4", lambda: (_lengths(1), 4)),
        Case("three sentences, all shorter than max_len 6", lambda: (_lengths(4, 4, 2), 6)),
        Case("an empty sentence (length 0): no real token", lambda: (_lengths(0, 2), 3)),
    ],
    hints=[
        """
        Position s of sentence b is a real token exactly when s < lengths[b]. Build that comparison for every
        (b, s) pair at once, then give the result the shape the library uses for a padding mask.
        """,
        """
        torch.arange(max_len) gives the positions 0..max_len-1. Compare a (1, S) row of positions with a
        (B, 1) column of lengths: broadcasting gives the (B, S) table of comparisons.
        """,
        """
        The (B, S) bool table must become (B, 1, 1, S), one size-1 dimension for the heads and one for the
        queries, so that it masks KEYS. Index it with [:, None, None, :].
        """,
    ],
    level="easy",
    kind="build",
    mistakes=[
        Mistake(
            _lengths_off_by_one,
            "one position too many counts as a real token: positions are counted from 0, so position lengths[b] "
            "is already the first <pad>.",
        ),
        Mistake(
            _lengths_inverted,
            'True marks the <pad> positions: that is a "blocked" mask, but in the library\'s convention True '
            'means "may attend".',
        ),
        Mistake(
            _lengths_flat,
            "the (B, S) table of real tokens is right, but a (B, S) mask does not broadcast against the scores "
            "(B, H, T, S) the way the library's padding mask does.",
        ),
        Mistake(
            _lengths_on_queries,
            "the positions run along the third dimension, the queries: such a mask hides rows of the scores, but "
            "padding must hide keys, the last dimension.",
        ),
        Mistake(
            _lengths_as_numbers,
            "a mask of 1s and 0s: the library's masks are bool tensors (True = may attend), and `~mask` or "
            "`masked_fill` need one.",
        ),
    ],
    forbidden=[padding_mask, target_mask],
    shortcuts=[_lengths_via_library, _lengths_via_getattr],
)


# --- 2. transfer: the causal mask of the newest tokens --------------------------------------


def _new_tokens_reference(n_new: int, n_total: int) -> Tensor:
    """Query i is the token at position n_total - n_new + i; it may see keys 0 .. n_total - n_new + i."""
    past = n_total - n_new  # how many earlier tokens the keys hold before the new ones
    query_position = torch.arange(past, n_total)[:, None]  # (T, 1): where each new token stands
    key_position = torch.arange(n_total)[None, :]  # (1, S)
    return key_position <= query_position  # (T, S), True = may attend


def _new_tokens_top_left(n_new: int, n_total: int) -> Tensor:
    return torch.ones(n_new, n_total, dtype=torch.bool).tril()  # what is_causal=True builds: the first T rows


def _new_tokens_first_rows(n_new: int, n_total: int) -> Tensor:
    return torch.ones(n_total, n_total, dtype=torch.bool).tril()[:n_new]


def _new_tokens_strict(n_new: int, n_total: int) -> Tensor:
    return torch.ones(n_total, n_total, dtype=torch.bool).tril(diagonal=-1)[n_total - n_new :]  # not itself


def _new_tokens_square(n_new: int, n_total: int) -> Tensor:
    return torch.ones(n_new, n_new, dtype=torch.bool).tril()  # only the new keys


def _new_tokens_every_row(n_new: int, n_total: int) -> Tensor:
    return torch.ones(n_total, n_total, dtype=torch.bool).tril()  # a row for every token, not only the new ones


def _new_tokens_blocked(n_new: int, n_total: int) -> Tensor:
    query_position = torch.arange(n_total - n_new, n_total)[:, None]
    return torch.arange(n_total)[None, :] > query_position  # True at the future: PyTorch's "blocked" meaning


def _new_tokens_one_ahead(n_new: int, n_total: int) -> Tensor:
    query_position = torch.arange(n_total - n_new, n_total)[:, None]
    return torch.arange(n_total)[None, :] <= query_position + 1  # each query also sees the next key


def _new_tokens_library(n_new: int, n_total: int) -> Tensor:  # the finished causal mask, sliced: no credit
    return causal_mask(n_total)[n_total - n_new :]


def _new_tokens_getattr(n_new: int, n_total: int) -> Tensor:
    return getattr(_masking, "causal" + "_mask")(n_total)[-n_new:]


def _new_tokens_target_mask(n_new: int, n_total: int) -> Tensor:
    return target_mask(torch.ones(1, n_total, dtype=torch.long), pad_id=0)[0, 0, n_total - n_new :]


def _new_tokens_pytorch_square(n_new: int, n_total: int) -> Tensor:  # PyTorch's finished square mask
    return (nn.Transformer.generate_square_subsequent_mask(n_total) == 0)[n_total - n_new :]


causal_mask_for_new_tokens = Exercise(
    name="causal_mask_for_new_tokens",
    reference=_new_tokens_reference,
    cases=[
        Case("no cache: 4 new tokens, 4 keys (the ordinary causal mask)", lambda: (4, 4)),
        Case("one new token after 4 cached ones (5 keys)", lambda: (1, 5)),
        Case("2 new tokens, 5 keys", lambda: (2, 5)),
        Case("3 new tokens, 7 keys", lambda: (3, 7)),
        Case("a single token alone", lambda: (1, 1)),
    ],
    hints=[
        """
        Write down where each new token stands in the whole sequence. With n_total = 5 keys and n_new = 2
        queries, the queries are the tokens at positions 3 and 4. Which keys may each of them see?
        """,
        """
        Query i stands at position (n_total - n_new) + i, and a token may see every key at its own position or
        before it. The mask is the LAST n_new rows of the ordinary (n_total, n_total) causal mask, not the
        first ones.
        """,
        """
        Build it by comparing positions: a (T, 1) column of the queries' positions,
        torch.arange(n_total - n_new, n_total)[:, None], against a (1, S) row of key positions,
        torch.arange(n_total)[None, :]. Which comparison, key <= query or key < query, keeps the token itself?
        """,
    ],
    level="medium",
    kind="transfer",
    wrong=[_new_tokens_first_rows],  # gives what _new_tokens_top_left gives, on every input
    mistakes=[
        Mistake(
            _new_tokens_top_left,
            "these are the rows of the FIRST n_new tokens: the new tokens are the last ones of the sequence, so "
            "query i stands n_total - n_new positions further on than row i of a square causal mask.",
        ),
        Mistake(
            _new_tokens_strict,
            "no query may see its own position: a token attends to itself as well as to every earlier token.",
        ),
        Mistake(
            _new_tokens_square,
            "there is one column per new token only: the keys are all n_total tokens, the earlier ones kept in "
            "the cache as well as the new ones.",
        ),
        Mistake(
            _new_tokens_every_row,
            "there is one row for every token of the sequence: only the n_new newest tokens are queries here, so "
            "the mask has one row per new token (and one column per key).",
        ),
        Mistake(
            _new_tokens_blocked,
            "True marks the keys in each query's future: that is a \"blocked\" mask (PyTorch's meaning), but in "
            'the library\'s convention True means "may attend".',
        ),
        Mistake(
            _new_tokens_one_ahead,
            "each query also sees the key right after its own position: the boundary between past and future "
            "is off by one.",
        ),
    ],
    forbidden=[
        causal_mask,
        target_mask,
        nn.Transformer.generate_square_subsequent_mask,
        _torch_transformer._generate_square_subsequent_mask,
    ],
    shortcuts=[_new_tokens_library, _new_tokens_getattr, _new_tokens_target_mask, _new_tokens_pytorch_square],
    why="""
    The new tokens are the last rows of the full causal mask: row i is causal_mask(S)[S - T + i]. Careful:
    F.scaled_dot_product_attention(..., is_causal=True) builds torch.ones(T, S).tril(), aligned at the
    top-left corner, which for T < S is the mask of the FIRST T tokens. With a cache, pass this mask yourself.
    """,
)


# --- 3. predict: which query is blind when the mask is misread ------------------------------


def _blind_query_reference() -> int:
    """Our causal mask for T = 5, read by nn.MultiheadAttention as True = blocked: which query sees no key?"""
    # our row i is True at keys 0..i; read as "blocked", row i may see only keys i+1..4 (its future)
    # the last row, i = 4, is True everywhere: every key is blocked, softmax(-inf, ...) = NaN
    return 4


def _blind_query_first() -> int:
    return 0


def _blind_query_none() -> int:
    return -1


def _blind_query_middle() -> int:
    return 2


predict_blind_query = Exercise(
    name="predict_blind_query",
    reference=_blind_query_reference,
    cases=[Case("your prediction: the index (0 to 4) of the query row that may see no key", lambda: ())],
    hints=[
        """
        Write the 5 x 5 causal mask on paper (section 1 printed it as 1s and 0s). nn.MultiheadAttention reads
        each True as "this key is blocked for this query".
        """,
        """
        Flip every entry: a query may see exactly the keys where our mask says False. Row 0 of our mask is
        [True, False, False, False, False]: which keys does query 0 see once it is read as "blocked"?
        """,
        """
        A query sees no key at all when its row of our mask has no False left. Which row is that?
        """,
    ],
    level="medium",
    kind="predict",
    wrong=[_blind_query_first, _blind_query_none, _blind_query_middle],
    explain={
        0: "row 0 of our mask is True only at key 0 (itself). Read as 'blocked', that blocks key 0 alone: "
        "query 0 may then see every key after it, its whole future.",
        -1: "if -1 means 'no query': one query does end up with no key. If it means 'the last row': give the row's "
        "index counted from 0 (0 to 4), not a Python index from the end.",
        5: "the rows are numbered from 0, like the queries in section 1: the index is 0 to 4.",
        1: "flipped, row 1 of our mask blocks keys 0 and 1 only; the three keys after them are still visible.",
        2: "flipped, row 2 of our mask blocks keys 0, 1 and 2 only; the two keys after them are still visible.",
        3: "flipped, row 3 of our mask blocks keys 0 to 3 only; the one key after them is still visible.",
    },
    why="""
    Flipped, our causal mask lets every query see only its FUTURE (keys after it), and the last query, whose
    row is all True, sees nothing: its softmax is over -inf only, so its weights are NaN. Nothing raises:
    the mask has the right shape and dtype, only its meaning is reversed.
    """,
)


# --- 4. debug the notes: -1e9 leaks the future and overflows float16 -------------------------


def _masked_softmax_reference(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the keys a query may see (mask True); 0 elsewhere; an all-zero row if it may see none."""
    scores = scores.masked_fill(~mask, float("-inf"))  # (..., T, S): -inf exists in every float dtype
    weights = torch.softmax(scores, dim=-1)  # masked keys: e^(-inf) = 0; a fully masked row: 0/0 = NaN
    return weights.masked_fill(~mask, 0.0)  # masked positions, NaN rows included, become exactly 0


def _notes_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Note 002: masked_fill(mask == 0, -1e9), then softmax."""
    return torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1)


def _masked_softmax_nan_rows(scores: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # note 001 / 004: NaN rows


def _masked_softmax_finfo_min(scores: Tensor, mask: Tensor) -> Tensor:
    fill = torch.finfo(scores.dtype).min  # no overflow, but a fully masked row is still uniform
    return torch.softmax(scores.masked_fill(~mask, fill), dim=-1)


def _masked_softmax_in_float32(scores: Tensor, mask: Tensor) -> Tensor:
    weights = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1)  # never cast back
    return weights.masked_fill(~mask, 0.0)


def _masked_softmax_run(candidate: Callable[..., Any], scores: Tensor, mask: Tensor) -> tuple[Any, str]:
    """The weights, and their dtype (the check asks for the scores' dtype back: weights @ value needs it)."""
    weights = candidate(scores, mask)
    return weights, str(weights.dtype) if isinstance(weights, Tensor) else type(weights).__name__


def _masked_softmax_zero_after(scores: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1) * mask  # zeros, but the rows no longer sum to 1


def _masked_softmax_inverted(scores: Tensor, mask: Tensor) -> Tensor:
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)  # hides the keys it may see
    return weights.masked_fill(mask, 0.0)


def _masked_softmax_via_library(scores: Tensor, mask: Tensor) -> Tensor:  # the finished version: no credit
    size = scores.shape[-1]
    eye = torch.eye(size, dtype=scores.dtype)
    return scaled_dot_product_attention(scores * math.sqrt(size), eye, eye, mask)[1]  # scores @ I / sqrt(S)


def _masked_softmax_via_getattr(scores: Tensor, mask: Tensor) -> Tensor:
    size = scores.shape[-1]
    eye = torch.eye(size, dtype=scores.dtype)
    finished = getattr(_attention_module, "scaled_dot_product" + "_attention")
    return finished(scores * math.sqrt(size), eye, eye, mask=mask)[1]


def _masked_softmax_via_core(scores: Tensor, mask: Tensor) -> Tensor:  # the library's core attention
    size = scores.shape[-1]
    eye = torch.eye(size, dtype=scores.dtype)
    return _attention_core(scores * math.sqrt(size), eye, eye, mask)[1]


def _masked_softmax_torch_masked(scores: Tensor, mask: Tensor) -> Tensor:  # PyTorch's finished masked softmax
    return torch.masked.softmax(scores, -1, mask=mask.expand(scores.shape)).nan_to_num(0.0)


def _left_padded_mask() -> Tensor:
    tokens = torch.tensor([[0, 0, 1, 6, 7]])  # <pad> <pad> <s> cats sleep
    real = (tokens != 0)[:, None, None, :]  # (1, 1, 1, 5)
    return real & torch.ones(5, 5, dtype=torch.bool).tril()  # (1, 1, 5, 5): rows 0 and 1 see no real key


masked_softmax = Exercise(
    name="masked_softmax",
    reference=_masked_softmax_reference,
    run=_masked_softmax_run,
    cases=[
        Case(
            "a causal mask (5, 5), float32",
            lambda: (_randn(5, 5, seed=50), torch.ones(5, 5, dtype=torch.bool).tril()),
        ),
        Case(
            "a padding mask (2, 1, 1, 5) broadcast over (2, 2, 5, 5) scores",
            lambda: (
                _randn(2, 2, 5, 5, seed=51),
                torch.tensor([[True, True, True, True, True], [True, True, True, False, False]])[:, None, None, :],
            ),
        ),
        Case(
            "the left-padded sentence of section 5: rows 0 and 1 may see no key",
            lambda: (_randn(1, 1, 5, 5, seed=52), _left_padded_mask()),
        ),
        Case(
            "float16 scores with a causal mask",
            lambda: (_randn(4, 4, seed=53, dtype=torch.float16), torch.ones(4, 4, dtype=torch.bool).tril()),
            atol=2e-3,
            rtol=2e-3,
        ),
        Case(
            "float16 scores, left-padded",
            lambda: (_randn(1, 1, 5, 5, seed=54, dtype=torch.float16), _left_padded_mask()),
            atol=2e-3,
            rtol=2e-3,
        ),
    ],
    hints=[
        """
        Run the notes' version on the left-padded mask and look at rows 0 and 1: which keys get weight, and
        which of them are real tokens that come AFTER the query? Then try float16 scores.
        """,
        """
        Any finite fill value, -1e9 or torch.finfo(dtype).min, turns a row that is entirely masked into equal
        scores, hence equal weights over all its keys. Only -inf gives exactly 0 to a masked key, and -inf
        exists in every float dtype, float16 included. What does softmax make of a row that is all -inf?
        """,
        """
        After the softmax over -inf-filled scores, the only wrong entries are the NaN of the fully masked rows,
        and they sit exactly where the mask is False. One more masked_fill, with ~mask and 0.0, on the weights.
        """,
    ],
    level="medium",
    kind="debug",
    mistakes=[
        Mistake(
            _notes_masked_softmax,
            "a query that may see no key spreads its weight evenly over all the keys, the future and <pad> "
            "included: with a finite fill value such as -1e9, a fully masked row is a row of equal scores. "
            "(And -1e9 does not fit in float16.)",
        ),
        Mistake(
            _masked_softmax_finfo_min,
            "the fill value now fits in float16, but a query that may see no key still spreads its weight evenly "
            "over all the keys: any finite fill value leaves a fully masked row with equal scores.",
        ),
        Mistake(
            _masked_softmax_nan_rows,
            "a query that may see no key gets NaN weights: the softmax of a row that is -inf everywhere is 0 / 0, "
            "and the exercise asks for a row of zeros there.",
        ),
        Mistake(
            _masked_softmax_zero_after,
            "masked keys get weight 0, but the rows no longer sum to 1: the weights were zeroed after the "
            "softmax, so the keys left were never renormalised among themselves.",
        ),
        Mistake(
            _masked_softmax_inverted,
            "the keys a query may see got weight 0 and the masked ones got all of it: the mask was read as "
            'True = blocked, but in the library\'s convention True means "may attend".',
        ),
        Mistake(
            _masked_softmax_in_float32,
            "the weights are right, but float16 scores gave float32 weights: return them in the scores' dtype, "
            "or the attention's next step, weights @ value, fails for a float16 value.",
        ),
    ],
    output_names=["your output", "your output's dtype"],
    forbidden=[
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "_masked_softmax",
        scaled_dot_product_attention,
        _attention_core,
        torch.masked.softmax,
    ],
    shortcuts=[
        _masked_softmax_via_library,
        _masked_softmax_via_getattr,
        _masked_softmax_via_core,
        _masked_softmax_torch_masked,
    ],
)


# --- 5. transfer: a causality tester --------------------------------------------------------


def _is_causal_reference(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    """True if, for every t, changing input position t leaves fn's outputs at positions 0..t-1 unchanged."""
    base = fn(x)  # (B, T, D_out)
    length = x.shape[1]
    for t in range(length):  # change one position at a time: every position, not only the last
        changed = x.clone()
        changed[:, t] = changed[:, t] + 1.0  # a different token at position t
        out = fn(changed)  # (B, T, D_out)
        if not torch.equal(out[:, :t], base[:, :t]):  # an EARLIER output moved: it saw position t
            return False
    return True  # outputs at t and after may change: they are allowed to see position t


def _tester_last_only(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    changed = x.clone()
    changed[:, -1] = changed[:, -1] + 1.0  # section 6's test: blind to a leak between earlier positions
    return torch.equal(fn(changed)[:, :-1], fn(x)[:, :-1])


def _tester_includes_t(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    base = fn(x)
    for t in range(x.shape[1]):
        changed = x.clone()
        changed[:, t] = changed[:, t] + 1.0
        if not torch.equal(fn(changed)[:, : t + 1], base[:, : t + 1]):  # position t may see itself
            return False
    return True


def _tester_later(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    base = fn(x)
    for t in range(x.shape[1]):
        changed = x.clone()
        changed[:, t] = changed[:, t] + 1.0
        if not torch.equal(fn(changed)[:, t + 1 :], base[:, t + 1 :]):  # looks at the wrong side
            return False
    return True


def _tester_needs_own_change(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    base = fn(x)
    for t in range(x.shape[1]):
        changed = x.clone()
        changed[:, t] = changed[:, t] + 1.0
        out = fn(changed)
        if not torch.equal(out[:, :t], base[:, :t]) or torch.equal(out[:, t], base[:, t]):
            return False  # also demands that output t changes: not part of causality
    return True


def _tester_via_reference(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:  # the finished tester: no credit
    import transformer_lab.exercises.ch02_masking as chapter

    return getattr(chapter, "_is_causal" + "_reference")(fn, x)


def _tester_via_exercise(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    return is_causal.reference(fn, x)


def _causal_attention(x: Tensor) -> Tensor:
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    return scaled_dot_product_attention(x, x, x, mask=mask)[0]


def _full_attention(x: Tensor) -> Tensor:
    return scaled_dot_product_attention(x, x, x)[0]


def _leaky_attention(x: Tensor) -> Tensor:
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    mask[1, 3] = True  # one hole: query 1 may see key 3
    return scaled_dot_product_attention(x, x, x, mask=mask)[0]


def _running_mean(x: Tensor) -> Tensor:
    counts = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]  # (1, T, 1)
    return x.cumsum(dim=1) / counts  # position t: the mean of positions 0..t


def _first_peeks_at_second(x: Tensor) -> Tensor:
    out = x.clone()
    out[:, 0] = x[:, 0] + x[:, 1]  # position 0 sees position 1, and nothing else leaks
    return out


def _identity(x: Tensor) -> Tensor:
    return x.clone()


def _previous_token(x: Tensor) -> Tensor:
    out = torch.zeros_like(x)
    out[:, 1:] = x[:, :-1]  # position t shows token t-1: the strict past only
    return out


def _suffix_sum(x: Tensor) -> Tensor:
    return x.flip(1).cumsum(dim=1).flip(1)  # position t: the sum of positions t..T-1, the future


def _with_grad(candidate: Callable[..., object], *inputs: object) -> object:
    """Run the candidate with autograd on, as in a notebook: a tester may use gradients (the checker runs other
    exercises under no_grad)."""
    with torch.enable_grad():
        return candidate(*inputs)


def _tester_by_gradients(fn: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    """Another right answer: output s must have no gradient with respect to a later input position."""
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)  # (B, T, D_out)
    for s in range(x.shape[1]):
        (grad,) = torch.autograd.grad(out[:, s].sum(), x, retain_graph=True, allow_unused=True)
        if grad is not None and bool((grad[:, s + 1 :] != 0).any()):
            return False
    return True


is_causal = Exercise(
    name="is_causal",
    reference=_is_causal_reference,
    cases=[
        Case("attention with a causal mask (True)", lambda: (_causal_attention, _randn(1, 5, 4, seed=60))),
        Case("attention without a mask (False)", lambda: (_full_attention, _randn(1, 5, 4, seed=61))),
        Case("a running mean (True)", lambda: (_running_mean, _randn(2, 6, 3, seed=62))),
        Case("the identity (True)", lambda: (_identity, _randn(1, 4, 2, seed=63))),
        Case("output t shows token t-1 (True)", lambda: (_previous_token, _randn(1, 5, 2, seed=64))),
        Case("a suffix sum (False)", lambda: (_suffix_sum, _randn(1, 5, 2, seed=65))),
        Case("position 0 peeks at position 1 (False)", lambda: (_first_peeks_at_second, _randn(1, 6, 3, seed=66))),
        Case("a causal mask with one hole (False)", lambda: (_leaky_attention, _randn(2, 5, 4, seed=67))),
    ],
    hints=[
        """
        Section 6 changed only the last token. Which leaks can that test not see? Think of a function whose
        output at position 0 looks at position 1 and nowhere else.
        """,
        """
        Change ONE position t at a time, for every t from 0 to T-1 (clone x, add 1 to x[:, t]), and run fn on
        it. Which outputs must then be exactly as before, and which are allowed to change?
        """,
        """
        Position t may influence outputs t, t+1, ..., never 0..t-1. So for each t compare out[:, :t] with the
        unchanged run's [:, :t] (torch.equal); the first difference means "not causal". No difference for any
        t means causal.
        """,
    ],
    level="harder",
    kind="transfer",
    run=_with_grad,
    # a tester returns one bool, so a case can only say that some mistake gives the same wrong verdict: each
    # sentence starts from what the case shows (a leak missed, a causal function refused), which is true of
    # every tester that gives that verdict there, and the order makes each mistake named on a case of its own
    mistakes=[
        Mistake(
            _tester_last_only,
            "a function that leaks passed your test: its leak runs from an input before the last into an earlier "
            "output, and shows only when that input is changed and the earlier outputs compared (a test that "
            "changes only the last position, like section 6's, cannot see it).",
        ),
        Mistake(
            _tester_includes_t,
            "a causal function was called not causal: your test forbids a change that is allowed, such as output "
            "t changing when input t changes (a position may see itself); only the outputs before t must stay "
            "the same.",
        ),
        Mistake(
            _tester_needs_own_change,
            "a causal function was called not causal: when input t changes, the outputs from t on may change or "
            "stay the same (here output t shows token t-1 and stays); causality only forbids the EARLIER "
            "outputs to change.",
        ),
        Mistake(
            _tester_later,
            "a function that looks at the future passed your test: it compares the outputs after the changed "
            "position, which are allowed to change, instead of the ones before it.",
        ),
    ],
    shortcuts=[_tester_via_reference, _tester_via_exercise],
    why="""
    Changing only the last token tests one column of the table "which input moves which output"; the leak
    from position 1 into position 0 sits in another column. Causality is a promise about every pair (an
    earlier output, a later input), so the test must change every input position once.
    """,
)
