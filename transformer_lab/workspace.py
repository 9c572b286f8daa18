"""The learner's own working copy of the course, and the command that opens it: `transformer-lab lab`.

    transformer-lab lab [--language en|zh] [--dir PATH] [--no-browser] [--allow-root] [jupyter lab options]

The learner edition of the chapters belongs to the course: a wheel carries it inside the package
(`transformer_lab/notebooks/`, `transformer_lab/notebooks/zh/`), a checkout of the repository has it in
`notebooks/` and `notebooks/zh/`, and `git pull` or `pip install --upgrade` updates it. A learner works in a
copy of it, which `sync` creates on first use and keeps in step with the course without ever losing work:

- a chapter the learner does not have yet is copied in (a new chapter, or one the learner deleted);
- a chapter the learner never changed is refreshed when the course's version changes;
- a chapter the learner changed (edited, or only ran: its outputs changed) is never overwritten. When
  the course's version of it changes, the new version is put beside it as `NN_name.updated.ipynb`,
  and the learner is told.

What "changed" means is recorded in the copy's `.course_versions.json`: for each chapter, the SHA-256 of
the course's file that was copied. A learner's file whose bytes still hash to that value is unchanged.

The working copy is `my_notebooks/` in a checkout (git-ignored), `~/transformer_lab_notebooks/` where the
course is installed from a wheel, or `--dir`; the Chinese edition goes into its `zh/` folder. Everything here
is pure Python with `pathlib`, so the command runs the same on Windows, macOS and Linux.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LANGUAGES",
    "MANIFEST",
    "UPDATED_SUFFIX",
    "WorkspaceError",
    "course_notebooks",
    "default_dir",
    "digest",
    "lab",
    "main",
    "read_manifest",
    "sync",
    "working_copy",
]

PACKAGE = Path(__file__).resolve().parent
MANIFEST = ".course_versions.json"
BROKEN_MANIFEST = ".course_versions.broken.json"
UPDATED_SUFFIX = ".updated.ipynb"
LANGUAGES = ("en", "zh")
FIRST_CHAPTER = "00_start_here.ipynb"
#: JupyterLab's language setting (the plugin of @jupyterlab/translation-extension), written once for zh.
TRANSLATION_PLUGIN = Path("@jupyterlab") / "translation-extension" / "plugin.jupyterlab-settings"


class WorkspaceError(Exception):
    """A problem the learner can fix, said in one sentence (the command prints it without a traceback)."""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _valid(data: object) -> bool:
    return isinstance(data, dict) and all(
        isinstance(name, str)
        and isinstance(entry, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in entry.items())
        for name, entry in data.items()
    )


def read_manifest(dest: Path) -> dict[str, dict[str, str]]:
    """The manifest of working copy `dest` ({} when there is none or it cannot be read)."""
    return _load_manifest(dest)[0]


def _load_manifest(dest: Path) -> tuple[dict[str, dict[str, str]], str | None]:
    """(manifest, None), or ({}, what was wrong) when the file exists but is not a manifest."""
    path = dest / MANIFEST
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return {}, f"{type(error).__name__}: {error}"
    if not _valid(data):
        return {}, "it is JSON, but not a map of chapter names to their recorded versions"
    return data, None


def write_manifest(dest: Path, manifest: dict[str, dict[str, str]]) -> None:
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def updated_name(name: str) -> str:
    return name[: -len(".ipynb")] + UPDATED_SUFFIX


def sync(source: Path, dest: Path) -> list[str]:
    """Bring `dest` in step with the chapters of `source` without losing a learner's work; return what was done.

    Args:
        source: the learner edition (`notebooks/`), or any folder of NN_*.ipynb chapters.
        dest: the learner's working copy (created if missing).

    Returns:
        One sentence per chapter that was added, refreshed, or kept with a new version beside it (and one first
        if the manifest could not be read: it is kept aside, and every chapter that differs from the course's is
        then treated as the learner's work).
    """
    source, dest = Path(source), Path(dest)
    chapters = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not chapters:
        raise FileNotFoundError(f"source: no chapter notebook (NN_*.ipynb) in {source}")
    dest.mkdir(parents=True, exist_ok=True)
    manifest, problem = _load_manifest(dest)
    messages = []
    if problem is not None:
        (dest / MANIFEST).replace(dest / BROKEN_MANIFEST)
        messages.append(
            f"{dest / MANIFEST} could not be read ({problem}), so it was moved to {BROKEN_MANIFEST} and every "
            "chapter that differs from the course's is kept as your work."
        )
    for chapter in chapters:
        name = chapter.name
        course = digest(chapter)
        mine = dest / name
        entry = manifest.get(name, {})
        copied = entry.get("copied")
        if not mine.exists():
            shutil.copyfile(chapter, mine)
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
            shutil.copyfile(chapter, mine)  # unchanged by the learner: take the course's new version
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
        shutil.copyfile(chapter, beside)
        manifest[name] = {"copied": copied or "", "offered": course}
        messages.append(
            f"{name}: the course's version changed, and yours has your work, so it was kept as it is. "
            f"The new version is beside it: {beside.name}"
        )
    write_manifest(dest, manifest)
    return messages


# ---------------------------------------------------------------------------------------------------------------
# Where the course comes from, where the copy goes
# ---------------------------------------------------------------------------------------------------------------


def _checkout() -> Path | None:
    """The repository this package lives in (a checkout, or an editable install of one), else None."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def course_notebooks(language: str = "en") -> Path:
    """The folder of the learner edition in `language`: the package's own copy (an installed wheel), else the
    repository's `notebooks/` (a checkout)."""
    _check_language(language)
    for base in (PACKAGE / "notebooks", None if _checkout() is None else _checkout() / "notebooks"):
        if base is None:
            continue
        folder = base if language == "en" else base / language
        if any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise WorkspaceError(
        f"the course's chapters ({language}) are neither in the installed package ({PACKAGE / 'notebooks'}) nor in "
        "a checkout of the repository: reinstall the course from its wheel, or run this from a clone of it."
    )


def default_dir() -> Path:
    """Where the working copy goes without --dir: `my_notebooks/` of a checkout, else ~/transformer_lab_notebooks."""
    root = _checkout()
    return root / "my_notebooks" if root is not None else Path.home() / "transformer_lab_notebooks"


def working_copy(folder: Path, language: str) -> Path:
    """The copy of `language` under the working-copy folder: the folder itself (en) or its `zh/`."""
    _check_language(language)
    return folder if language == "en" else folder / language


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise WorkspaceError(f"--language must be en or zh, got {language!r} (en: English, zh: 中文).")


def check_folder(folder: Path) -> None:
    """One clear sentence unless `folder` exists (or can be made in an existing folder) and can be written."""
    if folder.exists() and not folder.is_dir():
        raise WorkspaceError(f"--dir {folder} is a file, not a folder: give a folder for your working copy.")
    if not folder.exists():
        if not folder.parent.is_dir():
            raise WorkspaceError(
                f"--dir {folder}: its parent folder {folder.parent} does not exist; create it first, or give a "
                "folder that exists (the working copy is made inside it)."
            )
        probe_in = folder.parent
    else:
        probe_in = folder
    probe = probe_in / f".transformer_lab_write_test_{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise WorkspaceError(
            f"--dir {folder} cannot be written ({error.strerror or error}): give a folder of yours that you can "
            "write to."
        ) from None


