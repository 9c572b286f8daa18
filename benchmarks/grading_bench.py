"""How long grading a class takes, with the sandbox and without it, and with resource attackers in it.

    python benchmarks/grading_bench.py                 # 10 students x chapters 01 and 04, --jobs 2
    python benchmarks/grading_bench.py --students 20 --jobs 2 --chapters 02 04
    python benchmarks/grading_bench.py --attacks       # a class of 20 with and without one of each resource attack
    python benchmarks/grading_bench.py --attacks --out benchmarks/results/grading-attacks.md

Without `--attacks`: half the students hand in the source edition (every answer right), half the student version
(blank). The class is graded twice, in the same run: with a sandbox per student (what `classroom.py grade` does:
one for all of a student's chapters) and with `--no-sandbox` (the same stripped copy, static check and limits, no
bubblewrap), so the ratio says what the sandbox costs on this machine. Prints seconds per student and chapter for
each (issue 36's target: at most 1.5 s with the sandbox and two jobs).

With `--attacks` (issue 36): a class of `--students` (20) on chapter 01, graded twice with the sandbox and `--jobs`,
each time in a fresh process of its own, so that its peak memory (`ru_maxrss`) is that class's alone. The
reference class: half the students right, half blank. The attacked class: the same, but one student of each
resource attack (`ATTACKS`: memory, fork, wait, CPU spin past its alarms, huge output, a huge cell, deep nesting,
a forged result frame, filling /tmp and /dev) in place of as many of them, each attack put before the honest
answers of the chapter's first answer cell, so that it runs again before every exercise. Issue 36 asks that the
attacked class take at most 2 minutes more than the reference, and that the grader's peak memory stay under
1.5 GB. The figures depend on the machine and on what else runs on it: compare the two classes of one run only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: what the students who attack nothing hand in
HONEST = ("right", "blank")
#: issue 36's bounds for a class with one student of each resource attack
EXTRA_SECONDS = 120.0
PEAK_MIB = 1.5 * 1024

_FORGE = (
    "import struct\n"
    "payload = b'0' * (50 << 20)\n"
    "fd = max(int(n) for n in os.listdir('/proc/self/fd') if int(n) > 2 and os.path.exists(f'/proc/self/fd/{n}'))\n"
    "os.write(fd, struct.pack('<Q', len(payload)) + payload)\n"
    "os._exit(0)\n"
)
#: one answer cell's prefix per resource attack (the chapter's setup cell imports torch and os)
ATTACKS = {
    "memory": "hog = [bytearray(1 << 28) for _ in range(64)]\n",
    "fork": "import os\nfor _ in range(64):\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "wait": "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\ntime.sleep(3600)\n",
    "cpu_spin": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
    "huge_output": "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n",
    "huge_cell": "# " + "x" * (8 << 20) + "\n",
    "deep_nesting": "x = " + "[" * 150 + "]" * 150 + "\n",  # parses, but deeper than the static passes read
    "forged_frame": "import os\n" + _FORGE,
    "fill_tmp": "with open('/tmp/fill', 'wb') as f:\n    for _ in range(4096):\n        f.write(b'x' * (1 << 20))\n",
    "fill_dev": "for p in ('/dev/shm/fill', '/dev/fill'):\n    try:\n        with open(p, 'wb') as f:\n"
    "            for _ in range(4096):\n                f.write(b'x' * (1 << 20))\n    except OSError:\n        pass\n",
}


def load_classroom():  # noqa: ANN201 - tools/classroom.py as a module (tools/ is not a package)
    spec = importlib.util.spec_from_file_location("classroom", ROOT / "tools" / "classroom.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def machine() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def attacked(notebook: dict, attack: str) -> dict:
    """The source edition with `attack` put before the first answer cell's honest answer."""
    data = json.loads(json.dumps(notebook))
    for cell in data["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = ATTACKS[attack] + source
            return data
    raise ValueError("the chapter has no answer cell")


def grade_one_class(kind: str, students: int, jobs: int, chapter: str, timeout: float) -> dict:
    """Grade one class (`kind`: "reference" or "attacked") in this process; what it took."""
    classroom = load_classroom()
    source = next(p for p in classroom.chapter_notebooks(ROOT) if p.name[:2] == chapter)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"tl-grading-bench-{kind}-"))
    out = classroom.make_student_folder(tmp / "student", tmp / "course", [source])
    honest = json.loads(source.read_text(encoding="utf-8"))
    attackers = list(ATTACKS) if kind == "attacked" else []
    if len(attackers) > students:
        raise ValueError(f"students: at least {len(attackers)} for one of each attack, got {students}")
    who = {}
    for index in range(students):
        name = f"s{index:03d}"
        folder = tmp / "subs" / name
        folder.mkdir(parents=True)
        if index < len(attackers):
            who[name] = attackers[index]
            text = json.dumps(attacked(honest, attackers[index]))
        else:
            who[name] = "right" if index % 2 == 0 else "blank"
            text = source.read_text(encoding="utf-8") if index % 2 == 0 else (out / source.name).read_text("utf-8")
        (folder / source.name).write_text(text, encoding="utf-8")
    start = time.perf_counter()
    records = classroom.grade_folder(
        tmp / "subs", tmp / "course", timeout=timeout, jobs=jobs, sandbox=True, write_gb=False, secret=36
    )
    wall = time.perf_counter() - start
    points = {r["student"]: round(sum(e["points"] for e in r["exercises"]), 4) for r in records}
    report = (tmp / "course" / "grading_report.md").read_text(encoding="utf-8")
    flagged = {name: f"## {name}" in report for name in who}
    return {
        "kind": kind,
        "students": students,
        "jobs": jobs,
        "chapter": source.stem,
        "timeout": timeout,
        "wall_s": round(wall, 1),
        "per_submission_s": round(wall / len(records), 2),
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0),
        "students_by_kind": {w: sorted(n for n in who if who[n] == w) for w in sorted(set(who.values()))},
        "points": {f"{name} ({who[name]})": points.get(name) for name in sorted(who)},
        "flagged": {f"{name} ({who[name]})": flagged[name] for name in sorted(who)},
    }


