"""`transformer-lab lab` (transformer_lab/workspace.py): the working copy, the Chinese interface, and bad input.

JupyterLab itself is not started here (tests/test_wheel.py starts it from an installed wheel and asks its API);
these tests stand in for it with a recorder of the arguments it would get. Each bad input gets one sentence of
its own, and no learner file is lost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from transformer_lab import cli, workspace

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHAPTERS_ZH = sorted(p.name for p in (ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture
def jupyter(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record the argv JupyterLab would be started with, instead of starting it; and never as root."""
    from jupyterlab.labapp import LabApp

    calls: list[list[str]] = []
    monkeypatch.setattr(LabApp, "launch_instance", classmethod(lambda cls, argv=None, **kw: calls.append(argv)))
    monkeypatch.setattr(workspace, "_is_root", lambda: False)
    monkeypatch.delenv("JUPYTERLAB_SETTINGS_DIR", raising=False)
    monkeypatch.delenv("TRANSFORMER_LAB_LANGUAGE", raising=False)
    return calls


def one_sentence(text: str) -> str:
    text = text.strip()
    assert text.count("\n") == 0, f"expected one line, got {text!r}"
    assert text.startswith("transformer-lab lab: ") and text.endswith("."), text
    return text


def test_in_a_checkout_the_chapters_come_from_notebooks():
    assert workspace.course_notebooks("en") == ROOT / "notebooks"
    assert workspace.course_notebooks("zh") == ROOT / "notebooks" / "zh"
    assert workspace.default_dir() == ROOT / "my_notebooks"


def test_lab_makes_the_copy_and_opens_chapter_00_passing_jupyter_options_on(tmp_path, jupyter, capsys):
    folder = tmp_path / "张三 的 课程"  # a space and Chinese characters in the path
    assert cli.main(["lab", "--dir", str(folder), "--no-browser", "--port", "8899", "--ServerApp.token=x"]) == 0
    assert sorted(p.name for p in folder.glob("[0-9][0-9]_*.ipynb")) == CHAPTERS
    assert "never overwritten" in capsys.readouterr().out
    (argv,) = jupyter
    assert argv[0] == str(folder.resolve() / "00_start_here.ipynb")
    assert argv[1:] == ["--no-browser", "--port", "8899", "--ServerApp.token=x"]
    assert "JUPYTERLAB_SETTINGS_DIR" not in os.environ  # English: JupyterLab's own settings


def test_zh_makes_the_chinese_copy_and_a_chinese_interface_kept_once_changed(tmp_path, jupyter):
    folder = tmp_path / "course"
    assert cli.main(["lab", "--language", "zh", "--dir", str(folder)]) == 0
    assert sorted(p.name for p in (folder / "zh").glob("[0-9][0-9]_*.ipynb")) == CHAPTERS_ZH
    assert jupyter[0][0] == str(folder.resolve() / "zh" / "00_start_here.ipynb")
    option = "--LabApp.user_settings_dir="
    (settings,) = [Path(a.removeprefix(option)) for a in jupyter[0] if a.startswith(option)]
    assert settings == folder.resolve() / ".jupyter-zh" / "user-settings"
    assert "JUPYTERLAB_SETTINGS_DIR" not in os.environ  # for that server only, not the rest of this process
    plugin = settings / "@jupyterlab" / "translation-extension" / "plugin.jupyterlab-settings"
    assert json.loads(plugin.read_text(encoding="utf-8")) == {"locale": "zh_CN"}
    plugin.write_text('{"locale": "en"}\n', encoding="utf-8")  # the learner chose English in Settings > Language
    assert cli.main(["lab", "--language", "zh", "--dir", str(folder)]) == 0
    assert plugin.read_text(encoding="utf-8") == '{"locale": "en"}\n'


