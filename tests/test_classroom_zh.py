"""A Chinese class (issue 17): the same grading code, the Chinese edition handed out, the students' texts in
Chinese, and one language per class.

A class made with `classroom.py student --language zh` gets the Chinese source edition of chapter 02 as its
assignment (Chinese markdown, `tl.set_language("zh")` in the setup cell, checks that print Chinese), a Chinese
README, grades equal to an English class's on the same answers, and Chinese feedback. A course directory keeps
its language: asking it for the other one is refused with a message that says what to do.
"""

from __future__ import annotations

import json
import re

import pytest
from support import require_sandbox
from test_classroom import ROOT, classroom

from transformer_lab.exercises.grading import GradingSession  # noqa: F401  (the grading machinery is importable)

CJK = re.compile(r"[\u4e00-\u9fff]")
ZH = [p for p in classroom.chapter_notebooks(ROOT, language="zh") if p.name.startswith("02")]
EN = [p for p in classroom.chapter_notebooks(ROOT) if p.name.startswith("02")]
SECRET = 17

pytestmark = pytest.mark.slow  # grades a whole class: notebooks run in the sandbox


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    require_sandbox()
    if not ZH:
        pytest.fail("notebooks/zh/solutions/02_masking.ipynb is missing: run python tools/translate.py")
    tmp = tmp_path_factory.mktemp("zh-class")
    made = {}
    for language, chosen in (("zh", ZH), ("en", EN)):
        course = tmp / f"course-{language}"
        out = classroom.make_student_folder(tmp / f"student-{language}", course, chosen, language=language)
        subs = tmp / f"subs-{language}"
        for student, source in (("ada", chosen[0]), ("bob", out / chosen[0].name)):
            (subs / student).mkdir(parents=True)
            (subs / student / chosen[0].name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        records = classroom.grade_folder(subs, course, timeout=5.0, secret=SECRET)
        pages = classroom.feedback(course, course / "feedback")
        made[language] = {"course": course, "out": out, "records": records, "pages": pages}
    return made


def test_the_chinese_class_is_handed_the_chinese_edition(classes):
    out = classes["zh"]["out"]
    notebook = json.loads((out / ZH[0].name).read_text(encoding="utf-8"))
    markdown = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    code = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    assert CJK.search(markdown) and 'tl.set_language("zh")' in code and "raise NotImplementedError()" in code
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# Transformer Lab：你的课程副本") and "Settings → Language" in readme
    english = (classes["en"]["out"] / "README.md").read_text(encoding="utf-8")
    assert not CJK.search(english)


def test_grades_are_the_same_in_both_languages(classes):
    def scores(records):
        return {(r["student"], e["exercise"]): e["points"] for r in records for e in r["exercises"]}

    zh, en = scores(classes["zh"]["records"]), scores(classes["en"]["records"])
    assert zh == en
    assert all(p > 0 for (s, _), p in zh.items() if s == "ada") and all(
        p == 0 for (s, _), p in zh.items() if s == "bob"
    )


def test_the_feedback_speaks_the_class_language(classes):
    page = next(p for p in classes["zh"]["pages"] if "bob" in p.parts).read_text(encoding="utf-8")
    assert "你的反馈" in page and "尚未完成" in page and "lang='zh-CN'" in page
    assert "your feedback" not in page and "not done yet" not in page
    cases = [text for r in classes["zh"]["records"] for e in r["exercises"] for _, text in e["cases"]]
    assert cases and all(CJK.search(text) for text in cases), "a case name or message stayed English"
    english = next(p for p in classes["en"]["pages"] if "bob" in p.parts).read_text(encoding="utf-8")
    assert "your feedback" in english and not CJK.search(english.split("<h2>", 1)[1])


def test_a_class_keeps_its_language(classes, tmp_path):
    with pytest.raises(ValueError, match=r"language: the class in .* is in 'zh', not 'en'.*--course-dir"):
        classroom.make_student_folder(tmp_path / "again", classes["zh"]["course"], EN, language="en")
    assert classroom.class_language(classes["zh"]["course"]) == "zh"
