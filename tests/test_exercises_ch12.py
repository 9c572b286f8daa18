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
