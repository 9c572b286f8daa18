"""The Chinese edition (issue 17): complete, in step with the English, and different only where allowed.

- every markdown cell of every English source chapter has a translation keyed to its exact English text
  (missing, stale and half-updated entries fail, each naming the cell and what to do);
- every text of every exercise has its Chinese in the catalogue, and no entry is unused;
- the committed Chinese notebooks are a fresh generation (tools/translate.py);
- each Chinese notebook differs from its English twin only in the markdown, the setup cell's language line,
  the docstrings and comments of code cells (the code itself is byte for byte the English's), and the printed
  output of exercise calls, which is what those calls print in Chinese;
- every exercise's specification (its docstring) and help cell is translated;
- the translations keep the English's code spans, formulas (only the words inside \\text{} may be Chinese) and
  links, use the glossary's terms, use a rejected variant (真值 for value...) only inside quotes of the notes,
  and cite as d2l-zh does ("Xiong 等人").
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import editions  # noqa: E402
import translate  # noqa: E402

CHAPTERS = editions.source_notebooks(ROOT)
MODULES = translate.exercise_module_names()
GLOSSARY = ROOT / "docs" / "glossary.md"


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _entries(chapter: pathlib.Path) -> list[dict]:
    return translate.load_translation(chapter)["cells"]


# ------------------------------------------------------------------ complete and in step


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_markdown_cell_has_a_current_translation(chapter):
    problems = translate.problems(chapter)
    assert not problems, "\n".join(problems) + "\nthen: python tools/translate.py"


@pytest.mark.parametrize("module", MODULES)
def test_every_exercise_text_has_its_chinese(module):
    problems = translate.catalogue_problems(module)
    assert not problems, "\n".join(problems) + "\n(python tools/translate.py --update adds the missing keys)"


def test_committed_chinese_notebooks_are_a_fresh_generation():
    for chapter in CHAPTERS:
        if translate.problems(chapter):
            pytest.fail(f"{chapter.name}: translation incomplete (see the test above)")
    fresh = translate.generate(ROOT)
    assert len(fresh) == 2 * len(CHAPTERS)
    stale = [str(p.relative_to(ROOT)) for p, text in fresh.items() if not p.exists() or p.read_text("utf-8") != text]
    assert not stale, f"stale or missing: {stale}; run python tools/translate.py"
    extra = {p for folder in (translate.OUT_SOURCE, translate.OUT_LEARNER) for p in folder.glob("*.ipynb")} - set(fresh)
    assert not extra, f"Chinese notebooks without an English source: {sorted(map(str, extra))}"


def test_a_stale_translation_is_caught_and_update_keeps_the_old_pair(tmp_path, monkeypatch):
    """Change one English cell: the check names it; --update keeps the old translation beside the new English."""
    chapter = CHAPTERS[1]
    notebook = _load(chapter)
    index = next(i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "markdown" and i > 0)
    notebook["cells"][index]["source"] = editions.source_text(notebook["cells"][index]) + "\n\nOne more sentence."
    source = tmp_path / chapter.name
    source.write_text(json.dumps(notebook), encoding="utf-8")
    folder = tmp_path / "translations"
    folder.mkdir()
    (folder / (chapter.stem + ".json")).write_text(translate.translation_path(chapter).read_text("utf-8"), "utf-8")
    monkeypatch.setattr(translate, "TRANSLATIONS", folder)
    monkeypatch.setattr(translate, "ROOT", tmp_path)
    problems = translate.problems(source)
    assert any(f"cell {index} has no entry" in p for p in problems), problems
    assert any("no longer in the chapter" in p for p in problems), problems
    translate.update_translation(source)
    entry = next(e for e in _entries(source) if e["cell"] == index)
    assert entry["zh"] == "" and entry["old_zh"] and entry["en"].endswith("One more sentence.")
    assert any("not translated yet" in p for p in translate.problems(source))


def test_a_changed_docstring_is_caught_and_update_keeps_its_old_translation(tmp_path, monkeypatch):
    """Change an exercise's docstring: the check names it; --update keeps the old pair beside the new English."""
    chapter = CHAPTERS[1]
    notebook = _load(chapter)
    index, cell = next(
        (i, c) for i, c in enumerate(notebook["cells"]) if c["metadata"].get("nbgrader", {}).get("solution")
    )
    words = next(w for w in translate.code_words(editions.source_text(cell)) if w.docstring)
    source_text = editions.source_text(cell)
    changed = source_text[: words.end] + " Exactly." + source_text[words.end :]
    notebook["cells"][index]["source"] = editions.as_lines(changed)
    source = tmp_path / chapter.name
    source.write_text(json.dumps(notebook), encoding="utf-8")
    folder = tmp_path / "translations"
    folder.mkdir()
    (folder / (chapter.stem + ".json")).write_text(translate.translation_path(chapter).read_text("utf-8"), "utf-8")
    monkeypatch.setattr(translate, "TRANSLATIONS", folder)
    monkeypatch.setattr(translate, "ROOT", tmp_path)
    problems = translate.problems(source)
    assert any(f"cell {index}: the docstring" in p and "has no entry" in p for p in problems), problems
    assert any("no longer in the chapter's code" in p for p in problems), problems
    before = {e["en"]: e["zh"] for e in translate.load_translation(source)["code"]}
    translate.update_translation(source)
    entry = next(e for e in translate.load_translation(source)["code"] if e["en"] == words.text + " Exactly.")
    assert entry["zh"] == "" and entry["old_en"] == words.text and entry["old_zh"] == before[words.text]
    assert any("is not translated yet" in p for p in translate.problems(source))


