"""Chapter 11's switches of GPTConfig / GPT: each on its own and in the combinations the chapter uses.

For every switch: shapes and parameter counts, causality, the KV cache equal to recomputation (tokens identical,
float64 logits to 1e-10, also past block_size, where the cache is rebuilt from the cropped context), the fast and
explicit paths equal (outputs and gradients), the one-token step without the modules equal to the step through
them, and bad values refused with an error that names the field. With every switch at its default the model is
chapter 10's, bit for bit (initialisation and outputs), and chapter 10's checkpoints still load.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import test_gpt  # noqa: E402 - the shared test model of chapter 10
import torch
import torch.nn.functional as F
from test_gpt import BLOCK, LAYERS, D, H, V, small_config, tokens  # noqa: E402
from torch import nn

import transformer_lab as tl
from transformer_lab import gpt, training
from transformer_lab.data import TextTokenizer
from transformer_lab.feedforward import SwiGLU, relu_squared, swiglu_width
from transformer_lab.gpt import cache_bytes
from transformer_lab.modern import (
    Float32RMSNorm,
    RopeScaling,
    RotaryEmbedding,
    rope_frequencies,
    rotate_halves,
    rotate_pairs,
    soft_cap,
)

TOL = dict(rtol=1e-10, atol=1e-10)
LLAMA3 = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8)

# Each switch on its own (the rest GPT-2's).
SWITCHES: dict[str, dict[str, object]] = {
    "rope": dict(positions="rope"),
    "rope_halves": dict(positions="rope", rope_layout="halves"),
    "rope_base": dict(positions="rope", rope_base=500.0),
    "rope_llama3": dict(positions="rope", rope_scaling=LLAMA3),
    "rms": dict(norm="rms"),
    "rms_no_weight": dict(norm="rms_no_weight"),
    "norm_eps": dict(norm_eps=1e-3),
    "embedding_norm": dict(embedding_norm=True),
    "qk_norm": dict(qk_norm="rms"),
    "qk_norm_no_weight": dict(qk_norm="rms_no_weight"),
    "relu2": dict(activation="relu2"),
    "swiglu": dict(activation="swiglu"),
    "ff_width": dict(ff_width=24),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "head_dim": dict(head_dim=6),
    "softcap": dict(logit_softcap=2.0),
    "zero_init": dict(zero_init_output=True),
    "hf_float32": dict(positions="rope", norm="rms", qk_norm="rms", hf_float32=True),
    "window": dict(window_pattern="SL", window=3),
    "window_default": dict(window_pattern="SSSL"),  # a quarter of the context: 3 of 12
    "windows": dict(windows=(3, 5)),  # each layer's window written out: two sizes, the last layer windowed too
    "nanochat_init": dict(init="nanochat", tie_embeddings=False),
}
# The combinations the chapter uses.
COMBOS: dict[str, dict[str, object]] = {
    "rope+rms+swiglu+gqa": dict(positions="rope", norm="rms", activation="swiglu", n_kv_heads=2),
    "rope+qk_norm": dict(positions="rope", qk_norm="rms"),
    "relu2+softcap": dict(activation="relu2", logit_softcap=2.0),
    "llama": dict(
        positions="rope", rope_layout="halves", rope_scaling=LLAMA3, norm="rms", activation="swiglu", n_kv_heads=2,
        bias=False, tie_embeddings=False,
    ),
    "qwen3": dict(
        positions="rope", rope_layout="halves", norm="rms", qk_norm="rms", activation="swiglu", n_kv_heads=1,
        head_dim=6, bias=False,
    ),
    "nanochat": dict(
        positions="rope", norm="rms_no_weight", embedding_norm=True, qk_norm="rms_no_weight", activation="relu2",
        logit_softcap=3.0, zero_init_output=True, bias=False, tie_embeddings=False,
    ),
    "nanochat_window": dict(
        positions="rope", norm="rms_no_weight", embedding_norm=True, qk_norm="rms", activation="relu2",
        logit_softcap=3.0, bias=False, tie_embeddings=False, window_pattern="SSSL", window=4, init="nanochat",
        n_kv_heads=2,
    ),
}  # fmt: skip
EVERY = SWITCHES | COMBOS


def make_model(overrides: dict[str, object], record: bool = True, seed: int = 0) -> tl.GPT:
    """chapter 10's test model (float64, eval, every parameter perturbed) with the switches in `overrides`."""
    return test_gpt.make_model(record, seed, **overrides)


# ---------------------------------------------------------------- the defaults are chapter 10's model


