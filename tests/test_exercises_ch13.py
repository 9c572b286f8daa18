"""Chapter 13's exercises: each reference agrees with transformer_lab.finetune (the SFT loss, LoRA and its merge,
the group advantages, the 藏头诗 reward), honest answers written another way pass, and the natural mistakes get
their own diagnosis, in English and in Chinese."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from support import require
from torch import nn

from transformer_lab import finetune
from transformer_lab.exercises import ch13_instruction as ex


@pytest.fixture(autouse=True)
def _needs_pypinyin() -> None:
    """The rewards read rhymes with pypinyin, a requirement of the package: skipped locally without it, a failure
    under CI (support.require)."""
    require(
        importlib.util.find_spec("pypinyin") is not None, "pypinyin is not installed (pip install -r requirements.txt)"
    )


def _feedback(exercise, answer, language: str = "en") -> str:  # noqa: ANN001
    from transformer_lab import set_language

    set_language(language)
    try:
        return " ".join(exercise.run(answer).report().split())
    finally:
        set_language("en")


# --- 1. the parameters LoRA trains ----------------------------------------------------------------


def test_predicted_count_is_what_lora_linear_trains() -> None:
    layer = finetune.LoRALinear(nn.Linear(128, 512), rank=8, alpha=16)
    trainable = sum(p.numel() for p in layer.parameters() if p.requires_grad)
    assert trainable == ex.predict_lora_parameters.reference() == 5120
    assert trainable not in ex.predict_lora_parameters.explain
    assert "5,120" in ex.predict_lora_parameters.why and f"{5120 / (128 * 512):.1%}".replace("%", " %") in (
        ex.predict_lora_parameters.why
    )


def test_a_wrong_prediction_is_explained_and_never_shows_the_answer() -> None:
    report = _feedback(ex.predict_lora_parameters, lambda: 65536)
    assert "the whole weight W" in report and "5120" not in report and "5,120" not in report
    assert ex.predict_lora_parameters.run(lambda: 5120).passed


# --- 2. the SFT loss --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(ex.response_loss.cases)))
def test_response_loss_is_the_librarys_and_cross_entropy_over_the_response(case: int) -> None:
    logits, targets, mask = ex.response_loss.cases[case].inputs()
    ours = ex._response_loss_reference(logits, targets, mask)
    torch.testing.assert_close(ours, finetune.response_loss(logits, targets, mask), atol=1e-12, rtol=1e-12)
    expected = F.cross_entropy(logits[mask], targets[mask])  # only the response positions, each weighing the same
    torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-12)


def test_the_response_loss_gives_prompt_positions_no_gradient() -> None:
    logits, targets, mask = ex.response_loss.cases[2].inputs()
    logits.requires_grad_(True)
    ex._response_loss_reference(logits, targets, mask).backward()
    assert (logits.grad[~mask] == 0).all() and (logits.grad[mask] != 0).any()


def test_an_honest_response_loss_with_cross_entropy_passes() -> None:
    def honest(logits, targets, mask):  # noqa: ANN001, ANN202
        losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
        return losses[mask].mean()

    assert ex.response_loss.run(honest).passed


def test_averaging_every_position_is_named() -> None:
    def everything(logits, targets, mask):  # noqa: ANN001, ANN202
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    assert "the prompt's included" in _feedback(ex.response_loss, everything)
    assert "包括提示词的位置" in _feedback(ex.response_loss, everything, "zh")


def test_shifting_again_is_named() -> None:
    def shifted(logits, targets, mask):  # noqa: ANN001, ANN202
        losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none")
        return losses[mask[:, 1:]].mean()

    assert "shifted once more" in _feedback(ex.response_loss, shifted)


def test_calling_the_library_gets_no_credit() -> None:
    assert not ex.response_loss.run(lambda logits, targets, mask: finetune.response_loss(logits, targets, mask)).passed


# --- 3. LoRA's output and merge ------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(ex.lora_forward.cases)))
def test_lora_forward_is_lora_linear_and_its_merge(case: int) -> None:
    x, weight, bias, A, B, alpha = ex.lora_forward.cases[case].inputs()
    base = nn.Linear(weight.shape[1], weight.shape[0], dtype=torch.float64)
    with torch.no_grad():
        base.weight.copy_(weight)
        base.bias.copy_(bias)
    layer = finetune.LoRALinear(base, rank=A.shape[0], alpha=alpha)
    with torch.no_grad():
        layer.lora_A.copy_(A)
        layer.lora_B.copy_(B)
    y, merged = ex._lora_forward_reference(x, weight, bias, A, B, alpha)
    torch.testing.assert_close(y, layer(x).detach(), atol=1e-12, rtol=1e-12)
    layer.merge()
    torch.testing.assert_close(merged, layer.base.weight.detach(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(x @ merged.T + bias, y, atol=1e-12, rtol=1e-12)  # merged: the same outputs


def test_the_notebooks_buggy_lora_fails_and_is_named() -> None:
    def buggy(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
        return x @ weight.T + bias + x @ A.T @ B.T, weight + A.T @ B.T

    report = _feedback(ex.lora_forward, buggy)
    assert "both bugs are still there" in report
    assert "两处错误都还在" in _feedback(ex.lora_forward, buggy, "zh")

    def scale_mended(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
        s = alpha / A.shape[0]
        return x @ weight.T + bias + s * (x @ A.T @ B.T), weight + s * (A.T @ B.T)

    assert "the transpose of B A" in _feedback(ex.lora_forward, scale_mended)


def test_an_honest_lora_with_einsum_passes() -> None:
    def honest(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
        delta = torch.einsum("or,ri->oi", B, A) * (alpha / A.shape[0])
        return x @ (weight + delta).T + bias, weight + delta

    assert ex.lora_forward.run(honest).passed


def test_the_debug_exercise_is_titled_for_the_chapters_code_not_the_notes() -> None:
    from transformer_lab.exercises.core import Case, Exercise

    # the notes (../shared/seeds) have no LoRA: the bugs are in the code the chapter gives, and the title says so
    assert (ex.lora_forward.kind, ex.lora_forward.title) == ("debug", "medium, debug the code")
    options = {"reference": lambda: 1, "cases": [Case("one", lambda: ())], "hints": ["h"], "level": "easy"}
    assert Exercise("e", kind="debug", **options).title == "easy, debug the notes"  # the default: the notes' mistake
    with pytest.raises(ValueError, match="kind_title"):
        Exercise("e", kind="build", kind_title="debug the code", **options)  # only a "debug" exercise may say it


# --- 4. group advantages ------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(ex.group_advantages.cases)))
def test_group_advantages_are_the_librarys(case: int) -> None:
    (rewards,) = ex.group_advantages.cases[case].inputs()
    ours = ex._group_advantages_reference(rewards)
    torch.testing.assert_close(ours, finetune.group_advantages(rewards), atol=0, rtol=0)
    torch.testing.assert_close(ours.sum(1), torch.zeros(len(rewards), dtype=rewards.dtype), atol=1e-12, rtol=0)


def test_a_group_of_equal_rewards_teaches_nothing() -> None:
    (rewards,) = ex.group_advantages.cases[2].inputs()
    assert (ex._group_advantages_reference(rewards)[0] == 0).all()


def test_a_global_mean_and_a_z_score_are_named() -> None:
    assert "one mean over the whole batch" in _feedback(ex.group_advantages, lambda r: r - r.mean())
    z = _feedback(ex.group_advantages, lambda r: (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4))
    assert "GRPO's z-score" in z
    assert "整个批量的一个平均值" in _feedback(ex.group_advantages, lambda r: r - r.mean(), "zh")


def test_an_honest_loop_over_groups_passes() -> None:
    def honest(rewards):  # noqa: ANN001, ANN202
        return torch.stack([row - row.sum() / len(row) for row in rewards])

    assert ex.group_advantages.run(honest).passed


# --- 5. the reward of a 藏头诗 ------------------------------------------------------------------------


POEMS = [case.inputs()[:2] for case in ex.poem_reward.cases] + [
    ("春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少", "春处夜花"),  # the last mark missing
    ("", "春夏秋冬"),
    ("春眠不觉晓,处处闻啼鸟.夜来风雨声,花落知多少.", "春处夜花"),  # ASCII marks
    ("床前明月光，疑是地上霜。举头望明月，低头思故乡。", "床疑举低"),  # 霜 and 乡: uang and iang, one class
]


@pytest.mark.parametrize("index", range(len(POEMS)))
def test_poem_reward_is_the_librarys(index: int) -> None:
    text, heads = POEMS[index]
    assert ex._poem_reward_reference(text, heads) == finetune.poem_reward(text, heads)


def test_the_cases_tell_the_rhyme_mistakes_apart() -> None:
    checks = {case.name: finetune.poem_checks(*case.inputs()[:2]) for case in ex.poem_reward.cases}
    assert not checks["lines 1 and 3 rhyme, lines 2 and 4 do not"]["rhyme"]
    assert checks["lines 2 and 4 end in 楼 and 头 (one final, ou)"]["rhyme"]
    assert checks["《春晓》 with its own heads 春处夜花"]["all"]


def _lookup_table():  # noqa: ANN202
    """The answer a reviewer wrote: the visible cases' rewards, computed once with the library, looked up."""
    table = {}
    for case in ex.poem_reward.cases:
        text, heads, _ = case.inputs()
        table[text, heads] = finetune.poem_reward(text, heads)
    return lambda text, heads: table[text, heads]