def test_the_settings_run_sh_kept_in_the_checkout_move_with_the_learner(tmp_path):
    """`bash run.sh lab zh` kept JupyterLab's settings in the checkout's .jupyter-zh/; they are copied once into the
    working copy's, never over settings already there."""
    earlier = tmp_path / "checkout" / ".jupyter-zh" / "user-settings"
    theme = earlier / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    theme.parent.mkdir(parents=True)
    theme.write_text('{"theme": "JupyterLab Dark"}\n', encoding="utf-8")
    folder = tmp_path / "course"
    settings = workspace.chinese_interface(folder, earlier)
    assert (settings / theme.relative_to(earlier)).read_text(encoding="utf-8") == '{"theme": "JupyterLab Dark"}\n'
    plugin = settings / workspace.TRANSLATION_PLUGIN
    assert json.loads(plugin.read_text(encoding="utf-8")) == {"locale": "zh_CN"}
    theme.write_text('{"theme": "JupyterLab Light"}\n', encoding="utf-8")
    workspace.chinese_interface(folder, earlier)  # the working copy has settings now: nothing is copied again
    assert "Dark" in (settings / theme.relative_to(earlier)).read_text(encoding="utf-8")


def test_a_second_run_keeps_an_edit_and_puts_the_new_version_beside_it(tmp_path, jupyter, capsys):
    course, folder = tmp_path / "course", tmp_path / "mine"
    shutil.copytree(ROOT / "notebooks", course, ignore=shutil.ignore_patterns("solutions", "zh"))
    workspace.sync(course, folder)
    mine = folder / CHAPTERS[1]
    mine.write_text(mine.read_text(encoding="utf-8").replace("YOUR CODE HERE", "my answer 你好"), encoding="utf-8")
    edited = mine.read_bytes()
    (course / CHAPTERS[1]).write_bytes((course / CHAPTERS[1]).read_bytes() + b"\n")  # the course changes it
    messages = workspace.sync(course, folder)
    assert mine.read_bytes() == edited
    beside = folder / CHAPTERS[1].replace(".ipynb", ".updated.ipynb")
    assert beside.read_bytes() == (course / CHAPTERS[1]).read_bytes()
    assert len(messages) == 1 and "kept" in messages[0]


def test_an_unknown_language_is_one_sentence(tmp_path, jupyter, capsys):
    assert cli.main(["lab", "--language", "fr", "--dir", str(tmp_path / "x")]) == 2
    err = one_sentence(capsys.readouterr().err)
    assert "--language must be en or zh, got 'fr'" in err
    assert not (tmp_path / "x").exists() and not jupyter


def test_a_dir_whose_parent_does_not_exist_is_one_sentence(tmp_path, jupyter, capsys):
    missing = tmp_path / "no such folder" / "course"
    assert cli.main(["lab", "--dir", str(missing)]) == 2
    err = one_sentence(capsys.readouterr().err)
    assert "does not exist" in err and str(missing.parent) in err
    assert not missing.parent.exists() and not jupyter


