"""Exercises of chapter 01 (scaled dot-product attention), easy to harder, in notebook order.

1. `predict_zero_query` (easy, predict): the answer of the fruit look-up for the query [0, 0].
2. `softmax_rows` (easy, build): a numerically stable softmax over the last dimension.
3. `predict_output_shape` (medium, predict): the shape of the output of attention when T, S, d_k, d_v differ.
4. `attention` (medium, debug the notes): note 001's `attention()` has no mask; the fixed version takes one.
5. `distance_attention` (harder, transfer): attention whose scores are minus half the squared Euclidean
   distance (note 001's other similarity measure) instead of the dot product.

Used in notebooks/01_attention.ipynb as `from transformer_lab.exercises import ch01_attention as exercises`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab import attention as _attention_module
from transformer_lab.attention import attention as _attention_core
from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.multihead import MultiHeadAttention

__all__ = ["predict_zero_query", "softmax_rows", "predict_output_shape", "attention", "distance_attention"]


def _randn(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


# the fruit look-up of section 1 (the same numbers as the notebook)
FRUIT_KEYS = ((1.0, 0.2), (0.3, 1.0), (0.9, -0.8))  # apple, banana, cherry: (S=3, d_k=2)
FRUIT_PRICES = (3.0, 1.0, 8.0)  # their values (S=3, d_v=1)


# --- 1. predict: the answer for the query [0, 0] --------------------------------------------


def _zero_query_reference() -> float:
    """The soft look-up's answer for the query [0, 0] (apple 3.0, banana 1.0, cherry 8.0)."""
    # every score is [0, 0] . key = 0, whatever the key
    # softmax of three equal scores: e^0 / (e^0 + e^0 + e^0) = 1/3 for each key
    # the answer is the weighted average of the prices with equal weights: their plain mean
    return (3.0 + 1.0 + 8.0) / 3


def _zero_query_zero() -> float:
    return 0.0


def _zero_query_apple() -> float:
    return 3.0


def _zero_query_sum() -> float:
    return 12.0


predict_zero_query = Exercise(
    name="predict_zero_query",
    reference=_zero_query_reference,
    cases=[Case("your prediction for the query [0, 0]", lambda: ())],
    hints=[
        """
        Follow the three steps of the look-up by hand: the scores (one dot product per key), the weights
        (softmax of the scores), the answer (the weights times the prices, added up).
        """,
        """
        The query [0, 0] has a dot product of 0 with every key. What does softmax do with three equal scores?
        (e^0 = 1, and the weights must sum to 1.)
        """,
        """
        Every key gets the same weight, 1/3. The answer is 1/3 * 3.0 + 1/3 * 1.0 + 1/3 * 8.0: work it out.
        """,
    ],
    level="easy",
    kind="predict",
    wrong=[_zero_query_zero, _zero_query_apple, _zero_query_sum],
    explain={
        0: "the scores are all 0, but the weights are not: softmax turns three equal scores into three equal "
        "weights that sum to 1 (e^0 = 1, not 0). Zero weights cannot happen in a softmax.",
        3: "that is apple's price, as if apple had won. With the query [0, 0] no key scores higher than another.",
        1: "that is banana's price, as if banana had won. With the query [0, 0] no key scores higher than another.",
        8: "that is cherry's price, as if cherry had won. With the query [0, 0] no key scores higher than another.",
        12: "that is the sum of the prices. The weights sum to 1, so the answer is an average, not a sum.",
        1 / 3: "that is the weight of each key. The answer is a price: the weights times the prices, added up.",
    },
    why="""
    All three scores are 0, so softmax gives each key 1/3 and the answer is the plain mean of the values,
    (3 + 1 + 8) / 3 = 4. A query that prefers no key returns the average of all values: the softest look-up.
    """,
)


# --- 2. build: softmax over rows ------------------------------------------------------------


def _softmax_rows_reference(scores: Tensor) -> Tensor:
    """softmax(x)_j = exp(x_j - max x) / sum_k exp(x_k - max x), over the last dimension."""
    row_max = scores.max(dim=-1, keepdim=True).values  # (..., 1): the largest score of each row
    exps = (scores - row_max).exp()  # (..., S): the largest becomes e^0 = 1, nothing overflows
    return exps / exps.sum(dim=-1, keepdim=True)  # (..., S) / (..., 1): each row sums to 1


