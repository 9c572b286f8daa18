"""The learner's own working copy of the course (the logic lives in transformer_lab/workspace.py).

    python tools/workspace.py [--source notebooks] [--dest my_notebooks]

Kept for scripts that call it; `transformer-lab lab` (what `bash run.sh lab` runs) makes the working copy
itself and then opens it in JupyterLab. See transformer_lab.workspace for the rules: a chapter the learner
changed is never overwritten, and the course's new version is put beside it as NN_name.updated.ipynb.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from transformer_lab.workspace import (  # noqa: F401 - re-exported for the tests and for scripts
    MANIFEST,
    UPDATED_SUFFIX,
    digest,
    read_manifest,
    sync,
    updated_name,
    write_manifest,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
