"""Toy sequence-to-sequence tasks, a character tokenizer and padded batches (chapter 09).

Three tasks, generated on the fly, each with train / validation / test splits that are disjoint
by *underlying value* (a string for copy and reverse, a calendar day for dates), so a model is
always tested on values it has never seen in any form:

- ``copy``:    "hello" -> "hello"
- ``reverse``: "hello" -> "olleh"
- ``dates``:   "21 November 2026", "Nov 21, 2026", "11/21/2026", "21.11.2026", "2026年11月21日", ...
               -> "2026-11-21" (ISO 8601). The characters of the answer come from different places
               of the input in every format, so the learned cross-attention is non-monotonic.

Every date input has exactly one answer: each separator has one day/month order ("/" is always
month first, "." always day first), so "03/04/2026" can only mean 4 March.

Chapter 10's text data sits at the end: the two corpora shipped in `transformer_lab/assets`
(Tiny Shakespeare and 17,833 five-character Tang poems, provenance and licences in
`assets/CORPORA.md`), `load_corpus`, a character tokenizer built from a corpus (`TextTokenizer`, no
special tokens, as nanoGPT's `shakespeare_char`), the train/validation split (first 90 % / last 10 % of
the characters) and windows of a token stream for a language model.

Shape legend: B batch, S source length, T target length (+1 for BOS or EOS); for text, N tokens.
"""

from __future__ import annotations

import datetime as dt
import inspect
import numbers
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from transformer_lab._checks import as_device, check_bool, check_integer_vector, check_positive_int, is_trusted
from transformer_lab.masking import padding_mask

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "VOCAB_CHARS",
    "CharTokenizer",
    "Example",
    "Batch",
    "Task",
    "CopyTask",
    "ReverseTask",
    "DateTask",
    "DATE_FORMATS",
    "format_date",
    "make_task",
    "make_batch",
    "SPLITS",
    "split_of",
    "CORPORA",
    "load_corpus",
    "TextTokenizer",
    "split_text",
    "random_windows",
    "token_starts",
    "consecutive_windows",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3

#: Every character any task can produce: digits, letters, punctuation, space, and 年 月 日.
VOCAB_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.-/年月日"

SPLITS = ("train", "validation", "test")


