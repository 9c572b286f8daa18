"""The teacher's pack pages generated from the exercises (tools/teacher_pack.py) are up to date."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("transformer_lab_teacher_pack", ROOT / "tools" / "teacher_pack.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_the_answer_key_and_the_syllabus_table_are_fresh():
    pack = load()
    assert (ROOT / "docs" / "answer_key.md").read_text(encoding="utf-8") == pack.answer_key(), (
        "docs/answer_key.md is stale: run python tools/teacher_pack.py"
    )
    syllabus = (ROOT / "docs" / "syllabus.md").read_text(encoding="utf-8")
    assert syllabus == pack.syllabus(syllabus), "docs/syllabus.md is stale: run python tools/teacher_pack.py"


def test_the_answer_key_lists_every_graded_exercise_with_its_mistakes():
    from transformer_lab.exercises import all_exercises

    key = (ROOT / "docs" / "answer_key.md").read_text(encoding="utf-8")
    for name, exercise in all_exercises().items():
        if name.startswith("ch1") and int(name[2:4]) > 10:
            continue
        assert f"({exercise.title}," in key, name
    assert key.count("Common mistakes and what the check says:") >= len(all_exercises()) - 1
