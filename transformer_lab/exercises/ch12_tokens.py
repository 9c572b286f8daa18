"""Exercises of chapter 12, tokens (分词): notebooks/12_tokens.ipynb.

1. `predict_utf8_bytes`: how many UTF-8 bytes a line of English and Chinese takes (easy, predict).
2. `merge_step`: one step of BPE training, the most frequent pair found and merged (medium, build).
3. `decode_tokens`: a decoder that crashes on Chinese, mended (medium, debug).
4. `bits_per_byte`: losses per token turned into bits per byte, across vocabularies (harder, transfer).

Used in the notebook as `from transformer_lab.exercises import ch12_tokens as exercises`.
Shape legend: B batch, T positions, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_lab import bpe
from transformer_lab.exercises.core import Case, Exercise, Mistake

__all__ = ["predict_utf8_bytes", "merge_step", "decode_tokens", "bits_per_byte"]


def _one_output(candidate, *inputs):  # noqa: ANN001, ANN002, ANN202
    return (candidate(*inputs),)  # a 1-tuple, so that the feedback names it ("your text is ...", not "output is")


# --- 1. predict: the UTF-8 bytes of a mixed line --------------------------------------------------

#: the line of the exercise: 2 + 1 + 1 + 5 + 1 = 10 characters
LINE = "李白: 床前明月光。"


def _utf8_bytes_reference() -> int:
    # ASCII (U+0000-U+007F) takes 1 byte; U+0800-U+FFFF, where the common Chinese characters and the
    # full-width punctuation live, takes 3.
    chinese = 2 + 5  # 李白, 床前明月光
    full_width = 1  # 。 (U+3002) is not the ASCII full stop
    ascii_ = 2  # ":" and the space
    return 3 * chinese + 3 * full_width + ascii_  # 26


def _count_or_text(candidate):  # noqa: ANN001, ANN202
    value = candidate()
    return "a str" if isinstance(value, str) else value  # a count written as text gets its own explanation


predict_utf8_bytes = Exercise(
    "predict_utf8_bytes",
    reference=_utf8_bytes_reference,
    cases=[Case("your count for the line '李白: 床前明月光。'", lambda: ())],
    run=_count_or_text,
    hints=[
        "Go character by character: which of the 10 characters are ASCII, and which lie between U+0800 and U+FFFF?",
        "The colon and the space are ASCII. The Chinese full stop 。 is U+3002, not the ASCII '.'.",
        "ASCII characters take 1 byte each; the characters from U+0800 to U+FFFF take 3 each. Count each group.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: 10, lambda: 30, lambda: 24, lambda: 20],
    why=(
        "26 bytes for 10 characters: 7 Chinese characters and the full-width 。 take 3 bytes each (24), the colon "
        "and the space 1 each. A byte-level tokenizer starts from these 26 bytes, so before any merge a Chinese "
        "text costs about three times as many tokens as its characters."
    ),
    explain={
        10: "that is the number of characters (what len() of the str counts); UTF-8 stores some of them in "
        "several bytes.",
        30: "not every character takes 3 bytes: ASCII characters such as ':' and the space take 1.",
        24: "the Chinese full stop 。 is not ASCII: it is U+3002, a 3-byte character.",
        20: "2 bytes a character is UTF-16's size for these; UTF-8 uses 1 for ASCII and 3 for these Chinese "
        "characters.",
        22: "the colon and the space are 1 byte each, and 。 is 3.",
        28: "the colon here is the ASCII ':' (1 byte), not the full-width '：' (3 bytes) that Chinese text often has.",
        "a str": "the count came back as a str: return it as an int.",
    },
)


# --- 2. build: one step of BPE training -----------------------------------------------------------


def _merge_step_reference(ids: list[int], new_id: int) -> tuple[tuple[int, int], list[int]]:
    counts: dict[tuple[int, int], int] = {}
    for pair in zip(ids, ids[1:], strict=False):  # every adjacent pair, overlapping ones included
        counts[pair] = counts.get(pair, 0) + 1
    best = min(counts, key=lambda pair: (-counts[pair], pair))  # the highest count; a tie: the smallest pair
    merged, i = [], 0
    while i < len(ids):  # left to right: a pair used by one merge is not used again
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return best, merged


def _pair_counts(ids):  # noqa: ANN001, ANN202
    counts: dict[tuple[int, int], int] = {}
    for pair in zip(ids, ids[1:], strict=False):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _replace(ids, best, new_id):  # noqa: ANN001, ANN202
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _merge_first_seen_tie(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = max(counts, key=lambda pair: counts[pair])  # a tie goes to the pair seen first in the text
    return best, _replace(ids, best, new_id)


def _merge_least_frequent(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (counts[pair], pair))  # the minus sign forgotten: the rarest pair
    return best, _replace(ids, best, new_id)


def _merge_largest_tie(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = max(counts, key=lambda pair: (counts[pair], pair))  # a tie goes to the LARGEST pair
    return best, _replace(ids, best, new_id)


def _merge_right_to_left(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    merged, i = [], len(ids) - 1
    while i >= 0:  # from the end: "a a a" becomes [a, aa] instead of [aa, a]
        if i >= 1 and (ids[i - 1], ids[i]) == best:
            merged.append(new_id)
            i -= 2
        else:
            merged.append(ids[i])
            i -= 1
    return best, merged[::-1]


def _merge_no_skip(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
            merged.append(new_id)
            i += 1  # the right half stays and is copied again
        else:
            merged.append(ids[i])
            i += 1
    return best, merged


def _merge_non_overlapping_counts(ids, new_id):  # noqa: ANN001, ANN202
    counts: dict[tuple[int, int], int] = {}
    for i in range(0, len(ids) - 1, 2):  # pairs (0, 1), (2, 3), ...: every other pair is never counted
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    return best, _replace(ids, best, new_id)


def _merge_last_id_dropped(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    merged = _replace(ids, best, new_id)
    # a loop over the pairs (while i < len(ids) - 1) stops before the last id: unless the last pair was merged,
    # that id is never copied
    return best, merged if merged[-1] == new_id else merged[:-1]


def _merge_only_first(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == best:
            return best, [*ids[:i], new_id, *ids[i + 2 :]]  # only the first occurrence
    return best, list(ids)


def _merge_with_library(ids, new_id):  # noqa: ANN001, ANN202
    counts = _pair_counts(ids)
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    return best, bpe._merge_word(list(ids), best, new_id)


merge_step = Exercise(
    "merge_step",
    reference=_merge_step_reference,
    cases=[
        Case(
            "'aaabdaaabac' as ids (Wikipedia's example)", lambda: ([97, 97, 97, 98, 100, 97, 97, 97, 98, 97, 99], 256)
        ),
        Case("a tie between two pairs", lambda: ([5, 6, 1, 2, 5, 6, 1, 2], 9)),
        Case("a run of one token: 'aaaaa'", lambda: ([7, 7, 7, 7, 7], 8)),
        Case("overlapping pairs decide the count", lambda: ([3, 3, 3, 4, 5, 4, 5], 6)),
        Case("the best pair starts at odd positions", lambda: ([5, 1, 2, 1, 2, 1, 2, 9, 9], 11)),
        Case("ids above 255 (after earlier merges)", lambda: ([300, 12, 300, 12, 7, 300, 12, 12], 301)),
        Case("only two ids", lambda: ([4, 2], 10)),
    ],
    hints=[
        "Two parts: count every adjacent pair (ids[i], ids[i + 1]), then rewrite the list with the best pair "
        "replaced by new_id. Return (the pair, the new list).",
        "Count overlapping pairs too: 'aaa' holds (a, a) twice. The best pair has the highest count; among "
        "pairs with the same count take the smallest pair, comparing (left, right) as a tuple.",
        "Rewrite from left to right with an index i: where ids[i], ids[i + 1] is the pair, append new_id and move "
        "i on by 2; otherwise append ids[i] and move on by 1.",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _merge_least_frequent,
            "the pair with the lowest count was merged: BPE merges the most frequent pair. With min, the key must "
            "put the highest count first (its negative), then the smallest pair.",
        ),
        Mistake(
            _merge_first_seen_tie,
            "a tie between pairs of the same count went to the pair seen first in the text: the rule here (and "
            "Hugging Face's) takes the smallest pair, so that the result does not depend on the order of the "
            "counts.",
        ),
        Mistake(
            _merge_largest_tie,
            "a tie between pairs of the same count went to the largest pair: take the smallest (left, right).",
        ),
        Mistake(
            _merge_right_to_left,
            "the occurrences were replaced from the right end: in a run such as 'aaa' the merge takes the "
            "leftmost pair first, as encoding does.",
        ),
        Mistake(
            _merge_no_skip,
            "after a replacement the loop moved on by one, so the pair's right half was copied again: a merged "
            "pair turns two ids into one.",
        ),
        Mistake(
            _merge_non_overlapping_counts,
            "only every other pair was counted (positions 0-1, 2-3, ...): a pair starting at an odd position "
            "counts too.",
        ),
        Mistake(
            _merge_last_id_dropped,
            "the last id was dropped: a loop over the pairs (i < len(ids) - 1, or zip(ids, ids[1:])) ends before "
            "the last id, so when that id is not the right half of a merged pair nothing copies it. Every id that no "
            "merge takes must stay in the new list.",
        ),
        Mistake(
            _merge_only_first,
            "only the first occurrence of the pair was replaced: a merge rewrites every occurrence.",
        ),
    ],
    forbidden=[bpe.ByteBPE, bpe._merge_word, bpe._train_direct, bpe._train_incremental],
    output_names=["your pair", "your new ids"],
    shortcuts=[_merge_with_library],
)


# --- 3. debug: a decoder that crashes on Chinese ----------------------------------------------------

#: a small byte-level vocabulary: the ids of the exercise, each the bytes of one token
VOCAB = {
    0: b"I ",
    1: b"love ",
    2: "月".encode()[:2],  # the first two of the three bytes of 月 (e6 9c 88)
    3: "月".encode()[2:],  # its third byte
    4: "光".encode(),  # 光, whole
    5: "😀".encode()[:1],  # the four bytes of 😀, one token each
    6: "😀".encode()[1:2],
    7: "😀".encode()[2:3],
    8: "😀".encode()[3:],
    9: b"!",
}


def _decode_reference(ids: list[int], vocab: dict[int, bytes]) -> str:
    data = b"".join(vocab[i] for i in ids)  # first the bytes of the whole sequence ...
    return data.decode("utf-8", errors="replace")  # ... then the characters; each broken piece becomes U+FFFD


def _decode_per_token_replace(ids, vocab):  # noqa: ANN001, ANN202
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def _decode_per_token_ignore(ids, vocab):  # noqa: ANN001, ANN202
    return "".join(vocab[i].decode("utf-8", errors="ignore") for i in ids)


def _decode_whole_ignore(ids, vocab):  # noqa: ANN001, ANN202
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="ignore")


def _decode_streaming(ids, vocab):  # noqa: ANN001, ANN202
    text, buffer = "", b""
    for i in ids:  # keep the bytes until they decode, as an incremental decoder would
        buffer += vocab[i]
        try:
            text += buffer.decode("utf-8")
            buffer = b""
        except UnicodeDecodeError:
            pass
    return text


def _decode_latin1(ids, vocab):  # noqa: ANN001, ANN202
    return b"".join(vocab[i] for i in ids).decode("latin-1")  # one character per byte


def _decode_with_library(ids, vocab):  # noqa: ANN001, ANN202
    tokenizer = bpe.ByteBPE({i: bytes([b]) for i, b in enumerate(bpe.BYTE_ORDER)}, [])  # the 256 bytes only
    byte_id = {b: i for i, b in enumerate(bpe.BYTE_ORDER)}
    return tokenizer.decode([byte_id[b] for i in ids for b in vocab[i]])


decode_tokens = Exercise(
    "decode_tokens",
    reference=_decode_reference,
    cases=[
        Case("ASCII tokens: 'I love '", lambda: ([0, 1], dict(VOCAB))),
        Case("月 cut over two tokens", lambda: ([0, 1, 2, 3, 4], dict(VOCAB))),
        Case("😀 as four one-byte tokens", lambda: ([5, 6, 7, 8, 9], dict(VOCAB))),
        Case("a sequence that ends inside 月", lambda: ([1, 4, 2], dict(VOCAB))),
        Case("a sequence that begins inside 😀", lambda: ([7, 8, 9], dict(VOCAB))),
        Case("no ids at all", lambda: ([], dict(VOCAB))),
    ],
    hints=[
        "Run the buggy version on [0, 1, 2, 3, 4]: which token fails to decode, and what are its bytes?",
        "A token is bytes, not characters: one character may be spread over several tokens. Decode the bytes of "
        "the whole sequence at once, not token by token.",
        "Join the tokens' bytes (b''.join), then decode them once as UTF-8 with errors='replace' instead of "
        "raising: the start of a character that breaks off becomes one '\\ufffd', and so does each byte that "
        "cannot start a character.",
    ],
    level="medium",
    kind="debug",
    mistakes=[
        Mistake(
            _decode_per_token_replace,
            "each token was still decoded on its own, so a character spread over two tokens became two "
            "replacement characters instead of itself.",
        ),
        Mistake(
            _decode_whole_ignore,
            "a character cut at the start or end of the sequence was dropped without a trace: errors='replace' "
            "writes one '\\ufffd' for the start of a character that breaks off, and one for each byte that cannot "
            "start a character.",
        ),
        Mistake(
            _decode_per_token_ignore,
            "each token was still decoded on its own, and its broken pieces dropped: a character spread over "
            "several tokens disappeared.",
        ),
        Mistake(
            _decode_streaming,
            "the bytes were kept until they decoded: bytes that can never start a character (or a character cut "
            "off at the end) stayed in the buffer and swallowed what came after. Decode the whole sequence once, "
            "with errors='replace'.",
        ),
        Mistake(
            _decode_latin1,
            "the bytes were read as Latin-1, one character per byte: a byte-level tokenizer's bytes are UTF-8.",
        ),
    ],
    forbidden=[bpe.ByteBPE],
    shortcuts=[_decode_with_library],
    run=_one_output,
    output_names=["your text"],
)


# --- 4. transfer: bits per byte ---------------------------------------------------------------------


def _bits_per_byte_reference(logits: Tensor, targets: Tensor, token_bytes: Tensor) -> float:
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)  # (B, T, V): log-softmax, in nats
    nats = -log_probs.gather(-1, targets[..., None]).sum()  # the loss of every predicted token, added up
    total_bits = nats / math.log(2)  # nats -> bits: divide by ln 2
    total_bytes = token_bytes[targets].sum()  # the bytes of every predicted token, each time it occurs
    return (total_bits / total_bytes).item()  # a ratio of sums, not a mean of ratios


def _token_losses(logits, targets):  # noqa: ANN001, ANN202
    return -(logits - logits.logsumexp(dim=-1, keepdim=True)).gather(-1, targets[..., None])[..., 0]  # (B, T)


def _bpb_per_token(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets).sum() / math.log(2) / targets.numel()).item()  # bits per TOKEN


def _bpb_nats(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets).sum() / token_bytes[targets].sum()).item()  # nats, not bits


def _bpb_mean_of_ratios(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets) / math.log(2) / token_bytes[targets]).mean().item()


def _bpb_log10(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets).sum() / math.log(10) / token_bytes[targets].sum()).item()


def _bpb_times_ln2(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets).sum() * math.log(2) / token_bytes[targets].sum()).item()


def _bpb_vocabulary_bytes(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets).sum() / math.log(2) / token_bytes.sum()).item()  # the vocabulary's


def _bpb_mean_vocabulary_bytes(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    bits = _token_losses(logits, targets).sum() / math.log(2)
    return (bits / (targets.numel() * token_bytes.float().mean())).item()  # the vocabulary's mean bytes per token


def _bpb_argmax_bytes(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    bits = _token_losses(logits, targets).sum() / math.log(2)
    return (bits / token_bytes[logits.argmax(-1)].sum()).item()  # the bytes of the model's guesses


def _bpb_with_library(logits, targets, token_bytes):  # noqa: ANN001, ANN202
    import torch.nn.functional as F

    nats = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return (nats / math.log(2) / token_bytes[targets].sum()).item()


def _bpb_case(name: str, shape: tuple[int, int], vocab: int, seed: int) -> Case:
    def inputs() -> tuple[Tensor, Tensor, Tensor]:
        g = torch.Generator().manual_seed(seed)
        token_bytes = torch.randint(1, 7, (vocab,), generator=g)  # (V,): 1 to 6 bytes a token
        targets = torch.randint(0, vocab, shape, generator=g)  # (B, T)
        logits = torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2  # (B, T, V)
        return logits, targets, token_bytes

    return Case(name, inputs, atol=1e-9, rtol=1e-6)  # float32 arithmetic (about 1e-7) passes; every mistake is far off


bits_per_byte = Exercise(
    "bits_per_byte",
    reference=_bits_per_byte_reference,
    cases=[
        Case(
            "one token of 2 bytes, predicted with probability 1/4",
            lambda: (torch.zeros(1, 1, 4, dtype=torch.float64), torch.tensor([[1]]), torch.tensor([3, 2, 3, 1])),
            atol=1e-9,
            rtol=1e-6,
        ),
        Case(
            "characters: every token 1 byte",
            lambda: (
                torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, 1.0, 1.0]]], dtype=torch.float64),
                torch.tensor([[0, 1, 2]]),
                torch.tensor([1, 1, 1]),
            ),
            atol=1e-9,
            rtol=1e-6,
        ),
        _bpb_case("a batch (B=2, T=5), vocabulary 8", (2, 5), 8, seed=120),
        _bpb_case("a batch (B=4, T=16), vocabulary 50", (4, 16), 50, seed=121),
        _bpb_case("one long row (B=1, T=64), vocabulary 300", (1, 64), 300, seed=123),
    ],
    hints=[
        "Two steps: the loss of each predicted token (minus the log of the probability the model gave the "
        "target), then bits per byte = (all those losses added up, in bits) / (all the bytes the targets stand "
        "for).",
        "The log-probabilities: logits minus their logsumexp over the vocabulary; pick each target's with gather. "
        "They are natural logarithms (nats): one nat is 1 / ln 2 bits. token_bytes[targets] gives each "
        "predicted token's number of bytes.",
        "Add up first, then divide: sum(losses) / ln 2 / sum(token_bytes[targets]). A mean of per-token ratios "
        "would weight a 1-byte token as much as a 6-byte one. Return a float.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _bpb_argmax_bytes,
            "the bits were divided by the bytes of the model's likeliest tokens (the argmax of the logits): divide "
            "by the bytes of the targets, the text that had to be predicted, whatever the model guessed.",
        ),
        Mistake(
            _bpb_per_token,
            "the bits were divided by the number of tokens: that is bits per token, which grows with the bytes a "
            "token holds and so cannot compare two vocabularies.",
        ),
        Mistake(_bpb_nats, "the losses stayed in nats: cross-entropy uses the natural logarithm; a bit is ln 2 nats."),
        Mistake(
            _bpb_times_ln2,
            "the nats were multiplied by ln 2 instead of divided: one nat is 1 / ln 2 = 1.44 bits.",
        ),
        Mistake(_bpb_log10, "the losses were converted with log 10: a bit is a logarithm in base 2."),
        Mistake(
            _bpb_mean_of_ratios,
            "each token's bits per byte were averaged: a 1-byte token then weighs as much as a 6-byte one. "
            "Divide the total bits by the total bytes.",
        ),
        Mistake(
            _bpb_mean_vocabulary_bytes,
            "the bits were divided by the number of tokens times the vocabulary's mean bytes per token "
            "(token_bytes.mean()): that is the length of an average token of the vocabulary, not of the tokens "
            "predicted here. Count the bytes of the targets themselves: token_bytes[targets].",
        ),
        Mistake(
            _bpb_vocabulary_bytes,
            "the bytes of the whole vocabulary were counted: count the bytes of the predicted tokens (the "
            "targets), each time one occurs.",
        ),
    ],
    forbidden=["cross_entropy", "nll_loss"],
    shortcuts=[_bpb_with_library],
    run=_one_output,
    output_names=["your bits per byte"],
)