def _id_list(ids: object, vocab_size: int) -> list[int]:
    """Token ids (a 1-D integer tensor or a sequence of ints) as a list of ints in [0, vocab_size)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D (one sequence), got shape {tuple(ids.shape)}")
        if ids.numel() == 0:  # torch.tensor([]) is float32: no id, nothing to decode, whatever the dtype
            return []
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be integer token ids, got dtype {ids.dtype}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be a 1-D integer tensor or a list of ints, got {type(ids).__name__}")
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"ids must hold whole-number token ids, got {i!r}")
        if not 0 <= i < vocab_size:
            raise ValueError(f"ids: token id {int(i)} is outside the vocabulary [0, {vocab_size})")
        out.append(int(i))
    return out


class _CharsSerialised:
    """What both tokenizers share: they are saved as their characters (`to_dict`, `from_dict`)."""

    chars: str
    vocab_size: int

    def to_dict(self) -> dict[str, str]:
        """Plain data for a checkpoint (readable with `torch.load(weights_only=True)`)."""
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, data: dict[str, str]):  # noqa: ANN206 - the subclass
        return cls(_chars_of(data))  # type: ignore[call-arg]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def _chars_of(data: object) -> str:
    if not isinstance(data, dict) or not isinstance(data.get("chars"), str):
        raise ValueError(f"data must be a tokenizer's to_dict(), {{'chars': '...'}}, got {str(data)[:60]}")
    return data["chars"]


class CharTokenizer(_CharsSerialised):
    """Characters <-> token ids, with the four special tokens first (chapter 09).

    Ids: 0 PAD, 1 BOS (start of a target), 2 EOS (end of a target), 3 UNK (any character not in
    the vocabulary), then one id per character of `chars`.

    Args:
        chars: the characters of the vocabulary (default `VOCAB_CHARS`); no repeats.
    """

    def __init__(self, chars: str | Sequence[str] = VOCAB_CHARS) -> None:
        if not isinstance(chars, Sequence):
            raise TypeError(f"chars must be a string (or list) of single characters, got {type(chars).__name__}")
        chars = list(chars)
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("chars must be a non-empty sequence of single characters")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars = "".join(chars)
        self.tokens: list[str] = [*SPECIALS, *chars]
        self.index = {token: i for i, token in enumerate(self.tokens)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(4)

    @property
    def vocab_size(self) -> int:
        """Number of tokens, specials included."""
        return len(self.tokens)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """A string -> token ids; unknown characters become UNK (never an error)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        check_bool("add_bos", add_bos)  # a string such as "no" would be silently true
        check_bool("add_eos", add_eos)
        ids = [self.index.get(ch, self.unk_id) for ch in text]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int] | Tensor, stop_at_eos: bool = True) -> str:
        """Token ids -> a string: PAD and BOS are dropped, UNK shows as "?", decoding stops at EOS."""
        check_bool("stop_at_eos", stop_at_eos)
        ids = _id_list(ids, self.vocab_size)
        out = []
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i == self.eos_id and stop_at_eos:
                break
            if i in (self.pad_id, self.bos_id, self.eos_id):
                continue
            out.append("?" if i == self.unk_id else self.tokens[i])
        return "".join(out)

    def labels(self, ids: Iterable[int] | Tensor) -> list[str]:
        """One readable label per id (for attention-map axes): characters, or "<bos>", "<eos>", ..."""
        ids = _id_list(ids, self.vocab_size)
        return ["␣" if self.tokens[i] == " " else self.tokens[i] for i in ids]


# ---------------------------------------------------------------------------------------------
# Splits disjoint by underlying value
# ---------------------------------------------------------------------------------------------


def _mix64(x: int) -> int:
    """A fixed 64-bit integer hash (splitmix64's finaliser): same answer on every machine and run."""
    x &= 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


_FRACTIONS = (0.1, 0.1)  # the default shares of validation and test


def split_of(key: int | str, fractions: tuple[float, float] = _FRACTIONS) -> str:
    """The split ("train", "validation" or "test") that an underlying value belongs to.

    A fixed hash of the value decides, so the answer never depends on the format the value is
    written in, on the order examples are drawn in, or on any random seed.

    Args:
        key: the underlying value (a day's ordinal for dates, the string for copy/reverse).
        fractions: the shares of (validation, test); train gets the rest.
    """
    # Called for every day of a DateTask and every draw of a string task: the usual arguments pass at once.
    if type(key) not in (int, str) and (isinstance(key, bool) or not isinstance(key, (str, numbers.Integral))):
        raise TypeError(
            f"key must be a str or an int (the underlying value: a string, or a day's ordinal), got {key!r}"
        )
    if fractions is not _FRACTIONS:
        _check_fractions(fractions)
    if isinstance(key, str):
        h = 0
        for byte in key.encode("utf-8"):
            h = _mix64(h ^ byte)  # chained, so "ab" and "ba" differ
    else:
        h = _mix64(int(key))
    u = (h >> 11) / float(1 << 53)  # uniform in [0, 1)
    val, test = fractions
    if u < test:
        return "test"
    if u < test + val:
        return "validation"
    return "train"


def _check_fractions(fractions: object) -> None:
    """Two shares (validation, test), each in [0, 1], together at most 1 (train gets the rest)."""
    if (
        not isinstance(fractions, (tuple, list))
        or len(fractions) != 2
        or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in fractions)
    ):
        raise TypeError(f"fractions must be two numbers (validation share, test share), got {fractions!r}")
    if not all(0.0 <= f <= 1.0 for f in fractions) or sum(fractions) > 1.0:
        raise ValueError(
            f"fractions must be two shares in [0, 1] adding up to at most 1 (train gets the rest), got {fractions!r}"
        )


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass(frozen=True)
class Example:
    """One input/output pair of a task, with the kind of input it is (a date format, or a task name)."""

    source: str
    target: str
    kind: str


