"""Greedy and beam decoding (transformer_lab/decoding.py, chapter 09)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import transformer_lab as tl
from transformer_lab.decoding import _last_logits, beam_search, greedy_decode

PAD, BOS, EOS = 0, 1, 2
V = 13
TOLERANCES = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, norm_first: bool = True) -> tl.Transformer:
    torch.manual_seed(seed)
    config = tl.TransformerConfig(V, V, d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.1, norm_first=norm_first)
    return tl.Transformer(config).to(dtype)


def make_src(seed: int = 1, batch: int = 4, length: int = 6) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (batch, length), generator=g)
    src[1, 3:] = PAD  # padding in the source
    src[3, 1:] = PAD
    return src, tl.padding_mask(src, PAD)


def check_format(out: Tensor, batch: int, max_len: int) -> None:
    """BOS first, at most max_len generated tokens, only padding after a row's first EOS."""
    assert out.dtype == torch.long and out.shape[0] == batch
    assert 2 <= out.shape[1] <= 1 + max_len
    assert (out[:, 0] == BOS).all()
    for row in out.tolist():
        if EOS in row[1:]:
            end = row.index(EOS, 1)
            assert all(token == PAD for token in row[end + 1 :]), row


# --------------------------------------------------------------------------- a real (untrained) model


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("eos", [EOS, 5, 9])
def test_greedy_with_and_without_cache_identical(norm_first: bool, eos: int) -> None:
    model = make_model(norm_first=norm_first)
    src, src_mask = make_src()
    kwargs = dict(bos_id=BOS, eos_id=eos, pad_id=PAD, max_len=10)
    cached = greedy_decode(model, src, src_mask, **kwargs)
    plain = greedy_decode(model, src, src_mask, **kwargs, use_cache=False)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_logits_step_by_step_with_and_without_cache(dtype: torch.dtype) -> None:
    """Along the greedy path, the next-token logits from the cache equal those from recomputing the prefix."""
    model = make_model(dtype=dtype).eval()
    src, src_mask = make_src()
    tokens = greedy_decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=8)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        for t in range(1, tokens.shape[1]):
            with_cache = _last_logits(model, tokens[:, :t], memory, src_mask, cache)
            without = _last_logits(model, tokens[:, :t], memory, src_mask, None)
            torch.testing.assert_close(with_cache, without, **TOLERANCES[dtype])
            assert torch.equal(with_cache.argmax(-1)[tokens[:, t] != PAD], tokens[:, t][tokens[:, t] != PAD])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eos", [EOS, 6])
def test_beam_of_width_one_is_greedy(seed: int, eos: int) -> None:
    model = make_model(seed)
    src, src_mask = make_src(seed + 10)
    kwargs = dict(bos_id=BOS, eos_id=eos, pad_id=PAD, max_len=9)
    assert torch.equal(
        beam_search(model, src, src_mask, beam_size=1, **kwargs), greedy_decode(model, src, src_mask, **kwargs)
    )


@pytest.mark.parametrize("beam_size", [2, 3, 5])
@pytest.mark.parametrize("eos", [EOS, 4, 11])
def test_beam_with_and_without_cache_identical(beam_size: int, eos: int) -> None:
    model = make_model(3)
    src, src_mask = make_src(4)
    kwargs = dict(bos_id=BOS, eos_id=eos, pad_id=PAD, max_len=8, beam_size=beam_size)
    cached = beam_search(model, src, src_mask, **kwargs)
    plain = beam_search(model, src, src_mask, **kwargs, use_cache=False)
    assert torch.equal(cached, plain)
    check_format(cached, src.shape[0], 8)


def test_beam_results_do_not_depend_on_the_rest_of_the_batch() -> None:
    """Batched over sources: each source's answer equals decoding it alone."""
    model = make_model(5)
    src, src_mask = make_src(6)
    kwargs = dict(bos_id=BOS, eos_id=7, pad_id=PAD, max_len=7, beam_size=3)
    together = beam_search(model, src, src_mask, **kwargs)
    for b in range(src.shape[0]):
        alone = beam_search(model, src[b : b + 1], src_mask[b : b + 1], **kwargs)
        width = alone.shape[1]
        assert torch.equal(together[b, :width], alone[0])
        assert (together[b, width:] == PAD).all()


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_format_and_max_len(decode: Callable[..., Tensor]) -> None:
    model = make_model(2)
    src, src_mask = make_src(3)
    for max_len in (1, 4, 12):
        out = decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=max_len)
        check_format(out, src.shape[0], max_len)


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_training_flag_restored_and_no_gradients(decode: Callable[..., Tensor]) -> None:
    model = make_model().train()
    model.decoder.layers[0].eval()  # a mixed setting must come back as it was
    src, src_mask = make_src()
    out = decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=4)
    assert not out.requires_grad
    assert model.training and model.encoder.training and not model.decoder.layers[0].training
    assert all(p.grad is None for p in model.parameters())


