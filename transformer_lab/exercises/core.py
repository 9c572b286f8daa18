"""The exercise machinery every chapter uses: `check()`, `grade()`, `hint()`, `solution()`.

An `Exercise` runs the learner's function on several `Case`s (edge cases included), compares
each result with the library's reference solution, and says plainly what is wrong: a wrong
shape and which, wrong values and where, NaN, an input changed in place, an exception, or
"not implemented yet". `check()` only prints, it never raises, so "Run All" goes on past a
blank or wrong answer; `grade()` raises AssertionError, for the hidden tests that nbgrader
uses to give marks.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["Case", "Exercise", "CheckResult", "compare"]


@dataclass
class Case:
    """One input to try.

    Args:
        name: what the case is about, shown to the learner ("a fully masked row").
        inputs: a function returning the positional arguments (called afresh for the learner's
            function and for the reference, so neither sees the other's in-place changes).
        raises: the exception type the function must raise on these inputs, if any.
        atol, rtol: tolerances for comparing floating-point results.
    """

    name: str
    inputs: Callable[[], tuple[Any, ...]]
    raises: type[BaseException] | None = None
    atol: float = 1e-5
    rtol: float = 1e-4


@dataclass
class CheckResult:
    """What `Exercise.run` found: one line per case, and whether all passed."""

    exercise: str
    lines: list[tuple[bool, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.lines) and all(ok for ok, _ in self.lines)

    @property
    def n_passed(self) -> int:
        return sum(ok for ok, _ in self.lines)

    def report(self) -> str:
        out = [f"{self.exercise}: {self.n_passed} of {len(self.lines)} cases passed"]
        out += [f"  {'✓' if ok else '✗'} {text}" for ok, text in self.lines]
        if self.passed:
            out.append("All correct. Well done!")
        else:
            out.append("Not there yet: fix the first ✗ above, or call hint().")
        return "\n".join(out)


def compare(got: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4, name: str = "output") -> str | None:
    """Return None if `got` matches `expected`, else a sentence saying what differs and where."""
    if isinstance(expected, Tensor):
        return _compare_tensors(got, expected, atol, rtol, name)
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return f"{name} should be a {type(expected).__name__} of {len(expected)} items, got {type(got).__name__}"
        if len(got) != len(expected):
            return f"{name} should have {len(expected)} items, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e, atol, rtol, f"{name}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{name} should be a dict, got {type(got).__name__}"
        if set(got) != set(expected):
            return f"{name} should have keys {sorted(expected)}, got {sorted(got)}"
        for key in expected:
            problem = compare(got[key], expected[key], atol, rtol, f"{name}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(expected, float) and not isinstance(got, bool):
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)):
            return f"{name} should be a number, got {type(got).__name__}"
        if math.isnan(got) and not math.isnan(expected):
            return f"{name} is NaN, expected {expected:.6g}"
        if not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return f"{name} is {got:.6g}, expected {expected:.6g}"
        return None
    if got != expected:
        return f"{name} is {got!r}, expected {expected!r}"
    return None


def _compare_tensors(got: Any, expected: Tensor, atol: float, rtol: float, name: str) -> str | None:
    if not isinstance(got, Tensor):
        return f"{name} should be a torch.Tensor, got {type(got).__name__}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{name} has the wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}"
    if expected.dtype == torch.bool or got.dtype == torch.bool:
        if got.dtype != expected.dtype:
            return f"{name} should have dtype {expected.dtype}, got {got.dtype}"
        wrong = (got != expected).nonzero()
        if len(wrong):
            where = tuple(wrong[0].tolist())
            return (
                f"{name} is wrong at {len(wrong)} of {got.numel()} positions, first at index {where}: "
                f"expected {expected[where].item()}, got {got[where].item()}"
            )
        return None
    got_f, expected_f = got.detach().to(torch.float64), expected.detach().to(torch.float64)
    nan = torch.isnan(got_f) & ~torch.isnan(expected_f)
    if nan.any():
        where = tuple(nan.nonzero()[0].tolist())
        return (
            f"{name} contains NaN at {int(nan.sum())} positions (first at index {where}), where a number was expected"
        )
    close = torch.isclose(got_f, expected_f, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        diff = (got_f - expected_f).abs().nan_to_num(nan=math.inf)
        where = tuple((diff == diff.max()).nonzero()[0].tolist())
        return (
            f"{name} has wrong values at {int((~close).sum())} of {got.numel()} positions; the largest error is at "
            f"index {where}: expected {expected_f[where].item():.6g}, got {got_f[where].item():.6g}"
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


class Exercise:
    """One exercise of a chapter.

    Args:
        name: the function the learner writes, e.g. "softmax_rows".
        reference: the library's solution, same signature as the learner's function.
        cases: inputs to try, easy first, edge cases last.
        hint: a nudge, printed by `hint()`.
        run: how to call a candidate on a case's inputs (default `candidate(*inputs)`); an
            exercise about a class can build it, copy weights, and call it here.
        wrong: known-wrong solutions, used by the tests to prove `check()` rejects them.
    """

    def __init__(
        self,
        name: str,
        reference: Callable[..., Any],
        cases: Sequence[Case],
        hint: str,
        run: Callable[..., Any] | None = None,
        wrong: Sequence[Callable[..., Any]] = (),
    ) -> None:
        if not cases:
            raise ValueError("an exercise needs at least one case")
        self.name = name
        self.reference = reference
        self.cases = list(cases)
        self._hint = textwrap.dedent(hint).strip()
        self._run = run or (lambda candidate, *inputs: candidate(*inputs))
        self.wrong = list(wrong)

    def run(self, candidate: Callable[..., Any]) -> CheckResult:
        """Try `candidate` on every case; never raises."""
        result = CheckResult(self.name)
        if not callable(candidate):
            result.lines.append((False, f"expected a function, got {type(candidate).__name__}"))
            return result
        for case in self.cases:
            problem = self._run_case(candidate, case)
            result.lines.append((problem is None, case.name if problem is None else f"{case.name}: {problem}"))
            if problem is not None and problem.startswith("not implemented yet"):
                break  # the same message for every case would be noise
        return result

    def _run_case(self, candidate: Callable[..., Any], case: Case) -> str | None:
        inputs = case.inputs()
        before = _snapshot(inputs)
        try:
            with contextlib.nullcontext() if _needs_grad(inputs) else torch.no_grad():
                got = self._run(candidate, *inputs)
        except NotImplementedError:
            return "not implemented yet (the function still raises NotImplementedError)"
        except Exception as exc:  # the learner's code may raise anything: report it, never re-raise
            if case.raises is not None and isinstance(exc, case.raises):
                return None
            return f"raised {type(exc).__name__}: {exc}"
        if case.raises is not None:
            return f"should raise {case.raises.__name__} for this input, but returned normally"
        if _changed(before, inputs):
            return "changed its input tensor in place; compute a new tensor instead"
        expected = self._run(self.reference, *case.inputs())
        return compare(got, expected, case.atol, case.rtol)

    def check(self, candidate: Callable[..., Any]) -> None:
        """Print what is right and what is wrong with `candidate`. Never raises."""
        try:
            print(self.run(candidate).report())
        except Exception as exc:  # a bug in a checker must not stop the learner's notebook either
            print(f"{self.name}: the checker itself failed ({type(exc).__name__}: {exc}); please report it")

    def passes(self, candidate: Callable[..., Any]) -> bool:
        return self.run(candidate).passed

    def grade(self, candidate: Callable[..., Any]) -> None:
        """Raise AssertionError with the report unless every case passes (for nbgrader's hidden tests)."""
        result = self.run(candidate)
        assert result.passed, result.report()

    def hint(self) -> None:
        print(f"Hint for {self.name}:\n{self._hint}")

    def solution(self) -> None:
        """Print the reference solution's source."""
        print(textwrap.dedent(inspect.getsource(self.reference)))

    def __repr__(self) -> str:
        return f"Exercise({self.name!r}, {len(self.cases)} cases)"


def _needs_grad(inputs: tuple[Any, ...]) -> bool:
    return any(isinstance(x, Tensor) and x.requires_grad for x in inputs)
