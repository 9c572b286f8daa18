"""A decoder-only GPT (note 004's reading of nanoGPT) built from the course's own modules (chapter 10).

    idx (B, T) -> token embedding + learned position embedding -> N Pre-Norm blocks -> LayerNorm -> head -> logits

Each block is chapter 06's `EncoderLayer` (Pre-Norm, `norm_first=True`) called with a causal mask. GPT's block
is exactly "x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))" (note 004's `Block`): one self-attention and one
feed-forward network, which is an encoder layer. Chapter 07's `DecoderLayer` would bring a cross-attention and a
third LayerNorm that a decoder-only model has nothing to feed (there is no encoder memory; its `forward` even
requires one): parameters that never receive a gradient, and state-dict keys GPT-2 does not have.
"Decoder-only" names what the model does (predict the next token without seeing the future), and that is the
mask, not the layer. The one thing a decoder adds that generation needs is the KV
cache; `_cached_layer` below runs an `EncoderLayer` with one, from the layer's own sub-modules (`project_kv`,
`attend`, `norm1`, `feed_forward`, ...), and is tested equal to the layer's `forward`. A step of one token
(each step of `generate` after the prompt) goes faster still through `_decode_step`: the same arithmetic
straight from the weights, without calling the modules (why, and when it may not, is written above it).

How the names map onto nanoGPT / GPT-2 (what `GPT.from_gpt2` converts):

    wte -> token_embedding        h.i.ln_1 -> layers.i.norm1        h.i.mlp.c_fc   -> layers.i.feed_forward.w1
    wpe -> position_embedding     h.i.attn.c_attn -> w_q, w_k, w_v  h.i.mlp.c_proj -> layers.i.feed_forward.w2
    ln_f -> norm                  h.i.attn.c_proj -> w_o            h.i.ln_2       -> layers.i.norm2
    lm_head -> lm_head (tied to token_embedding)

Chapter 11 turns the same model, switch by switch, into a 2026 decoder (`GPTConfig`'s fields after
`activation`; GPT-2's behaviour is every default). How the switches depart from GPT-2, and where each lives:

    positions="rope"              no wpe; each head's q and k turned by their position (`tl.modern.RotaryEmbedding`)
    norm="rms" / "rms_no_weight"  `nn.RMSNorm` (with or without gains) for every LayerNorm
    embedding_norm=True           one more norm right after the embedding (nanochat)
    qk_norm="rms" / ...           RMSNorm over each head's queries and keys (`MultiHeadAttention.q_norm`, `k_norm`)
    activation="relu2" / "swiglu" ReLU^2 in `FeedForward`, or the gated `SwiGLU` (three matrices)
    n_kv_heads, head_dim          grouped-query attention (a KV cache of H_kv heads), a head size apart from D / H
    logit_softcap=c               logits = c tanh(logits / c)
    zero_init_output=True         W^O and W_2 start at zero
    window_pattern="SSSL", window sliding-window attention in the "S" layers (nanochat; Mistral, Gemma)
    windows=(None, 512, ...)      each layer's window written out (Hugging Face's Qwen3 and Mistral, `tl.hf`)
    init="nanochat"               nanochat's initialisation (N(0, 1) embedding, fan-in scaled matrices)
    bias=False, tie_embeddings=False   (chapter 10's switches) no biases, an untied head

A block stays chapter 06's `EncoderLayer`; the switches choose the attention, feed-forward network and norms
inside it (`_block`). `tl.hf` reads Llama and Qwen3 checkpoints into this model.

Shape legend: B batch, T length, D d_model, H heads, H_kv key/value heads, d_k = D / H (or head_dim),
V vocabulary size, N n_layers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import (
    check_bool,
    check_positive_int,
    check_probability,
    check_tensor,
    check_tokens,
    trusted,
)
from transformer_lab.attention import attention as scaled_attention
from transformer_lab.decoder import DecoderCache, LayerCache
from transformer_lab.embedding import LearnedPositionalEmbedding
from transformer_lab.encoder import EncoderLayer
from transformer_lab.feedforward import _ACTIVATIONS, FeedForward, SwiGLU, swiglu_width
from transformer_lab.masking import causal_mask
from transformer_lab.modern import (
    ROPE_LAYOUTS,
    Float32RMSNorm,
    RopeScaling,
    RotaryEmbedding,
    sliding_window_mask,
    soft_cap,
)
from transformer_lab.multihead import MultiHeadAttention, repeat_kv_heads
from transformer_lab.normalization import LayerNorm
from transformer_lab.residual import sublayer_connection

__all__ = ["GPTConfig", "GPT", "filter_logits", "load_gpt2_state_dict", "load_gpt2", "cache_bytes"]


@dataclass(frozen=True)
class GPTConfig:
    """Every size and switch of a `GPT`, frozen and checked when created (chapter 10); nanoGPT's `GPTConfig`.

    The first nine fields are chapter 10's GPT-2. The others are chapter 11's switches towards a 2026 decoder
    (Llama 3, Qwen3, Gemma, nanochat); each is one change, and its default is GPT-2's behaviour, so a config
    that sets none of them (or a checkpoint saved before they existed) is chapter 10's model, unchanged.

    Args:
        vocab_size: V, the number of token ids.
        block_size: the context length: the number of learned positions, the longest `idx` `forward` takes.
        d_model: D (nanoGPT's n_embd).
        n_heads: H; d_model must be divisible by it unless head_dim is given.
        n_layers: N, the number of blocks.
        dropout: dropout after the embeddings, on the attention weights, inside the feed-forward network
            and on each block's two residual branches (GPT-2 has no dropout inside the feed-forward network;
            with dropout=0.0, the default here, the two are the same model).
        bias: whether the Linear layers and LayerNorms have biases (GPT-2: True; nanoGPT offers False; Llama,
            Qwen3 and nanochat: False).
        tie_embeddings: the output head shares the token embedding's (V, D) matrix (weight tying, as GPT-2;
            False: an untied head, as Llama 3 8B, Qwen3 8B and nanochat).
        activation: the feed-forward network: "gelu_tanh" (GPT-2's tanh approximation of GELU), "gelu", "relu",
            "relu2" (ReLU squared, nanochat / modded-nanogpt) or "swiglu" (the gated `SwiGLU` of Llama and
            Qwen3: three matrices, so a narrower hidden width, see `d_ff`).
        positions: "learned" (GPT-2: a trained vector per position added to the token embedding) or "rope"
            (rotary position embeddings: no position vectors, each head's queries and keys are turned by
            their position inside attention; Su et al., 2021).
        rope_base: the base of the rotary frequencies, omega_i = rope_base^(-2i / d_k) (10000 as in the
            RoPE paper; Llama 3 500000, Qwen3 1000000). Only with positions="rope".
        rope_layout: which features form the pairs that RoPE turns: "pairs" (2i, 2i+1), as chapter 08 and
            the RoPE paper write it, or "halves" (i, i + d_k/2), as Hugging Face's checkpoints expect. Two
            conventions for one model: `tl.hf` permutes W^Q and W^K rows to go from one to the other.
        rope_scaling: Llama 3's frequency scaling (`tl.modern.RopeScaling`, or a dict of its fields), or None.
        norm: every normalisation of the model (the two per block, the final one, the optional one after the
            embedding): "layer" (LayerNorm, GPT-2), "rms" (RMSNorm with a gain, Llama / Qwen3; PyTorch's
            `nn.RMSNorm`) or "rms_no_weight" (RMSNorm without parameters, nanochat).
        norm_eps: the epsilon of every norm (GPT-2 1e-5; Llama 3 1e-5, Qwen3 1e-6).
        embedding_norm: one more norm right after the token (and position) embedding (nanochat).
        qk_norm: None (GPT-2), "rms" or "rms_no_weight": an RMSNorm over each head's queries and keys
            (d_k features) after their projections and before RoPE (Qwen3 with a gain, nanochat without).
        n_kv_heads: the number of key/value heads (grouped-query attention, Ainslie et al., 2023); it must
            divide n_heads. None: n_heads (multi-head attention, GPT-2); 1: multi-query attention. The KV cache
            holds only these heads (`GPT.kv_cache_bytes`).
        head_dim: d_k, the size of each head; None: d_model / n_heads (GPT-2). Qwen3 sets it apart from D / H.
        ff_width: the feed-forward hidden width, overriding the rule of `d_ff` (Llama and Qwen3 set it in
            their config as intermediate_size); None: the rule.
        logit_softcap: c in logits = c * tanh(logits / c) (Gemma 2, nanochat: 15); None: no cap (GPT-2).
        zero_init_output: start the two projections that write into the residual stream (W^O and the
            feed-forward network's W_2) at zero, so that every block starts as the identity (nanochat,
            modded-nanogpt); False: GPT-2's 0.02 / sqrt(2 N).
        hf_float32: compute RMSNorm (its statistic) and the rotary tables in float32 whatever the model's
            dtype, as Hugging Face's Llama and Qwen3 do (`tl.modern.Float32RMSNorm`): the same model, rounded
            as theirs is, so that a float64 copy of one equals it to 1e-10 rather than 1e-6 (`tl.hf`).
        window_pattern: sliding-window attention, layer by layer, as nanochat writes it: a string of "S" (a
            short window: the query at position i sees only the keys at i - window < j <= i) and "L" (the full
            causal context), tiled over the layers, the LAST layer always "L" (nanochat's rule: the top of the
            model sees the whole context). "SSSL" is nanochat's default; Gemma 3 interleaves five local layers
            per global one, and Mistral 7B windows every layer. None (GPT-2): every layer sees the whole context.
            Works with both attention paths, rotary or learned positions, and the KV cache: a cached step of an
            "S" layer attends to the last `window` keys only (the cache still keeps every key).
        window: the short window, in keys counted with the query's own (Hugging Face's `sliding_window`
            counts them so; nanochat's flash-attention `window_size=(left, 0)` counts the keys before it,
            left = window - 1). None: a quarter of block_size, rounded up. nanochat's short window has been a
            quarter of its context since March 2026, counted as its `left`, so one key more in this count (from
            January 2026, when the pattern came, it was half); nanochat then rounds it up to a multiple of 128,
            its kernel's tile, which a 64-token context has no use for. A window of block_size or more is the
            full context. Only with window_pattern.
        windows: each layer's window written out, instead of a pattern: a tuple of n_layers entries, each a
            window (a positive int, counted as `window` is) or None (the full context). Any layer may be
            windowed, the last one too: Hugging Face's Qwen3 windows the layers from max_window_layers on, the
            top of the model included, and Mistral 7B every layer, which nanochat's rule (the last layer full)
            cannot write. Not together with window_pattern or window. None (the default): the pattern decides.
        init: "gpt2" (GPT-2's N(0, 0.02^2), `reset_parameters`) or "nanochat" (nanochat's `init_weights`, in
            the version of January 2026 the chapter describes: token embedding N(0, 1), head N(0, 0.001^2),
            W^Q, W^K, W^V and the feed-forward network's first matrices uniform with std 1 / sqrt(fan_in), W^O
            and W_2 zero). nanochat's head starts near zero and its embedding at 1, so it needs
            tie_embeddings=False.
    """

    vocab_size: int
    block_size: int = 256
    d_model: int = 384
    n_heads: int = 6
    n_layers: int = 6
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True
    activation: str = "gelu_tanh"
    # Chapter 11's switches; each default is GPT-2's behaviour.
    positions: str = "learned"
    rope_base: float = 10000.0
    rope_layout: str = "pairs"
    rope_scaling: RopeScaling | None = None
    norm: str = "layer"
    norm_eps: float = 1e-5
    embedding_norm: bool = False
    qk_norm: str | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    ff_width: int | None = None
    logit_softcap: float | None = None
    zero_init_output: bool = False
    hf_float32: bool = False
    window_pattern: str | None = None
    window: int | None = None
    windows: tuple[int | None, ...] | None = None
    init: str = "gpt2"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "d_model", "n_heads", "n_layers"):
            check_positive_int(name, getattr(self, name))
        check_probability("dropout", self.dropout)
        for name in ("bias", "tie_embeddings", "embedding_norm", "zero_init_output", "hf_float32"):
            check_bool(name, getattr(self, name))
        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads so that each head gets d_k = d_model / n_heads features: "
                f"got d_model={self.d_model}, n_heads={self.n_heads} (or set head_dim)"
            )
        for name in ("head_dim", "n_kv_heads", "ff_width"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_kv_heads must divide n_heads, so that each key/value head serves the same number of query "
                f"heads: got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        _check_choice("activation", self.activation, (*_ACTIVATIONS, "swiglu"))
        _check_choice("positions", self.positions, POSITIONS)
        _check_choice("rope_layout", self.rope_layout, ROPE_LAYOUTS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("qk_norm", self.qk_norm, (None, *RMS_NORMS))
        _check_positive_float("rope_base", self.rope_base)
        _check_positive_float("norm_eps", self.norm_eps)
        if self.logit_softcap is not None:
            _check_positive_float("logit_softcap", self.logit_softcap)
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", RopeScaling.from_dict(self.rope_scaling))  # a checkpoint's dict
        if self.windows is not None:
            self._check_windows()
        if self.window_pattern is not None and (
            not isinstance(self.window_pattern, str) or not self.window_pattern or set(self.window_pattern) - {"S", "L"}
        ):
            raise ValueError(
                "window_pattern must be a non-empty string of 'S' (a layer with the short sliding window) and 'L' "
                f"(a layer with the full context), tiled over the layers, e.g. nanochat's 'SSSL'; got "
                f"{self.window_pattern!r}"
            )
        if self.window is not None:
            check_positive_int("window", self.window)
            if self.window_pattern is None:
                raise ValueError(
                    f"window={self.window} is the short window of window_pattern's 'S' layers: set window_pattern "
                    "too (e.g. window_pattern='SSSL'), or leave window=None"
                )
        _check_choice("init", self.init, INITS)
        if self.init == "nanochat" and self.tie_embeddings:
            raise ValueError(
                "init='nanochat' starts the embedding at std 1 and the head at std 0.001, which one tied matrix "
                "cannot be: set tie_embeddings=False (as nanochat does)"
            )
        if self.positions == "rope":
            if self.d_k % 2:
                raise ValueError(
                    f"positions='rope' turns pairs of features, so the head size d_k must be even: got d_k={self.d_k} "
                    f"(d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim})"
                )
        else:
            for name, default in (("rope_base", 10000.0), ("rope_layout", "pairs"), ("rope_scaling", None)):
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} needs positions='rope' (with positions={self.positions!r} "
                        "there is no rotation to configure)"
                    )

    def __repr__(self) -> str:
        """The dataclass's repr, with `windows` only where it is set: a config without it prints as every config
        printed before the field existed (chapters 10 and 11 print theirs)."""
        shown = [f for f in dataclasses.fields(self) if f.name != "windows" or self.windows is not None]
        return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def _check_windows(self) -> None:
        """`windows`: one entry per layer, each a positive int or None; stored as a tuple (a checkpoint's list)."""
        windows = self.windows
        if isinstance(windows, (str, bytes)) or not isinstance(windows, (tuple, list)):
            raise TypeError(
                "windows must be a tuple with one entry per layer, each a window (a positive int) or None (the full "
                f"context), e.g. (None, 4, 4) for 3 layers; got {windows!r}"
            )
        if len(windows) != self.n_layers:
            raise ValueError(
                f"windows must have one entry per layer: got {len(windows)} entries for n_layers={self.n_layers}"
            )
        for i, window in enumerate(windows):
            if window is not None:  # None: that layer sees the full context
                check_positive_int(f"windows[{i}] (layer {i}'s window, in keys; None for the full context)", window)
        if self.window_pattern is not None or self.window is not None:
            raise ValueError(
                f"windows={tuple(windows)!r} writes out every layer's window: leave window_pattern and window at None "
                f"(got window_pattern={self.window_pattern!r}, window={self.window!r})"
            )
        object.__setattr__(self, "windows", tuple(windows))

    @classmethod
    def gpt2(cls, **overrides: Any) -> GPTConfig:
        """GPT-2 small (124M parameters): V=50257, context 1024, D=768, 12 heads, 12 layers, biases, tied head."""
        settings: dict[str, Any] = dict(
            vocab_size=50257, block_size=1024, d_model=768, n_heads=12, n_layers=12, dropout=0.0, bias=True
        )
        settings.update(overrides)
        return cls(**settings)

    @property
    def d_ff(self) -> int:
        """The feed-forward network's hidden width: `ff_width` if set, else 4 x d_model, as in GPT-2 (and the paper:
        2048 = 4 x 512), or for SwiGLU 8/3 x d_model rounded up to a multiple of 8 (`swiglu_width`: three
        matrices of that width hold as many weights as two of 4 x d_model)."""
        if self.ff_width is not None:
            return self.ff_width
        return swiglu_width(self.d_model) if self.activation == "swiglu" else 4 * self.d_model

    @property
    def d_k(self) -> int:
        """The size of each head: `head_dim` if set, else d_model / n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def short_window(self) -> int:
        """The window of the "S" layers: `window` if set, else block_size / 4 rounded up (nanochat's quarter)."""
        return self.window if self.window is not None else -(-self.block_size // 4)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window (None: the full context): `windows` if set, else window_pattern tiled over the
        layers, the last "L"."""
        if self.windows is not None:
            return self.windows
        if self.window_pattern is None:
            return (None,) * self.n_layers
        pattern = self.window_pattern
        windows = [self.short_window if pattern[i % len(pattern)] == "S" else None for i in range(self.n_layers)]
        windows[-1] = None  # nanochat: the last layer always sees the whole context
        return tuple(windows)

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: `n_kv_heads` if set, else n_heads."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (for a checkpoint that `torch.load(weights_only=True)` can read)."""
        return dataclasses.asdict(self)


#: The values of GPTConfig's switches.
POSITIONS = ("learned", "rope")
RMS_NORMS = ("rms", "rms_no_weight")
NORMS = ("layer", *RMS_NORMS)
INITS = ("gpt2", "nanochat")


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def _check_positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    if not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


class GPT(nn.Module):
    """A decoder-only Transformer language model: GPT-2's architecture from the course's modules (chapter 10),
    and with chapter 11's switches (see `GPTConfig`) Llama's, Qwen3's or nanochat's.

    Args:
        config: a `GPTConfig`.

    Shape:
        idx (B, T) token ids with T <= block_size -> logits (B, T, V): row t scores the token after idx[:, t].
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)  # wte, (V, D); no sqrt(D) scale in GPT
        # wpe, (block_size, D); None with rotary positions, which turn each head's queries and keys instead
        self.position_embedding = (
            LearnedPositionalEmbedding(c.block_size, c.d_model) if c.positions == "learned" else None
        )
        self.embedding_norm = _norm(c, c.d_model) if c.embedding_norm else None  # nanochat's norm after wte
        self.dropout = nn.Dropout(c.dropout)
        # One rotary module serves every layer (its tables depend only on d_k and block_size).
        rotary = (
            RotaryEmbedding(c.d_k, c.block_size, c.rope_base, c.rope_layout, c.rope_scaling, c.hf_float32)
            if c.positions == "rope"
            else None
        )
        self.layers = nn.ModuleList(_block(c, rotary) for _ in range(c.n_layers))
        self.norm = _norm(c, c.d_model)  # ln_f: Pre-Norm leaves the last block's output un-normalized
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)  # (V, D)
        if c.tie_embeddings:
            # Weight tying: one (V, D) matrix embeds the input tokens and scores the next one.
            self.lm_head.weight = self.token_embedding.weight
        if not c.bias:
            _remove_biases(self)
        # The causal mask, True on and below the diagonal (True = may attend, the course's convention; nanoGPT
        # calls this `tril` buffer `bias`). Not persistent: it is rebuilt from block_size, not saved.
        self.register_buffer("causal", causal_mask(c.block_size), persistent=False)  # (block_size, block_size)
        # Chapter 11's sliding window: the mask of each window the layers use (the pattern's one short window, or
        # those of `windows`), rows and columns cut from it as from `causal`.
        self.window_sizes = sorted({window for window in c.layer_windows if window is not None})  # distinct
        masks = [sliding_window_mask(c.block_size, window) for window in self.window_sizes]
        stacked = torch.stack(masks) if masks else None  # (windows, block_size, block_size), one per distinct window
        self.register_buffer("window_masks", stacked, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation (as nanoGPT and Hugging Face's GPT-2 do it).

        Every Linear weight and both embeddings ~ N(0, 0.02^2), biases 0, norms gamma 1 and beta 0. The two
        projections that write into the residual stream (attention's W^O, nanoGPT's `attn.c_proj`, and the
        feed-forward network's W_2, `mlp.c_proj`) get std 0.02 / sqrt(2 N) instead. Why: each block ADDS two
        branches to the residual stream x, so at the top x is the embedding plus 2N such terms. Roughly
        independent terms add their variances, so with a fixed std the stream's variance would grow like 2N
        with depth; scaling each branch's last weight by 1/sqrt(2N) keeps the sum's variance independent of N.
        The GPT-2 paper (section 2.3) states the rule as a 1/sqrt(N) scale, its N counting residual layers,
        two per block: 1/sqrt(2 n_layers) here. With `zero_init_output` (chapter 11) those two start at 0.
        """
        std = 0.02
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                if isinstance(module.bias, nn.Parameter):
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.RMSNorm, Float32RMSNorm)) and module.weight is not None:
                nn.init.ones_(module.weight)
        if self.config.init == "nanochat":  # chapter 11: its embedding, head and matrices drawn anew
            self._nanochat_init()
            return
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for layer in self.layers:
            for weight in (layer.self_attn.w_o.weight, layer.feed_forward.w2.weight):
                if self.config.zero_init_output:
                    nn.init.zeros_(weight)
                else:
                    nn.init.normal_(weight, mean=0.0, std=residual_std)

    @torch.no_grad()
    def _nanochat_init(self) -> None:
        """nanochat's `init_weights` (January 2026), on this model's modules (chapter 11, init="nanochat").

        Token embedding ~ N(0, 1), so that the stream starts at RMS 1 (the norm after the embedding then changes
        its scale little; GPT-2's 0.02 makes that norm multiply it by about 50); the untied head ~ N(0, 0.001^2),
        so that the first logits are nearly equal. W^Q, W^K, W^V and the feed-forward network's first matrix
        (both of SwiGLU's) ~ uniform(-s, s) with s = sqrt(3 / fan_in): std 1 / sqrt(fan_in), so that each output
        starts with the variance of one input feature (nanochat: uniform rather than normal, to have no
        outliers). W^O and W_2 start at zero: every block starts as the identity. What nanochat does not have
        keeps GPT-2's values, set just before by `reset_parameters`: biases 0, norm gains 1, a learned position
        table N(0, 0.02^2).
        """
        nn.init.normal_(self.token_embedding.weight, mean=0.0, std=1.0)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.001)
        for layer in self.layers:
            attention, ff = layer.self_attn, layer.feed_forward
            inputs = [attention.w_q, attention.w_k, attention.w_v, ff.w1] + ([ff.w3] if isinstance(ff, SwiGLU) else [])
            for linear in inputs:
                bound = math.sqrt(3 / linear.in_features)  # uniform(-s, s) has variance s^2 / 3 = 1 / fan_in
                nn.init.uniform_(linear.weight, -bound, bound)
            nn.init.zeros_(attention.w_o.weight)
            nn.init.zeros_(ff.w2.weight)

    def new_cache(self) -> DecoderCache:
        """An empty KV cache for `forward(idx, cache=...)`: each layer's keys and values, and the length so far.

        Each layer holds keys and values of shape (B, H_kv, length, d_k): with grouped-query attention only the
        n_kv_heads key/value heads, which is where its memory saving comes from (`kv_cache_bytes`)."""
        return DecoderCache.empty(self.config.n_layers)

    def kv_cache_bytes(self, length: int, batch: int = 1) -> int:
        """The bytes a full KV cache holds for `batch` sequences of `length` positions (chapter 11).

        2 (keys and values) x N layers x B x H_kv x length x d_k numbers in the model's dtype: with H_kv = H / g
        key/value heads, g times less than multi-head attention. `cache_bytes(cache)` measures a filled cache.
        """
        check_positive_int("length", length)
        check_positive_int("batch", batch)
        c = self.config
        itemsize = self.token_embedding.weight.element_size()
        return 2 * c.n_layers * batch * c.kv_heads * length * c.d_k * itemsize

    def forward(self, idx: Tensor, cache: DecoderCache | None = None, *, through_modules: bool = False) -> Tensor:
        """Logits for the token after each position of `idx`.

        Args:
            idx: token ids (B, T), an integer tensor with ids in [0, vocab_size) and T <= block_size.
            cache: optional KV cache (`new_cache()`); `idx` then holds only the NEW tokens, at positions
                cache.length, ..., cache.length + T - 1, and the cache is extended with them.
            through_modules: with a cache and one new token, run the step through the modules even where
                `_decode_step` may run it straight from the weights (the same numbers; for timing or reading).

        Shape:
            idx (B, T) -> logits (B, T, V).
        """
        start = self._check_idx(idx, cache)
        check_bool("through_modules", through_modules)
        length = idx.shape[1]
        if cache is not None and length == 1 and not through_modules:
            plan = _decode_plan(self)
            if plan is not None:
                return _decode_step(self, idx, cache, plan)  # one token: the same result without the modules
        # idx is checked: the modules below skip their own checks, which would only repeat this one (and, once
        # per layer and per generated token, cost more than the layer's arithmetic at chapter 10's size).
        with trusted():
            x = self.token_embedding(idx)  # (B, T, D)
            if self.position_embedding is not None:  # learned positions; rotary ones turn q and k in attention
                x = self.position_embedding(x, start=start)  # (B, T, D), positions start..start+T-1
            if self.embedding_norm is not None:  # chapter 11: a norm right after the embedding (nanochat)
                x = self.embedding_norm(x)
            x = self.dropout(x)
            masks = self._layer_masks(start, length)  # one per layer: (T, start + T) or None
            for i, (layer, mask) in enumerate(zip(self.layers, masks, strict=True)):
                x = layer(x, mask) if cache is None else _cached_layer(layer, x, mask, cache.layers[i], start)
            if cache is not None:
                cache.length += length
            x = self.norm(x)  # (B, T, D); fused or term by term as `tl.record_attention` set it
            logits = self.lm_head(x)  # (B, T, V)
            if self.config.logit_softcap is not None:  # chapter 11: c * tanh(z / c) (Gemma 2, nanochat)
                logits = soft_cap(logits, self.config.logit_softcap)
            return logits

    def _layer_masks(self, start: int, length: int) -> list[Tensor | None]:
        """Each layer's mask for `length` queries at positions start.. against keys 0..start+length-1.

        Query t (absolute position start + t) may see keys 0..start+t: rows start..start+T-1 of the full mask.
        A single new token sees everything, so it needs no mask (and the fused kernel can skip it). An "S" layer
        of a window pattern (or a windowed layer of `windows`) cuts the same rows from its window's mask; a single
        token then needs one only once more than `window` keys are cached.
        """
        causal = None if length == 1 else self.causal[start : start + length, : start + length]  # (T, start + T)
        if self.window_masks is None:
            return [causal] * self.config.n_layers
        local: dict[int, Tensor | None] = {}
        for i, window in enumerate(self.window_sizes):
            # every cached key of a single token is still inside the window: no mask
            inside = length == 1 and start + 1 <= window
            local[window] = None if inside else self.window_masks[i, start : start + length, : start + length]
        return [causal if window is None else local[window] for window in self.config.layer_windows]

    def _check_idx(self, idx: object, cache: DecoderCache | None) -> int:
        """Clear errors for bad token ids or a context past block_size; returns the first position of idx."""
        check_tokens("idx", idx, self.config.vocab_size, device=self.token_embedding.weight.device)
        assert isinstance(idx, Tensor)
        if idx.shape[1] == 0:
            raise ValueError(f"idx must hold at least one token per sequence, got shape {tuple(idx.shape)}")
        start = 0
        if cache is not None:
            if not isinstance(cache, DecoderCache):
                raise TypeError(f"cache must be a DecoderCache from model.new_cache(), got {type(cache).__name__}")
            if len(cache.layers) != self.config.n_layers:
                raise ValueError(f"cache has {len(cache.layers)} layers, the model has {self.config.n_layers}")
            cached = cache.layers[0].self_k
            if cached is not None and cached.shape[0] != idx.shape[0]:
                raise ValueError(
                    f"idx must have the cache's batch size: the cache holds B={cached.shape[0]}, "
                    f"idx has B={idx.shape[0]}"
                )
            start = cache.length
        if start + idx.shape[1] > self.config.block_size:
            where = (
                f"the cache holds {start} positions and idx adds {idx.shape[1]}"
                if cache
                else (f"idx has T={idx.shape[1]} positions")
            )
            why = (
                "learned positions (there is no position embedding beyond them)"
                if self.config.positions == "learned"
                else "positions (its rotary tables and causal mask end there)"
            )
            raise ValueError(
                f"context too long: {where}, but the model has block_size={self.config.block_size} {why}; crop idx "
                "to its last block_size tokens, as generate does"
            )
        return start

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        *,
        use_cache: bool = True,
        through_modules: bool = False,
        return_logits: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Extend `idx` by `max_new_tokens` sampled tokens, one at a time (chapter 10).

        Each step scores the next token from the last block_size tokens (the context is cropped, as nanoGPT
        does), divides the logits by `temperature`, keeps the `top_k` best and/or the smallest set whose
        probabilities add up to `top_p` (`filter_logits`), and samples from the softmax.

        The KV cache (`use_cache=True`): the prompt is run once and each layer keeps its keys and values; every
        later step runs only the new token and attends to the cache. With LEARNED positions the cache cannot
        slide once the context is full: dropping the oldest token shifts every remaining token to the position
        before, so their position embeddings, hence every key and value of every layer above the embeddings,
        change. The cache must then be rebuilt from the cropped context (the last block_size tokens): a full
        forward pass, as without a cache. (Positions that did not move would not be enough either: above the
        first layer every cached key and value was computed from hidden states that attended to the dropped
        token.) A cache built from a full context has no room for the next token, so it would be rebuilt again
        at the very next step; it is therefore not kept: from the step where the context reaches block_size on,
        each step is that full forward pass over the cropped context. Past
        block_size the cache saves nothing, and the tokens stay exactly those of recomputation (tested); the
        speed-up is for the first block_size - T0 new tokens. Generation runs in eval mode (dropout off) and
        restores the mode afterwards.

        Args:
            idx: the prompt, token ids (B, T0), T0 >= 1 (longer than block_size is fine: it is cropped).
            max_new_tokens: how many tokens to add (>= 0).
            temperature: > 0 divides the logits (< 1 sharper, > 1 flatter); 0 means greedy: the most likely
                token every step (the first one on a tie), top_k, top_p and generator then unused.
            top_k: keep only the k most likely tokens (ties with the k-th are kept); None keeps all; a k above
                the vocabulary size keeps all.
            top_p: nucleus sampling, in (0, 1]: keep the most likely tokens until their probabilities add up to
                at least top_p; None (or 1.0) keeps all.
            generator: a `torch.Generator` for the sampling; the same seed gives the same tokens.
            use_cache: run with the KV cache (True) or recompute the whole context every step (False).
            through_modules: with the cache, run every one-token step through the modules (`_cached_layer`)
                instead of `_decode_step`, which computes the same numbers straight from the weights (see the
                comment above it): the same tokens, slower. For measuring what the cache alone saves.
            return_logits: also return each step's logits, before temperature and filtering.

        Returns:
            tokens (B, T0 + max_new_tokens), the prompt followed by the new tokens; with `return_logits`,
            (tokens, logits) where logits is (B, max_new_tokens, V).
        """
        check_tokens("idx", idx, self.config.vocab_size, device=self.token_embedding.weight.device)
        if idx.shape[1] == 0:
            raise ValueError(f"idx must hold at least one token per sequence (a prompt), got shape {tuple(idx.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        _check_sampling(temperature, top_k, top_p)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        check_bool("use_cache", use_cache)
        check_bool("through_modules", through_modules)
        check_bool("return_logits", return_logits)

        was_training = self.training
        self.eval()
        try:
            block_size = self.config.block_size
            tokens = idx
            steps: list[Tensor] = []
            cache: DecoderCache | None = None
            # None: every step goes through the modules
            plan = _decode_plan(self) if use_cache and not through_modules else None
            for _ in range(max_new_tokens):
                context = tokens[:, -block_size:]  # (B, <= block_size), cropped
                if not use_cache or context.shape[1] == block_size:
                    # No cache, or a full context: the cache cannot slide, so the cropped context is run again
                    # (a cache rebuilt from it would have no room for the next token: it is not kept).
                    cache = None
                    logits = self(context)[:, -1]  # (B, V)
                elif cache is None:
                    cache = self.new_cache()  # the first step: the prompt fills the cache
                    logits = self(context, cache)[:, -1]  # (B, V)
                elif plan is not None:  # only the newest token, checked by construction: straight to the step
                    logits = _decode_step(self, tokens[:, -1:], cache, plan)[:, -1]  # (B, V)
                else:
                    logits = self(tokens[:, -1:], cache, through_modules=through_modules)[:, -1]  # (B, V)
                steps.append(logits)
                next_token = _sample(logits, temperature, top_k, top_p, generator)  # (B, 1)
                tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
        finally:
            self.train(was_training)
        if not return_logits:
            return tokens
        empty = self.lm_head.weight.new_zeros((idx.shape[0], 0, self.config.vocab_size))  # (B, 0, V)
        all_logits = torch.stack(steps, dim=1) if steps else empty
        return tokens, all_logits  # (B, T0 + N), (B, N, V)

    @classmethod
    def from_gpt2(cls, state_dict: Mapping[str, Tensor], n_heads: int = 12) -> GPT:
        """A `GPT` holding the weights of a Hugging Face GPT-2 state dict (chapter 10).

        The config is read from the shapes: V and D from `wte`, block_size from `wpe`, N from the number of
        blocks `h.i`, biases from whether `c_attn` has one, tying from whether `lm_head` is absent or equal to
        `wte`. The number of heads cannot be read from any shape (the heads only split D), so it is an
        argument, 12 by default as in GPT-2 small (medium has 16, large 20, XL 25); `load_gpt2` reads it
        from config.json.
        GPT-2's `Conv1D` stores its weight as (in, out), computing x @ W + b, so each is transposed into a
        Linear's (out, in); the fused `c_attn` (D, 3D) is split into W^Q, W^K, W^V, in that order.
        Keys may carry GPT2LMHeadModel's "transformer." prefix or not (as in the original checkpoint files);
        the old causal-mask buffers "attn.bias" and "attn.masked_bias" are ignored. The model has the
        state dict's dtype.

        Args:
            state_dict: the tensors of a `GPT2LMHeadModel` or `GPT2Model`, by name.
            n_heads: the number of attention heads.

        Returns:
            the model in eval mode (dropout 0), with GELU's tanh approximation as GPT-2 uses it.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
        check_positive_int("n_heads", n_heads)
        sd = {(k[len("transformer.") :] if k.startswith("transformer.") else k): v for k, v in state_dict.items()}
        for name in ("wte.weight", "wpe.weight", "ln_f.weight"):
            if name not in sd:
                raise ValueError(f"state_dict is not a GPT-2 state dict: it has no {name!r}")
        _check_weight("wte.weight", sd["wte.weight"])
        if sd["wte.weight"].dim() != 2:
            raise ValueError(f"state_dict['wte.weight'] must be (V, D), got shape {tuple(sd['wte.weight'].shape)}")
        vocab_size, d_model = sd["wte.weight"].shape
        block_size = sd["wpe.weight"].shape[0]
        n_layers = 0
        while f"h.{n_layers}.ln_1.weight" in sd:
            n_layers += 1
        if n_layers == 0:
            raise ValueError("state_dict is not a GPT-2 state dict: it has no blocks 'h.0....'")
        if "h.0.mlp.c_fc.weight" not in sd:
            raise ValueError("state_dict is missing 'h.0.mlp.c_fc.weight' (every GPT-2 block has it)")
        d_ff = sd["h.0.mlp.c_fc.weight"].shape[-1]
        if d_ff != 4 * d_model:
            raise ValueError(f"the feed-forward width must be 4 x d_model={4 * d_model} as in GPT-2, got {d_ff}")
        head = sd.get("lm_head.weight")
        tied = head is None or head.data_ptr() == sd["wte.weight"].data_ptr() or torch.equal(head, sd["wte.weight"])
        config = GPTConfig(
            vocab_size=vocab_size,
            block_size=block_size,
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            dropout=0.0,
            bias="h.0.attn.c_attn.bias" in sd,
            tie_embeddings=tied,
            activation="gelu_tanh",
        )
        ours = _convert_gpt2(sd, config)
        dtypes = sorted({str(v.dtype) for v in ours.values()})
        if len(dtypes) > 1:
            raise ValueError(f"state_dict mixes dtypes {dtypes}; convert every tensor to one dtype first")
        model = cls(config).to(sd["wte.weight"].dtype)
        try:
            model.load_state_dict(ours, strict=True)
        except RuntimeError as error:  # e.g. tensors on the meta device, which hold no values to copy
            raise ValueError(f"state_dict could not be copied into the model: {str(error)[:300]}") from None
        return model.eval()


