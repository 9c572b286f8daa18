"""Chapter 11's exercises: each reference agrees with the library, with PyTorch and with the published recipes.

- the soft-cap with `tl.modern.soft_cap` and with a GPT's capped logits;
- the KV-cache prediction with `GPT.kv_cache_bytes` of Llama 3 8B's configuration (built on the meta device);
- the rows moved from the pairs to the halves layout with `tl.hf`'s converter (its inverse) and with a whole GPT,
  whose logits stay the same in float64;
- the Muon step with `tl.muon._reference_step` (the published update in float64) and with `torch.optim.Muon`
  (bfloat16 Newton-Schulz): the check's float32 cases accept torch's precision and nothing coarser.
Also chapter 11's figures (tl.plotting.modern): they draw without a warning and refuse bad input.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from transformer_lab.exercises import ch11_modern as ex  # noqa: E402
from transformer_lab.gpt import GPT, GPTConfig  # noqa: E402
from transformer_lab.hf import _halves_to_pairs  # noqa: E402
from transformer_lab.modern import soft_cap  # noqa: E402
from transformer_lab.muon import _reference_step  # noqa: E402
from transformer_lab.plotting import modern as plots  # noqa: E402
from transformer_lab.training import TextHistory  # noqa: E402

# ------------------------------------------------------------------ 1. soft-cap


@pytest.mark.parametrize("case", range(5))
def test_soft_cap_reference_is_the_librarys(case: int) -> None:
    logits, cap = ex.soft_cap_logits.cases[case].inputs()
    got = ex._soft_cap_reference(logits, cap)
    assert got.dtype == logits.dtype and got.shape == logits.shape
    torch.testing.assert_close(got, soft_cap(logits, cap), rtol=0, atol=0)
    assert bool((got.abs() <= cap).all())  # never past the cap (tanh rounds to 1 in float32 for large z)


def test_soft_cap_is_what_the_gpt_applies_to_its_logits() -> None:
    config = GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1)
    torch.manual_seed(0)
    plain = GPT(config).double().eval()
    capped = GPT(dataclasses.replace(config, logit_softcap=0.05)).double().eval()
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(capped(idx), ex._soft_cap_reference(plain(idx), 0.05), rtol=1e-12, atol=1e-12)


def _assert_named_alone(exercise, which: int) -> None:  # noqa: ANN001
    """Known mistake `which` fails some case, and every case it fails names it by its own sentence and no other."""
    mistakes = exercise.mistakes
    result = exercise.run(mistakes[which].answer)
    failed = [text for ok, text in result.lines if not ok]
    assert failed, result.report()
    for text in failed:
        assert mistakes[which].says in text, text
        assert not any(m.says in text for i, m in enumerate(mistakes) if i != which), text


@pytest.mark.parametrize("which", range(len(ex.soft_cap_logits.mistakes)))
def test_each_soft_cap_mistake_is_told_its_own_mistake_in_every_case_it_fails(which: int) -> None:
    """A hard clip and tanh of the raw logits both give +-cap far beyond the cap: the case of far logits holds one
    inside the cap too, so that neither learner is told the other's mistake. An answer in float32 fails the
    float64 case (compared to 1e-10) and is told so."""
    _assert_named_alone(ex.soft_cap_logits, which)


def test_a_float32_answer_fails_only_the_float64_case() -> None:
    result = ex.soft_cap_logits.run(ex._soft_cap_in_float32)
    failed = [text for ok, text in result.lines if not ok]
    assert len(failed) == 1 and failed[0].startswith("(B, T, V) logits in float64"), result.report()
    assert ex.soft_cap_logits.run(lambda logits, cap: torch.tanh(logits / cap) * cap).passed  # in the logits' dtype


# ------------------------------------------------------------------ 2. the KV cache of Llama 3 8B


def test_kv_cache_bytes_are_llama_3_8bs() -> None:
    llama = GPTConfig(
        vocab_size=128256, block_size=8192, d_model=4096, n_heads=32, n_layers=32, bias=False, tie_embeddings=False,
        positions="rope", rope_base=500000.0, norm="rms", activation="swiglu", n_kv_heads=8, ff_width=14336,
    )  # fmt: skip
    with torch.device("meta"):  # shapes and dtypes only: no 16 GB of weights
        model = GPT(llama).to(torch.bfloat16)
        full = GPT(dataclasses.replace(llama, n_kv_heads=None)).to(torch.bfloat16)
    expected = ex.predict_kv_cache_bytes.reference()
    assert model.kv_cache_bytes(8192) == expected == 1 << 30
    assert full.kv_cache_bytes(8192) == 4 * expected  # multi-head attention: the explained wrong answer
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # Llama 3 8B's parameter count
    assert expected not in ex.predict_kv_cache_bytes.explain
    for wrong in ex.predict_kv_cache_bytes.wrong:
        assert wrong() in ex.predict_kv_cache_bytes.explain


@pytest.mark.parametrize(("answer", "unit"), [(1.0, "GiB"), (1, "GiB"), ((1 << 30) / 1e9, "GB")])
def test_a_cache_size_in_gib_or_gb_is_told_it_is_not_bytes(answer: float, unit: str) -> None:
    result = ex.predict_kv_cache_bytes.run(lambda: answer)
    assert not result.passed
    assert f"that is the size in {unit}" in result.report(), result.report()


# ------------------------------------------------------------------ 3. the sliding-window mask


@pytest.mark.parametrize(("size", "window"), [(8, 3), (6, 1), (5, 2), (6, 6), (4, 10), (64, 16), (1, 1), (7, 4)])
def test_sliding_window_reference_is_the_librarys_and_the_causal_mask_for_a_long_window(size: int, window: int) -> None:
    from transformer_lab.masking import causal_mask
    from transformer_lab.modern import sliding_window_mask

    got = ex._window_reference(size, window)
    assert got.dtype == torch.bool and got.shape == (size, size)
    assert torch.equal(got, sliding_window_mask(size, window))
    assert got.sum(dim=1).tolist() == [min(i + 1, window) for i in range(size)]  # the query and window - 1 before
    if window >= size:
        assert torch.equal(got, causal_mask(size))


def test_the_sliding_window_cases_are_the_gpts_masks() -> None:
    """The case of 64 positions and 16 is the mask the modern model with window_pattern="SSSL" keeps."""
    config = GPTConfig(vocab_size=11, block_size=64, d_model=16, n_heads=2, n_layers=4, window_pattern="SSSL")
    assert torch.equal(GPT(config).window_masks[0], ex._window_reference(*ex.sliding_window_mask.cases[-1].inputs()))


def _window_as_the_notebook(size, window):  # noqa: ANN001, ANN202
    i = torch.arange(size).unsqueeze(1)
    j = torch.arange(size).unsqueeze(0)
    return (j <= i) & (j > i - window)


def _window_by_loops(size, window):  # noqa: ANN001, ANN202
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        for j in range(max(0, i - window + 1), i + 1):
            mask[i, j] = True
    return mask


def _window_from_tril(size, window):  # noqa: ANN001, ANN202
    ones = torch.ones(size, size, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def _window_from_triu(size, window):  # noqa: ANN001, ANN202
    ones = torch.ones(size, size, dtype=torch.bool)
    return torch.triu(torch.tril(ones), diagonal=-(window - 1))


@pytest.mark.parametrize("answer", [_window_as_the_notebook, _window_by_loops, _window_from_tril, _window_from_triu])
def test_honest_sliding_window_answers_pass(answer) -> None:  # noqa: ANN001
    result = ex.sliding_window_mask.run(answer)
    assert result.passed, result.report()


@pytest.mark.parametrize("which", range(len(ex.sliding_window_mask.mistakes)))
def test_each_sliding_window_mistake_is_told_its_own_mistake_in_every_case_it_fails(which: int) -> None:
    """An off-by-one window either way, a band on both sides or ahead of the diagonal, the far edge alone (no
    causality), the plain causal mask, the blocked convention and a float additive mask: each fails somewhere and is
    named, in every case it fails, by its own sentence and by no other."""
    _assert_named_alone(ex.sliding_window_mask, which)


def test_the_sliding_window_mistakes_say_different_things_and_cover_the_natural_slips() -> None:
    says = [m.says for m in ex.sliding_window_mask.mistakes]
    assert len(set(says)) == len(says)
    i, j = torch.arange(8).unsqueeze(1), torch.arange(8).unsqueeze(0)
    slips = {  # written here as a learner would, not taken from the module
        "window + 1 keys": (j <= i) & (j >= i - 3),
        "window - 1 keys": (j <= i) & (j > i - 2),
        "reaches into the future": (i - j).abs() < 3,
        "wrong side of the diagonal": (j >= i) & (j < i + 3),
        "plain causal mask": j <= i,
        "NOT see": (j > i) | (j <= i - 3),
    }
    for words, mask in slips.items():
        result = ex.sliding_window_mask.run(lambda size, window, mask=mask: mask if size == 8 else mask[:0])
        first = next(text for ok, text in result.lines if not ok)
        assert first.startswith("8 positions, a window of 3") and words in first, first


def test_the_librarys_sliding_window_mask_is_no_answer() -> None:
    result = ex.sliding_window_mask.run(ex._window_with_library)
    assert not result.passed and result.shortcut, result.report()


# ------------------------------------------------------------------ 4. pairs -> halves


@pytest.mark.parametrize("case", range(5))
def test_pairs_to_halves_is_the_inverse_of_the_hf_converter(case: int) -> None:
    weight, n_heads = ex.pairs_to_halves.cases[case].inputs()
    d_k = weight.shape[0] // n_heads
    moved = ex._pairs_to_halves_reference(weight, n_heads)
    assert torch.equal(_halves_to_pairs(moved, n_heads, d_k), weight)  # tl.hf's halves -> pairs undoes it
    assert torch.equal(ex._halves_to_pairs_by_hand(moved, n_heads), weight)  # and so does the first mistake


def test_moving_the_columns_is_named_in_every_case() -> None:
    result = ex.pairs_to_halves.run(ex._pairs_to_halves_columns)
    assert not any(ok for ok, _ in result.lines)
    for _, text in result.lines:
        assert "the columns moved" in text, text


def test_rows_returned_in_their_own_order_are_named_in_every_case() -> None:
    """A learner who reshapes into pairs and back without swapping two axes returns the weight unchanged. On the
    vector case that is also what moving the columns gives (a vector has none): this learner is told the rows did
    not move, not that the columns did."""
    result = ex.pairs_to_halves.run(lambda weight, n_heads: weight.clone())
    assert not any(ok for ok, _ in result.lines)
    for _, text in result.lines:
        assert "the rows came back in the order they came in" in text, text


@pytest.mark.parametrize("answer", [32 * 32 * 8192 * 128 * 2, 2 * 32 * 8 * 8192 * 128 * 4])
def test_twice_the_cache_names_both_ways_to_get_it(answer: int) -> None:
    """2 GiB: 4 bytes a number (float32), or the keys alone of the 32 query heads; the message names both."""
    report = ex.predict_kv_cache_bytes.run(lambda: answer).report()
    assert "4 bytes a number" in report and "32 query heads" in report, report


@pytest.mark.parametrize("qk_norm", [None, "rms"])
def test_a_pairs_model_with_its_rows_moved_is_the_same_model_in_the_halves_layout(qk_norm: str | None) -> None:
    config = GPTConfig(
        vocab_size=23, block_size=12, d_model=24, n_heads=4, n_layers=2, positions="rope", rope_layout="pairs",
        qk_norm=qk_norm, n_kv_heads=2, head_dim=8, norm="rms",
    )  # fmt: skip
    torch.manual_seed(0)
    pairs = GPT(config).double().eval()
    with torch.no_grad():
        for p in pairs.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norm gains and biases away from 1 and 0
    state = pairs.state_dict()
    for i in range(config.n_layers):
        for name, heads in (("w_q", config.n_heads), ("w_k", config.kv_heads), ("q_norm", 1), ("k_norm", 1)):
            for part in ("weight", "bias"):
                key = f"layers.{i}.self_attn.{name}.{part}"
                if key in state:
                    state[key] = ex._pairs_to_halves_reference(state[key], heads)
    halves = GPT(dataclasses.replace(config, rope_layout="halves")).double().eval()
    halves.load_state_dict(state)
    idx = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(halves(idx), pairs(idx), rtol=1e-10, atol=1e-10)
        wrong = dict(state)
        wrong["layers.0.self_attn.w_q.weight"] = ex._halves_to_pairs_by_hand(
            pairs.state_dict()["layers.0.self_attn.w_q.weight"], config.n_heads
        )
        halves.load_state_dict(wrong)
        assert not torch.allclose(halves(idx), pairs(idx), atol=1e-6)  # the inverse permutation is another model


# ------------------------------------------------------------------ 5. one Muon step

FLOAT64_CASES = [i for i, c in enumerate(ex.muon_update.cases) if len(c.inputs()) == 5]
TORCH_CASES = [i for i, c in enumerate(ex.muon_update.cases) if len(c.inputs()) == 6]


def test_the_muon_cases_are_four_in_float64_and_two_against_torch() -> None:
    assert len(FLOAT64_CASES) == 4 and len(TORCH_CASES) == 2
    for i in TORCH_CASES:
        assert ex.muon_update.cases[i].hidden == "same"  # torch's result is computed for these very inputs


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_muon_reference_is_the_published_update_in_float64(case: int) -> None:
    weight, grad, buffer, lr, momentum = ex.muon_update.cases[case].inputs()
    assert weight.dtype == torch.float64
    new_weight, new_buffer = ex._muon_reference(weight, grad, buffer, lr, momentum)
    expected_weight, expected_buffer = _reference_step(weight, grad, buffer, lr=lr, momentum=momentum)
    torch.testing.assert_close(new_weight, expected_weight, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(new_buffer, expected_buffer, rtol=1e-12, atol=1e-14)


def _muon_with_torch_eps(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    """The published update, but dividing by max(||U||_F, eps) as torch.optim.Muon does, not ||U||_F + eps."""
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    o = x.T if u.shape[0] > u.shape[1] else x
    return weight - lr * max(1.0, weight.shape[0] / weight.shape[1]) ** 0.5 * o, m


def _muon_in_float32(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    """The reference computed in float32 whatever the inputs' dtype, returned in their dtype."""
    w, m = ex._muon_reference(weight.float(), grad.float(), buffer.float(), lr, momentum)
    return w.to(weight.dtype), m.to(weight.dtype)


