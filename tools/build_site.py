"""Build the course's website: every chapter in English and in Chinese, from the committed notebooks, none executed.

    python tools/build_site.py                  # both languages into _site/ (what `bash run.sh site` runs)
    python tools/build_site.py --language zh    # one language only
    python tools/build_site.py --out DIR        # somewhere else

The site is made by Sphinx with myst-nb (execution off: the notebooks' stored outputs are the figures), with the
theme Furo; docs/site.md says why these and how to publish the result. This script prepares a staging tree per
language under build/site/ and runs sphinx-build on it with the project in site/ (conf.py, templates, static):

- the chapters are discovered, not listed: every `NN_name.ipynb` of the source edition (`notebooks/solutions/`,
  and `notebooks/zh/solutions/` for Chinese) becomes a page, so a new chapter appears with no change here;
- each page shows the source edition (prose, code, stored outputs) without nbgrader's markers: an exercise's
  answer cell shows the learner edition's blank function, and the answer itself is folded behind "Show the
  solution"; the check's report on that answer and the exercise's hints (from the exercise, in the page's
  language) are folded likewise;
- a widget output holds no picture of its own (only a reference to its state): it becomes a still of its first
  state, the image saved in the notebook's widget state, with a line saying how to run it live;
- a landing page per language: the chapters with their times, and the syllabus of docs/syllabus.md (in Chinese
  through translations/zh/site.json, which also holds the site's own words and the theme's that Sphinx's
  catalogue lacks);
- the learner edition's notebook of each chapter is copied into the site ("Download the notebook"); "Launch on
  Binder" opens it on mybinder.org, at the README's OWNER/REPO; "Open in Colab" and "Open in Kaggle" open it there,
  from the same OWNER/REPO at the release's tag (tools/install_cell.py makes those links);
- MathJax comes from a pinned PyPI package (sphinx-mathjax-offline) and is served by the site itself, once for
  both languages; Chinese search splits words with jieba, with the glossary's Chinese terms as its dictionary.

Sphinx runs with -W --keep-going: a warning fails the build. Nothing is fetched from the network.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import editions  # noqa: E402  (tools/editions.py)
import install_cell  # noqa: E402  (tools/install_cell.py: the Colab and Kaggle links)

if TYPE_CHECKING:
    from transformer_lab.exercises.core import Exercise

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPHINX_PROJECT = ROOT / "site"  # conf.py, templates/, static/
STAGING = ROOT / "build" / "site"
OUT = ROOT / "_site"
TRANSLATION = ROOT / "translations" / "zh" / "site.json"
SYLLABUS = ROOT / "docs" / "syllabus.md"
GLOSSARY = ROOT / "docs" / "glossary.md"
README = ROOT / "README.md"
STAMP = ".build-inputs"  # in the output folder: the digest of everything the build read (see `is_fresh`)

# MathJax's files that a page can load: the one component, its TeX extensions (autoloaded), its fonts, the menu
# and the accessibility tools it offers (with the speech rule engine they load).
MATHJAX_PACKAGE = "sphinx-mathjax-offline"
MATHJAX_FILES = ("tex-chtml.js", "input/tex", "output/chtml", "a11y", "adaptors", "ui", "sre")
MATHJAX_FOLDER = "mathjax"  # _site/mathjax/, shared by both languages

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CONTROL_MODELS = ("Slider", "Dropdown", "Checkbox", "Text", "ToggleButton", "RadioButtons", "Select")
TEXT_MODELS = ("HTMLModel", "LabelModel", "HTMLMathModel")
HELP_CALL = re.compile(r"^#\s*(\w+)\.(\w+)\.hint\(")
TIME = re.compile(r"\*\*Time:\*\* about (\d+) minutes")
TEACHER_COLUMNS = ("hand out",)  # syllabus columns for teachers only (classroom commands): not on the site
TITLE = "transformer_lab: the Transformer, one idea at a time"
WIDGET_NOTE = "Interactive widget: run this chapter in JupyterLab or on Binder to use it."


@dataclasses.dataclass(frozen=True)
class Edition:
    """One language of the site: where its notebooks are and what Sphinx calls the language."""

    language: str  # "en" or "zh", as transformer_lab.i18n names it
    sphinx_language: str  # Sphinx's name: "zh_CN" gives Chinese navigation, search and previous/next
    source: pathlib.Path  # the source edition: the pages
    learner: pathlib.Path  # the learner edition: what "Download" and "Launch on Binder" give
    name: str  # the language in its own words, on the other language's switch


EDITIONS = {
    "en": Edition("en", "en", ROOT / "notebooks" / "solutions", ROOT / "notebooks", "English"),
    "zh": Edition("zh", "zh_CN", ROOT / "notebooks" / "zh" / "solutions", ROOT / "notebooks" / "zh", "中文"),
}


# ------------------------------------------------------------------ the site's words in both languages


class Words:
    """translations/zh/site.json: the site's own words, the theme's, and the syllabus's, English -> Chinese.

    Each group is a list of {"en": ..., "zh": ...} entries keyed by the exact English, as the chapters'
    translation files are; `text(english, language)` looks one up and fails, naming the file, if it is missing.
    """

    GROUPS = ("interface", "theme", "syllabus")

    def __init__(self, path: pathlib.Path = TRANSLATION) -> None:
        self.path = path
        data = json.loads(path.read_text(encoding="utf-8"))
        self.groups: dict[str, dict[str, str]] = {
            group: {entry["en"]: entry.get("zh", "") for entry in data.get(group, [])} for group in self.GROUPS
        }
        # A message with a plural form (Sphinx's ngettext): the English singular keys it; Chinese has one form.
        self.plurals = {entry["en"]: entry["plural"] for entry in data.get("theme", []) if "plural" in entry}

    def text(self, english: str, language: str, group: str = "interface") -> str:
        if language == "en":
            return english
        chinese = self.groups[group].get(english, "").strip()
        if not chinese:
            raise KeyError(
                f"{self.path.relative_to(ROOT)}: no Chinese for {english!r} in its {group!r} list; "
                'add {"en": ..., "zh": ...} there (tests/test_site.py lists every missing entry)'
            )
        return chinese


# ------------------------------------------------------------------ what a page shows


def fence(text: str, info: str) -> str:
    """A fenced code block holding `text` as it is: the fence is longer than any run of backticks inside."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}"


