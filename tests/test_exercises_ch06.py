"""Chapter 06's exercises: each reference agrees with the library and with PyTorch's own modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.exercises import ch06_encoder as ex


def test_predicted_parameter_count_is_the_layers_own() -> None:
    layer = tl.EncoderLayer(d_model=512, n_heads=8, d_ff=2048)
    assert ex.predict_encoder_layer_parameters.reference() == sum(p.numel() for p in layer.parameters())
    torch_layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    assert ex.predict_encoder_layer_parameters.reference() == sum(p.numel() for p in torch_layer.parameters())


def test_every_explained_count_is_wrong() -> None:
    right = ex.predict_encoder_layer_parameters.reference()
    assert right not in ex.predict_encoder_layer_parameters.explain


@pytest.mark.parametrize("norm_first", [True, False])
def test_encode_ragged_equals_each_sentence_alone_and_pytorchs_encoder(norm_first: bool) -> None:
    torch.manual_seed(0)
    ours = tl.Encoder(8, 2, 16, 2, dropout=0.0, norm_first=norm_first).double().eval()
    g = torch.Generator().manual_seed(1)
    sequences = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in (3, 6, 1)]
    got = ex._ragged_reference(ours, sequences)
    with torch.no_grad():
        for out, s in zip(got, sequences, strict=True):
            torch.testing.assert_close(out, ours(s[None])[0], rtol=0, atol=1e-10)
    # PyTorch's encoder with the same weights, given the padded batch and its key padding mask
    template = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first)
    theirs = nn.TransformerEncoder(
        template, 2, norm=nn.LayerNorm(8) if norm_first else None, enable_nested_tensor=False
    ).double()
    for mine, their in zip(ours.layers, theirs.layers, strict=True):
        attn = mine.self_attn
        with torch.no_grad():
            their.self_attn.in_proj_weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
            their.self_attn.in_proj_bias.copy_(torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
        their.self_attn.out_proj.load_state_dict(attn.w_o.state_dict())
        their.linear1.load_state_dict(mine.feed_forward.w1.state_dict())
        their.linear2.load_state_dict(mine.feed_forward.w2.state_dict())
        their.norm1.load_state_dict(mine.norm1.state_dict())
        their.norm2.load_state_dict(mine.norm2.state_dict())
    if norm_first:
        theirs.norm.load_state_dict(ours.norm.state_dict())
    theirs.train()  # the explicit path, no fast path writing zeros at padded positions
    x, real = ex._pad(sequences)
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=~real)
    for i, out in enumerate(got):
        torch.testing.assert_close(out, expected[i, : len(out)], rtol=0, atol=1e-10)


def test_encode_ragged_does_not_change_its_inputs_and_calls_the_encoder_once() -> None:
    encoder, sequences = ex._ragged_case([2, 4], 0)
    before = [s.clone() for s in sequences]
    ex._run_once(ex.encode_ragged.reference_copy(), encoder, sequences)
    assert all(torch.equal(a, b) for a, b in zip(before, sequences, strict=True))
    with pytest.raises(ValueError, match="ONE call"):
        ex._run_once(ex._ragged_one_by_one, encoder, sequences)


def test_shuffled_prediction_is_what_the_encoder_does() -> None:
    torch.manual_seed(0)
    encoder = tl.Encoder(16, 2, 32, 2, dropout=0.0).eval()
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    with torch.no_grad():
        out, out_shuffled = encoder(x), encoder(x[:, perm])
    assert ex.predict_shuffled_output.reference() == "shuffled"
    torch.testing.assert_close(out_shuffled, out[:, perm])
    assert not torch.allclose(out_shuffled, out)


@pytest.mark.parametrize("norm_first", [False, True])
def test_from_pytorch_layer_reference_equals_pytorchs_layer(norm_first: bool) -> None:
    theirs, x, mask = ex._pytorch_case(8, 2, 16, norm_first, 7, dtype=torch.float64, eps=1e-3)
    theirs.train()  # no fast path; dropout is 0.1, so compare with dropout off on both sides
    for module in theirs.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    theirs.self_attn.dropout = 0.0  # nn.MultiheadAttention keeps its dropout as a float
    ours = ex._from_pytorch_reference(theirs)
    assert isinstance(ours, tl.EncoderLayer) and ours.norm_first == norm_first and ours.training
    keep = mask[:, 0, 0, :]
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=~keep)
        got = ours(x, mask)
    torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=1e-10)


def test_from_pytorch_layer_leaves_pytorchs_layer_alone() -> None:
    theirs, _, _ = ex._pytorch_case(8, 2, 16, True, 3)
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    ours = ex._from_pytorch_reference(theirs)
    with torch.no_grad():
        ours.self_attn.w_q.weight.zero_()  # the copy owns its tensors
    assert all(torch.equal(before[k], v) for k, v in theirs.state_dict().items())


# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _ragged_loop_mask(encoder, sequences):  # noqa: ANN001, ANN202
    longest = max(s.shape[0] for s in sequences)
    x = torch.zeros(len(sequences), longest, sequences[0].shape[1])
    mask = torch.zeros(len(sequences), 1, 1, longest, dtype=torch.bool)
    for i, s in enumerate(sequences):
        x[i, : len(s)] = s
        mask[i, ..., : len(s)] = True
    out = encoder(x, mask)
    return [out[i, : len(s)] for i, s in enumerate(sequences)]


def _ragged_any_filler(encoder, sequences):  # noqa: ANN001, ANN202
    longest = max(map(len, sequences))
    x = torch.stack([torch.cat([s, s.new_full((longest - len(s), s.shape[1]), 3.0)]) for s in sequences])
    lengths = torch.tensor([len(s) for s in sequences])
    out = encoder(x, (torch.arange(longest) < lengths[:, None]).unsqueeze(1).unsqueeze(1))
    return tuple(o[:n] for o, n in zip(out, lengths, strict=True))


def _load_by_state_dict(theirs):  # noqa: ANN001, ANN202
    attn, sd = theirs.self_attn, theirs.state_dict()
    ours = tl.EncoderLayer(
        attn.embed_dim, attn.num_heads, theirs.linear1.out_features, norm_first=theirs.norm_first, eps=theirs.norm1.eps
    )
    new = {}
    for name, w, b in zip(
        "qkv", sd["self_attn.in_proj_weight"].chunk(3), sd["self_attn.in_proj_bias"].chunk(3), strict=True
    ):
        new[f"self_attn.w_{name}.weight"], new[f"self_attn.w_{name}.bias"] = w, b
    pairs = {"self_attn.w_o": "self_attn.out_proj", "feed_forward.w1": "linear1", "feed_forward.w2": "linear2"}
    pairs |= {"norm1": "norm1", "norm2": "norm2"}
    for mine, their in pairs.items():
        for part in ("weight", "bias"):
            new[f"{mine}.{part}"] = sd[f"{their}.{part}"]
    ours.load_state_dict(new)
    return ours.to(sd["linear1.weight"].dtype)


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.encode_ragged: [_ragged_loop_mask, _ragged_any_filler],
        ex.from_pytorch_layer: [_load_by_state_dict],
        ex.predict_shuffled_output: [lambda: "Shuffled", lambda: " shuffled.", lambda: "SHUFFLED"],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()


def test_a_word_that_is_not_a_choice_is_told_so(capsys) -> None:  # noqa: ANN001
    ex.predict_shuffled_output.check(lambda: "permuted")
    out = capsys.readouterr().out
    assert "none of them" in out and "All correct" not in out
