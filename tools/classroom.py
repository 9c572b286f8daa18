"""Teach with the course: student versions, grading that can't be fooled, feedback. One assignment per chapter.

    python tools/classroom.py student  [--chapters 01 02 ...] [--out student/] [--with-solutions] [--language zh]
    python tools/classroom.py grade    SUBMISSIONS/ [--chapters ...] [--timeout 10] [--jobs N]
    python tools/classroom.py feedback [--out feedback/]
    python tools/classroom.py report

All of them work in an nbgrader course directory (`classroom/` by default, `--course-dir` for another);
docs/teaching.md is the teacher's guide.

`student` makes one nbgrader assignment per chapter from the source edition (notebooks/solutions/):
`source/NN_name/NN_name.ipynb`, then `nbgrader generate_assignment` (solution regions become
`raise NotImplementedError()`, hidden tests go, outputs are cleared, locked cells are recorded). The
chapters handed out so far are copied into `student/` with what a student needs to run them. It can be
run again at any time (a typo fixed, a chapter added): nothing graded is lost, and every earlier
release of a chapter is kept in `release_history/`.

`grade` grades each student's chapters with `transformer_lab.exercises.grading`: every answer runs in a
child process where the finished versions are unavailable, on hidden cases drawn with a seed made for
this run, and is compared in this process, which never runs a student's code. Points per case passed
(partial credit) go into nbgrader's gradebook; `grades.csv` has a row per student with each chapter's
points and the totals over the chapters graded so far; `grading_report.md` names every problem per
student (tampering, calls of finished functions, misnamed, corrupt or missing notebooks, time-outs).
One bad file never stops the others. Students are graded in parallel on the machine's cores.

A class has one language, chosen by `student --language en|zh` when its course directory is made (English
by default) and kept in the course directory: a Chinese class is handed the Chinese edition
(notebooks/zh/solutions/), whose checks, hints and solutions speak Chinese, a Chinese README, and gets
its feedback in Chinese. The grading code is the same.

`feedback` writes one HTML page per student and chapter (what passed, what did not and why), without
the teacher's paths or any copy of the package, into `feedback/<student>/<chapter>.html`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime as dt
import errno
import hashlib
import html
import json
import os
import pathlib
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
COURSE_ID = "transformer_lab"
MARKER = ".transformer_lab_student"  # marks a folder this tool made, so --out may replace it
RESULTS = "grading"  # inside the course directory: one JSON per student and chapter
CLASS_FILE = "transformer_lab_class.json"  # inside the course directory: the class's language and grading choices

NBGRADER_CONFIG = """\
# nbgrader configuration of the transformer_lab course directory, written by tools/classroom.py.
# No absolute path: the course directory is the folder of this file, wherever it is moved.
import os

c = get_config()  # noqa: F821
here = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = here
# The exchange: where `release_assignment` puts a chapter for students to `fetch`, and `submit` puts their
# work for `collect`. On one machine it lives in the course directory; on a JupyterHub, set the same
# folder (readable and writable by every user) in the system-wide /etc/jupyter/nbgrader_config.py.
c.Exchange.root = os.path.join(here, "exchange")
c.Exchange.path_includes_course = True
# A chapter may train a model for a minute or two: nbgrader's default of 30 s per cell is too short.
c.Execute.timeout = 600
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.egg-info"]
"""

STUDENT_README = """\
# Transformer Lab: your copy of the course

These are the chapters of the course your teacher has handed out so far, with the exercises left for you.

## Set up (once)

You need Python 3.11 or newer. In this folder:

    python -m venv .venv
    .venv/bin/pip install -r requirements.txt
    .venv/bin/jupyter lab

(On Windows: `.venv\\\\Scripts\\\\pip` and `.venv\\\\Scripts\\\\jupyter`. Without an NVIDIA GPU, add
`--extra-index-url https://download.pytorch.org/whl/cpu` to the pip command for a much smaller
PyTorch.) The package `transformer_lab` is in this folder, beside the notebooks, so the notebooks
import it from here: there is nothing else to install. Editing it changes nothing in your grade: your
answers are graded with your teacher's copy.

## The exercises

Each exercise is a function whose body says `# YOUR CODE HERE` and `raise NotImplementedError()`:
replace both with your code. The cell below it checks your function on a few cases and says what is
right and what is wrong; it never stops the notebook, so "Run All" always reaches the end, even with
exercises left blank. Uncomment the lines of the help cell for hints, one step at a time{solution_sentence}

## How your work is graded

Your teacher grades each answer on other inputs of the same kind as the ones the check cell shows,
so an answer that passes the check for the right reasons passes there too; each case passed earns its
share of the exercise's points. Only your answer cells are run for grading, each exercise on its own:
write each answer so that it works from the chapter's setup cell alone. An answer that calls the finished
version of what it should build (the library's function, or PyTorch's) earns nothing. The cells that
check your work are locked: keep them as they are.

## Hand in

Hand in the `.ipynb` files of the chapters you did, keeping their names, as your teacher tells you.
"""

WITH_SOLUTIONS = ", and `exercises.<name>.solution()` for a working answer."
WITHOUT_SOLUTIONS = (
    "; this version has no solutions: `exercises.<name>.solution()` says so, and the checks compare with "
    "stored answers instead."
)

STUDENT_README_ZH = """\
# Transformer Lab：你的课程副本

这里是老师目前发给你的各章，练习留给你来完成。

## 准备（只需一次）

需要 Python 3.11 或更新的版本。在这个文件夹里运行：

    python -m venv .venv
    .venv/bin/pip install -r requirements.txt
    .venv/bin/jupyter lab

（Windows 上用 `.venv\\\\Scripts\\\\pip` 和 `.venv\\\\Scripts\\\\jupyter`。没有 NVIDIA GPU 时，在 pip 命令后加上
`--extra-index-url https://download.pytorch.org/whl/cpu`，安装小得多的 PyTorch。）软件包 `transformer_lab`
就在这个文件夹里、笔记本旁边，笔记本从这里导入它：不需要再安装别的东西。修改它不会影响你的成绩：
你的答案用老师的副本评分。JupyterLab 的界面语言可在 Settings → Language 中选择中文。

## 练习

每个练习是一个函数，函数体写着 `# YOUR CODE HERE` 和 `raise NotImplementedError()`：把这两行换成你的代码。
它下面的单元格会用几个用例检查你的函数，告诉你哪里对、哪里不对；它从不让笔记本停下来，所以即使练习
还空着，“Run All”也总能运行到最后。取消帮助单元格中各行的注释，就能一步一步看到提示{solution_sentence}

## 如何评分

老师用与检查单元格同类的其他输入为每个答案评分，所以凭正确理由通过检查的答案在评分时也会通过；
每通过一个用例，就得到该练习分值中相应的一份。评分时只运行你的答案单元格，每个练习单独运行：
请让每个答案只依赖本章的设置单元格就能运行。直接调用它要你实现的现成版本（本库的函数或 PyTorch 的函数）
的答案不计分。检查你作业的单元格是锁定的：请保持原样。