def test_dropout_is_off_while_decoding() -> None:
    """Eval semantics: a model in training mode with dropout still decodes deterministically."""
    model = make_model().train()
    src, src_mask = make_src()
    kwargs = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=8)
    first = greedy_decode(model, src, src_mask, **kwargs)
    assert torch.equal(first, greedy_decode(model, src, src_mask, **kwargs))
    assert torch.equal(first, greedy_decode(model.eval(), src, src_mask, **kwargs))


def test_src_mask_none_means_every_position_visible() -> None:
    model = make_model()
    src, _ = make_src()
    kwargs = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=6)
    everything = torch.ones(src.shape[0], 1, 1, src.shape[1], dtype=torch.bool)
    assert torch.equal(greedy_decode(model, src, None, **kwargs), greedy_decode(model, src, everything, **kwargs))
    assert torch.equal(beam_search(model, src, None, **kwargs), beam_search(model, src, everything, **kwargs))


# --------------------------------------------------------------------------- a scripted model

A, B_, C = 3, 4, 5  # three ordinary tokens of the scripted vocabulary [PAD, BOS, EOS, A, B, C]
SCRIPT_V = 6

Table = Callable[[int, tuple[int, ...]], dict[int, float]]


class ScriptedModel(tl.Transformer):
    """A Transformer whose `decode` returns log-probabilities from a hand-written table.

    `table(source_id, prefix)` gives the next-token probabilities after `prefix` (BOS first);
    `source_id` is the first token of the source row, so rows can behave differently. With a
    cache, the prefix is kept in the cache (in the first layer's `self_k` slot), so a wrong
    `DecoderCache.reorder` in beam search would give wrong probabilities.
    """

    def __init__(self, table: Table) -> None:
        config = tl.TransformerConfig(SCRIPT_V, SCRIPT_V, d_model=4, n_heads=1, d_ff=4, n_layers=1, max_len=32)
        super().__init__(config)
        self.table = table

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return src[:, :, None].to(torch.float64).expand(-1, -1, self.config.d_model)  # (B, S, D), holds the ids

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None, cache=None) -> Tensor:  # noqa: ANN001
        prefix = tgt
        if cache is not None:
            layer = cache.layers[0]
            if layer.self_k is not None:
                prefix = torch.cat([layer.self_k[:, 0, :, 0].long(), tgt], dim=1)
            layer.self_k = prefix[:, None, :, None].to(torch.float64)  # (B, 1, L, 1)
            cache.length += tgt.shape[1]
        new, length = tgt.shape[1], prefix.shape[1]
        out = torch.empty(tgt.shape[0], new, SCRIPT_V, dtype=torch.float64)
        for b in range(tgt.shape[0]):
            for j in range(new):
                seen = tuple(prefix[b, : length - new + j + 1].tolist())
                out[b, j] = distribution(self.table(int(memory[b, 0, 0]), seen)).log()
        return out


def distribution(probs: dict[int, float]) -> Tensor:
    """A probability vector over the scripted vocabulary: the given tokens, the rest shared by the others."""
    p = torch.full((SCRIPT_V,), 1e-9, dtype=torch.float64)
    for token, value in probs.items():
        p[token] = value
    rest = [t for t in (EOS, A, B_, C) if t not in probs]
    if rest:
        p[rest] = (1.0 - sum(probs.values())) / len(rest)
    return p / p.sum()


def log_prob(table: Table, source: int, generated: list[int]) -> float:
    """The model's log-probability of a whole generated sequence (the test's own scoring)."""
    prefix = (BOS,)
    total = 0.0
    for token in generated:
        total += math.log(float(distribution(table(source, prefix))[token]))
        prefix += (token,)
    return total


def scripted_kwargs(**extra: object) -> dict:
    return dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, **extra)


