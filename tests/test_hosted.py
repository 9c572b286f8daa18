"""Hosted notebooks (Colab, Kaggle, any hosted Jupyter): the install lines at the top of every setup cell.

Fast: every chapter has the lines tools/install_cell.py writes (the README's OWNER/REPO, the version), both READMEs
the Colab and Kaggle links; the Chinese editions carry the lines with their comments in Chinese; run where the package
is there, the lines print nothing; run where it is missing (pip mocked), they ask pip for the wheel with the
[equality] extra and nothing that would replace a PyTorch already in range, honour TRANSFORMER_LAB_WHEEL, and print
one line (pip's own warnings captured); where pip fails (a wheel URL nothing answers, as without internet) they show
pip's messages and stop with one sentence; the hosted install's requirements bring no JupyterLab and no kernel.

Slow (a hosted runtime, tools/hosted_check.py's machinery): the wheel is built from the checkout, a fresh venv gets
this environment's PyTorch, JupyterLab, ipykernel, matplotlib and the wheel's other dependencies but not the course,
and chapters 00 and 01 are copied alone into an empty folder and executed there, in English and in Chinese, with
TRANSFORMER_LAB_WHEEL pointing at the wheel. Each installs the course, prints the one line, and runs to the end, and
PyTorch's files are the same afterwards, as are the kernel's (ipykernel, IPython, jupyter_client). Measured on the
shared 2-core machine beside other jobs: 11 min 12 s for the four (the wheel built in 58 s, the venv made in 151 s,
the chapters 81-151 s each with the install); pip's install itself is 3 s of CPU, the rest is waiting for a share of
the cores. Without git, `build` or a way to make the venv, it skips saying why, except under CI.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tomllib

import pytest
from support import require

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import editions  # noqa: E402  (tools/editions.py)
import install_cell  # noqa: E402  (tools/install_cell.py)
import translate  # noqa: E402  (tools/translate.py)

#: What the hosted install must not bring: JupyterLab, a kernel, or what comes with them.
KERNEL_PACKAGES = {"jupyterlab", "ipykernel", "jupyterlab-language-pack-zh-cn", "notebook", "jupyter-server", "jupyter"}
SOURCES = sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def setup_source(path: pathlib.Path) -> str:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return editions.source_text(next(c for c in notebook["cells"] if c["cell_type"] == "code"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_setup_cell_starts_with_the_install_lines(path):
    source = setup_source(path)
    assert source.startswith(install_cell.block_text()), (
        f"{path.name}: the setup cell does not start with the install lines (python tools/install_cell.py "
        f"{path.name[:2]}, then regenerate its editions)"
    )
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert install_cell.with_install_block(notebook)[1] is False  # running the tool again changes nothing


def test_the_lines_name_the_readme_place_the_version_and_the_extra():
    text = install_cell.block_text()
    repository = install_cell.repository()
    version = install_cell.version()
    import transformer_lab

    assert version == transformer_lab.__version__
    assert f"https://github.com/{repository}/releases/download/v{version}" in text
    assert f"attention_transformer_course-{version}-py3-none-any.whl" in text
    assert "attention-transformer-course[equality] @ " in text
    readme_place = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert f"mybinder.org/v2/gh/{repository}/HEAD" in readme_place


def test_the_readmes_have_colab_and_kaggle_links_for_every_chapter_of_their_table():
    assert install_cell.readmes_to_write() == {}, "stale links: run python tools/install_cell.py --all"
    for readme, folder in (("README.md", "notebooks"), ("README.zh.md", "notebooks/zh")):
        text = (ROOT / readme).read_text(encoding="utf-8")
        rows = [line for line in text.splitlines() if install_cell.ROW.match(line)]
        names = [install_cell.ROW.match(row).group(1) for row in rows]
        assert names == [path.stem for path in SOURCES], f"{readme}: the table of chapters has {names}"
        for row in rows:
            notebook = f"{folder}/{install_cell.ROW.match(row).group(1)}.ipynb"
            assert (ROOT / notebook).exists(), f"{readme}: {notebook} is not a chapter"
            assert row.endswith(
                f"| [Colab]({install_cell.colab_url(notebook)}) · [Kaggle]({install_cell.kaggle_url(notebook)}) |"
            ), row


def test_a_link_to_something_that_is_not_a_chapter_is_refused():
    with pytest.raises(ValueError, match="notebook='README.md': expected notebooks/NN_name.ipynb"):
        install_cell.colab_url("README.md")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
@pytest.mark.parametrize("edition", ["notebooks", "notebooks/zh/solutions", "notebooks/zh"])
def test_the_other_editions_carry_the_lines_with_chinese_comments(edition, path):
    common = translate.common_code()
    source = setup_source(ROOT / edition / path.name)
    expected = install_cell.block_text()
    if "zh" in edition:
        for words in translate.code_words(expected):
            assert common.get(words.text), f"translations/zh/common.json: no Chinese for {words.text!r}"
            expected = expected.replace(words.text, common[words.text])
    assert source.startswith(expected), f"{edition}/{path.name}: regenerate the editions"


def run_lines(monkeypatch, capsys, installed: bool, torch_versions=("2.9.1", "2.9.1"), wheel=None):
    """Execute the install lines with importlib and pip mocked; return (the pip commands run, what was printed)."""
    calls = []
    versions = iter(torch_versions)
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "transformer_lab":
            return real_find_spec(name) if installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: next(versions))

    def pip(command, **options):  # pip as on Colab/Kaggle (root, an older pip): noise the lines must not show
        calls.append(command)
        assert options == {"capture_output": True, "text": True}
        noise = "WARNING: Running pip as the 'root' user can result in broken permissions\n"
        return subprocess.CompletedProcess(command, 0, "", noise + "[notice] A new release of pip is available\n")

    monkeypatch.setattr(subprocess, "run", pip)
    if wheel is None:
        monkeypatch.delenv(install_cell.ENVIRONMENT, raising=False)
    else:
        monkeypatch.setenv(install_cell.ENVIRONMENT, wheel)
    exec(compile(install_cell.block_text(), "<install lines>", "exec"), {})
    return calls, capsys.readouterr().out


def test_where_the_course_is_installed_the_lines_do_nothing(monkeypatch, capsys):
    calls, printed = run_lines(monkeypatch, capsys, installed=True)
    assert calls == [] and printed == ""


def test_where_it_is_missing_they_install_the_release_wheel_and_say_so(monkeypatch, capsys):
    calls, printed = run_lines(monkeypatch, capsys, installed=False)
    assert len(calls) == 1
    command = calls[0]
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[-1] == f"attention-transformer-course[equality] @ {install_cell.wheel_url()}"
    # nothing that would replace a requirement already met (a PyTorch in range)
    forcing = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I", "--upgrade-strategy", "--no-deps"}
    assert not forcing & set(command)
    assert printed == f"installed transformer_lab from {install_cell.wheel_url()}; PyTorch 2.9.1 kept\n"


def test_the_wheel_can_be_redirected_and_a_replaced_pytorch_is_said(monkeypatch, capsys):
    calls, printed = run_lines(
        monkeypatch, capsys, installed=False, torch_versions=("2.8.0", "2.13.0"), wheel="file:///tmp/x.whl"
    )
    assert calls[0][-1] == "attention-transformer-course[equality] @ file:///tmp/x.whl"
    assert printed == "installed transformer_lab from file:///tmp/x.whl; PyTorch 2.13.0 installed\n"


def test_where_pip_fails_one_sentence_says_why_and_the_cell_stops_short(tmp_path):
    """A runtime without internet (a Kaggle notebook until Settings > Internet is on), here a wheel URL nothing
    answers: pip really runs (no retries), its messages are shown, then a RuntimeError of one sentence, raised in the
    lines themselves and not from inside subprocess."""
    with socket.socket() as s:  # a port on which nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wheel = f"http://127.0.0.1:{port}/attention_transformer_course-0.1.0-py3-none-any.whl"
    script = tmp_path / "run.py"
    script.write_text(
        "import importlib.util, traceback\n"
        "find_spec = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'transformer_lab' else find_spec(name, *a)\n"
        f"lines = {install_cell.block_text()!r}\n"
        "try:\n"
        "    exec(compile(lines, '<install lines>', 'exec'), {})\n"
        "except RuntimeError as error:\n"
        "    frames = traceback.extract_tb(error.__traceback__)\n"
        "    print('ERROR', [f.filename for f in frames][-1], error.__cause__, error.__suppress_context__)\n"
        "    print('MESSAGE', error)\n",
        encoding="utf-8",
    )
    env = dict(os.environ, TRANSFORMER_LAB_WHEEL=wheel, PIP_RETRIES="0", PIP_TIMEOUT="5", PIP_NO_INDEX="1")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert out[0] == "ERROR <install lines> None True", done.stdout  # raised by the lines, from None
    assert out[1] == (
        f"MESSAGE pip could not install the course from {wheel} (its messages are above); if this runtime has no "
        "internet access, turn it on (on Kaggle: Settings > Internet) and run this cell again."
    )
    assert len(out) == 2 and "installed transformer_lab" not in done.stdout
    assert "ERROR" in done.stderr and str(port) in done.stderr, done.stderr  # pip's own messages, shown


def test_the_install_asks_for_no_jupyterlab_nor_a_kernel():
    """The lines install the wheel with [equality] only: its dependencies must not bring JupyterLab, ipykernel or
    the language pack, which would replace the kernel packages a hosted runtime pins (Colab's ipykernel 5.5.6,
    IPython 7.34). They are the [lab] extra, for `transformer-lab lab` (tests/test_wheel.py reads the built wheel)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    hosted = [*project["dependencies"], *project["optional-dependencies"]["equality"]]
    names = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in hosted}
    assert not names & KERNEL_PACKAGES, sorted(names & KERNEL_PACKAGES)
    lab = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in project["optional-dependencies"]["lab"]}
    assert {"jupyterlab", "ipykernel", "jupyterlab-language-pack-zh-cn"} <= lab
    assert "[equality] @ " in install_cell.block_text() and "[lab" not in install_cell.block_text()