## 提交

按老师的要求，提交你完成的各章 `.ipynb` 文件，不要改文件名。
"""

WITH_SOLUTIONS_ZH = "；`exercises.<名称>.solution()` 给出一个可运行的答案。"
WITHOUT_SOLUTIONS_ZH = "；这个版本没有答案：`exercises.<名称>.solution()` 会说明这一点，检查则与存储的答案比较。"

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
#: a student id (a folder of the submissions): letters and digits of any script (张三, José), then also _ . @ -; no
#: space, separator, control or format character, so that it makes one safe path part and one line of the report
STUDENT_ID = re.compile(r"^[^\W_][\w.@-]*\Z")

# ------------------------------------------------------------------ notebooks and chapters


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


def chapter_notebooks(root: pathlib.Path = ROOT, language: str = "en") -> list[pathlib.Path]:
    """The course's chapters with their answers (the source edition), in order: notebooks/solutions/NN_*.ipynb,
    or notebooks/zh/solutions/NN_*.ipynb for a Chinese class."""
    folder = root / "notebooks" / "solutions" if language == "en" else root / "notebooks" / language / "solutions"
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def class_settings(course_dir: pathlib.Path) -> dict[str, Any]:
    """What the course directory keeps about its class: {"language": ..., "predict": ...} ({} if nothing yet)."""
    path = course_dir / CLASS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def class_language(course_dir: pathlib.Path) -> str | None:
    """The language a course directory's class was made in (None for a directory `student` never made)."""
    return class_settings(course_dir).get("language")


PREDICT_CHOICES = ("count", "leave-out")


def predict_counted(course_dir: pathlib.Path) -> bool:
    """Whether the class's grade counts its predict exercises (the default) or leaves them out (`grade
    --predict leave-out`, kept by the course directory): a predict answer's points prove that the value reached
    the notebook, not that it was predicted (docs/teaching.md)."""
    return class_settings(course_dir).get("predict", "count") == "count"


def set_predict(course_dir: pathlib.Path, choice: str) -> None:
    """Keep the class's choice for its predict exercises: "count" them in the grade or "leave-out"."""
    if choice not in PREDICT_CHOICES:
        raise ValueError(f"predict: expected one of {PREDICT_CHOICES}, got {choice!r}")
    course_dir.mkdir(parents=True, exist_ok=True)
    settings = {**class_settings(course_dir), "predict": choice}
    (course_dir / CLASS_FILE).write_text(json.dumps(settings) + "\n", encoding="utf-8")


def left_out(course_dir: pathlib.Path) -> dict[str, set[str]]:
    """{chapter: grade ids} of the exercises the class's grade leaves out: its predict exercises where the class
    leaves them out (`predict_counted`), none otherwise."""
    if predict_counted(course_dir):
        return {}
    from transformer_lab.exercises.grading import exercise_kinds

    found = {}
    for folder in sorted((course_dir / "source").glob("[0-9][0-9]_*")):
        kinds = exercise_kinds(read_notebook(folder / f"{folder.name}.ipynb"))
        found[folder.name] = {grade_id for grade_id, kind in kinds.items() if kind == "predict"}
    return found


def set_class_language(course_dir: pathlib.Path, language: str) -> None:
    """Record the class's language; a class keeps the language it was made in."""
    from transformer_lab import i18n

    if language not in i18n.LANGUAGES:
        raise ValueError(f"language: expected one of {i18n.LANGUAGES}, got {language!r}")
    known = class_language(course_dir)
    released = any((course_dir / "source").glob("[0-9][0-9]_*")) if (course_dir / "source").exists() else False
    if known is None and released and language != "en":
        known = "en"  # a course directory made before classes had a language: it was English
    if known is not None and known != language:
        raise ValueError(
            f"language: the class in {course_dir} is in {known!r}, not {language!r}; a class keeps one language "
            f"(its chapters and grades are in it): make the other class in its own --course-dir"
        )
    course_dir.mkdir(parents=True, exist_ok=True)
    settings = {**class_settings(course_dir), "language": language}
    (course_dir / CLASS_FILE).write_text(json.dumps(settings) + "\n", encoding="utf-8")


def select_chapters(chapters: Sequence[str] | None, available: Sequence[pathlib.Path]) -> list[pathlib.Path]:
    """The notebooks named by `chapters` ("01", "01_attention" or a path); all of them if None."""
    if not chapters:
        return list(available)
    chosen = []
    for name in chapters:
        path = pathlib.Path(name)
        if path.suffix == ".ipynb" and path.exists():
            chosen.append(path)
            continue
        matches = [p for p in available if p.stem == name or p.name[:2] == name[:2] and len(name) == 2]
        if len(matches) != 1:
            known = ", ".join(p.stem for p in available)
            raise ValueError(f"chapters: {name!r} names no single chapter; choose from {known}")
        chosen.append(matches[0])
    return chosen


def read_notebook(path: pathlib.Path) -> dict[str, Any]:
    """A notebook as a dict, or ValueError saying why it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name} is not a valid notebook (broken JSON at line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path.name} is not a notebook (its JSON is nested too deeply)") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"{path.name} is not a notebook (no list of cells)")
    return data


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ nbgrader


def grading_env(quick: bool = True) -> dict[str, str]:
    """The environment nbgrader runs in: one thread, the reduced training setting, this interpreter first."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    if quick:
        env["TRANSFORMER_LAB_QUICK"] = "1"
    else:
        env.pop("TRANSFORMER_LAB_QUICK", None)
    return env


def nbgrader(course_dir: pathlib.Path, *args: str) -> str:
    """Run one nbgrader command in `course_dir`; return its log, raise RuntimeError with it on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course_dir,
        env=grading_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed (exit {proc.returncode}):\n{log[-6000:]}")
    return log


def write_config(course_dir: pathlib.Path) -> pathlib.Path:
    """Write the course directory's nbgrader_config.py (no absolute path in it)."""
    course_dir.mkdir(parents=True, exist_ok=True)
    path = course_dir / "nbgrader_config.py"
    path.write_text(NBGRADER_CONFIG.format(course_id=COURSE_ID), encoding="utf-8")
    return path


def gradebook(course_dir: pathlib.Path):  # noqa: ANN201 - nbgrader's Gradebook
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course_dir.resolve() / 'gradebook.db'}", course_id=COURSE_ID)


def generate_chapter(course_dir: pathlib.Path, notebook: pathlib.Path) -> str:
    """Put one chapter into `source/` and generate its release; keep the release it replaces. Return what happened."""
    chapter = notebook.stem
    source = course_dir / "source" / chapter
    target = source / notebook.name
    release = course_dir / "release" / chapter / notebook.name
    if target.exists() and digest(target) == digest(notebook) and release.exists():
        return f"{chapter}: unchanged"
    source.mkdir(parents=True, exist_ok=True)
    shutil.copy2(notebook, target)
    if release.exists():  # keep every version students may have
        history = course_dir / "release_history" / chapter
        history.mkdir(parents=True, exist_ok=True)
        version = digest(release)[:12]
        if not (history / version).exists():
            (history / version).mkdir()
            shutil.copy2(release, history / version / notebook.name)
    try:
        nbgrader(course_dir, "generate_assignment", chapter, "--force")
    except RuntimeError:
        # nbgrader refuses to change an assignment that has submissions when a grade cell changed. The
        # grades live in the gradebook and are computed by our grader, so write the release ourselves.
        write_release(course_dir, notebook)
        return f"{chapter}: regenerated (nbgrader kept its gradebook entries; release written directly)"
    return f"{chapter}: generated"


