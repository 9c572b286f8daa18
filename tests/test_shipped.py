"""tl.shipped: the trained date model's attention maps for the early chapters."""

from __future__ import annotations

import pytest
import torch

from transformer_lab import shipped


def test_date_attention_maps_are_trained_weights_with_labels():
    maps = shipped.date_attention("21 Nov 2026")
    assert maps.target == "2026-11-21"  # the shipped model normalises the date
    assert maps.source_labels == list("21␣Nov␣2026")  # a space is drawn as ␣
    assert maps.target_labels[0] == "<bos>" and "".join(maps.target_labels[1:]) == "2026-11-21"
    s, t = len(maps.source_labels), len(maps.target_labels)
    assert [tuple(w.shape) for w in maps.encoder_self] == [(4, s, s)] * 2
    assert [tuple(w.shape) for w in maps.decoder_self] == [(4, t, t)] * 2
    assert [tuple(w.shape) for w in maps.cross] == [(4, t, s)] * 2
    for weights in maps.encoder_self + maps.decoder_self + maps.cross:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    for weights in maps.decoder_self:  # causal: nothing above the diagonal
        assert torch.all(weights.triu(diagonal=1) == 0)


def test_date_attention_follows_a_given_target_and_refuses_bad_input():
    maps = shipped.date_attention("2026年11月21日", target="2026-11-21")
    assert maps.source_labels[4] == "年"
    with pytest.raises(TypeError, match="text"):
        shipped.date_attention(20261121)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="target"):
        shipped.date_attention("21 Nov 2026", target=5)  # type: ignore[arg-type]