def _softmax_naive(scores: Tensor) -> Tensor:
    exps = scores.exp()  # overflows to inf for scores above ~88 (float32)
    return exps / exps.sum(dim=-1, keepdim=True)


def _softmax_wrong_dim(scores: Tensor) -> Tensor:
    exps = (scores - scores.max(dim=0, keepdim=True).values).exp()
    return exps / exps.sum(dim=0, keepdim=True)  # normalises each column, not each row


def _softmax_unnormalised(scores: Tensor) -> Tensor:
    return (scores - scores.max(dim=-1, keepdim=True).values).exp()


def _softmax_global_max(scores: Tensor) -> Tensor:
    exps = (scores - scores.max()).exp()  # one maximum for the whole tensor: small rows underflow to 0/0
    return exps / exps.sum(dim=-1, keepdim=True)


def _softmax_no_keepdim(scores: Tensor) -> Tensor:
    exps = (scores - scores.max(dim=-1, keepdim=True).values).exp()
    return exps / exps.sum(dim=-1)  # (n,) against (n, n): entry j of every row divided by row j's sum


def _softmax_total_sum(scores: Tensor) -> Tensor:
    exps = (scores - scores.max(dim=-1, keepdim=True).values).exp()
    return exps / exps.sum()  # one denominator for the whole tensor: right for a single row only


def _softmax_method(scores: Tensor) -> Tensor:  # the finished version, method form: no credit
    return scores.softmax(-1)


def _softmax_functional(scores: Tensor) -> Tensor:
    return F.softmax(scores, dim=-1)


def _softmax_via_log(scores: Tensor) -> Tensor:
    return torch.log_softmax(scores, dim=-1).exp()


def _softmax_module(scores: Tensor) -> Tensor:
    return torch.nn.Softmax(dim=-1)(scores)


def _softmax_via_logsumexp(scores: Tensor) -> Tensor:  # logsumexp does the stable part: no credit
    return (scores - scores.logsumexp(dim=-1, keepdim=True)).exp()


def _softmax_aten(scores: Tensor) -> Tensor:  # the operator underneath torch.softmax, by its overload
    return torch.ops.aten._softmax.default(scores, -1, False)


softmax_rows = Exercise(
    name="softmax_rows",
    reference=_softmax_rows_reference,
    cases=[
        Case("one row of three scores", lambda: (torch.tensor([[1.0, 2.0, 3.0]]),)),
        Case("a (4, 5) matrix: each row on its own", lambda: (_randn(4, 5, seed=1),)),
        Case("a square (4, 4) matrix: each row divided by its own sum", lambda: (_randn(4, 4, seed=4),)),
        Case("a batch (2, 3, 4): the last dimension only", lambda: (_randn(2, 3, 4, seed=2),)),
        Case("equal scores give equal weights", lambda: (torch.full((2, 4), 7.0),), hidden="scale"),
        Case("large scores (up to about 2000): no overflow", lambda: (_randn(3, 6, seed=3) * 1000.0,)),
        Case(
            "rows of very different sizes (one near 0, one near -2000)",
            lambda: (torch.tensor([[0.0, 1.0, 2.0], [-2000.0, -2001.0, -2002.0]]),),
        ),
    ],
    hints=[
        """
        softmax(s)_j = e^(s_j) / sum_k e^(s_k), along the LAST dimension of any tensor. Start with the plain
        formula of section 3 and make it work for a batch: which reduction gives each row's denominator?
        """,
        """
        Reduce over dim=-1 with keepdim=True: exps.sum(dim=-1, keepdim=True) has shape (..., 1), which
        broadcasts against (..., S), so every row is divided by its own sum, whatever the leading dimensions.
        """,
        """
        For scores of 1000, e^1000 overflows to inf and inf / inf is NaN. Subtract each row's own maximum,
        scores.max(dim=-1, keepdim=True).values, before exp(): the largest entry becomes e^0 = 1, and section 3
        showed that shifting a row does not change its softmax.
        """,
    ],
    level="easy",
    kind="build",
    mistakes=[
        Mistake(
            _softmax_naive,
            "e^x overflows to inf for large scores (inf / inf is NaN) and underflows to 0 when all of a row's "
            "scores are very negative (0 / 0): each row's scores must come near 0 before exp (if you did subtract "
            "a maximum, it was not each row's own), and section 3 showed that shifting a row changes nothing.",
        ),
        Mistake(
            _softmax_global_max,
            "each row was shifted by the largest score of the whole tensor, not by its own: a row far below that "
            "maximum underflows to 0 / 0.",
        ),
        Mistake(
            _softmax_wrong_dim,
            "each column was normalised, not each row: the reductions ran over the first dimension instead of "
            "the last.",
        ),
        Mistake(
            _softmax_unnormalised,
            "the rows do not sum to 1: the exponentials were never divided by their row's sum.",
        ),
        Mistake(
            _softmax_no_keepdim,
            "each row was divided by another row's sum: the row sums lost their summed dimension, so broadcasting "
            "lined them up along the last dimension and entry j of every row was divided by the sum of row j. A "
            "non-square matrix makes this an error; a square one hides it.",
        ),
        Mistake(
            _softmax_total_sum,
            "the whole tensor sums to 1, not each row: one denominator added up the exponentials of every row "
            "together.",
        ),
    ],
    forbidden=["softmax", "log_softmax", "_softmax", "_log_softmax", "logsumexp"],
    shortcuts=[
        _softmax_method,
        _softmax_functional,
        _softmax_via_log,
        _softmax_module,
        _softmax_via_logsumexp,
        _softmax_aten,
    ],
)


