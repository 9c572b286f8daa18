"""Grading a submitted chapter where the student's code cannot reach the score.

Threat model: a student controls everything that runs in their notebook's kernel (they can replace any
Python object, `sys.displayhook`, `torch.allclose`, modules in `sys.modules`, ...) and the repository,
reference answers included, is public. So nothing that runs a student's code decides a score:

1. For each exercise, a fresh **child process** (forked from a server that imported torch and the course
   but never ran student code) runs only what the answer needs: the chapter's setup cell and exercise
   import from the *teacher's* copy, then the student's answer cells of this exercise and of the
   exercises before it in the chapter. Nothing else of the notebook runs: no check cell, no cell of
   the chapter's text. Before any student line runs, the finished versions the exercise asks to build
   (its reference, its `forbidden` functions and classes, its forbidden torch functions by every public
   spelling) are made unavailable: a call fails with `ShortcutBlocked` and is reported.
2. The child calls the student's function on **hidden cases**: each visible case's inputs with every
   finite floating-point tensor moved by seeded noise (a seed drawn afresh for each grading run, so no
   one knows it when the answer is written; integer tensors, masks and sizes stay, so each hidden case
   keeps the shape and the edge of the case it comes from). It returns the results as plain data:
   tensors, numbers, strings and containers of them, read back with `torch.load(weights_only=True)`.
3. The **parent**, which never runs student code, computes the reference on the same hidden inputs and
   compares. Each case passed earns its share of the exercise's points (partial credit).

Cell and case time limits stop endless loops (`cell_timeout`, 10 s by default); the parent kills a
child that outlives its budget. What the child saw of tampering (the checker's classes or torch's
comparison functions replaced, the display hook, `float`...) is reported, never trusted: the score
does not depend on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lab import i18n
from transformer_lab.exercises.core import Exercise, _code_objects, _needs_grad, compare
from transformer_lab.i18n import message as _m
from transformer_lab.i18n import text as _t

__all__ = [
    "ShortcutBlocked",
    "hidden_inputs",
    "ExerciseGrade",
    "grade_exercise",
    "plain",
]

#: held while this process computes a case's hidden inputs and the reference's answer to them. A case's inputs
#: may seed and draw from torch's one global generator (`torch.manual_seed`, then `torch.randn`, as the chapters'
#: cases do); `grade_folder` grades in threads, and two threads drawing at once would each get numbers meant for
#: the other, so the reference would answer other inputs than the student's function did in its child.
_REFERENCE_LOCK = threading.Lock()

#: what a child may hand back: anything else becomes a description of what it was
PLAIN_TYPES = (bool, int, float, str, type(None))
TAMPER_WATCH = {
    "transformer_lab.exercises.core.Exercise.check": lambda: Exercise.check,
    "transformer_lab.exercises.core.Exercise.grade": lambda: Exercise.grade,
    "transformer_lab.exercises.core.Exercise.run": lambda: Exercise.run,
    "transformer_lab.exercises.core.compare": lambda: sys.modules["transformer_lab.exercises.core"].compare,
    "torch.allclose": lambda: torch.allclose,
    "torch.equal": lambda: torch.equal,
    "torch.isclose": lambda: torch.isclose,
    "torch.testing.assert_close": lambda: torch.testing.assert_close,
    "sys.displayhook": lambda: sys.displayhook,
    "builtins.float": lambda: __builtins__["float"] if isinstance(__builtins__, dict) else __builtins__.float,
    "builtins.print": lambda: __builtins__["print"] if isinstance(__builtins__, dict) else __builtins__.print,
}


class ShortcutBlocked(RuntimeError):
    """A call into the finished version of what an exercise asks to build, while grading."""


# ------------------------------------------------------------------ hidden cases


def _seed(secret: int, *parts: object) -> int:
    digest = hashlib.sha256(repr((secret, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _perturb(value: Any, generator: torch.Generator) -> Any:
    if isinstance(value, Tensor):
        if not value.is_floating_point() or value.numel() == 0:
            return value
        finite = torch.isfinite(value)
        if not finite.any():
            return value
        spread = value[finite].double().std().item() if int(finite.sum()) > 1 else 0.0
        scale = 0.5 * spread if spread > 0 else 0.5 * max(1.0, value[finite].abs().max().item())
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float64) * scale
        moved = torch.where(finite, value.double() + noise, value.double()).to(value.dtype)
        return moved.requires_grad_(value.requires_grad) if value.requires_grad else moved
    if isinstance(value, tuple):
        return tuple(_perturb(v, generator) for v in value)
    if isinstance(value, list):
        return [_perturb(v, generator) for v in value]
    if isinstance(value, dict):
        return {k: _perturb(v, generator) for k, v in value.items()}
    if isinstance(value, torch.nn.Module):
        with torch.no_grad():
            for parameter in value.parameters():
                parameter.copy_(_perturb(parameter.detach(), generator))
        return value
    return value


def hidden_inputs(exercise: Exercise, index: int, secret: int) -> tuple[Any, ...]:
    """The inputs of hidden case `index` of `exercise`: its visible case, moved by noise seeded with `secret`.

    A case that expects an exception, or whose moved inputs make the reference itself fail, keeps its
    visible inputs (the edge it tests must stay).
    """
    case = exercise.cases[index]
    if case.raises is not None:
        return case.inputs()

    def moved() -> tuple[Any, ...]:
        return _perturb(case.inputs(), torch.Generator().manual_seed(_seed(secret, exercise.name, index)))

    try:
        with torch.no_grad():
            exercise._run(exercise.reference, *moved())
    except Exception:
        return case.inputs()
    return moved()


# ------------------------------------------------------------------ plain data


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as plain data `torch.load(weights_only=True)` reads: tensors, numbers, strings, containers."""
    if depth > 20:
        return {"__unsupported__": "nested too deeply"}
    if isinstance(value, Tensor):
        if value.is_complex() or value.layout != torch.strided or value.device.type == "meta":
            return {"__unsupported__": f"a {value.dtype} tensor on {value.device} ({value.layout})"}
        return value.detach().cpu().clone()
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