def test_config_defaults_are_gpt2s() -> None:
    c = tl.GPTConfig(65)
    assert (c.positions, c.rope_base, c.rope_layout, c.rope_scaling) == ("learned", 10000.0, "pairs", None)
    assert (c.norm, c.norm_eps, c.embedding_norm, c.qk_norm) == ("layer", 1e-5, False, None)
    assert (c.n_kv_heads, c.head_dim, c.ff_width, c.logit_softcap) == (None, None, None, None)
    assert (c.zero_init_output, c.hf_float32, c.activation) == (False, False, "gelu_tanh")
    assert (c.window_pattern, c.window, c.windows, c.init, c.layer_windows) == (None, None, None, "gpt2", (None,) * 6)
    assert (c.d_k, c.kv_heads, c.d_ff) == (384 // 6, 6, 4 * 384)


def test_old_config_dicts_and_checkpoints_load_with_the_defaults(tmp_path: Path) -> None:
    """A checkpoint written before the switches existed holds only chapter 10's nine fields: it loads as the
    same model, every new field at its default."""
    chapter10_fields = [
        "vocab_size", "block_size", "d_model", "n_heads", "n_layers", "dropout", "bias", "tie_embeddings", "activation"
    ]  # fmt: skip
    config = small_config(bias=False)
    old = {k: v for k, v in config.to_dict().items() if k in chapter10_fields}
    assert tl.GPTConfig(**old) == config
    tokenizer = TextTokenizer([chr(ord("a") + i) for i in range(V)])
    torch.manual_seed(0)
    model = tl.GPT(config).eval()
    path = tmp_path / "chapter10.pt"
    training.save_gpt(model, path, tokenizer)
    data = torch.load(path, weights_only=True)
    data["config"] = {k: v for k, v in data["config"].items() if k in chapter10_fields}
    torch.save(data, path)
    loaded, _ = training.load_gpt(path)
    assert loaded.config == config
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


def test_modern_checkpoint_round_trip(tmp_path: Path) -> None:
    """Every switch is recorded in the checkpoint (rope_scaling as a plain dict) and read back."""
    config = small_config(**COMBOS["llama"], dropout=0.0)
    assert isinstance(config.to_dict()["rope_scaling"], dict)
    assert tl.GPTConfig(**config.to_dict()) == config
    tokenizer = TextTokenizer([chr(ord("a") + i) for i in range(V)])
    torch.manual_seed(0)
    model = tl.GPT(config).eval()
    training.save_gpt(model, tmp_path / "llama.pt", tokenizer)
    loaded, _ = training.load_gpt(tmp_path / "llama.pt")
    assert loaded.config == config
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


class Chapter10GPT(nn.Module):
    """Chapter 10's GPT as it was built before the switches: the reference for bit-identical defaults."""

    def __init__(self, c: tl.GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.position_embedding = tl.embedding.LearnedPositionalEmbedding(c.block_size, c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            tl.EncoderLayer(c.d_model, c.n_heads, 4 * c.d_model, c.dropout, norm_first=True, activation=c.activation)
            for _ in range(c.n_layers)
        )
        self.norm = tl.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        for layer in self.layers:
            nn.init.normal_(layer.self_attn.w_o.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))
            nn.init.normal_(layer.feed_forward.w2.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.position_embedding(self.token_embedding(idx)))
        mask = tl.causal_mask(idx.shape[1])
        for layer in self.layers:
            x = layer(x, mask)
        return self.lm_head(self.norm(x))


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
def test_default_switches_give_chapter_10s_model_bit_for_bit(activation: str) -> None:
    """The same seed gives the same weights, bit for bit, and the same logits, bit for bit, on both paths."""
    config = small_config(activation=activation)
    torch.manual_seed(3)
    model = tl.GPT(config)
    torch.manual_seed(3)
    reference = Chapter10GPT(config)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert model.embedding_norm is None and all(type(layer) is tl.EncoderLayer for layer in model.layers)
    idx = tokens(3, BLOCK)
    for dtype in (torch.float32, torch.float64):
        for record in (True, False):
            a, b = tl.record_attention(model.to(dtype).eval(), record), tl.record_attention(reference.to(dtype), record)
            with torch.no_grad():
                assert torch.equal(a(idx), b(idx))


# ---------------------------------------------------------------- structure: shapes and parameter counts


def expected_parameters(c: tl.GPTConfig) -> int:
    """The parameter count of a config, written out part by part."""
    d, dk, h, kv, ff, b = c.d_model, c.d_k, c.n_heads, c.kv_heads, c.d_ff, int(c.bias)
    attention = d * h * dk + 2 * d * kv * dk + h * dk * d + b * (h * dk + 2 * kv * dk + d)
    if c.activation == "swiglu":
        ffn = 3 * d * ff + b * (2 * ff + d)
    else:
        ffn = 2 * d * ff + b * (ff + d)
    norm = {"layer": d * (1 + b), "rms": d, "rms_no_weight": 0}[c.norm]
    qk = {None: 0, "rms": 2 * dk, "rms_no_weight": 0}[c.qk_norm]
    embeddings = c.vocab_size * d + (c.block_size * d if c.positions == "learned" else 0)
    head = 0 if c.tie_embeddings else c.vocab_size * d
    return embeddings + c.n_layers * (attention + ffn + 2 * norm + qk) + norm * (1 + c.embedding_norm) + head


@pytest.mark.parametrize("overrides", EVERY.values(), ids=EVERY.keys())
def test_shapes_and_parameter_count(overrides: dict) -> None:
    model = make_model(overrides)
    c = model.config
    assert sum(p.numel() for p in model.parameters()) == expected_parameters(c)
    attention = model.layers[0].self_attn
    assert attention.w_q.weight.shape == (c.n_heads * c.d_k, D)
    assert attention.w_k.weight.shape == attention.w_v.weight.shape == (c.kv_heads * c.d_k, D)
    assert attention.w_o.weight.shape == (D, c.n_heads * c.d_k)
    assert (model.position_embedding is None) == (c.positions == "rope")
    assert (attention.rotary is None) == (c.positions == "learned")
    with torch.no_grad():
        out = model(tokens(3, 7))
    assert out.shape == (3, 7, V) and out.dtype == torch.float64
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(3, 5), cache)
    assert all(layer.self_k.shape == (3, c.kv_heads, 5, c.d_k) for layer in cache.layers)


def test_the_modules_each_switch_picks() -> None:
    """Each switch is one module or function, PyTorch's own where there is one."""
    rms = tl.GPT(small_config(norm="rms", embedding_norm=True, qk_norm="rms_no_weight"))
    for norm in [rms.norm, rms.embedding_norm, rms.layers[0].norm1, rms.layers[1].norm2]:
        assert type(norm) is nn.RMSNorm and norm.weight.shape == (D,) and norm.eps == 1e-5
    q_norm = rms.layers[0].self_attn.q_norm
    assert type(q_norm) is nn.RMSNorm and q_norm.weight is None and q_norm.normalized_shape == (D // H,)
    assert tl.GPT(small_config(norm="rms_no_weight")).norm.weight is None
    assert type(tl.GPT(small_config(norm="rms", hf_float32=True)).norm) is Float32RMSNorm
    swiglu = tl.GPT(small_config(activation="swiglu")).layers[0].feed_forward
    assert type(swiglu) is SwiGLU and swiglu.w1.out_features == swiglu.w3.out_features == swiglu_width(D) == 48
    assert tl.GPT(small_config(activation="relu2")).layers[0].feed_forward.activation == "relu2"
    assert tl.GPT(small_config(activation="swiglu", ff_width=20)).layers[0].feed_forward.w1.out_features == 20
    rope = tl.GPT(small_config(positions="rope"))
    rotaries = {id(layer.self_attn.rotary) for layer in rope.layers}
    assert len(rotaries) == 1 and isinstance(rope.layers[0].self_attn.rotary, RotaryEmbedding)  # one, shared
    assert not any("position" in name for name in rope.state_dict())


def test_swiglu_width_rule() -> None:
    """8/3 D rounded up to a multiple of 8: the weights of a 4D two-matrix FFN, within a rounding."""
    assert [swiglu_width(d) for d in (16, 128, 384, 512)] == [48, 344, 1024, 1368]
    for d in (128, 512):
        assert abs(3 * d * swiglu_width(d) - 2 * d * 4 * d) / (8 * d * d) < 0.02


def test_initialisation_of_the_new_parts() -> None:
    """RMSNorm gains start at 1; with zero_init_output W^O and W_2 start at 0 (every block the identity), the
    rest as GPT-2's."""
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(500, block_size=64, d_model=128, n_heads=4, n_layers=2, **COMBOS["nanochat"]))
    for layer in model.layers:
        assert torch.all(layer.self_attn.w_o.weight == 0) and torch.all(layer.feed_forward.w2.weight == 0)
    others = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, nn.Linear) and m.weight.any()])
    assert others.std().item() == pytest.approx(0.02, rel=0.03)
    idx = torch.randint(0, 500, (2, 10))
    with torch.no_grad():  # the blocks add nothing: logits from the embedding alone
        direct = soft_cap(model.lm_head(model.norm(model.embedding_norm(model.token_embedding(idx)))), 3.0)
        torch.testing.assert_close(model(idx), direct, rtol=0, atol=0)
    torch.manual_seed(0)
    gains = tl.GPT(small_config(norm="rms", qk_norm="rms"))
    assert all(torch.all(p == 1) for name, p in gains.named_parameters() if "norm" in name)


