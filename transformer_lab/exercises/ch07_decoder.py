"""Exercises of chapter 07, the decoder (解码器): notebooks/07_decoder.ipynb.

1. `predict_cross_attention_shape`: the shape of a decoder layer's cross-attention weights (easy, predict).
2. `decoder_layer_post_norm`: one Post-Norm decoder layer's forward from given sublayers (medium, build).
3. `transformer_forward`: note 000's full model fixed, so that the decoder reads the target (medium, debug the notes).
4. `predict_best_loss_like_000`: the lowest loss note 000's wiring can reach on a two-answer task (harder, predict).
5. `cached_self_attention`: one generation step of masked self-attention with a KV cache (harder, transfer).

Shape legend: B batch, T target length, S source length, D d_model, H heads, d_k = D / H, V vocabulary.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from transformer_lab.decoder import Decoder, DecoderLayer, LayerCache
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.feedforward import FeedForward
from transformer_lab.masking import causal_mask
from transformer_lab.model import Transformer, TransformerConfig
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm
from transformer_lab.residual import sublayer_connection

__all__ = [
    "predict_cross_attention_shape",
    "decoder_layer_post_norm",
    "transformer_forward",
    "predict_best_loss_like_000",
    "cached_self_attention",
]


# --- 1. predict: the cross-attention weights' shape -------------------------------------------------


def _cross_shape_reference() -> tuple[int, int, int, int]:
    return (2, 2, 4, 6)  # (B, H, T, S): one row per target query, one column per source key


predict_cross_attention_shape = Exercise(
    "predict_cross_attention_shape",
    reference=_cross_shape_reference,
    cases=[Case("your shape for layer.cross_attn.attention_weights", lambda: ())],
    hints=[
        "Attention weights always have one row per query and one column per key, for each batch row and head.",
        "In cross-attention the queries come from the decoder's stream y (T = 4 positions) and the keys and values "
        "from the memory (S = 6 positions).",
        "Write (B, H, number of queries, number of keys) with B = 2 and H = 2.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: (2, 2, 6, 4), lambda: (2, 2, 4, 4), lambda: (2, 4, 6), lambda: (2, 2, 6, 6)],
    why=(
        "(B, H, T, S) = (2, 2, 4, 6): each of the 4 target positions spreads its weight over the 6 source tokens; "
        "the self-attention weights are (2, 2, 4, 4)."
    ),
    explain={
        (2, 2, 6, 4): "rows are queries and columns are keys: which side gives the queries in cross-attention?",
        (2, 2, 4, 4): "that is the masked SELF-attention's (T, T) map. Cross-attention's keys come from elsewhere.",
        (2, 2, 6, 6): "that would be the encoder's self-attention over the source. Who asks the questions here?",
        (2, 4, 6): "the weights are kept per head: one map for each of the 2 heads.",
        (2, 4, 8): "that is the shape of the cross-attention's OUTPUT (B, T, D), not of its weights.",
    },
)


# --- 2. build: a Post-Norm decoder layer from given sublayers ---------------------------------------


def _post_norm_reference(
    x: Tensor,
    memory: Tensor,
    self_attn: nn.Module,
    cross_attn: nn.Module,
    feed_forward: nn.Module,
    norm1: nn.Module,
    norm2: nn.Module,
    norm3: nn.Module,
    tgt_mask: Tensor | None = None,
    memory_mask: Tensor | None = None,
) -> Tensor:
    x = norm1(x + self_attn(x, x, x, tgt_mask))  # (B, T, D): masked self-attention, then Add & Norm
    x = norm2(x + cross_attn(x, memory, memory, memory_mask))  # queries from the decoder, keys/values from memory
    return norm3(x + feed_forward(x))  # (B, T, D)


def _post_pre_norm(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    h = n1(x)
    x = x + sa(h, h, h, tgt_mask)
    h = n2(x)
    x = x + ca(h, memory, memory, memory_mask)
    return x + ff(n3(x))


def _post_cross_on_self(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, tgt_mask))
    x = n2(x + ca(x, x, x, tgt_mask))  # never looks at the source
    return n3(x + ff(x))


def _post_memory_queries(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, tgt_mask))
    x = n2(x + ca(x, x, memory, memory_mask))  # values from the memory, keys from the decoder
    return n3(x + ff(x))


def _post_queries_from_memory(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, tgt_mask))
    x = n2(x + ca(memory, x, x, memory_mask))  # the roles swapped: the source asks, the decoder answers
    return n3(x + ff(x))


def _post_norm_on_sublayer(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = x + n1(sa(x, x, x, tgt_mask))  # the norm on the sublayer's output, before the addition
    x = x + n2(ca(x, memory, memory, memory_mask))
    return x + n3(ff(x))


def _post_no_memory_mask(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, tgt_mask))
    x = n2(x + ca(x, memory, memory, None))  # the source's padding is attended to
    return n3(x + ff(x))


def _post_no_causal(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, None))
    x = n2(x + ca(x, memory, memory, memory_mask))
    return n3(x + ff(x))


def _post_norm_memory(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    x = n1(x + sa(x, x, x, tgt_mask))
    m = n2(memory)  # the memory is normalized again
    x = n2(x + ca(x, m, m, memory_mask))
    return n3(x + ff(x))


def _decoder_case(batch: int, tgt_len: int, src_len: int, seed: int, padded: bool) -> tuple[object, ...]:
    d_model = 8
    torch.manual_seed(seed)
    self_attn, cross_attn = MultiHeadAttention(d_model, 2), MultiHeadAttention(d_model, 2)
    ff = FeedForward(d_model, 16)
    norms = [LayerNorm(d_model) for _ in range(3)]
    with torch.no_grad():  # gammas and betas away from 1 and 0, so that swapping the norms shows
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, tgt_len, d_model, generator=g)
    memory = torch.randn(batch, src_len, d_model, generator=g)
    tgt_mask = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()  # (T, T)
    memory_mask = None
    if padded:
        lengths = torch.arange(src_len, src_len - batch, -1).clamp(min=1)  # (B,) real source lengths
        memory_mask = (torch.arange(src_len)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return x, memory, self_attn, cross_attn, ff, *norms, tgt_mask, memory_mask


def _post_norm_with_library(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    layer = DecoderLayer(x.shape[-1], sa.n_heads, ff.w1.out_features, dropout=0.0, norm_first=False)
    layer.self_attn, layer.cross_attn, layer.feed_forward = sa, ca, ff
    layer.norm1, layer.norm2, layer.norm3 = n1, n2, n3
    return layer(x, memory, tgt_mask, memory_mask)


def _post_norm_with_connections(x, memory, sa, ca, ff, n1, n2, n3, tgt_mask=None, memory_mask=None):  # noqa: ANN001, ANN202
    keep = nn.Identity()
    x = sublayer_connection(x, lambda h: sa(h, h, h, tgt_mask), n1, keep, False)
    x = sublayer_connection(x, lambda h: ca(h, memory, memory, memory_mask), n2, keep, False)
    return sublayer_connection(x, ff, n3, keep, False)


decoder_layer_post_norm = Exercise(
    "decoder_layer_post_norm",
    reference=_post_norm_reference,
    cases=[
        Case("target of 4 tokens, source of 6", lambda: _decoder_case(1, 4, 6, 0, False)),
        Case("a batch with a padded source", lambda: _decoder_case(3, 5, 7, 1, True)),
        Case("target and source of equal length", lambda: _decoder_case(2, 5, 5, 2, False)),
        Case("a one-token target (the first generation step)", lambda: _decoder_case(2, 1, 4, 3, True)),
    ],
    hints=[
        "Three sublayers in the order of section 1, each in Post-Norm form: x = norm_k(x + sublayer(x)). "
        "No normalized copy h this time: the sublayer reads x itself.",
        "Masked self-attention reads x for queries, keys and values and takes tgt_mask; the FFN reads x. "
        "Which tensor gives the cross-attention's queries, and which its keys and values?",
        "x = norm1(x + self_attn(x, x, x, tgt_mask)); for cross-attention the queries are x and the keys and values "
        "the memory, with memory_mask; then the FFN sublayer with norm3.",
    ],
    level="medium",
    kind="build",
    wrong=[_post_memory_queries],  # raises unless T == S: no sentence of its own
    mistakes=[
        Mistake(
            _post_pre_norm,
            "each sublayer read a normalized copy and its sum stayed unnormalized: that is the Pre-Norm layer of "
            "section 1, and this exercise asks for Post-Norm, where the LayerNorm comes after the addition.",
        ),
        Mistake(
            _post_norm_on_sublayer,
            "each LayerNorm was applied to the sublayer's output before the addition: Post-Norm normalizes the "
            "SUM, norm_k(x + sublayer(x)), so that the stream itself leaves every sublayer normalized.",
        ),
        Mistake(
            _post_cross_on_self,
            "the cross-attention never looked at the source: its keys and values came from the decoder's own "
            "stream, so it was a second self-attention.",
        ),
        Mistake(
            _post_queries_from_memory,
            "the cross-attention's roles were swapped: the source asked the questions and the decoder's stream "
            "answered, so there is one result per source token instead of one per target position.",
        ),
        Mistake(
            _post_no_causal,
            "the self-attention was not masked: each target position also attended to the positions after it, "
            "which do not exist yet when the model generates.",
        ),
        Mistake(
            _post_no_memory_mask,
            "the cross-attention also attended to the source's padding: the source's mask was not used where the "
            "decoder reads the memory.",
        ),
        Mistake(
            _post_norm_memory,
            "the memory was normalized again before the cross-attention: the encoder's output arrives normalized "
            "already, and each of the three norms belongs to one sum of the decoder's stream (section 1).",
        ),
    ],
    forbidden=[DecoderLayer, Decoder, sublayer_connection, nn.TransformerDecoderLayer],
    shortcuts=[_post_norm_with_library, _post_norm_with_connections],
)


# --- 3. debug the notes: the decoder must read the target -------------------------------------------


def _forward_reference(model: nn.Module, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
    memory = model.encoder(model.positional(model.src_embed(src)), src_mask)  # (B, S, D): the source, encoded
    y = model.positional(model.tgt_embed(tgt_in))  # (B, T, D): the TARGET (shifted right) is the decoder's input
    causal = torch.ones(tgt_in.shape[1], tgt_in.shape[1], dtype=torch.bool).tril()  # (T, T): target positions
    out = model.decoder(y, memory, causal, src_mask)  # (B, T, D); cross-attention skips padded source tokens
    return model.generator(out)  # (B, T, V): one prediction per TARGET position


def notes_forward(model: nn.Module, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
    """Note 000's `Transformer.forward`, in the course's parts: the decoder reads the embedded SOURCE."""
    x = model.positional(model.src_embed(src))  # (B, S, D)
    memory = model.encoder(x)  # (B, S, D)
    out = model.decoder(x, memory, causal_mask(src.shape[1]))  # the decoder reads x too
    return model.generator(out)  # (B, S, V)


def _forward_source_embedding(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)), src_mask)
    y = model.positional(model.src_embed(tgt_in))  # the target read with the source's table
    return model.generator(model.decoder(y, memory, causal_mask(tgt_in.shape[1]), src_mask))


def _forward_no_causal(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)), src_mask)
    y = model.positional(model.tgt_embed(tgt_in))
    return model.generator(model.decoder(y, memory, None, src_mask))  # every position sees the future


def _forward_no_src_mask(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)))
    y = model.positional(model.tgt_embed(tgt_in))
    return model.generator(model.decoder(y, memory, causal_mask(tgt_in.shape[1])))


def _forward_encoder_unmasked(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)))  # note 000's encoder call kept: no mask
    y = model.positional(model.tgt_embed(tgt_in))
    return model.generator(model.decoder(y, memory, causal_mask(tgt_in.shape[1]), src_mask))


def _forward_no_positions(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.positional(model.src_embed(src)), src_mask)
    y = model.tgt_embed(tgt_in)  # the decoder cannot tell its positions apart
    return model.generator(model.decoder(y, memory, causal_mask(tgt_in.shape[1]), src_mask))


def _forward_source_no_positions(model, src, tgt_in, src_mask=None):  # noqa: ANN001, ANN202
    memory = model.encoder(model.src_embed(src), src_mask)  # the encoder cannot tell its positions apart
    y = model.positional(model.tgt_embed(tgt_in))
    return model.generator(model.decoder(y, memory, causal_mask(tgt_in.shape[1]), src_mask))


def _forward_case(src: list[list[int]], tgt_in: list[list[int]], seed: int, masked: bool) -> tuple[object, ...]:
    torch.manual_seed(seed)
    config = TransformerConfig(10, 12, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=16)
    model = Transformer(config).eval()
    source = torch.tensor(src)
    mask = source.ne(0)[:, None, None, :] if masked else None  # (B, 1, 1, S), pad id 0
    return model, source, torch.tensor(tgt_in), mask


transformer_forward = Exercise(
    "transformer_forward",
    reference=_forward_reference,
    cases=[
        Case("source of 5 tokens, target of 3", lambda: _forward_case([[3, 4, 5, 6, 7]], [[1, 8, 9]], 0, False)),
        Case("source and target of equal length", lambda: _forward_case([[3, 4, 5, 6]], [[1, 11, 10, 9]], 1, False)),
        Case(
            "a batch with a padded source and its mask",
            lambda: _forward_case(
                [[3, 4, 5, 6, 7], [8, 9, 2, 0, 0]], [[1, 4, 5, 6, 7, 8], [1, 9, 3, 2, 5, 6]], 2, True
            ),
        ),
        Case("a one-token target: <bos> only", lambda: _forward_case([[2, 3, 4], [5, 6, 0]], [[1], [1]], 3, True)),
    ],
    hints=[
        "Which of the function's inputs does notes_forward never read? The decoder's input should come from it.",
        "The source goes through src_embed, positional and the encoder (with src_mask). The decoder's input is "
        "the target tgt_in, through the target's own embedding table and the positional encoding.",
        "The decoder needs the causal mask of the TARGET's length T = tgt_in.shape[1] and the source's padding "
        "mask for its cross-attention: model.decoder(y, memory, causal, src_mask); then model.generator.",
    ],
    level="medium",
    kind="debug",
    mistakes=[
        Mistake(
            notes_forward,
            "the decoder read the embedded source, as in note 000: tgt_in was never used, so there is one "
            "prediction per source position and none depends on the target.",
        ),
        Mistake(
            _forward_source_embedding,
            "the target's ids were looked up in the source's embedding table: the target has a table of its own.",
        ),
        Mistake(
            _forward_no_causal,
            "the decoder's self-attention was not masked: in training each target position saw the very tokens it "
            "is asked to predict.",
        ),
        Mistake(
            _forward_no_src_mask,
            "the source's padding mask was never used: the encoder and the decoder's cross-attention both attended "
            "to PAD tokens.",
        ),
        Mistake(
            _forward_encoder_unmasked,
            "the encoder attended to the source's PAD tokens: the padding mask reached the decoder's "
            "cross-attention but not the encoder, as in note 000's call of the encoder.",
        ),
        Mistake(
            _forward_no_positions,
            "the target got no positional encoding: the decoder could not tell its positions apart.",
        ),
        Mistake(
            _forward_source_no_positions,
            "the source got no positional encoding: the encoder could not tell its positions apart, so the memory "
            "says which letters the source holds but not in which order (chapter 06, section 5).",
        ),
    ],
    forbidden=[Transformer],
    shortcuts=[
        lambda model, src, tgt_in, src_mask=None: model(src, tgt_in, src_mask),
        lambda model, src, tgt_in, src_mask=None: model.decode(tgt_in, model.encode(src, src_mask), src_mask),
        lambda model, src, tgt_in, src_mask=None: getattr(Transformer, "for" + "ward")(model, src, tgt_in, src_mask),
    ],
)


# --- 4. predict: the best note 000's wiring can do on "copy or reverse" -----------------------------


def _best_loss_reference() -> float:
    # Each of the 4 output positions is a function of the source alone: at best "source letter t or source
    # letter 3 - t, 1/2 each", ln 2 nats per position, and the 4 positions cannot agree on copy or reverse.
    return 4 * math.log(2)  # 2.773 nats per sequence (the correct decoder: ln 2, one coin flip at position 0)


predict_best_loss_like_000 = Exercise(
    "predict_best_loss_like_000",
    reference=_best_loss_reference,
    cases=[Case("your lowest loss per sequence, in nats", lambda: (), atol=0.01, rtol=0)],
    hints=[
        "In note 000's wiring, what does output position t depend on? Can position 2 know what position 0 chose?",
        "Each position must give its own probabilities, knowing the source only. Half the targets are the copy, "
        "half the reversal, and with 4 distinct letters they differ at every position.",
        "The best a position can say is 'letter t or letter 3 - t, 1/2 each': a loss of -ln(1/2) at that position. "
        "The sequence loss is the sum over the positions.",
    ],
    level="harder",
    kind="predict",
    wrong=[lambda: math.log(2), lambda: 0.0, lambda: 4 * math.log(4), lambda: math.log(24)],
    why=(
        "4 ln 2 = 2.773 nats: each position is an independent fair coin between 'copy' and 'reverse'. The correct "
        "decoder pays one coin, ln 2 = 0.693, at position 0, and then follows the choice it has written."
    ),
    explain={
        math.log(2): (
            "ln 2 is the bound of the CORRECT decoder, which flips one coin at position 0 and then reads what it "
            "wrote; it is also note 000's loss at ONE position. The question asks for the whole sequence: can note "
            "000's positions read each other's choices, and how many coins does the sum over the 4 positions hold?"
        ),
        4.0: "that count is in bits (logarithms to base 2); the question asks for nats (natural logarithms).",
        0.0: "each source has two valid targets, drawn 1/2 each: no model can be sure of the answer.",
        4 * math.log(4): "each position has only two plausible letters (copy or reverse), not four.",
        math.log(24): "the loss counts the two valid answers per source, not all orderings of the letters.",
    },
)


# --- 5. transfer: masked self-attention for one new token, with a KV cache ---------------------------


def _cached_reference(
    attn: nn.Module, h_new: Tensor, k_cache: Tensor, v_cache: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    batch, _, d_model = h_new.shape  # h_new (B, 1, D): the normalized stream at the newest position only
    n_heads = attn.n_heads
    d_k = d_model // n_heads

    def heads(t: Tensor) -> Tensor:  # (B, 1, D) -> (B, H, 1, d_k)
        return t.view(batch, -1, n_heads, d_k).transpose(1, 2)

    q = heads(attn.w_q(h_new))  # (B, H, 1, d_k): only the new token asks
    k = torch.cat([k_cache, heads(attn.w_k(h_new))], dim=2)  # (B, H, t + 1, d_k): the old keys and the new one
    v = torch.cat([v_cache, heads(attn.w_v(h_new))], dim=2)  # (B, H, t + 1, d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, 1, t + 1); no mask: nothing lies in its future
    weights = scores.softmax(dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, 1, d_model)  # (B, 1, D): the heads merged
    return attn.w_o(out), k, v


def _cached_parts(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    batch, _, d_model = h_new.shape
    d_k = d_model // attn.n_heads

    def heads(t):  # noqa: ANN001, ANN202
        return t.view(batch, -1, attn.n_heads, d_k).transpose(1, 2)

    return heads, heads(attn.w_q(h_new)), heads(attn.w_k(h_new)), heads(attn.w_v(h_new)), d_k


def _attend(attn, q, k, v, d_k, batch, d_model, scale=True):  # noqa: ANN001, ANN202
    scores = q @ k.transpose(-2, -1) / (math.sqrt(d_k) if scale else 1.0)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, 1, d_model)
    return attn.w_o(out)


def _cached_no_append(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k, v, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    return _attend(attn, q, k, v, d_k, *h_new.shape[::2]), k, v  # forgets the cache: sees only itself


def _cached_old_only(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    if k_cache.shape[2] == 0:
        return _attend(attn, q, k, v, d_k, *h_new.shape[::2]), k, v
    return _attend(attn, q, k_cache, v_cache, d_k, *h_new.shape[::2]), k, v  # the new token does not see itself


def _cached_no_scale(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    return _attend(attn, q, k, v, d_k, *h_new.shape[::2], scale=False), k, v


def _cached_scale_d_model(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    d_model = h_new.shape[-1]
    return _attend(attn, q, k, v, d_model, *h_new.shape[::2]), k, v  # sqrt(d_model) where sqrt(d_k) belongs


def _cached_new_first(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_new, k_cache], 2), torch.cat([v_new, v_cache], 2)  # the new key in front
    return _attend(attn, q, k, v, d_k, *h_new.shape[::2]), k, v


def _cached_softmax_over_queries(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(d_k)).softmax(-2)  # over the single query: every weight is 1
    out = (weights @ v).transpose(1, 2).reshape(h_new.shape)
    return attn.w_o(out), k, v


def _cached_no_w_o(attn, h_new, k_cache, v_cache):  # noqa: ANN001, ANN202
    _, q, k_new, v_new, d_k = _cached_parts(attn, h_new, k_cache, v_cache)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(h_new.shape), k, v


def _cache_case(batch: int, cached: int, d_model: int, n_heads: int, seed: int) -> tuple[object, ...]:
    """A self-attention layer, the first `cached` positions' keys and values projected, and the next position."""
    torch.manual_seed(seed)
    attn = MultiHeadAttention(d_model, n_heads)
    g = torch.Generator().manual_seed(seed + 1)
    h = torch.randn(batch, cached + 1, d_model, generator=g)  # (B, t + 1, D): the whole prefix, normalized
    with torch.no_grad():
        k_cache, v_cache = attn.project_kv(h[:, :cached], h[:, :cached])  # (B, H, t, d_k) each
    return attn, h[:, cached:], k_cache, v_cache