def better_than_greedy_table(source: int, prefix: tuple[int, ...]) -> dict[int, float]:
    """Greedy takes A (0.5) but then nothing is likely; B (0.4) leads to a near-certain EOS."""
    if prefix == (BOS,):
        return {A: 0.5, B_: 0.4, EOS: 0.05, C: 0.05}
    if prefix == (BOS, A):
        return {EOS: 0.4, A: 0.2, B_: 0.2, C: 0.2}
    if prefix == (BOS, B_):
        return {EOS: 0.9}
    return {EOS: 0.97}


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_finds_a_better_sequence_than_greedy(use_cache: bool) -> None:
    model = ScriptedModel(better_than_greedy_table)
    src = torch.tensor([[A, A]])
    greedy = greedy_decode(model, src, **scripted_kwargs(max_len=5, use_cache=use_cache))
    beam = beam_search(model, src, **scripted_kwargs(max_len=5, beam_size=2, use_cache=use_cache))
    assert greedy.tolist() == [[BOS, A, EOS]]
    assert beam.tolist() == [[BOS, B_, EOS]]
    assert log_prob(better_than_greedy_table, A, [B_, EOS]) > log_prob(better_than_greedy_table, A, [A, EOS])


def length_table(source: int, prefix: tuple[int, ...]) -> dict[int, float]:
    """EOS at once is likely (0.3, log -1.20); A A EOS has lower total (-1.90) but a better mean (-0.63)."""
    if prefix == (BOS,):
        return {A: 0.6, EOS: 0.3, B_: 0.05, C: 0.05}
    if prefix == (BOS, A):
        return {A: 0.5, EOS: 0.1, B_: 0.2, C: 0.2}
    if prefix == (BOS, A, A):
        return {EOS: 0.5, A: 0.3, B_: 0.1, C: 0.1}
    return {EOS: 0.2, A: 0.3, B_: 0.3, C: 0.2}


@pytest.mark.parametrize("use_cache", [True, False])
def test_length_penalty_changes_the_winner(use_cache: bool) -> None:
    model = ScriptedModel(length_table)
    src = torch.tensor([[A]])
    short, long = [EOS], [A, A, EOS]
    # The documented normalisation: log P / n ** alpha, n counting EOS.
    for alpha, winner in ((0.0, short), (1.0, long)):
        scores = {tuple(s): log_prob(length_table, A, s) / len(s) ** alpha for s in (short, long)}
        assert max(scores, key=scores.get) == tuple(winner)
    kwargs = scripted_kwargs(max_len=6, beam_size=3, use_cache=use_cache)
    assert beam_search(model, src, length_penalty=0.0, **kwargs).tolist() == [[BOS, *short]]
    assert beam_search(model, src, length_penalty=1.0, **kwargs).tolist() == [[BOS, *long]]


@pytest.mark.parametrize("use_cache", [True, False])
def test_gnmt_length_norm_ranks_by_the_gnmt_penalty(use_cache: bool) -> None:
    model = ScriptedModel(length_table)
    src = torch.tensor([[A]])
    short, long = [EOS], [A, A, EOS]
    kwargs = scripted_kwargs(max_len=6, beam_size=3, use_cache=use_cache, length_penalty=1.0)
    # At alpha = 1, n ** alpha prefers the long one; GNMT's ((5 + n) / 6) ** alpha penalises length less
    # and keeps the short one (the test's own scoring decides which).
    gnmt = {tuple(s): log_prob(length_table, A, s) / ((5 + len(s)) / 6) for s in (short, long)}
    assert max(gnmt, key=gnmt.get) == tuple(short)
    assert beam_search(model, src, **kwargs).tolist() == [[BOS, *long]]
    assert beam_search(model, src, length_norm="gnmt", **kwargs).tolist() == [[BOS, *short]]
    with pytest.raises(ValueError, match="length_norm must be"):
        beam_search(model, src, length_norm="wu", **kwargs)


