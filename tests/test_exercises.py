"""The exercise machinery (exercises/core.py) and every exercise of every chapter.

The generic tests are parametrized over `tl.exercises.all_exercises()`, so a chapter that adds
exercises is tested here without touching this file: each checker must accept its reference
solution, reject each of its known-wrong solutions, say "not implemented yet" for a blank answer,
and never raise from check() whatever the learner's function does.
"""

from __future__ import annotations

import importlib
import re

import pytest
import torch

import transformer_lab as tl
from transformer_lab.exercises import Case, Exercise, all_exercises, compare

EXERCISES = all_exercises()
IDS = sorted(EXERCISES)


def test_there_are_exercises() -> None:
    assert len(EXERCISES) >= 1


def test_each_chapter_module_has_at_least_three_exercises() -> None:
    """Chapters 01-09 each need >= 3 exercises (NOTEBOOKS.md); chapter 00 has a single warm-up."""
    import pkgutil

    import transformer_lab.exercises as package

    modules = [info.name for info in pkgutil.iter_modules(package.__path__) if re.match(r"ch0[1-9]_", info.name)]
    assert modules, "no chapter exercise module found"
    for module in modules:
        count = sum(name.startswith(module + ".") for name in EXERCISES)
        assert count >= 3, f"{module} has {count} exercises, NOTEBOOKS.md asks for at least 3"


def _blank(*args: object) -> object:
    raise NotImplementedError()


def _returns_none(*args: object) -> None:
    return None


def _raises(*args: object) -> object:
    raise ZeroDivisionError("a bug in the learner's code")


def _wrong_shape(*args: object) -> torch.Tensor:
    return torch.zeros(7, 1, 3)


def _report(exercise: Exercise, candidate: object, capsys: pytest.CaptureFixture[str]) -> str:
    exercise.check(candidate)  # must not raise
    return capsys.readouterr().out


