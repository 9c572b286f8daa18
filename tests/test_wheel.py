"""The course installed from its wheel, away from the repository: `transformer-lab lab` there.

From a clean copy of the checkout (the files git tracks or would track: no build/, no .venv, no my_notebooks),
`python -m build` makes the sdist and, from it, the wheel. The wheel is installed with --no-deps into a fresh
virtual environment in a temporary folder, as `attention-transformer-course[lab]` (JupyterLab is the [lab] extra, not
a dependency: its Requires-Dist are checked); the dependencies (torch, JupyterLab, ...) come from this environment
through a .pth file, as in tests/test_binder.py, since installing them afresh needs the network. Then, in a folder
that is not the repository, `transformer-lab lab --no-browser --dir X` makes the working copy from the chapters
the wheel carries and starts JupyterLab, whose API must answer; a second run, after the course's version of a
chapter changed (as `pip install --upgrade` would change it), keeps the learner's edit and puts the new version
beside it. The wheel's size is printed (and bounded) for the notes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from support import require, share_dependencies

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "course-wheel-test"
#: PyPI refuses files over 100 MB unless the project asks for more; the course's is far below.
MAX_WHEEL_MB = 60

pytestmark = pytest.mark.slow


def clean_copy(target: Path) -> Path:
    """The files of the checkout that git tracks or would track (untracked ones not ignored), as a fresh clone
    with the working tree's changes would have them (tools/hosted_check.py builds its wheel from the same)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import hosted_check

    return hosted_check.tracked_copy(target)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "needs git and a checkout to copy")
    require(
        subprocess.run([sys.executable, "-c", "import build"], capture_output=True).returncode == 0,
        "needs the `build` package (requirements-test.txt)",
    )
    tmp = tmp_path_factory.mktemp("wheel")
    source = clean_copy(tmp / "clean checkout")
    dist = tmp / "dist"
    # --no-isolation: the build uses this environment's setuptools instead of downloading one (an isolated
    # `python -m build`, what a release runs, gives the same files)
    run = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    # what is checked is the snapshot built, not notebooks/ now (others may change it meanwhile)
    course = source / "notebooks"
    chapters = sorted(p.name for p in course.glob("[0-9][0-9]_*.ipynb"))
    chapters_zh = sorted(p.name for p in (course / "zh").glob("[0-9][0-9]_*.ipynb"))
    return {"tmp": tmp, "wheel": wheel, "sdist": sdist, "course": course, "en": chapters, "zh": chapters_zh}


