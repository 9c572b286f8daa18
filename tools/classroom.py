"""Teach with the course: make the student versions with nbgrader, and grade what students hand in.

    python tools/classroom.py student [--out student/] [--course-dir classroom/]
    python tools/classroom.py grade SUBMISSIONS/ [--course-dir classroom/] [--csv grades.csv]

`student` copies every chapter of the source edition (notebooks/solutions/NN_*.ipynb) into an nbgrader course directory
(`classroom/` by default, with its own nbgrader_config.py written there) as one assignment,
"transformer_lab", together with a copy of the package and the pinned requirements, and runs
`nbgrader generate_assignment`: solution regions become `raise NotImplementedError()`, the hidden
tests of the grade cells are removed, outputs are cleared, the grade cells are locked. The result
(nbgrader's release folder) is copied to `student/`: a folder a teacher hands out as it is. The
package sits beside the notebooks, so `import transformer_lab` works when a notebook runs there;
the student only installs the requirements (see the README.md written into that folder).

`grade` takes a folder with one sub-folder per student (named by the student's id) holding that
student's notebooks, copies them into the course directory's `submitted/`, runs
`nbgrader autograde` (which puts the hidden tests back, runs every notebook in a fresh kernel
with one thread, and restores the package copy from the teacher's source, so an edited package
cannot change a grade), then writes nbgrader's own CSV export (one row per student) and a second
CSV with the points of every student in every chapter.

See docs/teaching.md for the whole workflow.
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
COURSE_ID = "transformer_lab"
ASSIGNMENT = "transformer_lab"
MARKER = ".transformer_lab_student"  # marks a folder this tool made, so --out may replace it

NBGRADER_CONFIG = """\
# nbgrader configuration of the transformer_lab course directory, written by tools/classroom.py.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
# A chapter may train a model for a minute or two: nbgrader's default of 30 s per cell is too short.
c.Execute.timeout = 600
# The stub nbgrader writes in place of a solution (this is nbgrader's default, spelled out).
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.egg-info"]
"""

STUDENT_README = """\
# Transformer Lab: your copy of the course

These are the chapters of the course with the exercises left for you to write.

## Set up (once)

You need Python 3.11 or newer. In this folder:

    python -m venv .venv
    .venv/bin/pip install -r requirements.txt
    .venv/bin/jupyter lab 00_start_here.ipynb

(On Windows: `.venv\\Scripts\\pip` and `.venv\\Scripts\\jupyter`. Without an NVIDIA GPU, add
`--extra-index-url https://download.pytorch.org/whl/cpu` to the pip command for a much smaller
PyTorch.) The package `transformer_lab` is in this folder, beside the notebooks, so the notebooks
import it from here: there is nothing else to install. Don't edit it: grading uses the teacher's copy.

## The exercises

Each exercise is a function whose body says `# YOUR CODE HERE` and `raise NotImplementedError()`:
replace both with your code. The cell below it checks your function and says what is right and
what is wrong; it never stops the notebook, so "Run All" always reaches the end, even with
exercises left blank. `exercises.<name>.hint()` gives a hint. The cells that check your work are
locked: the teacher's copy has more tests in them, which decide the points.

## Hand in

Hand in the `.ipynb` files, keeping their names, as your teacher tells you.
"""


HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"


def nbgrader_meta(cell: dict) -> dict:
    """A cell's nbgrader metadata ({} for an ordinary cell)."""
    return cell.get("metadata", {}).get("nbgrader", {})


def split_hidden(source: str) -> tuple[str, str]:
    """Split a grade cell's source into (what the student sees, the hidden tests between the markers)."""
    if source.count(HIDDEN_BEGIN) != 1 or source.count(HIDDEN_END) != 1:
        raise ValueError(f"source: expected one {HIDDEN_BEGIN!r} and one {HIDDEN_END!r} line")
    before, rest = source.split(HIDDEN_BEGIN)
    hidden, after = rest.split(HIDDEN_END)
    return (before + after).strip(), hidden.strip()


