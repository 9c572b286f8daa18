"""The course under a GBK locale, as on a Chinese Windows machine (code page 936), with Python's UTF-8 mode off.

The locale zh_CN.GBK is built without root (`localedef -i zh_CN -f GBK DIR/zh_CN.GBK`, used through LOCPATH);
without localedef the tests skip, saying why (under CI they fail). GBK lacks 81 of the Tang corpus's 5,711
characters (GB18030 has them all, so a GB18030 locale would hide a missing `encoding=`): a file written in the
locale's encoding fails on them, or is misread by a tool that reads UTF-8.

- Python under it says GBK (`locale.getpreferredencoding()`, the default of every `open()`).
- The unit tests of the working copy, data, BPE and the command line pass under it.
- What a learner's session writes (tests/locale_writer.py: the working copy, a BPE trained on Tang poems with
  characters GBK lacks, its ids and text, a tiny GPT and its sample, in folders with spaces and Chinese names)
  is the same file for file as under C.UTF-8, measured times aside.
- So is what grading a Chinese class writes (tests/classroom_locale_writer.py: two students named 张三 and 李四, a
  notebook handed in under a Chinese title, in `张三 的 课程/`): the student version, the grades, the records,
  the report and the feedback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import require

ROOT = Path(__file__).resolve().parents[1]
#: the unit tests run under GBK: the working copy, data, BPE, the command line
UNIT_TESTS = [
    "tests/test_lab.py",
    "tests/test_data.py",
    "tests/test_bpe.py",
    "tests/test_cli.py",
    "tests/test_editions.py::test_a_first_sync_copies_every_chapter",
    "tests/test_editions.py::test_an_unedited_copy_is_refreshed",
    "tests/test_editions.py::test_an_edited_copy_is_never_overwritten_and_the_new_version_is_put_beside_it",
    "tests/test_editions.py::test_a_new_chapter_is_added_and_a_deleted_one_comes_back",
    "tests/test_editions.py::test_the_workspace_command_creates_the_copy",
]

pytestmark = pytest.mark.slow


def environment(**settings: str) -> dict[str, str]:
    """This environment without any locale or encoding setting of its own, plus `settings`, UTF-8 mode off."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE", "LOCPATH", "PYTHONUTF8", "PYTHONIOENCODING")
    }
    env.update(PYTHONUTF8="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **settings)
    return env


@pytest.fixture(scope="module")
def gbk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a zh_CN.GBK locale built here, without root."""
    localedef = shutil.which("localedef")
    require(localedef is not None, "localedef (glibc's locale compiler, Debian's libc-bin) is missing: no zh_CN.GBK")
    locales = tmp_path_factory.mktemp("locales")
    made = subprocess.run(
        [localedef, "-i", "zh_CN", "-f", "GBK", str(locales / "zh_CN.GBK")], capture_output=True, text=True
    )
    require(
        (locales / "zh_CN.GBK").is_dir(),
        f"localedef could not build zh_CN.GBK (are glibc's locale sources, /usr/share/i18n, installed?): "
        f"{made.stderr.strip()[-300:]}",
    )
    return environment(LC_ALL="zh_CN.GBK", LOCPATH=str(locales))


def python(env: dict[str, str], *args: str, cwd: Path = ROOT, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=timeout, check=False)


def test_python_under_the_locale_says_gbk_and_gbk_lacks_tang_characters(gbk):
    said = python(gbk, "-c", "import locale, sys; print(locale.getpreferredencoding(), sys.getfilesystemencoding())")
    assert said.returncode == 0, said.stderr.decode("utf-8", "replace")
    assert said.stdout.decode("ascii").split() == ["GBK", "gbk"]
    from transformer_lab.data import load_corpus

    characters = set(load_corpus("tang"))
    lacking = [c for c in characters if not c.isspace() and not _encodes(c, "gbk")]
    assert lacking, "GBK encodes every character of the Tang corpus: the test could not fail"
    assert all(_encodes(c, "gb18030") for c in lacking)
    print(f"GBK lacks {len(lacking)} of the Tang corpus's {len(characters)} characters")


def _encodes(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def test_the_unit_tests_of_the_working_copy_data_bpe_and_cli_pass_under_gbk(gbk, tmp_path):
    run = python(gbk, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'pytest'}", *UNIT_TESTS)
    out = run.stdout.decode("gbk", "replace") + run.stderr.decode("gbk", "replace")
    assert run.returncode == 0, out[-4000:]
    assert " passed" in out and " failed" not in out


def test_what_a_session_writes_is_the_same_under_gbk_and_utf8(gbk, tmp_path):
    course = tmp_path / "course"  # one copy of the chapters for both runs, whatever else changes notebooks/
    (course / "zh").mkdir(parents=True)
    for chapter in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        shutil.copyfile(chapter, course / chapter.name)
    for chapter in (ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"):
        shutil.copyfile(chapter, course / "zh" / chapter.name)
    utf8 = same_under_gbk_and_utf8(gbk, tmp_path, "locale_writer.py", str(course))
    assert any(name.endswith(".pt") for name in utf8) and len(utf8) > 30


def same_under_gbk_and_utf8(gbk: dict[str, str], tmp_path: Path, writer: str, *args: str) -> dict[str, object]:
    """Run tests/WRITER OUT *ARGS under C.UTF-8, then under zh_CN.GBK; assert that the digests of what the two runs
    wrote (OUT/digest.json) are equal, and return it. Both runs write into the same folder (a checkpoint records
    the paths it was trained from; the classroom's printout names its folders), renamed to utf8/ and gbk/ after."""
    digests = {}
    for name, env in (("utf8", environment(LC_ALL="C.UTF-8")), ("gbk", gbk)):
        out = tmp_path / "run"
        out.mkdir()
        run = python(env, str(ROOT / "tests" / writer), str(out), *args, cwd=tmp_path)
        assert run.returncode == 0, f"{name}: " + run.stderr.decode("utf-8", "replace")[-4000:]
        digests[name] = json.loads((out / "digest.json").read_text(encoding="utf-8"))
        out.rename(tmp_path / name)
    utf8, gbk_files = digests["utf8"], digests["gbk"]
    assert sorted(gbk_files) == sorted(utf8), "the two runs wrote different files"
    differ = [name for name in utf8 if gbk_files[name] != utf8[name]]
    assert not differ, f"written differently under GBK: {differ}"
    return utf8


def test_grading_a_chinese_class_writes_the_same_files_under_gbk_and_utf8(gbk, tmp_path):
    """Issue 37: a two-student class with Chinese names (张三, 李四), a notebook handed in under a Chinese title, in a
    folder with spaces and Chinese characters, graded with tools/classroom.py's commands
    (tests/classroom_locale_writer.py): the student version, the grades (CSV), the records and notes (JSON), the
    report (markdown) and the feedback (HTML) are the same files under zh_CN.GBK as under C.UTF-8."""
    from support import _sandbox_reason

    # one copy of the chapter and of the grading code for both runs, whatever else changes the repository
    frozen = tmp_path / "repository"
    shutil.copytree(ROOT / "transformer_lab", frozen / "transformer_lab", ignore=shutil.ignore_patterns("__pycache__"))
    (frozen / "tools").mkdir()
    for name in ("tools/classroom.py", "tools/editions.py", "requirements.txt"):
        shutil.copyfile(ROOT / name, frozen / name)
    chapter = tmp_path / "chapter" / "01_attention.ipynb"
    chapter.parent.mkdir()
    shutil.copyfile(ROOT / "notebooks" / "zh" / "solutions" / "01_attention.ipynb", chapter)
    sandbox = [] if _sandbox_reason() is None else ["--no-sandbox"]  # both runs alike, with a sandbox where one runs
    utf8 = same_under_gbk_and_utf8(gbk, tmp_path, "classroom_locale_writer.py", str(chapter), str(frozen), *sandbox)
    kinds = {Path(name).suffix for name in utf8}
    assert {".csv", ".json", ".md", ".html", ".ipynb"} <= kinds, kinds
    assert any("张三" in name and name.endswith(".html") for name in utf8)  # the feedback of a Chinese-named student
    page = tmp_path / "utf8" / "张三 的 课程" / "课堂" / "feedback" / "李四" / "01_attention" / "01_attention.html"
    assert "尚未完成" in page.read_text(encoding="utf-8")