# ---------------------------------------------------------------- what each switch computes


def test_rotary_layouts_frequencies_and_relative_positions() -> None:
    """Pairs turn (x_2i, x_2i+1), halves (x_i, x_i+d/2), by the angle t omega_i with omega_i = base^(-2i/d);
    the two layouts are one permutation apart, and a query-key score depends only on the offset."""
    d, base = 8, 100.0
    torch.manual_seed(0)
    x = torch.randn(2, 5, d, dtype=torch.float64)
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(rope_frequencies(d, base), omega, **TOL)
    pairs = RotaryEmbedding(d, 16, base, "pairs")(x)
    expected = x.clone()
    for t in range(5):
        for i in range(d // 2):
            c, s = math.cos(t * omega[i].item()), math.sin(t * omega[i].item())
            a, b = x[:, t, 2 * i], x[:, t, 2 * i + 1]
            expected[:, t, 2 * i], expected[:, t, 2 * i + 1] = a * c - b * s, a * s + b * c
    torch.testing.assert_close(pairs, expected, **TOL)
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()  # halves -> pairs
    halves = RotaryEmbedding(d, 16, base, "halves")(x)
    torch.testing.assert_close(RotaryEmbedding(d, 16, base, "pairs")(x[..., order]), halves[..., order], **TOL)
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    rotary = RotaryEmbedding(d, 16, base)
    rows = torch.stack([q, k]).expand(16, 2, d).transpose(0, 1)  # (2, 16, d): q and k at every position
    turned_q, turned_k = rotary(rows)
    scores = [(turned_q[m] @ turned_k[n]).item() for m, n in ((3, 1), (9, 7), (15, 13))]  # offset 2 each
    assert scores == pytest.approx([scores[0]] * 3, abs=1e-12)
    torch.testing.assert_close(rotary(rows[:, 4:6], start=4), torch.stack([turned_q[4:6], turned_k[4:6]]), **TOL)
    assert rotary.rotate is rotate_pairs and RotaryEmbedding(d, 16, layout="halves").rotate is rotate_halves


def test_rotate_pairs_in_complex_numbers_is_the_real_formula() -> None:
    """`rotate_pairs` multiplies complex numbers where it can (float32, float64): the real formula's outputs and
    gradients, on the strided views of queries and keys the fast path passes, on a view that must be copied first
    (an odd offset), and in bfloat16, which has no complex type and takes the real formula."""

    def written_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    d, heads, length = 8, 2, 5
    tolerance = {torch.float64: TOL, torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=0, atol=0)}
    for dtype, tol in tolerance.items():
        cos, sin = RotaryEmbedding(d, 16).tables(dtype)
        cos, sin = cos[:length], sin[:length]
        torch.manual_seed(0)
        packed = torch.randn(3, length, 3 * heads * d, dtype=dtype)  # (B, L, [q; k; v]) as the fast path packs it
        grad = torch.randn(3, heads, length, d, dtype=dtype)
        for first in (0, heads * d, 1):  # the queries, the keys, and an odd offset (not viewable as complex)
            results = []
            for rotate in (rotate_pairs, written_out):
                leaf = packed.clone().requires_grad_()
                x = leaf[..., first : first + heads * d].unflatten(-1, (heads, d)).transpose(1, 2)  # (B, H, L, d)
                out = rotate(x, cos, sin)
                out.backward(grad)
                results.append((out, leaf.grad))
            (out, grad_in), (expected, expected_grad) = results
            torch.testing.assert_close(out, expected, **tol)
            torch.testing.assert_close(grad_in, expected_grad, **tol)


def test_llama3_scaling_keeps_short_stretches_long_and_blends_between() -> None:
    """Llama 3's rule, by its definition: wavelengths below L / high_freq_factor kept, above L / low_freq_factor
    divided by the factor, smoothly interpolated in between."""
    d, base, s = 16, 10000.0, RopeScaling(factor=8.0, original_max_position_embeddings=64)
    plain, scaled = rope_frequencies(d, base), rope_frequencies(d, base, s)
    wavelength = 2 * math.pi / plain
    short, long = wavelength < 64 / 4, wavelength > 64 / 1
    middle = ~short & ~long
    assert short.any() and long.any() and middle.any()  # all three regimes at this size
    torch.testing.assert_close(scaled[short], plain[short], **TOL)
    torch.testing.assert_close(scaled[long], plain[long] / 8, **TOL)
    assert torch.all(scaled[middle] < plain[middle]) and torch.all(scaled[middle] > plain[middle] / 8)