# ------------------------------------------------------------------ different only where allowed


def _exercise_cell(cell: dict) -> bool:
    return cell["cell_type"] == "code" and any(
        translate.CALL.match(line.strip()) for line in editions.source_text(cell).splitlines()
    )


def _pairs():
    for chapter in CHAPTERS:
        for edition, english, chinese in (
            ("solutions", ROOT / "notebooks" / "solutions", translate.OUT_SOURCE),
            ("learner", ROOT / "notebooks", translate.OUT_LEARNER),
        ):
            yield pytest.param(
                chapter.name, english / chapter.name, chinese / chapter.name, id=f"{chapter.stem}-{edition}"
            )


@pytest.mark.parametrize("name, english_path, chinese_path", list(_pairs()))
def test_chinese_differs_from_english_only_where_allowed(name, english_path, chinese_path):
    from transformer_lab import i18n

    if not chinese_path.exists():
        pytest.fail(f"{chinese_path.relative_to(ROOT)} is missing: run python tools/translate.py")
    english, chinese = _load(english_path), _load(chinese_path)
    assert len(english["cells"]) == len(chinese["cells"]), "not cell for cell"
    modules = editions.exercise_modules(english)
    language_lines = 0
    for index, (en, zh) in enumerate(zip(english["cells"], chinese["cells"], strict=True)):
        where = f"{chinese_path.relative_to(ROOT)}, cell {index}"
        assert en["cell_type"] == zh["cell_type"], where
        assert en.get("metadata") == zh.get("metadata"), f"{where}: cell metadata differs"
        if en["cell_type"] == "markdown":
            assert re.search(r"[\u4e00-\u9fff]", editions.source_text(zh)), f"{where}: no Chinese in a markdown cell"
            continue
        en_source, zh_source = editions.source_text(en), editions.source_text(zh)
        assert len(en_source.splitlines()) == len(zh_source.splitlines()), f"{where}: not line for line"
        # the code without its docstrings' and comments' words: byte for byte the English's
        en_lines = translate.code_skeleton(en_source).splitlines()
        zh_lines = translate.code_skeleton(zh_source).splitlines()
        assert len(en_lines) == len(zh_lines), f"{where}: the code differs"
        for a, b in zip(en_lines, zh_lines, strict=True):
            if a != b:
                assert a.startswith('tl.set_language("en")') and b.startswith('tl.set_language("zh")'), (
                    f"{where}: code differs outside the language line:\n{a}\n{b}"
                )
                language_lines += 1
        if _exercise_cell(en):
            en_text = "".join(editions.source_text({"source": o["text"]}) for o in en["outputs"] if "text" in o)
            zh_text = "".join(editions.source_text({"source": o["text"]}) for o in zh["outputs"] if "text" in o)
            with i18n.language("en"):
                expected = translate.exercise_outputs(en_source, modules, en_text, where)
            assert zh_text == expected, f"{where}: the printed output is not the exercise calls' Chinese"
            assert [o for o in en["outputs"] if "text" not in o] == [o for o in zh["outputs"] if "text" not in o]
        else:
            assert en.get("outputs") == zh.get("outputs"), f"{where}: outputs differ"
            assert en.get("execution_count") == zh.get("execution_count"), where
    assert language_lines == 1, "the setup cell's language line must be the one code line that differs"
    en_meta = {k: v for k, v in english["metadata"].items() if k != "transformer_lab"}
    zh_meta = {k: v for k, v in chinese["metadata"].items() if k != "transformer_lab"}
    assert en_meta == zh_meta
    assert chinese["metadata"]["transformer_lab"]["language"] == "zh"


