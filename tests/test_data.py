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


# ---------------------------------------------------------------- chapter 10: text corpora


@pytest.mark.parametrize(
    ("name", "n_bytes", "n_chars", "n_distinct", "md5"),
    [
        ("shakespeare", 1_115_394, 1_115_394, 65, "6fb458f1232090904fb40fe944165e91"),
        ("tang", 2_320_249, 785_209, 5_711, "115878b37460a791ec5f0ba90626ca69"),
    ],
)
def test_shipped_corpora_are_those_documented(name: str, n_bytes: int, n_chars: int, n_distinct: int, md5: str) -> None:
    """Sizes and checksums as in assets/CORPORA.md (and ../shared/data/README.md), licences shipped beside."""
    import hashlib

    path = data.ASSETS / data.CORPORA[name]
    raw = path.read_bytes()
    assert len(raw) == n_bytes and hashlib.md5(raw).hexdigest() == md5
    text = data.load_corpus(name)
    assert len(text) == n_chars and len(set(text)) == n_distinct
    assert data.TextTokenizer.from_text(text).vocab_size == n_distinct
    notes = (data.ASSETS / "CORPORA.md").read_text(encoding="utf-8")
    assert data.CORPORA[name] in notes and md5 in notes and "MIT" in notes and "public domain" in notes


def test_tang_corpus_lines_are_five_character_poems() -> None:
    lines = data.load_corpus("tang").splitlines()
    assert len(lines) == 17_833
    for poem in lines:
        verses = [poem[i : i + 6] for i in range(0, len(poem), 6)]
        assert len(verses) in (4, 8), poem
        assert all(len(v) == 6 and v[5] == ("，" if k % 2 == 0 else "。") for k, v in enumerate(verses)), poem


def test_load_corpus_reads_any_utf8_file_and_refuses_the_rest(tmp_path) -> None:
    path = tmp_path / "poem.txt"
    path.write_text("床前明月光\n", encoding="utf-8")
    assert data.load_corpus(path) == data.load_corpus(str(path)) == "床前明月光\n"
    with pytest.raises(FileNotFoundError, match="neither a shipped corpus"):
        data.load_corpus("shakespear")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        data.load_corpus(tmp_path / "latin1.txt")
    with pytest.raises(TypeError, match="name must be a corpus name"):
        data.load_corpus(3)


def test_text_tokenizer_is_the_sorted_characters_of_the_corpus() -> None:
    text = data.load_corpus("shakespeare")
    tok = data.TextTokenizer.from_text(text)
    assert tok.chars == "".join(sorted(set(text)))  # nanoGPT's shakespeare_char: id = rank of the character
    assert tok.chars[:3] == "\n !" and tok.vocab_size == 65
    ids = tok.encode(text[:1000])
    assert ids.dtype == torch.long and ids.shape == (1000,)
    assert tok.decode(ids) == text[:1000] and tok.decode(ids.tolist()) == text[:1000]
    assert data.TextTokenizer.from_dict(tok.to_dict()).chars == tok.chars
    with pytest.raises(ValueError, match=r"outside the vocabulary of 65, e.g. \['é'\]"):
        tok.encode("café")
    with pytest.raises(ValueError, match="token id 65 is outside"):
        tok.decode([1, 65])
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(ids.view(10, 100))
    with pytest.raises(ValueError, match="must not repeat"):
        data.TextTokenizer("abca")
    with pytest.raises(ValueError, match="must not be empty"):
        data.TextTokenizer.from_text("")


