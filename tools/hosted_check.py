"""Every chapter run as on a hosted runtime (Colab, Kaggle): a fresh venv with PyTorch and JupyterLab, no course.

    python tools/hosted_check.py                   # every chapter's learner edition, English, in quick mode
    python tools/hosted_check.py --language zh 00 01
    python tools/hosted_check.py --full            # the chapters' full setting instead of TRANSFORMER_LAB_QUICK=1

What it does, as tests/test_hosted.py does for chapters 00 and 01:

1. builds the course's wheel from the files git tracks (`python -m build --wheel`, as a release does);
2. makes a fresh virtual environment in a temporary folder with the PyTorch of this environment (same version),
   JupyterLab, ipykernel and matplotlib, and the other packages the wheel asks for, but not the course: a hosted
   runtime has most of them already, and installing them from an index takes minutes (`uv` installs them when it
   is there, else pip);
3. for each chapter: uninstalls the course, copies the chapter's notebook alone into an empty folder, and executes it
   there top to bottom in that environment's kernel, with `TRANSFORMER_LAB_WHEEL` pointing at the wheel (file://).
   The install lines of its setup cell must install the course and print exactly one line,
   `installed transformer_lab from <wheel>; PyTorch <version> kept`; the notebook must run to the end; and
   PyTorch must be the same files as before (its version and its RECORD unchanged).

It prints each chapter's time (the install included) and a total, and exits 1 if a chapter failed. The times depend
on the machine: run it under `nice` beside other work. Standard library, plus nbclient and nbformat inside the venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "attention-transformer-course"
#: What a hosted runtime has before the course: PyTorch (the version of this environment), JupyterLab and its
#: kernel, matplotlib, and nbclient to execute notebooks from a script.
RUNTIME = ("jupyterlab", "ipykernel", "matplotlib", "nbclient", "nbformat")

EXECUTE = r"""
import json, os, sys, time
import nbclient, nbformat
path, timeout = sys.argv[1], int(sys.argv[2])
notebook = nbformat.read(path, as_version=4)
start = time.perf_counter()
error = None
try:
    folder = {"metadata": {"path": os.path.dirname(os.path.abspath(path))}}
    nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources=folder).execute()
except Exception as exc:  # the report says which cell failed
    error = f"{type(exc).__name__}: {str(exc)[-1500:]}"
seconds = time.perf_counter() - start
code = [c for c in notebook.cells if c.cell_type == "code"]
streams = [o for o in code[0].get("outputs", []) if o.get("output_type") == "stream"] if code else []
setup = "".join(o.get("text", "") for o in streams)
ran = sum(1 for c in code if c.get("execution_count"))
print(json.dumps({"seconds": seconds, "setup_output": setup, "error": error, "ran": ran, "cells": len(code)}))
"""


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:  # noqa: ANN003
    return subprocess.run(command, capture_output=True, text=True, encoding="utf-8", **kwargs)


def tracked_copy(target: Path) -> Path:
    """The files git tracks or would track (untracked ones not ignored): what a release is built from."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def build_wheel(work: Path) -> Path:
    """The course's wheel, built from a clean copy of the checkout into work/dist."""
    source = tracked_copy(work / "clean checkout")
    built = run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work / "dist"), str(source)]
    )
    if built.returncode != 0:
        raise RuntimeError("python -m build failed:\n" + built.stdout[-2000:] + built.stderr[-2000:])
    (wheel,) = (work / "dist").glob("*.whl")
    return wheel


def torch_version() -> str:
    import torch

    return str(torch.__version__).split("+")[0]


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's dependencies, its [equality] extra included, as pip requirements."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode("utf-8")
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
        if not marker.strip() or 'extra == "equality"' in marker:
            found.append(requirement.strip())
    return found


