"""The exercise machinery (exercises/core.py) and every exercise of every chapter.

The generic tests are parametrized over `tl.exercises.all_exercises()`, so a chapter that adds
exercises is tested here without touching this file: each checker must accept its reference
solution, reject each of its known-wrong solutions, say "not implemented yet" for a blank answer,
and never raise from check() whatever the learner's function does.
"""

from __future__ import annotations

import functools
import importlib
import random
import re
import sys

import numpy as np
import pytest
import torch

import transformer_lab as tl
from transformer_lab.exercises import Case, Exercise, all_exercises, compare
from transformer_lab.exercises.core import KINDS, LEVELS

EXERCISES = all_exercises()
IDS = sorted(EXERCISES)


def test_there_are_exercises() -> None:
    assert len(EXERCISES) >= 1


CHAPTER_MODULE = re.compile(r"ch(0[1-9]|1[0-9])_")


def test_each_chapter_has_at_least_four_exercises_of_three_kinds() -> None:
    """Chapters 01 on: >= 4 exercises each, of >= 3 kinds (NOTEBOOKS.md); chapter 00 has a single warm-up."""
    import pkgutil

    import transformer_lab.exercises as package

    modules = [info.name for info in pkgutil.iter_modules(package.__path__) if CHAPTER_MODULE.match(info.name)]
    assert modules, "no chapter exercise module found"
    for module in modules:
        mine = [ex for name, ex in EXERCISES.items() if name.startswith(module + ".")]
        assert len(mine) >= 4, f"{module} has {len(mine)} exercises, the course asks for at least 4"
        kinds = {ex.kind for ex in mine}
        assert len(kinds) >= 3, f"{module} has exercises of {len(kinds)} kinds ({sorted(kinds)}), at least 3 needed"


def test_enough_exercises_of_each_kind_in_chapters_01_to_09() -> None:
    mine = [ex for name, ex in EXERCISES.items() if re.match(r"ch0[1-9]_", name)]
    counts = {kind: sum(ex.kind == kind for ex in mine) for kind in KINDS}
    assert len(mine) >= 40, f"chapters 01-09 have {len(mine)} exercises, at least 40 needed"
    for kind, least in {"build": 8, "predict": 8, "transfer": 8, "debug": 6}.items():
        assert counts[kind] >= least, f"{counts[kind]} exercises of kind {kind!r} in chapters 01-09, need {least}"


def _blank(*args: object) -> object:
    raise NotImplementedError()


def _returns_none(*args: object) -> None:
    return None


def _raises(*args: object) -> object:
    raise ZeroDivisionError("a bug in the learner's code")


def _wrong_shape(*args: object) -> torch.Tensor:
    return torch.zeros(7, 1, 3)


def _exits(*args: object) -> object:
    sys.exit(1)


def _interrupts(*args: object) -> object:
    raise KeyboardInterrupt


def _recurses(*args: object) -> object:
    return _recurses(*args)


def _generator(*args: object) -> object:
    yield torch.zeros(1)


def _complex(*args: object) -> torch.Tensor:
    return torch.zeros(2, 2, dtype=torch.complex64)


def _meta_device(*args: object) -> torch.Tensor:
    return torch.zeros(2, 2, device="meta")


def _reseeds(*args: object) -> object:
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)  # noqa: NPY002 - the legacy global generator is what a check must leave alone
    torch.set_default_dtype(torch.float64)
    return None


CANDIDATES = {
    "none": _returns_none,
    "raises": _raises,
    "shape": _wrong_shape,
    "int": 42,
    "exit": _exits,
    "interrupt": _interrupts,
    "recursion": _recurses,
    "generator": _generator,
    "complex": _complex,
    "meta-device": _meta_device,
    "reseeds": _reseeds,
}


def _report(exercise: Exercise, candidate: object, capsys: pytest.CaptureFixture[str]) -> str:
    exercise.check(candidate)  # must not raise
    return capsys.readouterr().out


@pytest.mark.parametrize("name", IDS)
def test_level_and_kind(name: str) -> None:
    exercise = EXERCISES[name]
    assert exercise.level in LEVELS and exercise.kind in KINDS