SAME_IN_CHINESE = {"inf", "log", "exp", "sqrt"}  # the words of a formula such as e^(-inf) = 0


def test_every_exercise_specification_and_help_cell_is_in_chinese():
    """The learner's specification (the stub's docstring) and the help cell's instruction, in both editions."""
    missing = []
    for folder in (translate.OUT_SOURCE, translate.OUT_LEARNER):
        for path in sorted(folder.glob("*.ipynb")):
            for index, cell in enumerate(_load(path)["cells"]):
                if cell["cell_type"] != "code" or not cell["metadata"].get("nbgrader"):
                    continue
                grade_id = cell["metadata"]["nbgrader"].get("grade_id", "")
                words = [w for w in translate.code_words(editions.source_text(cell)) if w.text != "YOUR CODE HERE"]
                if (cell["metadata"]["nbgrader"].get("solution") or grade_id.endswith("_help")) and not words:
                    missing.append(f"{path.relative_to(ROOT)}, cell {index}: no docstring or instruction")
                for w in words:
                    english = set(re.findall(r"[A-Za-z]{3,}", w.text)) - SAME_IN_CHINESE
                    if english and not re.search(r"[\u4e00-\u9fff]", w.text):
                        missing.append(f"{path.relative_to(ROOT)}, cell {index}: {w.text[:60]!r} is English")
    assert not missing, "\n".join(missing)


def test_code_words_are_the_prose_of_docstrings_and_comments_and_nothing_else():
    source = (
        "def f(x):\n"
        '    """One line.\n'
        "\n"
        "    Shape: x (B, T) -> (B,).\n"
        '    """\n'
        "    ### BEGIN SOLUTION\n"
        "    y = x.sum(-1)  # (B,)\n"
        "    return y  # the sum of a row\n"
        "    ### END SOLUTION\n"
        "# Stuck? Uncomment one line.\n"
        "# exercises.f.hint(2)\n"
        "# exercises.f.solution()  # a working answer\n"
        'note = """not a docstring"""  # noqa: E501\n'
    )
    words = translate.code_words(source)
    assert [(w.text, w.docstring) for w in words] == [
        ("One line.\n\nShape: x (B, T) -> (B,).", True),
        ("the sum of a row", False),
        ("Stuck? Uncomment one line.", False),
        ("a working answer", False),
    ]
    chinese = {
        "One line.\n\nShape: x (B, T) -> (B,).": "一行。\n\n形状：x (B, T) -> (B,)。",
        "the sum of a row": "一行之和",
        "a working answer": "一个可用的答案",
    }
    translated = translate.translate_code(source, chinese, "test")
    assert '    """一行。\n\n    形状：x (B, T) -> (B,)。\n    """\n' in translated
    assert "# exercises.f.solution()  # 一个可用的答案\n" in translated
    assert "# Stuck? Uncomment one line.\n" in translated  # no entry: stays English
    assert translate.code_skeleton(translated) == translate.code_skeleton(source)
    assert translate.translate_code(source, {}, "test") == source
    with pytest.raises(ValueError, match="keep the English's lines"):
        translate.translate_code(source, {"One line.\n\nShape: x (B, T) -> (B,).": "一行。"}, "test")
    with pytest.raises(ValueError, match="one line"):
        translate.translate_code(source, {"the sum of a row": "一行\n之和"}, "test")