def test_either_convention_for_eps_passes_but_float32_arithmetic_fails_the_float64_cases() -> None:
    assert ex.muon_update.run(_muon_with_torch_eps).passed  # the gradients are far above 1e-7: both agree
    result = ex.muon_update.run(_muon_in_float32)
    failed = [i for i, (ok, _) in enumerate(result.lines) if not ok]
    assert failed and set(failed) <= set(FLOAT64_CASES), result.report()  # float32 passes torch's cases only


def _muon_written_out(weight, grad, buffer, lr, momentum=0.95, coefficients=(3.4445, -4.7750, 2.0315), cast=None):  # noqa: ANN001, ANN202
    """The published update as a learner writes it, with the slips below as options."""
    a, b, c = coefficients
    if cast is not None:
        weight, grad, buffer = weight.to(cast), grad.to(cast), buffer.to(cast)
    m = momentum * buffer + (1 - momentum) * grad
    u = (1 - momentum) * grad + momentum * m
    tall = u.shape[0] > u.shape[1]
    x = u.T if tall else u
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    o = x.T if tall else x
    return weight - lr * max(1.0, weight.shape[0] / weight.shape[1]) ** 0.5 * o, m


def _slip_all_float32(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    return _muon_written_out(weight, grad, buffer, lr, momentum, cast=torch.float32)  # returns float32


def _slip_float32_and_back(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    new, m = _muon_written_out(weight, grad, buffer, lr, momentum, cast=torch.float32)
    return new.to(weight.dtype), m.to(weight.dtype)


def _slip_float32_constants(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    k = torch.tensor([3.4445, -4.7750, 2.0315])  # float32: each constant rounded
    return _muon_written_out(weight, grad, buffer, lr, momentum, coefficients=(k[0], k[1], k[2]))


def _slip_newton_schulz_in_float32(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
    m = momentum * buffer + (1 - momentum) * grad
    u = ((1 - momentum) * grad + momentum * m).float()  # the rest in float32, other arithmetic order
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = 3.4445 * x - 4.7750 * (gram @ x) + 2.0315 * (gram @ (gram @ x))
    o = x.T if u.shape[0] > u.shape[1] else x
    return weight - lr * max(1.0, weight.shape[0] / weight.shape[1]) ** 0.5 * o, m


FLOAT32_SAYS = next(m.says for m in ex.muon_update.mistakes if m.answer is ex._muon_through_float32)


@pytest.mark.parametrize(
    "slip", [_slip_all_float32, _slip_float32_and_back, _slip_float32_constants, _slip_newton_schulz_in_float32]
)
def test_a_float32_slip_is_named_in_every_float64_case_it_fails(slip) -> None:  # noqa: ANN001
    """Issue 35: a learner whose step went through float32 somewhere saw 'expected 0.124762, got 0.124762' and
    nothing else. Every float64 case such an answer fails now says why, whatever order its arithmetic ran in;
    torch's float32 cases pass it."""
    assert ex.muon_update.run(_muon_written_out).passed  # the same code without the slip
    result = ex.muon_update.run(slip)
    failed = [(i, text) for i, (ok, text) in enumerate(result.lines) if not ok]
    assert failed and {i for i, _ in failed} <= set(FLOAT64_CASES), result.report()
    for _, text in failed:
        assert FLOAT32_SAYS in text, text
        assert not any(m.says in text for m in ex.muon_update.mistakes if m.says != FLOAT32_SAYS), text


def test_the_float32_recogniser_names_no_other_mistake_and_passes_nothing() -> None:
    """Run as an answer right after a right one (whose results it may still hold), the float32 slip fails every
    float64 case; the other mistakes are not taken for it."""
    assert ex.muon_update.run(_muon_written_out).passed
    result = ex.muon_update.run(ex._muon_through_float32)
    assert [ok for ok, _ in result.lines[: len(FLOAT64_CASES)]] == [False] * len(FLOAT64_CASES), result.report()
    for mistake in ex.muon_update.mistakes:
        if mistake.answer is not ex._muon_through_float32:
            assert FLOAT32_SAYS not in ex.muon_update.run(mistake.answer).report(), mistake.says


def test_the_student_copy_of_chapter_11s_exercises_keeps_no_answer() -> None:
    """The float32 recogniser reads the learner's result through the run hook: strip_source still makes the
    student copy, without the reference or the recogniser (a mistake), and its cases still run."""
    import pathlib

    from transformer_lab.exercises.strip import strip_source

    stripped = strip_source(pathlib.Path(ex.__file__).read_text(encoding="utf-8"))
    assert "def _muon_reference" not in stripped and "def _muon_through_float32" not in stripped
    assert "def _window_reference" not in stripped and "def _run_muon" in stripped


@pytest.mark.parametrize("case", TORCH_CASES)
def test_float32_reference_is_within_bfloat16_precision_of_torch_optim_muon(case: int) -> None:
    weight, grad, buffer, lr, momentum, (torch_weight, torch_buffer) = ex.muon_update.cases[case].inputs()
    assert weight.dtype == torch.float32
    exact_weight, _ = _reference_step(weight, grad, buffer, lr=lr, momentum=momentum)
    ours, our_buffer = ex._muon_reference(weight, grad, buffer, lr, momentum)
    exact = exact_weight - weight.double()
    torch_error = ((torch_weight.double() - weight.double()) - exact).norm() / exact.norm()
    our_error = ((ours.double() - weight.double()) - exact).norm() / exact.norm()
    assert 1e-3 < torch_error < 2.5e-2 < ex.TORCH_RTOL  # bfloat16 rounding, measured 1.3e-2 to 2.2e-2
    assert our_error < 1e-5  # float32 rounding
    torch.testing.assert_close(our_buffer, torch_buffer, rtol=1e-6, atol=1e-6)
    # the check's run: the reference counts as torch's step, and a step 10 % off does not
    assert (
        ex._run_muon(ex._muon_reference, weight, grad, buffer, lr, momentum, (torch_weight, torch_buffer))[0]
        is not ours
    )

    def off(w, g, b, learning_rate, beta):  # noqa: ANN001, ANN202
        new_w, new_b = ex._muon_reference(w, g, b, learning_rate, beta)
        return w + 1.1 * (new_w - w), new_b

    got = ex._run_muon(off, weight, grad, buffer, lr, momentum, (torch_weight, torch_buffer))
    assert not torch.equal(got[0], torch_weight)


def test_a_candidate_that_returns_something_else_is_passed_through_unchanged() -> None:
    weight, grad, buffer, lr, momentum, torch_result = ex.muon_update.cases[TORCH_CASES[0]].inputs()
    for returned in (None, 3, torch.zeros(2), (torch.zeros(2), torch.zeros(2)), (weight, buffer, buffer)):
        got = ex._run_muon(lambda *args, r=returned: r, weight, grad, buffer, lr, momentum, torch_result)
        assert got is returned


def _named_in_every_failed_case(exercise, answer, says: str, failing: int) -> None:  # noqa: ANN001
    result = exercise.run(answer)
    failed = [text for ok, text in result.lines if not ok]
    assert len(failed) == failing, result.report()
    assert all(says in text for text in failed), result.report()


def test_muon_slips_written_as_a_learner_would_are_named() -> None:
    """Three slips a cold reader wrote: U from the OLD buffer ((1 - beta) G + beta * old buffer, which is M itself),
    Newton-Schulz on the gradient alone (passes the first step, whose buffer is zero), the pair returned in the
    other order. Each is named in every case it fails."""
    says = {m.answer.__name__: m.says for m in ex.muon_update.mistakes}

    def old_buffer(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
        u = (1 - momentum) * grad + momentum * buffer  # the Nesterov line written with the old buffer
        new_buffer = momentum * buffer + (1 - momentum) * grad
        return weight - lr * ex._scale(weight) * ex._ns(u), new_buffer

    def gradient_only(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
        new_buffer = momentum * buffer + (1 - momentum) * grad
        return weight - lr * ex._scale(weight) * ex._ns(grad), new_buffer

    def swapped(weight, grad, buffer, lr, momentum=0.95):  # noqa: ANN001, ANN202
        new_buffer = momentum * buffer + (1 - momentum) * grad
        u = (1 - momentum) * grad + momentum * new_buffer
        return new_buffer, weight - lr * ex._scale(weight) * ex._ns(u)

    assert "with the M of this step" in says["_muon_no_nesterov"]
    _named_in_every_failed_case(ex.muon_update, old_buffer, says["_muon_no_nesterov"], 5)
    _named_in_every_failed_case(ex.muon_update, gradient_only, says["_muon_gradient_only"], 5)
    _named_in_every_failed_case(ex.muon_update, swapped, says["_muon_outputs_swapped"], 6)


def test_pairs_to_halves_heads_split_the_wrong_way_is_named() -> None:
    """reshape(d_k, n_heads, ...) deals the rows out to the heads in turn: right for one head, named on the three
    cases with several."""
    says = next(m.says for m in ex.pairs_to_halves.mistakes if m.answer is ex._pairs_to_halves_heads_minor)

    def heads_minor(weight, n_heads):  # noqa: ANN001, ANN202
        d_k = weight.shape[0] // n_heads
        w = weight.reshape(d_k, n_heads, *weight.shape[1:])
        return torch.cat([w[0::2], w[1::2]], dim=0).reshape(weight.shape)

    _named_in_every_failed_case(ex.pairs_to_halves, heads_minor, says, 3)


def test_a_window_without_the_querys_own_key_is_named() -> None:
    says = next(m.says for m in ex.sliding_window_mask.mistakes if m.answer is ex._window_strictly_before)

    def strictly_before(size, window):  # noqa: ANN001, ANN202
        i, j = torch.arange(size).unsqueeze(1), torch.arange(size).unsqueeze(0)
        return (j < i) & (j >= i - window)

    _named_in_every_failed_case(ex.sliding_window_mask, strictly_before, says, 6)


def test_each_muon_mistake_is_more_than_bfloat16_away_somewhere() -> None:
    """The 3 % window never hides a known mistake: each fails at least one case whatever the tolerance there."""
    for mistake in ex.muon_update.mistakes:
        result = ex.muon_update.run(mistake.answer)
        assert not result.passed, mistake.says


@pytest.mark.parametrize("nesterov_like_sgd", [False, True])
def test_sgd_style_momentum_is_named_in_every_case(nesterov_like_sgd: bool) -> None:
    answer = ex._muon_sgd_momentum_nesterov if nesterov_like_sgd else ex._muon_sgd_momentum
    result = ex.muon_update.run(answer)
    assert not any(ok for ok, _ in result.lines)
    for _, text in result.lines:
        assert ex._SGD_MOMENTUM_SAYS in text, text


def test_what_the_sgd_momentum_feedback_says_is_true() -> None:
    """Run from a zero buffer, SGD's buffer is 1 / (1 - beta) times Muon's. With SGD's own Nesterov step,
    G + beta M, the update is then the same up to that factor, which Newton-Schulz divides out (but for its eps);
    with the hint's (1 - beta) G + beta M on SGD's buffer it is not. From a buffer kept as an average, both move
    the weight differently from Muon."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 10, generator=g, dtype=torch.float64)
    muon_w, muon_b = weight.clone(), torch.zeros_like(weight)
    sgd_w, sgd_b = weight.clone(), torch.zeros_like(weight)
    hint_w, hint_b = weight.clone(), torch.zeros_like(weight)
    for _ in range(6):
        grad = torch.randn(6, 10, generator=g, dtype=torch.float64)
        muon_w, muon_b = ex._muon_reference(muon_w, grad, muon_b, 0.02)
        sgd_w, sgd_b = ex._muon_sgd_momentum_nesterov(sgd_w, grad, sgd_b, 0.02)
        hint_w, hint_b = ex._muon_sgd_momentum(hint_w, grad, hint_b, 0.02)
        torch.testing.assert_close(sgd_b, muon_b / (1 - 0.95), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(hint_b, muon_b / (1 - 0.95), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(sgd_w, muon_w, rtol=1e-6, atol=1e-7)  # apart only by the eps of 1e-7
    assert not torch.allclose(hint_w, muon_w, atol=1e-4)
    grad = torch.randn(6, 10, generator=g, dtype=torch.float64)
    exact = ex._muon_reference(weight, grad, muon_b, 0.02)[0]
    for answer in (ex._muon_sgd_momentum, ex._muon_sgd_momentum_nesterov):
        assert not torch.allclose(answer(weight, grad, muon_b, 0.02)[0], exact, atol=1e-4)


@pytest.mark.parametrize(
    ("answer", "own"),
    [
        (ex._muon_factor_inverted, "the wide matrix's step was scaled up"),
        (ex._muon_factor_no_sqrt, "the square root of out / in"),
        (ex._muon_factor_no_max, "the factor never goes below 1"),
        (ex._muon_no_scaling, "the tall matrix moved by lr alone"),
    ],
)
def test_each_slip_of_the_shape_factor_is_named(answer, own: str) -> None:  # noqa: ANN001
    """On a tall matrix the inverted ratio gives the factor 1, as no factor at all does: it is told "moved by lr
    alone", which is what happened; the wide case names the inversion itself."""
    result = ex.muon_update.run(answer)
    failed = [text for ok, text in result.lines if not ok]
    assert failed and any(own in text for text in failed), result.report()
    for text in failed:
        assert own in text or (answer is ex._muon_factor_inverted and "moved by lr alone" in text), text


# ------------------------------------------------------------------ chapter 11's figures


def _draw(fig: matplotlib.figure.Figure) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing-glyph or layout warning
        fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def _history(seconds: list[float], losses: list[float]) -> TextHistory:
    h = TextHistory()
    h.eval_step, h.eval_seconds, h.val_loss = list(range(len(seconds))), seconds, losses
    return h


def test_the_figures_draw() -> None:
    _draw(plots.soft_cap_curves((5.0, 15.0)))
    _draw(plots.activation_curves(("gelu_tanh", "relu", "relu2", "silu")))
    scores = torch.randn(6, 6)
    _draw(plots.rope_scores(scores, title="scores"))
    _draw(plots.singular_values({"a": torch.rand(5), "b": torch.randn(4, 6)}))
    fig = plots.loss_by_time({"a": _history([1.0, 2.0], [2.5, 2.2]), "b": _history([1.5], [2.4]).to_dict()}, target=2.3)
    assert "training time, CPU seconds" in fig.axes[0].get_xlabel()
    _draw(fig)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: plots.soft_cap_curves([]), TypeError, "caps"),
        (lambda: plots.soft_cap_curves([0.0]), ValueError, "caps"),
        (lambda: plots.soft_cap_curves((1.0,), x_range=(2.0, 1.0)), ValueError, "x_range"),
        (lambda: plots.activation_curves(("gelu", "swish")), ValueError, "names"),
        (lambda: plots.activation_curves("relu2"), TypeError, "names"),
        (lambda: plots.rope_scores(torch.randn(3, 4)), ValueError, "square"),
        (lambda: plots.rope_scores(torch.tensor([[float("nan")]])), ValueError, "scores"),
        (lambda: plots.singular_values({}), TypeError, "by_name"),
        (lambda: plots.singular_values({"a": torch.zeros(2, 2, 2)}), ValueError, "by_name"),
        (lambda: plots.loss_by_time({"a": {"val_loss": [1.0]}}), ValueError, "train_gpt"),
        (lambda: plots.loss_by_time({"a": _history([1.0, 2.0], [2.0])}), ValueError, "one length"),
        (lambda: plots.loss_by_time({"a": _history([1.0], [2.0])}, target="low"), TypeError, "target"),
    ],
)
def test_the_figures_refuse_bad_input_and_name_the_argument(call, error, words) -> None:  # noqa: ANN001
    with pytest.raises(error, match=words):
        call()
    plt.close("all")
