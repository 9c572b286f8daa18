"""Make the Chinese edition of the course from the English source and the translation files.

    python tools/translate.py            # write notebooks/zh/solutions/NN_*.ipynb and notebooks/zh/NN_*.ipynb
    python tools/translate.py --check    # exit 1, saying what to do, if a translation is missing or stale,
                                         # or a committed Chinese notebook is not a fresh generation
    python tools/translate.py --update   # after an English change: add an entry for every new or changed
                                         # English text, keep the old translation beside it, drop unused ones

What a translator edits, and nothing else:

- `translations/zh/NN_name.json`, one per chapter: one entry per markdown cell of the English source
  notebook, `{"cell": index, "en": the exact English text, "zh": its translation}`. The English is the
  key: when an English cell changes, its entry no longer matches and the check says "stale"; `--update`
  then puts the new English in, moves the old pair to `old_en`/`old_zh` and empties `zh`, so that the
  translator sees what changed. Delete `old_en`/`old_zh` once `zh` says the new thing.
  Two spans of the English are written by tools/chapter_times.py and change whenever a chapter is re-run:
  the title cell's `**Time:**` line and the "NN min" cells of chapter 00's map. In the translation files
  they stand as `{{time}}` and `{{min}}`; this tool writes their Chinese from the English numbers.
  The same file's `code` list translates the words inside code cells: `{"cell": first cell, "en": a docstring's
  text (without its indentation) or a comment's words, "zh": ...}`. Every docstring of a function or class, and
  every comment of an exercise's cells (its specification, check and help cells), must have one; any other
  comment is translated where an entry exists. A comment that is valid Python (commented-out code such as
  `# exercises.x.hint(2)`, a shape such as `# (B, T, D)`) is code and stays, except for its own trailing
  comment. A docstring's translation keeps the English's number of lines, a comment's stays on one line, so
  the code and its line numbers are the English's, byte for byte.
- `translations/zh/common.json`: the words of code that every chapter shares (the install lines at the top of each
  setup cell, tools/install_cell.py; the optional GPU cells' device comments), `{"en": ..., "zh": ...}` in its
  `code` list, used in every chapter where a chapter's own file has no entry for the same words. Each entry must be
  used by some chapter's code.
- `transformer_lab/locale/zh/chNN_name.json`, one per exercise module: the texts of the chapter's
  exercises (case names, hints, the "why" of a right answer, what is said about a known wrong
  prediction), `{English text: Chinese text}` (see transformer_lab/i18n.py).
- `transformer_lab/locale/messages.json`: the fixed messages of checks, hints, solutions and the
  classroom, in both languages.

How a Chinese notebook is made from its English source (`notebooks/solutions/NN_name.ipynb`):

- every markdown cell becomes its translation;
- the docstrings and comments of code cells become their translations (the `code` entries), the code itself
  staying byte for byte the English's (tests/test_translation.py compares `code_skeleton` of both);
- the setup cell's line `tl.set_language("en")  # ...` becomes `tl.set_language("zh")  # ...`;
- the printed output of a cell that calls an exercise's `check()`, `hint()` or `solution()` becomes what
  those calls print in Chinese. It is recomputed from the exercise (a passing or a blank check, hint k, the
  solution), after proving that the English stored output is exactly what they print in English;
- every other code cell and every other output is copied as it is.

The Chinese learner edition (`notebooks/zh/`) is made from the Chinese source edition by the same
operation as the English one (tools/editions.py), its checks' blank reports in Chinese. Nothing is
executed: no kernel is needed, and the Chinese notebooks are not re-run under nbval (the proof above,
tests/test_translation.py, shows what a run would).
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import difflib
import importlib
import io
import json
import pathlib
import re
import sys
import tokenize
import warnings
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import editions  # noqa: E402  (tools/editions.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
LANG = "zh"
TRANSLATIONS = ROOT / "translations" / LANG
CATALOGUE = ROOT / "transformer_lab" / "locale" / LANG
OUT_SOURCE = ROOT / "notebooks" / LANG / "solutions"
OUT_LEARNER = ROOT / "notebooks" / LANG

COMMON = "common.json"  # in TRANSLATIONS: the code words every chapter shares
LANGUAGE_LINE = re.compile(r'^tl\.set_language\("en"\).*$', re.M)
ZH_LANGUAGE_LINE = 'tl.set_language("zh")  # 练习的检查、提示和答案用中文（英文版此处为 "en"）'
CALL = re.compile(r"^(\w+)\.(\w+)\.(check|hint|solution)\((.*)\)\s*$")

TIME_LINE = re.compile(
    r"\*\*Time:\*\* about (?P<total>\d+) minutes: (?P<reading>\d+) min of reading \((?P<words>\d+) words, "
    r"(?P<code>\d+) lines of code\)(?:, (?P<ex_min>\d+) min for the (?P<ex_n>\d+) exercises?)?"
    r"(?:, (?P<seconds>\d+) s of computation on one CPU thread \(measured\))?\."
)
MAP_MINUTES = re.compile(r"(?<=\| )(\d+) min(?= \|)")
TIME_MARK, MIN_MARK = "{{time}}", "{{min}}"


# ------------------------------------------------------------------ the spans chapter_times.py writes


def masked(english: str) -> tuple[str, list[tuple[str, re.Match[str]]]]:
    """The English with its generated spans replaced by {{time}} / {{min}}, and those spans in order."""
    spans: list[tuple[str, re.Match[str]]] = []

    def time(match: re.Match[str]) -> str:
        spans.append((TIME_MARK, match))
        return TIME_MARK

    def minutes(match: re.Match[str]) -> str:
        spans.append((MIN_MARK, match))
        return MIN_MARK

    text = TIME_LINE.sub(time, english)
    if english.startswith("## The map of the course"):
        text = MAP_MINUTES.sub(minutes, text)
    return text, spans


def chinese_span(mark: str, match: re.Match[str]) -> str:
    if mark == MIN_MARK:
        return f"{match.group(1)} 分钟"
    g = match.groupdict()
    parts = [f"阅读 {g['reading']} 分钟（英文原文 {g['words']} 词、{g['code']} 行代码）"]
    if g["ex_n"]:
        parts.append(f"{g['ex_n']} 道练习 {g['ex_min']} 分钟")
    if g["seconds"]:
        parts.append(f"计算 {g['seconds']} 秒（单个 CPU 线程，实测）")
    return f"**时间：** 约 {g['total']} 分钟：{'，'.join(parts)}。"


def unmask(chinese: str, spans: list[tuple[str, re.Match[str]]], where: str) -> str:
    marks = re.findall(r"\{\{time\}\}|\{\{min\}\}", chinese)
    if marks != [mark for mark, _ in spans]:
        raise ValueError(f"{where}: the translation must hold {[m for m, _ in spans]} in this order, holds {marks}")
    pieces = iter(chinese_span(mark, match) for mark, match in spans)
    return re.sub(r"\{\{time\}\}|\{\{min\}\}", lambda _: next(pieces), chinese)


# ------------------------------------------------------------------ formulas


TEXT_IN_FORMULA = re.compile(r"(\\text\{[^{}]*\})")


def formula_pattern(formula: str) -> re.Pattern[str]:
    """What a translation must hold for a formula of the English: the same symbols, character for character,
    except the words inside `\\text{...}`, which may be Chinese (`\\text{otherwise}` -> `\\text{其他}`)."""
    return re.compile(
        "".join(
            r"\\text\{[^{}]*\}" if TEXT_IN_FORMULA.fullmatch(piece) else re.escape(piece)
            for piece in TEXT_IN_FORMULA.split(formula)
        )
    )


# ------------------------------------------------------------------ the words inside code cells

SOLUTION_MARKS = {editions.SOLUTION_BEGIN, editions.SOLUTION_END, editions.HIDDEN_BEGIN, editions.HIDDEN_END}
DIRECTIVE = re.compile(r"(?:noqa|type:|pragma|fmt:)")  # comments addressed to tools, not to a reader


@dataclasses.dataclass(frozen=True)
class Words:
    """A span of a code cell's source that is prose, not code: a docstring's text or a comment's words."""

    start: int  # character offsets into the cell's source
    end: int
    text: str  # the English, as the translation file keys it (a docstring's text without its indentation)
    docstring: bool
    margin: str = ""  # the indentation of a docstring's second and later lines

    def render(self, chinese: str) -> str:
        """The translation as it stands in the source: a docstring's later lines indented as the English's."""
        lines = chinese.split("\n")
        return "\n".join([lines[0]] + [self.margin + line if line.strip() else "" for line in lines[1:]])


