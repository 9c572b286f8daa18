"""The grading server that runs inside a submission's sandbox: it runs answers and hands back plain data.

It never sees an answer, a reference, an expected value or the grading seed: the grader
(`transformer_lab.exercises.grading`, outside the sandbox) sends it, for one exercise at a time, the
cells to run (the teacher's setup cell, then the student's answer cells) and the hidden cases' floating-point
inputs as plain tensors; the server rebuilds each hidden case from the visible case's structure
(`Case.inputs()` of the stripped exercise module) with those tensors put in, and answers with the student's
results, the errors, and the ATen operators each case ran.

For each exercise the server forks a child, so one answer cannot change what the next one sees. Before any
student line runs, the child:

- gives up starting processes and sending signals (a seccomp filter: `fork`, `vfork`, `clone` of a new
  process, `kill`, `tkill`, `tgkill`, `rt_sigqueueinfo`, `pidfd_send_signal` and `ptrace` fail; `clone3`
  answers "not implemented", so that threads start with `clone`, which the filter allows for a thread),
  and is held to a CPU-time limit (`RLIMIT_CPU`); the server ends it when it waits without computing;
- closes every descriptor but its own result pipe, and points its stdout and stderr at nothing;
- makes the finished versions the exercise asks to build unavailable (a `TorchFunctionMode` refuses the
  forbidden torch functions by every spelling; the forbidden library functions and classes raise whatever
  name they are called by) and records, with a `TorchDispatchMode`, every ATen operator each case runs, so
  the grader can refuse the fused kernels that compute the answer whole however they were reached.

Protocol (length-prefixed frames; every frame is `torch.save` data read with `weights_only=True`):
stdin carries requests; stdout carries `(status, result bytes)` answers; nothing else is written to stdout.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import linecache
import os
import platform
import resource
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ShortcutBlocked", "plain", "float_leaves", "with_leaves", "serve", "read_frame", "write_frame"]

PLAIN_TYPES = (bool, int, float, str, type(None))
#: the most a child may hand back (bytes); more is dropped and reported as no result. The grader reads no more
#: than this from a sandbox either, and only uncompressed frames (`loads(..., limit=)`), so what a frame holds
#: once read is no larger than the frame.
MAX_RESULT = 16 << 20
#: the most members a frame's archive may hold (a tensor is one member)
MAX_MEMBERS = 4096
TAMPER_WATCH_NAMES = (
    "torch.allclose",
    "torch.equal",
    "torch.isclose",
    "torch.testing.assert_close",
    "sys.displayhook",
    "builtins.float",
    "builtins.print",
)


class ShortcutBlocked(RuntimeError):
    """A call into the finished version of what an exercise asks to build, while grading."""


# ------------------------------------------------------------------ frames


def write_frame(fd: int, payload: bytes) -> None:
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_RESULT) -> bytes | None:
    """One frame from `fd`, or None at end of file, past `deadline` (time.monotonic) or over `limit` bytes."""
    head = _read_exactly(fd, 8, deadline)
    if head is None:
        return None
    (size,) = struct.unpack("<Q", head)
    if size > limit:
        return None
    return _read_exactly(fd, size, deadline)


def dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def loads(data: bytes, limit: int | None = None) -> Any:
    """A frame's value (`torch.load` with `weights_only=True`). With `limit` (what the grader uses on whatever
    comes out of a sandbox), the frame must be an archive of at most MAX_MEMBERS uncompressed members of at most
    `limit` bytes in all: a compressed member, which could expand far past the frame, is refused (ValueError)."""
    if limit is not None:
        import zipfile

        if len(data) > limit:
            raise ValueError(f"frame: {len(data)} bytes, more than {limit}")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                members = archive.infolist()
        except zipfile.BadZipFile:
            raise ValueError("frame: not an archive") from None
        if len(members) > MAX_MEMBERS:
            raise ValueError(f"frame: {len(members)} members, more than {MAX_MEMBERS}")
        if any(m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size for m in members):
            raise ValueError("frame: a compressed member")
        if sum(m.file_size for m in members) > limit:
            raise ValueError("frame: its members hold more than the frame's limit")
    return torch.load(io.BytesIO(data), weights_only=True)


# ------------------------------------------------------------------ plain data and hidden inputs


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as plain data `torch.load(weights_only=True)` reads: tensors, numbers, strings, containers."""
    if depth > 20:
        return {"__unsupported__": "nested too deeply"}
    if isinstance(value, Tensor):
        if value.is_complex() or value.layout != torch.strided or value.device.type == "meta":
            return {"__unsupported__": f"a {value.dtype} tensor on {value.device} ({value.layout})"}
        return value.detach().cpu().as_subclass(Tensor).clone()
    if isinstance(value, PLAIN_TYPES):
        return value
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, (tuple, list)):
        items = [plain(v, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    return {"__unsupported__": type(value).__name__}


def float_leaves(value: Any) -> list[Tensor]:
    """The floating-point tensors of a case's inputs (a module's parameters included), in a fixed order:
    what hidden-case noise moves, and what the grader sends into the sandbox."""
    found: list[Tensor] = []

    def walk(item: Any) -> None:
        if isinstance(item, Tensor):
            if item.is_floating_point():
                found.append(item)
        elif isinstance(item, (tuple, list)):
            for v in item:
                walk(v)
        elif isinstance(item, dict):
            for v in item.values():
                walk(v)
        elif isinstance(item, torch.nn.Module):
            found.extend(p for p in item.parameters())

    walk(value)
    return found


def with_leaves(value: Any, leaves: list[Tensor]) -> Any:
    """`value` (a case's visible inputs) with its floating-point tensors replaced by `leaves`, in the order of
    `float_leaves`. Raises ValueError when the structures differ."""
    queue = list(leaves)

    def take(like: Tensor) -> Tensor:
        if not queue:
            raise ValueError("leaves: fewer tensors than the case's inputs hold")
        new = queue.pop(0)
        if not isinstance(new, Tensor) or new.shape != like.shape or new.dtype != like.dtype:
            raise ValueError("leaves: a tensor of another shape or dtype than the case's input")
        return new

    def walk(item: Any) -> Any:
        if isinstance(item, Tensor):
            if not item.is_floating_point():
                return item
            new = take(item).clone()
            return new.requires_grad_(True) if item.requires_grad else new
        if isinstance(item, tuple):
            return tuple(walk(v) for v in item)
        if isinstance(item, list):
            return [walk(v) for v in item]
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, torch.nn.Module):
            with torch.no_grad():
                for parameter in item.parameters():
                    parameter.copy_(take(parameter))
            return item
        return item

    out = walk(value)
    if queue:
        raise ValueError("leaves: more tensors than the case's inputs hold")
    return out


# ------------------------------------------------------------------ what the child gives up


def _seccomp_program() -> bytes | None:
    """A seccomp filter: no new process, no signal to another (or this) process, no ptrace. None where the
    processor is neither x86-64 nor AArch64 (that layer is then missing; the sandbox's others stay)."""
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        arch, clone, denied = 0xC000003E, 56, [57, 58, 62, 200, 234, 129, 297, 424, 101]  # fork vfork kill ...
    elif machine in ("aarch64", "arm64"):
        arch, clone, denied = 0xC00000B7, 220, [129, 130, 131, 138, 240, 424, 117]
    else:
        return None
    clone3 = 435  # the same number on both
    eperm, allow, enosys = 0x00050000 | 1, 0x7FFF0000, 0x00050000 | 38
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program: list[tuple[int, int, int, int]] = []
    # [0] arch; another ABI (32-bit calls on x86-64) is refused whole
    program.append((ld, 0, 0, 4))
    program.append((jeq, 1, 0, arch))
    program.append((ret, 0, 0, eperm))
    program.append((ld, 0, 0, 0))  # the syscall number
    program.append((jge, 0, 1, 0x40000000))  # x32
    program.append((ret, 0, 0, eperm))
    for number in denied:
        program.append((jeq, 0, 1, number))
        program.append((ret, 0, 0, eperm))
    # clone3 takes its flags in memory, where a filter cannot look: it answers "not implemented", and glibc then
    # starts a thread with clone, whose CLONE_THREAD flag the filter reads (threads allowed, processes not)
    program.append((jeq, 0, 1, clone3))
    program.append((ret, 0, 0, enosys))
    program.append((jeq, 1, 0, clone))
    program.append((ret, 0, 0, allow))
    program.append((ld, 0, 0, 16))  # clone's flags (low 32 bits of args[0])
    program.append((jset, 0, 1, 0x00010000))  # CLONE_THREAD: a thread is fine
    program.append((ret, 0, 0, allow))
    program.append((ret, 0, 0, eperm))
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)


