"""Attention and mask explorers (chapters 01-03).

Both return an ipywidgets box whose picture (an `ipywidgets.Image` holding a PNG of a matplotlib
figure) is redrawn whenever a control changes. They need no running kernel: in a plain Python
process, setting `explorer.scale.value = 4.0` redraws too, and `explorer.weights` / `explorer.mask`
hold what is drawn, so tests can check the update.

The weights shown are NOT trained: the word vectors come from a fixed table seeded by each word
(the same word always gets the same vector), and the multi-head projections are a
`tl.MultiHeadAttention` initialised from a fixed seed. They show the mechanics (what the scale
does, what each mask allows), not linguistic meaning.
"""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.attention import scaled_dot_product_attention
from transformer_lab.masking import causal_mask
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.plotting.attention import attention_heatmap, mask_picture
from transformer_lab.plotting.style import course_style

__all__ = ["attention_explorer", "mask_explorer", "word_vectors", "AttentionExplorer", "MaskExplorer"]

PAD = "<pad>"
MAX_TOKENS = 12
RAW = "word vectors (no projections)"


def word_vectors(tokens: Sequence[str], d_model: int = 16) -> Tensor:
    """A fixed, untrained embedding: each word gets a unit-variance random vector seeded by the word.

    The seed is a CRC32 of the lower-cased word, so the vectors are the same in every process and
    on every machine; the same word always gets the same vector.

    Shape:
        returns (len(tokens), d_model) float32.
    """
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not all(isinstance(t, str) for t in tokens):
        # a generator would be used up by this check and then give no vectors at all
        raise TypeError(
            f"tokens must be a sequence of strings, e.g. 'the cat sat'.split(), got {type(tokens).__name__}"
        )
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    rows = []
    for token in tokens:
        generator = torch.Generator().manual_seed(zlib.crc32(token.lower().encode("utf-8")))
        rows.append(torch.randn(d_model, generator=generator))
    if not rows:
        return torch.zeros(0, d_model)
    return torch.stack(rows)  # (L, D)


def _tokenize(sentence: str) -> list[str]:
    return sentence.split()[:MAX_TOKENS]


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _new_figure(size: tuple[float, float]) -> Figure:
    with course_style():
        return Figure(figsize=size, layout="constrained")


class AttentionExplorer(widgets.VBox):
    """The widget returned by `attention_explorer` (see there). Attributes:

    sentence, scale, head: the controls (Text, FloatLogSlider, Dropdown);
    tokens: the current tokens; weights: the (T, T) numpy weights drawn; figure: the matplotlib Figure;
    image: the ipywidgets.Image showing it.
    """

    def __init__(self, sentence: str, d_model: int, n_heads: int, seed: int) -> None:
        self.d_model = d_model
        self.n_heads = n_heads
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.attention = MultiHeadAttention(d_model, n_heads).eval()  # untrained, fixed by `seed`
        torch.random.set_rng_state(generator_state)  # leave the learner's random stream untouched
        self.sentence = widgets.Text(value=sentence, description="sentence", continuous_update=False)
        self.scale = widgets.FloatLogSlider(
            value=1.0, base=2, min=-4, max=4, step=0.25, description="scale", readout_format=".3g"
        )
        options = [RAW] + [f"head {h + 1}" for h in range(n_heads)]
        self.head = widgets.Dropdown(options=options, value=RAW, description="view")
        self.image = widgets.Image(format="png")
        self.figure = _new_figure((5.2, 4.4))
        self.tokens: list[str] = []
        self.weights = np.zeros((0, 0))
        super().__init__(
            [widgets.HBox([self.sentence, self.head]), self.scale, self.image],
            layout=widgets.Layout(width="auto"),
        )
        for control in (self.sentence, self.scale, self.head):
            control.observe(self._update, names="value")
        self._update()

    def compute(self) -> np.ndarray:
        """The (T, T) weights for the current sentence, scale and view."""
        x = word_vectors(self.tokens, self.d_model)[None]  # (1, T, D)
        scale = float(self.scale.value)
        with torch.no_grad():
            if self.head.value == RAW:
                # raw dot products of the word vectors: softmax(scale * x x^T / sqrt(D))
                _, weights = scaled_dot_product_attention(x * scale, x, x)  # (1, T, T)
                return weights[0].numpy()
            h = self.head.options.index(self.head.value) - 1
            q, k, v = (
                self.attention.split_heads(w(x)) for w in (self.attention.w_q, self.attention.w_k, self.attention.w_v)
            )
            # multiplying the queries by `scale` multiplies every score by it
            _, weights = scaled_dot_product_attention(q * scale, k, v)  # (1, H, T, T)
            return weights[0, h].numpy()

    def _update(self, change: object = None) -> None:
        self.tokens = _tokenize(self.sentence.value)
        self.figure.clear()
        ax = self.figure.add_subplot()
        if not self.tokens:
            self.weights = np.zeros((0, 0))
            ax.set_title("type a sentence (words separated by spaces)")
            ax.set_xlabel("key (attended to)")
            ax.set_ylabel("query (attending)")
        else:
            self.weights = self.compute()
            view = "dot products" if self.head.value == RAW else self.head.value
            title = f"{view}, scale x{self.scale.value:.3g} (untrained)"
            attention_heatmap(self.weights, self.tokens, self.tokens, title=title, ax=ax)
        self.image.value = _png(self.figure)

    def __repr__(self) -> str:
        return f"AttentionExplorer(tokens={len(self.tokens)}, view={self.head.value!r}, scale={self.scale.value:.3g})"