class Task:
    """A task: draws `Example`s of a split; subclasses define `sample(rng, split)`."""

    name = "task"
    #: the longest source and target strings the task can produce (without BOS/EOS)
    max_source_len = 0
    max_target_len = 0

    def sample(self, rng: random.Random, split: str) -> Example:
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """`n` examples of `split`, drawn with a seeded generator (same seed, same examples)."""
        _check_split(split)
        check_positive_int("n", n)
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self.sample(rng, split) for _ in range(n)]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name}


class _StringTask(Task):
    """Random strings of `min_len`..`max_len` characters from `alphabet`; split by the string."""

    def __init__(self, min_len: int = 1, max_len: int = 12, alphabet: str = "abcdefghijklmnopqrstuvwxyz") -> None:
        check_positive_int("min_len", min_len)
        check_positive_int("max_len", max_len)
        if min_len > max_len:
            raise ValueError(f"min_len ({min_len}) must be <= max_len ({max_len})")
        if not isinstance(alphabet, (str, list, tuple)) or not all(isinstance(ch, str) for ch in alphabet):
            raise TypeError(f"alphabet must be a string of characters, e.g. 'abc', got {alphabet!r}")
        if not alphabet or any(ch not in VOCAB_CHARS for ch in alphabet):
            raise ValueError("alphabet must be non-empty and use only characters of VOCAB_CHARS")
        self.min_len, self.max_len, self.alphabet = min_len, max_len, alphabet
        self.max_source_len = self.max_target_len = max_len

    def transform(self, text: str) -> str:
        raise NotImplementedError

    def sample(self, rng: random.Random, split: str) -> Example:
        _check_split(split)
        for _ in range(10_000):  # short strings may all live in other splits; rejection keeps it exact
            length = rng.randint(self.min_len, self.max_len)
            text = "".join(rng.choice(self.alphabet) for _ in range(length))
            if split_of(text) == split:
                return Example(text, self.transform(text), self.name)
        raise RuntimeError(f"could not draw a {split} example; widen min_len/max_len or the alphabet")

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "min_len": self.min_len, "max_len": self.max_len, "alphabet": self.alphabet}


class CopyTask(_StringTask):
    """Copy the input string (the easiest sequence-to-sequence task: a diagonal alignment)."""

    name = "copy"

    def transform(self, text: str) -> str:
        return text


class ReverseTask(_StringTask):
    """Reverse the input string (an anti-diagonal alignment)."""

    name = "reverse"

    def transform(self, text: str) -> str:
        return text[::-1]


MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _long(d: dt.date) -> str:
    return MONTHS[d.month - 1]


def _short(d: dt.date) -> str:
    return MONTHS[d.month - 1][:3]


#: name -> how a date is written. "/" is always month first, "." always day first.
DATE_FORMATS = {
    "d_month_y": lambda d: f"{d.day} {_long(d)} {d.year}",  # 21 November 2026
    "month_d_y": lambda d: f"{_long(d)} {d.day}, {d.year}",  # November 21, 2026
    "d_mon_y": lambda d: f"{d.day} {_short(d)} {d.year}",  # 21 Nov 2026
    "mon_d_y": lambda d: f"{_short(d)} {d.day}, {d.year}",  # Nov 21, 2026
    "mm/dd/yyyy": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",  # 11/21/2026
    "yyyy/mm/dd": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",  # 2026/11/21
    "dd.mm.yyyy": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",  # 21.11.2026
    "chinese": lambda d: f"{d.year}年{d.month}月{d.day}日",  # 2026年11月21日
}