def test_rms_norms_and_their_float32_variant() -> None:
    """The model's RMSNorm is PyTorch's; Float32RMSNorm is the same formula computed in float32 (Hugging Face's
    arithmetic): equal to it in float32, within float32 rounding of the float64 result in float64."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64) * 4
    gamma = torch.rand(8, dtype=torch.float64) + 0.5
    exact = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    hf_norm = Float32RMSNorm(8, eps=1e-6).double()
    torch_norm = nn.RMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        hf_norm.weight.copy_(gamma)
        torch_norm.weight.copy_(gamma)
        torch.testing.assert_close(torch_norm(x), exact, **TOL)
        gap = (hf_norm(x) - exact).abs().max().item()
        assert 0 < gap < 1e-6  # float32 inside
        torch.testing.assert_close(hf_norm.float()(x.float()), torch_norm.float()(x.float()), rtol=1e-6, atol=1e-6)
    assert Float32RMSNorm(8, weight=False).weight is None


def test_qk_norm_normalises_each_heads_queries_and_keys() -> None:
    """Without gains, every head's query and key vector has root mean square 1 after the QK norm."""
    model = make_model(dict(qk_norm="rms_no_weight", n_kv_heads=2, norm_eps=1e-12))  # eps too small to matter
    seen: dict[str, torch.Tensor] = {}
    attention = model.layers[0].self_attn
    for name, norm in (("q", attention.q_norm), ("k", attention.k_norm)):
        norm.register_forward_hook(lambda module, args, out, name=name: seen.__setitem__(name, out))
    with torch.no_grad():
        model(tokens(2, 6))
    q, k = seen["q"], seen["k"]
    assert q.shape == (2, H, 6, D // H) and k.shape == (2, 2, 6, D // H)
    for t in (q, k):
        torch.testing.assert_close(t.pow(2).mean(-1), torch.ones(t.shape[:-1], dtype=torch.float64), **TOL)


def test_feed_forward_variants_are_their_formulas() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    z = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert torch.equal(relu_squared(z), torch.clamp(z, min=0) ** 2)
    relu2 = tl.FeedForward(D, 24, activation="relu2").double()
    torch.testing.assert_close(relu2(x), relu2.w2(torch.clamp(relu2.w1(x), min=0) ** 2), **TOL)
    swiglu = SwiGLU(D, 20).double()
    assert swiglu.w1.bias is None  # bias-free by default, as Llama
    a = swiglu.w1(x)
    torch.testing.assert_close(swiglu(x), swiglu.w2(a * torch.sigmoid(a) * swiglu.w3(x)), **TOL)
    with pytest.raises(ValueError, match="d_model"):
        swiglu(torch.randn(2, 3, D + 1, dtype=torch.float64))


def test_relu_squared_gradient_is_twice_relu() -> None:
    """d/dx max(0, x)^2 = 2 max(0, x): the product r * r that `relu_squared` computes has `square`'s gradient."""
    z = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(relu_squared(z).sum(), z)
    assert torch.equal(gradient, 2 * torch.clamp(z.detach(), min=0))


def test_logit_softcap_bounds_the_logits() -> None:
    """logits = c tanh(z / c) of the same model without the cap; never beyond c."""
    capped = make_model(dict(logit_softcap=0.5))
    plain = tl.GPT(small_config()).double().eval()
    plain.load_state_dict(capped.state_dict())
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        z, out = plain(idx), capped(idx)
    assert z.abs().max() > 0.5 > out.abs().max()
    torch.testing.assert_close(out, 0.5 * torch.tanh(z / 0.5), **TOL)


def test_grouped_query_attention_is_chapter_03s() -> None:
    """Query head h reads key/value head h // (H / H_kv): the module equals that written out head by head, on
    both paths, with a causal mask."""
    torch.manual_seed(0)
    attention = tl.MultiHeadAttention(D, H, n_kv_heads=2, d_k=6).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    mask = tl.causal_mask(5)
    q = attention.w_q(x).view(2, 5, H, 6).transpose(1, 2)
    k = attention.w_k(x).view(2, 5, 2, 6).transpose(1, 2)
    v = attention.w_v(x).view(2, 5, 2, 6).transpose(1, 2)
    heads = []
    for h in range(H):
        scores = q[:, h] @ k[:, h // 2].transpose(-2, -1) / math.sqrt(6)
        heads.append(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v[:, h // 2])
    expected = attention.w_o(torch.cat(heads, dim=-1))
    with torch.no_grad():
        torch.testing.assert_close(attention(x, x, x, mask), expected, **TOL)
        assert attention.attention_weights.shape == (2, H, 5, 5)
        tl.record_attention(attention, False)
        torch.testing.assert_close(attention(x, x, x, mask), expected, **TOL)
    assert "n_kv_heads=2" in repr(attention)


def test_head_dim_is_independent_of_d_model() -> None:
    """head_dim frees d_k from D / H (Qwen3): D need not even be divisible by H."""
    model = tl.GPT(tl.GPTConfig(V, block_size=BLOCK, d_model=18, n_heads=4, n_layers=1, head_dim=4))
    assert model.layers[0].self_attn.w_q.weight.shape == (16, 18)
    assert model(tokens(1, 5)).shape == (1, 5, V)


# ---------------------------------------------------------------- causality, paths, the cache


@pytest.mark.parametrize("overrides", EVERY.values(), ids=EVERY.keys())
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_causality(overrides: dict, record: bool) -> None:
    """Changing a later token never changes an earlier logit."""
    model = make_model(overrides, record)
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        logits = model(idx)
        for t in (1, 6):
            changed = idx.clone()
            changed[:, t:] = (changed[:, t:] + 1 + torch.arange(BLOCK - t)) % V
            other = model(changed)
            torch.testing.assert_close(other[:, :t], logits[:, :t], rtol=0, atol=1e-12)
            assert (other[:, t] - logits[:, t]).abs().max() > 1e-6


@pytest.mark.parametrize("overrides", EVERY.values(), ids=EVERY.keys())
def test_fast_and_explicit_paths_are_equal(overrides: dict) -> None:
    """record_attention on or off: the same logits and the same gradients."""
    idx, target = tokens(2, BLOCK), tokens(2, BLOCK, seed=2)
    runs = []
    for record in (True, False):
        model = make_model(overrides, record)
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
        runs.append((logits.detach(), [p.grad for p in model.parameters()]))
    (explicit, explicit_grads), (fast, fast_grads) = runs
    torch.testing.assert_close(fast, explicit, **TOL)
    for a, b in zip(fast_grads, explicit_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("overrides", EVERY.values(), ids=EVERY.keys())
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_cache_step_by_step_equals_full_forward(overrides: dict, record: bool) -> None:
    model = make_model(overrides, record)
    idx = tokens(3, BLOCK)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :4], cache)] + [model(idx[:, t : t + 1], cache) for t in range(4, BLOCK)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)


@pytest.mark.parametrize("overrides", EVERY.values(), ids=EVERY.keys())
@pytest.mark.parametrize("batch", [1, 3])
def test_one_token_step_supports_every_switch(overrides: dict, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-token step without the modules runs for every switch, and gives what the modules give (same
    tokens, float64 logits to 1e-10, the same recorded attention weights), on both paths."""
    calls: list[int] = []
    step = gpt._decode_step
    monkeypatch.setattr(gpt, "_decode_step", lambda *args: calls.append(1) or step(*args))
    for record in (True, False):
        model = make_model(overrides, record)
        assert gpt._decode_plan(model) is not None
        idx = tokens(batch, 3)
        lean = model.generate(idx, 8, temperature=0, return_logits=True)
        lean_weights = [layer.self_attn.attention_weights for layer in model.layers]
        through = model.generate(idx, 8, temperature=0, return_logits=True, through_modules=True)
        assert torch.equal(lean[0], through[0])
        torch.testing.assert_close(lean[1], through[1], **TOL)
        for a, layer in zip(lean_weights, model.layers, strict=True):
            b = layer.self_attn.attention_weights
            if record:
                assert a.shape == (batch, H, 1, 10)
                torch.testing.assert_close(a, b, **TOL)
            else:
                assert a is None and b is None
    assert len(calls) == 2 * 7


def test_a_hook_on_a_new_module_sends_the_step_through_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step without the modules checks the new modules too: a hook on a QK norm or on the rotary module
    falls back to the modules (which then see every token), with the same result."""
    calls: list[int] = []
    step = gpt._decode_step
    monkeypatch.setattr(gpt, "_decode_step", lambda *args: calls.append(1) or step(*args))
    model = make_model(COMBOS["qwen3"])
    idx = tokens(2, 3)
    lean = model.generate(idx, 5, temperature=0, return_logits=True)
    assert len(calls) == 4
    for module in (model.layers[1].self_attn.k_norm, model.layers[0].self_attn.rotary):
        seen: list[int] = []
        handle = module.register_forward_hook(lambda m, args, out, seen=seen: seen.append(args[0].shape[-2]))
        hooked = model.generate(idx, 5, temperature=0, return_logits=True)
        handle.remove()
        assert len(calls) == 4 and seen[-4:] == [1, 1, 1, 1]
        assert torch.equal(hooked[0], lean[0])
        torch.testing.assert_close(hooked[1], lean[1], **TOL)


GENERATIONS = {
    "inside_block": (3, 6, dict(temperature=0)),  # greedy, inside block_size
    "past_block": (3, 25, dict(temperature=0)),  # greedy, far past block_size: the cache rebuilt from the crop
    "long_prompt": (BLOCK + 5, 4, dict(temperature=0)),  # a prompt longer than block_size is cropped
    "top_k": (2, 20, dict(temperature=0.8, top_k=10)),
}
# Every switch generating past block_size; the chapter's combinations in every setting.
CACHE_CASES = [pytest.param(o, *GENERATIONS["past_block"], id=f"{n}-past_block") for n, o in SWITCHES.items()] + [
    pytest.param(o, *g, id=f"{n}-{k}") for n, o in COMBOS.items() for k, g in GENERATIONS.items()
]


@pytest.mark.parametrize(("overrides", "prompt", "new", "sampling"), CACHE_CASES)
def test_generate_with_cache_equals_recomputation(overrides: dict, prompt: int, new: int, sampling: dict) -> None:
    model = make_model(overrides, record=False)
    idx = tokens(3, prompt)
    (cached, cached_logits), (recomputed, recomputed_logits) = (
        model.generate(
            idx, new, **sampling, generator=torch.Generator().manual_seed(7), use_cache=use, return_logits=True
        )
        for use in (True, False)
    )
    assert cached.shape == (3, prompt + new)
    assert torch.equal(cached, recomputed)
    torch.testing.assert_close(cached_logits, recomputed_logits, **TOL)


def test_generation_past_block_size_rebuilds_from_the_cropped_context() -> None:
    """As in chapter 10: the prompt, then one token at a time while the cache has room, then (the context full)
    the whole cropped context every step, at positions 0 .. block_size - 1 again; each logit row is forward() of
    the last block_size tokens."""
    model = make_model(COMBOS["rope+rms+swiglu+gqa"])
    lengths: list[int] = []
    model.token_embedding.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[1]))
    out, logits = model.generate(tokens(2, 5), 12, temperature=0, return_logits=True)
    assert lengths == [5] + [1] * 6 + [BLOCK] * 5
    with torch.no_grad():
        for step in range(12):
            end = 5 + step
            torch.testing.assert_close(logits[:, step], model(out[:, max(0, end - BLOCK) : end])[:, -1], **TOL)


def test_cache_in_float32_and_bfloat16() -> None:
    """The dtypes a learner trains in: the cached logits equal recomputation to the dtype's precision and keep it."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        model = make_model(COMBOS["qwen3"], record=False).to(dtype)
        runs = [model.generate(tokens(2, 3), 8, temperature=0, use_cache=u, return_logits=True) for u in (True, False)]
        assert runs[0][1].dtype == dtype
        torch.testing.assert_close(runs[0][1], runs[1][1], rtol=tol, atol=tol)


def test_kv_cache_memory_with_grouped_query_attention() -> None:
    """The cache stores the key/value heads only: H / H_kv times less memory than multi-head attention."""
    sizes = {}
    for kv in (H, 2, 1):
        model = make_model(dict(positions="rope", n_kv_heads=kv))
        cache = model.new_cache()
        with torch.no_grad():
            model(tokens(3, BLOCK), cache)
        sizes[kv] = cache_bytes(cache)
        assert sizes[kv] == model.kv_cache_bytes(BLOCK, batch=3) == 2 * LAYERS * 3 * kv * BLOCK * (D // H) * 8
    assert sizes[H] == 2 * sizes[2] == 4 * sizes[1]
    with pytest.raises(TypeError, match="cache"):
        cache_bytes({})
    with pytest.raises(ValueError, match="length"):
        make_model({}).kv_cache_bytes(0)


def test_train_gpt_trains_a_modern_model() -> None:
    """Chapter 10's training loop runs the switches unchanged (the loss goes down)."""
    text = "to be or not to be, that is the question. " * 20
    tokenizer = TextTokenizer.from_text(text)
    data = tokenizer.encode(text)
    torch.manual_seed(0)
    config = tl.GPTConfig(tokenizer.vocab_size, block_size=16, d_model=16, n_heads=4, n_layers=1, **COMBOS["nanochat"])
    model = tl.GPT(config)
    history = training.train_gpt(
        model, data, data, steps=30, batch_size=8, lr=1e-2, warmup=5, eval_every=15, eval_batch_size=16, progress=False
    )
    assert history.val_loss[-1] < history.val_loss[0]


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        (dict(positions="alibi"), ValueError, "positions"),
        (dict(positions="rope", rope_layout="interleaved"), ValueError, "rope_layout"),
        (dict(rope_layout="halves"), ValueError, "rope_layout.*positions='rope'"),
        (dict(rope_base=500.0), ValueError, "rope_base.*positions='rope'"),
        (dict(positions="rope", rope_base=0), ValueError, "rope_base"),
        (dict(positions="rope", rope_base="10000"), TypeError, "rope_base"),
        (dict(positions="rope", rope_scaling=dict(rope_type="yarn")), ValueError, "rope_type 'yarn'.*llama3"),
        (dict(positions="rope", rope_scaling=dict(factor=8.0, ramp=1)), ValueError, "rope_scaling.*ramp"),
        (dict(positions="rope", rope_scaling=dict(low_freq_factor=4.0)), ValueError, "high_freq_factor"),
        (dict(positions="rope", rope_scaling=[8.0]), TypeError, "rope_scaling"),
        (dict(positions="rope", head_dim=5), ValueError, "d_k must be even"),
        (dict(norm="batch"), ValueError, "norm must be one of"),
        (dict(norm_eps=0.0), ValueError, "norm_eps"),
        (dict(norm_eps=-1e-5), ValueError, "norm_eps"),
        (dict(embedding_norm=1), TypeError, "embedding_norm"),
        (dict(qk_norm="layer"), ValueError, "qk_norm"),
        (dict(qk_norm=True), ValueError, "qk_norm"),
        (dict(activation="geglu"), ValueError, "activation"),
        (dict(n_kv_heads=3), ValueError, "n_kv_heads must divide n_heads"),
        (dict(n_kv_heads=0), ValueError, "n_kv_heads"),
        (dict(n_kv_heads=2.0), TypeError, "n_kv_heads"),
        (dict(head_dim=0), ValueError, "head_dim"),
        (dict(d_model=18), ValueError, "divisible by n_heads.*head_dim"),
        (dict(ff_width=-4), ValueError, "ff_width"),
        (dict(logit_softcap=0.0), ValueError, "logit_softcap"),
        (dict(logit_softcap=float("inf")), ValueError, "logit_softcap"),
        (dict(zero_init_output="yes"), TypeError, "zero_init_output"),
        (dict(hf_float32=None), TypeError, "hf_float32"),
    ],
)
def test_bad_values_are_refused_naming_the_field(overrides: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        small_config(**overrides)


def test_bad_module_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="n_kv_heads must divide"):
        tl.MultiHeadAttention(D, H, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_k"):
        tl.MultiHeadAttention(D, H, d_k=0)
    with pytest.raises(TypeError, match="qk_norm"):
        tl.MultiHeadAttention(D, H, qk_norm="rms")
    with pytest.raises(TypeError, match="rotary"):
        tl.MultiHeadAttention(D, H, rotary="rope")
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(5, 8)
    with pytest.raises(ValueError, match="layout"):
        RotaryEmbedding(4, 8, layout="interleaved")
    with pytest.raises(ValueError, match="beyond the 8 positions"):
        RotaryEmbedding(4, 8)(torch.zeros(1, 3, 4), start=6)
    with pytest.raises(ValueError, match="context too long.*rotary tables"):
        make_model(dict(positions="rope"))(tokens(1, BLOCK + 1))


def test_config_is_frozen_and_hashable() -> None:
    config = small_config(**COMBOS["llama"])
    assert hash(config) == hash(dataclasses.replace(config))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.norm = "layer"  # type: ignore[misc]


# ---------------------------------------------------------------- training at equal time (chapter 11)


def budget_data() -> tuple[torch.Tensor, torch.Tensor]:
    stream = torch.randint(0, V, (4000,), generator=torch.Generator().manual_seed(3))
    return stream[:3600], stream[3600:]


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_a_time_budget_stops_the_run_and_decays_over_the_time(clock: str) -> None:
    train, val = budget_data()
    torch.manual_seed(0)
    model = tl.GPT(small_config())
    run = training.train_gpt(
        model,
        train,
        val,
        steps=100_000,
        batch_size=4,
        lr=1e-2,
        min_lr=1e-4,
        warmup=3,
        eval_every=10**6,
        seconds=0.5,
        clock=clock,
        progress=False,
    )
    steps = len(run.step)
    assert 3 < steps < 100_000  # stopped by the clock, not by the step cap
    assert run.eval_step == [steps] and run.eval_seconds[0] >= 0.5  # the last step, evaluated once
    assert run.lr[:3] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2])  # the warm-up counts steps
    assert run.lr[-1] == pytest.approx(1e-4, abs=5e-4)  # the cosine reached min_lr with the time
    assert all(a >= b for a, b in zip(run.lr[3:], run.lr[4:], strict=False))  # and only decays
    assert training.TRAINING_CLOCKS[clock] in (__import__("time").perf_counter, __import__("time").process_time)