def raw_html(markup: str) -> str:
    """A MyST block that passes `markup` to the HTML page as it is."""
    return fence(markup, "{raw} html")


def markdown_cell(text: str, cell_id: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": editions.as_lines(text)}


def folded(summary: str, css_class: str, body: str, cell_id: str) -> dict[str, Any]:
    """A markdown cell: `body` (MyST) folded in a <details> element whose control reads `summary`. No script: the
    browser folds and unfolds it."""
    opening = f'<details class="{css_class}">\n<summary>{html.escape(summary)}</summary>'
    return markdown_cell(f"{raw_html(opening)}\n\n{body}\n\n{raw_html('</details>')}", cell_id)


def hint_html(text: str) -> str:
    """A hint's text as HTML paragraphs, `code spans` kept as code."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out = []
    for paragraph in paragraphs:
        escaped = html.escape(" ".join(line.strip() for line in paragraph.splitlines()))
        out.append("<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped) + "</p>")
    return "\n".join(out)


def hints_cell(exercise: Exercise, language: str, words: Words, cell_id: str) -> dict[str, Any]:
    """The exercise's hints, each folded on its own inside one fold, in the page's language: what hint(k) says."""
    from transformer_lab import i18n

    steps = []
    with i18n.language(language):
        n = len(exercise.hints)
        for step, hint in enumerate(exercise.hints, start=1):
            header = i18n.message("hint.header", step=step, n=n, exercise=exercise.name).rstrip(":：")
            steps.append(
                f'<details class="tl-hint">\n<summary>{html.escape(header)}</summary>\n'
                f"{hint_html(i18n.text(hint))}\n</details>"
            )
    summary = html.escape(words.text("Hints", language))
    markup = f'<details class="tl-hints">\n<summary>{summary}</summary>\n' + "\n".join(steps) + "\n</details>"
    return markdown_cell(raw_html(markup), cell_id)


def stream_text(outputs: list[dict[str, Any]]) -> str:
    return "".join(editions.source_text({"source": o.get("text", "")}) for o in outputs if o["output_type"] == "stream")


def widget_tree(model_id: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The widget models under `model_id`, depth first (a box's children after the box)."""
    model = state.get(model_id)
    if model is None:
        return []
    found = [model]
    for child in model.get("state", {}).get("children", []):
        found += widget_tree(str(child).removeprefix("IPY_MODEL_"), state)
    return found


def widget_image(models: list[dict[str, Any]]) -> str | None:
    """The base64 PNG of the first image in the tree, as the notebook saved it: the widget's first state, since
    nothing moves a control while a notebook is executed."""
    for model in models:
        if model.get("model_name") == "ImageModel" and model.get("state", {}).get("format", "png") == "png":
            for buffer in model.get("buffers", []):
                if buffer.get("path") == ["value"] and buffer.get("encoding") == "base64":
                    return buffer["data"]
    return None


def widget_text(model: dict[str, Any]) -> str:
    """The text an HTML or label widget shows, without its markup."""
    return re.sub(r"<[^>]+>", "", html.unescape(str(model["state"].get("value", "")))).strip()


def control_value(model: dict[str, Any]) -> str:
    state = model.get("state", {})
    if model["model_name"] == "DropdownModel" and "index" in state:
        labels = state.get("_options_labels") or []
        index = state["index"]
        return labels[index] if isinstance(index, int) and index < len(labels) else ""
    value = state.get("value", "")
    if isinstance(value, bool):
        return "✓" if value else "✗"
    return f"{value:g}" if isinstance(value, float) else str(value)


def widget_still(view: dict[str, Any], state: dict[str, Any], language: str, words: Words) -> list[dict[str, Any]]:
    """What stands for a widget output: its first state's image (or a progress bar's text and bar, or the text it
    shows), then, for a widget with controls, a line saying where it runs and what its controls start at."""
    models = widget_tree(view.get("model_id", ""), state)
    if not models:
        raise ValueError(f"the widget {view.get('model_id')!r} has no saved state: re-execute the chapter")

    def display(mime: str, data: str) -> dict[str, Any]:
        return {"output_type": "display_data", "data": {mime: data}, "metadata": {}}

    texts = [widget_text(m) for m in models if m["model_name"] in TEXT_MODELS]
    bars = [m["state"] for m in models if m["model_name"] in ("FloatProgressModel", "IntProgressModel")]
    controls = [m for m in models if any(m["model_name"].endswith(kind + "Model") for kind in CONTROL_MODELS)]
    outputs = []
    if bars:  # tqdm's progress bar: its label, the bar, its counts
        outputs.append(
            display(
                "text/html",
                f'<div class="tl-progress"><span>{html.escape(texts[0] if texts else "")}</span> '
                f'<progress value="{bars[0].get("value", 0)}" max="{bars[0].get("max", 1) or 1}"></progress> '
                f"<span>{html.escape(' '.join(texts[1:]))}</span></div>",
            )
        )
    else:  # its image and the text it writes beside it (chapter 04's shift of the batch mean), in its order
        shown = [m for m in models if m["model_name"] in ("ImageModel", *TEXT_MODELS)]
        for model in shown:
            if model["model_name"] == "ImageModel":
                png = widget_image([model])
                if png:
                    outputs.append(display("image/png", png))
            elif text := widget_text(model):
                outputs.append(display("text/html", f'<p class="tl-widget-text">{html.escape(text)}</p>'))
    if controls or not outputs:
        start = ", ".join(
            f"{c['state'].get('description') or c['model_name'].removesuffix('Model')} = {control_value(c)}"
            for c in controls
        )
        note = html.escape(words.text(WIDGET_NOTE, language))
        if start:
            label = html.escape(words.text("Its controls start at:", language))
            note += f' <span class="tl-widget-start">{label} {html.escape(start)}</span>'
        outputs.append(display("text/html", f'<p class="tl-widget-note">{note}</p>'))
    return outputs


def site_notebook(source: dict[str, Any], name: str, language: str, words: Words) -> dict[str, Any]:
    """The notebook a chapter's page is made from (a new dict; `source`, the source edition, is not changed)."""
    modules = editions.exercise_modules(source)
    state = source.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    cells: list[dict[str, Any]] = []
    for index, original in enumerate(source["cells"]):
        cell = json.loads(json.dumps(original))  # a copy
        where = f"{name}, cell {index}"
        cell_id = f"tl-{index}"  # the id of a cell this adds after cell `index` starts with it
        text = editions.source_text(cell)
        meta = cell.setdefault("metadata", {}).pop("nbgrader", {})
        cell["metadata"].pop("tags", None)  # nbval's and the course's tags mean nothing on a page
        if meta.get("solution"):  # the answer: the blank function shows, the answer is folded
            answer = "\n".join(
                line
                for line in text.splitlines()
                if line.strip() not in (editions.SOLUTION_BEGIN, editions.SOLUTION_END)
            )
            summary = words.text("Show the solution", language)
            if cell["cell_type"] == "code":
                cell["source"] = editions.as_lines(editions.clear_solution(text))
                cell["outputs"] = []
                cells += [cell, folded(summary, "tl-solution", fence(answer, "python"), f"{cell_id}-solution")]
            else:
                cells.append(folded(summary, "tl-solution", answer, f"{cell_id}-solution"))
            continue
        if meta.get("grade") and cell["cell_type"] == "code":  # the check: its report on the answer is folded
            cell["source"] = editions.as_lines(editions.clear_hidden_tests(text))
            report = stream_text(cell.get("outputs", []))
            cell["outputs"] = [o for o in cell.get("outputs", []) if o["output_type"] != "stream"]
            cells.append(cell)
            if report.strip():
                summary = words.text("What the check says of the solution", language)
                cells.append(folded(summary, "tl-check", fence(report, "text"), f"{cell_id}-report"))
            continue
        if cell["cell_type"] == "code":
            outputs = []
            for output in cell.get("outputs", []):
                view = output.get("data", {}).get(WIDGET_VIEW)
                if view is None:
                    outputs.append(output)
                else:
                    try:
                        outputs += widget_still(view, state, language, words)
                    except ValueError as error:
                        raise ValueError(f"{where}: {error}") from None
            cell["outputs"] = outputs
        cells.append(cell)
        helps = {match.groups() for line in text.splitlines() if (match := HELP_CALL.match(line.strip()))}
        for alias, exercise_name in sorted(helps):  # a help cell: the hints it would print, folded
            exercise = getattr(modules.get(alias), exercise_name, None)
            if exercise is None:
                raise ValueError(f"{where}: `{alias}.{exercise_name}.hint()` names no exercise of the chapter")
            cells.append(hints_cell(exercise, language, words, f"{cell_id}-hints-{exercise_name}"[:64]))
    notebook = {**source, "cells": cells}
    notebook["metadata"] = {k: v for k, v in source.get("metadata", {}).items() if k != "widgets"}
    return notebook


# ------------------------------------------------------------------ the landing page


def chapter_title(notebook: dict[str, Any]) -> str:
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            match = re.search(r"^# (.+)$", editions.source_text(cell), re.M)
            if match:
                return match.group(1).strip()
    raise ValueError("a chapter needs a '# title' in a markdown cell")


def chapter_minutes(notebook: dict[str, Any]) -> int | None:
    """The chapter's time from its title cell (tools/chapter_times.py writes it), in the English source."""
    for cell in notebook["cells"][:3]:
        match = TIME.search(editions.source_text(cell))
        if match:
            return int(match.group(1))
    return None


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows[1:]])


