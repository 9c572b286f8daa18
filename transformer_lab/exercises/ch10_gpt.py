"""Exercises of chapter 10, the decoder-only GPT (仅解码器): notebooks/10_gpt.ipynb.

1. `predict_masked_entries`: how many scores note 004's `tril` mask sets to -inf for T = 5 (easy, predict).
2. `conv1d_qkv_heads`: q, k, v heads from GPT-2's checkpoint layout, a Conv1D weight (D, 3D) (medium, build).
3. `predict_gpt_parameters`: the parameter count of the chapter's GPT with a tied head (medium, predict).
4. `top_p_filter`: nucleus (top-p) filtering of a row of logits from primitives (harder, transfer).

Used in the notebook as `from transformer_lab.exercises import ch10_gpt as exercises`.
Shape legend: B batch, T positions, D d_model, H heads, d_k = D / H, V vocabulary size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.gpt import GPT, filter_logits

__all__ = ["predict_masked_entries", "predict_gpt_parameters", "conv1d_qkv_heads", "top_p_filter"]


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- 1. predict: the entries the tril mask removes ------------------------------------------------


def _masked_entries_reference() -> int:
    # tril(ones(5, 5)) keeps row t's keys 0..t: 1 + 2 + 3 + 4 + 5 = 15 of the 25 entries.
    # masked_fill(bias == 0, -inf) sets the other 25 - 15 = 10 (the strict upper triangle) to -inf.
    return 10


predict_masked_entries = Exercise(
    "predict_masked_entries",
    reference=_masked_entries_reference,
    cases=[Case("your count for T = 5", lambda: ())],
    hints=[
        "Draw the (5, 5) matrix torch.tril(torch.ones(5, 5)): which entries are 0?",
        "Row t (query t) keeps the keys 0, ..., t: how many entries does row 0 keep, row 1, ..., row 4?",
        "The kept entries add up to 1 + 2 + 3 + 4 + 5; every other entry of the 25 becomes -inf.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: 15, lambda: 25, lambda: 5, lambda: 20],
    why=(
        "10 = T (T - 1) / 2: the strict upper triangle, every key after its query. The diagonal stays: a "
        "character may look at itself. With T = 64 that is 2016 of the 4096 scores."
    ),
    explain={
        15: "that is how many entries the mask KEEPS (the ones of tril, diagonal included).",
        25: "not every entry: query t still sees the keys 0, ..., t.",
        20: "the diagonal is kept: masked_fill only touches the entries where the tril buffer is 0.",
        5: "that is the diagonal, which is kept.",
        0: "masked_fill(bias == 0, -inf) does change the scores where tril is 0.",
    },
)


# --- 3. predict: the parameters of the chapter's GPT ----------------------------------------------


def _gpt_parameters_reference() -> int:
    vocab, block, d, layers = 65, 64, 128, 4
    embeddings = vocab * d + block * d  # wte (V, D) and wpe (block_size, D)
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V (nanoGPT's c_attn, 3D x D + 3D) and W^O (c_proj)
    mlp = (d * 4 * d + 4 * d) + (4 * d * d + d)  # c_fc D -> 4D and c_proj 4D -> D, with biases
    norms = 2 * 2 * d  # ln_1 and ln_2: a gain and a shift of D each
    final_norm = 2 * d  # ln_f
    head = 0  # tied: lm_head.weight IS wte.weight, counted once
    return embeddings + layers * (attention + mlp + norms) + final_norm + head  # 809,856


# What a learner gets by one natural slip, each count derived from the reference's terms (809,856), and what to say.
# tests/test_exercises_ch10.py builds each slip as a model (an untied head, no position table, d_ff = D, ...) and
# checks that it gives this count.
_D, _BLOCK = 128 * 128 + 128, 198_272  # one D x D Linear with its bias; one block
_GPT_PARAMETER_MISTAKES = {
    809856 + 65 * 128: "the head is tied to the token embedding: one tensor, counted once.",
    809856 - 64 * 128: "GPT learns its positions: wpe is a (block_size, D) table of parameters (chapter 08's sinusoids "
    "had none).",
    809856 - 4 * (6 * 128 * 128 + 3 * 128): "the MLP is 4 x wider than d_model: c_fc maps D to 4D and c_proj 4D "
    "back to D, 4 x D x D weights each, not D x D.",
    809856 - 4 * (4 * 128 + 512 + 128): "the Linear layers have biases here (bias=True, as GPT-2).",
    809856 - 4 * (4 * 128 + 512 + 128) - 4 * 2 * 128 - 128: "the Linear layers have biases here, and every LayerNorm "
    "has a shift beside its gain (bias=True, as GPT-2).",
    809856 - 4 * 512 - 256: "the LayerNorms have parameters too: a gain and a shift of D each.",
    809856 - 4 * 256 - 128: "a LayerNorm has a shift as well as a gain: 2D numbers, not D.",
    809856 - 256: "a Pre-Norm GPT has one more LayerNorm after the last block, ln_f (a gain and a shift of D).",
    809856 - 4 * _D: "attention has a fourth matrix after W^Q, W^K, W^V: the output projection W^O (nanoGPT's "
    "c_proj), D x D with its bias.",
    809856 + 4 * 3 * 3 * _D: "the heads share W^Q, W^K and W^V: each head gets d_k = D / 4 of their output features, "
    "not a D x D matrix of its own.",
    809856 - 3 * _BLOCK: "there are 4 blocks (n_layers=4), each with its own attention, MLP and LayerNorms.",
}


predict_gpt_parameters = Exercise(
    "predict_gpt_parameters",
    reference=_gpt_parameters_reference,
    cases=[Case("your count for V=65, block_size=64, d_model=128, 4 layers, 4 heads, tied head", lambda: ())],
    hints=[
        "List the parts that hold numbers: the two embeddings, each block (attention, MLP, two LayerNorms), the "
        "final LayerNorm, the head. The number of heads changes none of the sizes.",
        "A Linear(n_in, n_out) has n_in * n_out + n_out numbers; a LayerNorm of D has 2D; the MLP's hidden width "
        "is 4 x d_model; the position embedding has one row per position of the context.",
        "Weight tying: lm_head.weight is the same tensor as the token embedding, so it adds nothing. Sum: "
        "65*128 + 64*128 + 4 * (attention + MLP + 2 LayerNorms) + the final LayerNorm.",
    ],
    level="medium",
    kind="predict",
    wrong=[(lambda count=count: count) for count in _GPT_PARAMETER_MISTAKES],
    why=(
        "809,856: 16,512 in the two embeddings, 198,272 per block (66,048 attention + 131,712 MLP + 512 "
        "LayerNorm), 256 in ln_f, and nothing for the tied head. Untied, the head would add 65 x 128 = 8,320 "
        "(1 %); for GPT-2 small, 50257 x 768 = 38.6 million (31 % of 124 M): tying matters for big vocabularies."
    ),
    explain=_GPT_PARAMETER_MISTAKES,
)


# --- 2. build: q, k, v heads from GPT-2's Conv1D layout ------------------------------------------


def _conv1d_heads_reference(x: Tensor, weight: Tensor, bias: Tensor, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    batch, length, d_model = x.shape
    d_k = d_model // n_heads
    qkv = x @ weight + bias  # Conv1D: weight (D, 3D) is (in, out), so x @ W, not x @ W.T: (B, T, 3D)
    q, k, v = qkv[..., :d_model], qkv[..., d_model : 2 * d_model], qkv[..., 2 * d_model :]  # (B, T, D) each
    # each (B, T, D) -> (B, T, H, d_k) -> (B, H, T, d_k): head h owns features h*d_k ... (h+1)*d_k - 1
    return tuple(t.reshape(batch, length, n_heads, d_k).transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]


def _conv1d_transposed(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    b, t, d = x.shape
    qkv = x @ weight.reshape(3 * d, d).T + bias  # treats (D, 3D) as if it were a Linear's (3D, D)
    return tuple(p.reshape(b, t, n_heads, d // n_heads).transpose(1, 2) for p in qkv.split(d, dim=-1))


def _conv1d_no_transpose(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    b, t, d = x.shape
    qkv = x @ weight + bias
    return tuple(p.reshape(b, n_heads, t, d // n_heads) for p in qkv.split(d, dim=-1))  # mixes positions


def _conv1d_heads_not_moved(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    b, t, d = x.shape
    qkv = x @ weight + bias
    return tuple(p.reshape(b, t, n_heads, d // n_heads) for p in qkv.split(d, dim=-1))  # (B, T, H, d_k)


def _conv1d_per_head_layout(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    b, t, d = x.shape
    qkv = (x @ weight + bias).reshape(b, t, n_heads, 3, d // n_heads)  # assumes [q|k|v] inside each head
    return tuple(qkv[:, :, :, i].transpose(1, 2) for i in range(3))


def _conv1d_no_bias(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    b, t, d = x.shape
    qkv = x @ weight
    return tuple(p.reshape(b, t, n_heads, d // n_heads).transpose(1, 2) for p in qkv.split(d, dim=-1))


def _conv1d_with_library(x, weight, bias, n_heads):  # noqa: ANN001, ANN202
    from transformer_lab.gpt import GPTConfig

    d = x.shape[-1]
    config = GPTConfig(vocab_size=1, block_size=1, d_model=d, n_heads=n_heads, n_layers=1)
    attention = GPT(config).double().layers[0].self_attn
    with torch.no_grad():
        attention.w_q.weight.copy_(weight[:, :d].T)
        attention.w_k.weight.copy_(weight[:, d : 2 * d].T)
        attention.w_v.weight.copy_(weight[:, 2 * d :].T)
        attention.w_q.bias.copy_(bias[:d])
        attention.w_k.bias.copy_(bias[d : 2 * d])
        attention.w_v.bias.copy_(bias[2 * d :])
    return tuple(attention.split_heads(layer(x)) for layer in (attention.w_q, attention.w_k, attention.w_v))


def _conv1d_case(name: str, b: int, t: int, d: int, h: int, seed: int) -> Case:
    """x (b, t, d), a Conv1D weight (d, 3d) and bias (3d), in float64 from three consecutive seeds; h heads."""
    return Case(
        name,
        lambda: (
            _randn(b, t, d, seed=seed).double(),
            _randn(d, 3 * d, seed=seed + 1).double(),
            _randn(3 * d, seed=seed + 2).double(),
            h,
        ),
        atol=1e-10,
        rtol=1e-10,
    )


conv1d_qkv_heads = Exercise(
    "conv1d_qkv_heads",
    reference=_conv1d_heads_reference,
    cases=[
        _conv1d_case("B=1, T=3, D=4, H=2", 1, 3, 4, 2, seed=100),
        _conv1d_case("B=2, T=4, D=6, H=3", 2, 4, 6, 3, seed=103),
        _conv1d_case("one head", 2, 4, 4, 1, seed=106),
        _conv1d_case("B=2, T=5, D=8, H=4", 2, 5, 8, 4, seed=109),
        _conv1d_case("a single position, T=1", 3, 1, 8, 2, seed=112),
    ],
    hints=[
        "GPT-2's checkpoints store c_attn as a Conv1D: its weight is (in, out) = (D, 3D) and it computes "
        "x @ weight + bias. An nn.Linear stores (out, in) and computes x @ weight.T + bias.",
        "After the projection each token has 3D features [q | k | v] (D each): cut the last axis into three "
        "slices of D.",
        "Each (B, T, D) slice becomes (B, T, H, d_k) with a reshape (head h owns d_k consecutive features), then "
        "swap the T and H axes to get (B, H, T, d_k).",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _conv1d_transposed,
            "the weight was read in a Linear's (out, in) layout: a Conv1D stores (in, out), so its rows belong to "
            "the input features.",
        ),
        Mistake(
            _conv1d_per_head_layout,
            "each head's q, k and v were taken to sit side by side: the checkpoint stores all of q first, then all "
            "of k, then all of v.",
        ),
        Mistake(
            _conv1d_no_bias,
            "the bias was left out: a Conv1D adds it to the product, as a Linear does.",
        ),
        # while T == H (the first two cases) this one and the next give the same tensor: this one is said there
        Mistake(
            _conv1d_no_transpose,
            "the projection was reshaped straight to (B, H, T, d_k): a reshape only regroups the numbers in their "
            "memory order, so each head got features of several positions (chapter 03).",
        ),
        Mistake(
            _conv1d_heads_not_moved,
            "the heads stayed behind the positions: the result is (B, T, H, d_k), and attention wants the heads "
            "in front, (B, H, T, d_k).",
        ),
    ],
    forbidden=[GPT, nn.Linear],  # "use tensor operations only (no GPT, no nn.Linear)"
    output_names=["your q", "your k", "your v"],
    shortcuts=[_conv1d_with_library],
)


# --- 4. transfer: top-p (nucleus) filtering from primitives ---------------------------------------


def _top_p_reference(logits: Tensor, top_p: float) -> Tensor:
    order = torch.argsort(logits, dim=-1, descending=True)  # (..., V): the most likely token first
    sorted_logits = torch.gather(logits, -1, order)  # (..., V)
    exp = torch.exp(sorted_logits - sorted_logits[..., :1])  # the softmax's numerators, the largest is 1
    probs = exp / exp.sum(dim=-1, keepdim=True)  # (..., V), sorted
    before = torch.cumsum(probs, dim=-1) - probs  # the probability of the tokens ranked above each one
    drop_sorted = before >= top_p  # keep a token while the mass before it is still below top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to the vocabulary's order
    return torch.where(drop, torch.full_like(logits, float("-inf")), logits)


def _probs(logits):  # noqa: ANN001, ANN202
    exp = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    return exp / exp.sum(dim=-1, keepdim=True)


def _top_p_cumsum_inclusive(logits, top_p):  # noqa: ANN001, ANN202
    order = torch.argsort(logits, dim=-1, descending=True)
    probs = torch.gather(_probs(logits), -1, order)
    drop_sorted = torch.cumsum(probs, dim=-1) > top_p  # drops the token that crosses top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _top_p_unsorted(logits, top_p):  # noqa: ANN001, ANN202
    probs = _probs(logits)
    before = torch.cumsum(probs, dim=-1) - probs  # in vocabulary order, not by probability
    return logits.masked_fill(before >= top_p, float("-inf"))


def _top_p_sorted_order(logits, top_p):  # noqa: ANN001, ANN202
    sorted_logits, _ = torch.sort(logits, dim=-1, descending=True)
    probs = _probs(sorted_logits)
    before = torch.cumsum(probs, dim=-1) - probs
    return sorted_logits.masked_fill(before >= top_p, float("-inf"))  # forgot to scatter back


def _top_p_one_softmax_for_all(logits, top_p):  # noqa: ANN001, ANN202
    order = torch.argsort(logits, dim=-1, descending=True)
    exp = torch.exp(torch.gather(logits, -1, order) - logits.max())
    probs = exp / exp.sum()  # normalised over the whole tensor, not row by row
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, torch.cumsum(probs, -1) - probs >= top_p)
    return logits.masked_fill(drop, float("-inf"))


def _top_p_zero_instead(logits, top_p):  # noqa: ANN001, ANN202
    order = torch.argsort(logits, dim=-1, descending=True)
    probs = torch.gather(_probs(logits), -1, order)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, torch.cumsum(probs, -1) - probs >= top_p)
    return logits.masked_fill(drop, 0.0)  # a logit of 0 still has probability


def _top_p_with_library(logits, top_p):  # noqa: ANN001, ANN202
    return filter_logits(logits, top_p=top_p)


def _top_p_through_generate_helper(logits, top_p):  # noqa: ANN001, ANN202
    import transformer_lab.gpt as gpt_module

    return getattr(gpt_module, "filter" + "_logits")(logits, None, top_p)


top_p_filter = Exercise(
    "top_p_filter",
    reference=_top_p_reference,
    cases=[
        Case("one row, top_p = 0.5", lambda: (torch.tensor([1.0, 3.0, 0.0, 2.0, -1.0]), 0.5)),
        Case("one row, top_p = 0.9", lambda: (torch.tensor([0.5, 2.5, 2.0, -1.0, 1.0, 0.0]), 0.9)),
        Case("a batch of rows (B, V)", lambda: (_randn(4, 10, seed=120) * 2, 0.8)),
        Case("top_p = 1.0 keeps every token", lambda: (_randn(2, 7, seed=121), 1.0)),
        Case("a tiny top_p keeps only the most likely token", lambda: (_randn(3, 9, seed=122) * 3, 1e-3)),
        Case("(B, T, V) logits", lambda: (_randn(2, 3, 8, seed=123) * 2, 0.6)),
    ],
    hints=[
        "Nucleus sampling keeps the most likely tokens until their probabilities add up to top_p. So rank the "
        "tokens by probability first (argsort, descending), and compute the probabilities with a softmax you write.",
        "In that ranked order, a token is kept while the probability of the tokens ranked ABOVE it (a cumulative sum "
        "minus the token's own probability) is still below top_p: the most likely token is always kept.",
        "Decide keep/drop in the ranked order, then put the decisions back in the vocabulary's order (scatter with "
        "the ranking's indices), and write -inf into the dropped logits (the kept ones stay unchanged).",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _top_p_cumsum_inclusive,
            "the token whose probability carries the running total past top_p was dropped too: the kept tokens "
            "then add up to less than top_p, and a tiny top_p drops even the most likely token.",
        ),
        Mistake(
            _top_p_unsorted,
            "the probabilities were added up in the vocabulary's order: the nucleus is counted from the most likely "
            "token down.",
        ),
        Mistake(
            _top_p_sorted_order,
            "the result came back in ranked order: each logit must stay at its token's place in the vocabulary.",
        ),
        Mistake(
            _top_p_zero_instead,
            "the dropped logits were set to 0: a logit of 0 still has a probability after the softmax, so those "
            "tokens can still be sampled.",
        ),
        Mistake(
            _top_p_one_softmax_for_all,
            "the probabilities were normalized over the whole tensor, not within each row: each row is a "
            "distribution of its own and sums to 1 by itself.",
        ),
    ],
    forbidden=[filter_logits, "softmax", "log_softmax"],
    shortcuts=[_top_p_with_library, _top_p_through_generate_helper],
)