def format_date(day: dt.date, fmt: str) -> str:
    """Write `day` in one of `DATE_FORMATS`."""
    if not isinstance(day, dt.date):
        raise TypeError(f"day must be a datetime.date, e.g. datetime.date(2026, 11, 21), got {day!r}")
    if fmt not in DATE_FORMATS:
        raise ValueError(f"fmt must be one of {sorted(DATE_FORMATS)}, got {fmt!r}")
    return DATE_FORMATS[fmt](day)


class DateTask(Task):
    """Normalise a date written in any of `formats` to ISO 8601 ("2026-11-21").

    The split of an example is decided by its calendar day, so a test day is never seen in
    training in any format.

    Args:
        first_year, last_year: the range of years (inclusive).
        formats: names from `DATE_FORMATS` (default: all of them).
    """

    name = "dates"

    def __init__(self, first_year: int = 1950, last_year: int = 2049, formats: Sequence[str] | None = None) -> None:
        check_positive_int("first_year", first_year)
        check_positive_int("last_year", last_year)
        if not 1000 <= first_year <= last_year <= 9999:
            raise ValueError(f"need 1000 <= first_year <= last_year <= 9999, got {first_year}, {last_year}")
        formats = list(DATE_FORMATS) if formats is None else list(formats)
        unknown = [f for f in formats if f not in DATE_FORMATS]
        if not formats or unknown:
            raise ValueError(f"formats must be a non-empty list of names from {sorted(DATE_FORMATS)}, got {formats}")
        self.first_year, self.last_year, self.formats = first_year, last_year, formats
        first = dt.date(first_year, 1, 1).toordinal()
        last = dt.date(last_year, 12, 31).toordinal()
        self.days: dict[str, list[int]] = {s: [] for s in SPLITS}
        for ordinal in range(first, last + 1):
            self.days[split_of(ordinal)].append(ordinal)
        self.max_source_len = len("September 30, 2000")
        self.max_target_len = len("2000-01-01")

    def split_of_day(self, day: dt.date) -> str:
        return split_of(day.toordinal())

    def sample(self, rng: random.Random, split: str) -> Example:
        _check_split(split)
        day = dt.date.fromordinal(rng.choice(self.days[split]))
        fmt = rng.choice(self.formats)
        return Example(format_date(day, fmt), day.isoformat(), fmt)

    def examples_per_format(self, split: str, n_per_format: int, seed: int = 0) -> list[Example]:
        """`n_per_format` examples of every format, each on a different day of `split` (as far as possible)."""
        _check_split(split)
        check_positive_int("n_per_format", n_per_format)
        rng = random.Random(f"{self.name}/{split}/per-format/{seed}")
        days = rng.sample(self.days[split], min(len(self.days[split]), n_per_format * len(self.formats)))
        out = []
        for i, fmt in enumerate(self.formats):
            for k in range(n_per_format):
                day = dt.date.fromordinal(days[(i * n_per_format + k) % len(days)])
                out.append(Example(format_date(day, fmt), day.isoformat(), fmt))
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "first_year": self.first_year,
            "last_year": self.last_year,
            "formats": list(self.formats),
        }


_TASKS: dict[str, type[Task]] = {"copy": CopyTask, "reverse": ReverseTask, "dates": DateTask}