# ------------------------------------------------------------------ the child


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


def _blocker(shown: str) -> Callable[..., Any]:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        raise ShortcutBlocked(_m("grading.blocked", shown=shown))

    return blocked


class _Block(TorchFunctionMode):
    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "").split(".", 1)[0]  # `_softmax.default` is `_softmax`
        if name in self.names:
            raise ShortcutBlocked(_m("grading.blocked", shown=self.names[name]))
        return func(*args, **(kwargs or {}))


def _block_finished(exercise: Exercise) -> _Block:
    """Make the finished versions unavailable in this (child) process; return the torch mode to enter."""
    blocked_names: dict[str, str] = {}
    targets: list[Any] = [exercise.reference]
    for item in exercise.forbidden:
        if isinstance(item, str):
            shown = _m("shown.torch", name=item)
            for variant in (item, f"special_{item}", f"native_{item}"):
                blocked_names[variant] = shown
            for module in (torch, torch.nn.functional, torch.Tensor, torch.special, torch.linalg, torch._C._nn):
                for variant in (item, f"native_{item}"):
                    if hasattr(module, variant):
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(module, variant, _blocker(shown))
        else:
            targets.append(item)
    for target in targets:
        for code, shown in _code_objects(target).items():
            if target is exercise.reference:
                shown = _m("shown.reference", name=exercise.name)
            message = _m("grading.blocked", shown=shown)
            for function in _functions_with(code, target):
                replacement = _raising_code(function, message)
                if replacement is not None:
                    function.__code__ = replacement
    return _Block(blocked_names)


def _functions_with(code: Any, target: Any) -> list[Any]:
    if isinstance(target, type):
        found = []
        for value in vars(target).values():
            function = getattr(value, "__func__", value)
            if getattr(function, "__code__", None) is code:
                found.append(function)
        return found
    function = getattr(target, "__func__", target)
    return [function] if getattr(function, "__code__", None) is code else []


