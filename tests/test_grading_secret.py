"""Each exercise's hidden cases are drawn from the class secret, the student's id and the answer cells
(`grading.submission_secret`): a re-grade of the same submission meets the same inputs. `grade_notebook` once
passed its sandbox object there in place of the student's id, whose repr changes from run to run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_lab.exercises import grading

ROOT = Path(__file__).resolve().parents[1]


class _Box:
    """Stands in for a StudentSandbox: nothing here runs an answer (grade_exercise is replaced below)."""

    session = None

    def server(self) -> None:
        return None

    def close(self) -> None:
        pass


def _secrets(monkeypatch: pytest.MonkeyPatch, student: str) -> list[int]:
    """The secrets grade_notebook draws chapter 01's hidden cases from, for the source edition handed in."""
    drawn: list[int] = []

    def record(exercise, function, cells, points, secret, *args, **kwargs):  # noqa: ANN001, ANN202
        drawn.append(secret)
        return grading.blank_grade(exercise, points)

    monkeypatch.setattr(grading, "grade_exercise", record)
    teacher = json.loads((ROOT / "notebooks" / "solutions" / "01_attention.ipynb").read_text(encoding="utf-8"))
    grading.grade_notebook(teacher, teacher, "01_attention", 1234, sandbox=_Box(), student=student)
    return drawn


def test_a_regrade_draws_the_same_hidden_cases_and_another_student_other_ones(monkeypatch):
    first, again = _secrets(monkeypatch, "ada"), _secrets(monkeypatch, "ada")
    assert first and first == again
    assert set(_secrets(monkeypatch, "grace")).isdisjoint(first)


def test_the_student_must_be_an_id():
    with pytest.raises(TypeError, match="student must be the student's id"):
        grading.submission_secret(1, object(), ["x = 1"])  # type: ignore[arg-type]
