"""The grading server that runs inside a submission's sandbox: it runs answers and hands back plain data.

It never sees an answer, a reference, an expected value or the grading seed: the grader
(`transformer_lab.exercises.grading`, outside the sandbox) sends it, for one exercise at a time, the
cells to run (the teacher's setup cell, then the student's answer cells) and the hidden cases' floating-point
inputs as plain tensors; the server rebuilds each hidden case from the visible case's structure
(`Case.inputs()` of the stripped exercise module) with those tensors put in, and answers with the student's
results, the errors, and the ATen operators each case ran.

For each exercise the server forks a child, so one answer cannot change what the next one sees. Before any
student line runs, the child:

- gives up starting processes, sending signals and reaching another process's memory (a seccomp filter: `fork`,
  `vfork`, `clone` of a new process, `kill`, `tkill`, `tgkill`, `rt_sigqueueinfo`, `pidfd_send_signal`, `ptrace`,
  `process_vm_readv` and `process_vm_writev` fail; `clone3` answers "not implemented", so that threads start with
  `clone`, which the filter allows for a thread; and the server is not dumpable, so that no child opens its
  /proc/<pid>/mem),
  and is held to a CPU-time limit (`RLIMIT_CPU`); the server ends it when it waits without computing;
- closes every descriptor but its own result pipe, and points its stdout and stderr at nothing;
- makes the finished versions the exercise asks to build unavailable (a `TorchFunctionMode` refuses the
  forbidden torch functions by every spelling; the forbidden library functions and classes raise whatever
  name they are called by) and records, with a `TorchDispatchMode`, every ATen operator each case runs, so
  the grader can refuse the fused kernels that compute the answer whole however they were reached.

What the child records is not left in the child, where the answer's code could undo it. Each operator's name is
written to a pipe the moment a case first runs it, and the server (this process, which never runs an answer) keeps
it: clearing the child's record afterwards clears nothing. At the end of each case the runner itself runs one
operator (the canary, `CANARY`) inside the record; a case whose record ends without it had its record taken away
while the answer ran (a popped mode records nothing). A Python audit hook, which no Python code can remove, writes
to the same pipe when the answer lists the garbage collector's objects (how the record or the modes are found) or
reads or compiles the course's source (how unblocked copies of the blocked library functions are made). The server
then checks each case (`verify`): its operators must lie in the exercise's allow-list (`allowed_operators`:
generic elementwise, reduction, shape and indexing operators, plus those the exercise's honest answers ran, stored
in operators.json by tools/allowed_operators.py); a case outside it, undone or reached from inside gets no credit,
and the operator or the event is named in the feedback.

What this does not stop: code that has full Python in the child (past the static check, which runs first, in the
grader) can pop the record and push it back around an operator (the canary is then in place), or write forged lines
to the pipe. Reaching either needs private names (`torch.utils._python_dispatch`, `torch._C`) or the garbage
collector, which the static check refuses before anything runs.

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

try:  # POSIX only: where it is missing (Windows) no sandbox starts, and sandbox.posix_missing() says why
    import resource
except ImportError:  # pragma: no cover - exercised with the module hidden (tests/test_grading_allowlist.py)
    resource = None  # type: ignore[assignment]

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
    """A seccomp filter: no new process, no signal to another (or this) process, no ptrace, no reading or writing
    another process's memory (process_vm_readv, process_vm_writev). None where the processor is neither x86-64 nor
    AArch64 (that layer is then missing; the sandbox's others stay)."""
    machine = platform.machine()
    # fork vfork kill tgkill tkill rt_sigqueueinfo rt_tgsigqueueinfo pidfd_send_signal ptrace process_vm_readv/writev
    if machine in ("x86_64", "AMD64"):
        arch, clone, denied = 0xC000003E, 56, [57, 58, 62, 200, 234, 129, 297, 424, 101, 310, 311]
    elif machine in ("aarch64", "arm64"):
        arch, clone, denied = 0xC00000B7, 220, [129, 130, 131, 138, 240, 424, 117, 270, 271]
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


def not_dumpable() -> str | None:
    """Make this process not dumpable (prctl PR_SET_DUMPABLE 0), so that its children, whose answer code could
    otherwise reach the record it keeps, cannot open its /proc/<pid>/mem or attach to it. None once done; where it
    cannot be done (not Linux, no prctl), one sentence saying why, and the other layers stay."""
    if not sys.platform.startswith("linux"):
        return f"the grading server stays dumpable: PR_SET_DUMPABLE is Linux only (this is {sys.platform})"
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as error:
        return f"the grading server stays dumpable: prctl is not available ({error})"
    pr_set_dumpable, pr_get_dumpable = 4, 3
    if prctl(pr_set_dumpable, 0, 0, 0, 0) != 0 or prctl(pr_get_dumpable, 0, 0, 0, 0) != 0:
        return (
            f"the grading server stays dumpable: prctl(PR_SET_DUMPABLE, 0) failed ({os.strerror(ctypes.get_errno())})"
        )
    return None


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
    """Every ATen operator run while it is active, by name (`_softmax`, `native_layer_norm`, ...). With `fd`, each
    name is also written to that pipe the moment it is first seen (`O<name>` lines): the grading server, another
    process, keeps what was written, so an answer that clears `seen` afterwards clears nothing that counts."""

    def __init__(self, fd: int | None = None) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.fd = fd

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch otherwise wraps __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo: about 3 s of CPU in every grading server, for a compiler the sandbox never runs
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func._schema.name.split("::", 1)[-1]
        if name not in self.seen:
            self.seen.add(name)
            if self.fd is not None:
                _stream(self.fd, b"O" + name.encode("ascii", "replace")[:80])
        return func(*args, **(kwargs or {}))


# ------------------------------------------------------------------ the record, kept outside the child

#: the operator the runner itself runs at the end of every case, inside the record: the grading server finds it
#: last before the case's end, or the record was taken away while the answer ran (a popped mode records nothing)
CANARY = "frac"
#: the most the record stream of one exercise may hold (bytes): an honest exercise writes a few KiB
MAX_RECORD = 1 << 20
#: audit events an answer never causes, and that reach the record, the modes or the library's code from inside:
#: objects found through the garbage collector, and the course's source read or compiled again (unblocked copies)
AUDITED = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
_write = os.write  # bound before any answer runs


def _stream(fd: int, line: bytes) -> None:
    with contextlib.suppress(OSError):
        _write(fd, line.replace(b"\n", b" ") + b"\n")


def _watch_audit(fd: int, course: str) -> list[bool]:
    """Report to the grading server, through the record pipe, each audit event by which an answer reaches what
    checks it (Python's audit hooks cannot be removed once added, so this lasts for the child's life). `course`:
    the course package's folder. Returns the switch the runner turns off once the answer's code is done."""
    import sys as _sys

    course = course.rstrip("/") + "/"
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not active[0]:
            return
        if event in AUDITED:
            _stream(fd, b"A" + event.encode())
        elif event in ("open", "compile") and args:
            where = args[1] if event == "compile" and len(args) > 1 else args[0]
            if isinstance(where, bytes):
                where = where.decode("utf-8", "replace")
            if isinstance(where, str) and where.startswith(course) and where.endswith(".py"):
                _stream(fd, b"A" + event.encode() + b" " + where[len(course) :].encode("utf-8", "replace")[:100])

    _sys.addaudithook(hook)
    return active


def read_record(stream: bytes, cases: int) -> dict[str, Any]:
    """What the grading server makes of one exercise's record stream: the operators of each case (`ops`, the
    canary left out), the cases whose record was taken away (`undone`: no canary before its end), and what shows
    the record or the course's code was reached from inside (`tampered`: audit events, lines out of order)."""
    ops: list[list[str]] = [[] for _ in range(cases)]
    opened: list[bool] = [False] * cases
    closed: list[bool] = [False] * cases
    undone: list[bool] = [False] * cases
    tampered: list[str] = []
    current: int | None = None
    if len(stream) > MAX_RECORD:
        tampered.append("the operator record overflowed")
        stream = stream[:MAX_RECORD]
    for raw in stream.split(b"\n"):
        if not raw:
            continue
        line = raw.decode("utf-8", "replace")
        kind, rest = line[0], line[1:]
        if kind == "S" and rest.isdigit() and current is None and int(rest) < cases and not opened[int(rest)]:
            current = int(rest)
            opened[current] = True
        elif kind == "O" and current is not None and rest:
            ops[current].append(rest)
        elif kind == "E" and current is not None and rest == str(current):
            seen = ops[current]
            undone[current] = not seen or seen[-1] != CANARY
            if not undone[current]:
                seen.pop()
            closed[current], current = True, None
        elif kind == "A":
            what = f"audit event {rest[:120]}"
            if what not in tampered:
                tampered.append(what)
        else:
            what = "the operator record holds a line the runner never writes"
            if what not in tampered:
                tampered.append(what)
    for index in range(cases):
        if opened[index] and not closed[index]:
            undone[index] = True
    return {"ops": [sorted(set(o)) for o in ops], "opened": opened, "undone": undone, "tampered": tampered}


_ALLOWED: dict[str, Any] = {}


def allowed_operators(key: str) -> frozenset[str] | None:
    """The ATen operators exercise `key` ("ch04_normalization.layer_norm") may run: the generic elementwise,
    reduction, shape and indexing operators plus those its honest answers ran (operators.json, written by
    tools/allowed_operators.py). None where the exercise has no list (a teacher's own exercise)."""
    if "data" not in _ALLOWED:
        import json
        import pathlib

        path = pathlib.Path(__file__).with_name("operators.json")
        try:
            _ALLOWED["data"] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            # never grade without the lists while believing they are checked: an install without them is broken
            raise RuntimeError(
                f"the exercises' operator allow-lists could not be read from {path} ({error}); reinstall the "
                "course, or write them again with `python tools/allowed_operators.py` from a checkout"
            ) from error
    data = _ALLOWED["data"]
    exercises = data.get("exercises", {})
    if key not in exercises:
        return None
    return frozenset(data.get("generic", ())) | frozenset(exercises[key])


def verify(request: dict[str, Any], result: dict[str, Any], stream: bytes) -> dict[str, Any]:
    """The child's result, checked by the grading server against the record it streamed: each case's operators
    are those of the stream; a case whose record was taken away, or an exercise whose answer reached the record
    or the course's code from inside, gets no credit (a shortcut), and so does a case that ran an operator
    outside the exercise's allow-list. Runs in the server, where no answer's code runs."""
    from transformer_lab.i18n import message

    entries = result.get("cases")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return result
    record = read_record(stream, len(entries))
    key = f"{str(request.get('module', '')).rsplit('.', 1)[-1]}.{request.get('exercise', '')}"
    allowed = allowed_operators(key)
    result["record"] = {"tampered": record["tampered"], "allowlist": allowed is not None, "outside": []}
    for index, entry in enumerate(entries):
        reported = entry.get("ops") if isinstance(entry.get("ops"), list) else []
        ops = sorted(set(record["ops"][index]) | {o for o in reported if isinstance(o, str)})
        entry["ops"] = ops
        answered = entry.get("error") is None and not entry.get("not_done") and not entry.get("shortcut")
        if record["tampered"]:
            entry["shortcut"] = message("grading.record_undone", what=record["tampered"][0])
        elif record["undone"][index] or (answered and not record["opened"][index]):
            # the canary missing at the case's end: the record was taken away while the answer ran
            entry["shortcut"] = message("grading.record_undone", what="no record of the case's end")
        elif allowed is not None and not entry.get("shortcut"):
            outside = [op for op in ops if op not in allowed]
            if outside:
                entry["shortcut"] = message("grading.outside_allowlist", op=", ".join(outside[:3]))
                result["record"]["outside"] += [o for o in outside if o not in result["record"]["outside"]]
    return result


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


def run_exercise(request: dict[str, Any], record_fd: int | None = None) -> dict[str, Any]:
    """Run the cells, then the student's function on every hidden case; return plain results. With `record_fd`,
    the operators each case runs are streamed to the grading server as they run (`S<case>`, `O<operator>` lines,
    the canary, `E<case>`), and audit events that reach the record or the course's code from inside with them."""
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
    canary_input = torch.zeros(1)
    auditing = [False]
    if record_fd is not None:
        import transformer_lab

        auditing = _watch_audit(record_fd, os.path.dirname(os.path.abspath(transformer_lab.__file__)))
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
    for index, case_inputs in enumerate(inputs):
        entry = {"value": None, "error": None, "error_types": [], "shortcut": None, "not_done": False, "ops": []}
        record = OperatorRecord(record_fd)
        started = False  # whether this case's record was opened (an `S` line)
        if timed_out:
            entry["error"] = "not run: an earlier case reached the time limit"
        elif not callable(candidate):
            entry["error"] = f"no function named {request['function']} after running the answer cells"
        else:
            if record_fd is not None:
                _stream(record_fd, b"S%d" % index)
                started = True
            try:
                with (
                    contextlib.redirect_stdout(sink),
                    contextlib.redirect_stderr(sink),
                    _time_limit(request["cell_timeout"]),
                    mode,
                    record,
                ):
                    try:
                        with contextlib.nullcontext() if _needs_grad(case_inputs) else torch.no_grad():
                            value = exercise._run(candidate, *case_inputs)
                    finally:
                        # the canary, inside the record: the server finds it last before the case's end
                        record.seen.discard(CANARY)
                        canary_input.frac()
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
        entry["ops"] = sorted(record.seen - {CANARY})
        if started:
            _stream(record_fd, b"E%d" % index)
        sink.seek(0)
        sink.truncate()
        out["cases"].append(entry)
    auditing[0] = False  # the answer's code is done: what follows (the result's pickling) is the runner's
    return out


def _child(request: dict[str, Any], result_fd: int, record_fd: int) -> None:
    """In a forked child: give up what answers never need, run the exercise, write the result; never returns."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        low, high = sorted((result_fd, record_fd))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 16)
        cpu = max(1, int(request["cpu_seconds"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        request["seccomp"] = give_up_processes_and_signals()
        out = run_exercise(request, record_fd)
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


def _drain(fd: int, into: bytearray) -> bool:
    """Read what the record pipe holds into `into` (kept up to MAX_RECORD + 1 bytes); False at its end."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if chunk and len(into) <= MAX_RECORD:
        into += chunk[: MAX_RECORD + 1 - len(into)]
    return bool(chunk)


def _wait_computing(
    fd: int,
    pid: int,
    deadline: float,
    idle_seconds: float,
    record_fd: int | None = None,
    record: bytearray | None = None,
) -> str | None:
    """Wait until `fd` can be read ("ready"), the deadline passes ("killed") or the child `pid` has waited
    `idle_seconds` without computing ("idle": a sleep, a blocked read, a lock no one releases). Meanwhile what the
    child writes to `record_fd` is read into `record`."""
    window_start, cpu_start = time.monotonic(), _cpu_seconds(pid)
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "killed"
        watched = [fd] if record_fd is None else [fd, record_fd]
        ready = select.select(watched, [], [], min(1.0, deadline - now))[0]
        if record_fd is not None and record_fd in ready:
            if not _drain(record_fd, record if record is not None else bytearray()):
                record_fd = None  # its end: the child closed it (or died)
            if fd not in ready:
                continue
        if fd in ready:
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
    record_read, record_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(record_read)
        _child(request, write_end, record_write)
    os.close(write_end)
    os.close(record_write)
    os.set_blocking(record_read, False)
    record = bytearray()
    deadline = time.monotonic() + float(request["budget"])
    idle = float(request.get("idle_seconds") or max(5.0, float(request.get("cell_timeout", 10.0))))
    waited = _wait_computing(read_end, pid, deadline, idle, record_read, record)
    payload = read_frame(read_end, deadline) if waited == "ready" else None
    os.close(read_end)
    status = "done"
    if payload is None:
        status = waited if waited in ("killed", "idle") else "killed" if time.monotonic() >= deadline else "lost"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    while _drain(record_read, record):  # what the child wrote before it ended
        pass
    os.close(record_read)
    if payload:
        try:
            result = loads(payload, limit=MAX_RESULT)
            if isinstance(result, dict) and "crash" not in result:
                payload = dumps(verify(request, result, bytes(record)))
        except Exception:  # noqa: BLE001, S110 - not a result the grader can read either: it says so
            pass
    return status, payload or b""


def serve() -> None:
    """Import what every answer needs once, then answer requests until stdin closes."""
    import matplotlib

    matplotlib.use("Agg")  # a chapter's setup cell imports pyplot: no display here
    import matplotlib.pyplot  # noqa: F401 - imported once here, inherited by every child

    import transformer_lab
    import transformer_lab.exercises.core  # noqa: F401

    torch.set_num_threads(1)
    dumpable = not_dumpable()
    # the course's source, held by linecache now, so that a warning's or traceback's line never reads a file of the
    # course while an answer runs (reading one then is how an unblocked copy is made, and is reported)
    package = os.path.dirname(os.path.abspath(transformer_lab.__file__))
    for name, loaded in list(sys.modules.items()):
        where = getattr(loaded, "__file__", None)
        if name.startswith("transformer_lab") and isinstance(where, str) and where.startswith(package):
            linecache.getlines(where)
    # warm up what every child uses, so that no child pays a first use against its time limit
    with _Block({}, str), OperatorRecord(), torch.no_grad():
        for dtype in (torch.float32, torch.float64, torch.float16):
            x = torch.ones(2, 3, dtype=dtype)
            (x.exp() / x.sum(-1, keepdim=True)).max(-1)
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing but frames on the channel to the grader
    write_frame(out_fd, dumps({"status": "ready", "torch": str(torch.__version__), "dumpable": dumpable}))
    while True:
        frame = read_frame(0, None, limit=1 << 30)
        if frame is None:
            return
        request = loads(frame)
        # the chapter's (stripped) exercise module, imported once here: every child inherits it
        if isinstance(request.get("module"), str) and request["module"].startswith("transformer_lab.exercises.ch"):
            with contextlib.suppress(Exception):
                linecache.getlines(__import__(request["module"], fromlist=["_"]).__file__)
        status, payload = _handle(request)
        write_frame(out_fd, struct.pack("<B", len(status)) + status.encode() + payload)


if __name__ == "__main__":
    serve()