def needs_translation(text: str) -> bool:
    """Whether a text of the syllabus has words to translate (a week number or a chapter number has none)."""
    return bool(re.search(r"[A-Za-z]", re.sub(r"`[^`]*`", "", text)))


def syllabus_parts(path: pathlib.Path = SYLLABUS) -> tuple[str, list[str], list[list[str]]]:
    """docs/syllabus.md's title, the paragraphs before its first table, and that table (header first), without
    the teachers' columns."""
    lines = path.read_text(encoding="utf-8").splitlines()
    title = next(line[2:].strip() for line in lines if line.startswith("# "))
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    prose = "\n".join(line for line in lines[:start] if not line.startswith("#"))
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", prose) if p.strip()]
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not all(re.fullmatch(r":?-+:?", c) for c in cells):
            table.append(cells)
    keep = [i for i, header in enumerate(table[0]) if header not in TEACHER_COLUMNS]
    return title, paragraphs, [[row[i] for i in keep] for row in table]


def syllabus_texts() -> list[str]:
    """Every English text of the syllabus the landing page shows: what site.json's "syllabus" list translates."""
    title, paragraphs, table = syllabus_parts()
    found = [title, *paragraphs, *(cell for row in table for cell in row if needs_translation(cell))]
    return list(dict.fromkeys(found))