def test_a_step_cap_still_ends_a_timed_run() -> None:
    train, val = budget_data()
    torch.manual_seed(0)
    run = training.train_gpt(
        tl.GPT(small_config()), train, val, steps=5, batch_size=4, lr=1e-2, warmup=2, seconds=60.0, progress=False
    )
    assert run.step == [1, 2, 3, 4, 5] and run.eval_step == [5]
    assert run.lr[-1] > 1e-3  # the cosine over 60 s had hardly begun


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(seconds=0.0), "seconds"),
        (dict(seconds=float("nan")), "seconds"),
        (dict(seconds=1.0, decay_steps=3), "decay_steps .* cannot be given with seconds"),
        (dict(clock="gpu"), "clock must be one of"),
    ],
)
def test_bad_time_budgets_are_refused(kwargs: dict, match: str) -> None:
    train, val = budget_data()
    with pytest.raises((ValueError, TypeError), match=match):
        training.train_gpt(
            tl.GPT(small_config()), train, val, steps=5, batch_size=4, warmup=2, progress=False, **kwargs
        )


# ---------------------------------------------------------------- the ablation's table (chapter 11)


def ablation_runs() -> list[dict]:
    losses = {"chapter 10": 1.86, "+ A": 1.80, "+ B": 1.87, "full modern": 1.70, "- A": 1.75, "full + C": 1.701}
    return [
        dict(variant=name, seed=seed, val_loss=loss + 0.01 * seed, steps=100 + seed, train_seconds=10.0)
        for seed in range(3)
        for name, loss in losses.items()
    ]