def test_the_wheel_and_the_sdist_carry_every_chapter_in_both_languages(built):
    wheel, sdist, chapters, chapters_zh = built["wheel"], built["sdist"], built["en"], built["zh"]
    assert len(chapters) >= 13 and len(chapters_zh) == len(chapters)
    assert wheel.name.startswith("attention_transformer_course-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for chapter in chapters:
        assert f"transformer_lab/notebooks/{chapter}" in names
    for chapter in chapters_zh:
        assert f"transformer_lab/notebooks/zh/{chapter}" in names
    assert "transformer_lab/assets/dates_model.pt" in names and "transformer_lab/locale/messages.json" in names
    assert "transformer_lab/assets/copy_model.pt" in names  # chapter 09's cli.load_shipped("copy")
    assert not any("/solutions/" in n for n in names), "the wheel must not carry the solutions"
    root = sdist.name[: -len(".tar.gz")]
    members = set(tarfile.open(sdist).getnames())
    assert {f"{root}/notebooks/{c}" for c in chapters} <= members
    assert {f"{root}/notebooks/zh/{c}" for c in chapters_zh} <= members
    size = wheel.stat().st_size / 1e6
    print(f"wheel {wheel.name}: {size:.1f} MB; sdist {sdist.stat().st_size / 1e6:.1f} MB")
    assert size < MAX_WHEEL_MB, f"the wheel is {size:.1f} MB"


def test_the_wheel_brings_jupyterlab_only_with_its_lab_extra(built):
    """The hosted install lines ask for `[equality]`: its requirements and the plain ones must bring no JupyterLab and
    no kernel, which would replace the ones a hosted runtime pins (Colab's ipykernel 5.5.6, IPython 7.34); `[lab]`,
    for `transformer-lab lab`, has them."""
    with zipfile.ZipFile(built["wheel"]) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode("utf-8")
    hosted, lab = set(), set()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist: "):
            requirement, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
            project = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
            if not marker.strip() or 'extra == "equality"' in marker:
                hosted.add(project)
            elif 'extra == "lab"' in marker:
                lab.add(project)
    kernel = {"jupyterlab", "ipykernel", "jupyterlab-language-pack-zh-cn", "notebook", "jupyter-server", "jupyter"}
    assert "torch" in hosted and not hosted & kernel, sorted(hosted)
    assert {"jupyterlab", "ipykernel", "jupyterlab-language-pack-zh-cn"} <= lab, sorted(lab)


def test_transformer_lab_lab_from_the_installed_wheel(built):
    tmp, course, chapters, chapters_zh = built["tmp"], built["course"], built["en"], built["zh"]
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    # the course with its [lab] extra, as docs/installing.md says; --no-deps, so the extra's packages (JupyterLab,
    # ipykernel, the Chinese language pack) come from this environment: they must be there, in the extra's ranges
    requirement = f"attention-transformer-course[lab] @ {built['wheel'].resolve().as_uri()}"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", requirement],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    site = share_dependencies(python)
    check = (
        "import importlib.metadata as m\n"
        "from packaging.requirements import Requirement\n"
        "lab = [Requirement(r) for r in m.requires('attention-transformer-course')]\n"
        "lab = [r for r in lab if r.marker is not None and r.marker.evaluate({'extra': 'lab'})]\n"
        "assert lab, 'no [lab] extra'\n"
        "for r in lab:\n"
        "    assert r.specifier.contains(m.version(r.name), prereleases=True), (r, m.version(r.name))\n"
        "print(sorted(r.name for r in lab))\n"
    )
    met = subprocess.run([python, "-c", check], cwd=venv, capture_output=True, text=True)  # not the checkout's
    assert met.returncode == 0, met.stderr[-3000:]
    assert "jupyterlab" in met.stdout and "ipykernel" in met.stdout, met.stdout
    away = tmp / "elsewhere"  # not the repository: the chapters must come from the wheel
    away.mkdir()
    shared = Path(sys.prefix) / "share" / "jupyter"
    env = dict(
        os.environ,
        HOME=str(tmp / "home"),
        # JupyterLab's built assets and the extensions (widgets, the Chinese language pack) are this environment's,
        # as the dependencies are: a full install would have put them in the new one
        JUPYTERLAB_DIR=str(shared / "lab"),
        JUPYTER_PATH=str(shared),
        JUPYTER_CONFIG_DIR=str(tmp / "home" / ".jupyter"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        PYTHONNOUSERSITE="1",
    )
    for name in ("PYTHONPATH", "JUPYTERLAB_SETTINGS_DIR", "TRANSFORMER_LAB_LANGUAGE", "VIRTUAL_ENV"):
        env.pop(name, None)
    where = subprocess.run(
        [python, "-c", "import transformer_lab.workspace as w; print(w.course_notebooks('en'))"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where) == Path(site) / "transformer_lab" / "notebooks", where

    command = [str(bin_dir / "transformer-lab"), "lab"]
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    copy = away / "my course"
    port = free_port()
    server = subprocess.Popen(
        [
            *command,
            "--no-browser",
            "--dir",
            str(copy),
            *root,
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}",
        ],
        cwd=away,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, status = time.monotonic() + 180, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status, body = get(f"{base}/api/status?token={TOKEN}")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert status == 200, f"the server did not answer on /api/status (exit {server.poll()})"
        assert "started" in json.loads(body)
        status, body = get(f"{base}/api/contents?token={TOKEN}")
        assert status == 200
        served = {item["name"] for item in json.loads(body)["content"]}
        assert set(chapters) <= served, f"JupyterLab does not serve the working copy: {sorted(served)}"
        assert get(f"{base}/lab?token={TOKEN}")[0] == 200
    finally:
        server.terminate()
        try:
            log = server.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            log = server.communicate()[0]
    assert "never overwritten" in log, log[-3000:]

    # every chapter, its exercises blank: the learner edition as the checkout built had it
    assert sorted(p.name for p in copy.glob("[0-9][0-9]_*.ipynb")) == chapters
    for chapter in chapters:
        text = (copy / chapter).read_text(encoding="utf-8")
        assert "### BEGIN SOLUTION" not in text, chapter
        assert (copy / chapter).read_bytes() == (course / chapter).read_bytes(), chapter

    # the learner's edit survives a second run, also after the course's version changed (an upgrade)
    mine = copy / chapters[1]
    mine.write_text(mine.read_text(encoding="utf-8").replace("YOUR CODE HERE", "我的答案"), encoding="utf-8")
    edited = mine.read_bytes()
    installed = Path(site) / "transformer_lab" / "notebooks" / chapters[1]
    installed.write_bytes(installed.read_bytes() + b"\n")
    again = subprocess.run(
        [*command, "--dir", str(copy), *root, "--version"], cwd=away, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert mine.read_bytes() == edited, "the second run lost the learner's edit"
    beside = copy / chapters[1].replace(".ipynb", ".updated.ipynb")
    assert beside.read_bytes() == installed.read_bytes() and beside.name in again.stdout

    # Chinese: the zh/ copy from the wheel, JupyterLab's interface in Chinese from the learner's folder
    zh = subprocess.run(
        [*command, "--language", "zh", "--dir", str(copy), *root, "--version"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
    )
    assert zh.returncode == 0, zh.stderr[-3000:]
    assert sorted(p.name for p in (copy / "zh").glob("[0-9][0-9]_*.ipynb")) == chapters_zh
    plugin = copy / ".jupyter-zh" / "user-settings" / "@jupyterlab" / "translation-extension"
    assert json.loads((plugin / "plugin.jupyterlab-settings").read_text(encoding="utf-8")) == {"locale": "zh_CN"}