@pytest.mark.parametrize("kind", ["str", "tensor"])
def test_split_text_first_ninety_percent_last_ten(kind: str) -> None:
    text = data.load_corpus("shakespeare")
    stream = text if kind == "str" else data.TextTokenizer.from_text(text).encode(text)
    train, validation = data.split_text(stream)
    assert len(train) == int(0.9 * len(text)) == 1_003_854  # nanoGPT's shakespeare_char: 1,003,854 / 111,540
    assert len(validation) == len(text) - len(train) == 111_540
    if kind == "str":
        assert train + validation == text
    else:
        assert torch.equal(torch.cat([train, validation]), stream)
    assert data.split_text("abcdefghij", 0.5) == ("abcde", "fghij")
    with pytest.raises(ValueError, match="train_fraction"):
        data.split_text(text, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        data.split_text(torch.zeros(2, 3))


def test_random_windows_targets_are_the_next_tokens() -> None:
    stream = torch.arange(100)
    x, y = data.random_windows(stream, 8, 32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (32, 8)
    assert torch.equal(y, x + 1)  # arange: the next token is the next number
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # contiguous windows
    assert int(y.max()) <= 99 and int(x.min()) >= 0
    again, _ = data.random_windows(stream, 8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
    # Every start 0 .. N - block_size - 1 is drawn, the last one included.
    starts = data.random_windows(torch.arange(12), 8, 400, torch.Generator().manual_seed(1))[0][:, 0]
    assert set(starts.tolist()) == {0, 1, 2, 3}


def test_consecutive_windows_cover_the_stream_once() -> None:
    stream = torch.arange(30)
    x, y = data.consecutive_windows(stream, 7)  # (30 - 1) // 7 = 4 windows
    assert x.shape == y.shape == (4, 7)
    assert torch.equal(x.flatten(), torch.arange(28)) and torch.equal(y.flatten(), torch.arange(1, 29))
    x, y = data.consecutive_windows(torch.arange(29), 7)  # exactly 4 windows and their targets
    assert x.shape == (4, 7) and int(y[-1, -1]) == 28
    with pytest.raises(ValueError, match="fewer than block_size"):
        data.consecutive_windows(torch.arange(7), 7)
    with pytest.raises(TypeError, match="1-D integer tensor"):
        data.consecutive_windows(torch.rand(30), 7)
    with pytest.raises(TypeError, match="block_size"):
        data.random_windows(stream, 7.0, 2)
    with pytest.raises(ValueError, match="batch_size"):
        data.random_windows(stream, 7, 0)


def test_windows_can_begin_only_at_given_offsets() -> None:
    """starts= draws every window at one of the offsets given (e.g. each newline): the poem model's batches."""
    text = "ab\ncde\nfg\nhijk\nlm\n" * 4
    ids = torch.tensor([ord(c) for c in text])
    newline = ord("\n")
    starts = data.token_starts(ids, newline, 5)
    assert torch.equal(ids[starts], torch.full_like(starts, newline))  # each offset holds a newline
    assert int(starts.max()) <= len(ids) - 5 - 1  # ... and a whole window and its targets fit after it
    every = [i for i, c in enumerate(text) if c == "\n" and i <= len(text) - 6]
    assert starts.tolist() == every  # ... and none is left out
    x, y = data.random_windows(ids, 5, 300, torch.Generator().manual_seed(0), starts)
    assert torch.all(x[:, 0] == newline) and torch.equal(x[:, 1:], y[:, :-1])
    # the windows drawn begin at every given offset (300 draws of 15), with the same seed the same ones
    assert {text[s + 1 : s + 5] for s in every} == {"".join(chr(int(c)) for c in row[1:]) for row in x}
    again, _ = data.random_windows(ids, 5, 300, torch.Generator().manual_seed(0), starts)
    assert torch.equal(x, again)


@pytest.mark.parametrize(
    ("starts", "error", "match"),
    [
        (torch.tensor([0.0, 3.0]), TypeError, "1-D integer tensor of offsets"),
        (torch.tensor([[0, 3]]), TypeError, "1-D integer tensor of offsets"),
        ([0, 3], TypeError, "1-D integer tensor of offsets"),
        (torch.tensor([], dtype=torch.long), ValueError, "starts is empty"),
        (torch.tensor([0, 25]), ValueError, r"starts must lie in \[0, 24\]"),
        (torch.tensor([-1, 3]), ValueError, r"starts must lie in \[0, 24\]"),
    ],
)
def test_bad_window_starts_are_refused(starts: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        data.random_windows(torch.arange(30), 5, 2, starts=starts)  # type: ignore[arg-type]


def test_token_starts_mixes_windows_at_the_token_with_windows_anywhere() -> None:
    """share in (0, 1): every offset once, then the token's offsets repeated to make up about that share."""
    text = "ab\ncde\nfg\nhijk\nlm\n" * 40
    ids = torch.tensor([ord(c) for c in text])
    anywhere = torch.arange(len(ids) - 5)
    at_newlines = data.token_starts(ids, ord("\n"), 5)
    assert torch.equal(data.token_starts(ids, ord("\n"), 5, 0.0), anywhere)
    for share in (0.25, 0.5, 0.8):
        starts = data.token_starts(ids, ord("\n"), 5, share)
        repeats = round(share / (1 - share) * len(anywhere) / len(at_newlines))
        assert torch.equal(starts, torch.cat([anywhere, at_newlines.repeat(repeats)]))
        x, _ = data.random_windows(ids, 5, 4000, torch.Generator().manual_seed(0), starts)
        aligned = (x[:, 0] == ord("\n")).double().mean().item()
        # each newline offset stands 1 + repeats times among the starts (about `share` of them, more the
        # commoner the newline is in the text: here one character in four)
        expected = (1 + repeats) * len(at_newlines) / len(starts)
        assert abs(aligned - expected) < 0.03, (share, aligned, expected)
    for share in (-0.1, 1.5, "half", True):
        with pytest.raises(ValueError, match="share must be a number in"):
            data.token_starts(ids, ord("\n"), 5, share)  # type: ignore[arg-type]


def test_token_starts_refuses_a_token_that_never_begins_a_window() -> None:
    with pytest.raises(ValueError, match="token 7 never stands where a window of 5 can begin"):
        data.token_starts(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), 7, 5)  # 7 stands too close to the end
    with pytest.raises(TypeError, match="token must be a token id"):
        data.token_starts(torch.arange(30), torch.tensor(3), 5)  # type: ignore[arg-type]