def _counter():  # noqa: ANN202
    """The visible cases' rewards handed out in the cases' order, whatever the poem."""
    answers = iter([finetune.poem_reward(*case.inputs()[:2]) for case in ex.poem_reward.cases])
    return lambda text, heads: next(answers)


def _hidden_points(candidate, secret: int) -> int:  # noqa: ANN001
    """How many of poem_reward's hidden cases `candidate` passes (as tests/test_classroom_class.py's fair grader)."""
    from transformer_lab.exercises.core import compare
    from transformer_lab.exercises.grading import hidden_inputs

    passed = 0
    for index, case in enumerate(ex.poem_reward.cases):
        inputs = hidden_inputs(ex.poem_reward, index, secret)
        try:
            got = ex.poem_reward._run(candidate, *inputs)
        except Exception:  # noqa: BLE001 - a lookup table meets keys it does not hold
            continue
        passed += compare(got, ex.poem_reward._run(ex.poem_reward.reference, *inputs), case.atol, case.rtol) is None
    return passed


@pytest.mark.parametrize("secret", [1, 2, 3, 12345])
def test_a_table_of_the_visible_answers_fails_the_hidden_cases(secret: int) -> None:
    cases = ex.poem_reward.cases
    assert ex.poem_reward.run(_lookup_table()).passed and ex.poem_reward.run(_counter()).passed  # visible: they pass
    from transformer_lab.exercises.grading import hidden_inputs

    drawn = [ex._drawn_poem(*hidden_inputs(ex.poem_reward, i, secret)) for i in range(len(cases))]
    assert all(poem != case.inputs()[:2] for poem, case in zip(drawn, cases, strict=True))  # every case moves
    assert _hidden_points(_lookup_table(), secret) == 0
    assert _hidden_points(_counter(), secret) < len(cases)
    assert _hidden_points(finetune.poem_reward, secret) == len(cases)  # the library itself passes them all
    assert all(ex._poem_reward_reference(*poem) == finetune.poem_reward(*poem) for poem in drawn)