def _is_code(comment_body: str) -> bool:
    """True if a comment's body is commented-out Python (`exercises.x.hint(2)`, a shape `(B, T, D)`).

    Its part before any comment of its own must be ASCII: Chinese words are valid identifiers."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(comment_body).readline))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(comment_body, "<comment>", "exec")
    except (SyntaxError, tokenize.TokenError, ValueError):
        return False
    code_end = next((tok.start[1] for tok in tokens if tok.type == tokenize.COMMENT), len(comment_body))
    return comment_body[:code_end].isascii()


def _comment_words(comment: str, offset: int) -> list[Words]:
    """The prose of one comment token that starts at `offset`: all of it, or the comment of commented-out code."""
    if comment.strip() in SOLUTION_MARKS:
        return []
    prefix = re.match(r"#+\s*", comment)
    assert prefix is not None  # a comment token starts with #
    body = comment[prefix.end() :].rstrip()
    start = offset + prefix.end()
    if not body or DIRECTIVE.match(body):
        return []
    if _is_code(body):
        inner = [tok for tok in tokenize.generate_tokens(io.StringIO(body).readline) if tok.type == tokenize.COMMENT]
        return [w for tok in inner for w in _comment_words(tok.string, start + tok.start[1])]
    if not re.search(r"[A-Za-z]{3,}|[^\x00-\x7f]", body):  # numbers and symbols only: nothing to translate
        return []
    return [Words(start, start + len(body), body, docstring=False)]


def _docstring_words(raw: str, offset: int) -> Words | None:
    """The text of a docstring whose content (between the quotes) is `raw` and starts at `offset`."""
    core = raw.strip()
    if not core:
        return None
    start = offset + len(raw) - len(raw.lstrip())
    lines = core.split("\n")
    indents = [line[: len(line) - len(line.lstrip())] for line in lines[1:] if line.strip()]
    margin = min(indents, key=len) if indents else ""
    text = "\n".join([lines[0]] + [line[len(margin) :] if line.strip() else "" for line in lines[1:]])
    return Words(start, start + len(core), text, docstring=True, margin=margin)


def code_words(source: str) -> list[Words]:
    """Every docstring (of a function or class) and every comment's prose in a code cell, in order.

    Code is never among them: a comment that is valid Python stays as it is, except for its own comment."""
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return []  # not plain Python (a notebook magic): nothing to translate
    lines = io.StringIO(source).readlines()  # the lines tokenize numbers
    docstrings = {  # (line, column in characters: ast counts UTF-8 bytes) of each docstring's opening quotes
        (node.lineno, len(lines[node.lineno - 1].encode()[: node.col_offset].decode()))
        for node in (
            owner.body[0]
            for owner in ast.walk(tree)
            if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        )
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))
    found: list[Words] = []
    for tok in tokens:
        offset = line_starts[tok.start[0] - 1] + tok.start[1]
        if tok.type == tokenize.COMMENT:
            found += _comment_words(tok.string, offset)
        elif tok.type == tokenize.STRING and tok.start in docstrings and tok.string[:3] in ('"""', "'''"):
            words = _docstring_words(tok.string[3:-3], offset + 3)
            if words is not None:
                found.append(words)
    return found