def test_ablation_summary_gives_mean_spread_and_a_verdict_against_the_seed_spread() -> None:
    table = training.ablation_summary(ablation_runs())
    assert list(table) == ["chapter 10", "+ A", "+ B", "full modern", "- A", "full + C"]
    base = table["chapter 10"]
    assert base["n"] == 3 and base["mean"] == pytest.approx(1.87) and base["spread"] == pytest.approx(0.02)
    assert base["steps"] == 101 and "gain" not in base
    assert table["+ A"]["gain"] == pytest.approx(0.06) and table["+ A"]["helps"]  # 0.06 > the spread 0.02
    assert table["+ B"]["gain"] == pytest.approx(-0.01) and not table["+ B"]["helps"] and not table["+ B"]["hurts"]
    assert table["- A"]["reference"] == "full modern"
    assert table["- A"]["gain"] == pytest.approx(0.05) and table["- A"]["helps"]  # removing A costs 0.05
    assert table["full + C"]["gain"] == pytest.approx(-0.001) and not table["full + C"]["hurts"]
    assert table["full modern"]["reference"] == "chapter 10" and table["full modern"]["gain"] == pytest.approx(0.16)
    timed = [dict(r, variant="chapter 10, timed", val_loss=r["val_loss"] - 0.03) for r in ablation_runs()[:1]]
    with_timed = training.ablation_summary(ablation_runs() + timed)  # chapter 10 trained for the variants' time
    assert with_timed["+ A"]["reference"] == "chapter 10, timed" and "gain" not in with_timed["chapter 10, timed"]
    assert with_timed["+ A"]["gain"] == pytest.approx(0.02) and with_timed["- A"]["reference"] == "full modern"
    assert table["+ A"]["verdict"] == "helps" and table["+ B"]["verdict"] == "within noise"
    assert with_timed["+ A"]["verdict"] == "fewer than 3 seeds"  # its timed reference has one seed
    lonely = training.ablation_summary([r for r in ablation_runs() if r["variant"] == "+ A"])
    assert "gain" not in lonely["+ A"]  # no reference in the log: no verdict