@dataclasses.dataclass
class Chapter:
    name: str  # "01_attention"
    title: str  # in the page's language
    minutes: int | None


def landing_page(edition: Edition, chapters: list[Chapter], words: Words) -> str:
    """index.md: what the course is, its chapters with their times, and the syllabus with each week's time."""
    lang = edition.language

    def say(english: str, **fields: Any) -> str:
        return words.text(english, lang).format(**fields)

    def syllabus(text: str) -> str:
        return words.text(text, lang, "syllabus") if needs_translation(text) else text

    def minutes(n: int | None) -> str:
        return say("about {minutes} min", minutes=n) if n else "-"

    chapter_rows = [[say("chapter"), say("time")]]
    chapter_rows += [[f"[{c.title}]({c.name}.ipynb)", minutes(c.minutes)] for c in chapters]

    title, paragraphs, table = syllabus_parts()
    by_number = {chapter.name[:2]: chapter for chapter in chapters}

    def link(match: re.Match[str]) -> str:  # a chapter's number in the syllabus, linked to its page
        number = match.group(0)
        return f"[{number}]({by_number[number].name}.ipynb)" if number in by_number else number

    column = table[0].index("chapter") if "chapter" in table[0] else None
    week_rows = [[syllabus(cell) for cell in table[0]] + [say("the chapters' time")]]
    for row in table[1:]:
        shown = [syllabus(cell) for cell in row]
        numbers = re.findall(r"\b\d\d\b", row[column]) if column is not None else []
        if column is not None:
            shown[column] = re.sub(r"\b\d\d\b", link, shown[column])
        week_rows.append(shown + [minutes(sum(by_number[n].minutes or 0 for n in numbers if n in by_number) or None)])

    introduction = say(
        "Build the Transformer of *Attention Is All You Need* (Vaswani et al., 2017) one idea at a time, "
        "in Python and Jupyter. Every chapter is here with its text, its code and the outputs it printed "
        "and drew; the answers to its exercises and their hints are folded under each exercise."
    )
    how_to_run = say(
        "To run the code, move the widgets and do the exercises yourself, open the course in JupyterLab: "
        "[on Binder]({binder}), with nothing to install, or on your own machine with `bash run.sh lab` "
        "([the repository]({repository})).",
        binder=binder_url(edition, chapters[0].name),
        repository=repository_url(),
    )
    toctree = "\n".join(chapter.name for chapter in chapters)  # the navigation: every chapter, in order
    parts = [
        f"# {say(TITLE)}",
        introduction,
        how_to_run,
        f"## {say('The chapters')}",
        markdown_table(chapter_rows),
        f"## {syllabus(title)}",
        *(syllabus(p) for p in paragraphs),
        markdown_table(week_rows),
        fence(f":hidden:\n:maxdepth: 1\n\n{toctree}", "{toctree}"),
    ]
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ links out of the site