def required_words(cell: dict[str, Any]) -> list[Words]:
    """The words of a code cell that must be translated: all of an exercise's cells (its specification, its
    check, its help), and every docstring elsewhere. Other comments are translated where an entry exists."""
    words = code_words(editions.source_text(cell))
    if cell.get("metadata", {}).get("nbgrader"):
        return words
    return [w for w in words if w.docstring]


def translate_code(source: str, chinese: dict[str, str], where: str) -> str:
    """`source` with each docstring and comment that `chinese` translates in Chinese; the code is untouched."""
    out, last = [], 0
    for words in code_words(source):
        translation = chinese.get(words.text, "").strip("\n")
        if not translation:
            continue
        problem = words_problem(words, translation)
        if problem:
            raise ValueError(f"{where}: {problem}")
        out += [source[last : words.start], words.render(translation)]
        last = words.end
    return "".join(out) + source[last:]


def words_problem(words: Words, translation: str) -> str | None:
    """Why `translation` cannot stand for `words` in the code, or None."""
    lines = translation.count("\n") + 1
    if words.docstring and lines != words.text.count("\n") + 1:
        return (
            f"the translation of the docstring {words.text[:50]!r} has {lines} lines, the English "
            f"{words.text.count(chr(10)) + 1}: keep the English's lines, so that line numbers stay the same"
        )
    if not words.docstring and lines != 1:
        return f"the translation of the comment {words.text[:50]!r} must be one line"
    if '"""' in translation or "'''" in translation or translation.endswith("\\"):
        return f"the translation of {words.text[:50]!r} would end its docstring early: no triple quotes"
    return None