@pytest.mark.parametrize(
    ("runs", "error", "match"),
    [({"variant": "x"}, TypeError, "runs must be a list"), ([{"variant": "x"}], ValueError, r"runs\[0\] must be")],
)
def test_ablation_summary_refuses_what_is_not_a_log(runs: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        training.ablation_summary(runs)  # type: ignore[arg-type]


def test_ablation_figure_draws_one_bar_per_change() -> None:
    import matplotlib

    matplotlib.use("Agg")
    fig = tl.plotting.modern.ablation_gains(training.ablation_summary(ablation_runs()))
    left, right = fig.axes
    assert [t.get_text() for t in left.get_yticklabels()] == ["full modern", "+ B", "+ A"]
    assert [t.get_text() for t in right.get_yticklabels()] == ["full + C", "- A"]
    with pytest.raises(ValueError, match="no row with a gain"):
        tl.plotting.modern.ablation_gains({"chapter 10": {"mean": 1.0}})


# ---------------------------------------------------------------- the ablation's step budgets (modern_decoder.py)


def _modern_decoder():
    import importlib
    import sys

    benchmarks = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    return importlib.import_module("modern_decoder")


def test_step_costs_times_every_variant_it_is_given() -> None:
    md = _modern_decoder()
    costs = md.step_costs(["chapter 10", "+ Muon"], rounds=2, steps=1)
    assert list(costs) == ["chapter 10", "+ Muon"]
    assert all(len(values) == 2 and all(v > 0 for v in values) for values in costs.values())


def test_the_shipped_log_ran_the_step_budgets_of_the_shipped_costs() -> None:
    """Every variant's budget is 1400 x (chapter 10's step time / its own), and every run of the log chapter 11
    reads took exactly its variant's budget, three seeds each. Runs of the later "full + X" variants may wait in
    `md.LATER` (complete, three seeds each) until chapter 11 is executed again with them, or not be run yet."""
    import json

    md = _modern_decoder()
    costs = json.loads(md.COSTS.read_text(encoding="utf-8"))
    ms = costs["step_ms"]
    assert set(ms) == set(md.variants()) - {md.TIMED_REFERENCE}
    for name, cost in ms.items():
        assert costs["steps"][name] == max(1, round(1400 * ms["chapter 10"] / cost)), name
    for name, twin in costs.get("same_step_as", {}).items():  # only the initial values differ: the same step
        assert ms[name] == ms[twin] and md.SAME_STEP_AS[name] == twin, name
    runs = [json.loads(line) for line in md.LOG.read_text(encoding="utf-8").splitlines()]
    later_lines = md.LATER.read_text(encoding="utf-8").splitlines() if md.LATER.exists() else []
    later = [json.loads(line) for line in later_lines]
    new = {f"full + {name}" for name in md.FULL_PLUS}
    assert {r["variant"] for r in later} <= new
    ran = {r["variant"] for r in runs + later}
    expected = [(n, s) for n in ms if n not in new or n in ran for s in (0, 1, 2)]
    assert sorted((r["variant"], r["seed"]) for r in runs + later) == sorted(expected)
    for run in runs + later:
        assert run["clock"] == "steps" and run["steps"] == costs["steps"][run["variant"]], run["variant"]
        assert run["recipe"]["steps"] == run["steps"]


def test_the_equal_steps_groups_say_what_is_left_of_a_change() -> None:
    """A change within noise at equal steps helped (or hurt) at equal time only through its cheaper (or dearer)
    step, its cost taken with the change over without it: for "- X" the full model's step over the variant's, and
    only where that cost differs from 1 by more than 3 % (1.3 % more steps cannot make a gain beyond the noise).
    With fewer than three seeds, in the row or its reference, the noise is also the variant's own spread at equal
    time, and the reading is marked. The benchmark's table and chapter 11's cell call this one function."""
    from transformer_lab import gpt_training

    md = _modern_decoder()
    assert md.per_step_group is gpt_training.per_step_group and md.PER_STEP_GROUPS is gpt_training.PER_STEP_GROUPS
    assert md.EQUAL_STEPS_GAP == gpt_training.EQUAL_STEPS_GAP == 0.03
    change_cost, group_of = gpt_training.change_step_cost, gpt_training.per_step_group
    cost = {"chapter 10": 100.0, "full modern": 140.0, "+ A": 90.0, "+ B": 120.0, "- C": 150.0, "full + D": 147.0}
    cost.update({"+ E": 98.7, "+ F": 101.1, "- G": 140.0 / 0.987, "full + H": 140.0 * 1.011})
    assert change_cost("+ A", cost) == 0.9 and change_cost("full + D", cost) == 1.05
    assert change_cost("- C", cost) == 140.0 / 150.0  # C makes the full model's step cheaper
    assert change_cost("- G", cost) == pytest.approx(0.987) and change_cost("full + H", cost) == pytest.approx(1.011)

    def rows(timed_gain: float, step_gain: float, n: int = 3, ref_n: int = 3) -> tuple[dict, dict]:
        timed = dict(gain=timed_gain, spread=0.01, helps=timed_gain > 0.01, hurts=-timed_gain > 0.01)
        verdict = "fewer than 3 seeds" if min(n, ref_n) < 3 else "within noise"
        return timed, dict(gain=step_gain, noise=0.002 if min(n, ref_n) < 3 else 0.01, n=n, verdict=verdict)

    groups = gpt_training.PER_STEP_GROUPS
    assert group_of("+ A", *rows(0.04, 0.03), cost) == (groups[0], False)  # helps per step
    assert group_of("+ A", *rows(0.04, 0.005), cost) == (groups[1], False)  # only its cheaper step
    assert group_of("- C", *rows(0.04, 0.005), cost) == (groups[1], False)
    assert group_of("+ B", *rows(-0.03, -0.002), cost) == (groups[2], False)  # only its dearer step
    assert group_of("+ B", *rows(-0.03, -0.02), cost) == (groups[3], False)  # hurts per step
    assert group_of("+ B", *rows(0.04, 0.005), cost) == (groups[4], False)  # dearer, yet helped in time
    assert group_of("full + D", *rows(0.0, 0.0), cost) == (groups[4], False)
    # a step within 3 % of the one without the change: its extra (or missing) steps explain nothing
    for name in ("+ E", "- G"):  # 0.987
        assert group_of(name, *rows(0.04, 0.005), cost) == (groups[4], False), name
        assert group_of(name, *rows(0.04, 0.03), cost) == (groups[0], False), name
    for name in ("+ F", "full + H"):  # 1.011
        assert group_of(name, *rows(-0.03, -0.002), cost) == (groups[4], False), name
        assert group_of(name, *rows(-0.03, -0.02), cost) == (groups[3], False), name
    # one seed: 0.005 beats the reference's spread (0.002) but not the variant's own spread at equal time (0.01)
    assert group_of("+ A", *rows(0.04, 0.005, n=1), cost) == (groups[1], True)
    assert group_of("+ A", *rows(0.04, 0.015, n=1), cost) == (groups[0], True)
    # three seeds of the variant but one of its reference: still provisional
    assert group_of("+ A", *rows(0.04, 0.005, ref_n=1), cost) == (groups[1], True)


def test_the_equal_steps_log_may_hold_chapter_10_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ablation --budget equal-steps --variants "chapter 10"` trains chapter 10's own recipe for its 1400 steps
    (no overrides), the reference of the "+ X" rows on the same machine; it comes first by default; a variant
    whose step is within 3 % of chapter 10's is refused, naming the option."""
    md = _modern_decoder()
    ran: list[list[dict]] = []
    monkeypatch.setattr(md, "_run_jobs", lambda jobs, n_jobs, log: ran.append(jobs) or [])
    log = tmp_path / "steps.jsonl"
    assert md.main(["ablation", "--budget", "equal-steps", "--variants", "chapter 10", "--log", str(log)]) == 0
    assert [(j["variant"], j["seed"]) for j in ran[0]] == [("chapter 10", s) for s in (0, 1, 2)]
    costs = __import__("json").loads(md.COSTS.read_text(encoding="utf-8"))
    for job in ran[0]:
        assert job["overrides"] == {} and job["recipe"] == md.CHAPTER_10 and job["recipe"]["steps"] == 1400
        assert job["clock"] == "steps" and job["step_cost_ms"] == costs["step_ms"]["chapter 10"]
    assert md.main(["ablation", "--budget", "equal-steps", "--log", str(log)]) == 0
    assert ran[1][0]["variant"] == "chapter 10" and "+ rotary positions" not in {j["variant"] for j in ran[1]}
    assert md.main(["ablation", "--budget", "equal-steps", "--variants", "+ rotary positions", "--log", str(log)]) == 2
    assert len(ran) == 2


def test_the_ablation_log_is_read_while_a_run_appends_to_it(tmp_path: Path) -> None:
    """A last line that does not parse (half written) is skipped; a bad line before it is an error."""
    md = _modern_decoder()
    log = tmp_path / "log.jsonl"
    log.write_text('{"variant": "a"}\n{"variant": "b"}\n{"variant": "c", "val', encoding="utf-8")
    assert [r["variant"] for r in md._read_log(log)] == ["a", "b"]
    log.write_text('{"variant": "a"}\n{"variant": "b", "val\n{"variant": "c"}\n', encoding="utf-8")
    with pytest.raises(ValueError):
        md._read_log(log)


def test_the_equal_steps_table_takes_chapter_10_from_its_own_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The "+ X" rows at equal steps are measured against chapter 10's runs of the equal-steps log (the same
    machine) where it has them, else against the main log's, and the text says which; the variants whose step is
    within 3 % of chapter 10's are named as left out of the column."""
    import json

    md = _modern_decoder()

    def run(variant: str, seed: int, loss: float, cost: float, made_on: str = "2026-12-02, Xeon") -> dict:
        return dict(
            variant=variant, seed=seed, val_loss=loss, steps=1400, train_seconds=1.0, step_cost_ms=cost, made_on=made_on
        )

    main = [run("chapter 10", s, 1.90 + s / 1000, 100.0, "2026-11-26, EPYC") for s in range(3)]
    main += [run("+ A", s, 1.85 + s / 1000, 90.0, "2026-11-26, EPYC") for s in range(3)]
    main += [run("+ B", s, 1.90 + s / 1000, 101.0, "2026-11-26, EPYC") for s in range(3)]
    steps = [run("+ A", s, 1.88 + s / 1000, 90.0) for s in range(3)]
    log = tmp_path / "steps.jsonl"
    monkeypatch.setattr(md, "STEPS_LOG", log)
    log.write_text("".join(json.dumps(r) + "\n" for r in steps), encoding="utf-8")
    text = "\n".join(md._equal_steps_table(main))
    assert "of the main log" in text and "no chapter 10 runs yet" in text
    assert "| + A | 0.90 | 0.90 | 1.8510 (1400) | +0.0500 | helps | 3 | 1.8810 | 0.0020 | +0.0200 | helps |" in text
    assert "Left out of the column (1 variants, a step within 3% of chapter 10's): + B." in text
    steps += [run("chapter 10", s, 1.87 + s / 1000, 100.0) for s in range(3)]  # the same machine: lower here
    log.write_text("".join(json.dumps(r) + "\n" for r in steps), encoding="utf-8")
    text = "\n".join(md._equal_steps_table(main))
    assert "of this log (3 of 3 seeds, the same machine)" in text and "main log" not in text
    assert "| 3 | 1.8810 | 0.0020 | -0.0100 | hurts |" in text
    assert "- hurts per step (1): + A" in text
