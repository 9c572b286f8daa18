"""Feedback that says why: a known mistake recognised by its symptom, a PyTorch error explained at the
learner's own line, comparison messages that never contradict themselves or name the check's internals."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.exercises.core import Case, Exercise, Mistake, compare


def _softmax(x):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def _global_max(x):
    e = torch.exp(x - x.max())
    return e / e.sum(-1, keepdim=True)


def _no_keepdim_sum(x):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum()


GLOBAL = "the maximum was taken over the whole tensor, not over each row"
SUM = "the sum runs over every entry of the tensor, not over each row"


def _exercise(**extra):
    return Exercise(
        "softmax_rows",
        _softmax,
        [Case("rows of very different sizes", lambda: (torch.tensor([[1.0, 2.0, 3.0], [-1000.0, -1001.0, -1002.0]]),))],
        ["a hint"],
        level="easy",
        kind="build",
        mistakes=[Mistake(_global_max, GLOBAL), Mistake(_no_keepdim_sum, SUM)],
        **extra,
    )


def test_a_known_mistake_is_named_by_its_symptom(capsys):
    exercise = _exercise()
    for answer, says in ((_global_max, GLOBAL), (_no_keepdim_sum, SUM)):
        exercise.check(answer)
        out = capsys.readouterr().out
        assert says in out and "known mistake" in out, out
    exercise.check(lambda x: x * 0)  # a mistake nobody catalogued: the ordinary message, no guess
    out = capsys.readouterr().out
    assert GLOBAL not in out and SUM not in out and "known mistake" not in out
    assert _global_max in exercise.wrong and _no_keepdim_sum in exercise.wrong  # the tests try them too


def test_a_mistake_needs_an_answer_and_a_sentence():
    with pytest.raises(TypeError, match="says"):
        Mistake(_global_max, "")
    with pytest.raises(TypeError, match="answer"):
        Mistake("not a function", GLOBAL)
    with pytest.raises(TypeError, match="mistakes"):
        Exercise("x", _softmax, [Case("c", lambda: ())], ["h"], level="easy", kind="build", mistakes=[_global_max])


def test_a_pytorch_error_is_shown_at_the_learners_line_with_what_it_means(capsys):
    def softmax_rows(x):
        w = torch.ones(7, 2)
        return x @ w

    _exercise().check(softmax_rows)
    out = capsys.readouterr().out
    assert "return x @ w" in out and "your line" in out
    assert out.count("inner sizes differ") == 1  # said once per check, not once per case


def test_equal_infinities_are_never_reported_as_the_difference():
    expected = torch.tensor([float("-inf"), 1.0, 2.0])
    got = torch.tensor([float("-inf"), 1.0, 5.0])
    problem = compare(got, expected)
    assert "expected 2, got 5" in problem and "-inf, got -inf" not in problem


def test_output_names_name_what_the_learner_returned():
    exercise = Exercise(
        "rms",
        lambda x: x * 2,
        [Case("a vector", lambda: (torch.ones(3),))],
        ["a hint"],
        level="easy",
        kind="build",
        run=lambda candidate, x: (candidate(x), str(candidate(x).dtype)),
        output_names=["your output", "your output's dtype"],
    )
    problem = exercise.run(lambda x: (x * 2).double()).lines[0][1]
    assert "your output's dtype" in problem and "output[1]" not in problem