def test_a_formula_may_say_its_text_words_in_chinese_and_nothing_else():
    english = r"$$q_c = \begin{cases} 0 & c = \text{PAD} \\ \varepsilon & \text{otherwise}\end{cases}$$"
    pattern = translate.formula_pattern(english)
    assert pattern.search(english)
    assert pattern.search(english.replace(r"\text{otherwise}", r"\text{其他}"))
    assert not pattern.search(english.replace(r"\varepsilon", r"\epsilon"))  # a symbol changed
    assert not pattern.search(english.replace(r"\text{otherwise}", "其他"))  # words outside \text{}


# ------------------------------------------------------------------ faithful structure


CODE_SPAN = re.compile(r"`[^`]+`")  # a span may wrap onto the next line
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def _translated_cells():
    for chapter in CHAPTERS:
        for entry in _entries(chapter):
            if entry.get("zh", "").strip():
                yield chapter.stem, entry


def _flat(text: str) -> str:
    """Text with its line breaks, blockquote markers included, as single spaces (a span may wrap)."""
    return re.sub(r"\s+", " ", re.sub(r"\n>[ ]?", "\n", text))


def _shifted(target: str) -> str:
    """A relative link out of notebooks/ gains one ../ in notebooks/zh/."""
    return "../" + target if target.startswith("../") else target


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_translations_keep_code_math_and_links(chapter):
    problems = []
    for entry in _entries(chapter):
        en, zh = entry["en"], entry.get("zh", "")
        if not zh.strip():
            continue
        zh_flat = _flat(zh)
        for span in set(CODE_SPAN.findall(FENCE.sub("", en))) - set(MATH.findall(en)):
            if _flat(span) not in zh_flat:
                problems.append(f"cell {entry['cell']}: {span[:70]!r} is not in the translation")
        for formula in set(MATH.findall(en)):
            if not translate.formula_pattern(_flat(formula)).search(zh_flat):
                problems.append(f"cell {entry['cell']}: the formula {formula[:70]!r} is not in the translation")
        for target in set(LINK.findall(en)):
            if target not in zh and _shifted(target) not in zh and not target.endswith("README.md"):
                problems.append(f"cell {entry['cell']}: the link {target!r} is missing (or not shifted by ../)")
        if en.count("{{") != zh.count("{{"):
            problems.append(f"cell {entry['cell']}: keep the {{{{time}}}} / {{{{min}}}} markers")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", sorted(translate.OUT_LEARNER.glob("*.ipynb")), ids=lambda p: p.stem)
