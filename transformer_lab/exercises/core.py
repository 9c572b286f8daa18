"""The exercise machinery every chapter uses: `check()`, `hint(step)`, `solution()`, `grade()`.

An `Exercise` runs the learner's function on several `Case`s (edge cases included), compares
each result with the exercise's reference solution, and says plainly what is wrong: a wrong
shape and which, wrong values and where, NaN, an input changed in place, an exception, or
"not done yet". The rules a learner can rely on (docs/exercises.md has the whole pattern):

- `check()` only prints: it never raises, whatever the learner's code does (`sys.exit()`, a
  tensor on another device, a complex tensor, a generator, an endless recursion...), so "Run All"
  goes on past a blank or wrong answer. `grade()` raises AssertionError, for nbgrader.
- A check never changes the random state of the notebook: torch's, Python's `random` and numpy's
  global generators are the same after a check as before it, so later cells print the same numbers
  however often a check cell is run.
- A candidate that only calls the finished version of what the exercise asks to build (the
  library's own function, the exercise's reference, or a torch function such as
  `F.scaled_dot_product_attention`) gets a friendly "build it from the pieces" and no credit.
  That is seen while the candidate runs, not by reading its source: a `TorchFunctionMode` sees
  every torch function by its name whatever the spelling (`torch.softmax`, `F.softmax`,
  `x.softmax(-1)`, an alias, `getattr`), and a profile hook sees a call into a forbidden Python
  function by its code object, whatever name it was reached by.
- A "predict" exercise never prints the expected value before the learner got it right.
- Hints come in steps: `hint()` is a first nudge, `hint(2)`, `hint(3)` say more, the last stops
  one step short of the answer; `solution()` prints working code built from primitives.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import pathlib
import random
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lab.exercises import sealed
from transformer_lab.i18n import get_language
from transformer_lab.i18n import message as _m
from transformer_lab.i18n import text as _t

__all__ = ["Case", "Exercise", "Mistake", "CheckResult", "compare", "LEVELS", "KINDS"]

LEVELS = ("easy", "medium", "harder")
KINDS = ("build", "debug", "predict", "transfer")
KIND_TITLES = {
    "build": "build",
    "debug": "debug the notes",
    "predict": "predict",
    "transfer": "transfer",
}
# a "debug" exercise whose mistake is in code its chapter gives (the notes have none on the subject) says so
OTHER_KIND_TITLES = {"debug": ("debug the code",)}
NOT_DONE = "not done yet"
HIDDEN_MODES = ("noise", "scale", "same")


@dataclass
class Case:
    """One input to try.

    Args:
        name: what the case is about, shown to the learner ("a fully masked row").
        inputs: a function returning the positional arguments (called afresh for the learner's
            function and for the reference, so neither sees the other's in-place changes).
        raises: the exception type the function must raise on these inputs, if any.
        atol, rtol: tolerances for comparing floating-point results.
        hidden: how a graded class's hidden case moves this case's floating-point inputs, so that it keeps
            the property the case tests: "noise" (the default: add noise; an all-zero tensor stays zero and
            a constant one constant), "scale" (multiply each tensor by one positive factor: zero rows stay
            zero, constant rows constant, a -inf mask stays a mask) or "same" (the visible inputs).
    """

    name: str
    inputs: Callable[[], tuple[Any, ...]]
    raises: type[BaseException] | None = None
    atol: float = 1e-5
    rtol: float = 1e-4
    hidden: str = "noise"

    def __post_init__(self) -> None:
        if self.hidden not in HIDDEN_MODES:
            raise ValueError(f"hidden: expected one of {HIDDEN_MODES}, got {self.hidden!r}")


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer, and what it shows the learner misunderstood.

    Args:
        answer: a function that makes the mistake (same signature as the exercise's).
        says: one or two sentences naming the misconception by its symptom ("the maximum is taken over the
            whole tensor, not over each row"), never the answer itself. Shown when a learner's wrong result
            equals this answer's result on the same inputs.
    """

    answer: Callable[..., Any]
    says: str

    def __post_init__(self) -> None:
        if not callable(self.answer):
            raise TypeError(f"answer: expected the wrong answer as a function, got {type(self.answer).__name__}")
        if not isinstance(self.says, str) or not self.says.strip():
            raise TypeError("says: expected a sentence naming the misconception")


@dataclass
class CheckResult:
    """What `Exercise.run` found: one line per case, and whether all passed."""

    exercise: str
    n_cases: int = 0
    lines: list[tuple[bool, str]] = field(default_factory=list)
    not_done: bool = False
    shortcut: str | None = None
    right_why: str | None = None
    mistakes_seen: list[int] = field(default_factory=list)  # known mistakes recognised so far, in order

    @property
    def passed(self) -> bool:
        return bool(self.lines) and all(ok for ok, _ in self.lines) and not self.not_done and not self.shortcut

    @property
    def n_passed(self) -> int:
        return 0 if (self.not_done or self.shortcut) else sum(ok for ok, _ in self.lines)

    def report(self) -> str:
        total = self.n_cases or len(self.lines)
        if self.not_done:
            return _m("check.not_done", exercise=self.exercise, total=total)
        out = [_m("check.summary", exercise=self.exercise, passed=self.n_passed, total=total)]
        out += [f"  {'✓' if ok else '✗'} {text}" for ok, text in self.lines]
        if self.shortcut:
            out.append(_m("check.shortcut", shortcut=self.shortcut))
        elif self.passed:
            out.append(_m("check.all_correct"))
            if self.right_why:
                out.append(_t(self.right_why))
        else:
            out.append(_m("check.not_there"))
        return "\n".join(out)


# a name that ends in Chinese (or a full-width mark) takes no space before the Chinese word after it
_ENDS_IN_CHINESE = re.compile(r"[\u2018-\u201d\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]$")


def compare(got: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4, name: str | None = None) -> str | None:
    """Return None if `got` matches `expected`, else a sentence saying what differs and where; `name` is what it
    calls `got` ("output" by default, 你的输出 in Chinese)."""
    name = _m("compare.output") if name is None else name
    problem = _compare(got, expected, atol, rtol, name)
    chinese_name = get_language() == "zh" and _ENDS_IN_CHINESE.search(name)
    if problem is not None and chinese_name and problem.startswith(name + " "):
        problem = name + problem[len(name) + 1 :]  # 你算出的损失是 0.5; 你返回的 k 是 0.5 keeps its space
    return problem


def _compare(got: Any, expected: Any, atol: float, rtol: float, name: str) -> str | None:
    if isinstance(expected, Tensor):
        return _compare_tensors(got, expected, atol, rtol, name)
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return _m(
                "compare.sequence_type", name=name, kind=type(expected).__name__, n=len(expected), got=_type_name(got)
            )
        if len(got) != len(expected):
            return _m("compare.sequence_length", name=name, n=len(expected), got=len(got))
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e, atol, rtol, f"{name}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return _m("compare.dict_type", name=name, got=_type_name(got))
        if set(got) != set(expected):
            return _m("compare.dict_keys", name=name, expected=sorted(expected), got=sorted(map(str, got)))
        for key in expected:
            problem = compare(got[key], expected[key], atol, rtol, f"{name}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(expected, float) and not isinstance(got, bool):
        if isinstance(got, Tensor) and got.numel() == 1 and not got.is_complex():
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return _m("compare.number_type", name=name, got=_type_name(got))
        if math.isnan(got) and not math.isnan(expected):
            return _m("compare.number_nan", name=name, expected=f"{expected:.6g}")
        if not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return _m("compare.number_value", name=name, got=f"{got:.6g}", expected=f"{expected:.6g}")
        return None
    if isinstance(got, Tensor) and got.numel() != 1:
        return _m("compare.type", name=name, kind=type(expected).__name__, got=_type_name(got))
    if isinstance(expected, bool) != isinstance(got, bool) and not isinstance(got, Tensor):
        return _m("compare.type", name=name, kind=type(expected).__name__, got=_type_name(got))
    if isinstance(expected, (int, str)) and not isinstance(got, (int, str, float, Tensor)):
        return _m("compare.type", name=name, kind=type(expected).__name__, got=_type_name(got))
    try:
        equal = bool(got == expected)
    except Exception:  # an exotic object whose == misbehaves is simply not equal
        equal = False
    if not equal:
        return _m("compare.value", name=name, got=_short_repr(got), expected=repr(expected))
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, Tensor):
        return _m("compare.tensor_shape_of", shape=tuple(value.shape))
    return type(value).__name__


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _compare_tensors(got: Any, expected: Tensor, atol: float, rtol: float, name: str) -> str | None:
    if not isinstance(got, Tensor):
        return _m("compare.tensor_type", name=name, got=_type_name(got))
    if got.device != expected.device:
        return _m("compare.tensor_device", name=name, got=got.device, expected=expected.device)
    if tuple(got.shape) != tuple(expected.shape):
        return _m("compare.tensor_shape", name=name, expected=tuple(expected.shape), got=tuple(got.shape))
    if got.is_complex() and not expected.is_complex():
        return _m("compare.tensor_complex", name=name, got=got.dtype, expected=expected.dtype)
    if expected.dtype == torch.bool or got.dtype == torch.bool:
        if got.dtype != expected.dtype:
            return _m("compare.tensor_dtype", name=name, expected=expected.dtype, got=got.dtype)
        wrong = (got != expected).nonzero()
        if len(wrong):
            where = tuple(wrong[0].tolist())
            return _m(
                "compare.tensor_bool_values",
                name=name,
                wrong=len(wrong),
                total=got.numel(),
                where=where,
                expected=expected[where].item(),
                got=got[where].item(),
            )
        return None
    got_f, expected_f = got.detach().to(torch.float64), expected.detach().to(torch.float64)
    nan = torch.isnan(got_f) & ~torch.isnan(expected_f)
    if nan.any():
        where = tuple(nan.nonzero()[0].tolist())
        return _m("compare.tensor_nan", name=name, count=int(nan.sum()), where=where)
    close = torch.isclose(got_f, expected_f, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        # only the positions that differ: equal infinities are close, and inf - inf (NaN) must not be picked
        if got_f.dim() == 0:  # one number: no positions or index to name
            return _m("compare.number_value", name=name, got=f"{got_f.item():.6g}", expected=f"{expected_f.item():.6g}")
        diff = torch.where(close, torch.zeros_like(got_f), (got_f - expected_f).abs().nan_to_num(nan=math.inf))
        where = tuple((diff == diff.max()).nonzero()[0].tolist())
        return _m(
            "compare.tensor_values",
            name=name,
            wrong=int((~close).sum()),
            total=got.numel(),
            where=where,
            expected=f"{expected_f[where].item():.6g}",
            got=f"{got_f[where].item():.6g}",
        )
    return None


def _snapshot(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {key: _snapshot(v) for key, v in value.items()}
    return None


def _changed(before: Any, after: Any) -> bool:
    if isinstance(before, Tensor):
        if not isinstance(after, Tensor):
            return True
        return not (before.shape == after.shape and torch.equal(before.nan_to_num(), after.detach().nan_to_num()))
    if isinstance(before, (tuple, list)):
        return any(_changed(b, a) for b, a in zip(before, after, strict=False))
    if isinstance(before, dict):
        return any(_changed(b, after.get(key)) for key, b in before.items() if isinstance(after, dict))
    return False


# ------------------------------------------------------------------ seeing shortcuts while they run


def _describe(obj: Any) -> str:
    module = getattr(obj, "__module__", "") or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    if module.startswith("transformer_lab"):
        return f"`tl.{name}`" if "." not in name else f"`{module}.{name}`"
    return f"`{module}.{name}`" if module else f"`{name}`"


def _code_objects(obj: Any) -> dict[Any, str]:
    """The code objects a call into `obj` runs first: a function's own, or a class's methods'."""
    found: dict[Any, str] = {}
    if isinstance(obj, type):
        for value in vars(obj).values():
            function = getattr(value, "__func__", value)
            code = getattr(function, "__code__", None)
            if code is not None:
                found[code] = _describe(obj)
        return found
    function = getattr(obj, "__func__", obj)
    function = inspect.unwrap(function) if callable(function) else function
    code = getattr(function, "__code__", None)
    if code is not None:
        found[code] = _describe(obj)
    return found


class _Shown:
    """A name for a forbidden function, said in the language in use when it is shown."""

    def __init__(self, key: str, **fields: Any) -> None:
        self.key, self.fields = key, fields

    def __str__(self) -> str:
        return _m(self.key, **self.fields)


class _Codes:
    """Code objects compared by identity (equal code objects are still different functions)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, str]] = {}

    def add(self, code: Any, shown: Any) -> None:
        self._by_id[id(code)] = (code, shown)  # keeps the code object alive, so its id stays unique

    def get(self, code: Any) -> str | None:
        entry = self._by_id.get(id(code))
        return entry[1] if entry is not None and entry[0] is code else None

    def __bool__(self) -> bool:
        return bool(self._by_id)


class _TorchWatch(TorchFunctionMode):
    """Notes every torch function called whose name is in `names` (whatever its spelling)."""

    def __init__(self, names: Mapping[str, str], seen: list[str]) -> None:
        super().__init__()
        self.names = names
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        name = name.split(".", 1)[0]  # an aten operator's overload, `_softmax.default`, is `_softmax`
        if name in self.names:
            self.seen.append(self.names[name])
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _watch(torch_names: Mapping[str, str], codes: _Codes) -> Iterator[list[str]]:
    """Run a block while watching for forbidden torch functions and Python functions; yield what was seen."""
    seen: list[str] = []
    previous = sys.getprofile()

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call":
            shown = codes.get(frame.f_code)
            if shown is not None:
                seen.append(shown)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile if codes else previous)
    try:
        if torch_names:
            with _TorchWatch(torch_names, seen):
                yield seen
        else:
            yield seen
    finally:
        sys.setprofile(previous)


@contextlib.contextmanager
def _same_random_state() -> Iterator[None]:
    """Restore torch's, Python's and numpy's global random state (and torch's default dtype) on exit."""
    python_state = random.getstate()
    numpy_state = None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy_state = numpy.random.get_state()
    dtype = torch.get_default_dtype()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)
        torch.set_default_dtype(dtype)


class _Stop(Exception):
    """A BaseException of the learner's code (sys.exit(), KeyboardInterrupt) turned into an ordinary one."""


# ------------------------------------------------------------------ the exercise


class Exercise:
    """One exercise of a chapter.

    Args:
        name: the function the learner writes, e.g. "softmax_rows".
        reference: the exercise's own solution, same signature as the learner's function, built
            from primitives (it is what `solution()` prints).
        cases: inputs to try, easy first, edge cases last.
        hints: the hints in steps, a first nudge first; the last stops one step short of the answer.
        level: "easy", "medium" or "harder".
        kind: "build", "debug" (debug the notes), "predict" or "transfer".
        kind_title: the heading's name for the kind when it is not `KIND_TITLES[kind]`, one of
            `OTHER_KIND_TITLES[kind]` ("debug the code": the mistake is in code the chapter gives, not in the notes).
        run: how to call a candidate on a case's inputs (default `candidate(*inputs)`); an
            exercise about a class can build it, copy weights, and call it here.
        wrong: known-wrong solutions, used by the tests to prove `check()` rejects them.
        mistakes: typical wrong answers with what each shows the learner misunderstood (`Mistake`): a wrong
            result equal to one of theirs gets that sentence added to what the check says (and to a graded
            class's feedback). Their answers count as known-wrong solutions too.
        forbidden: the finished versions of what the exercise asks to build. A string is the
            name of a torch function (`"softmax"` catches `torch.softmax`, `F.softmax`,
            `x.softmax`, `torch.special.softmax`); a function or class is caught by its code,
            whatever name it is called by. The reference is always forbidden.
        why: printed once the answer is right (the point of a "predict" exercise, say).
        explain: for a "predict" exercise, what to say about a known wrong answer (keyed by the
            answer); the expected value itself is never printed before the learner got it right.
        shortcuts: answers that only call the finished version by some spelling (an alias, the
            method form, `getattr`, the library's function): the tests prove each gets no credit.
        output_names: where `run` hands the check a tuple made from what the learner returned (the output and
            its dtype, say), what to call each part in a message ("your output", "your output's dtype"), so that
            a message never names the check's own tuple (`output[1]`).
    """

    def __init__(
        self,
        name: str,
        reference: Callable[..., Any],
        cases: Sequence[Case],
        hints: Sequence[str],
        *,
        level: str,
        kind: str,
        kind_title: str | None = None,
        run: Callable[..., Any] | None = None,
        wrong: Sequence[Callable[..., Any]] = (),
        mistakes: Sequence[Mistake] = (),
        forbidden: Sequence[Any] = (),
        why: str | None = None,
        explain: Mapping[Hashable, str] | None = None,
        shortcuts: Sequence[Callable[..., Any]] = (),
        output_names: Sequence[str] | None = None,
    ) -> None:
        if not cases:
            raise ValueError("cases: an exercise needs at least one case")
        if isinstance(hints, str) or not hints or not all(isinstance(h, str) and h.strip() for h in hints):
            raise TypeError("hints: expected a list of hint texts in steps, e.g. ['a nudge', 'more', 'almost there']")
        if level not in LEVELS:
            raise ValueError(f"level: expected one of {LEVELS}, got {level!r}")
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        if kind_title is not None and kind_title not in OTHER_KIND_TITLES.get(kind, ()):
            raise ValueError(
                f"kind_title: expected None or one of {OTHER_KIND_TITLES.get(kind, ())} for kind {kind!r}, "
                f"got {kind_title!r}"
            )
        self.name = name
        self.reference = reference
        self.cases = list(cases)
        self.hints = [textwrap.dedent(h).strip() for h in hints]
        self.level = level
        self.kind = kind
        self.kind_title = kind_title or KIND_TITLES[kind]  # what the exercise's heading calls its kind
        self._run = run or (lambda candidate, *inputs: candidate(*inputs))
        self.mistakes = list(mistakes)
        if not all(isinstance(m, Mistake) for m in self.mistakes):
            raise TypeError("mistakes: expected a list of Mistake(answer, says)")
        self.wrong = list(wrong) + [m.answer for m in self.mistakes if m.answer not in wrong]
        self.forbidden = list(forbidden)
        self.why = textwrap.dedent(why).strip() if why else None
        self.explain = dict(explain or {})
        self.shortcuts = list(shortcuts)
        self.output_names = list(output_names) if output_names is not None else None
        self._torch_names: dict[str, str] = {}
        self._codes = _Codes()
        self._codes.add(reference.__code__, _Shown("shown.reference", name=name))
        for item in self.forbidden:
            if isinstance(item, str):
                shown = _Shown("shown.torch", name=item)
                for variant in (item, f"special_{item}", f"native_{item}"):
                    self._torch_names[variant] = shown
            else:
                for code, shown in _code_objects(item).items():
                    self._codes.add(code, shown)

    # -- running a candidate ----------------------------------------------------------------------

    def run(self, candidate: Callable[..., Any]) -> CheckResult:
        """Try `candidate` on every case; never raises; leaves the global random state as it was."""
        result = CheckResult(self.name, n_cases=len(self.cases))
        if not callable(candidate):
            result.lines.append((False, _m("run.not_a_function", got=_type_name(candidate))))
            return result
        said: set[str] = set()  # what a common error usually means is said once per check
        with _same_random_state():
            for index, case in enumerate(self.cases):
                try:
                    problem = self._run_case(candidate, case, result, index)
                except Exception as exc:  # a failure of the comparison itself on an exotic result
                    problem = _m("run.not_compared", error=f"{type(exc).__name__}: {exc}")
                if result.not_done:
                    result.lines.clear()
                    break  # the same message for every case would be noise
                if result.shortcut:
                    result.lines = [(False, _m("check.case_problem", case=_t(case.name), problem=problem))]
                    break  # no credit for any case: one line says why
                shown = _t(case.name)
                problem = _once(problem, said)
                text = shown if problem is None else _m("check.case_problem", case=shown, problem=problem)
                result.lines.append((problem is None, text))
        if inspect.isclass(candidate) and not result.passed and not result.not_done and not result.shortcut:
            # Calling a class builds an object of it: every case failed for that one reason, which its lines
            # ("should be a torch.Tensor, got softmax_rows") do not say. A class that does build the answer
            # (a subclass of the layer asked for, say) passes above and is left alone.
            result.lines = [(False, _m("run.a_class", exercise=self.name, got=candidate.__name__))]
        if result.passed and self.why:
            result.right_why = self.why
        elif not result.passed:
            result.right_why = None
        return result

    def _call_watched(self, candidate: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[Any, list[str]]:
        with _watch(self._torch_names, self._codes) as seen:
            try:
                with contextlib.nullcontext() if _needs_grad(inputs) else torch.no_grad():
                    got = self._run(candidate, *inputs)
            except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
                raise _Stop(f"{type(exc).__name__}({exc})") from None
        return got, seen

    def _run_case(self, candidate: Callable[..., Any], case: Case, result: CheckResult, index: int = 0) -> str | None:
        inputs = case.inputs()
        before = _snapshot(inputs)
        try:
            got, seen = self._call_watched(candidate, inputs)
        except NotImplementedError:
            result.not_done = True
            return NOT_DONE
        except _Stop as exc:
            return _m("run.stopped", error=exc)
        except RecursionError:
            return _m("run.recursion")
        except Exception as exc:  # the learner's code may raise anything: report it, never re-raise
            if case.raises is not None and isinstance(exc, case.raises):
                return None
            return _m("run.raised", error=describe_error(exc))
        if seen:
            result.shortcut = str(seen[0])
            return _m("run.calls", shortcut=result.shortcut)
        if case.raises is not None:
            return _m("run.should_raise", error=case.raises.__name__)
        if _changed(before, inputs):
            return _m("run.changed_input")
        stored = _stored_answers().get(self._key)
        if stored is not None:  # a student version without the references (exercises/answers.py)
            expected = stored[index]
            if sealed.is_sealed(expected):  # a predict answer, stored as a salted hash
                text = sealed.opened(got, expected)
                if text is None:
                    return self._explain_wrong(got)
                why = _stored_answers().get(f"{self._key}.why")
                texts = sealed.unlock(why, text, expected["salt"]) if why is not None else None
                if texts:
                    result.right_why = texts.get(get_language()) or texts.get("en")
                return None
        else:
            expected = self._run(self.reference, *case.inputs())
        problem = self.compare(got, expected, case)
        if problem is not None and self.kind == "predict":
            return self._explain_wrong(got)
        if problem is not None:
            why = self.recognise(got, case.inputs, case.atol, case.rtol, result.mistakes_seen)
            if why:
                problem = _m("run.mistake", problem=problem, why=why)
        return problem

    def _explain_wrong(self, got: Any) -> str:
        """A wrong prediction: say why if it is a known one, never what the right answer is."""
        key: Any = got
        if isinstance(got, list):
            key = tuple(got)
        if isinstance(got, torch.Size):
            key = tuple(got)
        try:
            why = self.explain.get(key)
        except TypeError:  # unhashable
            why = None
        if why:
            return _m("run.not_right_because", why=_t(textwrap.dedent(why).strip()))
        return _m("run.not_right")

    # -- what a notebook calls --------------------------------------------------------------------

    def check(self, candidate: Callable[..., Any]) -> None:
        """Print what is right and what is wrong with `candidate`. Never raises."""
        try:
            text = self.run(candidate).report()
        except BaseException as exc:  # noqa: BLE001 - a check must never stop the learner's notebook
            text = _m("check.checker_failed", exercise=self.name, error=f"{type(exc).__name__}: {exc}")
        print(text)

    def blank_report(self) -> str:
        """What `check()` prints for a blank answer (the learner edition's stored output)."""
        return CheckResult(self.name, n_cases=len(self.cases), not_done=True).report()

    def passing_report(self) -> str:
        """What `check()` prints for an answer that passes every case (the source edition's stored output),
        computed without running anything."""
        lines = [(True, _t(case.name)) for case in self.cases]
        return CheckResult(self.name, n_cases=len(self.cases), lines=lines, right_why=self.why).report()

    def texts(self) -> list[str]:
        """Every text of this exercise a learner can be shown, in English: the catalogue's keys."""
        found = [case.name for case in self.cases] + list(self.hints)
        found += [self.why] if self.why else []
        found += [textwrap.dedent(why).strip() for why in self.explain.values() if why]
        found += [textwrap.dedent(m.says).strip() for m in self.mistakes]
        found += list(self.output_names or [])
        return list(dict.fromkeys(found))

    def compare(self, got: Any, expected: Any, case: Case) -> str | None:
        """`compare` with this exercise's tolerances for `case` and the names of what the learner returned."""
        names = self.output_names
        if names and isinstance(expected, tuple) and isinstance(got, (tuple, list)) and len(names) == len(expected):
            if len(got) != len(expected):
                return _m("compare.sequence_length", name=_m("compare.output"), n=len(expected), got=len(got))
            for part, (g, e) in zip(names, zip(got, expected, strict=True), strict=True):
                problem = compare(g, e, case.atol, case.rtol, _t(part))
                if problem:
                    return problem
            return None
        return compare(got, expected, case.atol, case.rtol)

    def recognise(
        self,
        got: Any,
        inputs: Callable[[], tuple[Any, ...]],
        atol: float,
        rtol: float,
        seen: list[int] | None = None,
    ) -> str | None:
        """What a wrong result shows the learner misunderstood: the `says` of a known mistake whose answer gives the
        same result on the same inputs (`inputs()` makes them afresh), in the language in use; None if no known
        mistake gives it. Where several give it (two mistakes can agree on a small case, as a 1 x 1 mask), one that an
        earlier case of the same check already recognised comes first: `seen` holds their indices in
        `self.mistakes`, and the one recognised here is added to it."""
        order = list(range(len(self.mistakes)))
        if seen:
            order = [i for i in seen if i < len(order)] + [i for i in order if i not in seen]
        for i in order:
            mistake = self.mistakes[i]
            try:
                with _same_random_state(), torch.no_grad():
                    theirs = self._run(mistake.answer, *inputs())
                same = compare(got, _plain_result(theirs), atol, rtol) is None
            except Exception:  # a mistake that fails on these inputs says nothing about them
                continue
            if same:
                if seen is not None and i not in seen:
                    seen.append(i)
                return _t(textwrap.dedent(mistake.says).strip())
        return None

    def passes(self, candidate: Callable[..., Any]) -> bool:
        return self.run(candidate).passed

    def grade(self, candidate: Callable[..., Any]) -> None:
        """Raise AssertionError with the report unless every case passes (for nbgrader's hidden tests)."""
        result = self.run(candidate)
        assert result.passed, result.report()

    def hint(self, step: int = 1) -> None:
        """Print hint number `step` (1 = a first nudge; the last one stops one step short of the answer)."""
        n = len(self.hints)
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= n:
            print(_m("hint.range", exercise=self.name, n=n))
            return
        print(self.hint_text(step))

    def hint_text(self, step: int = 1) -> str:
        """What `hint(step)` prints, in the current language."""
        n = len(self.hints)
        text = _m("hint.header", step=step, n=n, exercise=self.name) + "\n" + _t(self.hints[step - 1])
        if step < n:
            text += "\n" + _m("hint.more", exercise=self.name, next=step + 1)
        else:
            text += "\n" + _m("hint.last", exercise=self.name)
        return text

    def solution(self) -> None:
        """Print a working answer: the reference's source, under the learner's function name."""
        print(self.solution_source())

    @property
    def _key(self) -> str:
        return f"{self.reference.__module__.rsplit('.', 1)[-1]}.{self.name}"

    def solution_source(self) -> str:
        if _stored_answers():
            return _m("solution.withheld", exercise=self.name, n=len(self.hints))
        source = textwrap.dedent(inspect.getsource(self.reference))
        source = re.sub(r"^def \w+\(", f"def {self.name}(", source, count=1, flags=re.M)
        if self.why:
            source += "\n" + _m("solution.why") + _t(self.why).replace("\n", "\n# ")
        return source

    def reference_copy(self) -> Callable[..., Any]:
        """The reference as a new function (its own code object), which is not a shortcut: what an answer
        that does the same work looks like to the checker. The tests use it."""
        reference = self.reference
        code = reference.__code__.replace()  # an equal but distinct code object
        if code is reference.__code__:  # pragma: no cover - CPython always makes a new one
            raise RuntimeError("could not copy the reference's code")
        copy = type(reference)(
            code, reference.__globals__, reference.__name__, reference.__defaults__, reference.__closure__
        )
        copy.__kwdefaults__ = reference.__kwdefaults__
        return copy

    @property
    def title(self) -> str:
        """ "medium, predict" as in the notebook's heading."""
        return f"{self.level}, {self.kind_title}"

    def __repr__(self) -> str:
        return f"Exercise({self.name!r}, {self.level}, {self.kind}, {len(self.cases)} cases)"


_STORED: dict[str, Any] | None = None


def _stored_answers() -> dict[str, Any]:
    """The expected results a student version without references stores beside this file ({} otherwise)."""
    global _STORED
    if _STORED is None:
        path = pathlib.Path(__file__).with_name("expected.pt")
        _STORED = torch.load(path, weights_only=True) if path.exists() else {}
    return _STORED


#: common PyTorch errors, by their message, and what they usually mean (in the language in use)
ERROR_MEANINGS = (
    (re.compile(r"shapes cannot be multiplied|size mismatch, got"), lambda: _m("error.matmul")),
    (re.compile(r"must match the size of tensor b .* at non-singleton dimension"), lambda: _m("error.broadcast")),
    (re.compile(r"Expected all tensors to be on the same device"), lambda: _m("error.device")),
    (
        re.compile(r"expected (m1 and m2 to have the same dtype|scalar type)|found dtype|have the same dtype"),
        lambda: _m("error.dtype"),
    ),
    (re.compile(r"view size is not compatible with input tensor's size and stride"), lambda: _m("error.view")),
    (re.compile(r"shape '\[.*\]' is invalid for input of size"), lambda: _m("error.reshape")),
    (re.compile(r"Dimension out of range"), lambda: _m("error.dim")),
    (re.compile(r"modified by an inplace operation"), lambda: _m("error.inplace")),
    (re.compile(r"does not require grad and does not have a grad_fn"), lambda: _m("error.grad")),
)
_PACKAGE_DIRS = tuple(
    str(pathlib.Path(m.__file__).resolve().parent)
    for m in (torch, sys.modules[__name__.rsplit(".", 2)[0]])
    if getattr(m, "__file__", None)
)


def _learner_line(exc: BaseException) -> tuple[int, str] | None:
    """The line of the learner's own code where `exc` was raised (the last frame outside torch, this package and
    the standard library), as (line number, source); None if there is none or its source is unknown."""
    import linecache

    found = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        resolved = filename if filename.startswith("<") else str(pathlib.Path(filename).resolve())
        if resolved.startswith((*_PACKAGE_DIRS, sys.prefix, sys.base_prefix)):
            continue
        line = linecache.getline(filename, lineno, frame.f_globals).strip()
        if line:
            found = (lineno, line)
    return found


def _once(problem: str | None, said: set[str]) -> str | None:
    """`problem` without the meaning of a common error already said in an earlier line of the same check."""
    if problem is None:
        return None
    for _, said_as in ERROR_MEANINGS:
        meaning = said_as()
        if meaning in problem:
            if meaning in said:
                problem = problem.replace(" " + meaning, "")
            said.add(meaning)
    return problem


def describe_error(exc: BaseException) -> str:
    """An error raised in a learner's code, for a learner: its type and message, the learner's own line where it
    was raised, and, for a common PyTorch error, one sentence of what it usually means."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 400:
        text = text[:397] + "..."
    where = _learner_line(exc)
    if where is not None:
        text += " " + _m("run.error_line", line=where[0], code=where[1][:120])
    message = str(exc)
    for pattern, said_as in ERROR_MEANINGS:
        if pattern.search(message):
            text += " " + said_as()
            break
    return text


def _plain_result(value: Any) -> Any:
    """A result as the comparison reads it and a student version stores it: tensors detached and copied to the
    CPU, a torch.Size a tuple, sequences and dicts of them."""
    if isinstance(value, Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, tuple):
        return tuple(_plain_result(v) for v in value)
    if isinstance(value, list):
        return [_plain_result(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_result(v) for k, v in value.items()}
    return value


def _needs_grad(inputs: tuple[Any, ...]) -> bool:
    return any(isinstance(x, Tensor) and x.requires_grad for x in inputs)