def write_release(course_dir: pathlib.Path, notebook: pathlib.Path) -> None:
    """The student version of a chapter without nbgrader: stubs, no hidden tests, no outputs, locked cells kept."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import editions
    finally:
        sys.path.pop(0)
    data = read_notebook(notebook)
    for cell in data["cells"]:
        meta = nbgrader_meta(cell)
        text = editions.source_text(cell)
        if meta.get("solution"):
            text = editions.clear_solution(text, code=cell.get("cell_type") == "code")
        if meta.get("grade") and cell.get("cell_type") == "code":
            text = editions.clear_hidden_tests(text)
        cell["source"] = editions.as_lines(text)
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    out = course_dir / "release" / notebook.stem / notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(editions.dumps(data), encoding="utf-8")


# ------------------------------------------------------------------ the student folder


def needed_assets(chapters: Sequence[pathlib.Path]) -> set[str]:
    """The package's data files the handed-out chapters use (model checkpoints, corpora)."""
    assets = {p.name for p in (ROOT / "transformer_lab" / "assets").iterdir()}
    fonts = {a for a in assets if a.endswith((".otf", ".txt")) and "CJK" in a}
    used = set(fonts)
    text = "\n".join(p.read_text(encoding="utf-8") for p in chapters)
    if "load_shipped" in text or "dates_model" in text:
        used.add("dates_model.pt")
    # chapter 09's copy model: cli.load_shipped("copy"), quoted as in a notebook's JSON (\") or in a .py file
    if re.search(r"""load_shipped\(\s*(task\s*=\s*)?\\?["']copy""", text) or "copy_model" in text:
        used.add("copy_model.pt")
    if re.search(r"shakespeare|tang|load_corpus|CORPORA", text):
        used |= {a for a in assets if a.endswith(".txt") and "CJK" not in a} | {"CORPORA.md"}
    if "gpt" in text.lower():  # chapter 10: its checkpoints and nanoGPT's training log
        used |= {a for a in assets if a.startswith(("gpt", "tang", "shakespeare"))}
    used |= {a for a in assets if a in text}  # any file a chapter names (chapters 11-12's logs and figures)
    return used & assets


def copy_package(dest: pathlib.Path, chapters: Sequence[pathlib.Path], with_solutions: bool) -> None:
    """The package for students: without caches, without data no chapter handed out needs, and (unless
    `with_solutions`) without the exercises' reference answers, whose checks then read stored answers."""
    keep = needed_assets(chapters)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in ("__pycache__",) or n.endswith(".pyc")}
        if pathlib.Path(folder).name == "assets":
            skipped |= {n for n in names if n not in keep}
        return skipped

    shutil.copytree(ROOT / "transformer_lab", dest / "transformer_lab", ignore=ignore)
    # a teacher's own exercise modules (TRANSFORMER_LAB_EXERCISES) travel with the package
    for folder in os.environ.get("TRANSFORMER_LAB_EXERCISES", "").split(os.pathsep):
        for module in sorted(pathlib.Path(folder).glob("ch*.py")) if folder else []:
            shutil.copy2(module, dest / "transformer_lab" / "exercises" / module.name)
    if not with_solutions:
        strip_solutions(dest / "transformer_lab")
        keep_stored_answers(dest / "transformer_lab" / "exercises" / "expected.pt", exercise_modules(chapters))


_EXERCISE_IMPORT = re.compile(r"from transformer_lab\.exercises import (ch\w+) as exercises")


def exercise_modules(chapters: Sequence[pathlib.Path]) -> set[str]:
    """The exercise modules (`ch01_attention`, ...) that the chapters' notebooks import as `exercises`."""
    return {m.group(1) for path in chapters for m in _EXERCISE_IMPORT.finditer(path.read_text(encoding="utf-8"))}


def keep_stored_answers(store: pathlib.Path, modules: set[str]) -> int:
    """Keep in the student version's stored answers (`expected.pt`) only those of the exercise modules handed
    out: a chapter not handed out yet has none of its answers (sealed or not) in the students' hands. Returns
    how many entries were left out."""
    import torch

    stored = torch.load(store, weights_only=False)  # the file strip_solutions just wrote, in our own folder
    kept = {key: value for key, value in stored.items() if key.split(".", 1)[0] in modules}
    torch.save(kept, store)
    return len(stored) - len(kept)


def strip_solutions(package: pathlib.Path) -> None:
    """Replace every exercise's reference by stored expected results (what `check` compares with)."""
    code = (
        "import json, sys\n"
        "sys.path.insert(0, {!r})\n"
        "from transformer_lab.exercises import answers\n"
        "print(json.dumps(answers.write_stored({!r})))\n"
    ).format(str(package.parent), str(package / "exercises"))
    env = dict(os.environ, PYTHONPATH=str(package.parent), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"could not store the expected answers:\n{proc.stderr[-3000:]}")


def make_student_folder(
    out: pathlib.Path,
    course_dir: pathlib.Path,
    notebooks: Sequence[pathlib.Path] | None = None,
    force: bool = False,
    with_solutions: bool = False,
    language: str | None = None,
) -> pathlib.Path:
    """Generate each chapter's assignment in `course_dir` and make the folder to hand out; return `out`.

    `language` ("en" or "zh") is the class's: None keeps the one the course directory has (English for a new one).
    """
    course_dir = course_dir.resolve()
    language = language or class_language(course_dir) or "en"
    notebooks = list(chapter_notebooks(language=language) if notebooks is None else notebooks)
    if not notebooks:
        raise ValueError("chapters: no chapter notebook to hand out (expected notebooks/solutions/NN_*.ipynb)")
    if out.exists() and any(out.iterdir()) and not ((out / MARKER).exists() or force):
        raise FileExistsError(f"out: {out} exists and was not made by this tool; pass --force to replace it")
    set_class_language(course_dir, language)
    write_config(course_dir)
    for notebook in notebooks:
        print(generate_chapter(course_dir, notebook), flush=True)
    released = sorted((course_dir / "release").glob("*/[0-9][0-9]_*.ipynb"))
    handed = [n for n in chapter_notebooks(language=language) if n.stem in {p.stem for p in released}]
    handed += [n for n in notebooks if n not in handed]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in released:
        shutil.copy2(path, out / path.name)
    copy_package(out, handed, with_solutions)
    shutil.copy2(ROOT / "requirements.txt", out / "requirements.txt")
    if language == "zh":
        sentence = WITH_SOLUTIONS_ZH if with_solutions else WITHOUT_SOLUTIONS_ZH
        (out / "README.md").write_text(STUDENT_README_ZH.format(solution_sentence=sentence), encoding="utf-8")
    else:
        sentence = WITH_SOLUTIONS if with_solutions else WITHOUT_SOLUTIONS
        (out / "README.md").write_text(STUDENT_README.format(solution_sentence=sentence), encoding="utf-8")
    (out / MARKER).write_text("made by tools/classroom.py student\n", encoding="utf-8")
    return out


