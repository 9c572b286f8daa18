"""Every measured figure quoted in a chapter's prose comes from an output of that chapter, or says where else
it comes from; and the Chinese edition quotes the same figures as the English one.

A chapter's prose is written once and its outputs are re-made by every run, so a number in a sentence ("the
loss ends near 1.86") silently goes stale when a run changes the output it was read from. This guard reads the
committed notebooks only (no kernel; about a second for every chapter).

**Which figures.** In the English markdown cells of notebooks/solutions/NN_*.ipynb: every number with a
decimal point or an exponent (`1.86`, `0.02`, `1e-5`, `1.5 \\times 10^{-2}`, `10⁻⁹`), every percentage
(`97 %`, `12.5%`), every ratio (`3.2×`, `4x wide`, `8 times larger`; `4 x d_model` and `2 × 2` are products)
and every time (`104 s`, `1.5 minutes`, `12 ms`). Plain integers are not figures (dimensions, counts, seeds).
Not figures at all: section and version numbers (`§2.2`, `section 3.4`, `torch 2.11`, anything with two dots
such as `2.13.0` or `17.06.2025`), the operand after `/` or `^` in a formula, link targets, code blocks inside
markdown (their numbers count as code literals, below), and the spans that tools/chapter_times.py writes (the
title cell's `**Time:**` line and the minutes of chapter 00's map), which tests/test_editions.py holds to the
measured kernel time.

**When a figure matches.** By magnitude (a sign is easily reworded: "falls by 0.3"), when the number rounded
to the figure's precision is the figure: `1.86` matches 1.8605 and 1.855, not 1.87; `1e-5` matches 1.2e-5;
`7.4 M` matches 7,412,000; a bare power of ten is an order of magnitude (`10^{-14}` matches 3.6e-15). The
number may be:

- in the chapter's text outputs (stream output, text/plain, error messages; never images, whose titles and
  legends are not stored as text). A percentage matches an output percentage or any output number times 100
  (`97 %` matches the fraction 0.9712). A time matches only an output time, units converted (`1.5 minutes`
  matches `91.2 s`).
- a literal of the chapter's code (a setting `lr=3e-3`, an asserted bound `assert loss <= 1.88`, a command
  shown in the markdown): prose that quotes a setting quotes a definition, and the code is its source. Times
  never match code literals.
- Otherwise the figure needs an entry in tests/prose_figures.json, section "allowed": per chapter, a short
  phrase of the prose that holds the figure (whitespace does not matter) and its source ("paper, section 5.3",
  "note 002"; a repository path named there must exist). A source `arithmetic: <expression>` is computed (with
  `math`, `file_bytes(path)`) and must round to the figure. Entries go first: a phrase listed says more than a
  match by value, which may be a coincidence. An entry whose phrase left the prose, or holds no figure, fails,
  so the list cannot rot.

A figure that should come from an output and does not is a drift: it fails, with the chapter, the cell, the
sentence and the nearest output numbers. Drifts found and not yet fixed stand in the section "drift_to_fix"
with a note, and fail with it until the prose or the output is fixed and the entry deleted.

**Chinese.** Each English markdown cell and its translation (translations/zh/NN_*.json, from which
tools/translate.py makes notebooks/zh/; tests/test_translation.py proves those notebooks are a fresh
generation) quote the same numbers, as a multiset of values: the figures above, section and version numbers
included, and counts (integers of four digits or more, grouped `3,149,824` / `37 000`, or with a magnitude:
`65 M`, `70B`, `315 万`). Full-width digits and signs read as ASCII; 万 = 1e4, 亿 = 1e8, 千 = 1e3; times compare
in seconds (`1.5 分钟` = `90 s`). Two values agree when they round to each other at the coarser of the two
precisions (`约 315 万` agrees with 3,149,824 and with `3.15 M`). A ratio the Chinese spells out (八分之一,
八倍) may stand for an English figure, but is never required, as English number words are not read.

Weak spot: a figure of one significant digit has a wide window (`0.6` matches any output from 0.55 to 0.65,
`2x` any from 1.5 to 2.5), so a coincidence can back it; most figures of the course have two or more digits.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import json
import math
import pathlib
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))
TRANSLATIONS = ROOT / "translations" / "zh"
ALLOW_LIST = pathlib.Path(__file__).with_name("prose_figures.json")


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"transformer_lab_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses in the tool look their module up there
    spec.loader.exec_module(module)
    return module


translate = _load_tool("translate")  # its masked() blanks the spans tools/chapter_times.py writes


# ------------------------------------------------------------------ reading numbers

# Full-width forms (Chinese text) read as ASCII.
FULL_WIDTH = str.maketrans("０１２３４５６７８９．％－＋", "0123456789.%-+")
SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
SPACE = "[ \u00a0\u2009\u202f]"  # a space inside a number or between a number and its unit (never a newline)

SECONDS = {  # seconds in each unit of time, by its names in the English and the Chinese prose
    1e-9: ("ns",),
    1e-6: ("µs", "μs", "us"),
    1e-3: ("ms", "毫秒"),
    1.0: ("s", "sec", "secs", "second", "seconds", "秒"),
    60.0: ("min", "mins", "minute", "minutes", "分钟"),
    3600.0: ("h", "hour", "hours", "小时"),
    86400.0: ("day", "days", "天"),
}
TIME_UNITS = {name: seconds for seconds, names in SECONDS.items() for name in names}
MAGNITUDES = {"k": 1e3, "M": 1e6, "B": 1e9, "million": 1e6, "billion": 1e9, "千": 1e3, "万": 1e4, "亿": 1e8}

NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?<![A-Za-z_][-−])"  # not the 2 of GPT-2
    r"(?P<sign>[-−](?=\.?\d))?"  # a range 0.87-0.99 is two numbers
    r"(?P<mantissa>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!,?\d)"  # 3,149,824
    rf"|\d{{1,3}}(?:{SPACE}\d{{3}})+(?![\d.])"  # 37 000
    r"|\d+(?:\.\d+)?|\.\d+)"
    r"(?!\.?\d)"  # not a piece of 2.13.0 or 17.06.2025
    r"(?:[eE](?P<exp>[-+−]?\d+))?"  # 1e-5
    r"(?:\s*(?:\\times|\\cdot|×|·)\s*10\^\{?(?P<exp_tex>[-−]?\d+)\}?"  # 1.5 \times 10^{-2}
    r"|\s*×\s*10(?P<exp_sup>[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?"  # 3 × 10⁻⁴
    r"(?P<unit>"
    rf"{SPACE}?(?:%|percent\b)"
    r"|(?P<times>×|x)(?![A-Za-z0-9_])"  # 3.2×, 4x wide (not 4x4)
    rf"|{SPACE}(?P<spaced_times>×|x)(?!\s*[A-Za-z0-9_$\\(])"  # 3.2 ×, but not the product 4 x d_model
    rf"|{SPACE}(?P<word_times>times)(?![A-Za-z])"  # 8 times larger
    rf"|{SPACE}?(?:ns|µs|μs|us|ms|min|mins|minutes?|secs?|seconds?|hours?|days?)(?![A-Za-z])"
    rf"|{SPACE}(?:s|h)(?![A-Za-z0-9_])"
    r"|\s?(?:毫秒|秒|分钟|小时|天|倍)"
    rf"|{SPACE}?(?:M|million|billion|千|万|亿)(?![A-Za-z])"
    r"|(?:k|B)(?![A-Za-z])"
    r")?"
)
POWER_OF_TEN = re.compile(r"(?<![\d.])10(?:\^\{?(?P<tex>[-−]?\d+)\}?|(?P<sup>[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))")
# Chinese numerals that state a ratio: 八倍 / 八分之一 (English: "8 times", "8 times smaller").
CHINESE_RATIO = re.compile(r"(?P<numeral>[一二两三四五六七八九十百千万]+)(?:\s*倍|分之一)")
CHINESE_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
CHINESE_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000}
# Numbers that name a section, a version or a release, never a measurement.
REFERENCE = re.compile(r"(?:§|\bsections?\s|\bSections?\s|\bversions?\s|\btorch\s|\bPyTorch\s|\bPython\s|\bCUDA\s)$")


@dataclass(frozen=True)
class Figure:
    """A number as quoted in a text.

    `value` is in the figure's own unit (percent for a percentage, seconds for a time, the count for `7.4 M`);
    `step` is one unit of its last shown digit in that unit (0.01 for `1.86`, 1e5 for `7.4 M`, 6 s for
    `1.5 minutes`); `raw` and `raw_step` are the same before a magnitude is applied (7.4 and 0.1 for `7.4 M`).
    """

    text: str
    kind: str  # "decimal", "percent", "ratio", "time", "count", "integer"
    value: float
    step: float
    raw: float
    raw_step: float
    start: int = 0
    end: int = 0
    reference: bool = False  # a section or version number
    decade: bool = False  # a bare power of ten (10^{-9}, 10⁻⁹): an order of magnitude

    def bounds(self, raw: bool = False, step: float = 0.0) -> tuple[float, float]:
        """The magnitudes that round to this figure (at the coarser of its precision and `step`)."""
        if self.decade:  # 10^k stands for what rounds to k on a log scale: 3.2e-15 .. 3.2e-14 for 10^{-14}
            return self.value / math.sqrt(10), self.value * math.sqrt(10)
        value, own = (self.raw, self.raw_step) if raw else (self.value, self.step)
        half = max(own, step) / 2 * (1 + 1e-9) + 1e-300
        return abs(value) - half, abs(value) + half

    def agrees(self, value: float, step: float = 0.0) -> bool:
        """`value` rounds to this figure at the coarser of the two precisions."""
        low, high = self.bounds(step=step)
        return low <= abs(value) <= high


def chinese_numeral(text: str) -> int:
    """八 -> 8, 十六 -> 16, 三十五 -> 35, 十万 -> 100000."""
    total, digit = 0, 0
    for char in text:
        if char in CHINESE_DIGITS:
            digit = CHINESE_DIGITS[char]
        elif char == "万":
            total, digit = (total + digit) * 10_000, 0
        else:
            total, digit = total + max(digit, 1) * CHINESE_UNITS[char], 0
    return total + digit


def _decimals(mantissa: str) -> int:
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _exponent(text: str | None) -> int:
    return int(text.translate(SUPERSCRIPT).replace("−", "-")) if text else 0


def read_numbers(text: str, operands: bool = True) -> Iterator[Figure]:
    """Every number of `text` with its unit, in order (see the module's docstring for the forms).
    With `operands=False`, not the numbers that follow a `/` or `^` (the 2 of "(n + 1) / 2 times"): in prose
    they belong to a formula, not to a figure."""
    text = text.translate(FULL_WIDTH)
    taken: list[tuple[int, int]] = []
    for match in NUMBER.finditer(text):
        if not operands and re.search(r"[/^]\s?$", text[max(0, match.start() - 2) : match.start()]):
            continue
        mantissa = re.sub(r"[,\s]", "", match["mantissa"])
        exponent = _exponent(match["exp"] or match["exp_tex"] or match["exp_sup"])
        places = _decimals(mantissa)
        raw = float(mantissa) * 10.0**exponent
        raw_step = 10.0 ** (exponent - places)
        unit = (match["unit"] or "").strip(" \u00a0\u2009\u202f")
        scale, kind = 1.0, "decimal" if places or match["exp"] or match["exp_tex"] or match["exp_sup"] else "integer"
        if unit in ("%", "percent"):
            kind = "percent"
        elif match["times"] or match["spaced_times"] or match["word_times"] or unit == "倍":
            kind = "ratio"
        elif unit in TIME_UNITS:
            kind, scale = "time", TIME_UNITS[unit]
        elif unit in MAGNITUDES:
            scale = MAGNITUDES[unit]
            kind = "decimal" if places else "count"
        elif kind == "integer" and ("," in match["mantissa"] or " " in match["mantissa"] or raw >= 1000):
            kind = "count"
        before = text[max(0, match.start() - 12) : match.start()]
        if match["exp_tex"] or match["exp_sup"]:
            taken.append(match.span())
        yield Figure(
            text=match.group(0).strip(),
            kind=kind,
            value=raw * scale,
            step=raw_step * scale,
            raw=raw,
            raw_step=raw_step,
            start=match.start(),
            end=match.end(),
            reference=bool(REFERENCE.search(before)),
        )
    for match in CHINESE_RATIO.finditer(text):
        value = float(chinese_numeral(match["numeral"]))
        yield Figure(match.group(0), "ratio", value, 1.0, value, 1.0, match.start(), match.end())
    for match in POWER_OF_TEN.finditer(text):  # a bare 10^{-9} or 10⁻⁹: the number 1e-9
        if any(a <= match.start() < b for a, b in taken):
            continue
        exponent = _exponent(match["tex"] or match["sup"])
        value = 10.0**exponent
        yield Figure(match.group(0), "decimal", value, value, value, value, match.start(), match.end(), decade=True)


# ------------------------------------------------------------------ the prose of a chapter

FENCED = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)|<?https?://[^\s)>]+>?")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)


def _blank(text: str, start: int, end: int) -> str:
    """`text` with [start, end) replaced by spaces (newlines kept), so that positions stay put."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def code_blocks(markdown: str) -> list[tuple[int, int]]:
    """Spans of fenced code blocks and of indented ones (4 spaces, after a blank line, not in a list)."""
    spans = [m.span() for m in FENCED.finditer(markdown)]
    offset, previous_blank, inside = 0, True, False
    for line in markdown.splitlines(keepends=True):
        indented = line.startswith("    ") and not re.match(r"\s*(?:[-*+]|\d+\.)\s", line) and line.strip()
        if indented and (previous_blank or inside):
            spans.append((offset, offset + len(line)))
            inside = True
        elif line.strip():
            inside = False
        previous_blank = not line.strip()
        offset += len(line)
    return spans


def prose(markdown: str) -> tuple[str, str]:
    """(the text whose figures count, the text of its code blocks): link targets, HTML comments and code
    blocks blanked out of the first, positions kept."""
    text = markdown
    code = []
    for start, end in code_blocks(text):
        code.append(text[start:end])
        text = _blank(text, start, end)
    for pattern in (LINK_TARGET, HTML_COMMENT):
        for match in pattern.finditer(text):
            text = _blank(text, *match.span())
    return text, "\n".join(code)


def english_cells(notebook: dict) -> list[tuple[int, str, str]]:
    """(cell index, prose, code blocks) of every markdown cell, the chapter_times spans blanked out."""
    cells = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        markdown = _source(cell)
        for _, span in translate.masked(markdown)[1]:
            markdown = _blank(markdown, *span.span())
        cells.append((index, *prose(markdown)))
    return cells


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def measured(figures: Iterable[Figure]) -> list[Figure]:
    """The figures this guard holds to a source: not integers, counts or section numbers."""
    return [f for f in figures if f.kind in ("decimal", "percent", "ratio", "time") and not f.reference]


def sentence(text: str, figure: Figure, width: int = 220) -> str:
    """The sentence around a figure, on one line, cut to about `width` characters; in a table, its row after
    the table's header."""
    line_start = text.rfind("\n", 0, figure.start) + 1
    line_end = text.find("\n", figure.end) % (len(text) + 1)
    if text[line_start:line_end].lstrip().startswith("|"):
        header_start = line_start
        while header_start > 0:
            previous = text.rfind("\n", 0, header_start - 1) + 1
            if not text[previous:header_start].lstrip().startswith("|"):
                break
            header_start = previous
        header = text[header_start : text.find("\n", header_start)].strip()
        row = text[line_start:line_end].strip()
        return row if row == header else f"{header} … {row}"
    starts = [m.end() for m in re.finditer(r"[.!?:;]\s|\n\s*\n|^\s*[-|>]|\|", text[: figure.start], re.M)]
    start = starts[-1] if starts else 0
    end_match = re.compile(r"[.!?;](?=\s|$)|\n\s*\n|\|").search(text, figure.end)
    end = end_match.end() if end_match else len(text)
    said = " ".join(text[start:end].split())
    if len(said) > width:
        at = " ".join(text[start : figure.start].split())
        left = max(0, len(at) - width // 2)
        said = ("…" if left else "") + said[left : left + width] + "…"
    return said


# ------------------------------------------------------------------ the chapter's own numbers


@dataclass(frozen=True)
class Source:
    value: float  # magnitude, in seconds for a time
    kind: str  # an output's "number", "percent", "ratio" or "time"; a code "literal"
    cell: int
    text: str


OUTPUT_SKIP = re.compile(r"^<Figure size .*>$|^<IPython\..*>$", re.M)


def output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append(_source({"source": output["text"]}))
        for key in ("text/plain",):
            if key in output.get("data", {}):
                parts.append(_source({"source": output["data"][key]}))
        if output.get("output_type") == "error":
            parts.append(output.get("evalue", ""))
    return OUTPUT_SKIP.sub("", "\n".join(parts))


def output_numbers(notebook: dict) -> list[Source]:
    found = []
    for index, cell in enumerate(notebook["cells"]):
        for f in read_numbers(output_text(cell)):
            kind = {"percent": "percent", "ratio": "ratio", "time": "time"}.get(f.kind, "number")
            found.append(Source(abs(f.value), kind, index, f.text))
            if f.kind != "time" and f.value != f.raw:  # 7.4M: both 7.4e6 and 7.4
                found.append(Source(abs(f.raw), kind, index, f.text))
    return found


# What in code is not a literal number: strings (f-strings and their format specs included) and comments.
CODE_NOISE = re.compile(
    r"[rRbBuUfF]{0,2}(?:" + '"""' + r"[\s\S]*?" + '"""' + r"|'''[\s\S]*?'''"
    r"|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')|#[^\n]*"
)
PYTHON_NUMBER = re.compile(r"(?<![\w.])(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][-+]?\d+)?(?![\w.])")


def code_literals(notebook: dict) -> list[Source]:
    """The numeric literals of the chapter's code cells (strings and comments excluded) and of the code blocks
    inside its markdown (commands shown)."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            for token in PYTHON_NUMBER.findall(CODE_NOISE.sub(" ", _source(cell))):
                found.append(Source(abs(float(token.replace("_", ""))), "literal", index, token))
        elif cell["cell_type"] == "markdown":
            for f in read_numbers(prose(_source(cell))[1]):
                found.append(Source(abs(f.value), "literal", index, f.text))
    return found


class Index:
    """Sorted values for a fast "is there a source that rounds to this figure?"."""

    def __init__(self, sources: Iterable[Source], scale: float = 1.0) -> None:
        self.sources = sorted(sources, key=lambda s: s.value)
        self.values = [s.value * scale for s in self.sources]  # scale 100: a fraction read as a percentage

    def match(self, figure: Figure, raw: bool = False) -> tuple[float, Source] | None:
        """(distance, source) of the source nearest the figure among those that round to it, or None."""
        value, step = (abs(figure.raw), figure.raw_step) if raw else (abs(figure.value), figure.step)
        smallest, largest = figure.bounds(raw=raw)
        low, high = bisect.bisect_left(self.values, smallest), bisect.bisect_right(self.values, largest)
        if low == high:
            return None
        best = min(range(low, high), key=lambda i: abs(self.values[i] - value))
        return abs(self.values[best] - value) / step, self.sources[best]

    def nearest(self, value: float, count: int = 3) -> list[tuple[float, Source]]:
        """Up to `count` sources nearest `value` by ratio (so that 1e-16 is near 3e-16, not near 0), each number
        and cell once."""
        target = abs(value)

        def distance(i: int) -> float:
            if target == 0 or self.values[i] == 0:
                return 0.0 if self.values[i] == target else math.inf
            return abs(math.log(self.values[i] / target))

        at = bisect.bisect_left(self.values, target)
        window = range(max(0, at - 8 * count), min(len(self.values), at + 8 * count))
        seen, near = set(), []
        for i in sorted(window, key=distance):
            key = (self.sources[i].text, self.sources[i].cell)
            if key not in seen and distance(i) < math.inf:
                seen.add(key)
                near.append((self.values[i], self.sources[i]))
        return near[:count]


@dataclass
class Chapter:
    """A chapter's prose figures and the numbers that can back them."""

    name: str
    notebook: dict
    outputs: list[Source]
    literals: list[Source]

    @classmethod
    def load(cls, path: pathlib.Path, notebook: dict | None = None) -> Chapter:
        notebook = notebook or json.loads(path.read_text(encoding="utf-8"))
        return cls(path.stem, notebook, output_numbers(notebook), code_literals(notebook))

    def __post_init__(self) -> None:
        plain = [s for s in self.outputs if s.kind != "time"]
        self.any_output = Index(plain)
        self.as_percent = Index([s for s in plain if s.kind != "percent"], scale=100.0)  # fractions
        self.times = Index([s for s in self.outputs if s.kind == "time"])
        self.code = Index(self.literals)
        self.code_percent = Index(self.literals, scale=100.0)

    def backing(self, figure: Figure) -> tuple[str, Source] | None:
        """("output" or "code", the number) that the figure rounds to, or None. Of several, the nearest wins,
        and an output wins a tie: `α = 0.6` comes from the literal 0.6 rather than from an output 0.55."""
        if figure.kind == "time":
            found = self.times.match(figure)
            return ("output", found[1]) if found else None
        outputs = [self.any_output] + ([self.as_percent] if figure.kind == "percent" else [])
        code = [self.code] + ([self.code_percent] if figure.kind == "percent" else [])
        candidates = []
        for rank, (where, indexes) in enumerate((("output", outputs), ("code", code))):
            for index in indexes:
                for raw in (False, True) if figure.raw != figure.value else (False,):
                    found = index.match(figure, raw=raw)
                    if found:
                        candidates.append((found[0], rank, where, found[1]))
        if not candidates:
            return None
        _, _, where, source = min(candidates, key=lambda c: (c[0], c[1]))
        return where, source

    def nearest(self, figure: Figure) -> str:
        index = self.times if figure.kind == "time" else self.any_output
        candidates = index.nearest(figure.value)
        if figure.kind == "percent":
            candidates += self.as_percent.nearest(figure.value)
            candidates.sort(key=lambda pair: abs(pair[0] - figure.value))
            candidates = candidates[:3]
        if not candidates:
            return "no output of that kind in the chapter"
        return ", ".join(
            f"{s.text} (cell {s.cell}{', as a percentage' if scaled != s.value else ''})" for scaled, s in candidates
        )


# ------------------------------------------------------------------ the allow-list


def allow_list() -> dict:
    return json.loads(ALLOW_LIST.read_text(encoding="utf-8"))


def phrase_pattern(phrase: str) -> re.Pattern[str]:
    return re.compile(r"\s+".join(re.escape(word) for word in phrase.split()))


@dataclass
class Problem:
    chapter: str
    cell: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.chapter}, cell {self.cell}" if self.cell is not None else self.chapter
        return f"{where}: {self.message}"


@dataclass
class Report:
    figures: int = 0
    by_output: int = 0
    by_code: int = 0
    by_source: int = 0
    problems: list[Problem] = field(default_factory=list)


def file_bytes(path: str) -> int:
    """The size of a file of the repository, for a source such as `arithmetic: file_bytes("x.pt") / 1e6`."""
    return (ROOT / path).stat().st_size


def evaluate_arithmetic(expression: str) -> float:
    """The value of an allow-list source `arithmetic: <expression>`: Python arithmetic with math's names,
    `file_bytes(path)` and nothing else."""
    names = {name: getattr(math, name) for name in dir(math) if not name.startswith("_")}
    names |= {"math": math, "file_bytes": file_bytes, "sum": sum, "max": max, "min": min, "abs": abs}
    return float(eval(expression, {"__builtins__": {}}, names))  # the allow-list, this test's own data


SOURCE_PATH = re.compile(r"(?<![\w/])(?:[\w.-]+/)+[\w.-]+\.(?:py|json|md|log|pt|txt|csv|ipynb)\b")


def check_chapter(chapter: Chapter, allowed: dict[str, str], drifts: dict[str, str]) -> Report:
    """Every measured figure of the chapter's English prose, against its outputs, code and allow-list entries."""
    report = Report()
    problems = report.problems
    entries = {phrase: ("allowed", source) for phrase, source in allowed.items()}
    entries.update({phrase: ("drift", note) for phrase, note in drifts.items()})
    used: dict[str, int] = dict.fromkeys(entries, 0)
    found_anywhere: set[str] = set()
    for phrase, (section, source) in entries.items():
        if not isinstance(source, str) or not source.strip():
            problems.append(Problem(chapter.name, None, f"{section} entry {phrase!r} must say where it comes from"))
        elif section == "allowed":
            for path in SOURCE_PATH.findall(source):
                if not (ROOT / path).exists() and not (ROOT / "transformer_lab" / path).exists():
                    problems.append(Problem(chapter.name, None, f"allowed entry {phrase!r}: source {path} not found"))
    for index, text, _ in english_cells(chapter.notebook):
        spans = [(m.start(), m.end(), phrase) for phrase in entries for m in phrase_pattern(phrase).finditer(text)]
        found_anywhere.update(phrase for _, _, phrase in spans)
        for figure in measured(read_numbers(text, operands=False)):
            report.figures += 1
            covering = [p for a, b, p in spans if a <= figure.start and figure.end <= b]
            for phrase in covering:
                used[phrase] += 1
            # A listed phrase says more than a match by value, which may be a coincidence: it goes first.
            drift = next((p for p in covering if entries[p][0] == "drift"), None)
            allowed_by = next((p for p in covering if entries[p][0] == "allowed"), None)
            if drift is not None:
                backing = chapter.backing(figure)
                now = (
                    f"; it now rounds from {backing[0]} {backing[1].text} (cell {backing[1].cell}): if that is "
                    "its source, delete the entry"
                    if backing
                    else ""
                )
                problems.append(
                    Problem(
                        chapter.name,
                        index,
                        f"drift to fix: {figure.text!r} ({entries[drift][1]}) "
                        f"in: {sentence(text, figure)!r}; nearest outputs: "
                        f"{chapter.nearest(figure)}{now}",
                    )
                )
            elif allowed_by is not None:
                report.by_source += 1
                source = entries[allowed_by][1]
                if source.startswith("arithmetic:"):
                    try:
                        value = evaluate_arithmetic(source.removeprefix("arithmetic:"))
                    except Exception as error:  # any mistake in the allow-list is reported, not raised
                        problems.append(Problem(chapter.name, index, f"allowed entry {allowed_by!r}: {error!r}"))
                        continue
                    if not figure.agrees(value):
                        problems.append(
                            Problem(
                                chapter.name,
                                index,
                                f"{figure.text!r} is not what its allowed entry computes, {value:.6g} ({source})",
                            )
                        )
            elif backing := chapter.backing(figure):
                report.by_output += backing[0] == "output"
                report.by_code += backing[0] == "code"
            else:
                problems.append(
                    Problem(
                        chapter.name,
                        index,
                        f"{figure.text!r} matches no output, code literal or allow-list entry, in: "
                        f"{sentence(text, figure)!r}; nearest outputs: {chapter.nearest(figure)}",
                    )
                )
    for phrase, (section, _) in entries.items():
        if phrase not in found_anywhere:
            message = f"{section} entry {phrase!r} is no longer in the prose: delete it"
            if section == "drift":
                message += " (fixed?)"
            problems.append(Problem(chapter.name, None, message))
        elif not used[phrase]:
            problems.append(Problem(chapter.name, None, f"{section} entry {phrase!r} holds no measured figure"))
    return report


# ------------------------------------------------------------------ Chinese against English


def compared(text: str) -> list[Figure]:
    """The numbers of a text that its translation must keep: the measured figures, section and version
    numbers, and counts (see the module docstring). Not Chinese numerals (八分之一): see pair_up."""
    return [
        f for f in read_numbers(text, operands=False) if f.kind != "integer" and not CHINESE_RATIO.fullmatch(f.text)
    ]


def pair_up(english: list[Figure], chinese: list[Figure]) -> tuple[list[Figure], list[Figure]]:
    """(English figures without a Chinese one of the same value, Chinese figures without an English one).

    Pairs that agree at the finer of their two precisions are made first, so that `1.25 M` takes `1.25 M`
    and leaves `1.2 M` to `1.2 M`; then pairs that agree at the coarser one (3,149,824 and 约 315 万)."""
    left_en, left_zh = list(english), list(chinese)
    for finer in (True, False):
        for figure in sorted(list(left_en), key=lambda f: f.step):
            agreeing = [
                (abs(c.value - figure.value), i)
                for i, c in enumerate(left_zh)
                if (figure.agrees(c.value) and c.agrees(figure.value) if finer else figure.agrees(c.value, c.step))
            ]
            if agreeing:
                left_zh.pop(min(agreeing)[1])
                left_en.remove(figure)
    return left_en, left_zh


def spelled_out(text: str) -> list[Figure]:
    """The ratios a Chinese text writes in numerals (八倍, 八分之一): they may stand for an English figure
    ("8 times"), as English words may stand for a Chinese one, so they are never required."""
    return [f for f in read_numbers(text, operands=False) if CHINESE_RATIO.fullmatch(f.text)]


def check_translation(name: str, notebook: dict, translation: dict) -> list[Problem]:
    by_en = {entry["en"]: entry for entry in translation["cells"]}
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        english = translate.masked(_source(cell))[0]
        entry = by_en.get(english)
        if entry is None or not entry.get("zh", "").strip():
            continue  # missing or stale: tests/test_translation.py says so
        en_text = prose(english)[0]
        zh_text = prose(entry["zh"])[0]
        missing, extra = pair_up(compared(en_text), compared(zh_text))
        missing, _ = pair_up(missing, spelled_out(zh_text))
        for figure in missing:
            problems.append(
                Problem(name, index, f"the Chinese lacks {figure.text!r} of: {sentence(en_text, figure)!r}")
            )
        for figure in extra:
            problems.append(
                Problem(
                    name,
                    index,
                    f"the Chinese has {figure.text!r}, which the English lacks, in: {sentence(zh_text, figure)!r}",
                )
            )
    return problems


# ------------------------------------------------------------------ the tests


def chapters() -> list:
    return [pytest.param(path, id=path.stem) for path in SOURCES] or [pytest.param(None, id="no-chapters")]


@functools.cache
def _loaded(path: pathlib.Path) -> Chapter:
    return Chapter.load(path)  # once per run: the English and the Chinese tests read the same chapter


def _chapter(path: pathlib.Path | None) -> Chapter:
    if path is None:
        pytest.fail("no chapter in notebooks/solutions/")
    return _loaded(path)


def _failure(problems: list[Problem]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(f"- {p}" for p in problems)


def test_the_allow_list_names_only_chapters_that_exist():
    data = allow_list()
    names = {path.stem for path in SOURCES}
    for section in ("allowed", "drift_to_fix"):
        unknown = sorted(set(data.get(section, {})) - names)
        assert not unknown, f"tests/prose_figures.json, {section}: no such chapter {unknown}"


@pytest.mark.parametrize("path", chapters())
def test_every_prose_figure_has_a_source(path):
    chapter = _chapter(path)
    data = allow_list()
    report = check_chapter(chapter, data["allowed"].get(chapter.name, {}), data["drift_to_fix"].get(chapter.name, {}))
    if report.problems:
        pytest.fail(_failure(report.problems), pytrace=False)


@pytest.mark.parametrize("path", chapters())
def test_the_chinese_quotes_the_same_figures(path):
    chapter = _chapter(path)
    translation = json.loads((TRANSLATIONS / f"{chapter.name}.json").read_text(encoding="utf-8"))
    problems = check_translation(chapter.name, chapter.notebook, translation)
    if problems:
        pytest.fail(_failure(problems), pytrace=False)


# ---- the guard, seen failing on planted drifts


def _planted(chapter: Chapter, phrases: Iterable[str]) -> tuple[int, Figure, str]:
    """A figure of two digits or more that an output backs and no allow-list phrase covers, and the same
    figure with its last digit changed so that nothing backs it (1.86 -> 1.87)."""
    for index, text, _ in english_cells(chapter.notebook):
        covered = [m.span() for phrase in phrases for m in phrase_pattern(phrase).finditer(text)]
        for figure in measured(read_numbers(text, operands=False)):
            backing = chapter.backing(figure)
            if (
                figure.kind != "decimal"
                or not figure.text[-1].isdigit()
                or len(figure.text.lstrip("-−0.")) < 2
                or backing is None
                or backing[0] != "output"
                or any(a <= figure.start and figure.end <= b for a, b in covered)
            ):
                continue
            for step in range(1, 10):
                changed = figure.text[:-1] + str((int(figure.text[-1]) + step) % 10)
                if chapter.backing(next(read_numbers(changed))) is None:
                    return index, figure, changed
    raise AssertionError(f"{chapter.name}: no figure backed by an output to plant a drift on")


@pytest.mark.parametrize("name", ["06_encoder", "09_full_model"])
def test_a_planted_english_drift_is_reported_exactly(name):
    path = ROOT / "notebooks" / "solutions" / f"{name}.ipynb"
    chapter = _loaded(path)
    data = allow_list()
    allowed, drifts = data["allowed"].get(name, {}), data["drift_to_fix"].get(name, {})
    before = {str(p) for p in check_chapter(chapter, allowed, drifts).problems}
    index, figure, changed = _planted(chapter, [*allowed, *drifts])
    notebook = json.loads(path.read_text(encoding="utf-8"))
    text = _source(notebook["cells"][index])
    notebook["cells"][index]["source"] = text[: figure.start] + changed + text[figure.end :]
    after = check_chapter(Chapter.load(path, notebook), allowed, drifts).problems
    new = [p for p in after if str(p) not in before]
    assert len(new) == 1, _failure(new)
    assert new[0].cell == index and f"{changed!r} matches no output" in new[0].message, new[0]
    assert "nearest outputs:" in new[0].message and f"cell {index}" in str(new[0])


def _planted_in_chinese(translation: dict) -> tuple[int, Figure, str]:
    """(entry index, a decimal of its Chinese, the decimal with its last digit changed, 1.88 -> 1.83), where
    the changed value agrees with no English figure of the cell."""
    for at, entry in enumerate(translation["cells"]):
        english = compared(prose(entry["en"])[0])
        for figure in compared(prose(entry["zh"])[0]):
            if figure.kind != "decimal" or not figure.text[-1].isdigit():
                continue
            changed = figure.text[:-1] + str((int(figure.text[-1]) + 5) % 10)
            if not any(e.agrees(next(read_numbers(changed)).value) for e in english):
                return at, figure, changed
    raise AssertionError("no decimal in the Chinese to plant a drift on")


def test_a_planted_chinese_drift_is_reported_exactly():
    name = "10_gpt"
    notebook = _loaded(ROOT / "notebooks" / "solutions" / f"{name}.ipynb").notebook
    translation = json.loads((TRANSLATIONS / f"{name}.json").read_text(encoding="utf-8"))
    before = {str(p) for p in check_translation(name, notebook, translation)}
    at, figure, changed = _planted_in_chinese(translation)
    planted = [dict(e) for e in translation["cells"]]
    planted[at]["zh"] = planted[at]["zh"][: figure.start] + changed + planted[at]["zh"][figure.end :]
    after = check_translation(name, notebook, {**translation, "cells": planted})
    new = [str(p) for p in after if str(p) not in before]
    assert len(new) == 2, new  # the English figure it lost and the figure it gained, both in that cell
    assert any(f"lacks {figure.text!r}" in line for line in new) and any(f"has {changed!r}" in line for line in new)
    assert all(line.startswith(f"{name}, cell {planted[at]['cell']}:") for line in new), new


def test_figures_are_read_and_matched_as_documented():
    text = (
        "loss 1.86, 97 %, 12.5%, 3.2× faster, 4x wide, 8 times larger, 4 x d_model, 2 × 2, (n + 1) / 2 times, "
        "104 s, 1.5 minutes, 12 ms, 1e-5, $1.5 \\times 10^{-2}$, ε = 10⁻⁹, 7.4 M, 3,149,824, 37 000, 约 315 万, "
        "８０％, 八分之一, §2.2, torch 2.13.0, 17.06.2025, GPT-2, 2026年"
    )
    read = {f.text: f for f in read_numbers(text, operands=False)}
    assert read["1.86"].agrees(1.8605) and read["1.86"].agrees(1.855) and not read["1.86"].agrees(1.87)
    assert read["97 %"].kind == read["80%"].kind == "percent" and read["12.5%"].value == 12.5
    assert read["3.2×"].kind == read["4x"].kind == read["8 times"].kind == read["八分之一"].kind == "ratio"
    assert "4 x" not in read and "2 ×" not in read and "2 times" not in read
    assert read["1.5 minutes"].value == 90 and read["1.5 minutes"].agrees(93) and read["12 ms"].value == 0.012
    assert read["1e-5"].agrees(1.2e-5) and read["1.5 \\times 10^{-2}"].value == pytest.approx(0.015)
    assert read["10⁻⁹"].decade and read["10⁻⁹"].agrees(2e-9) and not read["10⁻⁹"].agrees(5e-9)
    assert read["7.4 M"].agrees(7_412_000) and read["3,149,824"].kind == "count" and read["37 000"].value == 37000
    assert read["315 万"].agrees(3_149_824, 1) and read["315 万"].kind == "count"
    assert read["2.2"].reference and read["2026"].kind == "count"
    assert not {"2.13", "2.13.0", "17.06", "06.2025"} & set(read)
    assert text.index("GPT-2") + 4 not in {f.start for f in read.values()}
    english, chinese = compared("3,149,824 and 1.86 and 9.1 %"), compared("约 315 万、1.86 和 9.2 %")
    missing, extra = pair_up(english, chinese)
    assert [f.text for f in missing] == ["9.1 %"] and [f.text for f in extra] == ["9.2 %"]