def _raising_code(function: Any, message: str) -> Any:
    """A code object for `function` that raises ShortcutBlocked, with the same free variables."""
    free = function.__code__.co_freevars
    names = ", ".join(free)
    source = "def outer():\n"
    for name in free:
        source += f"    {name} = None\n"
    source += "    def blocked(*args, **kwargs):\n"
    if free:
        source += f"        ({names},)\n"
    # resolved through the builtins, not the blocked function's own module globals
    source += "        grading = __import__('transformer_lab.exercises.grading', fromlist=['ShortcutBlocked'])\n"
    source += f"        raise grading.ShortcutBlocked({message!r})\n    return blocked\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - our own fixed template, no student input
    code = namespace["outer"]().__code__
    if code.co_freevars != free:
        return None
    return code


def _snapshot_watched() -> dict[str, Any]:
    found = {}
    for name, get in TAMPER_WATCH.items():
        try:
            found[name] = get()
        except Exception:
            found[name] = None
    return found


def child_main(request: dict[str, Any], result_path: str) -> None:
    """Run inside the child: set up, run the answer cells, call the answer on the hidden cases, save plain results."""
    torch.set_num_threads(1)
    os.environ["TRANSFORMER_LAB_QUICK"] = "1"
    i18n.set_language(request.get("language", "en"))  # the class's language, for the messages made here
    module = __import__(request["module"], fromlist=["_"])
    exercise: Exercise = getattr(module, request["exercise"])
    inputs = [hidden_inputs(exercise, i, request["secret"]) for i in range(len(exercise.cases))]
    watched = _snapshot_watched()
    mode = _block_finished(exercise)
    out: dict[str, Any] = {"cells": [], "cases": [], "tampered": []}
    namespace: dict[str, Any] = {"__name__": "__main__"}
    sink = io.StringIO()
    for kind, source in request["cells"]:
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
        out["cells"].append(entry)
    after = _snapshot_watched()
    out["tampered"] = sorted(name for name in watched if after[name] is not watched[name])
    candidate = namespace.get(request["function"])
    timed_out = False
    for case_inputs in inputs:
        entry = {"value": None, "error": None, "error_types": [], "shortcut": None, "not_done": False}
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
                entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
                entry["error_types"] = [k.__name__ for k in type(exc).__mro__]  # a case may expect an error
                if isinstance(exc, RecursionError):
                    entry["error"] = "RecursionError: the function calls itself without end"
        out["cases"].append(entry)
    torch.save(out, result_path)


def _run_child(request_path: str, result_path: str) -> None:
    """In a forked child of the server: one exercise's answer cells and hidden cases; never returns."""
    try:
        request = torch.load(request_path, weights_only=True)
        child_main(request, result_path)
    except BaseException:  # noqa: BLE001 - say what broke; the parent reports it
        with contextlib.suppress(Exception):
            torch.save({"crash": traceback.format_exc()[-2000:]}, result_path)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(0)  # skip the student's atexit hooks and finalizers


def serve() -> None:
    """The grading server: imports torch and the course once, never runs student code itself.

    It reads lines `REQUEST RESULT BUDGET` from stdin; for each it forks a child that runs the answer,
    waits at most BUDGET seconds (then kills it), and answers `done` or `killed` on stdout.
    """
    import matplotlib

    matplotlib.use("Agg")  # a chapter's setup cell imports pyplot: no display here
    import matplotlib.pyplot  # noqa: F401 - imported once here, inherited by every child

    import transformer_lab  # noqa: F401
    import transformer_lab.exercises  # noqa: F401

    torch.set_num_threads(1)
    for line in sys.stdin:
        request_path, result_path, budget = line.split()
        pid = os.fork()
        if pid == 0:
            _run_child(request_path, result_path)
        deadline = time.monotonic() + float(budget)
        status = "done"
        while True:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = "killed"
                break
            time.sleep(0.005)
        sys.stdout.write(status + "\n")
        sys.stdout.flush()


