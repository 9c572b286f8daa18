"""tl.widgets.attention: the attention and mask explorers, driven without a kernel."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import transformer_lab as tl  # noqa: E402
from transformer_lab.widgets.attention import PAD, word_vectors  # noqa: E402


def test_word_vectors_are_fixed_per_word() -> None:
    a = word_vectors(["the", "cat", "The"], d_model=8)
    assert a.shape == (3, 8)
    torch.testing.assert_close(a[0], a[2])  # lower-cased: same word, same vector
    torch.testing.assert_close(a, word_vectors(["the", "cat", "The"], d_model=8))
    assert not torch.allclose(a[0], a[1])
    with pytest.raises(TypeError, match="sequence of strings"):
        word_vectors("the cat")
    with pytest.raises(ValueError, match="d_model"):
        word_vectors(["a"], d_model=0)


def test_attention_explorer_updates_on_scale() -> None:
    explorer = tl.widgets.attention_explorer("the cat sat on the mat")
    assert explorer.tokens == ["the", "cat", "sat", "on", "the", "mat"]
    np.testing.assert_allclose(explorer.weights.sum(axis=-1), 1.0, rtol=1e-6)
    png, before = bytes(explorer.image.value), explorer.weights.copy()
    assert png.startswith(b"\x89PNG")
    explorer.scale.value = 8.0
    assert bytes(explorer.image.value) != png
    # a larger scale (a lower temperature) makes every row peakier
    assert np.all(explorer.weights.max(axis=-1) >= before.max(axis=-1) - 1e-6)
    # the raw view is softmax(scale * x x^T / sqrt(D)) of the word vectors
    x = word_vectors(explorer.tokens, 16)
    expected = torch.softmax(8.0 * x @ x.T / 4.0, dim=-1)
    np.testing.assert_allclose(explorer.weights, expected.numpy(), rtol=1e-5, atol=1e-6)
    title = explorer.figure.axes[0].get_title()
    assert "scale x8" in title and "untrained" in title


def test_attention_explorer_head_selector_matches_multihead_attention() -> None:
    explorer = tl.widgets.attention_explorer("a b c d", d_model=8, n_heads=2, seed=3)
    explorer.head.value = "head 2"
    x = word_vectors(["a", "b", "c", "d"], 8)[None]
    explorer.attention(x, x, x)  # the module itself, recording its weights
    np.testing.assert_allclose(explorer.weights, explorer.attention.attention_weights[0, 1].numpy(), rtol=1e-5)
    assert "head 2" in explorer.figure.axes[0].get_title()
    assert repr(explorer) == "AttentionExplorer(tokens=4, view='head 2', scale=1)"


def test_attention_explorer_sentence_and_empty_input() -> None:
    explorer = tl.widgets.attention_explorer("one two")
    explorer.sentence.value = "   "
    assert explorer.weights.shape == (0, 0)  # no crash on an empty sentence
    explorer.sentence.value = " ".join(str(i) for i in range(20))
    assert explorer.weights.shape == (12, 12)  # capped
    labels = [t.get_text() for t in explorer.figure.axes[0].get_xticklabels()]
    assert labels == [str(i) for i in range(12)]


def test_attention_explorer_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tl.widgets.attention_explorer("x y")
    torch.testing.assert_close(torch.rand(3), expected)


def test_attention_explorer_bad_arguments() -> None:
    with pytest.raises(TypeError, match="sentence"):
        tl.widgets.attention_explorer(["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divisible"):
        tl.widgets.attention_explorer("a", d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="n_heads"):
        tl.widgets.attention_explorer("a", n_heads=0)


def test_mask_explorer_combines_causal_and_padding() -> None:
    explorer = tl.widgets.mask_explorer(["a b c d", "e f"])
    assert explorer.tokens == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(explorer.mask, tl.causal_mask(4).numpy())
    explorer.sequence.value = 1
    assert explorer.tokens == ["e", "f", PAD, PAD]
    tokens = torch.tensor([[5, 6, 0, 0]])
    np.testing.assert_array_equal(explorer.mask, tl.target_mask(tokens, 0)[0, 0].numpy())
    assert np.all(explorer.weights[:, 2:] == 0)  # no weight on padded keys
    png = bytes(explorer.image.value)
    explorer.causal.value = False
    np.testing.assert_array_equal(explorer.mask, tl.padding_mask(tokens, 0)[0, 0].expand(4, 4).numpy())
    assert bytes(explorer.image.value) != png
    explorer.padding.value = False
    assert explorer.mask.all()
    np.testing.assert_allclose(explorer.weights.sum(-1), 1.0, rtol=1e-6)
    assert explorer.figure.axes[0].get_title() == "mask: none"
    assert repr(explorer) == "MaskExplorer(sequence=1, causal=False, padding=False)"


def test_mask_explorer_weights_match_the_library() -> None:
    explorer = tl.widgets.mask_explorer(["p q r", "s"], d_model=4)
    explorer.sequence.value = 1
    x = word_vectors(explorer.tokens, 4) / 2.0
    mask = torch.from_numpy(explorer.mask)
    _, expected = tl.scaled_dot_product_attention(x, x, x, mask)
    np.testing.assert_allclose(explorer.weights, expected.numpy(), rtol=1e-6)


def test_mask_explorer_bad_arguments() -> None:
    with pytest.raises(TypeError, match="sentences"):
        tl.widgets.mask_explorer("one sentence")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one word"):
        tl.widgets.mask_explorer(["a", "  "])
