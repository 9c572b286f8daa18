"""The catalogue of known mistakes: every build, debug and transfer exercise recognises at least two typical
wrong answers by their symptom, and each is tested with the wrong answer itself.

For each `Mistake(answer, says)` of each exercise, `check(answer)` must fail, and its report must say `says`
(in English and in Chinese), since the learner who wrote that answer is the one the sentence is for. A
sentence never quotes the reference's code, and two mistakes of one exercise never say the same thing.
"""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

from transformer_lab.exercises import all_exercises
from transformer_lab.i18n import language, text

EXERCISES = all_exercises()
EXPLAINED = sorted(name for name, ex in EXERCISES.items() if ex.kind in ("build", "debug", "transfer"))
MISTAKES = [
    pytest.param(name, index, id=f"{name}-{index}")
    for name in EXPLAINED
    for index in range(len(EXERCISES[name].mistakes))
]


@pytest.mark.parametrize("name", EXPLAINED)
def test_each_exercise_recognises_at_least_two_mistakes(name: str) -> None:
    exercise = EXERCISES[name]
    says = [textwrap.dedent(m.says).strip() for m in exercise.mistakes]
    assert len(says) >= 2, f"{name}: {len(says)} known mistakes, want at least 2"
    assert len(set(says)) == len(says), f"{name}: two mistakes say the same thing"


@pytest.mark.parametrize(("name", "index"), MISTAKES)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_each_mistake_is_recognised_by_its_own_wrong_answer(name: str, index: int, lang: str) -> None:
    exercise = EXERCISES[name]
    mistake = exercise.mistakes[index]
    says = textwrap.dedent(mistake.says).strip()
    with language(lang):
        result = exercise.run(mistake.answer)
        report = result.report()
        shown = text(says)
    assert not result.passed, f"{name}: the mistake passes the check"
    flat = " ".join(report.split())
    assert " ".join(shown.split()) in flat, f"{name}: mistake {index} not recognised:\n{report}"


@pytest.mark.parametrize(("name", "index"), MISTAKES)
def test_a_mistake_never_quotes_the_answer(name: str, index: int) -> None:
    """No line of the reference's code (beyond the trivial) appears in what a mistake says."""
    exercise = EXERCISES[name]
    says = " ".join(textwrap.dedent(exercise.mistakes[index].says).split())
    source = inspect.getsource(exercise.reference)
    for line in source.splitlines()[1:]:
        code = line.split("#")[0].strip()
        if len(code) >= 25 and not code.startswith(('"""', "return", "def ")):
            assert code not in says, f"{name}: mistake {index} quotes the answer: {code}"
        for statement in re.findall(r"return (.{20,})", code):
            assert statement not in says, f"{name}: mistake {index} quotes the answer: {statement}"