def _check_weight(name: str, tensor: object) -> Tensor:
    if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
        got = getattr(tensor, "dtype", type(tensor).__name__)
        raise TypeError(
            f"state_dict[{name!r}] must be a floating-point torch.Tensor, got {got}; "
            "convert with torch.from_numpy(...) or .float()"
        )
    return tensor


def _convert_gpt2(sd: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPT-2's names and layouts -> ours (see the table in the module docstring)."""
    d, v = config.d_model, config.vocab_size
    used = set()
    # The shape of each GPT-2 tensor, by the end of its name (Conv1D weights are (in, out)).
    shapes = {
        "wte.weight": (v, d),
        "wpe.weight": (config.block_size, d),
        "lm_head.weight": (v, d),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "mlp.c_fc.weight": (d, 4 * d),
        "mlp.c_fc.bias": (4 * d,),
        "mlp.c_proj.weight": (4 * d, d),
    }

    def take(name: str) -> Tensor:
        if name not in sd:
            raise ValueError(f"state_dict is missing {name!r} (a GPT-2 model with {config.n_layers} blocks has it)")
        used.add(name)
        tensor = _check_weight(name, sd[name])
        expected = next((s for end, s in shapes.items() if name.endswith(end)), (d,))  # the rest: (D,)
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"state_dict[{name!r}] has shape {tuple(tensor.shape)}, but a GPT-2 with V={v}, D={d} stores it as "
                f"{expected} (Conv1D weights are (in, out): do not transpose them first)"
            )
        return tensor

    ours: dict[str, Tensor] = {
        "token_embedding.weight": take("wte.weight"),
        "position_embedding.embedding.weight": take("wpe.weight"),
        "norm.weight": take("ln_f.weight"),
    }
    if config.bias:
        ours["norm.bias"] = take("ln_f.bias")
    for i in range(config.n_layers):
        g, o = f"h.{i}.", f"layers.{i}."
        # Conv1D weights are (in, out); Linear weights are (out, in): transpose.
        w_q, w_k, w_v = take(g + "attn.c_attn.weight").split(d, dim=1)  # (D, 3D) -> 3 x (D, D)
        ours[o + "self_attn.w_q.weight"] = w_q.t()
        ours[o + "self_attn.w_k.weight"] = w_k.t()
        ours[o + "self_attn.w_v.weight"] = w_v.t()
        ours[o + "self_attn.w_o.weight"] = take(g + "attn.c_proj.weight").t()  # (D, D)
        ours[o + "feed_forward.w1.weight"] = take(g + "mlp.c_fc.weight").t()  # (D, 4D) -> (4D, D)
        ours[o + "feed_forward.w2.weight"] = take(g + "mlp.c_proj.weight").t()  # (4D, D) -> (D, 4D)
        ours[o + "norm1.weight"] = take(g + "ln_1.weight")
        ours[o + "norm2.weight"] = take(g + "ln_2.weight")
        if config.bias:
            b_q, b_k, b_v = take(g + "attn.c_attn.bias").split(d)  # (3D,) -> 3 x (D,)
            ours[o + "self_attn.w_q.bias"] = b_q
            ours[o + "self_attn.w_k.bias"] = b_k
            ours[o + "self_attn.w_v.bias"] = b_v
            ours[o + "self_attn.w_o.bias"] = take(g + "attn.c_proj.bias")
            ours[o + "feed_forward.w1.bias"] = take(g + "mlp.c_fc.bias")
            ours[o + "feed_forward.w2.bias"] = take(g + "mlp.c_proj.bias")
            ours[o + "norm1.bias"] = take(g + "ln_1.bias")
            ours[o + "norm2.bias"] = take(g + "ln_2.bias")
        for buffer in ("attn.bias", "attn.masked_bias"):  # old checkpoints' causal-mask buffers: not weights
            if g + buffer in sd:
                used.add(g + buffer)
    ours["lm_head.weight"] = take("lm_head.weight") if "lm_head.weight" in sd else ours["token_embedding.weight"]
    unknown = sorted(set(sd) - used)
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5])
        raise ValueError(f"state_dict has {len(unknown)} entries that are not GPT-2 weights, e.g. {shown}")
    return {k: v.detach() for k, v in ours.items()}