@pytest.mark.parametrize("name", IDS)
def test_reference_solution_passes(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    result = exercise.run(exercise.reference)
    assert result.passed, result.report()
    assert len(result.lines) == len(exercise.cases)
    exercise.grade(exercise.reference)
    assert "All correct" in _report(exercise, exercise.reference, capsys)


@pytest.mark.parametrize("name", IDS)
def test_has_known_wrong_solutions_and_rejects_each(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    assert exercise.wrong, f"{name} needs at least one known-wrong solution in wrong="
    for wrong in exercise.wrong:
        result = exercise.run(wrong)
        assert not result.passed, f"{name} accepted the wrong solution {wrong.__name__}"
        with pytest.raises(AssertionError):
            exercise.grade(wrong)
        out = _report(exercise, wrong, capsys)
        assert "✗" in out and "Not there yet" in out


@pytest.mark.parametrize("name", IDS)
def test_blank_answer_says_not_implemented(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    out = _report(exercise, _blank, capsys)
    assert "not implemented yet" in out
    assert out.count("not implemented yet") == 1  # said once, not once per case
    with pytest.raises(AssertionError):
        exercise.grade(_blank)


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize(
    "candidate", [_returns_none, _raises, _wrong_shape, 42], ids=["none", "raises", "shape", "int"]
)
def test_check_never_raises(name: str, candidate: object, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    out = _report(exercise, candidate, capsys)
    assert "✗" in out
    assert not exercise.run(candidate).passed
    with pytest.raises(AssertionError):
        exercise.grade(candidate)
    if candidate is _raises:
        assert "raised ZeroDivisionError: a bug in the learner's code" in out


@pytest.mark.parametrize("name", IDS)
def test_hint_and_solution_print(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    exercise = EXERCISES[name]
    exercise.hint()
    hint = capsys.readouterr().out
    assert hint.startswith(f"Hint for {exercise.name}:") and len(hint) > 40
    exercise.solution()
    assert "def " in capsys.readouterr().out


@pytest.mark.parametrize("name", IDS)
def test_cases_are_deterministic(name: str) -> None:
    """Each case builds the same inputs every time (the reference and the learner see the same)."""
    for case in EXERCISES[name].cases:
        first, second = case.inputs(), case.inputs()
        assert compare(first, second, atol=0.0, rtol=0.0) is None, case.name


def test_exercise_modules_are_importable_by_notebook_name() -> None:
    for module in {name.split(".")[0] for name in EXERCISES}:
        importlib.import_module(f"transformer_lab.exercises.{module}")


# --- references agree with the library --------------------------------------------------------


def test_chapter_references_match_the_library() -> None:
    from transformer_lab.exercises import ch01_attention, ch02_masking, ch03_multihead

    for case in ch01_attention.attention.cases:
        got = ch01_attention.attention.reference(*case.inputs())
        expected = tl.scaled_dot_product_attention(*case.inputs())
        torch.testing.assert_close(got, expected)
    for size in (1, 4):
        assert torch.equal(ch02_masking.build_causal_mask.reference(size), tl.causal_mask(size))
    tokens = torch.tensor([[3, 4, 0], [5, 0, 0]])
    assert torch.equal(ch02_masking.build_padding_mask.reference(tokens, 0), tl.padding_mask(tokens, 0))
    assert torch.equal(ch02_masking.build_decoder_mask.reference(tokens, 0), tl.target_mask(tokens, 0))
    mask = tl.causal_mask(3)
    assert torch.equal(ch02_masking.to_additive.reference(mask), tl.to_additive_mask(mask))
    # the full multi-head forward equals tl.MultiHeadAttention with the same weights, in float64
    exercise = ch03_multihead.multi_head_attention
    for case in exercise.cases:
        query, key, value, weights, n_heads, mask = case.inputs()
        module = tl.MultiHeadAttention(query.shape[-1], n_heads).double()
        module.load_state_dict({k: v.double() for k, v in weights.items()})
        w64 = {k: v.double() for k, v in weights.items()}
        got = exercise.reference(query.double(), key.double(), value.double(), w64, n_heads, mask)
        torch.testing.assert_close(got, module(query.double(), key.double(), value.double(), mask), rtol=0, atol=1e-12)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    module = tl.MultiHeadAttention(8, 4)
    torch.testing.assert_close(ch03_multihead.split_heads.reference(x, 4), module.split_heads(x))
    heads = module.split_heads(x)
    torch.testing.assert_close(ch03_multihead.merge_heads.reference(heads), module.merge_heads(heads))


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


def test_compare_bool_masks() -> None:
    expected = torch.ones(2, 2, dtype=torch.bool).tril()
    assert compare(expected.float(), expected) == "output should have dtype torch.bool, got torch.float32"
    message = compare(~expected, expected)
    assert message is not None and "wrong at 4 of 4 positions, first at index (0, 0)" in message


def test_compare_types_and_structure() -> None:
    assert compare(None, torch.zeros(1)) == "output should be a torch.Tensor, got NoneType"
    assert compare(torch.zeros(1), (torch.zeros(1), torch.zeros(1))) == (
        "output should be a tuple of 2 items, got Tensor"
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
        hint="multiply by 2",
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
        hint="",
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
        hint="",
    )
    assert exercise.run(reference).passed
    result = exercise.run(lambda x: x)
    assert not result.passed
    assert re.search(r"should raise ValueError", result.lines[1][1])


def test_report_counts_cases() -> None:
    exercise = EXERCISES["ch01_attention.softmax_rows"]
    report = exercise.run(exercise.wrong[0]).report()
    assert report.splitlines()[0].startswith("softmax_rows: ") and "cases passed" in report.splitlines()[0]


def test_exercise_needs_a_case() -> None:
    with pytest.raises(ValueError, match="at least one case"):
        Exercise("x", reference=lambda: None, cases=[], hint="")