def binder_base() -> str:
    """The Binder address of the README's badge without its `?urlpath=`: the one place OWNER/REPO is set."""
    match = re.search(r"^\[binder\]:\s*(\S+)$", README.read_text(encoding="utf-8"), re.M)
    if not match or "?urlpath=" not in match.group(1):
        raise ValueError(
            f"{README.name}: expected a line `[binder]: https://mybinder.org/v2/gh/OWNER/REPO/HEAD?urlpath=...`"
        )
    return match.group(1).split("?urlpath=")[0]


def binder_url(edition: Edition, name: str) -> str:
    folder = edition.learner.relative_to(ROOT).as_posix()
    return f"{binder_base()}?urlpath=lab/tree/{folder}/{name}.ipynb"


def repository_url() -> str:
    match = re.search(r"/v2/gh/([^/]+/[^/]+)/", binder_base())
    if not match:
        raise ValueError(f"{README.name}: the Binder link does not name a GitHub repository (gh/OWNER/REPO)")
    return f"https://github.com/{match.group(1)}"


# ------------------------------------------------------------------ Chinese search and the theme's words


def glossary_terms(path: pathlib.Path = GLOSSARY) -> list[str]:
    """The Chinese terms of docs/glossary.md's table (its second column), for jieba's dictionary."""
    terms = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0] not in ("English", "---") and "---" not in cells[1]:
            terms += [t.strip() for t in re.split(r"[,，、/]", cells[1])]
    return [t for t in dict.fromkeys(terms) if t and " " not in t]