class Server:
    """A grading server process (see `serve`); one per parallel worker."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TRANSFORMER_LAB_QUICK="1")
        root = str(pathlib.Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "transformer_lab.exercises.grading"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )

    def run(self, request: dict[str, Any], budget: float) -> tuple[str, dict[str, Any] | None]:
        """Send one request; return (status, the plain result or None)."""
        with tempfile.TemporaryDirectory(prefix="tl-grade-") as tmp:
            request_path, result_path = pathlib.Path(tmp) / "request.pt", pathlib.Path(tmp) / "result.pt"
            torch.save(request, request_path)
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(f"{request_path} {result_path} {budget}\n")
            self.process.stdin.flush()
            status = self.process.stdout.readline().strip() or "lost"
            if not result_path.exists():
                return status, None
            try:
                return status, torch.load(result_path, weights_only=True)
            except Exception:  # not plain data: nothing to credit
                return "unreadable", None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ the parent


@dataclass
class ExerciseGrade:
    """The grade of one exercise of one submission, computed where no student code ran."""

    exercise: str
    points: float
    max_points: float
    cases: list[tuple[bool, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # for the teacher's report
    shortcut: str | None = None
    tampered: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(ok for ok, _ in self.cases)


def grade_exercise(
    exercise: Exercise,
    function: str,
    cells: list[tuple[str, str]],
    max_points: float,
    secret: int,
    cell_timeout: float = 10.0,
    server: Server | None = None,
) -> ExerciseGrade:
    """Grade one exercise: run `cells` and `function` in a child process, compare here.

    Args:
        exercise: the exercise (from the teacher's package).
        function: the name of the student's function.
        cells: (kind, source) to run in order: the teacher's setup, then the student's answer cells.
        max_points: the exercise's points.
        secret: the grading run's secret seed (hidden cases).
        cell_timeout: seconds allowed to each cell and to each case.
        server: a running grading `Server` (one is started and stopped for this call if none is given).
    """
    grade = ExerciseGrade(exercise.name, 0.0, max_points)
    request = {
        "module": _module_of(exercise),
        "exercise": _attribute_of(exercise),
        "function": function,
        "cells": cells,
        "secret": secret,
        "cell_timeout": float(cell_timeout),
        "language": i18n.get_language(),
    }
    budget = cell_timeout * (len(cells) + len(exercise.cases)) + 30.0
    owned = server is None
    server = server or Server()
    try:
        status, result = server.run(request, budget)
    finally:
        if owned:
            server.close()
    if status == "killed":
        grade.problems.append(_m("grading.stopped", seconds=f"{budget:g}"))
        grade.cases = [
            (False, _m("check.case_problem", case=_t(case.name), problem=_m("grading.did_not_finish")))
            for case in exercise.cases
        ]
        return grade
    if result is None:
        grade.problems.append(_m("grading.no_result_process", status=status))
        grade.cases = [
            (False, _m("check.case_problem", case=_t(case.name), problem=_m("grading.no_result")))
            for case in exercise.cases
        ]
        return grade
    if "crash" in result:
        grade.problems.append(_m("grading.crashed") + "\n" + str(result["crash"]))
        grade.cases = [
            (False, _m("check.case_problem", case=_t(case.name), problem=_m("grading.no_result")))
            for case in exercise.cases
        ]
        return grade
    for cell in result["cells"]:
        if cell["error"] and cell["kind"].startswith("answer"):
            grade.problems.append(_m("grading.cell_raised", cell=cell["kind"], error=cell["error"]))
    grade.tampered = list(result["tampered"])
    for index, (case, entry) in enumerate(zip(exercise.cases, result["cases"], strict=True)):
        name = _t(case.name)
        if entry["shortcut"]:
            grade.shortcut = entry["shortcut"]
            grade.cases.append((False, _m("check.case_problem", case=name, problem=entry["shortcut"])))
            continue
        if entry["not_done"]:
            grade.cases.append((False, _m("check.case_problem", case=name, problem=_m("grading.not_done"))))
            continue
        if case.raises is not None:
            ok = case.raises.__name__ in entry.get("error_types", [])
            problem = None if ok else (entry["error"] or _m("run.should_raise", error=case.raises.__name__))
            grade.cases.append((ok, name if ok else _m("check.case_problem", case=name, problem=problem)))
            continue
        if entry["error"]:
            grade.cases.append((False, _m("check.case_problem", case=name, problem=entry["error"])))
            continue
        with _REFERENCE_LOCK:  # one grader thread at a time (see _REFERENCE_LOCK)
            inputs = hidden_inputs(exercise, index, secret)
            with contextlib.nullcontext() if _needs_grad(inputs) else torch.no_grad():
                expected = plain(exercise._run(exercise.reference, *inputs))
        value = entry["value"]
        if isinstance(value, dict) and "__unsupported__" in value:
            problem = _m("grading.unsupported", what=value["__unsupported__"])
        else:
            problem = compare(value, expected, case.atol, case.rtol)
            if problem is not None and exercise.kind == "predict":
                problem = exercise._explain_wrong(value)
        grade.cases.append(
            (problem is None, name if problem is None else _m("check.case_problem", case=name, problem=problem))
        )
    if grade.shortcut:
        grade.problems.append(_m("grading.called_finished", exercise=exercise.name, shortcut=grade.shortcut))
    total = len(exercise.cases)
    grade.points = round(max_points * grade.passed / total, 4) if total and not grade.shortcut else 0.0
    return grade


def _module_of(exercise: Exercise) -> str:
    for name, module in list(sys.modules.items()):
        if name.startswith("transformer_lab.exercises.") and any(v is exercise for v in vars(module).values()):
            return name
    raise ValueError(f"exercise {exercise.name!r} is not defined in a transformer_lab.exercises module")


def _attribute_of(exercise: Exercise) -> str:
    module = sys.modules[_module_of(exercise)]
    for attribute, value in vars(module).items():
        if value is exercise:
            return attribute
    raise ValueError(f"exercise {exercise.name!r} not found in its module")


if __name__ == "__main__":
    # run the server from the package's module (not this __main__ copy), so that every class a child
    # meets (ShortcutBlocked above all) is the one the blocked functions raise
    from transformer_lab.exercises import grading

    grading.serve()


# ------------------------------------------------------------------ a whole submitted notebook

_CHECK_LINE = re.compile(r"^\s*exercises\.(\w+)\.check\((\w+)\)\s*$", re.M)
_IMPORT_LINE = re.compile(r"^from transformer_lab\.exercises import (\w+) as exercises\s*$", re.M)
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
#: names whose attributes an honest answer never assigns to (assigning to them patches the course or torch)
_PATCHABLE = {
    "torch",
    "F",
    "nn",
    "tl",
    "transformer_lab",
    "np",
    "numpy",
    "math",
    "sys",
    "builtins",
    "exercises",
    "Exercise",
    "Case",
    "core",
    "random",
    "importlib",
    "inspect",
}


@dataclass
class NotebookGrade:
    """One student's grade for one chapter."""

    chapter: str
    exercises: list[tuple[str, ExerciseGrade]] = field(default_factory=list)  # (grade_id, grade)
    problems: list[str] = field(default_factory=list)

    @property
    def points(self) -> float:
        return round(sum(grade.points for _, grade in self.exercises), 4)

    @property
    def max_points(self) -> float:
        return sum(grade.max_points for _, grade in self.exercises)


def _source(cell: dict[str, Any]) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else str(text)


def _meta(cell: dict[str, Any]) -> dict[str, Any]:
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    nbgrader = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
    return nbgrader if isinstance(nbgrader, dict) else {}


def _visible(text: str) -> str:
    return _HIDDEN.sub("", text).strip()


def suspicious_lines(source: str) -> list[str]:
    """Lines of an answer cell that patch the course, torch or Python itself (an honest answer has none)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        targets: list[Any] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            base = target
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if (
                isinstance(target, (ast.Attribute, ast.Subscript))
                and isinstance(base, ast.Name)
                and (base.id in _PATCHABLE or base.id == "__builtins__")
            ):
                found.append(ast.unparse(node).splitlines()[0][:120])
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in {"setattr", "delattr", "sys.setprofile", "sys.settrace", "globals().update"} or name.endswith(
                ("_pop_mode", "_pop_torch_function_stack", "reload")
            ):
                found.append(ast.unparse(node).splitlines()[0][:120])
    return found


def grade_notebook(
    teacher: dict[str, Any],
    submitted: dict[str, Any],
    chapter: str,
    secret: int,
    cell_timeout: float = 10.0,
    server: Server | None = None,
) -> NotebookGrade:
    """Grade one submitted chapter against the teacher's source notebook (both as JSON dicts).

    What runs of the submission, for each exercise: the teacher's setup cell (the chapter's first code
    cell) and exercise import, then the student's answer cells (nbgrader solution cells, matched by
    their id) of this exercise and of every exercise before it. Never a check cell, never any other
    cell of the student's notebook.
    """
    result = NotebookGrade(chapter)
    cells = teacher.get("cells", [])
    code_cells = [c for c in cells if c.get("cell_type") == "code"]
    setup = [("setup", _source(code_cells[0]))] if code_cells else []
    modules = [m.group(1) for c in code_cells for m in [_IMPORT_LINE.search(_source(c))] if m]
    if modules:
        setup.append(("setup", f"from transformer_lab.exercises import {modules[0]} as exercises"))
    mine = submitted.get("cells", []) if isinstance(submitted.get("cells"), list) else []
    by_id: dict[str, dict[str, Any]] = {}
    for cell in mine:
        grade_id = _meta(cell).get("grade_id") if isinstance(cell, dict) else None
        if isinstance(grade_id, str):
            if grade_id in by_id:
                result.problems.append(f"cell {grade_id!r} appears twice (a copied locked or answer cell)")
            by_id.setdefault(grade_id, cell)
    # locked cells: present and unchanged
    for cell in cells:
        meta = _meta(cell)
        if not meta.get("locked") or not meta.get("grade_id"):
            continue
        theirs = by_id.get(meta["grade_id"])
        if theirs is None:
            result.problems.append(f"locked cell {meta['grade_id']!r} was deleted or renamed")
        elif _visible(_source(theirs)) != _visible(_source(cell)):
            result.problems.append(f"locked cell {meta['grade_id']!r} was edited")
    answers: list[tuple[str, str]] = []
    module = __import__(f"transformer_lab.exercises.{modules[0]}", fromlist=["_"]) if modules else None
    for cell in cells:
        meta = _meta(cell)
        if meta.get("solution") and cell.get("cell_type") == "code":
            theirs = by_id.get(meta.get("grade_id", ""))
            if theirs is None:
                result.problems.append(f"answer cell {meta.get('grade_id')!r} is missing")
                continue
            text = _source(theirs)
            for line in suspicious_lines(text):
                result.problems.append(f"answer cell {meta['grade_id']!r} patches the course or torch: {line}")
            answers.append((f"answer {meta['grade_id']}", text))
        if meta.get("grade") and cell.get("cell_type") == "code":
            match = _CHECK_LINE.search(_source(cell))
            if not match or module is None:
                continue
            exercise = getattr(module, match.group(1), None)
            if not isinstance(exercise, Exercise):
                result.problems.append(f"the teacher's check cell {meta['grade_id']!r} names no known exercise")
                continue
            grade = grade_exercise(
                exercise,
                match.group(2),
                setup + answers,
                float(meta.get("points", 1)),
                secret,
                cell_timeout=cell_timeout,
                server=server,
            )
            for name in grade.tampered:
                message = f"the answer cells replaced {name}"
                if message not in result.problems:
                    result.problems.append(message)
            result.problems.extend(p for p in grade.problems if p not in result.problems)
            stopped = [text for ok, text in grade.cases if not ok and "time limit" in text]
            if stopped:
                result.problems.append(
                    f"{exercise.name}: stopped at the time limit of {cell_timeout:g} s ({stopped[0].split(': ')[0]})"
                )
            result.exercises.append((meta["grade_id"], grade))
    return result