def uv_command() -> list[str] | None:
    """`uv pip install` with pip's own settings (tools/uv_options.py), or None where uv is not installed."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        return None
    options = run([sys.executable, str(ROOT / "tools" / "uv_options.py"), sys.executable])
    if options.returncode != 0:
        return None
    return [uv, "pip", "install", "--quiet", *options.stdout.split()]


def make_runtime(venv: Path, wheel: Path) -> Path:
    """A fresh venv with PyTorch, JupyterLab, ipykernel, matplotlib and the wheel's other dependencies, not the
    course. Returns its python."""
    created = run([sys.executable, "-m", "venv", str(venv)])
    if created.returncode != 0:
        raise RuntimeError(f"python -m venv failed: {created.stderr[-1500:]}")
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    wanted = [f"torch=={torch_version()}", *RUNTIME, *wheel_requirements(wheel)]
    uv = uv_command()
    if uv is not None:
        installed = run([*uv, "--python", str(python), *wanted])
    if uv is None or installed.returncode != 0:
        installed = run([str(python), "-m", "pip", "install", "--quiet", *wanted])
    if installed.returncode != 0:
        raise RuntimeError(f"installing the runtime failed:\n{installed.stderr[-2000:]}")
    present = run(  # away from the checkout, whose folder would make it importable
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('transformer_lab') is None)"], cwd=venv
    )
    if present.stdout.strip() != "True":
        raise RuntimeError(f"the fresh venv can import transformer_lab already: {present.stdout}{present.stderr}")
    return python


def torch_fingerprint(python: Path) -> str:
    """PyTorch's version and the text of its RECORD (every file with its hash), as the venv has them."""
    code = "import importlib.metadata as m; d = m.distribution('torch'); print(d.version); print(d.read_text('RECORD'))"
    found = run([str(python), "-c", code])
    if found.returncode != 0:
        raise RuntimeError(f"no PyTorch in the venv: {found.stderr[-500:]}")
    return found.stdout


def run_chapter(python: Path, notebook: Path, work: Path, wheel: Path, quick: bool, timeout: int = 900) -> dict:
    """Execute one chapter alone in a fresh folder in the venv's kernel, after uninstalling the course there."""
    run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", DISTRIBUTION])
    folder = work / f"{notebook.parent.name}-{notebook.stem}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    copy = folder / notebook.name
    shutil.copy(notebook, copy)
    script = work / "execute.py"
    script.write_text(EXECUTE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update(
        TRANSFORMER_LAB_WHEEL=wheel.resolve().as_uri(),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HOME=str(work / "home"),
        PATH=str(python.parent) + os.pathsep + env.get("PATH", ""),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    env.pop("TRANSFORMER_LAB_QUICK", None)
    if quick:
        env["TRANSFORMER_LAB_QUICK"] = "1"
    (work / "home").mkdir(exist_ok=True)
    start = time.perf_counter()
    done = run([str(python), str(script), str(copy), str(timeout)], cwd=folder, env=env, timeout=timeout + 120)
    wall = time.perf_counter() - start
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": f"the executing script failed: {done.stderr[-2000:]}", "seconds": wall, "setup_output": ""}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    return result


def expected_line(wheel: Path, torch: str) -> str:
    return f"installed transformer_lab from {wheel.resolve().as_uri()}; PyTorch {torch} kept"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="two-digit chapter numbers (default: every chapter)")
    parser.add_argument("--language", choices=("en", "zh"), default="en")
    parser.add_argument("--full", action="store_true", help="the full setting, not TRANSFORMER_LAB_QUICK=1")
    args = parser.parse_args(argv)
    folder = ROOT / "notebooks" / ("zh" if args.language == "zh" else "")
    notebooks = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if args.chapters:
        notebooks = [p for p in notebooks if p.name[:2] in args.chapters]
    if not notebooks:
        print(f"no chapter matches {args.chapters} in {folder.relative_to(ROOT)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hosted-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        wheel = build_wheel(work)
        print(f"wheel {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB, built in {time.perf_counter() - start:.0f} s")
        start = time.perf_counter()
        python = make_runtime(work / "venv", wheel)
        before = torch_fingerprint(python)
        torch = before.splitlines()[0]
        print(f"fresh venv with PyTorch {torch} and JupyterLab, no course: {time.perf_counter() - start:.0f} s")
        failed, total = [], 0.0
        for notebook in notebooks:
            result = run_chapter(python, notebook, work, wheel, quick=not args.full)
            total += result.get("wall", result["seconds"])
            line = (result["setup_output"].splitlines() or [""])[0]
            problems = []
            if result.get("error"):
                plain = re.sub(r"\x1b\[[0-9;]*m", "", result["error"])  # the traceback's colours
                problems.append(plain.strip().splitlines()[-1][:300])
            if line != expected_line(wheel, torch):
                problems.append(f"the setup cell printed {line!r}")
            if torch_fingerprint(python) != before:
                problems.append("PyTorch was replaced")
            status = "ok" if not problems else "FAILED: " + "; ".join(problems)
            print(f"{notebook.relative_to(ROOT)}: {result.get('wall', result['seconds']):.0f} s, {status}", flush=True)
            if problems:
                failed.append(notebook.name)
        mode = "full setting" if args.full else "TRANSFORMER_LAB_QUICK=1"
        print(f"{len(notebooks) - len(failed)} of {len(notebooks)} chapters ran to the end ({mode}), {total:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