# ------------------------------------------------------------------ collecting submissions


def _normal(stem: str) -> str:
    """A file stem without what browsers and copies add: " (1)", "-copy", "Copy of ", case, separators."""
    stem = stem.lower()
    stem = re.sub(r"^copy of ", "", stem)
    stem = re.sub(r"[\s_-]*(\(\d+\)|copy(\s*\d+)?|-\d+|\s\d+)$", "", stem)
    return re.sub(r"[\s_-]+", "_", stem).strip("_")


#: the largest notebook graded (bytes); a larger one is one line in the report, not graded. The course's own
#: chapters with their outputs are under 1 MB; a student's with every figure drawn stays well under this.
MAX_NOTEBOOK_BYTES = 16 << 20
#: how deep a student's folder is searched for notebooks, and how many entries of it are looked at
MAX_FOLDER_DEPTH = 8
MAX_FOLDER_ENTRIES = 5000
#: an archive handed in instead of a folder: at most this many members and this many bytes unpacked
MAX_ARCHIVE_MEMBERS = 10000
MAX_ARCHIVE_BYTES = 1 << 30


#: the key of notes about the submissions folder itself (a folder that is no student's): no student id starts so
FOLDER_NOTES = "(submissions folder)"


def shown_name(name: str, limit: int = 80) -> str:
    """A file or folder name a student chose, as the report and notes show it: one line, no control characters,
    cut to `limit` characters (a newline in a name can no longer start a section of the report)."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else "?" for c in str(name))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(mode: int) -> str:
    """What a file-system entry that is not a regular file is, in words."""
    for test, words in (
        (stat.S_ISLNK, "a symbolic link (links are never followed)"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def find_notebooks(folder: pathlib.Path) -> tuple[list[pathlib.Path], list[str]]:
    """The regular files named `*.ipynb` in a student's folder and below it, never following a symbolic link
    (to a file or a folder); and a note for each entry named like a notebook that is not a regular file (a
    link, a folder, a FIFO, a device), which is not graded. `.ipynb_checkpoints` folders are skipped."""
    files: list[pathlib.Path] = []
    notes: list[str] = []
    seen = 0
    pending = [(folder, 0)]
    while pending:
        here, depth = pending.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"{shown_name(here.name)}/: could not be read ({exc.strerror}): not graded")
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                notes.append(f"more than {MAX_FOLDER_ENTRIES} files and folders: the rest was not looked at")
                return files, notes
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            path = pathlib.Path(entry.path)
            shown = shown_name(str(path.relative_to(folder)))
            if stat.S_ISDIR(mode):
                if entry.name.endswith(".ipynb"):
                    notes.append(f"{shown}: {_kind(mode)}, not a notebook: not graded")
                if entry.name == ".ipynb_checkpoints":
                    continue
                if depth + 1 < MAX_FOLDER_DEPTH:
                    pending.append((path, depth + 1))
                continue
            if not entry.name.endswith(".ipynb"):
                continue
            if stat.S_ISREG(mode):
                files.append(path)
            else:
                notes.append(f"{shown}: {_kind(mode)}, not a notebook file: not graded (only regular files are)")
    return sorted(files), notes


def read_regular(path: pathlib.Path, limit: int | None = None) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes (MAX_NOTEBOOK_BYTES if None), opened
    without following a link and without waiting on a FIFO; else ValueError saying what it is."""
    limit = MAX_NOTEBOOK_BYTES if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{shown_name(path.name)} is a symbolic link (links are never followed)") from None
        raise ValueError(f"{shown_name(path.name)} could not be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{shown_name(path.name)} is {_kind(info.st_mode)}, not a notebook file")
        if info.st_size > limit:
            raise ValueError(
                f"{shown_name(path.name)} is {info.st_size / 2**20:.1f} MiB, more than the {limit / 2**20:g} MiB "
                f"a notebook may have (clear the outputs and hand it in again)"
            )
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{shown_name(path.name)} is more than the {limit / 2**20:g} MiB a notebook may have")
    return data


def unpack_archive(archive: pathlib.Path, dest: pathlib.Path) -> dict[str, list[str]]:
    """Unpack a zip archive of submissions (one folder per student) into `dest`, keeping only regular files:
    a symbolic link, an absolute path or a path with `..` in it is left out with a note, and the archive may
    hold at most MAX_ARCHIVE_MEMBERS members and MAX_ARCHIVE_BYTES bytes once unpacked. Returns the notes, per
    student (the member's first folder) or under FOLDER_NOTES."""
    import zipfile

    notes: dict[str, list[str]] = {}

    def note(name: str, text: str) -> None:
        first = name.replace("\\", "/").lstrip("/").split("/", 1)[0]
        inside = not name.startswith(("/", "\\")) and "/" in name.replace("\\", "/")
        key = first if inside and STUDENT_ID.match(first) else FOLDER_NOTES
        notes.setdefault(key, []).append(f"{shown_name(name)}: {text}")

    if not zipfile.is_zipfile(archive):
        raise ValueError(f"submissions: {archive} is neither a folder nor a zip archive")
    with zipfile.ZipFile(archive) as zipped:
        members = zipped.infolist()
        if len(members) > MAX_ARCHIVE_MEMBERS:
            raise ValueError(
                f"submissions: {archive.name} holds {len(members)} members, more than {MAX_ARCHIVE_MEMBERS}"
            )
        total = 0
        for member in members:
            name = member.filename
            mode = member.external_attr >> 16
            parts = pathlib.PurePosixPath(name.replace("\\", "/")).parts
            if member.is_dir():
                continue
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: an archiver that stores no file type
                note(name, f"{_kind(mode)} in the archive: left out")
                continue
            if not parts or name.startswith("/") or ".." in parts or any(":" in p for p in parts[:1]):
                note(name, "a path outside the archive's folder: left out")
                continue
            total += member.file_size
            if total > MAX_ARCHIVE_BYTES or member.file_size > MAX_NOTEBOOK_BYTES and name.endswith(".ipynb"):
                note(name, "too large once unpacked: left out")
                total -= member.file_size
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipped.open(member) as source, open(target, "xb") as out:
                left = member.file_size + 1  # never more than the member says it holds
                while left > 0:
                    chunk = source.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    out.write(chunk)
                    left -= len(chunk)
    return notes


