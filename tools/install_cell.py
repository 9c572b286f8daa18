"""The install lines at the top of every chapter's setup cell: on a hosted runtime (Colab, Kaggle, any Jupyter),
they install the course before the setup cell imports it.

    python tools/install_cell.py 00 01 ...   # put them into these chapters' source edition (or bring them up to date)
    python tools/install_cell.py --all       # every chapter of notebooks/solutions/
    python tools/install_cell.py --check     # exit 1, naming the chapters, where they are missing or stale

Then regenerate the learner and Chinese editions of the chapters changed (/tmp/team/regen_one.py NN, or
tools/editions.py and tools/translate.py). Running it again changes nothing: the lines are found by their first
and last lines and rewritten only if they differ. They go at the top of the setup cell, the chapter's first code
cell, and not into a cell of their own: the grader runs the teacher's first code cell before every answer
(transformer_lab/exercises/grading.py), so a cell before the setup would take its place.

What the lines do: where `transformer_lab` can be imported (a checkout set up by `bash run.sh lab`, the wheel
installed by hand, Binder, the grader's sandbox) they only import importlib.util and print nothing, so stored outputs
and nbval are unchanged. Where it cannot (a fresh hosted runtime), they install the course's release wheel with the
`[equality]` extra, with pip and without `--upgrade`: pip leaves a requirement that is already met as it is, so the
runtime's own PyTorch stays when it is in the course's range (torch>=2.9,<3) and is replaced only when it is not.
They print one line saying what they installed and whether PyTorch was kept: pip's own output (a root-user warning,
a notice of a newer pip) is captured and shown only if pip fails, and then one sentence says what failed and how to
go on (a runtime without internet, as a Kaggle notebook is until Settings > Internet is turned on), and the cell
stops with a RuntimeError instead of a traceback from inside subprocess. The extra is `[equality]` and not `[lab]`:
JupyterLab and ipykernel would replace the kernel packages a hosted runtime pins (Colab's ipykernel, IPython).
`TRANSFORMER_LAB_WHEEL` (a URL, https:// or file://) installs another wheel instead: tests/test_hosted.py points it
at a wheel built from the checkout.

The wheel's address is made from two places and nowhere else: the GitHub OWNER/REPO of the README's Binder link
(`[binder]: https://mybinder.org/v2/gh/OWNER/REPO/HEAD?...`, the one place it is set) and the version in
transformer_lab/__init__.py: the release `vVERSION` of that repository, whose assets hold the wheel that
`python -m build` makes (docs/installing.md, "Publishing a release"). The "Open in Colab" and "Open in Kaggle" links
of the README and the website (`colab_url`, `kaggle_url`) open the learner edition at the same tag, so that the
notebook opened and the package installed are the same release.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import editions  # noqa: E402  (tools/editions.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INIT = ROOT / "transformer_lab" / "__init__.py"
DISTRIBUTION = "attention-transformer-course"
ENVIRONMENT = "TRANSFORMER_LAB_WHEEL"
BLOCK_FIRST_LINE = "# On a hosted runtime (Colab, Kaggle, ...)"
BLOCK_LAST_LINE = '    print(f"installed transformer_lab from '

TEMPLATE = """\
# On a hosted runtime (Colab, Kaggle, ...) the course's package is not there yet: these lines install it first.
# Where it is installed (bash run.sh lab, Binder) they do nothing.
import importlib.util

if importlib.util.find_spec("transformer_lab") is None:
    import importlib.metadata
    import os
    import subprocess
    import sys

    RELEASE = "https://github.com/{repository}/releases/download/v{version}"
    wheel = os.environ.get("{environment}", f"{{RELEASE}}/{wheel_name}")
    torch_before = importlib.util.find_spec("torch") and importlib.metadata.version("torch")
    # No --upgrade: pip keeps a PyTorch that the course supports (2.9 or newer) and installs one only if needed.
    pip = [sys.executable, "-m", "pip", "install", "--quiet", f"{distribution}[equality] @ {{wheel}}"]
    # pip's own messages (warnings, notices) are shown only if it fails.
    done = subprocess.run(pip, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr)
        raise RuntimeError(
            f"pip could not install the course from {{wheel}} (its messages are above); if this runtime has no "
            "internet access, turn it on (on Kaggle: Settings > Internet) and run this cell again."
        ) from None
    importlib.invalidate_caches()
    torch_now = importlib.metadata.version("torch")
    kept = "kept" if torch_now == torch_before else "installed"
    print(f"installed transformer_lab from {{wheel}}; PyTorch {{torch_now}} {{kept}}")