def test_relative_links_of_the_chinese_notebooks_resolve(path):
    broken = []
    for cell in _load(path)["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for target in LINK.findall(editions.source_text(cell)):
            if re.match(r"[a-z]+:|#", target):
                continue
            file = target.split("#", 1)[0]
            if file and not (path.parent / file).exists():
                broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"


# ------------------------------------------------------------------ the glossary


def glossary() -> list[dict[str, str]]:
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and cells[0] not in ("English", "---"):
            rows.append({"en": cells[0], "zh": cells[1], "definition": cells[2], "rejected": cells[3], "d2l": cells[4]})
    return rows


def test_glossary_is_complete_and_starts_from_the_plans_terms():
    rows = glossary()
    assert len(rows) >= 40
    for row in rows:
        assert row["zh"] and row["definition"], row
        assert re.search(r"[\u4e00-\u9fff]", row["definition"]), f"{row['en']}: the definition is not Chinese"
    by_en = {row["en"]: row["zh"] for row in rows}
    plan = (
        (ROOT.parent / "shared" / "NOTEBOOKS.md").read_text(encoding="utf-8")
        if (ROOT.parent / "shared" / "NOTEBOOKS.md").exists()
        else ""
    )
    for en, zh in [
        ("mask", "掩码"),
        ("multi-head attention", "多头注意力"),
        ("layer normalization", "层归一化"),
        ("batch normalization", "批归一化"),
        ("feed-forward network", "前馈神经网络"),
        ("residual connection", "残差连接"),
        ("encoder", "编码器"),
        ("decoder", "解码器"),
        ("positional encoding", "位置编码"),
        ("query", "查询"),
        ("key", "键"),
        ("value", "值"),
    ]:
        assert by_en.get(en) == zh, f"glossary: {en} should be {zh} (the plan's Terms)"
        if plan:
            assert zh in plan
    assert "真值" in next(row["rejected"] for row in rows if row["en"] == "value")


def test_glossary_decides_the_terms_the_readers_asked_for_and_maps_d2l_zh():
    rows = {row["en"]: row for row in glossary()}
    for en, zh, rejected in [
        ("score", "分数", "得分"),
        ("stride", "步幅", ""),
        ("masked", "掩蔽", "屏蔽"),
        ("memory (of the encoder)", "记忆", "存储器"),
    ]:
        assert rows[en]["zh"] == zh, en
        assert rejected in rows[en]["rejected"], en
    assert rows["layer normalization"]["d2l"] == "层规范化"  # d2l-zh's word where it differs
    assert rows["query"]["d2l"] == ""  # the same as ours: empty
    assert all(row["d2l"] != row["zh"] for row in rows.values())


def _prose(english: str) -> str:
    """English prose without code, math, link targets and HTML."""
    text = FENCE.sub(" ", english)
    text = re.sub(r"(?m)^(?: {4}|\t).*$", " ", text)  # indented code blocks
    text = MATH.sub(" ", text)
    text = CODE_SPAN.sub(" ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<[^>]+>", " ", text)


def _term_pattern(term: str) -> re.Pattern[str]:
    words = [re.escape(w) for w in re.split(r"[ -]", term)]
    return re.compile(r"\b" + r"[\s-]".join(words) + r"(?:s|es)?\b", re.I)


def _rejected_words(zh: str, rows: list[dict[str, str]]) -> list[str]:
    """The glossary's rejected words that `zh` uses outside a quote of the notes or a code span."""
    unquoted = re.sub(r"“[^”]*”|「[^」]*」|`[^`]*`", " ", zh)
    found = []
    for row in rows:
        for word in filter(None, (w.strip() for w in row["rejected"].split(","))):
            if re.search(re.escape(word) + ("(?!对)" if word == "键值" else ""), unquoted):
                found.append(f"{word} (not used: {row['zh']}) outside a quote of the notes")
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_translations_use_the_glossary(chapter):
    rows = sorted(glossary(), key=lambda r: -len(r["en"]))  # longest first: "batch normalization" before "batch"
    checked = [row for row in rows if "(" not in row["en"]]  # "memory (of the encoder)": the word has other senses
    problems = []
    for entry in translate.load_translation(chapter)["code"]:
        problems += [f"code {entry['en'][:40]!r}: {p}" for p in _rejected_words(entry.get("zh", ""), rows)]
    for entry in _entries(chapter):
        zh = entry.get("zh", "")
        if not zh.strip():
            continue
        prose = _prose(entry["en"])
        for row in checked:
            pattern = _term_pattern(row["en"])
            if pattern.search(prose):
                if row["zh"] not in zh:
                    problems.append(f"cell {entry['cell']}: '{row['en']}' should be {row['zh']}")
                prose = pattern.sub(" ", prose)
        problems += [f"cell {entry['cell']}: {p}" for p in _rejected_words(zh, rows)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_citations_are_written_as_d2l_zh_writes_them(chapter):
    """Citations as d2l-zh writes them: "Xiong 等人（2020）", never "Xiong et al." or "Xiong 等" (glossary.md)."""
    problems = []
    for entry in _entries(chapter):
        prose = re.sub(r"“[^”]*”|`[^`]*`", " ", entry.get("zh", ""))  # quotes of the notes, code
        for match in re.finditer(r"[A-Z][\w-]+ (?:et al\.?|等(?!人))", prose):
            problems.append(f"cell {entry['cell']}: {match.group(0)!r}: write “{match.group(0).split()[0]} 等人”")
    assert not problems, "\n".join(problems)