def load_gpt2_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Read a GPT-2 checkpoint as Hugging Face stores it, from a folder or a single file, without any network.
    Nothing here is GPT-2's own: `tl.hf.load_hf` reads Llama and Qwen3 folders with it (chapter 11).

    A folder is what `save_pretrained` writes (and what a download of "openai-community/gpt2" holds):
    `model.safetensors` (read with the `safetensors` package), a sharded `model.safetensors.index.json`,
    or `pytorch_model.bin` (read with `torch.load(weights_only=True)`).

    Returns:
        the tensors by name, for `GPT.from_gpt2`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder or file path (str or pathlib.Path), got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
            if (path / name).is_file():
                return load_gpt2_state_dict(path / name)
        raise FileNotFoundError(f"{path} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file or folder: {path}")
    if path.name.endswith(".index.json"):
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        tensors: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(load_gpt2_state_dict(path.parent / shard))
        return tensors
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("reading .safetensors needs the safetensors package: pip install safetensors") from error
        return load_file(str(path), device="cpu")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as error:
        raise ValueError(
            f"path {os.fspath(path)!r} could not be read as a GPT-2 state dict (corrupt, or holding Python objects "
            f"rather than tensors): {str(error)[:200]}"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state


def load_gpt2(path: str | os.PathLike[str], n_heads: int | None = None) -> GPT:
    """A `GPT` from a Hugging Face GPT-2 folder (`save_pretrained`'s output, or a downloaded checkpoint).

    The weights come from `load_gpt2_state_dict`; the number of heads from `n_heads` if given, else from the
    folder's config.json ("n_head"), else GPT-2's 12. config.json is also checked for what this model cannot
    represent (another activation than GELU's tanh approximation, another LayerNorm epsilon than 1e-5).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder or file path (str or pathlib.Path), got {type(path).__name__}")
    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path.parent / "config.json"
    hf_config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            hf_config = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{config_file} is not valid JSON: {error}") from None
        if not isinstance(hf_config, dict):
            raise ValueError(f"{config_file} must hold a JSON object (GPT-2's config), got {type(hf_config).__name__}")
        activation = hf_config.get("activation_function", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{config_file}: activation_function {activation!r} is not GELU's tanh approximation")
        eps = hf_config.get("layer_norm_epsilon", 1e-5)
        if eps != 1e-5:
            raise ValueError(f"{config_file}: layer_norm_epsilon {eps} is not the 1e-5 this model uses")
        if n_heads is not None and "n_head" in hf_config and hf_config["n_head"] != n_heads:
            raise ValueError(f"n_heads={n_heads} disagrees with n_head={hf_config['n_head']} in {config_file}")
    heads = n_heads if n_heads is not None else hf_config.get("n_head", 12)
    return GPT.from_gpt2(load_gpt2_state_dict(path), n_heads=heads)


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit that top-k and then top-p (nucleus) filtering removes (chapter 10).

    top_k: keep the k largest logits of each row (and any tied with the k-th). top_p: sort the remaining
    tokens by probability, most likely first, and keep a token while the probabilities BEFORE it add up to
    less than top_p: the smallest set whose total reaches top_p (never empty: the most likely token stays).

    Shape:
        logits (..., V) -> (..., V), the kept entries unchanged.
    """
    check_tensor("logits", logits, min_dim=1)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor of scores, got dtype {logits.dtype}")
    _check_sampling(1.0, top_k, top_p)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1), the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # (..., V), mass of the tokens ranked above each one
        remove_sorted = before >= top_p
        remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def _sample(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """One token per row: greedy for temperature 0, else a draw from the filtered softmax. (B, V) -> (B, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


def _check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def _norm(config: GPTConfig, size: int) -> nn.Module:
    """The norm `config.norm` names, over `size` features: the course's LayerNorm (GPT-2), or PyTorch's
    `nn.RMSNorm` with or without its gain (Hugging Face's float32 arithmetic where `hf_float32` asks for it)."""
    if config.norm == "layer":
        return LayerNorm(size, config.norm_eps)
    return _rms_norm(config, size, weight=config.norm == "rms")


def _rms_norm(config: GPTConfig, size: int, weight: bool) -> nn.Module:
    if config.hf_float32:
        return Float32RMSNorm(size, config.norm_eps, weight=weight)
    return nn.RMSNorm(size, eps=config.norm_eps, elementwise_affine=weight)


def _block(config: GPTConfig, rotary: RotaryEmbedding | None) -> EncoderLayer:
    """One block: chapter 06's Pre-Norm `EncoderLayer`, its parts chosen by the switches (chapter 11).

    With GPT-2's attention and norms it is built exactly as chapter 10 builds it; otherwise around the attention,
    feed-forward network and norms the switches pick (`EncoderLayer.from_parts`), with the same `forward`
    (x + attn(norm1(x)), then x + ffn(norm2(x))).
    """
    c = config
    gpt2_attention = c.positions == "learned" and c.qk_norm is None and c.n_kv_heads is None and c.head_dim is None
    if gpt2_attention and c.norm == "layer" and c.activation != "swiglu":
        return EncoderLayer(
            c.d_model, c.n_heads, c.d_ff, c.dropout, norm_first=True, eps=c.norm_eps, activation=c.activation
        )
    qk_norm = None if c.qk_norm is None else partial(_rms_norm, c, weight=c.qk_norm == "rms")
    attention = MultiHeadAttention(
        c.d_model, c.n_heads, c.dropout, n_kv_heads=c.n_kv_heads, d_k=c.d_k, qk_norm=qk_norm, rotary=rotary
    )
    if c.activation == "swiglu":
        feed_forward: nn.Module = SwiGLU(c.d_model, c.d_ff, c.dropout, bias=c.bias)
    else:
        feed_forward = FeedForward(c.d_model, c.d_ff, c.dropout, c.activation)
    return EncoderLayer.from_parts(attention, feed_forward, _norm(c, c.d_model), _norm(c, c.d_model), c.dropout)


def cache_bytes(cache: DecoderCache) -> int:
    """The bytes of the keys and values a filled KV cache holds (chapter 11): every layer's self_k and self_v,
    (B, H_kv, length, d_k) each. Room reserved for later positions is not counted (see `LayerCache`)."""
    if not isinstance(cache, DecoderCache):
        raise TypeError(f"cache must be a DecoderCache from model.new_cache(), got {type(cache).__name__}")
    tensors = [t for layer in cache.layers for t in (layer.self_k, layer.self_v) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def _cached_layer(layer: EncoderLayer, x: Tensor, mask: Tensor | None, cache: LayerCache, start: int = 0) -> Tensor:
    """`layer.forward(x, mask)` for a Pre-Norm `EncoderLayer`, with a KV cache (tested equal).

    The keys and values of the new positions are appended to the cache; the queries of the new positions
    attend to all of them. `start` is the position of x's first token (for rotary positions).
    Shape: x (B, T, D), mask (T, cached + T) or None -> (B, T, D).
    """
    attention = layer.self_attn
    norm1, norm2 = layer.norm1, layer.norm2  # each computes fused or term by term as its own flag says

    def self_attention(h: Tensor) -> Tensor:
        k, v = cache.extend_self(*attention.project_kv(h, h, start))  # (B, H_kv, cached + T, d_k) each
        return attention.attend(h, k, v, mask, start)  # (B, T, D)

    x = sublayer_connection(x, self_attention, norm1, layer.dropout1, layer.norm_first)
    return sublayer_connection(x, layer.feed_forward, norm2, layer.dropout2, layer.norm_first)


# One generated token, without the module machinery.
#
# A cached step runs one token: at chapter 10's size (d_model 128) each of its ~25 matrix products takes a few
# microseconds, and calling ~60 modules (each `nn.Module.__call__`, the dropouts of p = 0, the heads split and
# merged with views) costs more than the arithmetic. `_decode_step` computes what the modules compute, one token
# at a time, straight from their weights: the same steps in the same order (tested equal: tokens, and float64
# logits to 1e-10), with W^Q, W^K, W^V packed into one matrix as the fast path does, and at batch 1 one vector
# (D,) instead of a (1, 1, D) tensor, so that each product is a matrix-vector product. It runs only where the
# modules could not compute anything else: every module of the model is of the course's own class (not a
# subclass), none has a hook or a replaced `forward`, and no dropout is active. Otherwise (a hook to read
# activations, say, or training with dropout) the step goes through the modules (`_cached_layer`), and so it does
# when asked: `generate(..., through_modules=True)` or `model(idx, cache, through_modules=True)`.
# Chapter 11's switches are all supported: rotary positions, RMSNorm, QK norm, grouped-query attention, a free
# head size, ReLU^2 and SwiGLU, the norm after the embedding, the logit soft-cap and the sliding window (each tested
# equal).

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_NORM_CLASSES = (LayerNorm, nn.RMSNorm, Float32RMSNorm)


class _LayerPlan(NamedTuple):
    """What `_decode_step` reads of one `EncoderLayer`, fetched once per `generate`."""

    norm1: Callable[[Tensor], Tensor]
    w_qkv: Tensor  # (H d_k + 2 H_kv d_k, D), [W^Q; W^K; W^V]
    b_qkv: Tensor | None
    sizes: list[int]  # the rows of W^Q, W^K and W^V in w_qkv
    attention: MultiHeadAttention  # its path (record_weights), its heads, where the weights are recorded
    q_norm: Callable[[Tensor], Tensor] | None
    k_norm: Callable[[Tensor], Tensor] | None
    rotary: RotaryEmbedding | None
    w_o: Tensor
    b_o: Tensor | None
    norm2: Callable[[Tensor], Tensor]
    feed_forward: Callable[[Tensor], Tensor]  # the network of FeedForward or SwiGLU, from their weights
    window: int | None  # the sliding window of an "S" layer (None: the whole context)


def _untouched(module: nn.Module) -> bool:
    """No hook, no replaced `forward` and no compiled call: calling it is calling its class's `forward`."""
    return (
        not any(getattr(module, name) for name in _HOOKS)
        and "forward" not in module.__dict__
        and getattr(module, "_compiled_call_impl", None) is None
    )


def _feed_forward_step(
    h: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    activation: Callable[[Tensor], Tensor],
    w2: Tensor,
    b2: Tensor | None,
) -> Tensor:
    """`FeedForward` from its weights: W_2 act(W_1 h + b_1) + b_2."""
    return _linear(activation(_linear(h, w1, b1)), w2, b2)


def _swiglu_step(
    h: Tensor, w1: Tensor, b1: Tensor | None, w3: Tensor, b3: Tensor | None, w2: Tensor, b2: Tensor | None
) -> Tensor:
    """`SwiGLU` from its weights: W_2 (SiLU(W_1 h) * W_3 h)."""
    return _linear(F.silu(_linear(h, w1, b1)) * _linear(h, w3, b3), w2, b2)


def _decode_plan(model: GPT) -> list[_LayerPlan] | None:
    """Each layer's weights for `_decode_step`, or None where the step must go through the modules (see above)."""
    from torch.nn.modules import module as module_state

    if (
        module_state._global_forward_hooks
        or module_state._global_forward_pre_hooks
        or module_state._global_backward_hooks
        or module_state._global_backward_pre_hooks
        or torch._C._get_tracing_state()
        or not all(_untouched(m) for m in model.modules())
    ):
        return None
    expected: list[tuple[nn.Module | None, tuple[type, ...]]] = [
        (model, (GPT,)),
        (model.token_embedding, (nn.Embedding,)),
        (model.norm, _NORM_CLASSES),
        (model.lm_head, (nn.Linear,)),
        (model.dropout, (nn.Dropout,)),
    ]
    if model.position_embedding is not None:
        expected += [(model.position_embedding, (LearnedPositionalEmbedding,))]
        expected += [(model.position_embedding.embedding, (nn.Embedding,))]
    if model.embedding_norm is not None:
        expected += [(model.embedding_norm, _NORM_CLASSES)]
    for layer in model.layers:
        attention, ff = layer.self_attn, layer.feed_forward
        expected += [(layer, (EncoderLayer,)), (attention, (MultiHeadAttention,)), (ff, (FeedForward, SwiGLU))]
        expected += [(m, _NORM_CLASSES) for m in (layer.norm1, layer.norm2)]
        expected += [(m, _NORM_CLASSES) for m in (attention.q_norm, attention.k_norm) if m is not None]
        if attention.rotary is not None:
            expected += [(attention.rotary, (RotaryEmbedding,))]
        linears = [attention.w_q, attention.w_k, attention.w_v, attention.w_o, ff.w1, ff.w2]
        linears += [ff.w3] if isinstance(ff, SwiGLU) else []
        expected += [(m, (nn.Linear,)) for m in linears]
        expected += [(m, (nn.Dropout,)) for m in (attention.dropout, layer.dropout1, layer.dropout2, ff.dropout)]
        if not layer.norm_first:
            return None
    if any(type(m) not in classes for m, classes in expected):
        return None
    embeddings = [model.token_embedding]
    if model.position_embedding is not None:
        embeddings.append(model.position_embedding.embedding)
    if any(embedding.max_norm is not None for embedding in embeddings):
        return None  # an embedding that renormalizes its rows when called
    if any(m.training and m.p > 0 for m, classes in expected if classes == (nn.Dropout,)):  # type: ignore[union-attr]
        return None
    plan = []
    for layer, window in zip(model.layers, model.config.layer_windows, strict=True):
        attention, ff = layer.self_attn, layer.feed_forward
        w_qkv, b_qkv = attention.packed_projections()
        if isinstance(ff, SwiGLU):
            feed_forward = partial(
                _swiglu_step,
                w1=ff.w1.weight,
                b1=ff.w1.bias,
                w3=ff.w3.weight,
                b3=ff.w3.bias,
                w2=ff.w2.weight,
                b2=ff.w2.bias,
            )
        else:
            feed_forward = partial(
                _feed_forward_step,
                w1=ff.w1.weight,
                b1=ff.w1.bias,
                activation=_ACTIVATIONS[ff.activation],
                w2=ff.w2.weight,
                b2=ff.w2.bias,
            )
        plan.append(
            _LayerPlan(
                norm1=layer.norm1.forward,  # fused or term by term, as the LayerNorm's own flag says
                w_qkv=w_qkv,
                b_qkv=b_qkv,
                sizes=attention.packed_sizes(),
                attention=attention,
                q_norm=attention.q_norm.forward if attention.q_norm is not None else None,
                k_norm=attention.k_norm.forward if attention.k_norm is not None else None,
                rotary=attention.rotary,
                w_o=attention.w_o.weight,
                b_o=attention.w_o.bias,
                norm2=layer.norm2.forward,
                feed_forward=feed_forward,
                window=window,
            )
        )
    return plan


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear(x, weight, bias)`; for one vector x (D,) the matrix-vector product (`addmv`), which skips the
    transposes and the copy of the bias that `F.linear` makes (a third faster at chapter 10's size)."""
    if x.dim() > 1:
        return F.linear(x, weight, bias)
    return torch.mv(weight, x) if bias is None else torch.addmv(bias, weight, x)


def _decode_step(model: GPT, idx: Tensor, cache: DecoderCache, plan: list[_LayerPlan]) -> Tensor:
    """`model(idx, cache)` for ONE new token per row, from the modules' weights (see above; tested equal).

    Shape: idx (B, 1) -> logits (B, 1, V). Inside, x is (B, D), or (D,) when B = 1.
    """
    batch = idx.shape[0]
    start = cache.length
    tokens = idx[0] if batch == 1 else idx.view(batch)  # (1,) or (B,)
    embedding = model.token_embedding.weight
    x = F.embedding(tokens, embedding)  # (B, D)
    if model.position_embedding is not None:  # learned positions; rotary ones turn q and k below
        x = x + model.position_embedding.embedding.weight[start].to(embedding.dtype)
    if batch == 1:
        x = x[0]  # (D,)
    with trusted():
        if model.embedding_norm is not None:
            x = model.embedding_norm.forward(x)
        for layer, layer_cache in zip(plan, cache.layers, strict=True):
            attention = layer.attention
            qkv = _linear(layer.norm1(x), layer.w_qkv, layer.b_qkv)  # (B, (H + 2 H_kv) d_k) or without B
            q, k, v = qkv.split(layer.sizes, dim=-1)  # (B, H d_k), (B, H_kv d_k), (B, H_kv d_k), or without B
            # With one position, (B, heads * d_k) is (B, heads, 1, d_k) in memory: splitting the heads is a view.
            q = q.view(batch, attention.n_heads, 1, attention.d_k)  # (B, H, 1, d_k)
            k = k.view(batch, attention.n_kv_heads, 1, attention.d_k)  # (B, H_kv, 1, d_k)
            v = v.view(batch, attention.n_kv_heads, 1, attention.d_k)  # (B, H_kv, 1, d_k)
            if layer.q_norm is not None and layer.k_norm is not None:  # QK norm
                q, k = layer.q_norm(q), layer.k_norm(k)
            if layer.rotary is not None:  # rotary positions: both turned by the angle of position `start`
                q, k = layer.rotary.forward(q, start), layer.rotary.forward(k, start)
            k, v = layer_cache.extend_self(k, v)  # (B, H_kv, cached + 1, d_k) each
            keys = k.shape[2]
            if layer.window is not None and keys > layer.window:  # sliding window: the last `window` keys only
                k, v = k[:, :, -layer.window :], v[:, :, -layer.window :]  # (B, H_kv, window, d_k) each
            if attention.record_weights:
                group = attention.n_heads // attention.n_kv_heads
                k, v = repeat_kv_heads(k, group), repeat_kv_heads(v, group)  # (B, H, <= cached + 1, d_k) each
                heads, weights = scaled_attention(q, k, v)  # (B, H, 1, d_k), (B, H, 1, <= cached + 1)
                # the keys outside the window get weight 0, as the masked softmax of the modules gives them
                attention.attention_weights = F.pad(weights.detach(), (keys - weights.shape[-1], 0))
            else:
                heads = F.scaled_dot_product_attention(
                    q, k, v, enable_gqa=attention.n_kv_heads != attention.n_heads
                )  # (B, H, 1, d_k)
                attention.attention_weights = None
            merged = heads.reshape(*x.shape[:-1], -1)  # (B, H d_k) or (H d_k,): the heads concatenated
            x = x + _linear(merged, layer.w_o, layer.b_o)  # W^O, residual
            x = x + layer.feed_forward(layer.norm2(x))
        cache.length += 1
        logits = _linear(model.norm(x), model.lm_head.weight, model.lm_head.bias)  # (B, V) or (V,)
        if model.config.logit_softcap is not None:
            logits = soft_cap(logits, model.config.logit_softcap)
    return logits.view(batch, 1, -1)  # (B, 1, V)


def _remove_biases(model: nn.Module) -> None:
    """bias=False (nanoGPT's option): no bias in any Linear, and LayerNorms without beta.

    The course's `LayerNorm` always adds its `bias`; here it becomes a constant zero buffer (not a
    parameter, not saved), so the same modules serve both settings.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.bias = None
        elif isinstance(module, LayerNorm):
            zeros = torch.zeros_like(module.bias, requires_grad=False)
            del module.bias
            module.register_buffer("bias", zeros, persistent=False)
