"""Grade a two-student Chinese class into OUT, and write a digest of every file there (tests/test_locale_gbk.py).

    python tests/classroom_locale_writer.py OUT CHAPTER_SOURCE REPOSITORY [--no-sandbox]

Run once under zh_CN.GBK and once under C.UTF-8: the two digests must be equal. In a folder whose name has spaces
and Chinese characters (`张三 的 课程/`), it does what a teacher does with `tools/classroom.py`, through its command
line (REPOSITORY's `tools/classroom.py` and `transformer_lab`: a frozen copy of the repository's, so that both runs
grade with the same code while the repository changes). It makes the student version of chapter 01 in Chinese
(CHAPTER_SOURCE, a frozen copy of its Chinese source edition), then grades two students with Chinese names: 张三
hands in the source edition under a Chinese title (`01_注意力机制.ipynb`, graded as 01_attention, misnamed), 李四
the student version, blank, and a notes file in Chinese that is not a notebook. It grades with two jobs, writes the
feedback, rewrites the report leaving the predict exercises out, and saves what the commands print as UTF-8.

The class's secret is written before grading, so that both runs draw the same hidden cases. The digest,
OUT/digest.json, names each file by its path (as this process decodes it) and gives its SHA-256; a torch file is
given by what it holds (tests/locale_writer.py's `canonical`), with each sealed predict answer by its form alone
(its salt is drawn afresh for every student version, by design: `answers.write_stored`). Left out, as timestamps:
nbgrader's gradebook (an SQLite file of submission times) and the `timestamp.txt` of each submission.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # REPOSITORY's transformer_lab, before anything imports the package
    sys.path.insert(0, str(Path(sys.argv[3]).resolve()))
sys.path.insert(1, str(HERE))
from locale_writer import canonical  # noqa: E402

TIMESTAMPS = ("gradebook.db", "timestamp.txt")


def load_classroom(root: Path):  # noqa: ANN201 - ROOT/tools/classroom.py as a module (tools/ is not a package)
    spec = importlib.util.spec_from_file_location("classroom", root / "tools" / "classroom.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run(classroom, argv: list[str]) -> str:  # noqa: ANN001 - the classroom module
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = classroom.main(argv)
    assert status == 0, (argv, status)
    return out.getvalue()


def unsalted(value: object) -> object:
    """A stored-answers file's contents without what its salt decides: a sealed answer (a dict with a "salt") by
    its form, an encrypted "why" (`NAME.why`) by its length."""
    if isinstance(value, dict) and "salt" in value:
        return {"sealed": value.get("form")}
    if isinstance(value, dict):
        return {k: len(v) if str(k).endswith(".why") else unsalted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [unsalted(v) for v in value]
    return value


def digest(out: Path) -> dict[str, object]:
    files: dict[str, object] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name not in TIMESTAMPS):
        name = path.relative_to(out).as_posix()
        if path.suffix == ".pt":
            files[name] = canonical(unsalted(torch.load(path, weights_only=True)))
        else:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def main(out: Path, chapter: Path, root: Path, sandbox: bool) -> None:
    torch.set_num_threads(1)
    classroom = load_classroom(root)
    assert Path(classroom.ROOT) == root.resolve(), classroom.ROOT
    folder = out / "张三 的 课程"
    course, student = folder / "课堂", folder / "学生版"
    said = run(
        classroom,
        ["--course-dir", str(course), "student", "--chapters", str(chapter), "--language", "zh", "--out", str(student)],
    )
    (course / classroom.SECRET_FILE).write_text("20261202\n", encoding="utf-8")
    subs = folder / "交上来的 作业"
    (subs / "张三").mkdir(parents=True)
    (subs / "李四").mkdir()
    shutil.copyfile(chapter, subs / "张三" / "01_注意力机制.ipynb")
    shutil.copyfile(student / chapter.name, subs / "李四" / chapter.name)
    (subs / "李四" / "笔记 第一章.txt").write_text("注意力：查询、键、值\n", encoding="utf-8")
    grade = ["--course-dir", str(course), "grade", str(subs), "--jobs", "2", "--timeout", "20"]
    said += run(classroom, [*grade, *([] if sandbox else ["--no-sandbox"])])
    said += run(classroom, ["--course-dir", str(course), "feedback"])
    said += run(classroom, ["--course-dir", str(course), "report", "--predict", "leave-out"])
    said += run(classroom, ["--course-dir", str(course), "feedback", "--out", str(course / "反馈 不计预测")])
    (folder / "输出.txt").write_text(said, encoding="utf-8")
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((course / "grading").glob("*/*.json"))]
    points = {r["student"]: sum(e["points"] for e in r["exercises"]) for r in records if "chapter" in r}
    assert set(points) == {"张三", "李四"} and points["张三"] > 0 and points["李四"] == 0, points
    import transformer_lab

    assert Path(transformer_lab.__file__).resolve().is_relative_to(root.resolve()), transformer_lab.__file__
    files = digest(out)
    (out / "digest.json").write_text(json.dumps(files, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), "--no-sandbox" not in sys.argv[4:])