def po_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # the escapes a .po string needs (\\, \", \n) are JSON's


def theme_catalogue(words: Words) -> str:
    """A gettext catalogue (sphinx.po) with the theme's words that Sphinx's own Chinese catalogue lacks; Sphinx
    compiles it and falls back to its own catalogue for every other word."""
    entries = []
    for en, zh in words.groups["theme"].items():
        if en in words.plurals:
            plural = po_string(words.plurals[en])
            entries.append(f"msgid {po_string(en)}\nmsgid_plural {plural}\nmsgstr[0] {po_string(zh)}\n")
        else:
            entries.append(f"msgid {po_string(en)}\nmsgstr {po_string(zh)}\n")
    header = (
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n"Language: zh_CN\\n"\n'
        '"Plural-Forms: nplurals=1; plural=0;\\n"\n'
    )
    return "\n".join([header, *entries])


def theme_scripts_catalogue(words: Words) -> str:
    """Sphinx's Chinese catalogue for the search page's scripts (sphinx.js) with the theme's words added: Sphinx
    8.2's catalogue lacks the search's "found N pages" message. Sphinx takes this file instead of its own."""
    import sphinx

    own = pathlib.Path(sphinx.__file__).parent / "locale" / "zh_CN" / "LC_MESSAGES" / "sphinx.js"
    text = own.read_text(encoding="utf-8")
    catalogue = json.loads(text[text.index("(") + 1 : text.rindex(")")])
    for en, zh in words.groups["theme"].items():
        catalogue["messages"][en] = [zh] if en in words.plurals else zh  # ngettext reads a list of forms
    return f"Documentation.addTranslations({json.dumps(catalogue, ensure_ascii=False, indent=1)});\n"


# ------------------------------------------------------------------ staging and building


def write_if_changed(path: pathlib.Path, data: str | bytes) -> None:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == raw:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


