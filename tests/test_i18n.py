"""The message catalogue and the language switch (issue 17): every message in both languages with the
same fields, every key the code uses present and every key present used, and a learner's check, hint and
solution in the language the setup cell chose, never mixed."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import torch

import transformer_lab as tl
from transformer_lab import i18n
from transformer_lab.exercises import all_exercises
from transformer_lab.exercises import ch01_attention as ch01

ROOT = pathlib.Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u4e00-\u9fff]")


def test_every_message_in_both_languages_with_the_same_fields():
    for key, entry in i18n.messages().items():
        assert set(entry) == set(i18n.LANGUAGES), f"{key}: languages {sorted(entry)}"
        assert all(entry[lang].strip() for lang in i18n.LANGUAGES), key
        assert i18n.fields_of(entry["en"]) == i18n.fields_of(entry["zh"]), f"{key}: the fields differ"
        words = re.sub(r"\{[^}]*\}", "", entry["en"])
        if re.search(r"[A-Za-z]{3,}", words):  # a message with words (not "{case}: {problem}") says them in Chinese
            assert CJK.search(entry["zh"]), f"{key}: the Chinese text has no Chinese"


def test_every_key_used_exists_and_every_key_is_used():
    sources = [*(ROOT / "transformer_lab").rglob("*.py"), *(ROOT / "tools").glob("*.py")]
    used = set()
    for path in sources:
        used |= set(re.findall(r"""(?:_m|message|_Shown)\(\s*["']([a-z_]+\.[a-z_]+)["']""", path.read_text("utf-8")))
    keys = set(i18n.messages())
    assert used - keys == set(), f"used but not in the catalogue: {sorted(used - keys)}"
    assert keys - used == set(), f"in the catalogue but never used: {sorted(keys - used)}"


def test_exercise_texts_keep_their_code_spans():
    texts = i18n.texts("zh")
    problems = []
    for exercise in all_exercises().values():
        for english in exercise.texts():
            chinese = texts.get(english)
            if chinese is None:
                continue  # tests/test_translation.py names missing entries
            for span in re.findall(r"`[^`]+`", english):
                if span not in chinese:
                    problems.append(f"{exercise.name}: {span} is missing in {chinese[:50]!r}")
    assert not problems, "\n".join(problems)


def test_set_language_rejects_what_it_does_not_know_and_names_the_argument():
    with pytest.raises(ValueError, match=r"lang: expected one of \('en', 'zh'\).*got 'fr'"):
        tl.set_language("fr")
    with pytest.raises(ValueError, match="lang"):
        tl.set_language(None)
    assert tl.get_language() == "en"


def test_the_environment_variable_chooses_and_is_checked():
    code = "import transformer_lab as tl; print(tl.get_language())"
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={"TRANSFORMER_LAB_LANGUAGE": "zh_CN", "PATH": ""},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.stdout.strip() == "zh", run.stderr
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={"TRANSFORMER_LAB_LANGUAGE": "klingon"},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode != 0 and "TRANSFORMER_LAB_LANGUAGE" in run.stderr


def _blank(*args):
    raise NotImplementedError()


def _wrong_shape(x):
    return x.softmax(-1)[..., :1]


def test_a_learner_in_chinese_reads_chinese_and_english_comes_back(capsys):
    exercise = ch01.softmax_rows
    with i18n.language("zh"):
        exercise.check(_blank)
        exercise.hint()
        exercise.hint(99)
        exercise.check(lambda x: torch.zeros(1, 1))
        exercise.solution()
    out = capsys.readouterr().out
    assert "尚未完成" in out and "的提示（第 1 条" in out and "形状不对" in out
    for english in ("not done yet", "Hint 1 of", "wrong shape", "cases passed", "has hints 1 to"):
        assert english not in out, f"English {english!r} in the Chinese feedback"
    assert tl.get_language() == "en"
    exercise.check(_blank)
    assert "not done yet" in capsys.readouterr().out


def test_case_names_hints_and_why_come_from_the_chapter_catalogue():
    for exercise in all_exercises().values():
        with i18n.language("zh"):
            report = exercise.passing_report()
            hints = [exercise.hint_text(k) for k in range(1, len(exercise.hints) + 1)]
        assert CJK.search(report) and all(CJK.search(h) for h in hints), exercise.name
        for case in exercise.cases:
            words = re.sub(r"`[^`]*`", "", case.name)
            if CJK.search(case.name) is None and re.search(r"[A-Za-z]{3,}", words):  # "B=2, T=3" needs no words
                assert f"✓ {case.name}\n" not in report, f"{exercise.name}: case {case.name!r} shown in English"


def test_run_sh_lab_zh_opens_the_chinese_working_copy_with_a_chinese_interface():
    """`bash run.sh lab zh` (here with --version, which jupyter lab answers and exits; --allow-root, where the tests
    run as root) makes my_notebooks/zh/ from notebooks/zh/ and, in my_notebooks/.jupyter-zh/ (the learner's folder,
    not the repository), the JupyterLab settings that choose the Chinese interface; an unknown language is refused."""
    import os

    env = dict(os.environ, VENV=sys.prefix)
    run = subprocess.run(
        ["bash", "run.sh", "lab", "zh", "--version", "--allow-root"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"^\d+\.\d+\.\d+$", run.stdout.strip().splitlines()[-1]), run.stdout
    chapters = sorted(p.name for p in (ROOT / "my_notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))
    assert chapters == sorted(p.name for p in (ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))
    settings = ROOT / "my_notebooks" / ".jupyter-zh" / "user-settings" / "@jupyterlab" / "translation-extension"
    assert '"locale": "zh_CN"' in (settings / "plugin.jupyterlab-settings").read_text(encoding="utf-8")
    bad = subprocess.run(
        ["bash", "run.sh", "lab"],
        cwd=ROOT,
        env=dict(env, TRANSFORMER_LAB_LANGUAGE="fr"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "must be en or zh, got 'fr'" in bad.stderr