def attention_explorer(
    sentence: str = "the cat sat on the mat because it was tired",
    d_model: int = 16,
    n_heads: int = 4,
    seed: int = 0,
) -> AttentionExplorer:
    """An attention map that redraws live (chapters 01 and 03).

    Controls: the sentence (words separated by spaces, at most 12 are used); `scale`, a factor
    multiplying every score before the softmax (1 is the paper's Q K^T / sqrt(d_k); large values
    are a low temperature and make the softmax peaky, small ones flatten it); `view`, either the
    raw dot products of the word vectors (chapter 01: attention(x, x, x) without projections) or
    one head of an untrained `tl.MultiHeadAttention(d_model, n_heads)` built from `seed` (chapter 03).

    Nothing here is trained: word vectors come from `word_vectors` (random, seeded by the word).

    Returns:
        an `AttentionExplorer` (an ipywidgets.VBox); display it in a notebook cell.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    for name, value in (("d_model", d_model), ("n_heads", n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (it fixes the untrained attention's weights), got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return AttentionExplorer(sentence, d_model, n_heads, seed)


class MaskExplorer(widgets.VBox):
    """The widget returned by `mask_explorer` (see there). Attributes:

    sequence, causal, padding: the controls; tokens: the padded tokens of the chosen sequence;
    mask: the (T, T) bool mask drawn (True = may attend); weights: the resulting (T, T) weights;
    figure, image: the matplotlib Figure and the ipywidgets.Image showing it.
    """

    def __init__(self, sentences: Sequence[str], d_model: int) -> None:
        self.d_model = d_model
        rows = [_tokenize(s) for s in sentences]
        self.length = max(len(r) for r in rows)
        self.batch = [r + [PAD] * (self.length - len(r)) for r in rows]  # padded to the longest
        labels = [f"{i}: {' '.join(r)}" for i, r in enumerate(rows)]
        self.sequence = widgets.Dropdown(options=list(zip(labels, range(len(rows)), strict=True)), value=0)
        self.sequence.description = "sequence"
        self.causal = widgets.Checkbox(value=True, description="causal mask")
        self.padding = widgets.Checkbox(value=True, description="padding mask")
        self.image = widgets.Image(format="png")
        self.figure = _new_figure((9.0, 3.9))
        self.tokens: list[str] = []
        self.mask = np.zeros((0, 0), dtype=bool)
        self.weights = np.zeros((0, 0))
        super().__init__([self.sequence, widgets.HBox([self.causal, self.padding]), self.image])
        for control in (self.sequence, self.causal, self.padding):
            control.observe(self._update, names="value")
        self._update()

    def compute(self) -> tuple[np.ndarray, np.ndarray]:
        """(mask, weights) for the chosen sequence: both (T, T)."""
        self.tokens = self.batch[self.sequence.value]
        t = self.length
        mask = torch.ones(t, t, dtype=torch.bool)  # (T, T): everything allowed
        if self.padding.value:
            mask = mask & torch.tensor([tok != PAD for tok in self.tokens])[None, :]  # (1, S): keys only
        if self.causal.value:
            mask = mask & causal_mask(t)  # (T, T)
        x = word_vectors(self.tokens, self.d_model) / math.sqrt(self.d_model)  # (T, D), milder scores
        with torch.no_grad():
            _, weights = scaled_dot_product_attention(x, x, x, mask)  # (T, T)
        return mask.numpy(), weights.numpy()

    def _update(self, change: object = None) -> None:
        self.mask, self.weights = self.compute()
        self.figure.clear()
        left, right = self.figure.subplots(1, 2)
        on = [name for name, flag in (("causal", self.causal.value), ("padding", self.padding.value)) if flag]
        mask_picture(self.mask, self.tokens, self.tokens, title="mask: " + (" & ".join(on) or "none"), ax=left)
        attention_heatmap(
            self.weights, self.tokens, self.tokens, title="weights (untrained vectors)", ax=right, annotate=False
        )
        self.image.value = _png(self.figure)

    def __repr__(self) -> str:
        return f"MaskExplorer(sequence={self.sequence.value}, causal={self.causal.value}, padding={self.padding.value})"


def mask_explorer(
    sentences: Sequence[str] = ("a dog ran", "the cat sat on the mat", "hello world", "we like to code in python"),
    d_model: int = 16,
) -> MaskExplorer:
    """Masks on a padded batch, live (chapter 02).

    The sentences (split on spaces, at most 12 words each) are padded with "<pad>" to the longest
    one. Choose a sequence, switch the causal and the padding mask on or off, and see the
    combined (T, T) mask (True = may attend, drawn blue) and the attention weights it produces
    over untrained word vectors (`word_vectors`, scaled by 1/sqrt(d_model)). A padding mask hides
    padded KEYS (columns); padded queries (rows) still compute something, which is thrown away later.

    Returns:
        a `MaskExplorer` (an ipywidgets.VBox); display it in a notebook cell.
    """
    if (
        isinstance(sentences, str)
        or not isinstance(sentences, Sequence)  # a generator would be used up by the checks below
        or not sentences
        or not all(isinstance(s, str) for s in sentences)
    ):
        raise TypeError(f"sentences must be a non-empty sequence of strings (a list), got {type(sentences).__name__}")
    if any(not s.split() for s in sentences):
        raise ValueError("every sentence must contain at least one word")
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    return MaskExplorer(list(sentences), d_model)