def chapters_of(edition: Edition) -> list[pathlib.Path]:
    found = sorted(edition.source.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no chapter notebook (NN_name.ipynb) in {edition.source.relative_to(ROOT)}")
    return found


def stage(edition: Edition, words: Words, staging: pathlib.Path) -> dict[str, Any]:
    """Write the staging tree of one language; return the context conf.py reads."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the exercise modules, for the hints
    english = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in chapters_of(EDITIONS["en"])}
    chapters, pages = [], {}
    wanted = {"index.md"}
    for path in chapters_of(edition):
        source = json.loads(path.read_text(encoding="utf-8"))
        notebook = site_notebook(source, path.name, edition.language, words)
        write_if_changed(staging / path.name, editions.dumps(notebook))
        learner = edition.learner / path.name
        if not learner.exists():
            raise FileNotFoundError(f"{learner.relative_to(ROOT)}: the learner edition of {path.name} is missing")
        write_if_changed(staging / "_extra" / "notebooks" / path.name, learner.read_bytes())
        wanted |= {path.name, f"_extra/notebooks/{path.name}"}
        minutes = chapter_minutes(english[path.stem]) if path.stem in english else None
        chapters.append(Chapter(path.stem, chapter_title(source), minutes))
        learner_path = learner.relative_to(ROOT).as_posix()
        pages[path.stem] = {
            "binder": binder_url(edition, path.stem),
            "colab": install_cell.colab_url(learner_path),
            "kaggle": install_cell.kaggle_url(learner_path),
            "download": f"notebooks/{path.name}",
        }
    write_if_changed(staging / "index.md", landing_page(edition, chapters, words))
    search_options: dict[str, str] = {}
    if edition.language == "zh":
        dictionary = staging / "_search" / "glossary.dict"
        write_if_changed(dictionary, "".join(term + "\n" for term in glossary_terms()))
        messages = staging / "locale" / "zh_CN" / "LC_MESSAGES"
        write_if_changed(messages / "sphinx.po", theme_catalogue(words))
        write_if_changed(messages / "sphinx.js", theme_scripts_catalogue(words))
        wanted |= {"_search/glossary.dict", *(f"locale/zh_CN/LC_MESSAGES/sphinx.{e}" for e in ("po", "mo", "js"))}
        search_options = {"dict": str(dictionary)}
    for path in sorted(staging.rglob("*")):  # a chapter that is gone must not stay on the site
        if path.is_file() and path.relative_to(staging).as_posix() not in wanted:
            path.unlink()
    other = EDITIONS["zh" if edition.language == "en" else "en"]
    texts = {english: words.text(english, edition.language) for english in words.groups["interface"]}
    return {
        "language": edition.language,
        "sphinx_language": edition.sphinx_language,
        "title": texts[TITLE],
        "texts": texts,
        "pages": pages,
        "repository": repository_url(),
        "twin_language": other.language,
        "twin_name": other.name,
        "twin_hreflang": other.sphinx_language.replace("_", "-"),
        "mathjax_path": f"../../{MATHJAX_FOLDER}/tex-chtml.js",  # relative to the language's _static/
        "search_options": search_options,
        "extra_path": str(staging / "_extra"),
        "locale_dir": str(staging / "locale"),
    }


def copy_mathjax(out: pathlib.Path) -> None:
    """MathJax's files from the pinned PyPI package into out/mathjax/ (both languages load it from there)."""
    try:
        distribution = importlib.metadata.distribution(MATHJAX_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{MATHJAX_PACKAGE} is not installed: pip install -r requirements-site.txt") from None
    source = pathlib.Path(str(distribution.locate_file(f"{MATHJAX_PACKAGE}/static/mathjax")))
    target = out / MATHJAX_FOLDER
    for name in MATHJAX_FILES:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, dirs_exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)


def chooser_page(words: Words) -> str:
    """_site/index.html: the two languages, for whoever opens the site's root."""
    links = "\n".join(
        f'<li><a href="{e.language}/index.html" hreflang="{e.sphinx_language.replace("_", "-")}" '
        f'lang="{e.sphinx_language.replace("_", "-")}">{e.name}</a></li>'
        for e in EDITIONS.values()
    )
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>transformer_lab</title>\n"
        '<link rel="icon" href="en/_static/favicon.svg">\n'
        "<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;"
        "line-height:1.5}li{font-size:1.3rem;margin:.5rem 0}</style>\n</head>\n<body>\n"
        f"<h1>transformer_lab</h1>\n<p>{html.escape(TITLE)}<br>{html.escape(words.text(TITLE, 'zh'))}</p>\n"
        f"<ul>\n{links}\n</ul>\n</body>\n</html>\n"
    )


