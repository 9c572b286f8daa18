"""Chapter 12's exercises: each reference agrees with the library's byte-level BPE (tl.bpe) and with PyTorch."""

from __future__ import annotations

import math

import pytest
import torch.nn.functional as F

from transformer_lab.bpe import BYTE_ORDER, ByteBPE, _merge_word, _train_direct
from transformer_lab.exercises import ch12_tokens as ex


def test_predicted_bytes_are_the_lines_utf8_length() -> None:
    assert len(ex.LINE) == 10
    assert len(ex.LINE.encode("utf-8")) == ex.predict_utf8_bytes.reference()
    assert ex.predict_utf8_bytes.reference() not in ex.predict_utf8_bytes.explain


@pytest.mark.parametrize("case", range(len(ex.merge_step.cases)))
def test_merge_step_is_the_librarys_merge(case: int) -> None:
    ids, new_id = ex.merge_step.cases[case].inputs()
    pair, merged = ex._merge_step_reference(ids, new_id)
    assert merged == _merge_word(list(ids), pair, new_id)
    if max(ids) < 256:  # the direct trainer starts from the 256 bytes: its first merge is the same pair
        byte_ids = [BYTE_ORDER.index(i) for i in ids]  # ids as bytes -> the trainer's ids of those bytes
        merges, _, _ = _train_direct([byte_ids], [1], 257)
        assert (BYTE_ORDER[merges[0][0]], BYTE_ORDER[merges[0][1]]) == pair


def test_merge_step_repeated_trains_what_the_library_trains() -> None:
    text = "the cat sat on the mat; the rat ate the hat"
    tokenizer = ByteBPE._train_direct(text, 256 + 8, pattern=r"(?s).+")  # one chunk: the whole text
    ids = [BYTE_ORDER.index(b) for b in text.encode()]
    for k, merge in enumerate(tokenizer.merges):
        pair, ids = ex._merge_step_reference(ids, 256 + k)
        assert pair == merge
    assert ids == tokenizer.encode(text)


def test_decode_reference_is_the_tokenizers_decode() -> None:
    tokenizer = ByteBPE.train("床前明月光，疑是地上霜。举头望明月，低头思故乡。" * 3 + "Hi 😀!", 300)
    ids = tokenizer.encode("明月光😀!床前")
    vocab = dict(tokenizer.tokens)
    for start in range(len(ids)):
        for end in range(start, len(ids) + 1):
            assert ex._decode_reference(ids[start:end], vocab) == tokenizer.decode(ids[start:end])


def test_decode_cases_cut_characters() -> None:
    outputs = [ex._decode_reference(*case.inputs()) for case in ex.decode_tokens.cases]
    assert outputs[1] == "I love 月光" and outputs[2] == "😀!"
    # errors="replace", as the exercise states it: the start of a character that breaks off (e6 9c, 月 without
    # its last byte) is one U+FFFD; each byte that cannot start a character (98 80, the end of 😀) is one more
    assert outputs[3] == "love 光\ufffd" and outputs[4] == "\ufffd\ufffd!" and outputs[5] == ""
    with pytest.raises(UnicodeDecodeError):  # the buggy version of the notebook crashes on case 1
        "".join(ex.VOCAB[i].decode("utf-8") for i in ex.decode_tokens.cases[1].inputs()[0])


def test_bits_per_byte_is_cross_entropy_in_bits_over_the_targets_bytes() -> None:
    for case in ex.bits_per_byte.cases:
        logits, targets, token_bytes = case.inputs()
        nats = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        expected = (nats / math.log(2) / token_bytes[targets].sum()).item()
        assert ex._bits_per_byte_reference(logits, targets, token_bytes) == pytest.approx(expected, rel=1e-12)
    assert ex._bits_per_byte_reference(*ex.bits_per_byte.cases[0].inputs()) == pytest.approx(1.0)  # 2 bits / 2 B


def test_bits_per_byte_of_characters_is_the_mean_loss_over_ln2() -> None:
    logits, targets, token_bytes = ex.bits_per_byte.cases[1].inputs()
    mean_loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    assert ex._bits_per_byte_reference(logits, targets, token_bytes) == pytest.approx(mean_loss / math.log(2))


def _feedback(exercise, answer, language: str = "en") -> str:  # noqa: ANN001
    from transformer_lab import set_language

    set_language(language)
    try:
        return exercise.run(answer).report()
    finally:
        set_language("en")


def test_a_dropped_last_id_is_named() -> None:
    def dropped(ids, new_id):  # noqa: ANN001, ANN202
        counts = {}
        for pair in zip(ids, ids[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + 1
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merged, skip = [], False
        for left, right in zip(ids, ids[1:], strict=False):  # over the pairs: the last id is never `left`
            if skip:
                skip = False
            elif (left, right) == best:
                merged.append(new_id)
                skip = True
            else:
                merged.append(left)
        return best, merged

    report = _feedback(ex.merge_step, dropped)
    assert "the last id was dropped" in report
    assert "最后一个 id 丢了" in _feedback(ex.merge_step, dropped, "zh")
    assert ex.merge_step._run(ex._merge_last_id_dropped, [1, 2, 3], 9) == ((1, 2), [9])  # the 3 is lost


def test_bits_over_the_vocabularys_mean_token_length_are_named() -> None:
    def mean_bytes(logits, targets, token_bytes):  # noqa: ANN001, ANN202
        log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)
        bits = -log_probs.gather(-1, targets[..., None]).sum() / math.log(2)
        return (bits / targets.numel() / token_bytes.double().mean()).item()

    report = _feedback(ex.bits_per_byte, mean_bytes)
    assert "the vocabulary's mean bytes per token" in report and "your bits per byte is" in report
    zh = _feedback(ex.bits_per_byte, mean_bytes, "zh")
    assert "平均每词元字节数" in zh and "output" not in zh and "你算出的每字节比特数" in zh


def test_every_new_mistake_fails_a_case_and_passes_none_it_should_not() -> None:
    for exercise, answer in (
        (ex.merge_step, ex._merge_last_id_dropped),
        (ex.bits_per_byte, ex._bpb_mean_vocabulary_bytes),
    ):
        result = exercise.run(answer)
        assert not result.passed and result.n_passed < len(exercise.cases)


def test_the_cold_reads_mistakes_are_named() -> None:
    assert "as a str" in _feedback(ex.predict_utf8_bytes, lambda: "26")
    assert "full-width" in _feedback(ex.predict_utf8_bytes, lambda: 28)
    assert "the lowest count" in _feedback(ex.merge_step, ex._merge_least_frequent)
    assert "kept until they decoded" in _feedback(ex.decode_tokens, ex._decode_streaming)
    assert "likeliest tokens" in _feedback(ex.bits_per_byte, ex._bpb_argmax_bytes)


def test_bits_per_byte_in_float32_is_accepted() -> None:
    def in_float32(logits, targets, token_bytes):  # noqa: ANN001, ANN202
        logits = logits.float()  # a right answer with float32 rounding (about 1e-7)
        log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)
        return (-log_probs.gather(-1, targets[..., None]).sum() / math.log(2) / token_bytes[targets].sum()).item()

    assert ex.bits_per_byte.run(in_float32).passed
    for mistake in ex.bits_per_byte.mistakes:  # each mistake is off by far more than the tolerance
        assert not ex.bits_per_byte.run(mistake.answer).passed


def test_no_feedback_of_chapter_12_says_output() -> None:
    for language in ("en", "zh"):
        text = _feedback(ex.decode_tokens, ex._decode_streaming, language)
        text += _feedback(ex.bits_per_byte, ex._bpb_nats, language)
        assert "output" not in text