def chapter_notebooks(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The course's chapters with their answers (the source edition): notebooks/solutions/NN_*.ipynb, in order."""
    return sorted((root / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def grading_env(quick: bool = True) -> dict[str, str]:
    """The environment nbgrader and its kernels run in: one thread, and the reduced training setting."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # nbgrader runs `alembic` (its database migrations) from PATH: put this interpreter's bin first.
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    if quick:
        env["TRANSFORMER_LAB_QUICK"] = "1"
    else:
        env.pop("TRANSFORMER_LAB_QUICK", None)
    return env


def nbgrader(course_dir: pathlib.Path, *args: str, quick: bool = True) -> str:
    """Run one nbgrader command in `course_dir`; return its log, raise RuntimeError with it on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course_dir,
        env=grading_env(quick),
        capture_output=True,
        text=True,
        check=False,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed (exit {proc.returncode}):\n{log[-6000:]}")
    return log


def write_config(course_dir: pathlib.Path) -> pathlib.Path:
    """Write the course directory's nbgrader_config.py (its root is the directory itself)."""
    course_dir.mkdir(parents=True, exist_ok=True)
    path = course_dir / "nbgrader_config.py"
    path.write_text(NBGRADER_CONFIG.format(course_id=COURSE_ID, root=str(course_dir.resolve())))
    return path


def build_course(
    course_dir: pathlib.Path,
    notebooks: Sequence[pathlib.Path] | None = None,
    assignment: str = ASSIGNMENT,
) -> pathlib.Path:
    """Set up an nbgrader course directory with the chapters as one assignment and generate it.

    Args:
        course_dir: the course directory (created; an existing one is updated, its gradebook kept).
        notebooks: the chapters to include (default: every notebooks/NN_*.ipynb).
        assignment: the assignment's name.

    Returns:
        The release folder, `course_dir/release/<assignment>`: the student version.
    """
    notebooks = list(chapter_notebooks() if notebooks is None else notebooks)
    if not notebooks:
        raise ValueError("notebooks: no chapter notebook to generate (expected notebooks/solutions/NN_*.ipynb)")
    course_dir = course_dir.resolve()
    write_config(course_dir)
    source = course_dir / "source" / assignment
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    for notebook in notebooks:
        shutil.copy2(notebook, source / notebook.name)
    shutil.copytree(
        ROOT / "transformer_lab",
        source / "transformer_lab",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copy2(ROOT / "requirements.txt", source / "requirements.txt")
    (source / "README.md").write_text(STUDENT_README)
    (source / MARKER).write_text("made by tools/classroom.py student\n")
    nbgrader(course_dir, "generate_assignment", assignment, "--force")
    return course_dir / "release" / assignment


def make_student_folder(
    out: pathlib.Path,
    course_dir: pathlib.Path,
    notebooks: Sequence[pathlib.Path] | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Generate the student version into `course_dir` and copy it to `out`; return `out`."""
    if out.exists() and any(out.iterdir()):
        if not ((out / MARKER).exists() or force):
            raise FileExistsError(f"out: {out} exists and was not made by this tool; pass --force to replace it")
        shutil.rmtree(out)
    release = build_course(course_dir, notebooks)
    shutil.copytree(release, out, dirs_exist_ok=True)
    return out


STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


def submitted_notebooks(folder: pathlib.Path) -> list[pathlib.Path]:
    """A student's notebooks: NN_*.ipynb in `folder` or, if none there, in its one sub-folder."""
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        found = sorted(folder.glob("*/[0-9][0-9]_*.ipynb"))
    return found


def collect(submissions: pathlib.Path, course_dir: pathlib.Path, assignment: str = ASSIGNMENT) -> list[str]:
    """Copy each student's notebooks into `course_dir/submitted/<student>/<assignment>/`; return the ids."""
    students = []
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir()):
        if not STUDENT_ID.match(folder.name):
            raise ValueError(f"submissions: {folder.name!r} is not a usable student id (letters, digits, _ . @ -)")
        notebooks = submitted_notebooks(folder)
        if not notebooks:
            print(f"{folder.name}: no NN_*.ipynb notebook found, skipped", file=sys.stderr)
            continue
        dest = course_dir / "submitted" / folder.name / assignment
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for notebook in notebooks:
            shutil.copy2(notebook, dest / notebook.name)
        students.append(folder.name)
    if not students:
        raise ValueError(f"submissions: no student folder with notebooks in {submissions}")
    return students


def autograde(course_dir: pathlib.Path, student: str, assignment: str = ASSIGNMENT, quick: bool = True) -> str:
    """Autograde one student's submission (already in `submitted/`); return nbgrader's log."""
    return nbgrader(course_dir, "autograde", assignment, "--student", student, "--force", quick=quick)


def scores(course_dir: pathlib.Path, assignment: str = ASSIGNMENT) -> list[dict[str, object]]:
    """Every grade cell of every graded submission: student, notebook, cell, score, max_score, manual."""
    from nbgrader.api import Gradebook

    rows: list[dict[str, object]] = []
    with Gradebook(f"sqlite:///{course_dir.resolve() / 'gradebook.db'}", course_id=COURSE_ID) as gb:
        for submission in gb.assignment_submissions(assignment):
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    rows.append(
                        {
                            "student": submission.student.id,
                            "notebook": notebook.name,
                            "cell": grade.name,
                            "score": float(grade.score),
                            "max_score": float(grade.max_score),
                            "needs_manual_grade": bool(grade.needs_manual_grade),
                        }
                    )
    return sorted(rows, key=lambda r: (str(r["student"]), str(r["notebook"]), str(r["cell"])))


def chapter_totals(rows: list[dict[str, object]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(student, notebook) -> (score, max_score), summed over grade cells."""
    totals: dict[tuple[str, str], tuple[float, float]] = {}
    for row in rows:
        key = (str(row["student"]), str(row["notebook"]))
        score, best = totals.get(key, (0.0, 0.0))
        totals[key] = (score + float(row["score"]), best + float(row["max_score"]))  # type: ignore[arg-type]
    return totals


def write_chapter_csv(rows: list[dict[str, object]], path: pathlib.Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "notebook", "score", "max_score"])
        for (student, notebook), (score, best) in sorted(chapter_totals(rows).items()):
            writer.writerow([student, notebook, f"{score:g}", f"{best:g}"])


def grade_folder(
    submissions: pathlib.Path,
    course_dir: pathlib.Path,
    csv_path: pathlib.Path,
    quick: bool = True,
) -> list[dict[str, object]]:
    """Autograde every student in `submissions` and export the grades; return the per-cell rows."""
    if not (course_dir / "gradebook.db").exists():
        print(f"{course_dir}: no gradebook yet, generating the assignment first", file=sys.stderr)
        build_course(course_dir)
    for student in collect(submissions, course_dir):
        print(f"{student}: autograding...", flush=True)
        autograde(course_dir, student, quick=quick)
    csv_path = csv_path.resolve()
    nbgrader(course_dir, "export", "--to", str(csv_path))
    rows = scores(course_dir)
    chapters_path = csv_path.with_name(csv_path.stem + "_by_chapter.csv")
    write_chapter_csv(rows, chapters_path)
    for (student, notebook), (score, best) in sorted(chapter_totals(rows).items()):
        print(f"{student} {notebook}: {score:g} / {best:g}")
    print(f"grades: {csv_path} (one row per student), {chapters_path} (one row per student and chapter)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    student = commands.add_parser("student", help="make the student versions of all chapters")
    student.add_argument("--out", type=pathlib.Path, default=ROOT / "student", help="folder to hand out")
    student.add_argument("--course-dir", type=pathlib.Path, default=ROOT / "classroom", help="nbgrader course dir")
    student.add_argument("--force", action="store_true", help="replace --out even if this tool did not make it")
    grade = commands.add_parser("grade", help="autograde a folder of submissions and export the grades")
    grade.add_argument("submissions", type=pathlib.Path, help="one sub-folder per student id with the notebooks")
    grade.add_argument("--course-dir", type=pathlib.Path, default=ROOT / "classroom", help="nbgrader course dir")
    grade.add_argument("--csv", type=pathlib.Path, default=pathlib.Path("grades.csv"), help="where to write grades")
    grade.add_argument("--full", action="store_true", help="run the chapters' full training (default: quick)")
    args = parser.parse_args(argv)
    if args.command == "student":
        out = make_student_folder(args.out, args.course_dir.resolve(), force=args.force)
        names = sorted(p.name for p in out.glob("*.ipynb"))
        print(f"student version of {len(names)} chapters in {out} (nbgrader course directory: {args.course_dir})")
    else:
        grade_folder(args.submissions, args.course_dir.resolve(), args.csv, quick=not args.full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