"""


def repository(readme: pathlib.Path = README) -> str:
    """OWNER/REPO of the README's Binder link, the one place it is set."""
    match = re.search(r"^\[binder\]:\s*https://mybinder\.org/v2/gh/([^/\s]+/[^/\s]+)/", readme.read_text("utf-8"), re.M)
    if match is None:
        raise ValueError(
            f"{readme.name}: expected a line `[binder]: https://mybinder.org/v2/gh/OWNER/REPO/HEAD?urlpath=...`"
        )
    return match.group(1)


def version(init: pathlib.Path = INIT) -> str:
    """The course's version, from `__version__ = "..."` in transformer_lab/__init__.py (not imported)."""
    match = re.search(r'^__version__ = "([^"]+)"$', init.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise ValueError(f'{init.name}: expected a line `__version__ = "X.Y.Z"`')
    return match.group(1)


def tag() -> str:
    """The release's git tag, at which the hosted links open the notebooks."""
    return f"v{version()}"


def wheel_name() -> str:
    return f"{DISTRIBUTION.replace('-', '_')}-{version()}-py3-none-any.whl"


def wheel_url() -> str:
    return f"https://github.com/{repository()}/releases/download/{tag()}/{wheel_name()}"


def block_text() -> str:
    """The install lines, in English (tools/translate.py translates their comments for the Chinese edition)."""
    return TEMPLATE.format(
        repository=repository(),
        version=version(),
        wheel_name=wheel_name(),
        environment=ENVIRONMENT,
        distribution=DISTRIBUTION,
    )


def notebook_path(notebook: str) -> str:
    """A notebook's path in the repository, e.g. notebooks/zh/01_attention.ipynb, checked to be a chapter's."""
    if not re.fullmatch(r"notebooks/(zh/)?\d\d_\w+\.ipynb", notebook):
        raise ValueError(f"notebook={notebook!r}: expected notebooks/NN_name.ipynb or notebooks/zh/NN_name.ipynb")
    return notebook


def colab_url(notebook: str) -> str:
    """ "Open in Colab": the learner edition's notebook at the release's tag, on colab.research.google.com."""
    return f"https://colab.research.google.com/github/{repository()}/blob/{tag()}/{notebook_path(notebook)}"


def kaggle_url(notebook: str) -> str:
    """ "Open in Kaggle": the same notebook, imported into a new Kaggle notebook from its GitHub address."""
    source = f"https://github.com/{repository()}/blob/{tag()}/{notebook_path(notebook)}"
    return f"https://kaggle.com/kernels/welcome?src={source}"


def with_block(setup: str) -> str:
    """The setup cell's source with the install lines at its top, in place of any earlier version of them."""
    lines = setup.splitlines(keepends=True)
    first = BLOCK_FIRST_LINE
    if lines and lines[0].startswith(first):
        last = next((i for i, line in enumerate(lines) if line.startswith(BLOCK_LAST_LINE)), None)
        if last is None:
            raise ValueError(f"the setup cell starts with the install lines but has no line {BLOCK_LAST_LINE!r}")
        rest = "".join(lines[last + 1 :]).lstrip("\n")
    elif any(line.startswith(first) for line in lines):
        raise ValueError("the install lines must stand at the top of the setup cell: move them there")
    else:
        rest = setup.lstrip("\n")
    return block_text() + "\n" + rest


def with_install_block(notebook: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the notebook with the install lines at the top of its setup cell, whether anything changed).

    The setup cell is the chapter's first code cell, as the grader takes it (transformer_lab/exercises/grading.py
    runs it before every answer): the lines must stand there, since a cell before it would become the grader's
    setup. Where transformer_lab is installed, as in the grader's sandbox, they only import importlib.util."""
    cells = notebook["cells"]
    index = next((i for i, cell in enumerate(cells) if cell.get("cell_type") == "code"), None)
    if index is None:
        raise ValueError("the notebook has no code cell: the install lines go at the top of its setup cell")
    source = editions.source_text(cells[index])
    updated = with_block(source)
    if updated == source:
        return notebook, False
    cells[index]["source"] = editions.as_lines(updated)
    return notebook, True


