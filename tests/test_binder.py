"""The mybinder.org configuration in binder/: pins, Python version, and a postBuild that works.

What can be checked without Docker and without the network: the pins agree with requirements.txt
(what CI tests), the CPU wheel index is there for torch, runtime.txt names the Python the package
needs, and postBuild, run in a fresh virtual environment, installs the package there. The fresh
environment sees the dependencies of this one through a .pth file (installing torch afresh needs the
network): postBuild's own work, the package installed with --no-deps, is what the test exercises,
and the installed copy, not this checkout, is then imported. If repo2docker is installed, its dry
run (`--no-build --debug`, no Docker needed) shows the image Binder would build.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from support import require, share_dependencies

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


def requirement_lines(path: pathlib.Path) -> list[str]:
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def pins(lines: list[str]) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines; other lines are ignored here."""
    found = {}
    for line in lines:
        match = PIN.match(line)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            assert name not in found, f"{name} pinned twice"
            found[name] = match.group(2)
    return found


def test_binder_pins_are_exactly_those_of_requirements_txt():
    ours = requirement_lines(ROOT / "requirements.txt")
    binder = requirement_lines(BINDER / "requirements.txt")
    assert pins(ours), "requirements.txt pins nothing"
    assert pins(binder) == pins(ours)
    assert pins(binder)["torch"] == "2.13.0"


def test_binder_requirements_have_the_cpu_index_and_nothing_local():
    lines = requirement_lines(BINDER / "requirements.txt")
    options = [line for line in lines if line.startswith("-")]
    assert options == [CPU_INDEX], f"expected only the CPU wheel index as an option, got {options}"
    for line in lines:
        if line != CPU_INDEX:
            assert PIN.match(line), f"not an exact pin (local paths, -r, -e, URLs and ranges break caching): {line}"


def test_runtime_txt_names_the_python_the_package_needs():
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert match, f"runtime.txt should read python-X.Y, got {runtime!r}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", requires)
    assert minimum, f"unexpected requires-python {requires!r}"
    assert (int(match.group(1)), int(match.group(2))) == (3, 11)
    assert (int(match.group(1)), int(match.group(2))) >= (int(minimum.group(1)), int(minimum.group(2)))


def test_postbuild_is_executable_in_git_too():
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild is not executable"
    assert post_build.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    if (ROOT / ".git").exists() and shutil.which("git"):
        staged = subprocess.run(
            ["git", "ls-files", "-s", "binder/postBuild"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        if staged:  # committed: a fresh clone gets the mode git recorded
            assert staged.startswith("100755 "), f"git records binder/postBuild as {staged.split()[0]}, not 100755"


def test_binder_installs_no_grading_server():
    text = "\n".join(
        requirement_lines(BINDER / "requirements.txt") + [(BINDER / "postBuild").read_text(encoding="utf-8")]
    )
    for unwanted in ("nbgrader", "jupyter labextension", "jupyter server extension", "jupyter nbextension"):
        assert unwanted not in text


@pytest.mark.slow
def test_postbuild_installs_the_package_in_a_fresh_venv(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md", "binder"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, repo / name)
    shutil.copytree(ROOT / "transformer_lab", repo / "transformer_lab", ignore=shutil.ignore_patterns("__pycache__"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    # The course's dependencies (torch, matplotlib, ...) come from this environment, after the venv's own;
    # so does setuptools: the venv's bundled one (65) is older than pyproject.toml asks for and than Binder's.
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, capture_output=True)
    site = str(share_dependencies(python))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PIP_NO_INDEX="1",  # offline: postBuild must not need to download anything
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        MPLCONFIGDIR=str(tmp_path / "mpl"),
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(["./binder/postBuild"], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list((tmp_path / "mpl").glob("fontlist-*.json")), "postBuild did not build matplotlib's font cache"

    shutil.rmtree(repo)  # what is imported now must be the installed copy
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = project["name"]  # the distribution's name: the import name is transformer_lab
    assert "version" in project["dynamic"]
    check = subprocess.run(
        [
            python,
            "-c",
            f"import importlib.metadata as m, transformer_lab as tl; print(tl.__file__, m.version({name!r}), "
            "tl.__version__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    where, version, declared = check.stdout.split()
    assert pathlib.Path(where).is_relative_to(site), f"imported from {where}, not from the venv's {site}"
    assert version == declared  # the version lives in one place, transformer_lab/__init__.py


@pytest.mark.slow
def test_repo2docker_dry_run(tmp_path):
    """repo2docker (a test dependency) builds nothing without Docker, but its dry run shows the image it would build."""
    beside_python = pathlib.Path(sys.executable).parent / "repo2docker"
    executable = os.environ.get("REPO2DOCKER") or (str(beside_python) if beside_python.exists() else None)
    executable = executable or shutil.which("repo2docker")
    require(executable is not None, "repo2docker is not installed (pip install -r requirements-test.txt)")
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.txt", "binder"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, repo / name)
    proc = subprocess.run(
        [executable, "--no-build", "--debug", "--user-id", "1000", "--user-name", "jovyan", str(repo)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "python=3.11" in out
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in out
    # The requirements layer is built before the repository is copied in, so Binder can cache it.
    assert out.index('-r "binder/requirements.txt"') < out.index("COPY --chown=1000:1000 src/ ${REPO_DIR}/")
    assert "RUN ./binder/postBuild" in out


def test_readme_badge_opens_the_start_notebook_on_binder():
    """The README's Binder link opens JupyterLab at the first chapter, which exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"https://mybinder\.org/v2/gh/[^\s)]+", readme)
    assert links, "README.md has no mybinder.org link (see docs/teaching.md, section Binder)"
    for link in links:
        match = re.fullmatch(r"https://mybinder\.org/v2/gh/([^/]+)/([^/]+)/HEAD\?urlpath=lab/tree/(\S+)", link)
        assert match, f"expected https://mybinder.org/v2/gh/OWNER/REPO/HEAD?urlpath=lab/tree/<notebook>, got {link}"
        assert match.group(3) in ("notebooks/00_start_here.ipynb", "notebooks/zh/00_start_here.ipynb"), link
        assert (ROOT / match.group(3)).is_file(), link
    assert any(link.endswith("notebooks/00_start_here.ipynb") for link in links)


def test_the_chinese_badge_opens_the_chinese_edition_and_agrees_with_readme():
    """README.md and README.zh.md each have a badge to the Chinese learner edition, with the same OWNER/REPO
    as README.md's English badge (README.md says where to change them)."""
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    chinese = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert "README.zh.md" in english.split("\n\n", 2)[1], "README.md should link README.zh.md at its top"
    repos = set()
    for text in (english, chinese):
        zh = re.findall(
            r"https://mybinder\.org/v2/gh/([^/]+/[^/]+)/HEAD\?urlpath=lab/tree/notebooks/zh/00_start_here\.ipynb", text
        )
        assert zh, "no badge to notebooks/zh/00_start_here.ipynb"
        repos |= set(zh)
    repos |= set(re.findall(r"https://mybinder\.org/v2/gh/([^/]+/[^/]+)/HEAD", english))
    assert len(repos) == 1, f"the badges name different repositories: {sorted(repos)}"
    for pin in ("requirements.txt", "binder/requirements.txt"):
        assert re.search(r"^jupyterlab-language-pack-zh-CN==\S+$", (ROOT / pin).read_text(encoding="utf-8"), re.M), pin