def give_up_processes_and_signals() -> bool:
    """Install the seccomp filter in this process (and every thread it starts); True if it is in place."""
    program = _seccomp_program()
    if program is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) == 0


# ------------------------------------------------------------------ blocking and recording


class _Timeout(BaseException):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum, frame):  # noqa: ANN001, ARG001
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Block(TorchFunctionMode):
    def __init__(self, names: dict[str, str], message: Callable[[str], str]) -> None:
        super().__init__()
        self.names, self.message = names, message

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "").split(".", 1)[0]  # `_softmax.default` is `_softmax`
        if name in self.names:
            raise ShortcutBlocked(self.message(self.names[name]))
        return func(*args, **(kwargs or {}))


class OperatorRecord(TorchDispatchMode):
    """Every ATen operator run while it is active, by name (`_softmax`, `native_layer_norm`, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch otherwise wraps __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo: about 3 s of CPU in every grading server, for a compiler the sandbox never runs
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.seen.add(func._schema.name.split("::", 1)[-1])
        return func(*args, **(kwargs or {}))


def _raising_code(function: Any, message: str) -> Any:
    """A code object for `function` that raises ShortcutBlocked, with the same free variables."""
    free = function.__code__.co_freevars
    source = "def outer():\n"
    for name in free:
        source += f"    {name} = None\n"
    source += "    def blocked(*args, **kwargs):\n"
    if free:
        source += f"        ({', '.join(free)},)\n"
    source += "        runner = __import__('transformer_lab.exercises.runner', fromlist=['ShortcutBlocked'])\n"
    source += f"        raise runner.ShortcutBlocked({message!r})\n    return blocked\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - our own fixed template, no student input
    code = namespace["outer"]().__code__
    return code if code.co_freevars == free else None


def _functions_of(target: Any) -> list[Any]:
    if isinstance(target, type):
        return [
            getattr(v, "__func__", v) for v in vars(target).values() if hasattr(getattr(v, "__func__", v), "__code__")
        ]
    function = getattr(target, "__func__", target)
    return [function] if hasattr(function, "__code__") else []


def block_finished(exercise: Any) -> _Block:
    """Make the finished versions unavailable in this (child) process; return the torch mode to enter."""
    from transformer_lab.exercises.core import _describe
    from transformer_lab.i18n import message

    def blocked(shown: str) -> str:
        return message("grading.blocked", shown=shown)

    names: dict[str, str] = {}
    for item in exercise.forbidden:
        if isinstance(item, str):
            shown = message("shown.torch", name=item)
            for variant in (item, f"special_{item}", f"native_{item}"):
                names[variant] = shown
            for module in (torch, torch.nn.functional, torch.Tensor, torch.special, torch.linalg, torch._C._nn):
                for variant in (item, f"native_{item}"):
                    if hasattr(module, variant):
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(module, variant, _blocker(blocked(shown)))
        else:
            for function in _functions_of(item):
                replacement = _raising_code(function, blocked(_describe(item)))
                if replacement is not None:
                    function.__code__ = replacement
    return _Block(names, blocked)


def _blocker(text: str) -> Callable[..., Any]:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        raise ShortcutBlocked(text)

    return blocked


def _watched() -> dict[str, Any]:
    import builtins

    found: dict[str, Any] = {}
    for name in TAMPER_WATCH_NAMES:
        owner, attribute = name.rsplit(".", 1)
        base = {"torch": torch, "torch.testing": torch.testing, "sys": sys, "builtins": builtins}[owner]
        found[name] = getattr(base, attribute, None)
    return found


# ------------------------------------------------------------------ one exercise, in the child


def run_exercise(request: dict[str, Any]) -> dict[str, Any]:
    """Run the cells, then the student's function on every hidden case; return plain results."""
    from transformer_lab import i18n
    from transformer_lab.exercises.core import _needs_grad, describe_error

    torch.set_num_threads(1)
    i18n.set_language(request.get("language", "en"))
    module = __import__(request["module"], fromlist=["_"])
    exercise = getattr(module, request["exercise"])
    inputs = []
    for case, leaves in zip(exercise.cases, request["leaves"], strict=True):
        visible = case.inputs()
        inputs.append(visible if leaves is None else with_leaves(visible, list(leaves)))
    before = _watched()
    mode = block_finished(exercise)
    out: dict[str, Any] = {"cells": [], "cases": [], "tampered": []}
    namespace: dict[str, Any] = {"__name__": "__main__"}
    sink = io.StringIO()
    for kind, source in request["cells"]:
        # the source by its name, so that an error's message can quote the answer's own line
        linecache.cache[f"<{kind}>"] = (len(source), None, source.splitlines(keepends=True), f"<{kind}>")
        start = time.perf_counter()
        entry: dict[str, Any] = {"kind": kind, "error": None}
        try:
            with (
                contextlib.redirect_stdout(sink),
                contextlib.redirect_stderr(sink),
                _time_limit(request["cell_timeout"]),
            ):
                exec(compile(source, f"<{kind}>", "exec"), namespace)  # noqa: S102 - the sandboxed child
        except _Timeout:
            entry["error"] = f"stopped after {request['cell_timeout']:g} s (time limit per cell)"
        except BaseException as exc:  # noqa: BLE001 - the student's code may raise anything
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        entry["seconds"] = round(time.perf_counter() - start, 3)
        sink.seek(0)
        sink.truncate()
        out["cells"].append(entry)
    after = _watched()
    out["tampered"] = sorted(name for name in before if after[name] is not before[name])
    candidate = namespace.get(request["function"])
    timed_out = False
    for case_inputs in inputs:
        entry = {"value": None, "error": None, "error_types": [], "shortcut": None, "not_done": False, "ops": []}
        record = OperatorRecord()
        if timed_out:
            entry["error"] = "not run: an earlier case reached the time limit"
        elif not callable(candidate):
            entry["error"] = f"no function named {request['function']} after running the answer cells"
        else:
            try:
                with (
                    contextlib.redirect_stdout(sink),
                    contextlib.redirect_stderr(sink),
                    _time_limit(request["cell_timeout"]),
                    mode,
                    record,
                ):
                    with contextlib.nullcontext() if _needs_grad(case_inputs) else torch.no_grad():
                        value = exercise._run(candidate, *case_inputs)
                entry["value"] = plain(value)
            except _Timeout:
                entry["error"] = f"stopped after {request['cell_timeout']:g} s (time limit)"
                timed_out = True
            except NotImplementedError:
                entry["not_done"] = True
            except ShortcutBlocked as exc:
                entry["shortcut"] = str(exc)
            except BaseException as exc:  # noqa: BLE001
                entry["error"] = describe_error(exc)[:1000]
                entry["error_types"] = [k.__name__ for k in type(exc).__mro__]  # a case may expect an error
                if isinstance(exc, RecursionError):
                    entry["error"] = "RecursionError: the function calls itself without end"
        entry["ops"] = sorted(record.seen)
        sink.seek(0)
        sink.truncate()
        out["cases"].append(entry)
    return out


