"""Generating a target sequence from a trained model: greedy and beam decoding (chapter 09).

At inference there is no target to feed: the decoder starts from BOS and appends one token at a
time, each chosen from the logits of the last position.

- `greedy_decode` takes the most likely token at every step.
- `beam_search` keeps the `beam_size` best partial sequences (beams, 束) and ranks finished ones
  by length-normalised log-probability.

Both run the encoder once. With `use_cache=True` the decoder keeps each layer's self-attention
keys and values in a `DecoderCache` and projects the source's cross-attention keys and values
once per source, so each step costs one token's worth of work; `use_cache=False` feeds the whole
prefix at every step (the simple reference, tested to give the same tokens).

Shape legend: B sources in the batch, K beam size, S source length, L decoded length, V target
vocabulary size, D d_model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from transformer_lab._checks import check_positive_int, check_source_mask, check_tokens
from transformer_lab.decoder import DecoderCache

__all__ = ["greedy_decode", "beam_search"]


@contextmanager
def _inference_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode and no gradients inside; every submodule's own training flag restored afterwards."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in flags:
            module.training = training


def _check_arguments(
    model: object,
    src: object,
    src_mask: object,
    bos_id: object,
    eos_id: object,
    pad_id: object,
    max_len: object,
) -> None:
    # Imported here: model.py does not import this module, but keeping the import local makes
    # `tl.decoding` cheap to load on its own.
    from transformer_lab.model import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a transformer_lab Transformer, got {type(model).__name__}")
    config = model.config
    check_tokens("src", src, config.src_vocab_size, device=model._device())
    assert isinstance(src, Tensor)
    if src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(f"src must hold at least one token per row and one row, got shape {tuple(src.shape)}")
    if src_mask is not None:
        check_source_mask("src_mask", src_mask, src.shape[0], src.shape[1], device=src.device)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int token id, got {value!r}")
        if not 0 <= value < config.tgt_vocab_size:
            raise ValueError(f"{name}={value} is outside the target vocabulary [0, {config.tgt_vocab_size})")
    check_positive_int("max_len", max_len)
    assert isinstance(max_len, int)
    if max_len > config.max_len:
        # The last step feeds BOS plus max_len - 1 generated tokens, so positions up to max_len - 1 are used.
        raise ValueError(
            f"max_len={max_len} is longer than the model's positional encoding allows "
            f"(config.max_len={config.max_len}); pass max_len <= {config.max_len}"
        )


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _batch_mask(src_mask: Tensor | None, batch: int, length: int) -> Tensor | None:
    """A source mask broadcastable to (B, 1, 1, S), made exactly (B, 1, 1, S) so rows can be selected."""
    if src_mask is None:
        return None
    mask = src_mask.reshape((1,) * (4 - src_mask.dim()) + tuple(src_mask.shape))  # (.., .., .., S) -> 4-D
    return mask.expand(batch, 1, 1, length)  # (B, 1, 1, S)


def _last_logits(
    model: nn.Module, tokens: Tensor, memory: Tensor, src_mask: Tensor | None, cache: DecoderCache | None
) -> Tensor:
    """Logits of the next token after `tokens` (rows, L): (rows, V).

    With a cache only the last token is fed (the earlier ones are in the cache); without, the whole
    prefix is decoded again.
    """
    if cache is not None:
        if cache.length != tokens.shape[1] - 1:
            raise RuntimeError(f"cache holds {cache.length} positions, expected {tokens.shape[1] - 1}")
        return model.decode(tokens[:, -1:], memory, src_mask, cache=cache)[:, -1]  # (rows, 1, V) -> (rows, V)
    return model.decode(tokens, memory, src_mask)[:, -1]  # (rows, L, V) -> (rows, V)


def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int,
    use_cache: bool = True,
) -> Tensor:
    """Decode by taking the most likely next token at every step (chapter 09).

    Runs under `torch.no_grad()` in eval mode (dropout off); the training flags of `model` and
    its submodules are restored afterwards.

    Args:
        model: a `Transformer`.
        src: source token ids.
        src_mask: bool mask broadcastable to (B, 1, 1, S), True = real source token (e.g.
            `tl.padding_mask(src, src_pad_id)`); None means every source position is visible.
        bos_id: the token every target starts with.
        eos_id: the token that ends a row; it is kept in the output.
        pad_id: written after a row's EOS.
        max_len: the most tokens generated after BOS (EOS included); at most `config.max_len`.
        use_cache: decode with a KV cache (one new token per step) or recompute the whole prefix
            at every step (the reference); both give the same tokens.

    Shape:
        src (B, S). Returns a LongTensor (B, 1 + n) with n <= max_len: BOS, then the generated
        tokens, each row ending at its first EOS and padded with `pad_id` after it. Decoding stops
        early, with n < max_len, once every row has produced EOS.
    """
    _check_arguments(model, src, src_mask, bos_id, eos_id, pad_id, max_len)
    _check_flag("use_cache", use_cache)
    batch, length = src.shape
    mask = _batch_mask(src_mask, batch, length)
    with _inference_mode(model):
        memory = model.encode(src, mask)  # (B, S, D)
        cache = model.new_cache() if use_cache else None
        tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len):
            logits = _last_logits(model, tokens, memory, mask, cache)  # (B, V)
            next_token = logits.argmax(dim=-1)  # (B,)
            next_token = next_token.masked_fill(finished, pad_id)  # rows already ended get padding
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + 1)
            finished = finished | (next_token == eos_id)
            if bool(finished.all()):
                break
    return tokens


def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    use_cache: bool = True,
    length_norm: str = "power",
) -> Tensor:
    """Beam search (束搜索): keep the `beam_size` best partial targets per source (chapter 09).

    Each step extends every live beam by every token, scores the extensions by their summed
    log-probability, and keeps the best ones. A candidate that ends in EOS and ranks within the
    best `beam_size` of its step is set aside as a finished hypothesis; the search for a source
    ends when it holds `beam_size` finished hypotheses (the rule of fairseq and of Hugging Face's
    `early_stopping=True`), or at `max_len`, where the live beams are added as finished without EOS.
    With `beam_size=1` this is exactly greedy decoding.

    Finished hypotheses are ranked by the normalised score

        score(y) = log P(y_1, ..., y_n | x) / lp(n),   lp(n) = n ** length_penalty

    where n counts the generated tokens including EOS (BOS is not counted). `length_penalty=0`
    ranks by raw log-probability, which favours short outputs; 1.0 ranks by the mean
    log-probability per token. With `length_norm="gnmt"`, lp(n) = ((5 + n) / 6) ** length_penalty
    instead: the length penalty of Google's NMT system (Wu et al. 2016), which the paper uses with
    alpha = 0.6 (section 6.1); it equals 1 at n = 1 and grows more slowly than n ** alpha.
    The beams themselves are always ranked by raw log-probability
    (they all have the same length at a given step).

    Runs under `torch.no_grad()` in eval mode; the training flags are restored afterwards.

    Args:
        model, src, src_mask, bos_id, eos_id, pad_id, max_len, use_cache: as in `greedy_decode`.
            With the cache the encoder runs once, the first step runs once per source (all beams
            start from the same BOS), so cross-attention keys and values are projected once per
            source and then copied to the beams with `DecoderCache.reorder`.
        beam_size: the number of beams K kept per source.
        length_penalty: the exponent alpha of the length normalisation above (>= 0).
        length_norm: "power" (n ** alpha, the default) or "gnmt" (((5 + n) / 6) ** alpha).

    Shape:
        src (B, S). Returns a LongTensor (B, 1 + n), n <= max_len: per source the best finished
        hypothesis, BOS first, padded with `pad_id` after its EOS (or after its last token when it
        reached max_len without EOS).
    """
    _check_arguments(model, src, src_mask, bos_id, eos_id, pad_id, max_len)
    _check_flag("use_cache", use_cache)
    check_positive_int("beam_size", beam_size)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise TypeError(f"length_penalty must be a float >= 0, got {length_penalty!r}")
    if not (math.isfinite(length_penalty) and length_penalty >= 0):
        raise ValueError(f"length_penalty must be a finite float >= 0, got {length_penalty}")
    if length_norm not in ("power", "gnmt"):
        raise ValueError(
            f'length_norm must be "power" (n ** alpha) or "gnmt" (((5 + n) / 6) ** alpha), got {length_norm!r}'
        )

    def normalised(score: float, n: int) -> float:
        """log P(y) / lp(n): the score finished hypotheses are ranked by."""
        base = n if length_norm == "power" else (5 + n) / 6
        return score / base**length_penalty

    batch, src_len = src.shape
    device = src.device
    mask = _batch_mask(src_mask, batch, src_len)
    # finished[b] holds (normalised score, generated tokens) of source b's finished hypotheses.
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch

    with _inference_mode(model):
        memory = model.encode(src, mask)  # (B, S, D)
        cache = model.new_cache() if use_cache else None
        beams = 1  # live beams per source: one (BOS) before the first step, beam_size after it
        tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)  # (B * beams, L)
        scores = torch.zeros(batch, 1, dtype=torch.float64, device=device)  # (B, beams) summed log-probs
        memory_rows, mask_rows = memory, mask  # memory (and mask) repeated for each live beam

        for step in range(1, max_len + 1):  # `step` tokens generated after this iteration
            logits = _last_logits(model, tokens, memory_rows, mask_rows, cache)  # (B * beams, V)
            vocab = logits.shape[-1]
            log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)  # (B * beams, V)
            candidates = (scores[:, :, None] + log_probs.view(batch, beams, vocab)).view(batch, beams * vocab)
            n_best = min(2 * beam_size, beams * vocab)  # 2K: enough to refill K beams after EOS is set aside
            top_scores, top_index = candidates.topk(n_best, dim=1)  # (B, 2K), best first
            top_scores, top_index = top_scores.tolist(), top_index.tolist()

            rows: list[int] = []  # the row of `tokens` each new beam extends
            next_tokens: list[int] = []
            next_scores: list[float] = []
            for b in range(batch):
                kept = 0
                if not done[b]:
                    for rank, (score, index) in enumerate(zip(top_scores[b], top_index[b], strict=True)):
                        if score == float("-inf") or kept == beam_size:
                            break
                        origin, token = divmod(index, vocab)  # which beam, which token
                        row = b * beams + origin
                        if token == eos_id:
                            if rank < beam_size:
                                generated = tokens[row, 1:].tolist() + [eos_id]
                                finished[b].append((normalised(score, step), generated))
                            continue
                        rows.append(row)
                        next_tokens.append(token)
                        next_scores.append(score)
                        kept += 1
                    if len(finished[b]) >= beam_size:
                        done[b] = True
                # Finished sources (and sources with fewer than K candidates) keep placeholder beams
                # with score -inf, so every source has exactly K rows.
                for _ in range(beam_size - kept):
                    rows.append(b * beams)
                    next_tokens.append(pad_id)
                    next_scores.append(float("-inf"))

            row_index = torch.tensor(rows, dtype=torch.long, device=device)  # (B * K,)
            new_tokens = torch.tensor(next_tokens, dtype=torch.long, device=device)[:, None]  # (B * K, 1)
            tokens = torch.cat([tokens.index_select(0, row_index), new_tokens], dim=1)  # (B * K, L + 1)
            scores = torch.tensor(next_scores, dtype=torch.float64, device=device).view(batch, beam_size)
            if beams != beam_size:  # after the first step: one row per beam from now on
                memory_rows = memory.repeat_interleave(beam_size, dim=0)  # (B * K, S, D)
                mask_rows = mask.repeat_interleave(beam_size, dim=0) if mask is not None else None
                beams = beam_size
            if all(done):
                break
            if cache is not None:
                cache.reorder(row_index)  # each new beam continues from the cache of the beam it extends

        # Sources still searching at max_len: their live beams end there, without EOS.
        for b in range(batch):
            if done[b]:
                continue
            for k in range(beam_size):
                score = float(scores[b, k])
                if score != float("-inf"):
                    generated = tokens[b * beam_size + k, 1:].tolist()
                    finished[b].append((normalised(score, len(generated)), generated))

    if any(not hypotheses for hypotheses in finished):  # cannot happen with finite logits
        raise RuntimeError("beam search ended without any hypothesis; are the logits finite?")
    # max() keeps the first of equal scores, i.e. the hypothesis found first.
    best = [max(hypotheses, key=lambda item: item[0])[1] for hypotheses in finished]
    width = max(len(generated) for generated in best)
    out = torch.full((batch, 1 + width), pad_id, dtype=torch.long, device=device)  # (B, 1 + n)
    out[:, 0] = bos_id
    for b, generated in enumerate(best):
        out[b, 1 : 1 + len(generated)] = torch.tensor(generated, dtype=torch.long, device=device)
    return out