# --- 3. predict: the output's shape ---------------------------------------------------------


def _output_shape_reference() -> tuple[int, int, int]:
    """The shape of `output` for query (B, T, d_k), key (B, S, d_k), value (B, S, d_v)."""
    B, T, S, d_k, d_v = 2, 3, 5, 4, 2  # noqa: N806, F841 - the chapter's names, all of them
    # scores:  (B, T, d_k) @ (B, d_k, S) -> (B, T, S), one score per (query, key) pair
    # weights: softmax over the keys keeps the shape (B, T, S)
    # output:  (B, T, S) @ (B, S, d_v) -> (B, T, d_v), one mix of value rows per query
    return (B, T, d_v)


def _output_shape_d_k() -> tuple[int, int, int]:
    return (2, 3, 4)


def _output_shape_keys() -> tuple[int, int, int]:
    return (2, 5, 2)


def _output_shape_weights() -> tuple[int, int, int]:
    return (2, 3, 5)


predict_output_shape = Exercise(
    name="predict_output_shape",
    reference=_output_shape_reference,
    cases=[Case("your prediction for B=2, T=3, S=5, d_k=4, d_v=2", lambda: ())],
    hints=[
        """
        Follow the shapes through the two matrix products. A batched product (B, n, m) @ (B, m, p) gives
        (B, n, p): the shared size m disappears.
        """,
        """
        The scores Q K^T are (B, T, d_k) @ (B, d_k, S) -> (B, T, S): d_k disappears. The softmax keeps the
        shape.
        """,
        """
        The output is weights @ value, (B, T, S) @ (B, S, d_v). Which size disappears, and which are left?
        """,
    ],
    level="medium",
    kind="predict",
    wrong=[_output_shape_d_k, _output_shape_keys, _output_shape_weights],
    explain={
        (2, 3, 4): "the last size is d_k. d_k only has to agree between query and key, and it disappears in "
        "the dot products. The output is made of value rows.",
        (2, 5, 2): "that has one row per key. The output has one row per query: each query gets its own mix.",
        (2, 3, 5): "that is the shape of the weights (one weight per query and key). The output multiplies the "
        "weights by value, and the key dimension S disappears in that product.",
        (2, 5, 4): "that is the shape of key. The output has one row per query, made of value rows.",
        (2, 5, 5): "that is a (S, S) matrix per batch. The output has one row per query, made of value rows.",
        (3, 2): "the batch dimension B = 2 is still there: every matrix product here is batched.",
    },
    why="""
    weights (B, T, S) @ value (B, S, d_v) -> (B, T, d_v): one output row per query, a weighted average of
    the value rows, so it has the values' size d_v. d_k disappears in Q K^T, S disappears in weights @ V.
    """,
)


# --- 4. debug the notes: note 001's attention() has no mask ---------------------------------


def _attention_reference(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, masked keys getting weight 0; returns (output, weights)."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, S)
    if mask is not None:  # mask broadcasts to (..., T, S); True = may attend
        scores = scores.masked_fill(~mask, float("-inf"))  # e^(-inf) = 0: masked keys get weight exactly 0
    weights = torch.softmax(scores, dim=-1)  # (..., T, S), each row sums to 1 over the keys it may see
    return weights @ value, weights  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)