def make_task(name: str | dict[str, object], **options: object) -> Task:
    """A task by name ("copy", "reverse", "dates") with its options, or rebuilt from its `to_dict()`.

    The options are those of the task's class: `min_len`, `max_len`, `alphabet` for copy and reverse
    (`CopyTask`), `first_year`, `last_year`, `formats` for dates (`DateTask`).
    """
    if isinstance(name, dict):
        if "name" not in name:
            raise ValueError(f"a task dict must have a 'name' (a task's to_dict()), got keys {sorted(name)}")
        if options:
            raise TypeError(
                f"options {sorted(options)} given beside a task dict: put them into the dict, "
                f"e.g. make_task({{**task_dict, {next(iter(options))!r}: ...}})"
            )
        options = {k: v for k, v in name.items() if k != "name"}
        name = name["name"]  # type: ignore[assignment]
        if not isinstance(name, str):
            raise TypeError(f"a task dict's 'name' must be a task name such as 'dates', got {name!r}")
    if not isinstance(name, str) or name not in _TASKS:
        raise ValueError(f"task must be one of {sorted(_TASKS)}, got {name!r}")
    cls = _TASKS[name]
    known = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"the {name} task has no option {unknown[0]!r}"
            + (f" (nor {unknown[1:]})" if unknown[1:] else "")
            + f"; its options are {known}"
        )
    return cls(**options)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """A padded batch, ready for teacher forcing (chapter 09).

    Shape:
        src (B, S): source ids, PAD on the right.
        tgt_in (B, T): BOS + target, the decoder's input ("shifted right").
        tgt_out (B, T): target + EOS, what the decoder must predict at each position (PAD after the end).
        src_mask (B, 1, 1, S): `tl.padding_mask(src, pad_id)`, True at real source tokens.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    src_mask: Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (self.src, self.tgt_in, self.tgt_out, self.src_mask)))

    def __len__(self) -> int:
        return self.src.shape[0]


def _pad(rows: list[list[int]], pad_id: int) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)


def make_batch(
    examples: Sequence[Example] | Sequence[tuple[str, str]],
    tokenizer: CharTokenizer,
    device: torch.device | str = "cpu",
) -> Batch:
    """Encode and pad a list of examples (or (source, target) pairs) into a `Batch`."""
    if isinstance(examples, str) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a list of Example or (source, target) pairs, got {type(examples).__name__}")
    if not examples:
        raise ValueError("examples must not be empty")
    if not isinstance(tokenizer, CharTokenizer):
        raise TypeError(f"tokenizer must be a CharTokenizer, got {type(tokenizer).__name__}")
    pairs = []
    for e in examples:
        if isinstance(e, Example):
            pairs.append((e.source, e.target))
        elif isinstance(e, (tuple, list)) and len(e) == 2 and all(isinstance(t, str) for t in e):
            pairs.append((e[0], e[1]))
        else:
            raise TypeError(
                f"examples must be Example objects or (source, target) pairs of strings, got an item {e!r}; "
                "for sources alone use [(source, '') for source in sources]"
            )
    empty = [i for i, (source, _) in enumerate(pairs) if not source]
    if empty:
        raise ValueError(
            f"examples[{empty[0]}] has an empty source: the encoder would have nothing to read (a row of padding "
            "only); leave it out of the batch"
        )
    src = _pad([tokenizer.encode(s) for s, _ in pairs], tokenizer.pad_id)  # (B, S)
    tgt_in = _pad([tokenizer.encode(t, add_bos=True) for _, t in pairs], tokenizer.pad_id)  # (B, T)
    tgt_out = _pad([tokenizer.encode(t, add_eos=True) for _, t in pairs], tokenizer.pad_id)  # (B, T)
    return Batch(src, tgt_in, tgt_out, padding_mask(src, tokenizer.pad_id)).to(as_device("device", device))


# ---------------------------------------------------------------------------------------------
# Text corpora for a character-level language model (chapter 10)
# ---------------------------------------------------------------------------------------------

ASSETS = Path(__file__).resolve().parent / "assets"

#: The corpora shipped with the course (provenance, checksums and licences: assets/CORPORA.md).
CORPORA = {
    "shakespeare": "tinyshakespeare.txt",  # Tiny Shakespeare, nanoGPT's shakespeare_char: 1,115,394 characters
    "tang": "tang_wuyan.txt",  # 17,833 five-character Tang poems, one per line, simplified characters
}


def load_corpus(name: str | os.PathLike[str]) -> str:
    """The text of a shipped corpus ("shakespeare" or "tang", see `CORPORA`), or of any UTF-8 text file.

    Args:
        name: a key of `CORPORA`, or the path of a UTF-8 text file.

    Returns:
        the whole text as one string.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"name must be a corpus name {sorted(CORPORA)} or a file path, got {type(name).__name__}")
    path = ASSETS / CORPORA[name] if isinstance(name, str) and name in CORPORA else Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{str(name)!r} is neither a shipped corpus {sorted(CORPORA)} nor a text file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: {error}") from None