def chinese_interface(folder: Path, earlier: Path | None = None) -> Path:
    """Make JupyterLab's interface Chinese for this working copy; return its settings folder.

    The settings live in `<folder>/.jupyter-zh/user-settings` (the learner's folder, not the repository or the
    package), written once: Settings > Language changes them later, and they are not overwritten. `earlier`, the
    settings folder `bash run.sh lab zh` used before (the checkout's `.jupyter-zh/user-settings`), is copied in
    first when the working copy has none yet, so that a learner's choices there are kept.
    """
    settings = folder / ".jupyter-zh" / "user-settings"
    if earlier is not None and earlier.is_dir() and not settings.exists():
        shutil.copytree(earlier, settings)
    plugin = settings / TRANSLATION_PLUGIN
    if not plugin.is_file():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        plugin.write_text('{\n    "locale": "zh_CN"\n}\n', encoding="utf-8")
    return settings


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)  # absent on Windows, where there is no root to refuse
    return geteuid is not None and geteuid() == 0


ROOT_REFUSED = (
    "transformer-lab lab: you are running as root, and JupyterLab refuses to start as root because every notebook "
    "it runs could then change anything on this machine; run the command as an ordinary user, or, in a throwaway "
    "container, add --allow-root."
)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="transformer-lab lab")
    parser.description = (
        "Make or refresh your working copy of the course (a chapter you changed is never overwritten: the course's "
        "new version is put beside it as NN_name.updated.ipynb) and open chapter 00 in JupyterLab. Options it does "
        "not know are passed on to `jupyter lab`."
    )
    parser.add_argument(
        "--language", default=os.environ.get("TRANSFORMER_LAB_LANGUAGE", "en"), help="en (default) or zh (中文)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the folder of your working copy (default: my_notebooks/ in a clone of the repository, else "
        "~/transformer_lab_notebooks); zh goes into its zh/ folder",
    )
    parser.add_argument("--no-browser", action="store_true", help="start the server without opening a browser")
    parser.add_argument("--allow-root", action="store_true", help="let JupyterLab run as root (containers only)")
    return parser