@pytest.mark.parametrize("name", IDS)
def test_reference_solution_passes(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's work, as an answer of its own (a distinct function), passes every case."""
    exercise = EXERCISES[name]
    answer = exercise.reference_copy()
    result = exercise.run(answer)
    assert result.passed, result.report()
    assert len(result.lines) == len(exercise.cases)
    exercise.grade(answer)
    assert "All correct" in _report(exercise, answer, capsys)


@pytest.mark.parametrize("name", IDS)
def test_calling_the_reference_is_a_shortcut(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    reference = exercise.reference
    alias = getattr(importlib.import_module(reference.__module__), reference.__name__)
    for candidate in (reference, lambda *a: alias(*a), functools.partial(reference)):
        result = exercise.run(candidate)
        assert not result.passed and result.shortcut, result.report()
        assert "Build it from the pieces" in _report(exercise, candidate, capsys)


@pytest.mark.parametrize("name", IDS)
def test_library_shortcuts_get_no_credit(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    if exercise.kind != "predict":
        assert exercise.shortcuts, f"{name}: give at least one shortcut (the finished version called) in shortcuts="
    for shortcut in exercise.shortcuts:
        result = exercise.run(shortcut)
        assert not result.passed and result.shortcut, f"{name}: {shortcut.__name__} got credit:\n{result.report()}"
        out = _report(exercise, shortcut, capsys)
        assert "Build it from the pieces" in out and "All correct" not in out


@pytest.mark.parametrize("name", IDS)
def test_has_known_wrong_solutions_and_rejects_each(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    assert exercise.wrong, f"{name} needs at least one known-wrong solution in wrong="
    for wrong in exercise.wrong:
        result = exercise.run(wrong)
        assert not result.passed, f"{name} accepted the wrong solution {wrong.__name__}"
        assert not result.shortcut, f"{name}: the wrong answer {wrong.__name__} calls a forbidden function"
        with pytest.raises(AssertionError):
            exercise.grade(wrong)
        out = _report(exercise, wrong, capsys)
        assert "✗" in out and "Not there yet" in out


@pytest.mark.parametrize("name", IDS)
def test_blank_answer_says_not_done_yet_with_the_true_number_of_cases(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exercise = EXERCISES[name]
    out = _report(exercise, _blank, capsys)
    assert "not done yet" in out and out.count("not done yet") == 1
    assert f"0 of {len(exercise.cases)} cases" in out
    assert out.strip() == exercise.blank_report()
    with pytest.raises(AssertionError):
        exercise.grade(_blank)


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("candidate", list(CANDIDATES), ids=list(CANDIDATES))
def test_check_never_raises_and_keeps_the_random_state(
    name: str, candidate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exercise = EXERCISES[name]
    function = CANDIDATES[candidate]
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002 - the legacy global generator is what a check must leave alone
    out = _report(exercise, function, capsys)
    after = (torch.rand(3), random.random(), np.random.rand(), torch.get_default_dtype())  # noqa: NPY002
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002 - the legacy global generator is what a check must leave alone
    before = (torch.rand(3), random.random(), np.random.rand(), torch.get_default_dtype())  # noqa: NPY002
    assert torch.equal(after[0], before[0]) and after[1:] == before[1:], "check() changed the global random state"
    assert "✗" in out, out
    assert not exercise.run(function).passed
    with pytest.raises(AssertionError):
        exercise.grade(function)
    if candidate == "raises":
        assert "raised ZeroDivisionError: a bug in the learner's code" in out


@pytest.mark.parametrize("name", IDS)
def test_a_check_cell_run_twice_leaves_later_numbers_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    torch.manual_seed(0)
    first = torch.rand(4)
    torch.manual_seed(0)
    exercise.check(exercise.reference_copy())
    exercise.check(exercise.reference_copy())
    assert torch.equal(torch.rand(4), first)


@pytest.mark.parametrize("name", IDS)
def test_hints_in_steps_and_a_solution(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    assert len(exercise.hints) >= 3, f"{name}: hints in at least three steps (hint(), hint(2), hint(3))"
    for step in range(1, len(exercise.hints) + 1):
        exercise.hint(step)
        header, _, body = capsys.readouterr().out.partition("\n")
        assert header == f"Hint {step} of {len(exercise.hints)} for {exercise.name}:" and body.strip()
    exercise.hint(len(exercise.hints) + 1)  # out of range: a friendly line, no exception
    assert "has hints 1 to" in capsys.readouterr().out
    exercise.solution()
    source = capsys.readouterr().out
    assert source.startswith(f"def {exercise.name}("), source[:200]


@pytest.mark.parametrize("name", IDS)
def test_solution_is_more_than_a_call_into_the_library(name: str) -> None:
    """solution() shows working code from primitives, never only `return tl.something(...)`."""
    import ast
    import inspect
    import textwrap

    exercise = EXERCISES[name]
    tree = ast.parse(textwrap.dedent(inspect.getsource(exercise.reference)))
    function = tree.body[0]
    body = [node for node in function.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call):
        called = body[0].value.func
        target = None
        if isinstance(called, ast.Name):
            target = exercise.reference.__globals__.get(called.id)
        elif isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name):
            owner = exercise.reference.__globals__.get(called.value.id)
            target = getattr(owner, called.attr, None)
        module = getattr(target, "__module__", "") or ""
        assert not (module.startswith("transformer_lab") and not module.startswith("transformer_lab.exercises")), (
            f"{name}: solution() would show only a call into the library ({ast.unparse(body[0])})"
        )


def test_exercise_modules_are_importable_by_notebook_name() -> None:
    for module in {name.split(".")[0] for name in EXERCISES}:
        importlib.import_module(f"transformer_lab.exercises.{module}")


def test_shortcut_spellings_are_all_seen() -> None:
    """A forbidden torch function is seen by any spelling; a forbidden Python function by any name."""
    import torch.nn.functional as F

    def reference(x: torch.Tensor) -> torch.Tensor:
        e = (x - x.max(-1, keepdim=True).values).exp()
        return e / e.sum(-1, keepdim=True)

    exercise = Exercise(
        "softmax_rows",
        reference=reference,
        cases=[Case("a row", lambda: (torch.tensor([[1.0, 2.0, 3.0]]),))],
        hints=["a", "b", "c"],
        level="easy",
        kind="build",
        forbidden=["softmax", tl.scaled_dot_product_attention],
    )
    soft = torch.softmax
    spellings = {
        "torch.softmax": lambda x: torch.softmax(x, -1),
        "F.softmax": lambda x: F.softmax(x, dim=-1),
        "method": lambda x: x.softmax(-1),
        "alias": lambda x: soft(x, -1),
        "getattr": lambda x: getattr(torch, "soft" + "max")(x, -1),
        "special": lambda x: torch.special.softmax(x, -1),
        "nn.Softmax": lambda x: torch.nn.Softmax(dim=-1)(x),
        "library by another name": lambda x: (lambda f: f(x, x, x)[1])(tl.attention.scaled_dot_product_attention),
    }
    for spelling, candidate in spellings.items():
        result = exercise.run(candidate)
        assert result.shortcut and not result.passed, spelling
    assert exercise.run(exercise.reference_copy()).passed


def test_predict_never_prints_the_expected_value(capsys: pytest.CaptureFixture[str]) -> None:
    exercise = Exercise(
        "predict_shape",
        reference=lambda: (2, 8, 5, 4),
        cases=[Case("your prediction", lambda: ())],
        hints=["a", "b", "c"],
        level="easy",
        kind="predict",
        why="B, H, T, d_k.",
        explain={(2, 5, 32): "that is before the split into heads."},
    )
    exercise.check(lambda: (2, 5, 32))
    out = capsys.readouterr().out
    assert "before the split" in out and "(2, 8, 5, 4)" not in out and "8, 5, 4" not in out
    exercise.check(lambda: (1, 2, 3))
    out = capsys.readouterr().out
    assert "not right" in out and "(2, 8, 5, 4)" not in out
    exercise.check(lambda: [2, 8, 5, 4])
    out = capsys.readouterr().out
    assert "All correct" in out and "B, H, T, d_k." in out


# --- compare(): the messages a learner reads ----------------------------------------------------


def test_compare_accepts_equal_values() -> None:
    x = torch.tensor([[1.0, 2.0]])
    assert compare(x.clone(), x) is None
    assert compare((x, 1.5), (x.clone(), 1.5)) is None


def test_compare_wrong_shape_names_both_shapes() -> None:
    message = compare(torch.zeros(2, 3), torch.zeros(3, 2))
    assert message == "output has the wrong shape: expected (3, 2), got (2, 3)"


def test_compare_nan_says_where() -> None:
    got = torch.tensor([[1.0, float("nan")], [0.0, float("nan")]])
    message = compare(got, torch.ones(2, 2))
    assert message is not None
    assert "NaN at 2 positions" in message and "(0, 1)" in message


def test_compare_wrong_values_gives_count_and_largest_error() -> None:
    expected = torch.zeros(2, 3)
    got = expected.clone()
    got[1, 2] = 5.0
    got[0, 0] = 0.5
    message = compare(got, expected)
    assert message is not None
    assert "wrong values at 2 of 6 positions" in message
    assert "index (1, 2)" in message and "expected 0, got 5" in message


def test_compare_a_wrong_scalar_tensor_names_the_two_numbers_not_positions() -> None:
    message = compare(torch.tensor(2.5, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64), name="loss")
    assert message == "loss is 2.5, expected 3"  # not "1 of 1 positions ... at index ()"
    assert compare(torch.tensor([2.5]), torch.tensor([3.0])) is not None  # one element of a vector keeps its index
    assert "index (0,)" in compare(torch.tensor([2.5]), torch.tensor([3.0]))


def test_compare_bool_masks() -> None:
    expected = torch.ones(2, 2, dtype=torch.bool).tril()
    assert compare(expected.float(), expected) == "output should have dtype torch.bool, got torch.float32"
    message = compare(~expected, expected)
    assert message is not None and "wrong at 4 of 4 positions, first at index (0, 0)" in message


def test_compare_types_and_structure() -> None:
    assert compare(None, torch.zeros(1)) == "output should be a torch.Tensor, got NoneType"
    assert compare(torch.zeros(1), (torch.zeros(1), torch.zeros(1))) == (
        "output should be a tuple of 2 items, got a tensor of shape (1,)"
    )
    message = compare((torch.zeros(1), torch.ones(1)), (torch.zeros(1), torch.zeros(1)))
    assert message is not None and message.startswith("output[1] has wrong values")
    assert compare(3.0, 2.0) == "output is 3, expected 2"
    assert compare("a", 2.0) == "output should be a number, got str"


def test_in_place_change_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    exercise = Exercise(
        "double",
        reference=lambda x: x * 2,
        cases=[Case("a vector", lambda: (torch.ones(3),))],
        hints=["multiply by 2", "x * 2", "return x * 2"],
        level="easy",
        kind="build",
    )

    def in_place(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    result = exercise.run(in_place)
    assert not result.passed
    assert "changed its input tensor in place" in result.lines[0][1]


def test_in_place_change_inside_a_dict_is_reported() -> None:
    exercise = Exercise(
        "total",
        reference=lambda d: d["a"].sum(),
        cases=[Case("a dict", lambda: ({"a": torch.ones(3)},))],
        hints=["a", "b", "c"],
        level="easy",
        kind="build",
    )
    result = exercise.run(lambda d: d["a"].add_(1).sum() - 3)
    assert "changed its input tensor in place" in result.lines[0][1]


def test_expected_exception_cases() -> None:
    def reference(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 1:
            raise ValueError("x must be 1-D")
        return x

    exercise = Exercise(
        "one_d",
        reference=reference,
        cases=[Case("1-D", lambda: (torch.ones(2),)), Case("2-D", lambda: (torch.ones(2, 2),), raises=ValueError)],
        hints=["a", "b", "c"],
        level="easy",
        kind="build",
    )
    assert exercise.run(exercise.reference_copy()).passed
    result = exercise.run(lambda x: x)
    assert not result.passed
    assert re.search(r"should raise ValueError", result.lines[1][1])


def test_report_counts_cases() -> None:
    for exercise in EXERCISES.values():
        report = exercise.run(exercise.wrong[0]).report()
        first = report.splitlines()[0]
        assert first.startswith(f"{exercise.name}: ") and f"of {len(exercise.cases)} cases passed" in first


def test_exercise_needs_a_case() -> None:
    with pytest.raises(ValueError, match="at least one case"):
        Exercise("x", reference=lambda: None, cases=[], hints=["a"], level="easy", kind="build")


def test_a_mistake_recognised_on_an_earlier_case_is_preferred_where_two_fit():
    """Chapter 02's exercise 2 read with PyTorch's "blocked" meaning: on its last case (one token alone, a 1 x 1
    mask) that answer gives [[False]], as does a mask in which no query sees itself. The check names the mistake it
    already recognised on the earlier cases, not the other one."""
    import torch

    from transformer_lab.exercises import ch02_masking

    exercise = ch02_masking.causal_mask_for_new_tokens

    def blocked(n_new, n_total):
        position = torch.arange(n_total - n_new, n_total)
        return torch.arange(n_total)[None, :] > position[:, None]

    lines = exercise.run(blocked).lines
    assert len(lines) == len(exercise.cases) and not any(ok for ok, _ in lines)
    says = [text.split("That is what a known mistake gives: ", 1)[-1] for _, text in lines]
    assert len(set(says)) == 1 and "blocked" in says[0], says

    def blind(n_new, n_total):  # no query may see its own position: the strict <, alone it is still named
        position = torch.arange(n_total - n_new, n_total)
        return torch.arange(n_total)[None, :] < position[:, None]

    assert "blocked" not in exercise.run(blind).lines[-1][1]