def test_the_tool_puts_the_lines_at_the_top_of_the_setup_cell_once(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# 99 · A chapter"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "source": ["import transformer_lab as tl\n"]},
        ]
    }
    updated, changed = install_cell.with_install_block(notebook)
    assert changed and len(updated["cells"]) == 2
    text = editions.source_text(updated["cells"][1])
    assert text == install_cell.block_text() + "\nimport transformer_lab as tl\n"
    assert install_cell.with_install_block(updated) == (updated, False)
    table = "| chapter | topic | links |\n| --- | --- | --- |\n| `00_a` | x | old |\n| `01_b` | y |\n"
    assert install_cell.with_links(table, "notebooks", "links").splitlines()[2:] == [
        f"| `00_a` | x | {install_cell.links_cell('notebooks', '00_a')} |",
        f"| `01_b` | y | {install_cell.links_cell('notebooks', '01_b')} |",  # a new row keeps its cells
    ]
    stale = text.replace("releases/download", "releases/OLD")
    updated["cells"][1]["source"] = editions.as_lines(stale)
    again, changed = install_cell.with_install_block(updated)
    assert changed and editions.source_text(again["cells"][1]) == text


# ------------------------------------------------------------------ a hosted runtime: a fresh venv, no course


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    import hosted_check as hosted

    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "needs git and a checkout to build from")
    require(importlib.util.find_spec("build") is not None, "needs the `build` package (requirements-test.txt)")
    work = tmp_path_factory.mktemp("hosted")
    wheel = hosted.build_wheel(work)
    try:
        python = hosted.make_runtime(work / "venv", wheel)
    except RuntimeError as error:
        require(False, f"cannot make the hosted runtime's venv here: {str(error)[:300]}")
    return {
        "hosted": hosted,
        "work": work,
        "wheel": wheel,
        "python": python,
        "torch": hosted.torch_fingerprint(python),
        "kernel": kernel_fingerprint(python),
    }