def test_hidden_poems_are_drawn_per_submission() -> None:
    from transformer_lab.exercises.grading import hidden_inputs

    def poems(secret: int) -> list[tuple[str, str]]:
        return [ex._drawn_poem(*hidden_inputs(ex.poem_reward, i, secret)) for i in range(len(ex.poem_reward.cases))]

    assert poems(7) == poems(7)  # a re-grade meets the same poems
    assert all(a != b for a, b in zip(poems(7), poems(8), strict=True))


def test_an_honest_reward_with_regular_expressions_passes() -> None:
    import re

    def honest(text, heads):  # noqa: ANN001, ANN202
        form = re.fullmatch(r"(?:[\u4e00-\u9fff]{5}，[\u4e00-\u9fff]{5}。){2}", text) is not None
        lines = re.split("[，。]", text)
        if lines and lines[-1] == "":
            lines = lines[:-1]
        acrostic = len(lines) == 4 and all(line[:1] == head for line, head in zip(lines, heads, strict=True))
        rhyme = False
        if len(lines) == 4 and lines[1] and lines[3]:
            a, b = finetune.rhyme_class(lines[1][-1]), finetune.rhyme_class(lines[3][-1])
            rhyme = a is not None and a == b
        return (int(form) + int(acrostic) + int(rhyme)) / 3

    assert ex.poem_reward.run(honest).passed and _hidden_points(honest, 5) == len(ex.poem_reward.cases)


def test_comparing_exact_finals_and_rhyming_lines_one_and_three_are_named() -> None:
    from pypinyin import Style, pinyin

    def exact(text, heads):  # noqa: ANN001, ANN202
        lines = text.replace("。", "，").split("，")[:4]
        form = ex._form(text)
        acrostic = len(lines) == 4 and all(line.startswith(h) for line, h in zip(lines, heads, strict=True))
        rhyme = len(lines) == 4 and bool(lines[1]) and bool(lines[3])
        if rhyme:
            finals = [pinyin(line[-1], style=Style.FINALS, strict=True)[0][0] for line in (lines[1], lines[3])]
            rhyme = finals[0] == finals[1]
        return (form + acrostic + rhyme) / 3

    assert "the exact finals were compared" in _feedback(ex.poem_reward, exact)
    assert "完整的韵母" in _feedback(ex.poem_reward, exact, "zh")


def test_every_exercise_passes_its_reference_and_fails_each_mistake() -> None:
    for name in ex.__all__:
        exercise = getattr(ex, name)
        assert exercise.run(exercise.reference_copy()).passed, name
        for mistake in exercise.mistakes:
            report = _feedback(exercise, mistake.answer)
            assert " ".join(mistake.says.split()) in report, (name, mistake.answer.__name__, report)
        for shortcut in exercise.shortcuts:
            assert not exercise.run(shortcut).passed, (name, shortcut.__name__)
