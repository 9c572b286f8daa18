"""Exercises of chapter 06, the encoder (编码器): notebooks/06_encoder.ipynb.

1. `predict_encoder_layer_parameters`: how many numbers the paper's base encoder layer learns (easy, predict).
2. `encode_ragged`: a list of sentences of different lengths encoded in one padded, masked call (medium, build).
3. `predict_shuffled_output`: what an encoder without positions does with shuffled input (medium, predict).
4. `from_pytorch_layer`: a trained `nn.TransformerEncoderLayer`'s weights loaded into a `tl.EncoderLayer`
   (harder, transfer: the chapter copied ours into PyTorch's, never the other way).

Shape legend: B batch, S source length, L_i the length of sentence i, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_lab.encoder import Encoder, EncoderLayer
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.multihead import MultiHeadAttention

__all__ = ["predict_encoder_layer_parameters", "encode_ragged", "predict_shuffled_output", "from_pytorch_layer"]


# --- 1. predict: the parameters of the paper's base encoder layer ---------------------------------


def _count_parts(d_model: int, d_ff: int, *, bias: bool = True, projections: int = 4, norms: int = 2) -> int:
    def linear(n_in: int, n_out: int) -> int:
        return n_in * n_out + (n_out if bias else 0)

    attention = projections * linear(d_model, d_model)
    feed_forward = linear(d_model, d_ff) + linear(d_ff, d_model)
    return attention + feed_forward + norms * 2 * d_model


def _parameters_reference() -> int:
    d_model, d_ff = 512, 2048  # the paper's base layer; its 8 heads do not change the count
    attention = 4 * (d_model * d_model + d_model)  # W^Q, W^K, W^V, W^O: a (D, D) weight and a (D,) bias each
    feed_forward = (d_model * d_ff + d_ff) + (d_ff * d_model + d_model)  # W_1 (F, D), b_1 (F,), W_2 (D, F), b_2 (D,)
    norms = 2 * (2 * d_model)  # norm1 and norm2: gamma and beta, (D,) each
    return attention + feed_forward + norms  # 3,152,384


predict_encoder_layer_parameters = Exercise(
    "predict_encoder_layer_parameters",
    reference=_parameters_reference,
    cases=[Case("your count for tl.EncoderLayer(d_model=512, n_heads=8, d_ff=2048)", lambda: ())],
    hints=[
        "Go through the parts that `print(layer)` lists and count each Linear's weight AND bias, and each "
        "LayerNorm's gamma and beta. Dropout learns nothing.",
        "A Linear(n_in, n_out) has n_in * n_out + n_out parameters. The attention has four Linear(512, 512); "
        "splitting into 8 heads only reshapes their outputs, so the number of heads does not appear in the count.",
        "attention 4 * (512 * 512 + 512), the FFN (512 * 2048 + 2048) + (2048 * 512 + 512), and two LayerNorms "
        "of 2 * 512 each: add the three parts.",
    ],
    level="easy",
    kind="predict",
    wrong=[
        lambda: _count_parts(512, 2048, bias=False),
        lambda: _count_parts(512, 512),
        lambda: _count_parts(512, 2048) + 7 * 4 * (512 * 512 + 512),
        lambda: _count_parts(512, 2048, norms=0),
    ],
    why=(
        "attention 1,050,624 + FFN 2,099,712 + norms 2,048 = 3,152,384. The FFN holds two thirds of the layer, "
        "which is why note 000's FFN with hidden width d_model (chapter 05) loses so much."
    ),
    explain={
        _count_parts(512, 2048, bias=False): "close: every Linear layer of tl.EncoderLayer also has a bias vector.",
        _count_parts(512, 2048, bias=False, norms=0): "the biases and the two LayerNorms' gamma and beta are missing.",
        _count_parts(512, 512): "that is an FFN of hidden width d_model, note 000's mistake: here d_ff = 2048.",
        _count_parts(512, 2048) + 7 * 4 * (512 * 512 + 512): (
            "the heads do not have projections of their own: the four (512, 512) matrices are split among the 8 "
            "heads, so the count does not depend on n_heads."
        ),
        _count_parts(512, 2048, norms=0): "the two LayerNorms learn gamma and beta too (512 numbers each).",
        _count_parts(512, 2048, projections=3): "W^O, the output projection after the heads are merged, counts too.",
    },
)


# --- 2. build: a ragged list of sentences, one padded and masked call ------------------------------


def _ragged_reference(encoder: nn.Module, sequences: list[Tensor]) -> list[Tensor]:
    lengths = torch.tensor([len(s) for s in sequences])  # (B,)
    batch, longest, d_model = len(sequences), int(lengths.max()), sequences[0].shape[-1]
    x = sequences[0].new_zeros(batch, longest, d_model)  # (B, S, D): zeros where a sentence has ended
    for i, s in enumerate(sequences):
        x[i, : len(s)] = s
    real = torch.arange(longest)[None, :] < lengths[:, None]  # (B, S): True at real tokens
    mask = real[:, None, None, :]  # (B, 1, 1, S): blocks the padded keys, for every head and query
    out = encoder(x, mask)  # (B, S, D), ONE call for the whole batch
    return [out[i, :n] for i, n in enumerate(lengths.tolist())]  # (L_i, D) each: the padding dropped


def _pad(sequences: list[Tensor]) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(s) for s in sequences])
    x = sequences[0].new_zeros(len(sequences), int(lengths.max()), sequences[0].shape[-1])
    for i, s in enumerate(sequences):
        x[i, : len(s)] = s
    return x, torch.arange(x.shape[1])[None, :] < lengths[:, None]


def _ragged_no_mask(encoder, sequences):  # noqa: ANN001, ANN202
    x, _ = _pad(sequences)
    out = encoder(x)  # the real tokens attend to the padding
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_inverted_mask(encoder, sequences):  # noqa: ANN001, ANN202
    x, real = _pad(sequences)
    out = encoder(x, (~real)[:, None, None, :])  # PyTorch's "True = blocked" given to a "True = may attend" API
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_mask_on_queries(encoder, sequences):  # noqa: ANN001, ANN202
    x, real = _pad(sequences)
    out = encoder(x, real[:, None, :, None])  # (B, 1, S, 1): blocks padded QUERY rows, not padded keys
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_mask_missing_an_axis(encoder, sequences):  # noqa: ANN001, ANN202
    x, real = _pad(sequences)
    out = encoder(x, real[:, None, :])  # (B, 1, S): broadcasting lines B up with the heads, when B == H
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_off_by_one(encoder, sequences):  # noqa: ANN001, ANN202
    x, _ = _pad(sequences)
    lengths = torch.tensor([len(s) for s in sequences])
    real = torch.arange(x.shape[1])[None, :] <= lengths[:, None]  # one padded position too many
    out = encoder(x, real[:, None, None, :])
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_keeps_padding(encoder, sequences):  # noqa: ANN001, ANN202
    x, real = _pad(sequences)
    out = encoder(x, real[:, None, None, :])
    return list(out)  # (S, D) each: the padded positions are still there


def _ragged_one_by_one(encoder, sequences):  # noqa: ANN001, ANN202
    return [encoder(s[None])[0] for s in sequences]  # right numbers, but B calls instead of one batch


def _run_once(candidate, encoder, sequences):  # noqa: ANN001, ANN202
    """Call the candidate, then insist that it encoded the whole batch in one call of the encoder."""
    calls: list[int] = []
    handle = encoder.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        out = candidate(encoder, sequences)
    finally:
        handle.remove()
    if len(calls) != 1:
        raise ValueError(
            f"encode the whole batch in ONE call of encoder(x, mask): your function called it {len(calls)} times"
        )
    return out


def _ragged_case(lengths: list[int], seed: int, norm_first: bool = True) -> tuple[object, ...]:
    torch.manual_seed(seed)
    encoder = Encoder(8, 2, 16, 2, dropout=0.0, norm_first=norm_first).eval()
    g = torch.Generator().manual_seed(seed + 1)
    return encoder, [torch.randn(n, 8, generator=g) for n in lengths]


encode_ragged = Exercise(
    "encode_ragged",
    reference=_ragged_reference,
    run=_run_once,
    cases=[
        Case("one sentence of 4 tokens (nothing to pad)", lambda: _ragged_case([4], 0)),
        Case("two sentences, 5 and 3 tokens", lambda: _ragged_case([5, 3], 1)),
        Case("three sentences, the longest in the middle", lambda: _ragged_case([2, 6, 4], 2)),
        Case("a one-token sentence, Post-Norm stack", lambda: _ragged_case([1, 5], 3, norm_first=False)),
    ],
    hints=[
        "Three steps: put the sentences into one (B, S, D) tensor, S the longest length; build a mask that blocks "
        "the filler; call encoder(x, mask) once and cut each sentence's outputs back to its own length.",
        "Start from x = sequences[0].new_zeros(B, S, D) and copy sentence i into x[i, :L_i]. From the lengths, "
        "torch.arange(S)[None, :] < lengths[:, None] is True at the real positions, (B, S).",
        "The encoder wants the mask as (B, 1, 1, S), True = may attend, so that it blocks padded KEYS for every "
        "head and query: real[:, None, None, :]. Then out = encoder(x, mask) and return [out[i, :L_i] for each i].",
    ],
    level="medium",
    kind="build",
    wrong=[_ragged_one_by_one],  # the check refuses it before comparing: B calls of the encoder, not one
    mistakes=[
        Mistake(
            _ragged_no_mask,
            "No mask reached the encoder: the real tokens attended to the filler vectors too, so a short sentence "
            "gets other outputs than when it is encoded alone.",
        ),
        Mistake(
            _ragged_inverted_mask,
            "Your mask is inverted, True at the padding: in this course True means 'may attend' (PyTorch's own "
            "padding masks use the opposite), so the real tokens could attend only to the filler, or to nothing at "
            "all where a sentence has no padding.",
        ),
        Mistake(
            _ragged_mask_on_queries,
            "Your mask blocks the padded positions as queries (rows of the scores), not as keys (columns): the real "
            "tokens still attend to the padding.",
        ),
        Mistake(
            _ragged_mask_missing_an_axis,
            "Your mask has one axis too few: broadcasting lined its batch axis up with the heads, so each head used "
            "another sentence's mask (and with more sentences than heads the shapes do not fit at all).",
        ),
        Mistake(
            _ragged_off_by_one,
            "Your mask lets each short sentence see one padded position past its end: an off-by-one where the "
            "positions are compared with the lengths.",
        ),
        Mistake(
            _ragged_keeps_padding,
            "Your i-th tensor still holds the padded positions: it has the longest sentence's length, not sentence "
            "i's own.",
        ),
    ],
    forbidden=["pad_sequence", "pad_packed_sequence", "nested_tensor", "to_padded_tensor"],
    shortcuts=[
        lambda encoder, seqs: _unpad(encoder, seqs, torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)),
        lambda encoder, seqs: _unpad(encoder, seqs, getattr(torch.nn.utils.rnn, "pad_" + "sequence")(seqs, True)),
    ],
)


def _unpad(encoder: nn.Module, sequences: list[Tensor], x: Tensor) -> list[Tensor]:
    lengths = torch.tensor([len(s) for s in sequences])
    out = encoder(x, (torch.arange(x.shape[1])[None, :] < lengths[:, None])[:, None, None, :])
    return [out[i, :n] for i, n in enumerate(lengths.tolist())]


# --- 3. predict: shuffled input, no positional encoding --------------------------------------------


def _shuffled_reference() -> str:
    # Attention sums over all keys, and a sum does not care about the order of its terms; the FFN, the
    # residuals and the norms work on each position alone. So every token gets the output it got before,
    # now at its new position: encoder(x[:, perm]) == encoder(x)[:, perm].
    return "shuffled"


_CHOICES = ("same", "shuffled", "different")
_NOT_A_CHOICE = "(not one of the three choices)"


def _as_choice(value: object) -> object:
    """A learner's choice in one spelling: "Shuffled", " shuffled" and "shuffled." are "shuffled"; a string that is
    none of the three choices becomes a marker the explanation names."""
    if not isinstance(value, str):
        return value
    word = value.strip().strip("\"'.!").strip().lower()
    return word if word in _CHOICES else _NOT_A_CHOICE


predict_shuffled_output = Exercise(
    "predict_shuffled_output",
    reference=_shuffled_reference,
    cases=[Case('your choice: "same", "shuffled" or "different"', lambda: ())],
    hints=[
        "Follow one token, say 'cat', through a layer. What does its output depend on: its own vector, the set "
        "of the other vectors, their order?",
        "Its query is compared with every key, and the weighted values are summed. Does a sum change when its "
        "terms come in another order? The FFN, residuals and LayerNorms look at each position alone.",
        "So 'cat' gets exactly the output it got before. Where does that output appear in the new output: at "
        "cat's old position, or at its new one?",
    ],
    level="medium",
    kind="predict",
    run=lambda candidate: _as_choice(candidate()),
    wrong=[lambda: "same", lambda: "Different", lambda: "permuted"],
    why=(
        "encoder(words[:, perm]) == encoder(words)[:, perm]: the encoder is permutation-equivariant (置换等变). "
        "Each token's output depends on its own vector and on the SET of the others, not on their order, and it "
        "appears wherever the token now stands. Without positions 'dog bites man' and 'man bites dog' give each "
        "word the same vector."
    ),
    explain={
        _NOT_A_CHOICE: "return one of the three words the exercise lists, as a string: that answer is none of them.",
        "same": (
            "position 0 of the shuffled input holds another token than before. Would an encoder give that other "
            "token the output of the first one?"
        ),
        "different": (
            "which operation of a layer could notice the order? Attention sums over all keys, and a sum is the "
            "same in any order; the FFN, residuals and norms look at one position at a time."
        ),
    },
)


# --- 4. transfer: PyTorch's layer, loaded into ours ------------------------------------------------


def _from_pytorch_reference(theirs: nn.TransformerEncoderLayer) -> EncoderLayer:
    attn = theirs.self_attn  # nn.MultiheadAttention: W^Q, W^K, W^V stacked in ONE (3D, D) matrix
    ours = EncoderLayer(
        attn.embed_dim,
        attn.num_heads,
        theirs.linear1.out_features,  # d_ff
        dropout=theirs.dropout1.p,
        norm_first=theirs.norm_first,  # Pre-Norm or Post-Norm: the weights alone do not say which
        eps=theirs.norm1.eps,
    ).to(attn.in_proj_weight.dtype)
    w_q, w_k, w_v = attn.in_proj_weight.chunk(3)  # three (D, D) blocks, in the order Q, K, V
    b_q, b_k, b_v = attn.in_proj_bias.chunk(3)  # three (D,)
    pairs = [
        (ours.self_attn.w_q, w_q, b_q),
        (ours.self_attn.w_k, w_k, b_k),
        (ours.self_attn.w_v, w_v, b_v),
        (ours.self_attn.w_o, attn.out_proj.weight, attn.out_proj.bias),
        (ours.feed_forward.w1, theirs.linear1.weight, theirs.linear1.bias),  # (F, D), (F,)
        (ours.feed_forward.w2, theirs.linear2.weight, theirs.linear2.bias),  # (D, F), (D,)
        (ours.norm1, theirs.norm1.weight, theirs.norm1.bias),  # gamma, beta (D,)
        (ours.norm2, theirs.norm2.weight, theirs.norm2.bias),
    ]
    with torch.no_grad():
        for module, weight, bias in pairs:
            module.weight.copy_(weight)
            module.bias.copy_(bias)
    return ours.train(theirs.training)


def _load(theirs, order=(0, 1, 2), transpose=False, biases=True, norm_first=None, eps=None):  # noqa: ANN001, ANN202
    attn = theirs.self_attn
    first = theirs.norm_first if norm_first is None else norm_first
    ours = EncoderLayer(
        attn.embed_dim,
        attn.num_heads,
        theirs.linear1.out_features,
        dropout=0.0,
        norm_first=first,
        eps=theirs.norm1.eps if eps is None else eps,
    ).to(attn.in_proj_weight.dtype)
    blocks, bias_blocks = attn.in_proj_weight.chunk(3), attn.in_proj_bias.chunk(3)
    targets = [ours.self_attn.w_q, ours.self_attn.w_k, ours.self_attn.w_v]
    with torch.no_grad():
        for target, i in zip(targets, order, strict=True):
            target.weight.copy_(blocks[i].T if transpose else blocks[i])
            if biases:
                target.bias.copy_(bias_blocks[i])
        for mine, their in (
            (ours.self_attn.w_o, attn.out_proj),
            (ours.feed_forward.w1, theirs.linear1),
            (ours.feed_forward.w2, theirs.linear2),
            (ours.norm1, theirs.norm1),
            (ours.norm2, theirs.norm2),
        ):
            mine.weight.copy_(their.weight)
            if biases:
                mine.bias.copy_(their.bias)
    return ours.eval()


def _load_k_q_v(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, order=(1, 0, 2))


def _load_v_k_q(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, order=(2, 1, 0))


def _load_q_v_k(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, order=(0, 2, 1))


def _load_transposed(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, transpose=True)


def _load_no_biases(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, biases=False)


def _load_always_pre_norm(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, norm_first=True)


def _load_default_eps(theirs):  # noqa: ANN001, ANN202
    return _load(theirs, eps=1e-5)


def _run_layer(candidate, theirs, x, mask):  # noqa: ANN001, ANN202
    """Load with the candidate, then run the loaded layer (in evaluation mode) on x with the padding mask."""
    ours = candidate(theirs)
    if not isinstance(ours, EncoderLayer):
        raise TypeError(f"return a tl.EncoderLayer holding PyTorch's weights, got {type(ours).__name__}")
    return ours.eval()(x, mask)  # (B, S, D)


def _pytorch_case(
    d_model: int, n_heads: int, d_ff: int, norm_first: bool, seed: int, dtype=torch.float32, eps=1e-5, scale=1.0
):  # noqa: ANN001, ANN202
    torch.manual_seed(seed)
    theirs = nn.TransformerEncoderLayer(
        d_model, n_heads, d_ff, dropout=0.1, batch_first=True, norm_first=norm_first, layer_norm_eps=eps
    )
    with torch.no_grad():  # "trained" weights: no parameter keeps its initial 0 or 1
        for p in theirs.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    theirs = theirs.to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    x = scale * torch.randn(2, 5, d_model, generator=g, dtype=dtype)  # (B, S, D)
    tokens = torch.tensor([[4, 5, 6, 7, 8], [4, 5, 6, 0, 0]])
    return theirs, x, tokens.ne(0)[:, None, None, :]


from_pytorch_layer = Exercise(
    "from_pytorch_layer",
    reference=_from_pytorch_reference,
    run=_run_layer,
    cases=[
        Case("a Post-Norm layer (norm_first=False), d_model=8, 2 heads", lambda: _pytorch_case(8, 2, 16, False, 0)),
        Case("a Pre-Norm layer (norm_first=True)", lambda: _pytorch_case(8, 2, 16, True, 1)),
        Case("d_model=16, 4 heads, d_ff=24", lambda: _pytorch_case(16, 4, 24, True, 2)),
        Case(
            "layer_norm_eps=1e-3, on small inputs",
            lambda: _pytorch_case(8, 2, 16, True, 3, eps=1e-3, scale=0.02),
        ),
        Case("a float64 layer", lambda: _pytorch_case(8, 2, 16, False, 4, dtype=torch.float64), atol=1e-10, rtol=0),
    ],
    hints=[
        "Make a tl.EncoderLayer of the same size and settings, then copy each of PyTorch's tensors into the matching "
        "parameter of yours: section 3 did exactly this in the other direction.",
        "Read the sizes and settings from theirs: self_attn.embed_dim and num_heads, linear1.out_features (d_ff), "
        "norm_first, norm1.eps; and make your layer the same dtype as theirs (.to(...)). Copy inside "
        "torch.no_grad() with .copy_().",
        "self_attn.in_proj_weight is (3D, D): W^Q, W^K, W^V stacked in that order, so .chunk(3) gives them back "
        "(in_proj_bias likewise). out_proj is W^O, linear1/linear2 are the FFN's w1/w2, norm1/norm2 are the norms.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _load_k_q_v,
            "W^Q and W^K came from each other's block of in_proj_weight: the scores were computed as keys against "
            "queries. Check the order in which PyTorch stacks the three projections.",
        ),
        Mistake(
            _load_v_k_q,
            "W^Q and W^V came from each other's block of in_proj_weight: the queries were made by the value "
            "projection and the values by the query projection. PyTorch stacks the three in the order Q, K, V.",
        ),
        Mistake(
            _load_q_v_k,
            "W^K and W^V came from each other's block of in_proj_weight: the keys were made by the value projection "
            "and the values by the key projection. PyTorch stacks the three in the order Q, K, V.",
        ),
        Mistake(
            _load_transposed,
            "The Q, K, V blocks were transposed on the way: in_proj_weight stores each of them in the same "
            "(out_features, in_features) layout as an nn.Linear's weight.",
        ),
        Mistake(
            _load_no_biases,
            "The biases were not copied: your layer still has its own freshly initialized biases (and its "
            "LayerNorms' beta of zeros).",
        ),
        Mistake(
            _load_always_pre_norm,
            "Your layer is Pre-Norm whatever theirs is: where the norms sit (norm_first) is a setting, not a weight, "
            "so copying the weights does not carry it over.",
        ),
        Mistake(
            _load_default_eps,
            "Your LayerNorms kept the default eps: theirs was built with another layer_norm_eps, a setting the "
            "weights do not carry; it shows on small inputs.",
        ),
    ],
    forbidden=[
        nn.TransformerEncoderLayer,
        nn.MultiheadAttention,
        nn.TransformerEncoder,
        "multi_head_attention_forward",
    ],
    shortcuts=[
        lambda theirs: _Wrapped(theirs),
        lambda theirs: _with_their_attention(theirs),
    ],
)


class _Wrapped(EncoderLayer):
    """A "loaded" layer that only calls PyTorch's: no credit."""

    def __init__(self, theirs: nn.TransformerEncoderLayer) -> None:
        super().__init__(theirs.self_attn.embed_dim, theirs.self_attn.num_heads, theirs.linear1.out_features)
        self.theirs = theirs

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        blocked = None if mask is None else ~mask[:, 0, 0, :]
        return self.theirs(x, src_key_padding_mask=blocked)


def _with_their_attention(theirs: nn.TransformerEncoderLayer) -> EncoderLayer:
    ours = _from_pytorch_copy(theirs)

    class Adapter(MultiHeadAttention):  # our attention's interface, PyTorch's computation
        def forward(self, q, k, v, mask=None):  # noqa: ANN001, ANN202
            blocked = None if mask is None else ~mask[:, 0, 0, :]
            return theirs.self_attn(q, k, v, key_padding_mask=blocked, need_weights=False)[0]

    ours.self_attn = Adapter(theirs.self_attn.embed_dim, theirs.self_attn.num_heads).to(theirs.linear1.weight.dtype)
    return ours


def _from_pytorch_copy(theirs: nn.TransformerEncoderLayer) -> EncoderLayer:
    return _load(theirs)