def match_chapters(files: Sequence[pathlib.Path], chapters: Sequence[str]) -> tuple[dict[str, pathlib.Path], list[str]]:
    """Which file is which chapter: {chapter: file}, and notes on every file not named exactly."""
    found: dict[str, pathlib.Path] = {}
    notes: list[str] = []
    for path in sorted(files, key=lambda p: (p.lstat().st_mtime, p.name)):
        if path.stem in chapters:
            chapter = path.stem
        else:
            normal = _normal(path.stem)
            candidates = [c for c in chapters if _normal(c) == normal] or [
                c for c in chapters if normal[:2].isdigit() and c[:2] == normal[:2]
            ]
            if len(candidates) != 1:
                notes.append(f"{shown_name(path.name)}: matches no chapter, not graded")
                continue
            chapter = candidates[0]
            notes.append(f"{shown_name(path.name)}: graded as {chapter}.ipynb (misnamed)")
        if chapter in found:
            notes.append(
                f"{shown_name(found[chapter].name)} and {shown_name(path.name)} are both {chapter}: the newer one, "
                f"{shown_name(path.name)}, is graded"
            )
        found[chapter] = path
    return found, notes


def collect(
    submissions: pathlib.Path, course_dir: pathlib.Path, chapters: Sequence[str]
) -> tuple[dict[str, dict[str, pathlib.Path]], dict[str, list[str]]]:
    """Each student's notebooks, copied into nbgrader's `submitted/<student>/<chapter>/`; and notes per student.

    Only regular files are graded: a symbolic link is never followed (a student folder that is a link, a link
    named like a notebook, a link to a folder), and a folder, a FIFO or a device named like a notebook is a note
    for that student, not an error for the class. Notes about entries of `submissions` that are no student's go
    under FOLDER_NOTES."""
    students: dict[str, dict[str, pathlib.Path]] = {}
    notes: dict[str, list[str]] = {}
    if not submissions.is_dir():
        raise ValueError(f"submissions: {submissions} is not a folder (expected one sub-folder per student)")
    for entry in sorted(os.scandir(submissions), key=lambda e: e.name):
        folder = pathlib.Path(entry.path)
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue
        if not stat.S_ISDIR(mode):
            if stat.S_ISLNK(mode) or entry.name.endswith(".ipynb"):
                notes.setdefault(FOLDER_NOTES, []).append(
                    f"{shown_name(entry.name)}: {_kind(mode)} in the submissions folder, not a student's folder: "
                    "not graded"
                )
            continue
        if not STUDENT_ID.match(folder.name):
            notes.setdefault(FOLDER_NOTES, []).append(
                f"folder {shown_name(folder.name)!r} is not a usable student id (letters, digits, _ . @ -): not graded"
            )
            continue
        files, walk_notes = find_notebooks(folder)
        found, found_notes = match_chapters(files, chapters)
        notes.setdefault(folder.name, []).extend(walk_notes + found_notes)
        students[folder.name] = {}
        for chapter, path in found.items():
            dest = course_dir / "submitted" / folder.name / chapter
            try:
                if path.resolve() == (dest / f"{chapter}.ipynb").resolve():  # nbgrader's collect put it there
                    read_regular(path)  # still a regular file of a sane size
                    students[folder.name][chapter] = path
                    continue
                data = read_regular(path)
            except ValueError as exc:
                notes[folder.name].append(f"{exc}: not graded")
                continue
            if dest.is_symlink():
                dest.unlink()
            elif dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            (dest / f"{chapter}.ipynb").write_bytes(data)
            stamp = dt.datetime.fromtimestamp(path.lstat().st_mtime, dt.UTC).isoformat()
            (dest / "timestamp.txt").write_text(stamp, encoding="utf-8")
            students[folder.name][chapter] = dest / f"{chapter}.ipynb"
        if not students[folder.name]:
            notes[folder.name].append("no notebook of a graded chapter found")
    return students, notes


# ------------------------------------------------------------------ grading


SECRET_FILE = ".grading_secret"  # inside the course directory: the class's one secret (hidden cases' seed)


def class_secret(course_dir: pathlib.Path) -> int:
    """The class's secret, made on first use and kept (readable by the teacher only): a re-grade of the same
    submissions draws the same hidden cases and gives the same grades (each submission's own, drawn from this
    secret, the student and its answer cells: `grading.submission_secret`). It never enters a sandbox."""
    path = course_dir / SECRET_FILE
    if path.exists():
        return int(path.read_text(encoding="utf-8").strip())
    course_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.randbits(62)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(f"{value}\n")
    return value


def grade_one(
    course_dir: pathlib.Path,
    student: str,
    chapter: str,
    path: pathlib.Path,
    secret: int,
    timeout: float,
    session: Any = None,
    sandbox: Any = None,
    chapter_timeout: float | None = None,
) -> dict[str, Any]:
    """Grade one student's chapter in that student's sandbox (`sandbox`: a StudentSandbox, kept for the student's
    other chapters; else one is made for this chapter from `session`, a GradingSession, itself made sandboxed if
    None); return the plain record saved in `grading/<student>/<chapter>.json`."""
    from transformer_lab.exercises.grading import default_session, grade_notebook

    session = sandbox.session if sandbox is not None else session or default_session()
    teacher = read_notebook(course_dir / "source" / chapter / f"{chapter}.ipynb")
    record: dict[str, Any] = {
        "student": student,
        "chapter": chapter,
        "exercises": [],
        "problems": [],
        "sandboxed": bool(session.sandbox),
    }
    try:
        submitted = read_notebook(path)
    except ValueError as exc:
        record["problems"].append(f"{exc}: 0 points for this chapter")
        submitted = None
    if submitted is not None:
        result = grade_notebook(
            teacher,
            submitted,
            chapter,
            secret,
            cell_timeout=timeout,
            session=session,
            sandbox=sandbox,
            chapter_timeout=chapter_timeout,
            student=student,
        )
        record["problems"] += result.problems
        for grade_id, grade in result.exercises:
            record["exercises"].append(
                {
                    "grade_id": grade_id,
                    "exercise": grade.exercise,
                    "points": grade.points,
                    "max_points": grade.max_points,
                    "cases": [[ok, text] for ok, text in grade.cases],
                    "refused": list(grade.refused),
                    "fused": list(grade.fused),
                }
            )
    # the chapter's exercises that were not graded (unreadable notebook) score 0 of their points
    graded = {e["grade_id"] for e in record["exercises"]}
    for cell in teacher["cells"]:
        meta = nbgrader_meta(cell)
        if meta.get("grade") and meta.get("grade_id") not in graded:
            record["exercises"].append(
                {
                    "grade_id": meta["grade_id"],
                    "exercise": meta["grade_id"],
                    "points": 0.0,
                    "max_points": float(meta.get("points", 1)),
                    "cases": [],
                }
            )
    save_record(course_dir, record)
    return record


