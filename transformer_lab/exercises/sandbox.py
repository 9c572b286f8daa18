"""A sandbox per student: where a student's answers run while a class is graded (Linux, bubblewrap); one
student's chapters share theirs (`grading.StudentSandbox`), another student's answers never run in it.

`SandboxServer` starts `transformer_lab.exercises.runner` (the grading server) inside a bubblewrap sandbox
(`bwrap`, the sandbox Flatpak uses), under `prlimit`. From inside it the student's code:

- reads only the Python interpreter and its standard library, the environment's site-packages (with any
  installed or editable `transformer_lab` in them hidden), the system's shared libraries (`/usr`), a
  matplotlib font cache made for it, and a **stripped copy** of the course package (`stripped_package`:
  no references, no wrong answers, no helpers only they use, no stored expected answers or hashes, no
  grading code, no translations of exercise texts; the data files read-only). Not the repository, not the
  teacher's home, not another student's submission, not the grader's records;
- writes only a scratch `/tmp` (a memory-backed tmpfs of `tmp_mib`, thrown away with the sandbox); `/dev`
  holds bwrap's few device nodes (null, zero, random, ...) and is read-only, so no other tmpfs can hold data;
- has no network (its own empty network namespace), sees no process outside it (its own PID namespace)
  and so can signal none, runs as `nobody` in its own user namespace and may not make another
  (`--disable-userns`), and is in a session of its own (`--new-session`);
- is held to `memory_mib` of memory: by a memory cgroup of its own (cgroup v2) where this user has one delegated
  (`memory_cgroup()`), which counts everything the sandbox holds, its /tmp included; otherwise per process, as
  address space (`RLIMIT_AS`, set with `prlimit`: bubblewrap sets none), every tmpfs it can write having a size
  (the empty folders that hide the course are 4 KiB and read-only); and to `cpu_seconds` of CPU time
  (`RLIMIT_CPU`); each answer's own child process is further held to its exercise's time budget and may
  start no process and send no signal (a seccomp filter, runner.py);
- dies whole when the grader stops it or dies (`--die-with-parent`, and the PID namespace: when its first
  process ends, the kernel kills every process left in it).

Where the sandbox cannot be made (another OS, no `bwrap`, user namespaces disabled: Ubuntu 23.10+ restricts
them with AppArmor, see docs/teaching.md), `probe()` says why and grading refuses to start unless the teacher
asks for `sandbox=False` (`classroom.py grade --no-sandbox`): then the same server runs as a plain child
process, still on the stripped copy and under the same limits, and the report says so on its first line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any

from transformer_lab.exercises import runner
from transformer_lab.exercises.strip import strip_source

__all__ = [
    "Limits",
    "probe",
    "posix_missing",
    "memory_cgroup",
    "stripped_package",
    "SandboxServer",
    "SandboxUnavailable",
]

PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # transformer_lab/
#: files of transformer_lab/exercises/ that stay out of the stripped copy: they grade, they hold no case
GRADER_ONLY = {"grading.py", "policy.py", "sandbox.py", "answers.py", "expected.pt", "expected_hashes.pt"}
INSIDE = "/course"  # where the stripped package is mounted inside the sandbox
FONT_CACHE = "/mplconfig"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made on this machine; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one student's sandbox may use.

    memory_mib: address space of each process in it (RLIMIT_AS); PyTorch alone reserves about 800 MiB.
    cpu_seconds: CPU time of the sandbox's server process (RLIMIT_CPU); each exercise's child gets its own
        budget from the time limit per cell.
    tmp_mib: size of its scratch /tmp (memory-backed).
    open_files: descriptors per process (RLIMIT_NOFILE).
    """

    memory_mib: int = 3072
    cpu_seconds: int = 600
    tmp_mib: int = 64
    open_files: int = 256

    def __post_init__(self) -> None:
        for name, least in (("memory_mib", 1024), ("cpu_seconds", 5), ("tmp_mib", 1), ("open_files", 32)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected a whole number of at least {least}, got {value!r}")


# ------------------------------------------------------------------ the stripped copy


def stripped_package(dest: pathlib.Path) -> pathlib.Path:
    """Write the copy of `transformer_lab` a sandbox reads into `dest/transformer_lab`; return `dest`.

    The package's data files (`assets/`) are not copied: the sandbox mounts the teacher's read-only. Nor is the
    learner edition a wheel installs into the package (`notebooks/`, setup.py): a sandbox runs no notebook, and an
    installed course would otherwise copy its chapters (about 10 MB) for every grading run.
    """
    dest = pathlib.Path(dest)
    target = dest / "transformer_lab"

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = pathlib.Path(folder)
        skipped = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
        if here == PACKAGE:
            skipped |= {"assets", "notebooks"}
        if here == PACKAGE / "exercises":
            skipped |= GRADER_ONLY & set(names)
        if here == PACKAGE / "locale":
            skipped.add("zh")  # the exercises' texts in Chinese (a "why" may hold a predict answer)
        return skipped

    shutil.copytree(PACKAGE, target, ignore=ignore)
    (target / "assets").mkdir()
    (target / "locale" / "zh").mkdir()
    # a teacher's own exercise modules (TRANSFORMER_LAB_EXERCISES) are graded from the copy too
    for folder in os.environ.get("TRANSFORMER_LAB_EXERCISES", "").split(os.pathsep):
        for module in sorted(pathlib.Path(folder).glob("ch*.py")) if folder else []:
            shutil.copy2(module, target / "exercises" / module.name)
    for module in sorted((target / "exercises").glob("ch*.py")):
        module.write_text(strip_source(module.read_text(encoding="utf-8")), encoding="utf-8")
    import compileall

    compileall.compile_dir(str(target), quiet=1, workers=1)
    return dest


# ------------------------------------------------------------------ the command


def _site_dirs() -> list[str]:
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    dirs += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs) if os.path.isdir(d)]


