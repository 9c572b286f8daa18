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

Shape legend: B batch, S source length, T target length (+1 for BOS or EOS).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_lab._checks import as_device, check_positive_int
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
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3

#: Every character any task can produce: digits, letters, punctuation, space, and 年 月 日.
VOCAB_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.-/年月日"

SPLITS = ("train", "validation", "test")


class CharTokenizer:
    """Characters <-> token ids, with the four special tokens first (chapter 09).

    Ids: 0 PAD, 1 BOS (start of a target), 2 EOS (end of a target), 3 UNK (any character not in
    the vocabulary), then one id per character of `chars`.

    Args:
        chars: the characters of the vocabulary (default `VOCAB_CHARS`); no repeats.
    """

    def __init__(self, chars: str | Sequence[str] = VOCAB_CHARS) -> None:
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
        ids = [self.index.get(ch, self.unk_id) for ch in text]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int] | Tensor, stop_at_eos: bool = True) -> str:
        """Token ids -> a string: PAD and BOS are dropped, UNK shows as "?", decoding stops at EOS."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(f"ids must be 1-D (one sequence), got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        out = []
        for i in ids:
            i = int(i)
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
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return ["␣" if self.tokens[int(i)] == " " else self.tokens[int(i)] for i in ids]

    def to_dict(self) -> dict[str, str]:
        """Plain data for a checkpoint (readable with `torch.load(weights_only=True)`)."""
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> CharTokenizer:
        return cls(data["chars"])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# ---------------------------------------------------------------------------------------------
# Splits disjoint by underlying value
# ---------------------------------------------------------------------------------------------


def _mix64(x: int) -> int:
    """A fixed 64-bit integer hash (splitmix64's finaliser): same answer on every machine and run."""
    x &= 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def split_of(key: int | str, fractions: tuple[float, float] = (0.1, 0.1)) -> str:
    """The split ("train", "validation" or "test") that an underlying value belongs to.

    A fixed hash of the value decides, so the answer never depends on the format the value is
    written in, on the order examples are drawn in, or on any random seed.

    Args:
        key: the underlying value (a day's ordinal for dates, the string for copy/reverse).
        fractions: the shares of (validation, test); train gets the rest.
    """
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
    """A task by name ("copy", "reverse", "dates"), or rebuilt from its `to_dict()`."""
    if isinstance(name, dict):
        options = {k: v for k, v in name.items() if k != "name"}
        name = str(name["name"])
    if name not in _TASKS:
        raise ValueError(f"task must be one of {sorted(_TASKS)}, got {name!r}")
    return _TASKS[name](**options)  # type: ignore[arg-type]


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
    src = _pad([tokenizer.encode(s) for s, _ in pairs], tokenizer.pad_id)  # (B, S)
    tgt_in = _pad([tokenizer.encode(t, add_bos=True) for _, t in pairs], tokenizer.pad_id)  # (B, T)
    tgt_out = _pad([tokenizer.encode(t, add_eos=True) for _, t in pairs], tokenizer.pad_id)  # (B, T)
    return Batch(src, tgt_in, tgt_out, padding_mask(src, tokenizer.pad_id)).to(as_device("device", device))