def test_a_dir_that_is_a_file_is_one_sentence(tmp_path, jupyter, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine", encoding="utf-8")
    assert cli.main(["lab", "--dir", str(notes)]) == 2
    assert "is a file, not a folder" in one_sentence(capsys.readouterr().err)
    assert notes.read_text(encoding="utf-8") == "mine"


def reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner may run `path` (every folder above it and the file itself: o+x), both
    where it is named and, for a link (a venv's python), where it leads."""
    return all(
        p.stat().st_mode & 0o001 for start in (path.absolute(), path.resolve()) for p in (start, *start.parents)
    )


def test_a_read_only_dir_is_one_sentence_and_nothing_is_lost():
    """A real read-only folder: its mode 0555, and the command run as an ordinary user (root writes anywhere, so
    where the tests run as root the command runs as `nobody`, in a folder that nobody can reach)."""
    base = Path(tempfile.mkdtemp(prefix="transformer-lab-read-only-"))
    base.chmod(0o755)
    folder = base / "read-only"
    folder.mkdir()
    (folder / "mine.txt").write_text("my notes", encoding="utf-8")
    folder.chmod(0o555)
    command = [sys.executable, "-m", "transformer_lab.cli", "lab"]
    user = {}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        # nobody needs a Python it may run: this one, else the system's, which runs the module's file (it imports
        # only the standard library up to the folder check)
        usable = [
            p
            for p in (sys.executable, shutil.which("python3"), "/usr/bin/python3")
            if p and Path(p).exists() and reachable_by_others(Path(p))
        ]
        if not usable:
            shutil.rmtree(base)
            pytest.skip("running as root, and no Python that the user nobody may run: cannot make a read-only folder")
        if usable[0] != sys.executable:
            module = ROOT / "transformer_lab" / "workspace.py"
            if not (reachable_by_others(module.parent) and module.stat().st_mode & 0o004):
                shutil.rmtree(base)
                pytest.skip(f"running as root, and the user nobody may not read {module}: cannot run the command")
            command = [usable[0], "-I", str(module)]
    try:
        run = subprocess.run(
            [*command, "--dir", str(folder), "--no-browser"],
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=dict(os.environ, HOME=str(base), PYTHONIOENCODING="utf-8"),
            cwd=base,
            timeout=120,
            **user,
        )
    finally:
        folder.chmod(0o755)
        listing = sorted(p.name for p in folder.iterdir())
        kept = (folder / "mine.txt").read_text(encoding="utf-8")
        shutil.rmtree(base)
    assert run.returncode == 2, run.stdout + run.stderr
    err = one_sentence(run.stderr)
    assert "cannot be written" in err and str(folder) in err
    assert listing == ["mine.txt"] and kept == "my notes"


def test_a_broken_manifest_is_said_and_set_aside_and_no_work_is_lost(tmp_path, jupyter, capsys):
    folder = tmp_path / "mine"
    assert cli.main(["lab", "--dir", str(folder)]) == 0
    work = folder / CHAPTERS[1]
    work.write_text(work.read_text(encoding="utf-8") + " ", encoding="utf-8")
    edited = work.read_bytes()
    (folder / workspace.MANIFEST).write_text('{"01_attention.ipynb": {"copied": ', encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["lab", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "could not be read" in out and workspace.BROKEN_MANIFEST in out
    assert (folder / workspace.BROKEN_MANIFEST).read_text(encoding="utf-8") == '{"01_attention.ipynb": {"copied": '
    assert work.read_bytes() == edited
    assert workspace.read_manifest(folder)  # a good manifest again
    # JSON of the wrong shape is broken too
    (folder / workspace.MANIFEST).write_text("[1, 2]", encoding="utf-8")
    assert "not a map" in workspace.sync(ROOT / "notebooks", folder)[0]
    assert work.read_bytes() == edited


def test_as_root_it_says_why_and_how_to_go_on(tmp_path, jupyter, monkeypatch, capsys):
    monkeypatch.setattr(workspace, "_is_root", lambda: True)
    assert cli.main(["lab", "--dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "refuses to start as root" in err and "--allow-root" in err
    assert not (tmp_path / "c").exists() and not jupyter
    assert cli.main(["lab", "--dir", str(tmp_path / "c"), "--allow-root"]) == 0
    assert "--allow-root" in jupyter[0]


def test_a_deleted_chapter_00_does_not_hide_what_was_kept(tmp_path, jupyter, capsys, monkeypatch):
    """Without chapter 00 a run counts as a first one (every chapter added, said in one line), but a kept chapter
    whose new version is put beside it is still said."""
    course, folder = tmp_path / "course", tmp_path / "mine"
    shutil.copytree(ROOT / "notebooks", course, ignore=shutil.ignore_patterns("solutions", "zh"))
    monkeypatch.setattr(workspace, "course_notebooks", lambda language: course)
    assert cli.main(["lab", "--dir", str(folder)]) == 0
    mine = folder / CHAPTERS[1]
    mine.write_text(mine.read_text(encoding="utf-8") + " ", encoding="utf-8")
    (folder / CHAPTERS[0]).unlink()
    (course / CHAPTERS[1]).write_bytes((course / CHAPTERS[1]).read_bytes() + b"\n")  # the course changes it
    capsys.readouterr()
    assert cli.main(["lab", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "never overwritten" in out and ": added" not in out
    assert "so it was kept as it is" in out and CHAPTERS[1].replace(".ipynb", ".updated.ipynb") in out


def test_without_jupyterlab_it_says_how_to_install_the_lab_extra(tmp_path, monkeypatch, capsys):
    """JupyterLab is the `[lab]` extra, not a dependency (a hosted runtime must keep its own kernel): without it the
    command says in one sentence how to install it, after making the working copy."""
    monkeypatch.setattr(workspace, "_is_root", lambda: False)
    monkeypatch.setitem(sys.modules, "jupyterlab.labapp", None)  # `from jupyterlab.labapp import ...` fails
    assert cli.main(["lab", "--dir", str(tmp_path / "c")]) == 2
    err = one_sentence(capsys.readouterr().err)
    assert "JupyterLab is not installed" in err and 'pip install "attention-transformer-course[lab]"' in err
