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