def inputs_digest() -> str:
    """A digest of every file the build reads, so that a test can tell whether a built site is up to date."""
    paths = [
        *sorted(SPHINX_PROJECT.rglob("*")),
        *sorted((ROOT / "notebooks").rglob("*.ipynb")),
        *sorted((ROOT / "transformer_lab" / "exercises").glob("*.py")),
        *sorted((ROOT / "transformer_lab" / "locale").rglob("*.json")),
        pathlib.Path(__file__),
        ROOT / "tools" / "editions.py",
        TRANSLATION,
        SYLLABUS,
        GLOSSARY,
        README,
        ROOT / "requirements-site.txt",
    ]
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def is_fresh(out: pathlib.Path = OUT, languages: tuple[str, ...] = tuple(EDITIONS)) -> bool:
    """Whether `out` holds a build of these languages from the files as they are now."""
    stamp = out / STAMP
    if not stamp.exists():
        return False
    recorded = json.loads(stamp.read_text(encoding="utf-8"))
    return recorded.get("digest") == inputs_digest() and set(languages) <= set(recorded.get("languages", []))


def build(
    out: pathlib.Path = OUT, languages: tuple[str, ...] = tuple(EDITIONS), quiet: bool = True
) -> dict[str, float]:
    """Build the site into `out` (one folder per language, MathJax beside them); return each language's seconds.

    The languages build in parallel, each in its own sphinx-build process; a warning fails the build."""
    unknown = set(languages) - set(EDITIONS)
    if unknown:
        raise ValueError(f"languages: expected some of {tuple(EDITIONS)}, got {sorted(unknown)}")
    digest = inputs_digest()
    words = Words()
    (out / STAMP).unlink(missing_ok=True)
    started: dict[str, tuple[subprocess.Popen[bytes], float, pathlib.Path, pathlib.Path]] = {}
    for language in languages:
        staging = STAGING / language
        context = stage(EDITIONS[language], words, staging)
        context_file = STAGING / f"context-{language}.json"
        write_if_changed(context_file, json.dumps(context, ensure_ascii=False, indent=1))
        # Sphinx writes into build/site/out/<language>/html/ (myst-nb puts its copies of the notebooks and their
        # images beside that folder); the finished pages are then copied into `out`.
        html_dir = STAGING / "out" / language / "html"
        shutil.rmtree(html_dir, ignore_errors=True)  # no page of an earlier build may stay
        log = STAGING / f"sphinx-{language}.log"
        command = [
            sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-E", "-a",
            "-c", str(SPHINX_PROJECT), "-d", str(STAGING / "out" / language / "doctrees"),
            *(["-q"] if quiet else []), str(staging), str(html_dir),
        ]  # fmt: skip
        env = {**os.environ, "TL_SITE_CONTEXT": str(context_file), "OMP_NUM_THREADS": "1"}
        with log.open("wb") as handle:
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
        started[language] = (process, time.monotonic(), log, html_dir)
    copy_mathjax(out)
    seconds, failed = {}, []
    for language, (process, start, log, html_dir) in started.items():
        code = process.wait()
        seconds[language] = time.monotonic() - start
        text = log.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            print(f"--- sphinx-build ({language}):\n{text}", file=sys.stderr)
        if code != 0:
            failed.append(language)
            continue
        shutil.rmtree(out / language, ignore_errors=True)
        shutil.copytree(html_dir, out / language, ignore=shutil.ignore_patterns(".buildinfo", "_sources"))
    if failed:
        raise SystemExit(f"the site did not build ({', '.join(failed)}): see the warnings above; -W makes them errors")
    write_if_changed(out / "index.html", chooser_page(words))
    write_if_changed(out / ".nojekyll", "")  # GitHub Pages: serve _static/ and _images/ as they are
    (out / STAMP).write_text(json.dumps({"digest": digest, "languages": sorted(languages)}), encoding="utf-8")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--language", choices=[*EDITIONS, "all"], default="all", help="which language (default: all)")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help=f"the output folder (default: {OUT.name}/)")
    parser.add_argument("--verbose", action="store_true", help="show sphinx-build's progress")
    args = parser.parse_args(argv)
    languages = tuple(EDITIONS) if args.language == "all" else (args.language,)
    start = time.monotonic()
    seconds = build(args.out.resolve(), languages, quiet=not args.verbose)
    for language, taken in seconds.items():
        pages = len(list((args.out / language).glob("*.html")))
        print(f"{language}: {pages} pages in {args.out / language} ({taken:.1f} s)")
    print(f"site built in {time.monotonic() - start:.1f} s: open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