def _masks(site_dirs: list[str]) -> list[str]:
    """bwrap arguments hiding every installed or editable copy of the course in site-packages."""
    args: list[str] = []
    for folder in site_dirs:
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name == "transformer_lab" and os.path.isdir(path):
                args += _empty(path)
            elif "transformer_lab" in name and os.path.isfile(path):
                args += ["--ro-bind", "/dev/null", path]
    return args


def _empty(path: str) -> list[str]:
    """bwrap arguments that hide `path` under an empty folder nothing can write into: a tmpfs of 4 KiB, read-only
    (every writable tmpfs of a sandbox has a size; this one is not even writable)."""
    return ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]


def _interpreter() -> tuple[str, str]:
    """(the real interpreter's path, its installation prefix) - a venv's python is a link to it."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


BOOT = (
    "import os, shutil, sys, tempfile; sys.path[:0] = {path!r}; sys.dont_write_bytecode = True; "
    # matplotlib ignores a read-only cache folder: each sandbox gets its own writable copy of the one made for it
    "fonts = tempfile.mkdtemp(prefix='mpl-'); shutil.copytree({fonts!r}, fonts, dirs_exist_ok=True); "
    "os.environ['MPLCONFIGDIR'] = fonts; "
    "from transformer_lab.exercises import runner; runner.serve()"
)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def command(
    package: pathlib.Path, font_cache: pathlib.Path, limits: Limits, sandbox: bool = True, hide: tuple[str, ...] = ()
) -> list[str]:
    """The command line that starts the grading server, in a sandbox unless `sandbox` is False. `hide`: more
    folders (the course directory) to keep out of sight should a mounted tree hold them."""
    python, prefix = _interpreter()
    site_dirs = _site_dirs()
    assets = str(PACKAGE / "assets")
    prlimit = [
        "prlimit",
        f"--as={limits.memory_mib << 20}",
        f"--cpu={limits.cpu_seconds}",
        f"--nofile={limits.open_files}",
        "--core=0",
        f"--fsize={limits.tmp_mib << 20}",
        "--",
    ]
    if not sandbox:
        path = [str(package), *site_dirs]
        return [*prlimit, python, "-I", "-S", "-c", BOOT.format(path=path, fonts=str(font_cache))]
    mounted = ["/usr", prefix, *site_dirs]
    args = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
        # /proc, /dev and the scratch /tmp first: a bind mount below /tmp (a venv in a temporary folder) must
        # go on top of the tmpfs, not under it
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",  # the few device nodes bwrap makes, and nothing can be written into /dev (a tmpfs)
        "/dev",
        "--size",
        str(limits.tmp_mib << 20),
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for link in ("lib", "lib64", "bin", "sbin", "lib32"):
        target = os.path.realpath(f"/{link}")
        if os.path.islink(f"/{link}") and target.startswith("/usr/"):
            args += ["--symlink", target.lstrip("/"), f"/{link}"]
        elif os.path.isdir(f"/{link}") and not os.path.islink(f"/{link}"):
            args += ["--ro-bind", f"/{link}", f"/{link}"]
            mounted.append(f"/{link}")
    for path in [prefix, *site_dirs]:
        if not _under(path, ["/usr"]):
            args += ["--ro-bind", path, path]
    args += _masks(site_dirs)
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(package / "transformer_lab"), f"{INSIDE}/transformer_lab"]
    args += ["--ro-bind", assets, f"{INSIDE}/transformer_lab/assets"]
    args += ["--ro-bind", str(font_cache), FONT_CACHE]
    # the repository and the course directory stay hidden even where a mounted tree holds them
    for secret in dict.fromkeys([str(PACKAGE.parent), *(os.path.realpath(h) for h in hide)]):
        if secret != "/" and _under(secret, mounted) and not _under(secret, [str(package)]):
            args += _empty(secret)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TRANSFORMER_LAB_QUICK": "1",
        "MPLBACKEND": "Agg",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--remount-ro", "/", "--chdir", "/tmp"]  # nothing but /tmp is writable
    path = [INSIDE, *site_dirs]
    return [*prlimit, *args, python, "-I", "-S", "-c", BOOT.format(path=path, fonts=FONT_CACHE)]


def font_cache(dest: pathlib.Path) -> pathlib.Path:
    """A matplotlib font cache for the sandbox (which cannot write one, and cannot run `fc-list` to make it)."""
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MPLCONFIGDIR=str(dest), MPLBACKEND="Agg")
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.font_manager"], env=env, check=False, capture_output=True, timeout=300
    )
    return dest


def posix_missing() -> str | None:
    """One sentence saying why a submission cannot be graded here, where the POSIX modules the sandbox limits it
    with are missing (Windows); None where they are present."""
    import importlib.util

    missing = [name for name in ("resource", "fcntl") if importlib.util.find_spec(name) is None]
    if runner.resource is None and "resource" not in missing:
        missing.insert(0, "resource")
    if not missing:
        return None
    return (
        f"grading a class needs Linux: Python's {' and '.join(missing)} module (with which the sandbox limits a "
        f"submission's memory and time) does not exist on {sys.platform}; grade on a Linux machine or in WSL 2"
    )


#: where the kernel's cgroup v2 tree is mounted
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def memory_cgroup() -> tuple[pathlib.Path | None, str]:
    """(the cgroup v2 folder under which each sandbox gets a memory cgroup of its own, or None; one sentence saying
    which memory limit holds). A sandbox's cgroup limits everything it holds (every process, its /tmp); without
    one, each process's address space is limited (RLIMIT_AS) and every tmpfs it can write has a size."""
    fallback = "each process's address space (RLIMIT_AS), with every writable tmpfs of a fixed size"
    controllers = CGROUP_ROOT / "cgroup.controllers"
    try:
        if "memory" not in controllers.read_text(encoding="utf-8").split():
            return None, f"{fallback}: no cgroup v2 memory controller here"
        own = pathlib.Path("/proc/self/cgroup").read_text(encoding="utf-8").strip().splitlines()
        line = next((entry for entry in own if entry.startswith("0::")), None)
        if line is None:
            return None, f"{fallback}: this process is in no cgroup v2"
        here = CGROUP_ROOT / line[3:].lstrip("/")
        subtree = (here / "cgroup.subtree_control").read_text(encoding="utf-8").split()
        if "memory" not in subtree or not os.access(here, os.W_OK) or not os.access(here / "cgroup.procs", os.W_OK):
            return None, f"{fallback}: the cgroup {here} is not delegated to this user with its memory controller"
    except OSError as exc:
        return None, f"{fallback}: cgroup v2 cannot be read ({exc.strerror})"
    return here, f"a memory cgroup per sandbox under {here}"