def code_skeleton(source: str) -> str:
    """The code of a cell without the text of its docstrings and comments (each becomes "…", on as many lines)."""
    out, last = [], 0
    for words in code_words(source):
        out += [source[last : words.start], "…" + "\n" * words.text.count("\n")]
        last = words.end
    return "".join(out) + source[last:]


# ------------------------------------------------------------------ translation files


def translation_path(chapter: pathlib.Path) -> pathlib.Path:
    return TRANSLATIONS / (chapter.stem + ".json")


def common_code() -> dict[str, str]:
    """{English words: Chinese} of translations/zh/common.json's `code` list (the words every chapter shares)."""
    path = TRANSLATIONS / COMMON
    if not path.exists():
        return {}
    return {entry["en"]: entry.get("zh", "") for entry in json.loads(path.read_text(encoding="utf-8"))["code"]}


def common_problems(root: pathlib.Path = ROOT) -> list[str]:
    """What is empty, malformed or unused among the shared code words of translations/zh/common.json."""
    where = (TRANSLATIONS / COMMON).name
    used: dict[str, Words] = {}
    for chapter in editions.source_notebooks(root):
        notebook = json.loads(chapter.read_text(encoding="utf-8"))
        for _, words, _ in code_cells_words(notebook):
            used.setdefault(words.text, words)
    found = []
    for english, chinese in common_code().items():
        if english not in used:
            found.append(f"{where}: the code entry {english[:50]!r} is in no chapter's code (stale: delete it)")
        elif not chinese.strip():
            found.append(f"{where}: the code entry {english[:50]!r} is not translated yet (its zh is empty)")
        else:
            problem = words_problem(used[english], chinese.strip("\n"))
            if problem:
                found.append(f"{where}: {problem}")
    return found


def load_translation(chapter: pathlib.Path) -> dict[str, Any]:
    path = translation_path(chapter)
    if not path.exists():
        return {"chapter": chapter.name, "cells": [], "code": []}
    data = json.loads(path.read_text(encoding="utf-8"))
    data.setdefault("code", [])
    return data


def markdown_cells(notebook: dict[str, Any]) -> list[tuple[int, str]]:
    """(index, masked English) of every markdown cell."""
    return [
        (i, masked(editions.source_text(cell))[0])
        for i, cell in enumerate(notebook["cells"])
        if cell.get("cell_type") == "markdown"
    ]


def code_cells_words(notebook: dict[str, Any]) -> list[tuple[int, Words, bool]]:
    """(cell index, words, whether they must be translated) of every code cell's docstrings and comments."""
    found = []
    for i, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") == "code":
            required = {(w.start, w.end) for w in required_words(cell)}
            found += [(i, w, (w.start, w.end) in required) for w in code_words(editions.source_text(cell))]
    return found


def code_problems(notebook: dict[str, Any], entries: list[dict[str, Any]], where: object) -> list[str]:
    """What is missing, stale or malformed among a chapter's translations of its code cells' words."""
    by_en = {entry["en"]: entry for entry in entries}
    first: dict[str, tuple[int, Words]] = {}  # each text once, where it first stands
    required: set[str] = set()
    for index, words, must in code_cells_words(notebook):
        first.setdefault(words.text, (index, words))
        if must:
            required.add(words.text)
    found = []
    for text, (index, words) in first.items():
        entry = by_en.get(text)
        what = ("docstring " if words.docstring else "comment ") + repr(words.text[:50])
        if entry is None:
            if text in required:
                found.append(f"{where}: cell {index}: the {what} has no entry (new or changed: run --update)")
        elif not entry.get("zh", "").strip():
            found.append(f"{where}: cell {index}: the {what} is not translated yet (its entry's zh is empty)")
        elif "old_en" in entry or "old_zh" in entry:
            found.append(f"{where}: cell {index}: the {what} changed; update zh, then delete old_en and old_zh")
        else:
            problem = words_problem(words, entry["zh"].strip("\n"))
            if problem:
                found.append(f"{where}: cell {index}: {problem}")
    for entry in entries:
        if entry["en"] not in first:
            found.append(
                f"{where}: the code entry {entry['en'][:50]!r} translates words that are no longer in the "
                "chapter's code (stale: run --update)"
            )
    return found


