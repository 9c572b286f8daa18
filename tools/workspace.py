"""The learner's own working copy of the course, which `bash run.sh lab` opens.

    python tools/workspace.py [--dest my_notebooks]

The learner edition in `notebooks/` belongs to the repository: `git pull` updates it. A learner works in
a copy of it, `my_notebooks/` (git-ignored, so nothing of git, the set-up or the test command touches it),
which this tool creates on first use and keeps in step with the course without ever losing work:

- a chapter the learner does not have yet is copied in (a new chapter, or one the learner deleted);
- a chapter the learner never changed is refreshed when the course's version changes;
- a chapter the learner changed (edited, or only ran: its outputs changed) is never overwritten. When
  the course's version of it changes, the new version is put beside it as `NN_name.updated.ipynb`,
  and the learner is told.

What "changed" means is recorded in `my_notebooks/.course_versions.json`: for each chapter, the
SHA-256 of the course's file that was copied. A learner's file whose bytes still hash to that value is
unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = ".course_versions.json"
UPDATED_SUFFIX = ".updated.ipynb"


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(dest: pathlib.Path) -> dict[str, dict[str, str]]:
    path = dest / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_manifest(dest: pathlib.Path, manifest: dict[str, dict[str, str]]) -> None:
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def updated_name(name: str) -> str:
    return name[: -len(".ipynb")] + UPDATED_SUFFIX


def sync(source: pathlib.Path, dest: pathlib.Path) -> list[str]:
    """Bring `dest` in step with the chapters of `source` without losing a learner's work; return what was done.

    Args:
        source: the learner edition (`notebooks/`), or any folder of NN_*.ipynb chapters.
        dest: the learner's working copy (created if missing).

    Returns:
        One sentence per chapter that was added, refreshed, or kept with a new version beside it.
    """
    chapters = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not chapters:
        raise FileNotFoundError(f"source: no chapter notebook (NN_*.ipynb) in {source}")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(dest)
    messages = []
    for chapter in chapters:
        name = chapter.name
        course = digest(chapter)
        mine = dest / name
        entry = manifest.get(name, {})
        copied = entry.get("copied")
        if not mine.exists():
            shutil.copy2(chapter, mine)
            manifest[name] = {"copied": course}
            messages.append(f"{name}: added")
            continue
        current = digest(mine)
        if current == course:
            manifest[name] = {"copied": course}  # same as the course's: nothing to do
            continue
        if course == copied:
            continue  # the course's version has not changed since it was copied: the learner's copy is theirs
        if copied is not None and current == copied:
            shutil.copy2(chapter, mine)  # unchanged by the learner: take the course's new version
            manifest[name] = {"copied": course}
            messages.append(f"{name}: refreshed (the course's version changed; you had not changed yours)")
            continue
        # The learner's own work (or a copy of unknown origin): never overwritten.
        if entry.get("offered") == course and (dest / updated_name(name)).exists():
            messages.append(f"{name}: yours is kept; the course's newer version is still in {updated_name(name)}")
            continue
        beside = dest / updated_name(name)
        if beside.exists() and digest(beside) != entry.get("offered"):
            number = 2
            while (dest / f"{name[: -len('.ipynb')]}.updated-{number}.ipynb").exists():
                number += 1
            beside = dest / f"{name[: -len('.ipynb')]}.updated-{number}.ipynb"
        shutil.copy2(chapter, beside)
        manifest[name] = {"copied": copied or "", "offered": course}
        messages.append(
            f"{name}: the course's version changed, and yours has your work, so it was kept as it is. "
            f"The new version is beside it: {beside.name}"
        )
    write_manifest(dest, manifest)
    return messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=pathlib.Path, default=ROOT / "notebooks", help="the learner edition")
    parser.add_argument("--dest", type=pathlib.Path, default=ROOT / "my_notebooks", help="your working copy")
    args = parser.parse_args(argv)
    first = not args.dest.exists()
    messages = sync(args.source, args.dest)
    if first:
        print(f"Your working copy of the course is {args.dest}: your work there is never overwritten.")
    for message in messages:
        if not first:
            print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