class TextTokenizer(_CharsSerialised):
    """Characters <-> token ids for a language model on one corpus (chapter 10).

    The vocabulary is the sorted set of the characters of a text (`from_text`), id i being the i-th:
    no special tokens, exactly nanoGPT's `shakespeare_char` (65 characters for Tiny Shakespeare). Unlike
    chapter 09's `CharTokenizer` there is no UNK: a character outside the vocabulary is an error, since
    a language model can neither read nor write it.

    Args:
        chars: the vocabulary's characters, each once.
    """

    def __init__(self, chars: str | Sequence[str]) -> None:
        if not isinstance(chars, Sequence):
            raise TypeError(f"chars must be a string (or list) of single characters, got {type(chars).__name__}")
        chars = list(chars)
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("chars must be a non-empty sequence of single characters")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars = "".join(chars)
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> TextTokenizer:
        """The tokenizer whose vocabulary is every distinct character of `text`, sorted."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("text must not be empty: the vocabulary is made of its characters")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """A string -> its token ids, a 1-D int64 tensor (N,)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            ids = [self.index[ch] for ch in text]
        except KeyError as error:
            unknown = sorted(set(text) - set(self.index))
            raise ValueError(
                f"text contains {len(unknown)} character(s) outside the vocabulary of {self.vocab_size}, "
                f"e.g. {unknown[:5]}"
            ) from error
        return torch.tensor(ids, dtype=torch.long)  # (N,)

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """Token ids (a 1-D tensor or a sequence of ints) -> the string."""
        ids = _id_list(ids, self.vocab_size)
        out = []
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            out.append(self.chars[i])
        return "".join(out)


def split_text(data: str | Tensor, train_fraction: float = 0.9) -> tuple[str | Tensor, str | Tensor]:
    """The first `train_fraction` of the characters (or token ids) for training, the rest for validation.

    As nanoGPT does (n = len(data); train = data[: int(0.9 n)]): a cut in the text, not a random
    sample of lines, so validation text is text the model has never seen a window of.

    Returns:
        (train, validation), the same type as `data`.
    """
    if not isinstance(data, (str, Tensor)):
        raise TypeError(f"data must be a str or a 1-D tensor of token ids, got {type(data).__name__}")
    if isinstance(data, Tensor) and data.dim() != 1:
        raise ValueError(f"data must be 1-D (one stream of token ids), got shape {tuple(data.shape)}")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)):
        raise TypeError(f"train_fraction must be a float in (0, 1), got {train_fraction!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    cut = int(len(data) * train_fraction)
    return data[:cut], data[cut:]


def _check_stream(data: object, block_size: object) -> None:
    check_integer_vector("data", data, "token ids (tokenizer.encode(text))")
    assert isinstance(data, Tensor)
    check_positive_int("block_size", block_size)
    assert isinstance(block_size, int)
    if data.numel() < block_size + 1:
        raise ValueError(f"data has {data.numel()} tokens, fewer than block_size + 1 = {block_size + 1}")


def random_windows(
    data: Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """A training batch: `batch_size` windows at random offsets, and the same windows one token later.

    Target y[b, t] = x[b, t + 1]: at every position the model predicts the next character.

    Args:
        starts: the offsets a window may begin at (a 1-D integer tensor, e.g. `token_starts(data, newline_id,
            block_size)`: every window then begins with a newline); None, any offset 0 ... N - block_size - 1.

    Shape:
        data (N,) -> x (B, block_size), y (B, block_size).
    """
    _check_stream(data, block_size)
    check_positive_int("batch_size", batch_size)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)) or None, got {generator!r}"
        )
    if starts is None:
        first = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    else:
        if not is_trusted():  # train_gpt checks its starts once, not at every step
            _check_starts(starts, len(data), block_size)
        first = starts[torch.randint(len(starts), (batch_size,), generator=generator)]  # (B,)
    offsets = first[:, None] + torch.arange(block_size)  # (B, block_size)
    return data[offsets], data[offsets + 1]


