"""Write each chapter's time, estimated from what it holds and measured where it runs, into its title cell.

    python tools/chapter_times.py            # rewrite the "**Time:**" line of every source chapter
    python tools/chapter_times.py --check    # exit 1 if a chapter's stated time is not the computed one

A chapter's time is three parts, each from a count, not a guess:

- reading: the words of its markdown at READING_WPM words a minute (technical prose with formulas), plus
  its code at CODE_LINES_PER_MINUTE lines a minute (code is read, not skimmed);
- exercises: EXERCISE_MINUTES minutes for each exercise by level (easy, medium, harder);
- computation: the kernel's CPU time, measured by tools/execute_notebooks.py when it last ran the chapter
  in a fresh kernel on one CPU thread (stored in the notebook's metadata, `transformer_lab.kernel_seconds`; on a
  quiet machine it is the wall time, on a busy one the wall time overstates it).

The title cell gets one line, `**Time:** about N minutes (...)`, in place of the one it had; chapter 00's
map of the course is not touched here (it links the chapters; their times are in their own title cells).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
READING_WPM = 150
CODE_LINES_PER_MINUTE = 12
EXERCISE_MINUTES = {"easy": 5, "medium": 10, "harder": 15}
LEVEL = re.compile(r"\((easy|medium|harder), (?:build|debug the (?:notes|code)|predict|transfer)\)")
TIME_LINE = re.compile(r"(\*\*Time:\*\* about [^\n]*?\.(?=\s|$)|\*About \d+ minutes\.\*)")


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


INSTALL_IF = 'if importlib.util.find_spec("transformer_lab") is None:'


def without_install_lines(code: str) -> str:
    """A setup cell's code without the hosted-runtime install lines at its top (tools/install_cell.py), which a
    learner does not read as part of the chapter: the comments and import before the `if`, and its indented body."""
    lines = code.splitlines()
    if INSTALL_IF not in lines:
        return code
    start = lines.index(INSTALL_IF) + 1
    while start < len(lines) and (not lines[start].strip() or lines[start].startswith((" ", "\t"))):
        start += 1
    return "\n".join(lines[start:])


def estimate(notebook: dict) -> dict[str, float]:
    """{reading, exercises, computation, total} in minutes, and the counts they come from."""
    cells = notebook.get("cells", [])
    words = sum(len(re.findall(r"\S+", _text(c))) for c in cells[1:] if c.get("cell_type") == "markdown")
    code_lines = sum(
        1
        for c in cells
        if c.get("cell_type") == "code"
        for line in without_install_lines(_text(c)).splitlines()
        if line.strip() and not line.strip().startswith("#")
    )
    levels = [m.group(1) for c in cells if c.get("cell_type") == "markdown" for m in LEVEL.finditer(_text(c))]
    seconds = float(notebook.get("metadata", {}).get("transformer_lab", {}).get("kernel_seconds", 0.0))
    reading = words / READING_WPM + code_lines / CODE_LINES_PER_MINUTE
    exercises = sum(EXERCISE_MINUTES[level] for level in levels)
    total = reading + exercises + seconds / 60
    return {
        "words": words,
        "code_lines": code_lines,
        "exercises_count": len(levels),
        "kernel_seconds": seconds,
        "reading": reading,
        "exercises": exercises,
        "total": total,
    }


def time_line(numbers: dict[str, float]) -> str:
    total = total_minutes(numbers)  # to the next 5 minutes
    parts = [
        f"{round(numbers['reading'])} min of reading ({numbers['words']:.0f} words, "
        f"{numbers['code_lines']:.0f} lines of code)"
    ]
    count = int(numbers["exercises_count"])
    if count:
        parts.append(f"{numbers['exercises']:.0f} min for the {count} exercise{'s' if count > 1 else ''}")
    if numbers["kernel_seconds"]:
        parts.append(f"{numbers['kernel_seconds']:.0f} s of computation on one CPU thread (measured)")
    return f"**Time:** about {total} minutes: {', '.join(parts)}."


def updated(notebook: dict) -> tuple[dict, bool]:
    """The notebook with its title cell's time line recomputed, and whether it changed."""
    title = notebook["cells"][0]
    text = _text(title)
    line = time_line(estimate(notebook))
    if TIME_LINE.search(text):
        new = TIME_LINE.sub(lambda _: line, text, count=1)
    else:
        new = text.rstrip("\n") + "\n\n" + line
    changed = new != text
    if changed:
        title["source"] = new.splitlines(keepends=True)
    return notebook, changed


def total_minutes(numbers: dict[str, float]) -> int:
    return 5 * max(1, math.ceil(numbers["total"] / 5))


def update_map(notebook: dict, totals: dict[str, int]) -> bool:
    """Write each chapter's time into the last column ("time") of chapter 00's map of the course."""
    changed = False
    for cell in notebook["cells"]:
        text = _text(cell)
        if cell.get("cell_type") != "markdown" or not text.startswith("## The map of the course"):
            continue
        lines = text.split("\n")
        for i, line in enumerate(lines):
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            if not cells:
                continue
            if cells[0] == "chapter":
                if cells[-1] != "time":
                    cells.append("time")
            elif set(cells[0]) <= {"-", " "}:
                if len(cells) < len([c for c in lines[i - 1].strip().strip("|").split("|")]):
                    cells.append("---")
            else:
                name = next((c.strip("`") for c in cells if c.startswith("`") and c.strip("`") in totals), None)
                time = f"{totals[name]} min" if name else "-"
                header = [c.strip() for c in lines[_header_index(lines)].strip().strip("|").split("|")]
                if len(cells) < len(header):
                    cells.append(time)
                else:
                    cells[-1] = time
            new = "| " + " | ".join(cells) + " |"
            if new != line:
                lines[i], changed = new, True
        if changed:
            cell["source"] = "\n".join(lines).splitlines(keepends=True)
    return changed


def _header_index(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("| chapter"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))
    stale = []
    totals = {
        p.stem: total_minutes(estimate(json.loads(p.read_text(encoding="utf-8"))))
        for p in sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))
    }
    start = ROOT / "notebooks" / "solutions" / "00_start_here.ipynb"
    if start.exists():
        notebook = json.loads(start.read_text(encoding="utf-8"))
        if update_map(notebook, totals):
            stale.append(f"{start.name} (map)")
            if not args.check:
                start.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")
    for path in paths:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        notebook, changed = updated(notebook)
        numbers = estimate(notebook)
        print(f"{path.name}: {time_line(numbers)}")
        if changed:
            stale.append(path.name)
            if not args.check:
                path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")
    if args.check and stale:
        print(f"stale times in {stale}: run python tools/chapter_times.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