def attacks(args: argparse.Namespace) -> int:
    results = {}
    for kind in ("reference", "attacked"):  # each in a fresh process: its peak memory is its own
        command = [sys.executable, __file__, "--one-class", kind, "--students", str(args.students)]
        command += ["--jobs", str(args.jobs), "--chapters", args.chapters[0], "--timeout", str(args.timeout)]
        print(f"grading the {kind} class ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", check=False)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    text = render(results, args, os.getloadavg())
    print(text)
    print(json.dumps(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n```json\n" + json.dumps(results, indent=1) + "\n```\n", encoding="utf-8")
        print(f"written to {args.out}")
    return 0


def render(results: dict, args: argparse.Namespace, load: tuple[float, float, float]) -> str:
    """The markdown table of an --attacks run."""
    reference, attacked_class = results["reference"], results["attacked"]
    extra = attacked_class["wall_s"] - reference["wall_s"]
    seen = {kind: {p for name, p in reference["points"].items() if name.endswith(f"({kind})")} for kind in HONEST}
    lines = [
        "# Grading a class with resource attackers (benchmarks/grading_bench.py --attacks)",
        "",
        f"Machine: {machine()}, {os.cpu_count()} cores; load average after the run {load[0]:.1f}, {load[1]:.1f}, "
        f"{load[2]:.1f} (1, 5, 15 min): the machine was shared, so compare the two classes of this run only.",
        f"A class of {args.students} on chapter {reference['chapter']}, `--jobs {args.jobs}`, `--timeout "
        f"{args.timeout:g}` (so a chapter's wall-clock limit of {max(60, 12 * args.timeout):g} s), with the sandbox.",
        "",
        "| class | wall s | s per student and chapter | grader's peak MiB |",
        "| --- | --- | --- | --- |",
        *(
            f"| {r['kind']} | {r['wall_s']:.1f} | {r['per_submission_s']:.2f} | {r['peak_mib']:.0f} |"
            for r in (reference, attacked_class)
        ),
        "",
        f"The attacked class took **{extra:+.1f} s** against the reference (issue 36: at most {EXTRA_SECONDS:.0f} s "
        f"more): {'within' if extra <= EXTRA_SECONDS else 'OVER'} the bound. The grader's peak memory: "
        f"{max(r['peak_mib'] for r in results.values()):.0f} MiB (bound {PEAK_MIB:.0f} MiB): "
        f"{'within' if max(r['peak_mib'] for r in results.values()) < PEAK_MIB else 'OVER'} it.",
        "",
        "Each attacker hands in the right answers with its attack put before the first answer cell's: it can only "
        "lose the points of the exercises the attack stops, and must be named in the report.",
        "",
        "| attacker | points (right notebook: "
        + ", ".join(f"{p:g}" for p in sorted(seen["right"]))
        + "; blank: "
        + ", ".join(f"{p:g}" for p in sorted(seen["blank"]))
        + ") | in the report |",
        "| --- | --- | --- |",
        *(
            f"| {name} | {points:g} | {'yes' if attacked_class['flagged'][name] else 'no'} |"
            for name, points in attacked_class["points"].items()
            if not name.endswith(("(right)", "(blank)"))
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=None, help="10, or 20 with --attacks")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chapters", nargs="*", default=None, help="01 04, or 01 with --attacks")
    parser.add_argument("--attacks", action="store_true", help="a class with one student of each resource attack")
    parser.add_argument("--timeout", type=float, default=10.0, help="grade --timeout (seconds per cell and case)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the --attacks table here (markdown)")
    parser.add_argument("--one-class", choices=("reference", "attacked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_class:
        print(json.dumps(grade_one_class(args.one_class, args.students, args.jobs, args.chapters[0], args.timeout)))
        return 0
    if args.attacks:
        args.students = args.students or 20
        args.chapters = args.chapters or ["01"]
        return attacks(args)
    args.students = args.students or 10
    args.chapters = args.chapters or ["01", "04"]
    classroom = load_classroom()
    chapters = [p for p in classroom.chapter_notebooks(ROOT) if p.name[:2] in args.chapters]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tl-grading-bench-"))
    out = classroom.make_student_folder(tmp / "student", tmp / "course", chapters)
    for index in range(args.students):
        folder = tmp / "subs" / f"s{index:03d}"
        folder.mkdir(parents=True)
        for path in chapters:
            source = path if index % 2 == 0 else out / path.name
            (folder / path.name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