def kernel_fingerprint(python: pathlib.Path) -> str:
    """The runtime's kernel packages (ipykernel, IPython, jupyter_client) as installed: versions and RECORDs."""
    code = (
        "import importlib.metadata as m\n"
        "for name in ('ipykernel', 'ipython', 'jupyter_client'):\n"
        "    d = m.distribution(name); print(name, d.version); print(d.read_text('RECORD'))\n"
    )
    found = subprocess.run([python, "-c", code], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr[-500:]
    return found.stdout


@pytest.mark.slow
@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("chapter", ["00_start_here", "01_attention"])
def test_a_chapter_installs_the_course_and_runs_to_the_end_on_a_fresh_runtime(runtime, chapter, language):
    hosted, python, wheel = runtime["hosted"], runtime["python"], runtime["wheel"]
    notebook = ROOT / "notebooks" / ("zh" if language == "zh" else "") / f"{chapter}.ipynb"
    result = hosted.run_chapter(python, notebook, runtime["work"], wheel, quick=True)
    torch = runtime["torch"].splitlines()[0]
    assert result.get("error") is None, result["error"]
    assert result["ran"] == result["cells"], f"{result['ran']} of {result['cells']} code cells ran"
    lines = result["setup_output"].splitlines()
    assert lines[:1] == [hosted.expected_line(wheel, torch)], result["setup_output"]
    assert sum(line.startswith("installed transformer_lab") for line in lines) == 1
    # pip's own lines (as root here, as on Colab and Kaggle: its root-user warning) are not shown
    assert not [line for line in lines if line.startswith(("WARNING", "[notice]", "ERROR"))], result["setup_output"]
    assert hosted.torch_fingerprint(python) == runtime["torch"], "the install replaced PyTorch"
    assert kernel_fingerprint(python) == runtime["kernel"], "the install replaced the runtime's kernel packages"
    print(f"{language}/{chapter}: {result['wall']:.0f} s on a fresh runtime, the install included")