def _check_starts(starts: object, n: int, block_size: int) -> None:
    check_integer_vector("starts", starts, "offsets (tl.data.token_starts)")
    assert isinstance(starts, Tensor)
    if starts.numel() == 0:
        raise ValueError("starts is empty: no window can begin anywhere; pass None to allow every offset")
    last = n - block_size - 1  # the last offset whose window and targets fit in the data
    low, high = torch.stack(torch.aminmax(starts)).tolist()  # one pass, one read-back
    if low < 0 or high > last:
        raise ValueError(
            f"starts must lie in [0, {last}] (N - block_size - 1, for data of {n} tokens and block_size "
            f"{block_size}), got values in [{low}, {high}]; tl.data.token_starts "
            "leaves out the offsets too close to the end"
        )


def token_starts(data: Tensor, token: int, block_size: int, share: float = 1.0) -> Tensor:
    """Offsets for `random_windows(..., starts=...)` that make windows begin where `token` stands.

    For a text of one item per line (a poem, say) with `token` the newline's id, windows drawn from these
    offsets begin at the start of an item, so a model learns to write one from its beginning, as it does
    when sampled from a prompt of a newline.

    Args:
        share: 1.0, only the offsets where `token` stands (and a whole window and its targets fit); below 1,
            every offset 0 ... N - block_size - 1 once, followed by the token's offsets repeated
            k = round(share / (1 - share) * (N - block_size) / K) times (K of them), so that about `share` of
            the windows drawn begin at the token and the rest anywhere; 0.0, every offset once.

    Shape:
        data (N,) -> offsets (K,) increasing for share 1.0, else (N - block_size + k K,).
    """
    _check_stream(data, block_size)
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be a token id (an int, e.g. tokenizer.encode('\\n').item()), got {token!r}")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        raise ValueError(
            f"share must be a number in [0, 1] (the share of windows that begin at the token), got {share!r}"
        )
    anywhere = torch.arange(len(data) - block_size)  # every offset whose window and targets fit
    if share == 0.0:
        return anywhere
    offsets = anywhere[data[: len(data) - block_size] == token]  # (K,)
    if offsets.numel() == 0:
        raise ValueError(
            f"token {token} never stands where a window of {block_size} can begin (offsets 0 ... "
            f"{len(data) - block_size - 1}); choose a token of the text"
        )
    if share == 1.0:
        return offsets
    repeats = round(share / (1.0 - share) * len(anywhere) / len(offsets))
    return torch.cat([anywhere, offsets.repeat(repeats)])


def consecutive_windows(data: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """The whole stream cut into consecutive windows, for a validation loss that is not a random estimate.

    Window i holds tokens i * block_size ... (i + 1) * block_size - 1 and its targets are the next tokens;
    the tail that does not fill a whole window (fewer than block_size + 1 tokens left) is left out. Every
    token is predicted once, by a model that sees 0 ... block_size - 1 tokens of context before it.

    Shape:
        data (N,) -> x (W, block_size), y (W, block_size), W = (N - 1) // block_size.
    """
    _check_stream(data, block_size)
    windows = (len(data) - 1) // block_size
    used = windows * block_size
    x = data[:used].view(windows, block_size)  # (W, block_size)
    y = data[1 : used + 1].view(windows, block_size)  # (W, block_size)
    return x, y
