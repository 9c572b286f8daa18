"""A class's grade may leave its predict exercises out (`classroom.py grade --predict leave-out`, kept by the
course directory): a predict answer's points prove that the value reached the notebook, not that it was
predicted (docs/teaching.md). The tables, the report and the feedback then count none of their points; the
per-exercise table still lists them, and `--predict count` brings them back."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from test_classroom import NOTEBOOKS, classroom

from transformer_lab.exercises import grading

TEACHER = next(p for p in NOTEBOOKS if p.name.startswith("01"))
CHAPTER = "01_attention"


def _course(tmp_path):
    """A course directory with chapter 01 handed out and one record: every exercise full marks but one."""
    course = tmp_path / "course"
    classroom.set_class_language(course, "zh")
    (course / "source" / CHAPTER).mkdir(parents=True)
    shutil.copy2(TEACHER, course / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    teacher = json.loads(TEACHER.read_text(encoding="utf-8"))
    points = {
        classroom.nbgrader_meta(c)["grade_id"]: float(classroom.nbgrader_meta(c).get("points", 1))
        for c in teacher["cells"]
        if classroom.nbgrader_meta(c).get("grade")
    }
    kinds = grading.exercise_kinds(teacher)
    assert set(kinds) == set(points)  # every graded cell's exercise is found
    predict = {g for g, k in kinds.items() if k == "predict"}
    assert predict and set(kinds) - predict, kinds  # chapter 01 has both kinds
    build = sorted(set(kinds) - predict)
    exercises = [
        {"grade_id": g, "exercise": g, "points": 0.0 if g == build[0] else p, "max_points": p, "cases": [[True, "ok"]]}
        for g, p in points.items()
    ]
    classroom.save_record(course, {"student": "ada", "chapter": CHAPTER, "exercises": exercises, "problems": []})
    return course, points, predict, build[0]


def _row(course):
    with (course / "grades.csv").open(encoding="utf-8", newline="") as f:
        return next(r for r in csv.DictReader(f) if r["student_id"] == "ada")


def test_the_grade_leaves_the_predict_exercises_out_when_the_class_says_so(tmp_path):
    course, points, predict, missed = _course(tmp_path)
    everything, without = sum(points.values()), sum(p for g, p in points.items() if g not in predict)
    classroom.main(["--course-dir", str(course), "report"])
    assert _row(course)["total"] == f"{everything - points[missed]:g}"
    assert _row(course)["max_total"] == f"{everything:g}"
    assert "leaves out" not in (course / "grading_report.md").read_text(encoding="utf-8")

    assert classroom.main(["--course-dir", str(course), "report", "--predict", "leave-out"]) == 0
    assert not classroom.predict_counted(course) and classroom.class_language(course) == "zh"  # both kept
    assert _row(course)["total"] == f"{without - points[missed]:g}" and _row(course)["max_total"] == f"{without:g}"
    with (course / "grades_by_chapter.csv").open(encoding="utf-8", newline="") as f:
        assert next(csv.DictReader(f))["max_score"] == f"{without:g}"
    with (course / "grades_by_exercise.csv").open(encoding="utf-8", newline="") as f:
        assert predict <= {r["exercise"] for r in csv.DictReader(f)}  # still listed, with their points
    report = (course / "grading_report.md").read_text(encoding="utf-8")
    assert "leaves out the predict exercises" in report and all(g in report for g in predict), report

    page = classroom.feedback(course, course / "feedback")[0].read_text(encoding="utf-8")
    assert f"得 {without - points[missed]:g} 分（满分 {without:g} 分）" in page, page  # the total, in Chinese
    assert page.count("不计入成绩") == len(predict), page

    classroom.main(["--course-dir", str(course), "report"])  # no --predict: the class's choice stays
    assert _row(course)["max_total"] == f"{without:g}"
    classroom.main(["--course-dir", str(course), "report", "--predict", "count"])
    assert _row(course)["max_total"] == f"{everything:g}" and classroom.predict_counted(course)


def test_a_wrong_choice_names_the_argument(tmp_path, capsys):
    with pytest.raises(ValueError, match="predict: expected one of"):
        classroom.set_predict(tmp_path, "drop")
    with pytest.raises(ValueError, match="predict: expected one of"):
        classroom.grade_folder(tmp_path / "subs", tmp_path / "course", predict="leave out")  # before anything runs
    with pytest.raises(SystemExit):
        classroom.main(["--course-dir", str(tmp_path), "report", "--predict", "drop"])
    assert "--predict: invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        classroom.main(["--course-dir", str(tmp_path), "grade", str(tmp_path), "--predict", "none"])
    assert "--predict: invalid choice" in capsys.readouterr().err
    assert not (tmp_path / classroom.CLASS_FILE).exists()  # nothing kept of a refused choice
