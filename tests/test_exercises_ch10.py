"""Chapter 10's exercises: each reference agrees with the library's GPT and with PyTorch, in float64."""

from __future__ import annotations

import pytest
import torch

import transformer_lab as tl
from transformer_lab.exercises import ch10_gpt as ex
from transformer_lab.gpt import GPT, GPTConfig, filter_logits


def test_masked_entries_is_what_the_tril_mask_removes() -> None:
    tril = torch.tril(torch.ones(5, 5))  # note 004's buffer
    scores = torch.zeros(5, 5).masked_fill(tril == 0, float("-inf"))
    assert int(torch.isinf(scores).sum()) == ex.predict_masked_entries.reference()
    assert int((~tl.causal_mask(5)).sum()) == ex.predict_masked_entries.reference()  # the course's convention
    assert ex.predict_masked_entries.reference() not in ex.predict_masked_entries.explain


def test_predicted_parameters_are_the_chapters_gpt() -> None:
    model = GPT(GPTConfig(vocab_size=65, block_size=64, d_model=128, n_heads=4, n_layers=4))
    assert sum(p.numel() for p in model.parameters()) == ex.predict_gpt_parameters.reference()
    assert ex.predict_gpt_parameters.reference() not in ex.predict_gpt_parameters.explain
    untied = GPT(GPTConfig(vocab_size=65, block_size=64, d_model=128, n_heads=4, n_layers=4, tie_embeddings=False))
    assert sum(p.numel() for p in untied.parameters()) == ex.predict_gpt_parameters.reference() + 65 * 128


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _chapters_gpt(**changes: object) -> GPT:
    config = dict(vocab_size=65, block_size=64, d_model=128, n_heads=4, n_layers=4) | changes
    return GPT(GPTConfig(**config))


def _slips() -> dict[str, tuple[int, str]]:
    """Each natural slip in counting the chapter's GPT, built as a model (or read off one), with a phrase the
    feedback for it must contain."""
    model = _chapters_gpt()
    right = _count(model)
    layer_norms = [norm for layer in model.layers for norm in (layer.norm1, layer.norm2)] + [model.norm]
    attention = [layer.self_attn for layer in model.layers]
    qkv = sum(_count(w) for a in attention for w in (a.w_q, a.w_k, a.w_v))
    return {
        "an untied head": (_count(_chapters_gpt(tie_embeddings=False)), "tied"),
        "no position table": (_count(_chapters_gpt(positions="rope")), "learns its positions"),
        "d_ff = D": (_count(_chapters_gpt(ff_width=128)), "4 x wider"),
        "no Linear biases": (
            right
            - sum(m.bias.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None),
            "biases",
        ),
        "no biases at all (bias=False)": (_count(_chapters_gpt(bias=False)), "shift"),
        "no LayerNorms": (right - sum(_count(m) for m in layer_norms), "LayerNorms have parameters"),
        "a gain but no shift (RMSNorm-sized)": (_count(_chapters_gpt(norm="rms")), "2D numbers"),
        "no ln_f": (right - _count(model.norm), "ln_f"),
        "no W^O": (right - sum(_count(a.w_o) for a in attention), "W^O"),
        "a D x D W^Q, W^K, W^V per head": (right + 3 * qkv, "heads share"),
        "one block": (_count(_chapters_gpt(n_layers=1)), "4 blocks"),
    }


def test_each_natural_slip_in_the_count_gets_its_own_reason() -> None:
    slips = _slips()
    explain = ex.predict_gpt_parameters.explain
    counts = [count for count, _ in slips.values()]
    assert len(set(counts)) == len(counts), "two slips give the same count: the feedback could not tell them apart"
    assert set(explain) == set(counts), (
        f"feedback for counts no slip gives: {sorted(set(explain) - set(counts))}; "
        f"slips without feedback: {sorted(set(counts) - set(explain))}"
    )
    for slip, (count, phrase) in slips.items():
        assert phrase in explain[count], f"{slip} gives {count:,}, whose feedback is {explain[count]!r}"
        said = ex.predict_gpt_parameters._explain_wrong(count)
        assert phrase in said and "809" not in said  # the reason, never the answer
    assert slips["d_ff = D"][0] == 415_104  # the count issue 35 found without a targeted hint
    assert sorted(w() for w in ex.predict_gpt_parameters.wrong) == sorted(counts)
    for wrong in ex.predict_gpt_parameters.wrong:
        assert not ex.predict_gpt_parameters.passes(wrong)


@pytest.mark.parametrize("case", range(5))
def test_conv1d_heads_equal_the_converted_models_projections(case: int) -> None:
    x, weight, bias, n_heads = ex.conv1d_qkv_heads.cases[case].inputs()
    d = x.shape[-1]
    # a one-block GPT-2 state dict around this c_attn, converted by the library's own GPT.from_gpt2
    torch.manual_seed(case)
    sd = {
        "wte.weight": torch.randn(3, d, dtype=torch.float64),
        "wpe.weight": torch.randn(x.shape[1], d, dtype=torch.float64),
        "ln_f.weight": torch.ones(d, dtype=torch.float64),
        "ln_f.bias": torch.zeros(d, dtype=torch.float64),
        "h.0.ln_1.weight": torch.ones(d, dtype=torch.float64),
        "h.0.ln_1.bias": torch.zeros(d, dtype=torch.float64),
        "h.0.ln_2.weight": torch.ones(d, dtype=torch.float64),
        "h.0.ln_2.bias": torch.zeros(d, dtype=torch.float64),
        "h.0.attn.c_attn.weight": weight,
        "h.0.attn.c_attn.bias": bias,
        "h.0.attn.c_proj.weight": torch.randn(d, d, dtype=torch.float64),
        "h.0.attn.c_proj.bias": torch.zeros(d, dtype=torch.float64),
        "h.0.mlp.c_fc.weight": torch.randn(d, 4 * d, dtype=torch.float64),
        "h.0.mlp.c_fc.bias": torch.zeros(4 * d, dtype=torch.float64),
        "h.0.mlp.c_proj.weight": torch.randn(4 * d, d, dtype=torch.float64),
        "h.0.mlp.c_proj.bias": torch.zeros(d, dtype=torch.float64),
    }
    attention = GPT.from_gpt2(sd, n_heads=n_heads).layers[0].self_attn
    with torch.no_grad():
        expected = tuple(attention.split_heads(w(x)) for w in (attention.w_q, attention.w_k, attention.w_v))
        got = ex._conv1d_heads_reference(x, weight, bias, n_heads)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == (x.shape[0], n_heads, x.shape[1], d // n_heads)
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", range(6))
def test_top_p_reference_equals_the_librarys_filter(case: int) -> None:
    logits, top_p = ex.top_p_filter.cases[case].inputs()
    logits = logits.double()
    got = ex._top_p_reference(logits, top_p)
    expected = filter_logits(logits, top_p=top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got[~torch.isinf(got)], logits[~torch.isinf(got)], rtol=0, atol=0)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50, 30, dtype=torch.float64) * 2
    kept = ~torch.isinf(ex._top_p_reference(logits, 0.7))
    probs = torch.softmax(logits, dim=-1)
    assert ((probs * kept).sum(-1) >= 0.7).all()  # the kept mass reaches top_p ...
    smallest_kept = torch.where(kept, probs, torch.inf).min(-1).values
    assert ((probs * kept).sum(-1) - smallest_kept < 0.7).all()  # ... and no kept token could be dropped