def problems(chapter: pathlib.Path) -> list[str]:
    """What is missing or stale in a chapter's translation file."""
    notebook = json.loads(chapter.read_text(encoding="utf-8"))
    entries = load_translation(chapter)["cells"]
    by_en = {entry["en"]: entry for entry in entries}
    where = translation_path(chapter).relative_to(ROOT)
    found = []
    wanted = set()
    for index, english in markdown_cells(notebook):
        wanted.add(english)
        entry = by_en.get(english)
        if entry is None:
            found.append(f"{where}: cell {index} has no entry for its English (new or changed: run --update)")
        elif not entry.get("zh", "").strip():
            found.append(f"{where}: cell {index} is not translated yet (its entry's zh is empty)")
        elif "old_en" in entry or "old_zh" in entry:
            found.append(f"{where}: cell {index}: the English changed; update zh, then delete old_en and old_zh")
    for entry in entries:
        if entry["en"] not in wanted:
            found.append(
                f"{where}: the entry for cell {entry.get('cell')} translates English that is no longer in the "
                "chapter (stale: run --update)"
            )
    return found + code_problems(notebook, load_translation(chapter)["code"], where)


def update_translation(chapter: pathlib.Path) -> bool:
    notebook = json.loads(chapter.read_text(encoding="utf-8"))
    old = load_translation(chapter)
    by_en = {entry["en"]: entry for entry in old["cells"]}
    by_cell = {entry.get("cell"): entry for entry in old["cells"]}
    current = markdown_cells(notebook)
    in_chapter = {english for _, english in current}
    cells = []
    for index, english in current:
        entry = by_en.get(english)
        if entry is not None:
            cells.append({**entry, "cell": index})
            continue
        new: dict[str, Any] = {"cell": index, "en": english, "zh": ""}
        previous = by_cell.get(index)
        if previous is not None and previous["en"] not in in_chapter:
            new["old_en"] = previous.get("old_en", previous["en"])
            new["old_zh"] = previous.get("old_zh", previous.get("zh", ""))
        cells.append(new)
    data = {
        "chapter": chapter.name,
        "note": "generated skeleton kept by tools/translate.py --update; translators edit only the zh fields",
        "cells": cells,
        "code": updated_code_entries(notebook, old["code"]),
    }
    return write_if_changed(translation_path(chapter), json.dumps(data, ensure_ascii=False, indent=1) + "\n")


