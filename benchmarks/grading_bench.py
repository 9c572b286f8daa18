"""How long grading a class takes, with the sandbox and without it, in the same run.

    python benchmarks/grading_bench.py                 # 10 students x chapters 01 and 04, --jobs 2
    python benchmarks/grading_bench.py --students 20 --jobs 2 --chapters 02 04

Half the students hand in the source edition (every answer right), half the student version (blank). The
class is graded twice, in the same run: with a sandbox per student (what `classroom.py grade` does: one for all
of a student's chapters) and with `--no-sandbox` (the same stripped copy, static check and limits, no
bubblewrap), so the ratio says what the sandbox costs on this machine. Prints seconds per student and chapter
for each (issue 22's target: at most 6 s with the sandbox and two jobs on a 2-core machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def load_classroom():  # noqa: ANN201 - tools/classroom.py as a module (tools/ is not a package)
    spec = importlib.util.spec_from_file_location("classroom", ROOT / "tools" / "classroom.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chapters", nargs="*", default=["01", "04"])
    args = parser.parse_args()
    classroom = load_classroom()
    chapters = [p for p in classroom.chapter_notebooks(ROOT) if p.name[:2] in args.chapters]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tl-grading-bench-"))
    out = classroom.make_student_folder(tmp / "student", tmp / "course", chapters)
    for index in range(args.students):
        folder = tmp / "subs" / f"s{index:03d}"
        folder.mkdir(parents=True)
        for path in chapters:
            source = path if index % 2 == 0 else out / path.name
            (folder / path.name).write_text(source.read_text())
    results = {}
    for sandbox in (True, False):
        start = time.perf_counter()
        records = classroom.grade_folder(
            tmp / "subs", tmp / "course", timeout=10.0, jobs=args.jobs, sandbox=sandbox, write_gb=False
        )
        wall = time.perf_counter() - start
        results[sandbox] = wall / len(records)
        points = sorted({round(sum(e["points"] for e in r["exercises"]), 4) for r in records})
        print(
            f"{'sandbox' if sandbox else 'no sandbox'}: {len(records)} submissions in {wall:.1f} s, "
            f"{wall / len(records):.2f} s per student and chapter (jobs {args.jobs}; points seen {points})"
        )
    print(
        json.dumps(
            {"per_submission_sandbox_s": round(results[True], 2), "ratio": round(results[True] / results[False], 2)}
        )
    )


if __name__ == "__main__":
    main()