cached_self_attention = Exercise(
    "cached_self_attention",
    reference=_cached_reference,
    cases=[
        Case("the first step: an empty cache", lambda: _cache_case(1, 0, 8, 2, 0)),
        Case("three tokens cached", lambda: _cache_case(1, 3, 8, 2, 1)),
        Case("a batch of 2, five tokens cached, 4 heads", lambda: _cache_case(2, 5, 16, 4, 2)),
        Case("one head", lambda: _cache_case(3, 2, 8, 1, 3)),
    ],
    hints=[
        "Only the new token is new: project it with w_q, w_k and w_v, split into heads, and put its key and value "
        "after the cached ones. Then the new query attends to all of them.",
        "Split a (B, 1, D) projection into heads with .view(B, 1, H, d_k).transpose(1, 2); the cache grows along "
        "dim=2, the position axis: torch.cat([k_cache, k_new], dim=2). No mask is needed: the cache holds only "
        "earlier positions, and a position may see itself.",
        "scores = q @ k.transpose(-2, -1) / sqrt(d_k) is (B, H, 1, t + 1); softmax over the last axis, times v, "
        "merge the heads back to (B, 1, D) and apply w_o. Return (that output, k, v).",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _cached_no_append,
            "the new query attended only to its own key and value: the earlier positions' keys and values in the "
            "cache were neither used nor kept.",
        ),
        Mistake(
            _cached_old_only,
            "the new token did not attend to itself: its own key and value were left out of its attention, but a "
            "position may see itself (the causal mask keeps the diagonal).",
        ),
        Mistake(
            _cached_no_scale,
            "the scores were not divided by the square root of d_k before the softmax, so the weights came out "
            "too peaked.",
        ),
        Mistake(
            _cached_scale_d_model,
            "the scores were divided by the square root of d_model, not of d_k = d_model / n_heads: each head's "
            "dot products add up only d_k terms.",
        ),
        Mistake(
            _cached_softmax_over_queries,
            "the softmax ran over the axis of the single query, so every weight became 1: a query's weights "
            "share 1 among the keys.",
        ),
        Mistake(
            _cached_new_first,
            "the new key and value went in front of the cached ones. This step's output does not show it (attention "
            "sums over the keys in any order), but the cache must keep the positions in order, the newest last: a "
            "mask over the cached positions (a padded prompt, several tokens in one step) addresses them by index.",
        ),
        Mistake(
            _cached_no_w_o,
            "the heads were merged but the output projection w_o was never applied.",
        ),
    ],
    output_names=["your out", "your k", "your v"],
    forbidden=[
        MultiHeadAttention.forward,
        MultiHeadAttention.attend,
        MultiHeadAttention.project_kv,
        DecoderLayer,
        Decoder,
        Transformer,
    ],
    shortcuts=[
        lambda attn, h, k, v: _shortcut_attend(attn, h, k, v),
        lambda attn, h, k, v: _shortcut_layer(attn, h, k, v),
    ],
)


def _shortcut_attend(attn: MultiHeadAttention, h: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, ...]:
    k_new, v_new = attn.project_kv(h, h)
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    return attn.attend(h, k, v), k, v


def _shortcut_layer(attn: MultiHeadAttention, h: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, ...]:
    cache = LayerCache(k_cache, v_cache)
    out = DecoderLayer._self_attention(SimpleNamespace(self_attn=attn), h, None, cache)
    return out, cache.self_k, cache.self_v