def updated_code_entries(notebook: dict[str, Any], old: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The code entries after an English change: one per text that must be translated or already is, in the
    order of the chapter, each with the first cell it stands in; a changed text gets the closest unused old
    pair of a cell it stands in beside it (old_en, old_zh)."""
    by_en = {entry["en"]: entry for entry in old}
    cells_of: dict[str, list[int]] = {}
    required: set[str] = set()
    for index, words, must in code_cells_words(notebook):
        cells_of.setdefault(words.text, [])
        if index not in cells_of[words.text]:
            cells_of[words.text].append(index)
        if must:
            required.add(words.text)
    unused = [entry for entry in old if entry["en"] not in cells_of]
    entries = []
    for text, cells in cells_of.items():
        entry = by_en.get(text)
        if entry is not None:
            entries.append({**entry, "cell": cells[0]})
            continue
        if text not in required:
            continue
        new: dict[str, Any] = {"cell": cells[0], "en": text, "zh": ""}
        candidates = [e for e in unused if e.get("cell") in cells]
        if candidates:
            previous = max(candidates, key=lambda e: difflib.SequenceMatcher(None, e["en"], text).ratio())
            unused.remove(previous)
            new["old_en"] = previous.get("old_en", previous["en"])
            new["old_zh"] = previous.get("old_zh", previous.get("zh", ""))
        entries.append(new)
    return entries


# ------------------------------------------------------------------ the exercises' texts


def exercise_module_names() -> list[str]:
    folder = ROOT / "transformer_lab" / "exercises"
    return sorted(p.stem for p in folder.glob("ch[0-9][0-9]_*.py"))


def module_texts(module_name: str) -> list[str]:
    from transformer_lab.exercises.core import Exercise

    module = importlib.import_module(f"transformer_lab.exercises.{module_name}")
    found: list[str] = []
    for value in vars(module).values():
        if isinstance(value, Exercise):
            found += value.texts()
    return list(dict.fromkeys(found))


def catalogue_problems(module_name: str) -> list[str]:
    path = CATALOGUE / f"{module_name}.json"
    have = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    where = path.relative_to(ROOT)
    wanted = module_texts(module_name)
    found = [f"{where}: no translation of {text[:60]!r}" for text in wanted if not have.get(text, "").strip()]
    found += [
        f"{where}: translates {text[:60]!r}, which no exercise says any more (stale: run --update)"
        for text in have
        if text not in wanted
    ]
    return found


def update_catalogue(module_name: str) -> bool:
    path = CATALOGUE / f"{module_name}.json"
    have = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data = {text: have.get(text, "") for text in module_texts(module_name)}
    for text in have:
        if text not in data:
            print(f"{path.relative_to(ROOT)}: dropped the unused entry {text[:60]!r}")
    return write_if_changed(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")


# ------------------------------------------------------------------ the Chinese notebooks


def exercise_outputs(source: str, modules: dict[str, Any], english: str, where: str) -> str:
    """What the exercise calls of a cell print in the current language, after proving that `english`
    (the stored English output) is what they print in English."""
    from transformer_lab import i18n

    calls = []
    for line in source.splitlines():
        match = CALL.match(line.strip())
        if match:
            alias, name, method, argument = match.groups()
            if alias not in modules or not hasattr(modules[alias], name):
                raise ValueError(f"{where}: `{line.strip()}` names no exercise of the chapter")
            calls.append((getattr(modules[alias], name), method, argument.strip()))

    def printed(lang: str, choice: list[int]) -> str:
        out = []
        with i18n.language(lang):
            for (exercise, method, argument), pick in zip(calls, choice, strict=True):
                if method == "check":
                    out.append((exercise.passing_report, exercise.blank_report)[pick]())
                elif method == "hint":
                    out.append(exercise.hint_text(int(argument) if argument else 1))
                else:
                    out.append(exercise.solution_source())
        return "".join(text + "\n" for text in out)

    choice = [0] * len(calls)
    for i, (_, method, _) in enumerate(calls):  # a check prints a pass or a blank report: find which
        if method == "check" and not english.startswith(printed("en", choice)[: len(english)]):
            choice[i] = 1
    if printed("en", choice) != english:
        raise ValueError(
            f"{where}: its stored output is not what its exercise calls print in English; "
            "re-execute the chapter (bash run.sh notebooks)"
        )
    return printed(LANG, choice)


def translate_notebook(source: dict[str, Any], chapter: pathlib.Path) -> dict[str, Any]:
    """The Chinese source edition of one English source notebook."""
    from transformer_lab import i18n

    notebook = copy.deepcopy(source)
    translation = load_translation(chapter)
    by_en = {entry["en"]: entry for entry in translation["cells"]}
    code_chinese = common_code()  # the shared words, unless the chapter's own file says otherwise
    code_chinese.update({entry["en"]: entry.get("zh", "") for entry in translation["code"] if "old_en" not in entry})
    modules = editions.exercise_modules(notebook)
    language_lines = 0
    for index, cell in enumerate(notebook["cells"]):
        where = f"{chapter.name}, cell {index}"
        text = editions.source_text(cell)
        if cell.get("cell_type") == "markdown":
            english, spans = masked(text)
            entry = by_en.get(english)
            if entry is None or not entry.get("zh", "").strip():
                raise ValueError(f"{where}: no translation (python tools/translate.py --check says what to do)")
            cell["source"] = editions.as_lines(unmask(entry["zh"], spans, where))
            continue
        if cell.get("cell_type") != "code":
            continue
        chinese_source = translate_code(text, code_chinese, where)
        if LANGUAGE_LINE.search(text):
            language_lines += 1
            chinese_source = LANGUAGE_LINE.sub(lambda _: ZH_LANGUAGE_LINE, chinese_source)
        if chinese_source != text:
            cell["source"] = editions.as_lines(chinese_source)
        if any(CALL.match(line.strip()) for line in text.splitlines()):
            streams = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
            if any(o.get("name") != "stdout" for o in streams):
                raise ValueError(f"{where}: an exercise cell wrote to stderr; re-execute the chapter")
            english = "".join(editions.source_text({"source": o["text"]}) for o in streams)
            with i18n.language("en"):
                chinese = exercise_outputs(text, modules, english, where)
            others = [o for o in cell["outputs"] if o.get("output_type") != "stream"]
            cell["outputs"] = (
                [{"name": "stdout", "output_type": "stream", "text": editions.as_lines(chinese)}] if chinese else []
            ) + others
    if language_lines != 1:
        raise ValueError(f'{chapter.name}: expected one setup line `tl.set_language("en")`, found {language_lines}')
    meta = notebook.setdefault("metadata", {}).setdefault("transformer_lab", {})
    meta.update(
        {
            "edition": "source",
            "language": LANG,
            "generated_from": f"notebooks/solutions/{chapter.name}",
            "note": "generated by tools/translate.py: edit the English source and translations/zh/, not this file",
        }
    )
    return notebook


def generate(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
    """{Chinese notebook path: its text} for both editions of every chapter."""
    from transformer_lab import i18n

    out = {}
    for chapter in editions.source_notebooks(root):
        source = json.loads(chapter.read_text(encoding="utf-8"))
        zh_source = translate_notebook(source, chapter)
        out[root / "notebooks" / LANG / "solutions" / chapter.name] = editions.dumps(zh_source)
        with i18n.language(LANG):
            learner = editions.learner_notebook(zh_source, chapter.name)
        learner["metadata"]["transformer_lab"].update(
            {
                "language": LANG,
                "generated_from": f"notebooks/{LANG}/solutions/{chapter.name}",
                "note": "generated by tools/translate.py: edit the English source and translations/zh/, not this file",
            }
        )
        out[root / "notebooks" / LANG / chapter.name] = editions.dumps(learner)
    return out


def translation_problems() -> list[str]:
    """What is missing or stale in every translation file and exercise catalogue."""
    found = [p for chapter in editions.source_notebooks(ROOT) for p in problems(chapter)] + common_problems()
    return found + [p for name in exercise_module_names() for p in catalogue_problems(name)]


def all_problems() -> list[str]:
    """translation_problems(), or else the Chinese notebooks that are not a fresh generation."""
    found = translation_problems()
    if found:
        return found
    fresh = generate()
    for path, text in fresh.items():
        if not path.exists():
            found.append(f"{path.relative_to(ROOT)}: missing (run python tools/translate.py)")
        elif path.read_text(encoding="utf-8") != text:
            found.append(f"{path.relative_to(ROOT)}: differs from a fresh generation (run python tools/translate.py)")
    for folder in (OUT_SOURCE, OUT_LEARNER):
        for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
            if path not in fresh:
                found.append(f"{path.relative_to(ROOT)}: has no English source")
    return found


def write_if_changed(path: pathlib.Path, text: str) -> bool:
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: written")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="only check; exit 1 and say what to do if anything is off")
    group.add_argument("--update", action="store_true", help="bring the translation files' English up to date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.update:
        for chapter in editions.source_notebooks(ROOT):
            update_translation(chapter)
        for name in exercise_module_names():
            update_catalogue(name)
        remaining = translation_problems()
        print(f"{len(remaining)} entries to translate" if remaining else "every text has its translation")
        return 0
    if args.check:
        found = all_problems()
        for problem in found:
            print(problem)
        if found:
            print("then: python tools/translate.py", file=sys.stderr)
            return 1
        print("the Chinese edition is up to date")
        return 0
    found = translation_problems()
    if found:
        for problem in found:
            print(problem)
        print(f"{len(found)} problems: translate first (python tools/translate.py --update lists them)")
        return 1
    fresh = generate()
    for path, text in fresh.items():
        write_if_changed(path, text)
    print(f"Chinese edition: {len(fresh) // 2} chapters in notebooks/zh/ and notebooks/zh/solutions/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
