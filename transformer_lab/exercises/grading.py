"""Grading a submitted chapter where the student's code can reach neither the score nor an answer.

Threat model: a student controls everything that runs of their notebook: they can replace any Python
object, read and write any file their process can, start processes, send signals, allocate memory, and
look for the answers in what their process holds; and the repository, reference answers included, is
public. So nothing that runs a student's code decides a score, and nothing within its reach holds an answer:

1. **A static check** (`transformer_lab.exercises.policy`), here in the grader before anything runs: an
   answer cell that uses a private or introspective name (`torch._C`, `torch.ops`, `__code__`, frames,
   `importlib`, `sys.modules`, `eval`/`exec`, `/proc`, ...) does not run; its exercise gets 0 points and the
   feedback says why.
2. **A sandbox per student** (`transformer_lab.exercises.sandbox`, kept for all of one student's chapters by
   `StudentSandbox`, never shared with another student): the answers run in a bubblewrap sandbox that reads
   only the interpreter, site-packages and a stripped copy of the course package (no references, wrong answers,
   stored answers or grading code), writes only a scratch folder thrown away with it, has no network, sees and
   signals no process outside it, and is held to memory and CPU limits. Its grading server
   (`transformer_lab.exercises.runner`) forks a child per exercise that may start no process and send no signal.
3. **Hidden cases computed here**: each visible case's inputs moved by noise drawn from the class's secret
   (never sent into the sandbox: the sandbox receives the moved tensors, not the seed), in the way the case
   allows (`Case.hidden`: a constant input stays constant, an all-zero one zero, masks and integers stay).
4. **The finished versions blocked and recorded** in the sandbox: the exercise's forbidden torch functions
   fail by every spelling (`TorchFunctionMode`), its forbidden library functions and classes fail by their
   code, and every ATen operator each case runs is recorded (`TorchDispatchMode`); here the record is
   checked against the exercise's deny-list of fused kernels (`FUSED_KERNELS`).
5. **The comparison here**, in the grader, which never runs a student's code: the reference runs on the
   same hidden inputs and each case passed earns its share of the points (partial credit).

What the sandbox reports of tampering is reported, never trusted: the score does not depend on it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import pathlib
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from transformer_lab import i18n
from transformer_lab.exercises import policy
from transformer_lab.exercises.core import Exercise, _needs_grad
from transformer_lab.exercises.runner import ShortcutBlocked, float_leaves, plain
from transformer_lab.exercises.sandbox import (
    Limits,
    SandboxServer,
    SandboxUnavailable,
    font_cache,
    probe,
    stripped_package,
)
from transformer_lab.i18n import message as _m
from transformer_lab.i18n import text as _t

__all__ = [
    "ShortcutBlocked",
    "hidden_inputs",
    "ExerciseGrade",
    "grade_exercise",
    "plain",
    "GradingSession",
    "StudentSandbox",
    "grade_notebook",
    "FUSED_KERNELS",
    "SandboxUnavailable",
    "Limits",
    "clean_result",
    "chapter_limit",
    "exercise_kinds",
    "stripped_package",
    "unreadable_reason",
]

#: held while this process computes a case's hidden inputs and the reference's answer to them. A case's inputs
#: may seed and draw from torch's one global generator (`torch.manual_seed`, then `torch.randn`, as the chapters'
#: cases do); `grade_folder` grades in threads, and two threads drawing at once would each get numbers meant for
#: the other, so the reference would answer other inputs than the student's function did in its sandbox.
_REFERENCE_LOCK = threading.Lock()

_SOFTMAX = {
    "_softmax",
    "_log_softmax",
    "_safe_softmax",
    "softmax",
    "log_softmax",
    "logsumexp",
    "_masked_softmax",
    "_sparse_softmax",
    "_sparse_log_softmax",
    "_sparse_csr_softmax",
}
_DISTANCES = {"_cdist_forward", "cdist", "_euclidean_dist", "pairwise_distance", "_pdist_forward", "pdist"}
_SDPA = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
    "_fused_sdp_choice",
    "_native_multi_head_attention",
    "_transformer_encoder_layer_fwd",
}
_NORMS = {
    "native_layer_norm",
    "layer_norm",
    "native_group_norm",
    "group_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_impl_index",
    "batch_norm",
    "instance_norm",
    "_fused_rms_norm",
    "rms_norm",
}
#: per exercise, the ATen operators that compute its answer whole (a fused kernel), whatever Python spelling
#: reached them (`torch.softmax`, `torch.ops.aten._softmax`, `torch._C._nn...`). A deny-list, not an allow-list:
#: any honest way of building the answer from smaller operators stays allowed. Exercises not named here
#: (predict exercises, and those whose answer no single kernel computes) deny none.
FUSED_KERNELS: dict[str, frozenset[str]] = {
    "squared_lengths": frozenset({"linalg_vector_norm", "norm", "frobenius_norm"} | _DISTANCES),
    "softmax_rows": frozenset(_SOFTMAX),
    "attention": frozenset(_SDPA),
    "distance_attention": frozenset(_SDPA | _DISTANCES),
    "masked_softmax": frozenset(_SDPA | {"_masked_softmax", "_sparse_softmax", "_sparse_log_softmax"}),
    "grouped_query_attention": frozenset(_SDPA),
    "masked_batch_norm": frozenset(_NORMS),
    "layer_norm": frozenset(_NORMS),
    "rms_norm": frozenset(_NORMS),
    "swiglu_feed_forward": frozenset({"silu", "glu", "silu_"}),
    "from_pytorch_layer": frozenset(_SDPA),
    "embedding_grad": frozenset({"embedding", "embedding_backward", "embedding_dense_backward"}),
    "top_p_filter": frozenset(_SOFTMAX),
}


# ------------------------------------------------------------------ hidden cases


def _seed(secret: int, *parts: object) -> int:
    digest = hashlib.sha256(repr((secret, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def submission_secret(secret: int, student: str, cells: list[str]) -> int:
    """The seed of one submission's hidden cases of one exercise: the class's secret, the student and a hash of
    the exercise's answer cells. A re-grade of the same submission draws the same inputs (the same grade); a
    changed answer meets new ones, so a table of answers built from one round's feedback is worth nothing in
    the next, and two students never share hidden inputs."""
    if not isinstance(student, str):  # repr() of anything else (a sandbox object) would change from run to run
        raise TypeError(f"student must be the student's id as a str, got {type(student).__name__}")
    digest = hashlib.sha256("\0".join(cells).encode("utf-8", "surrogatepass")).hexdigest()
    return _seed(secret, "submission", student, digest)


#: a number that could carry a hidden input or a hidden expected value out through the feedback: one with a
#: decimal point or an exponent, or one of four digits or more (shapes, counts and indices stay)
_VALUE = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE][-+]?\d))(?:[eE][-+]?\d+)?|\d{4,}|\b(?:nan|inf)\b")


def hide_values(text: str) -> str:
    """A message about a hidden case without its values: every number that could be an input or an expected
    value is replaced by "…" (the feedback says what is wrong and where, not the hidden numbers)."""
    return _VALUE.sub("…", text)


def _move(value: Tensor, generator: torch.Generator, mode: str) -> Tensor:
    """One floating-point tensor moved as `mode` allows, keeping the property its case tests."""
    if not value.is_floating_point() or value.numel() == 0:
        return value
    finite = torch.isfinite(value)
    if not finite.any():
        return value
    values = value[finite].double()
    if mode == "scale":
        # one positive factor for the whole tensor: zeros stay zero, constant rows constant, signs and order stay
        factor = float(torch.empty((), dtype=torch.float64).uniform_(0.5, 2.0, generator=generator))
        moved = torch.where(finite, value.double() * factor, value.double())
    else:
        if bool((values == 0).all()):
            return value  # an all-zero input stays all zero
        spread = values.std().item() if values.numel() > 1 else 0.0
        scale = 0.5 * spread if spread > 0 else 0.5 * max(1.0, values.abs().max().item())
        if bool((values == values[0]).all()):
            noise = torch.randn((), generator=generator, dtype=torch.float64) * scale  # a constant stays constant
        else:
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float64) * scale
        moved = torch.where(finite, value.double() + noise, value.double())
    moved = moved.to(value.dtype)
    return moved.requires_grad_(True) if value.requires_grad else moved


def _perturb(value: Any, generator: torch.Generator, mode: str = "noise") -> Any:
    if isinstance(value, Tensor):
        return _move(value, generator, mode)
    if isinstance(value, tuple):
        return tuple(_perturb(v, generator, mode) for v in value)
    if isinstance(value, list):
        return [_perturb(v, generator, mode) for v in value]
    if isinstance(value, dict):
        return {k: _perturb(v, generator, mode) for k, v in value.items()}
    if isinstance(value, torch.nn.Module):
        with torch.no_grad():
            for parameter in value.parameters():
                parameter.copy_(_move(parameter.detach(), generator, mode))
        return value
    return value


def hidden_inputs(exercise: Exercise, index: int, secret: int) -> tuple[Any, ...]:
    """The inputs of hidden case `index` of `exercise`: its visible case, moved as the case allows
    (`Case.hidden`), with noise seeded by `secret`.

    A case that expects an exception, or whose moved inputs make the reference itself fail, keeps its
    visible inputs (the edge it tests must stay); so does a case whose `hidden` is "same".
    """
    case = exercise.cases[index]
    mode = getattr(case, "hidden", "noise")
    if case.raises is not None or mode == "same":
        return case.inputs()

    def moved() -> tuple[Any, ...]:
        return _perturb(case.inputs(), torch.Generator().manual_seed(_seed(secret, exercise.name, index)), mode)

    try:
        with torch.no_grad():
            exercise._run(exercise.reference, *moved())
    except Exception:
        return case.inputs()
    return moved()


def _sent_leaves(exercise: Exercise, index: int, secret: int) -> list[Tensor] | None:
    """What the sandbox receives of hidden case `index`: its floating-point tensors (None: the visible case)."""
    case = exercise.cases[index]
    hidden = hidden_inputs(exercise, index, secret)
    leaves = [t.detach().clone() for t in float_leaves(hidden)]
    visible = [t.detach() for t in float_leaves(case.inputs())]
    if len(leaves) == len(visible) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(leaves, visible, strict=True)
    ):
        return None
    return leaves


# ------------------------------------------------------------------ sessions: one stripped copy, many sandboxes


class GradingSession:
    """What a grading run shares: the stripped copy of the package and a font cache, in a temporary folder,
    the sandbox's limits, and whether there is a sandbox at all. `server()` starts one submission's sandbox.

    Raises SandboxUnavailable (saying why and what to do) where a sandbox cannot be made, unless `sandbox`
    is False (the teacher's explicit choice; the report says so).
    """

    def __init__(self, limits: Limits | None = None, sandbox: bool = True, hide: tuple[str, ...] = ()) -> None:
        self.limits = limits or Limits()
        self.sandbox = sandbox
        self.hide = tuple(str(h) for h in hide)
        if sandbox:
            reason = probe(self.limits)
            if reason is not None:
                raise SandboxUnavailable(
                    f"{reason}. Grading runs students' code and refuses to do so without a sandbox; to grade "
                    f"anyway, knowing that a student's code can then read and change what your account can, "
                    f"pass --no-sandbox (the report will say so on its first line)"
                )
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="tl-grading-"))
        self.package = stripped_package(self.folder / "package")
        self.fonts = font_cache(self.folder / "fonts")

    def server(self) -> SandboxServer:
        return SandboxServer(self.package, self.fonts, self.limits, self.sandbox, self.hide)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> GradingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StudentSandbox:
    """One student's grading server, kept for all of that student's chapters: started on first use, started again
    whenever an answer stopped it, closed by `close()`. A server keeps what it was sent (answers, inputs), so it is
    never shared between students, nor between threads (it answers one request at a time).

    A teacher grading a class pays the sandbox's start (Python, PyTorch and matplotlib, about 4 s of CPU) once per
    student rather than once per student and chapter.
    """

    def __init__(self, session: GradingSession) -> None:
        self.session = session
        self.started = 0  # how many servers were started (one, unless answers stopped some)
        self._server: SandboxServer | None = None

    def server(self) -> SandboxServer:
        """The running server, started (again) if there is none or the last one stopped."""
        if self._server is None or not self._server.alive():
            if self._server is not None:
                self._server.close()
            self._server = self.session.server()
            self.started += 1
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> StudentSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFAULT: dict[str, GradingSession] = {}
_DEFAULT_LOCK = threading.Lock()  # grader threads arriving together make one session, not two


def default_session() -> GradingSession:
    """A sandboxed session for this process (made on first use, removed at exit)."""
    with _DEFAULT_LOCK:
        if "session" not in _DEFAULT:
            _DEFAULT["session"] = GradingSession()
            atexit.register(_DEFAULT["session"].close)
        return _DEFAULT["session"]


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
    refused: list[str] = field(default_factory=list)  # the static check's findings
    fused: list[str] = field(default_factory=list)  # denied ATen operators the answer ran

    @property
    def passed(self) -> int:
        return sum(ok for ok, _ in self.cases)


# ------------------------------------------------------------------ what comes out of a sandbox, checked

#: the longest text of a sandbox's answer kept (an error message, a shortcut's message); the rest is cut
MAX_TEXT = 300
#: the most a sandbox's answer may hold: nodes of its values (containers, numbers, strings), and tensor elements
MAX_NODES = 20_000
MAX_ELEMENTS = 1 << 22
_OP_NAME = re.compile(r"^[A-Za-z0-9_.]{1,80}$")


class Malformed(ValueError):
    """A sandbox's answer that is not what a grading server sends (forged, too large, too deep)."""


def clean_text(value: Any, limit: int = MAX_TEXT) -> str | None:
    """A text out of a sandbox (an error message, what an answer printed), cut to `limit` characters, its control
    characters but newlines and tabs replaced; None stays None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Malformed("a text that is no string")
    text = value[: limit + 1]
    text = "".join(c if c.isprintable() or c in "\n\t" else " " for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Budget:
    def __init__(self) -> None:
        self.nodes, self.elements = 0, 0

    def take(self, nodes: int = 1, elements: int = 0) -> None:
        self.nodes += nodes
        self.elements += elements
        if self.nodes > MAX_NODES or self.elements > MAX_ELEMENTS:
            raise Malformed("more values than an answer returns")


def _plain_copy(value: Any, budget: _Budget, depth: int = 0) -> Any:
    """A fresh copy of a value out of a sandbox, held to the budget (a structure that repeats itself by
    reference is counted at each repeat), 24 levels deep at most, and tensors to plain strided CPU ones whose
    storage holds them."""
    if depth > 24:
        raise Malformed("a value nested too deeply")
    budget.take()
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        if value.bit_length() > 256:
            raise Malformed("an integer too large")
        return value
    if isinstance(value, str):
        if len(value) > 10_000:
            raise Malformed("a string too long")
        return value
    if isinstance(value, Tensor):
        if type(value) is not Tensor and not isinstance(value, torch.nn.Parameter):
            raise Malformed("a tensor subclass")
        if value.layout != torch.strided or value.device.type != "cpu" or value.is_quantized:
            return {"__unsupported__": f"a {value.dtype} tensor on {value.device} ({value.layout})"}
        budget.take(elements=value.numel())
        spans = zip(value.shape, value.stride(), strict=True)
        needed = value.storage_offset() + sum((n - 1) * st for n, st in spans) + 1
        if value.numel() and needed * value.element_size() > value.untyped_storage().nbytes():
            raise Malformed("a tensor larger than its storage")
        return value.detach().as_subclass(Tensor).clone()
    if isinstance(value, (tuple, list)):
        budget.take(nodes=len(value))
        items = [_plain_copy(v, budget, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        budget.take(nodes=len(value))
        return {str(_plain_copy(k, budget, depth + 1)): _plain_copy(v, budget, depth + 1) for k, v in value.items()}
    raise Malformed(f"a value of type {type(value).__name__}")


def clean_result(result: Any, cases: int) -> dict[str, Any]:
    """A grading server's answer about one exercise, checked and copied: the fields the grader reads, of the
    types and sizes it expects, `cases` case entries, texts cut and cleaned. Malformed if it is anything else."""
    if not isinstance(result, dict):
        raise Malformed("not a record")
    if "crash" in result:
        return {"crash": clean_text(result["crash"], 2000)}
    budget = _Budget()
    cells, entries = result.get("cells"), result.get("cases")
    if not isinstance(cells, list) or not isinstance(entries, list) or len(entries) != cases or len(cells) > 1000:
        raise Malformed("not the cells and cases of this exercise")
    out: dict[str, Any] = {"cells": [], "cases": [], "seccomp": bool(result.get("seccomp"))}
    for cell in cells:
        if not isinstance(cell, dict):
            raise Malformed("a cell that is no record")
        out["cells"].append({"kind": clean_text(cell.get("kind"), 80) or "", "error": clean_text(cell.get("error"))})
    tampered = result.get("tampered", [])
    if not isinstance(tampered, list):
        raise Malformed("tampered: no list")
    out["tampered"] = sorted({t for t in tampered if isinstance(t, str) and t in runner_watch()})
    for entry in entries:
        if not isinstance(entry, dict):
            raise Malformed("a case that is no record")
        ops, types = entry.get("ops", []), entry.get("error_types", [])
        if not isinstance(ops, list) or not isinstance(types, list) or len(ops) > 5000 or len(types) > 64:
            raise Malformed("a case's operators or error types")
        out["cases"].append(
            {
                "value": _plain_copy(entry.get("value"), budget),
                "error": clean_text(entry.get("error")),
                "error_types": [t for t in types if isinstance(t, str) and _OP_NAME.match(t)],
                "shortcut": clean_text(entry.get("shortcut")),
                "not_done": entry.get("not_done") is True,
                # an operator the record cannot name is named as such: it still counts against an allow-list
                "ops": sorted({op if isinstance(op, str) and _OP_NAME.match(op) else "<unnamed>" for op in ops}),
            }
        )
    return out


def runner_watch() -> tuple[str, ...]:
    from transformer_lab.exercises.runner import TAMPER_WATCH_NAMES

    return TAMPER_WATCH_NAMES


def _all_cases(exercise: Exercise, problem: str) -> list[tuple[bool, str]]:
    return [(False, _m("check.case_problem", case=_t(case.name), problem=problem)) for case in exercise.cases]


def grade_exercise(
    exercise: Exercise,
    function: str,
    cells: list[tuple[str, str]],
    max_points: float,
    secret: int,
    cell_timeout: float = 10.0,
    server: SandboxServer | None = None,
    deadline: float | None = None,
) -> ExerciseGrade:
    """Grade one exercise: run `cells` and `function` in a sandbox, compare here.

    Args:
        exercise: the exercise (from the teacher's package).
        function: the name of the student's function.
        cells: (kind, source) to run in order: the teacher's setup, then the student's answer cells.
        max_points: the exercise's points.
        secret: the class's secret (the hidden cases' seed); it never leaves this process.
        cell_timeout: seconds allowed to each cell and to each case.
        server: a running sandbox (`GradingSession.server()`); one is started and stopped for this call if none
            is given.
        deadline: when (`time.monotonic()`) the grading of this student's chapter must end: the exercise gets
            what is left of it at most, and is not graded if nothing is.
    """
    grade = ExerciseGrade(exercise.name, 0.0, max_points)
    budget = cell_timeout * (len(cells) + len(exercise.cases)) + 30.0
    if deadline is not None:
        left = deadline - time.monotonic()
        if left < 1.0:
            reason = _m("grading.chapter_time_spent")
            grade.problems.append(_m("grading.not_graded", reason=reason))
            grade.cases = _all_cases(exercise, _m("grading.not_graded", reason=reason))
            return grade
        budget = min(budget, left)
    with _REFERENCE_LOCK:
        leaves = [_sent_leaves(exercise, i, secret) for i in range(len(exercise.cases))]
    request = {
        "module": _module_of(exercise),
        "exercise": _attribute_of(exercise),
        "function": function,
        "cells": cells,
        "leaves": leaves,
        "cell_timeout": float(cell_timeout),
        "cpu_seconds": int(budget) + 1,
        "language": i18n.get_language(),
    }
    owned = server is None
    server = server or default_session().server()
    try:
        status, result = server.run(request, budget)
    finally:
        if owned:
            server.close()
    if status == "killed":
        grade.problems.append(_m("grading.stopped", seconds=f"{budget:.0f}"))
        grade.cases = _all_cases(exercise, _m("grading.did_not_finish"))
        return grade
    if status == "idle":
        reason = _m("grading.idle")
        grade.problems.append(_m("grading.not_graded", reason=reason))
        grade.cases = _all_cases(exercise, _m("grading.did_not_finish"))
        return grade
    if status == "done" and result is not None:
        try:
            result = clean_result(result, len(exercise.cases))
        except Malformed as exc:
            status, result = f"malformed: {exc}", None
    if status != "done" or result is None:
        reason = (
            _m("grading.sandbox_stopped") if status == "sandbox" else _m("grading.no_result_process", status=status)
        )
        grade.problems.append(_m("grading.not_graded", reason=reason))
        grade.cases = _all_cases(exercise, _m("grading.not_graded", reason=reason))
        return grade
    if "crash" in result:
        grade.problems.append(_m("grading.crashed") + "\n" + str(result["crash"]))
        grade.cases = _all_cases(exercise, _m("grading.no_result"))
        return grade
    for cell in result["cells"]:
        if cell["error"] and cell["kind"].startswith("answer"):
            grade.problems.append(_m("grading.cell_raised", cell=cell["kind"], error=cell["error"]))
    grade.tampered = list(result["tampered"])
    denied = FUSED_KERNELS.get(exercise.name, frozenset())
    for index, (case, entry) in enumerate(zip(exercise.cases, result["cases"], strict=True)):
        name = _t(case.name)
        fused = sorted(set(entry.get("ops", [])) & denied)
        if fused and not entry["shortcut"]:
            entry["shortcut"] = _m("grading.fused", op=fused[0])
            grade.fused += [op for op in fused if op not in grade.fused]
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
            problem = hide_values(problem) if problem and leaves[index] is not None else problem
            grade.cases.append((ok, name if ok else _m("check.case_problem", case=name, problem=problem)))
            continue
        hidden = leaves[index] is not None  # its inputs were moved: its values stay out of the feedback
        if entry["error"]:
            problem = hide_values(entry["error"]) if hidden else entry["error"]
            grade.cases.append((False, _m("check.case_problem", case=name, problem=problem)))
            continue
        with _REFERENCE_LOCK:  # one grader thread at a time (see _REFERENCE_LOCK)
            inputs = hidden_inputs(exercise, index, secret)
            with contextlib.nullcontext() if _needs_grad(inputs) else torch.no_grad():
                expected = plain(exercise._run(exercise.reference, *inputs))
        value = entry["value"]
        if isinstance(value, dict) and "__unsupported__" in value:
            problem = _m("grading.unsupported", what=value["__unsupported__"])
        else:
            problem = exercise.compare(value, expected, case)
            if problem is not None and hidden:
                problem = hide_values(problem)
            if problem is not None and exercise.kind == "predict":
                problem = exercise._explain_wrong(value)
            elif problem is not None:  # a known mistake's symptom: recognised here, never in the sandbox
                with _REFERENCE_LOCK:
                    why = exercise.recognise(
                        value, lambda i=index: hidden_inputs(exercise, i, secret), case.atol, case.rtol
                    )
                if why:
                    problem = _m("run.mistake", problem=problem, why=why)
        grade.cases.append(
            (problem is None, name if problem is None else _m("check.case_problem", case=name, problem=problem))
        )
    if grade.shortcut:
        grade.problems.append(_m("grading.called_finished", exercise=exercise.name, shortcut=grade.shortcut))
    total = len(exercise.cases)
    grade.points = round(max_points * grade.passed / total, 4) if total and not grade.shortcut else 0.0
    return grade


def _blank(source: str) -> set[str]:
    """The functions a cell defines if it is a blank answer (every function's body only `raise
    NotImplementedError`, as the student version hands it out), else an empty set."""
    import ast

    try:
        tree = policy.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            return set()
        body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) else node.body
        if len(body) != 1 or not isinstance(body[0], ast.Raise):
            return set()
        raised = body[0].exc
        target = raised.func if isinstance(raised, ast.Call) else raised
        if not (isinstance(target, ast.Name) and target.id == "NotImplementedError"):
            return set()
        names.add(node.name)
    return names


def blank_grade(exercise: Exercise, max_points: float) -> ExerciseGrade:
    """The grade of an exercise left blank: 0 points, "not done yet" for each case, nothing run."""
    grade = ExerciseGrade(exercise.name, 0.0, max_points)
    grade.cases = _all_cases(exercise, _m("grading.not_done"))
    return grade


def refused_grade(exercise: Exercise, max_points: float, findings: list[str]) -> ExerciseGrade:
    """The grade of an exercise whose answer the static check refused: 0 points, each case saying why."""
    grade = ExerciseGrade(exercise.name, 0.0, max_points, refused=list(findings))
    why = _m("grading.refused", what=findings[0])
    grade.cases = _all_cases(exercise, why)
    grade.problems.append(f"{exercise.name}: {why}")
    return grade


def not_graded(exercise: Exercise, max_points: float, why: str) -> ExerciseGrade:
    """The grade of an exercise whose answer could not be read (too large, too deeply nested): 0 points, nothing
    run, each case saying why."""
    grade = ExerciseGrade(exercise.name, 0.0, max_points)
    text = _m("grading.not_graded", reason=why)
    grade.cases = _all_cases(exercise, text)
    grade.problems.append(f"{exercise.name}: {text}")
    return grade


def unreadable_reason(source: str) -> str | None:
    """Why the static passes cannot read an answer cell (`policy.unreadable`: too large, too deep), in the language
    in use (a student reads it in the feedback), or None."""
    why = policy.unreadable(source)
    if why is None:
        return None
    if len(source) > policy.MAX_ANSWER_CHARS:
        return _m("grading.too_large", chars=f"{len(source):,}", limit=f"{policy.MAX_ANSWER_CHARS:,}")
    return _m("grading.too_deep", limit=policy.MAX_DEPTH)  # every other reason is a parser's depth (policy.parse)


def chapter_limit(cell_timeout: float) -> float:
    """The default wall-clock limit of one student's chapter (seconds): twelve times the limit per cell and case,
    two minutes with the default 10 s. An honest chapter takes a few seconds; an answer that stops its own
    alarms and waits or spins can hold a grader no longer than this."""
    return max(60.0, 12 * cell_timeout)


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
        tree = policy.parse(source)
    except (SyntaxError, ValueError):
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


def exercise_kinds(teacher: dict[str, Any]) -> dict[str, str]:
    """{grade_id: kind} for each graded check cell of a teacher's source notebook (a JSON dict) that names an
    exercise of its chapter's module: "build", "debug", "predict" or "transfer" (`Exercise.kind`). What lets a
    report leave the predict exercises out of a grade."""
    code = [c for c in teacher.get("cells", []) if isinstance(c, dict) and c.get("cell_type") == "code"]
    modules = [m.group(1) for c in code for m in [_IMPORT_LINE.search(_source(c))] if m]
    if not modules:
        return {}
    module = __import__(f"transformer_lab.exercises.{modules[0]}", fromlist=["_"])
    kinds = {}
    for cell in code:
        meta, match = _meta(cell), _CHECK_LINE.search(_source(cell))
        exercise = getattr(module, match.group(1), None) if match else None
        if meta.get("grade") and isinstance(meta.get("grade_id"), str) and isinstance(exercise, Exercise):
            kinds[meta["grade_id"]] = exercise.kind
    return kinds


def grade_notebook(
    teacher: dict[str, Any],
    submitted: dict[str, Any],
    chapter: str,
    secret: int,
    cell_timeout: float = 10.0,
    session: GradingSession | None = None,
    sandbox: StudentSandbox | None = None,
    chapter_timeout: float | None = None,
    student: str = "",
) -> NotebookGrade:
    """Grade one submitted chapter against the teacher's source notebook (both as JSON dicts).

    What runs of the submission, for each exercise, in the student's own sandbox (`sandbox`, the one this
    student's other chapters ran in; one is made for this call and closed after it if None; started again if an
    answer stopped it): the teacher's setup cell (the chapter's first code cell) and exercise import, then the
    student's answer cells (nbgrader solution cells, matched by their id) of this exercise and of every exercise
    before it. Never a check cell, never any other cell of the student's notebook, never an answer cell the
    static check refused (its exercise scores 0), never one too large or too deeply nested to be read (its
    exercise is not graded). `chapter_timeout` (seconds; `chapter_limit(cell_timeout)` if None) bounds the wall
    clock of the whole chapter: the exercises left when it is spent are not graded. Each exercise's hidden
    cases are drawn from `submission_secret(secret, student, its answer cells)`.
    """
    deadline = time.monotonic() + (chapter_limit(cell_timeout) if chapter_timeout is None else chapter_timeout)
    session = sandbox.session if sandbox is not None else session or default_session()
    box = sandbox if sandbox is not None else StudentSandbox(session)  # not `student`: that names who is graded
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
    # what runs before every answer: its imports say what an answer's names refer to (the static check's context)
    context = "\n".join(source for _, source in setup) if setup else policy.DEFAULT_CONTEXT
    refused: list[str] = []  # the static check's findings in this exercise's answer cells
    unreadable: list[str] = []  # why an answer cell of this exercise could not be read (too large, too deep)
    own: list[str] = []  # this exercise's own answer cells (since the previous check cell)
    module = __import__(f"transformer_lab.exercises.{modules[0]}", fromlist=["_"]) if modules else None
    try:
        for cell in cells:
            meta = _meta(cell)
            if meta.get("solution") and cell.get("cell_type") == "code":
                theirs = by_id.get(meta.get("grade_id", ""))
                if theirs is None:
                    result.problems.append(f"answer cell {meta.get('grade_id')!r} is missing")
                    continue
                text = _source(theirs)
                try:
                    why = unreadable_reason(text)
                    lines, findings = ([], []) if why else (suspicious_lines(text), policy.refusals(text, context))
                except Exception as exc:  # noqa: BLE001 - no source may stop the static passes
                    why, lines, findings = _m("grading.static_failed", error=type(exc).__name__), [], []
                if why:
                    unreadable.append(why)
                    result.problems.append(_m("grading.cell_not_graded", cell=repr(meta["grade_id"]), reason=why))
                    continue
                for line in lines:
                    result.problems.append(f"answer cell {meta['grade_id']!r} patches the course or torch: {line}")
                if findings:
                    refused += [str(f) for f in findings]
                    result.problems.append(
                        f"answer cell {meta['grade_id']!r} refused (not run): "
                        + "; ".join(str(f) for f in findings[:3])
                        + ("; ..." if len(findings) > 3 else "")
                    )
                    continue
                answers.append((f"answer {meta['grade_id']}", text))
                own.append(text)
            if meta.get("grade") and cell.get("cell_type") == "code":
                match = _CHECK_LINE.search(_source(cell))
                if not match or module is None:
                    continue
                exercise = getattr(module, match.group(1), None)
                if not isinstance(exercise, Exercise):
                    result.problems.append(f"the teacher's check cell {meta['grade_id']!r} names no known exercise")
                    continue
                points = float(meta.get("points", 1))
                stubs = [_blank(text) for text in own]  # each own cell's stub functions (empty: not blank)
                blank = bool(own) and all(stubs) and match.group(2) in set().union(*stubs)
                if unreadable:
                    grade = not_graded(exercise, points, unreadable[0])
                elif refused:
                    grade = refused_grade(exercise, points, refused)
                elif blank:  # handed in as handed out: nothing to run
                    grade = blank_grade(exercise, points)
                else:
                    grade = grade_exercise(
                        exercise,
                        match.group(2),
                        setup + answers,
                        points,
                        submission_secret(secret, student, own),
                        cell_timeout,
                        server=box.server(),
                        deadline=deadline,
                    )
                for name in grade.tampered:
                    message = f"the answer cells replaced {name}"
                    if message not in result.problems:
                        result.problems.append(message)
                if grade.fused:
                    result.problems.append(f"{exercise.name}: ran the fused kernel(s) {', '.join(grade.fused)}")
                result.problems.extend(p for p in grade.problems if p not in result.problems)
                stopped = [text for ok, text in grade.cases if not ok and "time limit" in text]
                if stopped:
                    result.problems.append(
                        f"{exercise.name}: stopped at the time limit of {cell_timeout:g} s "
                        f"({stopped[0].split(': ')[0]})"
                    )
                result.exercises.append((meta["grade_id"], grade))
                refused, own, unreadable = [], [], []
    finally:
        if sandbox is None:
            box.close()
    return result