def _child(request: dict[str, Any], result_fd: int) -> None:
    """In a forked child: give up what answers never need, run the exercise, write the result; never returns."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, result_fd)
        os.closerange(result_fd + 1, 1 << 16)
        cpu = max(1, int(request["cpu_seconds"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        request["seccomp"] = give_up_processes_and_signals()
        out = run_exercise(request)
        out["seccomp"] = request["seccomp"]
        payload = dumps(out)
    except BaseException:  # noqa: BLE001 - say what broke; the grader reports it
        payload = dumps({"crash": traceback.format_exc()[-2000:]})
    with contextlib.suppress(BaseException):
        write_frame(result_fd, payload)
    os._exit(0)  # skip the student's atexit hooks and finalizers


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) process `pid` has used so far, from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: a child that used less than this share of one processor over a whole idle window is waiting, not computing
IDLE_SHARE = 0.02


def _wait_computing(fd: int, pid: int, deadline: float, idle_seconds: float) -> str | None:
    """Wait until `fd` can be read ("ready"), the deadline passes ("killed") or the child `pid` has waited
    `idle_seconds` without computing ("idle": a sleep, a blocked read, a lock no one releases)."""
    window_start, cpu_start = time.monotonic(), _cpu_seconds(pid)
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "killed"
        if select.select([fd], [], [], min(1.0, deadline - now))[0]:
            return "ready"
        now, cpu = time.monotonic(), _cpu_seconds(pid)
        if cpu is None or cpu_start is None:
            window_start, cpu_start = now, cpu
        elif now - window_start >= idle_seconds:
            if cpu - cpu_start < IDLE_SHARE * (now - window_start):
                return "idle"
            window_start, cpu_start = now, cpu


def _handle(request: dict[str, Any]) -> tuple[str, bytes]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(request, write_end)
    os.close(write_end)
    deadline = time.monotonic() + float(request["budget"])
    idle = float(request.get("idle_seconds") or max(5.0, float(request.get("cell_timeout", 10.0))))
    waited = _wait_computing(read_end, pid, deadline, idle)
    payload = read_frame(read_end, deadline) if waited == "ready" else None
    os.close(read_end)
    status = "done"
    if payload is None:
        status = waited if waited in ("killed", "idle") else "killed" if time.monotonic() >= deadline else "lost"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return status, payload or b""


def serve() -> None:
    """Import what every answer needs once, then answer requests until stdin closes."""
    import matplotlib

    matplotlib.use("Agg")  # a chapter's setup cell imports pyplot: no display here
    import matplotlib.pyplot  # noqa: F401 - imported once here, inherited by every child

    import transformer_lab  # noqa: F401
    import transformer_lab.exercises.core  # noqa: F401

    torch.set_num_threads(1)
    # warm up what every child uses, so that no child pays a first use against its time limit
    with _Block({}, str), OperatorRecord(), torch.no_grad():
        for dtype in (torch.float32, torch.float64, torch.float16):
            x = torch.ones(2, 3, dtype=dtype)
            (x.exp() / x.sum(-1, keepdim=True)).max(-1)
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing but frames on the channel to the grader
    write_frame(out_fd, dumps({"status": "ready", "torch": str(torch.__version__)}))
    while True:
        frame = read_frame(0, None, limit=1 << 30)
        if frame is None:
            return
        request = loads(frame)
        # the chapter's (stripped) exercise module, imported once here: every child inherits it
        if isinstance(request.get("module"), str) and request["module"].startswith("transformer_lab.exercises.ch"):
            with contextlib.suppress(Exception):
                __import__(request["module"])
        status, payload = _handle(request)
        write_frame(out_fd, struct.pack("<B", len(status)) + status.encode() + payload)


if __name__ == "__main__":
    serve()