def prepare(folder: Path | None, language: str) -> tuple[Path, Path | None]:
    """Check the folder, make or refresh the working copy of `language`, print what changed; return the copy and,
    for zh, the JupyterLab settings folder that chooses the Chinese interface (None for en: JupyterLab's own)."""
    _check_language(language)
    source = course_notebooks(language)
    folder = (folder if folder is not None else default_dir()).expanduser().resolve()
    check_folder(folder)
    dest = working_copy(folder, language)
    first = not (dest / FIRST_CHAPTER).exists()
    try:
        messages = sync(source, dest)
    except OSError as error:
        raise WorkspaceError(
            f"the working copy {dest} could not be written ({error.strerror or error}); nothing of yours was "
            "overwritten: free some space or give another --dir."
        ) from None
    if first:  # every chapter was added: say so once, but never leave out a kept chapter or a set-aside manifest
        print(f"Your working copy of the course is {dest}: your work there is never overwritten.")
        messages = [message for message in messages if not message.endswith(": added")]
    for message in messages:
        print(message)
    settings = None
    if language == "zh":
        checkout = _checkout()
        earlier = checkout / ".jupyter-zh" / "user-settings" if checkout is not None else None
        settings = chinese_interface(folder, earlier)
    return dest, settings


def lab(args: argparse.Namespace, extra: Sequence[str] = ()) -> int:
    """`transformer-lab lab`: the working copy, then JupyterLab on chapter 00 (blocks until the server stops)."""
    extra = list(extra)
    allow_root = args.allow_root or "--allow-root" in extra
    if _is_root() and not allow_root:
        print(ROOT_REFUSED, file=sys.stderr)
        return 2
    try:
        dest, settings = prepare(args.dir, args.language)
    except WorkspaceError as error:
        print(f"transformer-lab lab: {error}", file=sys.stderr)
        return 2
    try:
        from jupyterlab.labapp import LabApp
    except ImportError:
        print(
            "transformer-lab lab: JupyterLab is not installed in this Python environment "
            f'({sys.executable}); install it with: pip install "attention-transformer-course[lab]".',
            file=sys.stderr,
        )
        return 2
    argv = [str(dest / FIRST_CHAPTER)]
    if args.no_browser:
        argv.append("--no-browser")
    if args.allow_root and "--allow-root" not in extra:
        argv.append("--allow-root")
    if settings is not None and not any("user_settings_dir" in option for option in extra):
        # the Chinese interface, for this server only (an environment variable would outlive it in this process)
        argv.append(f"--LabApp.user_settings_dir={settings}")
    LabApp.launch_instance(argv=[*argv, *extra])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    return lab(args, extra)


if __name__ == "__main__":
    sys.exit(main())