def rows_table(source: int, prefix: tuple[int, ...]) -> dict[int, float]:
    """Source A: EOS after 1 token; source B: EOS after 3 tokens; source C: never EOS."""
    generated = len(prefix) - 1
    if source == A:
        return {EOS: 0.9} if generated >= 1 else {A: 0.9}
    if source == B_:
        return {EOS: 0.9} if generated >= 3 else {B_: 0.9}
    return {C: 0.9, EOS: 1e-6}


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_eos_pad_filling_and_max_len(decode: Callable[..., Tensor], use_cache: bool) -> None:
    model = ScriptedModel(rows_table)
    src = torch.tensor([[A, PAD], [B_, A], [C, C]])
    out = decode(model, src, **scripted_kwargs(max_len=5, use_cache=use_cache))
    assert out.tolist() == [
        [BOS, A, EOS, PAD, PAD, PAD],
        [BOS, B_, B_, B_, EOS, PAD],
        [BOS, C, C, C, C, C],  # reached max_len without EOS
    ]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_stops_early_when_every_row_has_finished(decode: Callable[..., Tensor], use_cache: bool) -> None:
    model = ScriptedModel(rows_table)
    src = torch.tensor([[A], [B_], [A]])
    out = decode(model, src, **scripted_kwargs(max_len=20, use_cache=use_cache))
    assert out.tolist() == [[BOS, A, EOS, PAD, PAD], [BOS, B_, B_, B_, EOS], [BOS, A, EOS, PAD, PAD]]


def test_greedy_stops_calling_the_model_once_all_rows_ended() -> None:
    calls = []

    class Counting(ScriptedModel):
        def decode(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(1)
            return super().decode(*args, **kwargs)

    greedy_decode(Counting(rows_table), torch.tensor([[A], [A]]), **scripted_kwargs(max_len=20))
    assert len(calls) == 2  # A, then EOS


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_bad_arguments(decode: Callable[..., Tensor]) -> None:
    model = make_model()
    src, src_mask = make_src()
    good = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=4)
    with pytest.raises(TypeError, match="model must be a transformer_lab Transformer"):
        decode(torch.nn.Linear(2, 2), src, **good)
    with pytest.raises(TypeError, match="src must be an integer tensor"):
        decode(model, src.float(), **good)
    with pytest.raises(ValueError, match="src must have shape"):
        decode(model, src[0], **good)
    with pytest.raises(TypeError, match="src_mask must be a bool tensor"):
        decode(model, src, src_mask.float(), **good)
    with pytest.raises(ValueError, match="src_mask of shape"):
        decode(model, src, src_mask[:, :, :, :2], **good)
    with pytest.raises(ValueError, match="eos_id=13 is outside the target vocabulary"):
        decode(model, src, **{**good, "eos_id": V})
    with pytest.raises(TypeError, match="bos_id must be an int"):
        decode(model, src, **{**good, "bos_id": 1.0})
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        decode(model, src, **{**good, "max_len": 0})
    with pytest.raises(ValueError, match="longer than the model's positional encoding"):
        decode(model, src, **{**good, "max_len": model.config.max_len + 1})
    with pytest.raises(TypeError, match="use_cache must be True or False"):
        decode(model, src, **good, use_cache=1)
    with pytest.raises(TypeError):
        decode(model, src, src_mask, BOS, EOS, PAD, 4)  # keyword-only ids


def test_bad_beam_arguments() -> None:
    model = make_model()
    src, src_mask = make_src()
    good = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=4)
    with pytest.raises(ValueError, match="beam_size must be a positive int"):
        beam_search(model, src, **good, beam_size=0)
    with pytest.raises(ValueError, match="length_penalty must be a finite float >= 0"):
        beam_search(model, src, **good, length_penalty=-1.0)
    with pytest.raises(TypeError, match="length_penalty must be a float"):
        beam_search(model, src, **good, length_penalty="1")


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_cache_projects_the_source_once_per_source(decode: Callable[..., Tensor]) -> None:
    """With the cache, cross-attention keys and values are projected once, for the B sources (not
    for B * beam_size rows: the beams get copies through DecoderCache.reorder)."""
    model = tl.record_attention(make_model(), False)
    src, src_mask = make_src()
    batches: list[list[int]] = []
    for layer in model.decoder.layers:
        seen: list[int] = []
        original = layer.cross_attn.project_kv

        def wrapped(key, value, original=original, seen=seen):  # noqa: ANN001, ANN202
            seen.append(key.shape[0])
            return original(key, value)

        layer.cross_attn.project_kv = wrapped
        batches.append(seen)
    out = decode(model, src, src_mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=6)
    assert out.shape[1] > 2  # several steps were decoded
    assert batches == [[src.shape[0]]] * len(model.decoder.layers)