def grade_student(
    course_dir: pathlib.Path,
    student: str,
    chapters: dict[str, pathlib.Path],
    secret: int,
    timeout: float,
    session: Any,
    chapter_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Grade one student's chapters ({chapter: notebook}) one after another in one sandbox of the student's own
    (started again if an answer stopped it); return their records. A chapter that cannot be graded gets a record
    that says why, and the student's other chapters are still graded."""
    from transformer_lab.exercises.grading import StudentSandbox

    records = []
    with StudentSandbox(session) as sandbox:
        for chapter, path in chapters.items():
            try:
                record = grade_one(
                    course_dir,
                    student,
                    chapter,
                    path,
                    secret,
                    timeout,
                    sandbox=sandbox,
                    chapter_timeout=chapter_timeout,
                )
            except Exception as exc:  # never stop the class at one student
                record = {
                    "student": student,
                    "chapter": chapter,
                    "exercises": [],
                    "problems": [f"could not be graded ({type(exc).__name__}: {exc})"],
                    "sandboxed": session.sandbox,
                }
                save_record(course_dir, record)
            records.append(record)
            print(f"{student} {chapter}: {sum(e['points'] for e in record['exercises']):g} points", flush=True)
    return records


def save_record(course_dir: pathlib.Path, record: dict[str, Any]) -> None:
    """Write one record atomically (a crash mid-write never leaves half a record)."""
    out = course_dir / RESULTS / record["student"] / f"{record['chapter']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, out)


def write_gradebook(course_dir: pathlib.Path, record: dict[str, Any]) -> None:
    """Put one record's scores into nbgrader's gradebook (the grade cells' auto scores)."""
    from nbgrader.api import MissingEntry

    with gradebook(course_dir) as gb, warnings.catch_warnings():
        # nbgrader builds a submission's rows before adding them to its session; SQLAlchemy warns about it
        warnings.filterwarnings("ignore", message=".*not in session.*")
        gb.update_or_create_student(record["student"])
        gb.update_or_create_submission(record["chapter"], record["student"])
        for exercise in record["exercises"]:
            try:
                grade = gb.find_grade(exercise["grade_id"], record["chapter"], record["chapter"], record["student"])
            except MissingEntry:
                continue  # a grade cell the gradebook does not know (added after the release): kept in our tables
            grade.auto_score = exercise["points"]
        gb.db.commit()


def load_records(course_dir: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted((course_dir / RESULTS).glob("*/*.json"))]


def grade_folder(
    submissions: pathlib.Path,
    course_dir: pathlib.Path,
    csv_path: pathlib.Path | None = None,
    chapters: Sequence[str] | None = None,
    timeout: float = 10.0,
    jobs: int | None = None,
    secret: int | None = None,
    write_gb: bool = True,
    sandbox: bool = True,
    limits: Any = None,
    chapter_timeout: float | None = None,
    predict: str | None = None,
) -> list[dict[str, Any]]:
    """Grade every student's chapters in `submissions`; write the gradebook, tables and report; return the records.

    Each student's submissions run in a sandbox of the student's own (`transformer_lab.exercises.sandbox`, one for
    all their chapters, students graded in parallel on `jobs` threads); where none can be made
    this raises SandboxUnavailable unless `sandbox` is False (then the report says so on its first line).
    `limits` (a sandbox.Limits) sets its memory and CPU time. `secret` seeds the hidden cases; leave it None
    (the class's own secret, kept in the course directory, so a re-grade gives the same grades) except in a test.
    `write_gb=False` skips nbgrader's gradebook (a course directory `student` did not make). `chapter_timeout`
    bounds the wall clock of one student's chapter (`grading.chapter_limit(timeout)` if None).
    `submissions` may also be a zip archive of the class's folders (`unpack_archive`: regular files only).
    `predict` ("count" or "leave-out"; None: the class's choice so far, "count" at first) says whether the tables
    and the feedback count the predict exercises; the course directory keeps it.
    """
    from transformer_lab.exercises.grading import GradingSession

    if predict is not None and predict not in PREDICT_CHOICES:
        raise ValueError(f"predict: expected one of {PREDICT_CHOICES}, got {predict!r}")
    course_dir = course_dir.resolve()
    released = sorted(p.name for p in (course_dir / "source").glob("[0-9][0-9]_*") if p.is_dir())
    if not released:
        raise ValueError(f"course-dir: {course_dir} has no chapter yet: run `classroom.py student` first")
    if chapters:
        unknown = [c for c in chapters if not any(r == c or r[:2] == c[:2] for r in released)]
        if unknown:
            raise ValueError(f"chapters: {unknown} were never handed out; handed out: {released}")
        released = [r for r in released if any(r == c or (len(c) == 2 and r[:2] == c) for c in chapters)]
    archive_notes: dict[str, list[str]] = {}
    unpacked = None
    if submissions.is_file() and not submissions.is_symlink():  # a zip of the class's folders
        unpacked = tempfile.TemporaryDirectory(prefix="tl-submissions-")
        archive_notes = unpack_archive(submissions, pathlib.Path(unpacked.name))
        submissions = pathlib.Path(unpacked.name)
    try:
        students, notes = collect(submissions, course_dir, released)
    finally:
        if unpacked is not None:
            unpacked.cleanup()
    for key, lines in archive_notes.items():
        notes.setdefault(key, [])[:0] = lines
    if predict is not None:
        set_predict(course_dir, predict)
    session = GradingSession(limits, sandbox=sandbox, hide=(str(course_dir), str(submissions.resolve())))
    if secret is None:
        secret = class_secret(course_dir)  # hidden cases: a seed no student can know, the same at every re-grade
    jobs = jobs or max(1, min(len(os.sched_getaffinity(0)), 8))
    records = []
    from transformer_lab import i18n

    try:
        # the students' messages in the class's language (one process-wide setting: every grader thread shares it);
        # one task per student: a student's chapters share the student's sandbox (its start paid once)
        with i18n.language(class_language(course_dir) or "en"), concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = [
                pool.submit(grade_student, course_dir, student, found, secret, timeout, session, chapter_timeout)
                for student, found in students.items()
                if found
            ]
            for future in concurrent.futures.as_completed(futures):
                records += future.result()
    finally:
        session.close()
    for record in records if write_gb else []:
        write_gradebook(course_dir, record)
    notes_path = course_dir / RESULTS / "notes.json"
    previous = json.loads(notes_path.read_text(encoding="utf-8")) if notes_path.exists() else {}
    for student, lines in notes.items():
        previous[student] = lines
    for student in students:
        missing = [c for c in released if c not in students[student]]
        if missing:
            previous.setdefault(student, [])
            previous[student] = [n for n in previous[student] if not n.startswith("not handed in")]
            previous[student].append(f"not handed in this time: {', '.join(missing)}")
    notes_path.parent.mkdir(parents=True, exist_ok=True)
    notes_path.write_text(json.dumps(previous, indent=1), encoding="utf-8")
    write_tables(course_dir, csv_path or course_dir / "grades.csv")
    return records


def chapter_maxima(course_dir: pathlib.Path, leave: dict[str, set[str]] | None = None) -> dict[str, float]:
    """Each handed-out chapter's points, from the teacher's source, less those of the exercises `leave` names
    ({chapter: grade ids}, `left_out`)."""
    maxima = {}
    for folder in sorted((course_dir / "source").glob("[0-9][0-9]_*")):
        data = read_notebook(folder / f"{folder.name}.ipynb")
        skip = (leave or {}).get(folder.name, set())
        maxima[folder.name] = sum(
            float(nbgrader_meta(c).get("points", 1))
            for c in data["cells"]
            if nbgrader_meta(c).get("grade") and nbgrader_meta(c).get("grade_id") not in skip
        )
    return maxima


def counted(record: dict[str, Any], leave: dict[str, set[str]]) -> float:
    """A record's points, less those of the exercises `leave` names ({chapter: grade ids})."""
    skip = leave.get(record["chapter"], set())
    return sum(e["points"] for e in record["exercises"] if e.get("grade_id") not in skip)


def write_tables(course_dir: pathlib.Path, csv_path: pathlib.Path) -> None:
    """grades.csv (a row per student: each chapter, total, out of the chapters graded so far), the per-chapter
    and per-exercise tables beside it, and grading_report.md."""
    records = load_records(course_dir)
    leave = left_out(course_dir)
    maxima = chapter_maxima(course_dir, leave)
    graded = sorted({r["chapter"] for r in records})
    students = sorted({r["student"] for r in records} | {s for s in _notes(course_dir) if STUDENT_ID.match(s)})
    by = {(r["student"], r["chapter"]): r for r in records}
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", *graded, "total", "max_total"])
        for student in students:
            points = [counted(by[(student, c)], leave) if (student, c) in by else 0.0 for c in graded]
            writer.writerow(
                [student, *(f"{p:g}" for p in points), f"{sum(points):g}", f"{sum(maxima[c] for c in graded):g}"]
            )
    with csv_path.with_name(csv_path.stem + "_by_chapter.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "chapter", "score", "max_score"])
        for student in students:
            for chapter in graded:
                record = by.get((student, chapter))
                score = counted(record, leave) if record else 0.0
                writer.writerow([student, chapter, f"{score:g}", f"{maxima[chapter]:g}"])
    with csv_path.with_name(csv_path.stem + "_by_exercise.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "chapter", "exercise", "cases_passed", "cases", "score", "max_score"])
        for record in sorted(records, key=lambda r: (r["student"], r["chapter"])):
            for e in record["exercises"]:
                passed = sum(ok for ok, _ in e["cases"])
                writer.writerow(
                    [
                        record["student"],
                        record["chapter"],
                        e["exercise"],
                        passed,
                        len(e["cases"]),
                        f"{e['points']:g}",
                        f"{e['max_points']:g}",
                    ]
                )
    write_report(course_dir, records, students, leave)


def _notes(course_dir: pathlib.Path) -> dict[str, list[str]]:
    path = course_dir / RESULTS / "notes.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


#: the most characters of one problem the report shows (an error message is cut there)
REPORT_LINE = 400
#: what could make a link, an image, an HTML tag or entity, a table or a heading of a student's text (emphasis and
#: code spans stay: they forge nothing, and the grader's own messages quote names in backticks)
_MARKDOWN = re.compile(r"([\\\[\]<>&!|#])")


def md(text: object, limit: int = REPORT_LINE) -> str:
    """Text a student controls (a file name, an error message, an answer's output) made safe for one line of
    the markdown report: every line break and control character becomes a visible escape, markdown and HTML
    characters are escaped (no heading, list item, link, image or tag can be forged), and it is cut to `limit`
    characters."""
    flat = "".join(c if c.isprintable() else ("⏎" if c in "\r\n" else " ") for c in str(text))
    flat = " ".join(flat.split())
    if len(flat) > limit:
        flat = flat[: limit - 3] + "..."
    return _MARKDOWN.sub(r"\\\1", flat)


def write_report(
    course_dir: pathlib.Path,
    records: list[dict[str, Any]],
    students: Sequence[str],
    leave: dict[str, set[str]] | None = None,
) -> pathlib.Path:
    """grading_report.md: every problem of every student, one section each; honest students have none. `leave`
    ({chapter: grade ids}, `left_out`): the exercises the grade leaves out, named at the top."""
    notes = _notes(course_dir)
    skipped = [
        f"{md(chapter)} {md(grade_id)}" for chapter, ids in sorted((leave or {}).items()) for grade_id in sorted(ids)
    ]
    unsandboxed = sorted({f"{r['student']}/{r['chapter']}" for r in records if r.get("sandboxed") is False})
    lines = [
        *(
            [
                f"**WARNING: {len(unsandboxed)} submission(s) of this class were graded WITHOUT a sandbox "
                f"(--no-sandbox): their code could read and change what the grading account can.** "
                f"({', '.join(unsandboxed[:10])}{', ...' if len(unsandboxed) > 10 else ''})",
                "",
            ]
            if unsandboxed
            else []
        ),
        "# Grading report",
        "",
        "Every problem the grader saw, per student. A student with none is not listed below.",
        "",
        *(
            [
                f"The grade leaves out the predict exercises ({len(skipped)}: {', '.join(skipped)}): "
                "grades.csv, grades_by_chapter.csv and the feedback's totals count none of their points "
                "(grades_by_exercise.csv still lists them).",
                "",
            ]
            if skipped
            else []
        ),
    ]
    clean = []
    if notes.get(FOLDER_NOTES):
        lines += [
            "## Not graded: entries of the submissions folder",
            "",
            *(f"- {md(n)}" for n in notes[FOLDER_NOTES]),
            "",
        ]
    for student in students:
        problems = [f"- {md(n)}" for n in notes.get(student, []) if not n.startswith("not handed in")]
        missing = [md(n) for n in notes.get(student, []) if n.startswith("not handed in")]
        for record in sorted((r for r in records if r["student"] == student), key=lambda r: r["chapter"]):
            problems += [f"- {md(record['chapter'])}: {md(p)}" for p in record["problems"]]
        if problems:
            lines += [f"## {md(student)}", "", *problems, *([f"- ({missing[0]})"] if missing else []), ""]
        else:
            clean.append(md(student) + (f" ({missing[0]})" if missing else ""))
    lines += ["## No problem", "", *(f"- {s}" for s in clean), ""]
    path = course_dir / "grading_report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------ feedback

FEEDBACK_STYLE = (
    "body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.4}"
    ".ok{color:#1a7f37}.no{color:#cf222e}td,th{padding:.2em .6em;text-align:left;vertical-align:top}"
)


def feedback(course_dir: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """One HTML page per student and chapter, in the class's language: points, and each case passed or not
    with the reason."""
    from transformer_lab import i18n

    written = []
    language = class_language(course_dir) or "en"
    leave = left_out(course_dir)
    for record in load_records(course_dir):
        with i18n.language(language):
            body = _feedback_body(record, leave.get(record["chapter"], set()))
        lang = "zh-CN" if language == "zh" else "en"
        page = (
            f"<!doctype html><html lang='{lang}'><meta charset='utf-8'><title>{html.escape(record['chapter'])}</title>"
        )
        page += f"<style>{FEEDBACK_STYLE}</style>" + "\n".join(body)
        # nbgrader's layout, so that `nbgrader release_feedback` can hand the pages back through the exchange
        path = out / record["student"] / record["chapter"] / f"{record['chapter']}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
        # what `nbgrader release_feedback` reads to address the page to the student's own submission
        submitted = course_dir / "submitted" / record["student"] / record["chapter"]
        for name in ("timestamp.txt", "submission_secret.txt"):
            if (submitted / name).exists():
                shutil.copy2(submitted / name, path.parent / name)
        written.append(path)
    return written


def _feedback_body(record: dict[str, Any], skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """The HTML of one student's chapter, in the language in use; the exercises whose grade ids `skip` holds
    (predict exercises the class leaves out) say so and count in no total."""
    from transformer_lab.i18n import message

    def points(got: float, most: float) -> str:
        return message("feedback.points", got=f"{got:g}", most=f"{most:g}")

    body = [f"<h1>{html.escape(record['chapter'])}{message('feedback.title')}</h1>"]
    total = sum(e["points"] for e in record["exercises"] if e.get("grade_id") not in skip)
    most = sum(e["max_points"] for e in record["exercises"] if e.get("grade_id") not in skip)
    body.append(f"<p><b>{points(total, most)}</b> {message('feedback.intro')}</p>")
    for problem in record["problems"]:
        body.append(f"<p class='no'>{message('feedback.note')}{html.escape(_public(problem))}</p>")
    for e in record["exercises"]:
        aside = f" {message('feedback.left_out')}" if e.get("grade_id") in skip else ""
        body.append(f"<h2>{html.escape(e['exercise'])}: {points(e['points'], e['max_points'])}{aside}</h2><table>")
        for ok, text in e["cases"]:
            mark = "<span class='ok'>✓</span>" if ok else "<span class='no'>✗</span>"
            body.append(f"<tr><td>{mark}</td><td>{html.escape(_public(text))}</td></tr>")
        if not e["cases"]:
            body.append(f"<tr><td></td><td>{message('feedback.not_graded')}</td></tr>")
        body.append("</table>")
    return body


def _public(text: str) -> str:
    """A message without file-system paths (a student reads it)."""
    return re.sub(r"(/[\w.@+-]+){2,}/?", "<path>", text)


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course-dir", type=pathlib.Path, default=ROOT / "classroom", help="nbgrader course dir")
    commands = parser.add_subparsers(dest="command", required=True)
    student = commands.add_parser("student", help="make the student version of some or all chapters")
    student.add_argument("--chapters", nargs="*", help="chapters to hand out, e.g. 01 02 (default: all)")
    student.add_argument("--out", type=pathlib.Path, default=ROOT / "student", help="folder to hand out")
    student.add_argument("--force", action="store_true", help="replace --out even if this tool did not make it")
    student.add_argument("--with-solutions", action="store_true", help="keep solution() and the references")
    student.add_argument(
        "--language",
        choices=("en", "zh"),
        default=None,
        help="the class's language: en (default for a new class) or zh, the Chinese edition; kept by the course dir",
    )
    grade = commands.add_parser("grade", help="grade a folder of submissions")
    grade.add_argument(
        "submissions", type=pathlib.Path, help="one sub-folder per student id with the notebooks, or a zip of them"
    )
    grade.add_argument("--chapters", nargs="*", help="grade only these chapters")
    grade.add_argument("--csv", type=pathlib.Path, default=None, help="grade table (default: COURSE_DIR/grades.csv)")
    grade.add_argument("--timeout", type=float, default=10.0, help="seconds per answer cell and per case")
    grade.add_argument("--jobs", type=int, default=None, help="parallel graders (default: the cores)")
    grade.add_argument(
        "--chapter-timeout",
        type=float,
        default=None,
        help="wall-clock seconds per student and chapter (default: 12 x --timeout, at least 60)",
    )
    grade.add_argument(
        "--no-sandbox",
        action="store_true",
        help="grade without a sandbox where none can be made (students' code can then reach your account; "
        "the report says so on its first line)",
    )
    predict_help = (
        "count the predict exercises in the grade, or leave them out (their points prove that the value reached "
        "the notebook, not that it was predicted: docs/teaching.md); the course directory keeps the choice "
        "(at first: count)"
    )
    grade.add_argument("--predict", choices=PREDICT_CHOICES, default=None, help=predict_help)
    grade.add_argument("--memory", type=int, default=None, help="MiB of address space per sandboxed process (3072)")
    grade.add_argument("--cpu-time", type=int, default=None, help="CPU seconds per submission's sandbox (600)")
    fb = commands.add_parser("feedback", help="HTML feedback per student and chapter")
    fb.add_argument("--out", type=pathlib.Path, default=None, help="default: COURSE_DIR/feedback")
    report = commands.add_parser("report", help="rewrite the grade tables and the report from the stored grades")
    report.add_argument("--predict", choices=PREDICT_CHOICES, default=None, help=predict_help)
    args = parser.parse_args(argv)
    course_dir = args.course_dir.resolve()
    if args.command == "student":
        language = args.language or class_language(course_dir) or "en"
        chosen = select_chapters(args.chapters, chapter_notebooks(language=language))
        out = make_student_folder(
            args.out, course_dir, chosen, force=args.force, with_solutions=args.with_solutions, language=language
        )
        names = sorted(p.name for p in out.glob("*.ipynb"))
        print(f"student version of {len(names)} chapters in {out} (course directory: {course_dir})")
    elif args.command == "grade":
        if args.timeout <= 0:
            parser.error("--timeout must be a positive number of seconds")
        if args.jobs is not None and args.jobs < 1:
            parser.error("--jobs must be at least 1")
        if args.chapter_timeout is not None and args.chapter_timeout < args.timeout:
            parser.error("--chapter-timeout must be at least --timeout (seconds per student and chapter)")
        from transformer_lab.exercises.grading import Limits, SandboxUnavailable

        try:
            defaults = Limits()
            limits = Limits(
                memory_mib=args.memory or defaults.memory_mib, cpu_seconds=args.cpu_time or defaults.cpu_seconds
            )
        except ValueError as exc:
            parser.error(f"--{str(exc).split(':')[0].replace('_mib', '').replace('_seconds', '-time')}: {exc}")
        try:
            grade_folder(
                args.submissions,
                course_dir,
                args.csv,
                args.chapters,
                args.timeout,
                args.jobs,
                sandbox=not args.no_sandbox,
                limits=limits,
                chapter_timeout=args.chapter_timeout,
                predict=args.predict,
            )
        except SandboxUnavailable as exc:
            print(f"classroom.py grade: no sandbox: {exc}", file=sys.stderr)
            return 2
        print(f"grades: {args.csv or course_dir / 'grades.csv'}; problems: {course_dir / 'grading_report.md'}")
    elif args.command == "feedback":
        written = feedback(course_dir, args.out or course_dir / "feedback")
        print(f"{len(written)} feedback pages in {args.out or course_dir / 'feedback'}")
    else:
        if args.predict is not None:
            set_predict(course_dir, args.predict)
        write_tables(course_dir, course_dir / "grades.csv")
        print(f"grades: {course_dir / 'grades.csv'}; problems: {course_dir / 'grading_report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
