"""The language of what the course says to a learner: English ("en") or Chinese ("zh").

Chosen once, in the setup cell of a chapter (`tl.set_language("zh")` in the Chinese edition), or
for a whole process by the environment variable `TRANSFORMER_LAB_LANGUAGE`. It decides the words
of the exercises' checks, hints and solutions and of the classroom's student-facing texts; nothing
else. Error messages of the package stay English (Python's convention), and so do strings that code
cells print and the labels of figures and widgets, so that both editions run the same code.

Two catalogues hold the words:

- `transformer_lab/locale/messages.json`: the fixed messages of the exercise machinery and the
  classroom, one entry per key with its text in every language ({"en": ..., "zh": ...}); fields in
  braces (`{exercise}`) are filled in by `message(key, **fields)`.
- `transformer_lab/locale/zh/*.json`: the texts of each chapter's exercises (case names, hints, the
  "why" of a right answer, the explanations of known wrong predictions), keyed by their exact English
  text, as gettext does. `text(english)` looks one up. An English text that changes no longer finds
  its translation; the tests (tests/test_i18n.py) fail on every missing or unused entry.

A teacher's own exercise module has no Chinese catalogue: its texts stay English in both editions.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import string
from collections.abc import Iterator
from functools import cache
from typing import Any

__all__ = ["LANGUAGES", "LANGUAGE_VARIABLE", "set_language", "get_language", "language", "message", "text"]

LANGUAGES = ("en", "zh")
LANGUAGE_VARIABLE = "TRANSFORMER_LAB_LANGUAGE"
LOCALE = pathlib.Path(__file__).with_name("locale")


def _valid(lang: Any, argument: str = "lang") -> str:
    if isinstance(lang, str):
        normal = lang.strip().lower().replace("_", "-")
        if normal in ("zh-cn", "zh-hans", "chinese", "中文"):
            normal = "zh"
        if normal in ("english",):
            normal = "en"
        if normal in LANGUAGES:
            return normal
    raise ValueError(
        f"{argument}: expected one of {LANGUAGES} ('en' English, 'zh' Chinese), got {lang!r}; "
        f'for example tl.set_language("zh")'
    )


def _from_environment() -> str:
    value = os.environ.get(LANGUAGE_VARIABLE, "").strip()
    return _valid(value, LANGUAGE_VARIABLE) if value else "en"


_current: str = _from_environment()


def set_language(lang: str) -> None:
    """Speak `lang` ("en" or "zh") in every check, hint and solution from now on."""
    global _current
    _current = _valid(lang)


def get_language() -> str:
    """The language now in use: "en" or "zh"."""
    return _current


@contextlib.contextmanager
def language(lang: str) -> Iterator[None]:
    """Within the block, speak `lang`; the language before it comes back afterwards."""
    global _current
    before, _current = _current, _valid(lang)
    try:
        yield
    finally:
        _current = before


@cache
def messages() -> dict[str, dict[str, str]]:
    """The fixed messages: {key: {"en": template, "zh": template}}."""
    with open(LOCALE / "messages.json", encoding="utf-8") as handle:
        return json.load(handle)


@cache
def texts(lang: str = "zh") -> dict[str, str]:
    """Every chapter's exercise texts in `lang`: {English text: translation}."""
    found: dict[str, str] = {}
    folder = LOCALE / _valid(lang)
    for path in sorted(folder.glob("*.json")):
        with open(path, encoding="utf-8") as handle:
            found.update({en: zh for en, zh in json.load(handle).items() if zh})
    return found


def fields_of(template: str) -> set[str]:
    """The names of the fields a template fills in ({name} and {name:spec})."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def message(key: str, /, **fields: Any) -> str:
    """The fixed message `key` in the current language, its fields filled in."""
    try:
        entry = messages()[key]
    except KeyError:
        raise KeyError(f"key: no message {key!r} in {LOCALE / 'messages.json'}") from None
    template = entry.get(_current) or entry["en"]
    return template.format(**fields)


def text(english: str) -> str:
    """An exercise's text (a hint, a case name...) in the current language; English where untranslated."""
    if _current == "en" or not english:
        return english
    return texts(_current).get(english, english)