def probe(limits: Limits | None = None) -> str | None:
    """None if a sandbox can be made here; else why not, and what to do."""
    missing = posix_missing()
    if missing:
        return missing
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (bubblewrap); this is {sys.platform}"
    for tool, package in (("bwrap", "bubblewrap"), ("prlimit", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed: install Debian/Ubuntu's `{package}` (sudo apt-get install {package})"
    with tempfile.TemporaryDirectory(prefix="tl-probe-") as tmp:
        package = pathlib.Path(tmp) / "pkg"
        (package / "transformer_lab" / "assets").mkdir(parents=True)
        cache = pathlib.Path(tmp) / "fonts"
        cache.mkdir()
        argv = command(package, cache, limits or Limits())
        boot = argv.index("-c") + 1
        argv[boot] = "import sys; print('ok')"
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode == 0 and proc.stdout.strip() == "ok":
        return None
    said = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(nothing)"]
    hint = ""
    if "ermission" in said[0] or "namespace" in said[0].lower():
        hint = (
            "; user namespaces seem restricted: on Ubuntu 23.10+ AppArmor blocks them for unconfined programs "
            "(docs/teaching.md, 'The sandbox', says how to allow bwrap)"
        )
    return f"bubblewrap could not start a sandbox (exit {proc.returncode}: {said[0]}){hint}"


# ------------------------------------------------------------------ the server


#: what a grading server may answer about one exercise (runner._handle); anything else stops the sandbox
STATUSES = frozenset({"done", "killed", "idle", "lost"})


class SandboxServer:
    """The grading server of one submission, in its sandbox; `run()` sends one exercise, returns its result."""

    def __init__(
        self,
        package: pathlib.Path,
        font_dir: pathlib.Path,
        limits: Limits,
        sandbox: bool = True,
        hide: tuple[str, ...] = (),
    ) -> None:
        missing = posix_missing()
        if missing:
            raise SandboxUnavailable(missing)
        self.argv = command(package, font_dir, limits, sandbox, hide)
        self.cgroup: pathlib.Path | None = None
        parent, self.memory_limit = memory_cgroup()
        if parent is not None:
            group = parent / f"transformer-lab-{os.getpid()}-{id(self):x}"
            try:
                group.mkdir()
                (group / "memory.max").write_text(str((limits.memory_mib + limits.tmp_mib) << 20), encoding="ascii")
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0", encoding="ascii")
                # the sandbox's first process joins the cgroup before it becomes the sandbox: all it starts is in it
                self.argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *self.argv]
                self.cgroup = group
            except OSError as exc:
                self.memory_limit = f"RLIMIT_AS (the memory cgroup could not be made: {exc.strerror})"
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
        )
        self.ready: dict[str, Any] | None = None

    def _wait_ready(self, deadline: float) -> bool:
        if self.ready is None:
            assert self.process.stdout is not None
            frame = runner.read_frame(self.process.stdout.fileno(), deadline, limit=1 << 16)
            if frame is None:
                return False
            try:
                ready = runner.loads(frame, limit=1 << 16)
            except Exception:
                return False
            self.ready = ready if isinstance(ready, dict) else {}
        return True

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, request: dict[str, Any], budget: float, start_budget: float = 120.0) -> tuple[str, Any]:
        """Send one request; return (status, the plain result or None). Status: done, killed (the child ran out
        of time), lost (the child died without an answer), sandbox (the sandbox itself stopped or hung)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        if self.process.stdout.closed or not self.alive():
            return "sandbox", None
        if not self._wait_ready(time.monotonic() + start_budget):
            self.close()
            return "sandbox", None
        request = dict(request, budget=budget)
        try:
            runner.write_frame(self.process.stdin.fileno(), runner.dumps(request))
        except OSError:
            self.close()
            return "sandbox", None
        # what comes out of a sandbox is held to the size a result may have, uncompressed (runner.loads)
        frame = runner.read_frame(
            self.process.stdout.fileno(), time.monotonic() + budget + 15.0, limit=runner.MAX_RESULT + 256
        )
        if frame is None or len(frame) < 1:
            self.close()
            return "sandbox", None
        (size,) = struct.unpack("<B", frame[:1])
        status = frame[1 : 1 + size].decode("ascii", "replace")
        if status not in STATUSES:
            self.close()
            return "sandbox", None
        payload = frame[1 + size :]
        if not payload:
            return status, None
        try:
            return status, runner.loads(payload, limit=runner.MAX_RESULT)
        except Exception:  # too large, compressed, or not plain data: nothing to credit
            return "unreadable", None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(Exception):
            assert self.process.stdout is not None
            self.process.stdout.close()
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()

    def __enter__(self) -> SandboxServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