#: The READMEs whose table of chapters gets the links, with the learner edition they open and their column's title.
READMES = {
    "README.md": ("notebooks", "run it online"),
    "README.zh.md": ("notebooks/zh", "在线运行"),
}
ROW = re.compile(r"^\| `(\d\d_\w+)` \|")


def links_cell(folder: str, name: str) -> str:
    notebook = f"{folder}/{name}.ipynb"
    return f"[Colab]({colab_url(notebook)}) · [Kaggle]({kaggle_url(notebook)})"


def with_links(readme: str, folder: str, title: str) -> str:
    """A README's table of chapters (rows `| `NN_name` | ...`) with the last column "Open in Colab / Kaggle".

    The column is added where missing and rewritten where present (found by its title in the header row)."""
    lines = readme.split("\n")
    rows = [i for i, line in enumerate(lines) if ROW.match(line)]
    if not rows:
        raise ValueError("no table of chapters (rows starting with | `NN_name` |) in the README")
    header, rule = rows[0] - 2, rows[0] - 1
    head = [c.strip() for c in lines[header].strip().strip("|").split("|")]
    present = head[-1] == title
    if not present:
        lines[header] = lines[header].rstrip() + f" {title} |"
        lines[rule] = lines[rule].rstrip() + " --- |"
    for i in range(rows[0], len(lines)):
        match = ROW.match(lines[i])
        if not match:
            break
        cells = lines[i].strip().strip("|").split("|")
        if present and len(cells) == len(head):  # a row that has the column already (a new row may not)
            cells = cells[:-1]
        lines[i] = "|" + "|".join(cells) + f"| {links_cell(folder, match.group(1))} |"
    return "\n".join(lines)


def readmes_to_write() -> dict[pathlib.Path, str]:
    """{README path: its text with the links up to date} for each README whose links are missing or stale."""
    out = {}
    for name, (folder, title) in READMES.items():
        path = ROOT / name
        text = path.read_text(encoding="utf-8")
        new = with_links(text, folder, title)
        if new != text:
            out[path] = new
    return out


def chapters(numbers: list[str], every: bool) -> list[pathlib.Path]:
    found = editions.source_notebooks(ROOT)
    if every:
        return found
    chosen = []
    for number in numbers:
        matches = [p for p in found if p.name.startswith(f"{number}_")]
        if not re.fullmatch(r"\d\d", number) or not matches:
            raise SystemExit(f"chapter {number!r}: expected a two-digit number of notebooks/solutions/NN_*.ipynb")
        chosen += matches
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="two-digit chapter numbers, e.g. 00 01")
    parser.add_argument("--all", action="store_true", help="every chapter of notebooks/solutions/")
    parser.add_argument("--check", action="store_true", help="only check (every chapter unless some are named)")
    args = parser.parse_args(argv)
    if not args.chapters and not args.all and not args.check:
        parser.error("name the chapters (e.g. 00 01), or --all, or --check")
    paths = chapters(args.chapters, args.all or not args.chapters)
    stale = []
    for path in paths:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        updated, changed = with_install_block(notebook)
        if not changed:
            continue
        if args.check:
            stale.append(path.name)
        else:
            path.write_text(editions.dumps(updated), encoding="utf-8")
            print(f"{path.relative_to(ROOT)}: install lines written")
    for path, text in readmes_to_write().items():
        if args.check:
            stale.append(f"{path.name} (the Colab and Kaggle links)")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{path.name}: Colab and Kaggle links written")
    if stale:
        print("the install lines or links are missing or stale in: " + ", ".join(stale))
        numbers = " ".join(name[:2] for name in stale if name[:2].isdigit())
        print(f"run: python tools/install_cell.py {numbers or '--all'}", file=sys.stderr)
        return 1
    if args.check:
        print(f"the install lines are up to date in {len(paths)} chapters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
