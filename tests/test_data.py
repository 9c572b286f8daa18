"""Tests of transformer_lab.data: the tokenizer, the tasks and their splits, batching."""

from __future__ import annotations

import datetime as dt
import random

import pytest
import torch

import transformer_lab as tl
from transformer_lab import data


@pytest.fixture(scope="module")
def dates() -> data.DateTask:
    return data.DateTask()


def test_tokenizer_round_trip_and_specials() -> None:
    tok = data.CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.tokens[:4] == [data.PAD, data.BOS, data.EOS, data.UNK]
    text = "2026年11月21日, Nov 21/2026."
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids + [tok.pad_id, tok.pad_id])) == text
    assert tok.decode([tok.bos_id, *tok.encode("ab"), tok.eos_id, *tok.encode("cd")]) == "ab"
    assert tok.decode([*tok.encode("ab"), tok.eos_id, *tok.encode("cd")], stop_at_eos=False) == "abcd"


def test_tokenizer_unknown_characters_become_unk() -> None:
    tok = data.CharTokenizer()
    ids = tok.encode("a€b号")
    assert ids[1] == tok.unk_id and ids[3] == tok.unk_id
    assert tok.decode(ids) == "a?b?"


def test_tokenizer_vocabulary_covers_every_task() -> None:
    tok = data.CharTokenizer()
    task_list = [data.DateTask(), data.CopyTask(), data.ReverseTask()]
    for task in task_list:
        for ex in task.examples("train", 300):
            assert tok.unk_id not in tok.encode(ex.source + ex.target), ex
    assert {"年", "月", "日"} <= set(data.VOCAB_CHARS)


def test_tokenizer_bad_input() -> None:
    tok = data.CharTokenizer()
    with pytest.raises(TypeError, match="text"):
        tok.encode(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="repeat"):
        data.CharTokenizer("aa")
    assert data.CharTokenizer.from_dict(tok.to_dict()).tokens == tok.tokens


def test_date_formats_examples() -> None:
    day = dt.date(2026, 11, 21)
    written = {fmt: data.format_date(day, fmt) for fmt in data.DATE_FORMATS}
    assert written["d_month_y"] == "21 November 2026"
    assert written["mon_d_y"] == "Nov 21, 2026"
    assert written["mm/dd/yyyy"] == "11/21/2026"
    assert written["dd.mm.yyyy"] == "21.11.2026"
    assert written["chinese"] == "2026年11月21日"
    with pytest.raises(ValueError, match="fmt"):
        data.format_date(day, "nope")


def test_every_date_input_has_exactly_one_answer(dates: data.DateTask) -> None:
    answer: dict[str, str] = {}
    first, last = dt.date(dates.first_year, 1, 1).toordinal(), dt.date(dates.last_year, 12, 31).toordinal()
    for ordinal in range(first, last + 1):
        day = dt.date.fromordinal(ordinal)
        for fmt in data.DATE_FORMATS:
            text = data.format_date(day, fmt)
            assert answer.setdefault(text, day.isoformat()) == day.isoformat(), f"{text!r} has two answers"
    # only May is written the same way in full and abbreviated ("3 May 2026"), with the same answer
    may_days = sum(dt.date.fromordinal(o).month == 5 for o in range(first, last + 1))
    assert len(answer) == (last - first + 1) * len(data.DATE_FORMATS) - 2 * may_days


def test_one_day_month_order_per_separator() -> None:
    # 3 April: with "/" the month comes first everywhere, with "." the day comes first.
    day = dt.date(2026, 4, 3)
    assert data.format_date(day, "mm/dd/yyyy") == "04/03/2026"
    assert data.format_date(day, "yyyy/mm/dd") == "2026/04/03"
    assert data.format_date(day, "dd.mm.yyyy") == "03.04.2026"


def test_date_splits_are_disjoint_by_day(dates: data.DateTask) -> None:
    days = {s: set(dates.days[s]) for s in data.SPLITS}
    assert not days["train"] & days["test"] and not days["train"] & days["validation"]
    assert not days["validation"] & days["test"]
    total = sum(len(d) for d in days.values())
    assert 0.07 < len(days["test"]) / total < 0.13
    for split in data.SPLITS:
        for ex in dates.examples(split, 400, seed=1):
            day = dt.date.fromisoformat(ex.target)
            assert dates.split_of_day(day) == split
            assert data.format_date(day, ex.kind) == ex.source


def test_string_tasks_round_trip_and_splits() -> None:
    copy, reverse = data.CopyTask(max_len=8), data.ReverseTask(max_len=8)
    seen = {}
    for split in data.SPLITS:
        for ex in copy.examples(split, 200):
            assert ex.source == ex.target and 1 <= len(ex.source) <= 8
            assert data.split_of(ex.source) == split
            seen.setdefault(ex.source, split)
            assert seen[ex.source] == split
        for ex in reverse.examples(split, 200):
            assert ex.target == ex.source[::-1] and data.split_of(ex.source) == split


def test_examples_are_reproducible_and_per_format(dates: data.DateTask) -> None:
    assert dates.examples("train", 50, seed=3) == dates.examples("train", 50, seed=3)
    assert dates.examples("train", 50, seed=3) != dates.examples("train", 50, seed=4)
    test = dates.examples_per_format("test", 20)
    assert len(test) == 20 * len(data.DATE_FORMATS)
    assert {e.kind for e in test} == set(data.DATE_FORMATS)
    assert len({e.target for e in test}) == len(test)  # each a different day


def test_task_bad_arguments() -> None:
    with pytest.raises(ValueError, match="split"):
        data.CopyTask().examples("dev", 3)
    with pytest.raises(ValueError, match="min_len"):
        data.CopyTask(min_len=5, max_len=2)
    with pytest.raises(ValueError, match="formats"):
        data.DateTask(formats=["bogus"])
    with pytest.raises(ValueError, match="task"):
        data.make_task("sort")
    task = data.make_task(data.DateTask(formats=["chinese"]).to_dict())
    assert isinstance(task, data.DateTask) and task.formats == ["chinese"]


def test_make_batch_shapes_padding_and_shift() -> None:
    tok = data.CharTokenizer()
    batch = data.make_batch([("abc", "xy"), ("a", "wxyz")], tok)
    assert batch.src.shape == (2, 3) and batch.tgt_in.shape == (2, 5) and batch.tgt_out.shape == (2, 5)
    assert batch.src[1].tolist() == [tok.index["a"], tok.pad_id, tok.pad_id]
    # tgt_in is BOS + target, tgt_out is target + EOS: the same sequence shifted by one
    assert batch.tgt_in[:, 0].eq(tok.bos_id).all()
    assert batch.tgt_in[1, 1:].tolist() == batch.tgt_out[1, :-1].tolist()
    assert batch.tgt_out[0].tolist() == [tok.index["x"], tok.index["y"], tok.eos_id, tok.pad_id, tok.pad_id]
    assert torch.equal(batch.src_mask, tl.padding_mask(batch.src, tok.pad_id))
    assert batch.src_mask.shape == (2, 1, 1, 3)
    with pytest.raises(ValueError, match="empty"):
        data.make_batch([], tok)


def test_split_of_is_stable() -> None:
    # a fixed hash: the same value always lands in the same split, whatever the process or seed
    random.seed(0)
    assert [data.split_of(k) for k in range(20)] == [data.split_of(k) for k in range(20)]
    assert data.split_of("ab") in data.SPLITS
    shares = [data.split_of(k) for k in range(20000)]
    assert 0.08 < shares.count("validation") / 20000 < 0.12