def _notes_attention(query: Tensor, key: Tensor, value: Tensor, dropout=None) -> tuple[Tensor, Tensor]:  # noqa: ANN001
    """Note 001's attention(): no mask argument (called with a mask, the mask lands in `dropout`)."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


def _attention_inverted_mask(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # hides the keys it may see
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_fill_zero(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)  # a score of 0 still gets weight e^0 / sum > 0
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_zero_after_softmax(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    if mask is not None:
        weights = weights * mask  # zeros, but the rows no longer sum to 1
    return weights @ value, weights


def _attention_mask_added(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores + mask  # a bool mask added: True adds 1, False adds 0, nothing is hidden
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_no_scale(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _attention_softmax_over_queries(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)  # each key's column sums to 1, over the queries
    return weights @ value, weights


def _attention_library(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:  # the finished version: no credit
    return scaled_dot_product_attention(query, key, value, mask)


def _attention_library_getattr(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    finished = getattr(_attention_module, "scaled_dot_product_" + "attention")
    return finished(query, key, value, mask=mask)


def _attention_library_core(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:  # the function tl.scaled_dot_product_attention calls after its checks: no credit
    return _attention_module.attention(query, key, value, mask)


def _attention_torch_fused(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask), weights


def _causal(t: int) -> Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def _scattered(t: int, s: int, seed: int) -> Tensor:
    mask = torch.rand(t, s, generator=torch.Generator().manual_seed(seed)) > 0.5
    mask[:, 0] = True  # every query may see at least one key
    return mask


attention = Exercise(
    name="attention",
    reference=_attention_reference,
    cases=[
        Case(
            "no mask, T=3, S=4, d_k=d_v=2",
            lambda: (_randn(3, 2, seed=20), _randn(4, 2, seed=21), _randn(4, 2, seed=22)),
        ),
        Case(
            "no mask, a batch, d_v=5 different from d_k=8",
            lambda: (_randn(2, 3, 8, seed=23), _randn(2, 6, 8, seed=24), _randn(2, 6, 5, seed=25)),
        ),
        Case(
            "a causal mask (4, 4): query i sees keys 0..i",
            lambda: (_randn(4, 4, seed=26), _randn(4, 4, seed=27), _randn(4, 4, seed=28), _causal(4)),
        ),
        Case(
            "a padding mask (2, 1, 5) broadcast over the 3 queries",
            lambda: (
                _randn(2, 3, 4, seed=29),
                _randn(2, 5, 4, seed=30),
                _randn(2, 5, 4, seed=31),
                torch.tensor([[[True, True, True, False, False]], [[True, True, True, True, True]]]),
            ),
        ),
        Case(
            "a scattered (3, 6) mask",
            lambda: (_randn(3, 4, seed=32), _randn(6, 4, seed=33), _randn(6, 3, seed=34), _scattered(3, 6, seed=35)),
        ),
    ],
    hints=[
        """
        The notes' function has nowhere to put a mask: add the parameter `mask=None`. Then ask where a mask can
        act: a masked key's weight must be exactly 0 and the other weights of its row must still sum to 1.
        Which step of attention could do both at once?
        """,
        """
        The softmax can: e^(-inf) = 0, and the remaining weights are renormalised among themselves. So change
        the SCORES where the mask is False, before the softmax, and leave the others alone. A mask smaller
        than the scores, such as (2, 1, 5) for scores (2, 3, 5), is stretched by broadcasting.
        """,
        """
        scores.masked_fill(condition, value) returns a copy of the scores with `value` wherever condition is
        True. The condition here is "may NOT attend", which is ~mask, and the value is float("-inf"). With
        mask=None, skip this step; everything else stays as in the notes' function.
        """,
    ],
    level="medium",
    kind="debug",
    wrong=[_notes_attention],  # called with a mask it raises: the mask lands in its `dropout` argument
    mistakes=[
        Mistake(
            _attention_inverted_mask,
            "the keys a query may see got weight 0 and the masked ones got all of it: the mask was read as "
            'True = blocked, but in the library\'s convention True means "may attend".',
        ),
        Mistake(
            _attention_fill_zero,
            "masked keys still get weight: a score of 0 is an ordinary score (e^0 = 1), so the softmax still "
            "gives those keys a share.",
        ),
        Mistake(
            _attention_zero_after_softmax,
            "masked keys get weight 0, but the rows no longer sum to 1: the weights were zeroed after the "
            "softmax, so the keys left were never renormalised among themselves.",
        ),
        Mistake(
            _attention_mask_added,
            "the bool mask was added to the scores. Adding works for note 001's mask, whose entries are 0 and -inf, "
            "but in a bool mask True counts as 1 and False as 0: a hidden key scores only 1 less than it would if "
            "visible, and keeps a share of the weight. A hidden key needs a score of -inf before the softmax.",
        ),
        Mistake(
            _attention_no_scale,
            "the weights are too peaked: the scores were not scaled by 1 / sqrt(d_k) as in the formula.",
        ),
        Mistake(
            _attention_softmax_over_queries,
            "each key's weights sum to 1 over the queries, not each query's over the keys: the softmax ran over "
            "the wrong dimension of the (..., T, S) scores.",
        ),
    ],
    output_names=["your first returned tensor (the output)", "your second returned tensor (the weights)"],
    forbidden=[
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        scaled_dot_product_attention,
        _attention_core,
        MultiHeadAttention,
    ],
    shortcuts=[_attention_library, _attention_library_getattr, _attention_torch_fused, _attention_library_core],
)


# --- 5. transfer: attention by distance -----------------------------------------------------


def _distance_attention_reference(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """Attention whose score for query i and key j is -||q_i - k_j||^2 / 2; returns (output, weights)."""
    diff = query[..., :, None, :] - key[..., None, :, :]  # (..., T, 1, d) - (..., 1, S, d) -> (..., T, S, d)
    scores = -0.5 * (diff * diff).sum(dim=-1)  # (..., T, S): closer keys score higher
    scores = scores - scores.max(dim=-1, keepdim=True).values  # far queries: the row's best becomes 0
    exps = scores.exp()  # (..., T, S)
    weights = exps / exps.sum(dim=-1, keepdim=True)  # (..., T, S), rows sum to 1
    return weights @ value, weights  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)


def _distance_dot_product(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    return weights @ value, weights  # the chapter's attention, not distance


def _distance_not_squared(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    diff = query[..., :, None, :] - key[..., None, :, :]
    weights = torch.softmax(-0.5 * (diff * diff).sum(dim=-1).sqrt(), dim=-1)
    return weights @ value, weights


def _distance_wrong_sign(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    diff = query[..., :, None, :] - key[..., None, :, :]
    weights = torch.softmax(0.5 * (diff * diff).sum(dim=-1), dim=-1)  # prefers the farthest key
    return weights @ value, weights


def _distance_no_shift(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    diff = query[..., :, None, :] - key[..., None, :, :]
    exps = (-0.5 * (diff * diff).sum(dim=-1)).exp()  # underflows to 0 for a far query: 0 / 0
    weights = exps / exps.sum(dim=-1, keepdim=True)
    return weights @ value, weights


def _distance_no_half(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    diff = query[..., :, None, :] - key[..., None, :, :]
    weights = torch.softmax(-(diff * diff).sum(dim=-1), dim=-1)
    return weights @ value, weights


def _distance_scaled(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    diff = query[..., :, None, :] - key[..., None, :, :]
    scores = -0.5 * (diff * diff).sum(dim=-1) / math.sqrt(query.shape[-1])  # dot-product attention's scaling
    return torch.softmax(scores, dim=-1) @ value, torch.softmax(scores, dim=-1)


def _distance_cdist(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:  # no credit
    weights = torch.softmax(-0.5 * torch.cdist(query, key) ** 2, dim=-1)
    return weights @ value, weights


def _distance_cdist_getattr(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    distances = getattr(torch, "cd" + "ist")(query, key)
    weights = torch.softmax(-0.5 * distances.pow(2), dim=-1)
    return weights @ value, weights


def _distance_via_library(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    # q . k - |k|^2 / 2 differs from -|q - k|^2 / 2 by -|q|^2 / 2, the same for every key of a row
    d = query.shape[-1]
    ones = torch.ones(*query.shape[:-1], 1, dtype=query.dtype)
    q_plus = torch.cat([query, ones], dim=-1) * math.sqrt(d + 1)
    k_plus = torch.cat([key, -0.5 * (key * key).sum(dim=-1, keepdim=True)], dim=-1)
    return scaled_dot_product_attention(q_plus, k_plus, value)


def _distance_via_library_core(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    d = query.shape[-1]
    ones = torch.ones(*query.shape[:-1], 1, dtype=query.dtype)
    q_plus = torch.cat([query, ones], dim=-1) * math.sqrt(d + 1)
    k_plus = torch.cat([key, -0.5 * (key * key).sum(dim=-1, keepdim=True)], dim=-1)
    return _attention_module.attention(q_plus, k_plus, value)  # the library's core, reached by another name


distance_attention = Exercise(
    name="distance_attention",
    reference=_distance_attention_reference,
    cases=[
        Case(
            "the fruit look-up, query [6, 1.5]",
            lambda: (torch.tensor([[6.0, 1.5]]), torch.tensor(FRUIT_KEYS), torch.tensor(FRUIT_PRICES)[:, None]),
        ),
        Case(
            "T=2 queries, S=3 keys, d=4, d_v=1",
            lambda: (_randn(2, 4, seed=40), _randn(3, 4, seed=41), _randn(3, 1, seed=42)),
        ),
        Case(
            "a batch: (2, 3, 4) queries, (2, 6, 4) keys, d_v=5",
            lambda: (_randn(2, 3, 4, seed=43), _randn(2, 6, 4, seed=44), _randn(2, 6, 5, seed=45)),
        ),
        Case(
            "a query equal to the second key",
            lambda: (torch.tensor([[0.3, 1.0]]), torch.tensor(FRUIT_KEYS), torch.tensor(FRUIT_PRICES)[:, None]),
        ),
        Case(
            "a query far from every key (squared distances about 10000)",
            lambda: (
                torch.tensor([[100.0, 0.0], [0.0, 1.0]]),
                torch.tensor(FRUIT_KEYS),
                torch.tensor(FRUIT_PRICES)[:, None],
            ),
        ),
    ],
    hints=[
        """
        Only the scores change. Build a (..., T, S) matrix whose entry (i, j) is -||q_i - k_j||^2 / 2, then
        finish as attention does: a softmax over the keys (the last dimension), then weights @ value.
        """,
        """
        All pairs at once by broadcasting: query[..., :, None, :] is (..., T, 1, d) and key[..., None, :, :]
        is (..., 1, S, d); their difference is (..., T, S, d), one difference vector per (query, key) pair.
        Square it and sum over the last dimension.
        """,
        """
        A far query has scores around -5000 for every key: e^(-5000) underflows to 0 and 0 / 0 is NaN. Use a
        softmax that subtracts each row's maximum (your softmax_rows, or torch.softmax). Then return
        (weights @ value, weights).
        """,
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _distance_dot_product,
            "these are the chapter's dot-product weights: here the scores must come from the distance between "
            "query and key, not from their dot product.",
        ),
        Mistake(
            _distance_not_squared,
            "the scores use the distance itself, not its square: a square root too many.",
        ),
        Mistake(
            _distance_wrong_sign,
            "the farthest key gets the most weight: the scores grow with the distance, but a closer key must "
            "score higher.",
        ),
        Mistake(
            _distance_no_half,
            "the weights are too peaked: the scores are the whole squared distance, without the factor 1/2.",
        ),
        Mistake(
            _distance_scaled,
            "the weights are too flat: the scores were divided by sqrt(d), as dot-product attention divides its "
            "scores, but this exercise's score is -||q - k||^2 / 2 with no further scaling.",
        ),
        Mistake(
            _distance_no_shift,
            "a query far from every key gets NaN weights: its scores are about -5000, e^(-5000) underflows to 0 "
            "for every key, and 0 / 0 is NaN.",
        ),
    ],
    output_names=["your first returned tensor (the output)", "your second returned tensor (the weights)"],
    forbidden=[
        "cdist",
        "pairwise_distance",
        "scaled_dot_product_attention",
        scaled_dot_product_attention,
        _attention_core,
    ],
    shortcuts=[_distance_cdist, _distance_cdist_getattr, _distance_via_library, _distance_via_library_core],
    why="""
    Expand the square: -||q - k||^2 / 2 = q . k - ||k||^2 / 2 - ||q||^2 / 2. The last term is the same for
    every key of a row, and a softmax ignores what a whole row shares (section 3). So attention by distance
    is dot-product attention (unscaled) with a penalty -||k||^2 / 2 on long keys: the dot product rewards a
    key that points the right way and is long; the distance rewards a key that is close.
    """,
)
