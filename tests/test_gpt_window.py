"""Chapter 11's later switches: sliding-window attention, QK norm's learnable gain and nanochat's initialisation.

Sliding window: the mask against its definition (i - window < j <= i), nanochat's pattern tiled over the layers
with the last layer full, the model's logits against a forward pass written out by hand (float64, an explicit mask
built by loops) on both attention paths, a cached step seeing only the last `window` keys, a window as long as the
context being no window, equality with Hugging Face's Qwen3 with sliding-window layers (random small config, no
download), and bad values refused naming the field. The windows written out layer by layer (`windows`): the same
model as the pattern that gives the same windows, bit for bit; several sizes and a windowed last layer against the
forward pass by hand and in cached generation; read back from a checkpoint's list; bad values refused. The generic
checks of every switch (causality, the cache step by step and in generate, the two paths, the one-token step) run
over it, with learned positions and LayerNorm too, in tests/test_gpt_modern.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math

import pytest
import torch
import torch.nn.functional as F
from support import require
from test_gpt import BLOCK, LAYERS, D, H, V, make_model, small_config, tokens  # noqa: E402
from torch import nn

import transformer_lab as tl
from transformer_lab.modern import sliding_window_mask, soft_cap

TOL = dict(rtol=1e-10, atol=1e-10)
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


# ---------------------------------------------------------------- the mask and the pattern


def test_sliding_window_mask_is_its_definition() -> None:
    for size in (1, 2, 5, 9):
        for window in range(1, size + 3):
            expected = torch.tensor([[i - window < j <= i for j in range(size)] for i in range(size)])
            assert torch.equal(sliding_window_mask(size, window), expected), (size, window)
    assert torch.equal(sliding_window_mask(7, 7), tl.causal_mask(7))  # the whole context: the causal mask
    assert torch.equal(sliding_window_mask(7, 1), torch.eye(7, dtype=torch.bool))  # each token alone
    assert sliding_window_mask(6, 2).sum(-1).tolist() == [1, 2, 2, 2, 2, 2]  # at most `window` keys per query


@pytest.mark.parametrize(("pattern", "layers", "windows"), [
    ("SSSL", 6, (4, 4, 4, None, 4, None)),  # tiled, the last layer full (nanochat's rule)
    ("SSSL", 4, (4, 4, 4, None)),
    ("S", 3, (4, 4, None)),
    ("L", 2, (None, None)),
    ("SL", 1, (None,)),
])  # fmt: skip
def test_the_pattern_is_tiled_and_the_last_layer_sees_everything(pattern: str, layers: int, windows: tuple) -> None:
    assert small_config(window_pattern=pattern, window=4, n_layers=layers).layer_windows == windows


def test_the_default_window_is_a_quarter_of_the_context_rounded_up() -> None:
    assert small_config(window_pattern="SL").short_window == 3  # 12 / 4
    assert small_config(window_pattern="SL", block_size=13).short_window == 4
    assert small_config(window_pattern="SL", block_size=2048).short_window == 512  # nanochat's, before its tiles
    assert small_config(window_pattern="SL", window=5).short_window == 5


# ---------------------------------------------------------------- the model against a forward pass by hand


def by_hand(model: tl.GPT, idx: torch.Tensor) -> torch.Tensor:
    """The model's forward pass written out from its weights: rotary positions, RMSNorm with gains, QK norm with
    gains, grouped-query attention, ReLU^2, a soft-cap; each layer's mask built by loops from its window."""
    c = model.config
    T = idx.shape[1]

    def rms(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        return y if weight is None else y * weight

    x = model.token_embedding.weight[idx]  # (B, T, D)
    for layer, window in zip(model.layers, c.layer_windows, strict=True):
        a = layer.self_attn
        w = T if window is None else window
        mask = torch.tensor([[i - w < j <= i for j in range(T)] for i in range(T)])
        h = rms(x, layer.norm1.weight)
        q = (h @ a.w_q.weight.T).view(*h.shape[:2], c.n_heads, c.d_k).transpose(1, 2)  # (B, H, T, d_k)
        k = (h @ a.w_k.weight.T).view(*h.shape[:2], c.kv_heads, c.d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
        v = (h @ a.w_v.weight.T).view(*h.shape[:2], c.kv_heads, c.d_k).transpose(1, 2)
        q, k = rms(q, a.q_norm.weight), rms(k, a.k_norm.weight)
        q, k = a.rotary(q), a.rotary(k)
        group = c.n_heads // c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c.d_k)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        heads = (weights @ v).transpose(1, 2).reshape(*x.shape[:2], -1)
        x = x + heads @ a.w_o.weight.T
        h = rms(x, layer.norm2.weight)
        x = x + torch.relu(h @ layer.feed_forward.w1.weight.T).pow(2) @ layer.feed_forward.w2.weight.T
    logits = rms(x, model.norm.weight) @ model.lm_head.weight.T
    return soft_cap(logits, c.logit_softcap)


HAND = dict(
    positions="rope", norm="rms", qk_norm="rms", activation="relu2", logit_softcap=4.0, bias=False,
    tie_embeddings=False, n_kv_heads=2, n_layers=3, window_pattern="SL", window=3,
)  # fmt: skip


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_the_model_equals_its_forward_pass_by_hand(record: bool) -> None:
    model = make_model(record, **HAND)
    assert model.config.layer_windows == (3, None, None)
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), by_hand(model, idx), **TOL)
        # the window matters: the same weights without it give other logits from position 3 on
        full = make_model(record, **dict(HAND, window_pattern=None, window=None))
        assert torch.equal(full.state_dict()["lm_head.weight"], model.state_dict()["lm_head.weight"])
        torch.testing.assert_close(full(idx)[:, :3], model(idx)[:, :3], **TOL)
        assert (full(idx)[:, 3:] - model(idx)[:, 3:]).abs().max() > 1e-3


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_cached_generation_equals_recomputation_and_sees_the_last_window_keys(record: bool) -> None:
    model = make_model(record, **HAND)
    idx = tokens(2, 3)
    cached, cached_logits = model.generate(idx, 20, temperature=0, return_logits=True)  # past block_size too
    again, again_logits = model.generate(idx, 20, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, again)
    torch.testing.assert_close(cached_logits, again_logits, **TOL)
    through = model.generate(idx, 6, temperature=0, return_logits=True, through_modules=True)
    torch.testing.assert_close(model.generate(idx, 6, temperature=0, return_logits=True)[1], through[1], **TOL)
    if record:  # the last cached step (8 keys): the "S" layer weighs only the last 3, each row summing to 1
        weights = model.layers[0].self_attn.attention_weights  # (B, H, 1, 8)
        assert weights.shape == (2, H, 1, 8)
        assert torch.all(weights[..., :-3] == 0) and torch.all(weights[..., -3:] > 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 1, dtype=torch.float64), **TOL)
        assert torch.all(model.layers[1].self_attn.attention_weights > 0)  # the "L" layer sees all 8


@pytest.mark.parametrize("window", [BLOCK, BLOCK + 5])
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_a_window_as_long_as_the_context_is_no_window(window: int, record: bool) -> None:
    windowed = make_model(record, **dict(HAND, window=window))
    plain = make_model(record, **dict(HAND, window_pattern=None, window=None))
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        torch.testing.assert_close(windowed(idx), plain(idx), **TOL)
    generated = [m.generate(idx[:, :2], 15, temperature=0) for m in (windowed, plain)]
    assert torch.equal(*generated)


def test_equal_to_hugging_face_qwen3_with_sliding_window_layers() -> None:
    """Hugging Face builds Mistral's and Qwen3's sliding windows with one mask function (q - window < k <= q);
    Qwen3's layer_types can leave the last layer full, as nanochat's pattern does (Mistral windows every layer).
    `tl.hf` reads them as `windows`; the pattern "SL" with the same window is the same model, bit for bit.
    (tests/test_hf_modern.py reads Qwen3 and Mistral models whose last layer is windowed too.)"""
    require(HAS_TRANSFORMERS, "transformers is not installed (pip install -r requirements.txt)")
    from test_hf_modern import settings
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from transformer_lab import hf

    values = settings("qwen3")
    layer_types = ["sliding_attention", "full_attention"]
    config = Qwen3Config(**values, layer_types=layer_types, sliding_window=5, use_sliding_window=True)
    torch.manual_seed(0)
    reference = Qwen3ForCausalLM(config).double().eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    read = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    assert read.config.windows == (5, None)
    ours_config = dataclasses.replace(read.config, windows=None, window_pattern="SL", window=5)
    assert ours_config.layer_windows == read.config.layer_windows
    ours = tl.GPT(ours_config).double()
    ours.load_state_dict(hf._convert(reference.state_dict(), ours_config))
    ours.eval()
    idx = torch.randint(0, values["vocab_size"], (2, values["max_position_embeddings"]))
    with torch.no_grad():
        expected = reference(idx).logits
        for record in (True, False):
            torch.testing.assert_close(tl.record_attention(ours, record)(idx), expected, **TOL)
            assert torch.equal(tl.record_attention(read, record)(idx), ours(idx))  # windows: the pattern's model
        prompt = idx[:, :3]
        theirs = reference.generate(prompt, max_new_tokens=15, do_sample=False)
    assert torch.equal(ours.generate(prompt, 15, temperature=0), theirs)
    assert torch.equal(read.generate(prompt, 15, temperature=0), theirs)


# ---------------------------------------------------------------- the windows written out layer by layer


@pytest.mark.parametrize(("pattern", "window", "layers"), [("SL", 3, 3), ("SSSL", 4, 6), ("S", 2, 4), ("L", 5, 2)])
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_windows_written_out_are_the_patterns_model_bit_for_bit(
    pattern: str, window: int, layers: int, record: bool
) -> None:
    """The pattern's windows given as `windows`: the same logits and cached generation, to the last bit."""
    tiled = make_model(record, **dict(HAND, window_pattern=pattern, window=window, n_layers=layers))
    explicit = make_model(
        record, **dict(HAND, window_pattern=None, window=None, windows=tiled.config.layer_windows, n_layers=layers)
    )
    assert explicit.config.layer_windows == tiled.config.layer_windows
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        assert torch.equal(explicit(idx), tiled(idx))
    generated = [m.generate(idx[:, :2], 15, temperature=0, return_logits=True) for m in (explicit, tiled)]
    assert torch.equal(generated[0][0], generated[1][0]) and torch.equal(generated[0][1], generated[1][1])


WRITTEN_OUT = dict(HAND, window_pattern=None, window=None, windows=(2, None, 5))  # the last layer windowed


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_windows_of_several_sizes_and_a_windowed_last_layer(record: bool) -> None:
    """What no pattern writes (two sizes, the last layer windowed): equal to the forward pass by hand, the cached
    generation equal to recomputation past both windows, each layer's last cached step weighing its own window."""
    model = make_model(record, **WRITTEN_OUT)
    assert model.config.layer_windows == (2, None, 5) and model.window_sizes == [2, 5]
    assert model.window_masks.shape == (2, BLOCK, BLOCK)
    idx = tokens(2, BLOCK)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), by_hand(model, idx), **TOL)
        last_full = make_model(record, **dict(WRITTEN_OUT, windows=(2, None, None)))
        assert (last_full(idx)[:, 5:] - model(idx)[:, 5:]).abs().max() > 1e-3  # the last layer's window matters
    prompt = idx[:, :3]
    cached, cached_logits = model.generate(prompt, 20, temperature=0, return_logits=True)  # past block_size too
    again, again_logits = model.generate(prompt, 20, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, again)
    torch.testing.assert_close(cached_logits, again_logits, **TOL)
    if record:  # the last cached step holds 8 keys: 2, all 8 and 5 of them weighed by the three layers
        model.generate(prompt, 6, temperature=0)
        for layer, seen in zip(model.layers, (2, 8, 5), strict=True):
            weights = layer.self_attn.attention_weights  # (B, H, 1, 8)
            assert weights.shape == (2, H, 1, 8)
            assert torch.all(weights[..., : 8 - seen] == 0) and torch.all(weights[..., 8 - seen :] > 0)


def test_windows_read_back_from_a_checkpoints_list() -> None:
    """A checkpoint's JSON or torch.load gives a list: the config stores the tuple, equal to the original."""
    config = small_config(n_layers=3, windows=(2, None, 5))
    assert config.windows == (2, None, 5)
    again = tl.GPTConfig(**json.loads(json.dumps(config.to_dict())))
    assert again == config and again.windows == (2, None, 5) and hash(again) == hash(config)
    assert "windows=(2, None, 5), init='gpt2')" in repr(config)
    assert "windows" not in repr(small_config()) and repr(small_config()).endswith("window=None, init='gpt2')")


@pytest.mark.parametrize(("overrides", "error", "words"), [
    (dict(windows=(3,)), ValueError, r"windows must have one entry per layer: got 1 entries for n_layers=2"),
    (dict(windows="SL"), TypeError, r"windows must be a tuple with one entry per layer"),
    (dict(windows=4), TypeError, r"windows must be a tuple"),
    (dict(windows=(0, None)), ValueError, r"windows\[0\] \(layer 0's window.*must be a positive int, got 0"),
    (dict(windows=(None, 2.5)), TypeError, r"windows\[1\] .*must be a positive int, got 2.5"),
    (dict(windows=(None, True)), TypeError, r"windows\[1\] .*must be a positive int"),
    (dict(windows=(3, None), window_pattern="SL"), ValueError, r"leave window_pattern and window at None"),
    (dict(windows=(3, None), window=3), ValueError, r"leave window_pattern and window at None"),
])  # fmt: skip
def test_bad_windows_are_refused_naming_the_field(overrides: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        small_config(**overrides)


@pytest.mark.parametrize(("overrides", "error", "words"), [
    (dict(window_pattern="SSSL", window=0), ValueError, "window must be a positive int"),
    (dict(window_pattern="SSSL", window=-3), ValueError, "window must be a positive int"),
    (dict(window_pattern="SSSL", window=2.5), TypeError, "window must be a positive int"),
    (dict(window_pattern="SSSL", window="4"), TypeError, "window must be a positive int"),
    (dict(window_pattern="SSSL", window=True), TypeError, "window must be a positive int"),
    (dict(window=4), ValueError, "window=4 is the short window of window_pattern"),
    (dict(window_pattern="SXL"), ValueError, "window_pattern must be .*'S'.*'L'.*'SXL'"),
    (dict(window_pattern="ssl"), ValueError, "window_pattern must be"),
    (dict(window_pattern=""), ValueError, "window_pattern must be"),
    (dict(window_pattern=["S", "L"]), ValueError, "window_pattern must be"),
    (dict(window_pattern=4), ValueError, "window_pattern must be"),
    (dict(init="xavier"), ValueError, "init must be one of 'gpt2', 'nanochat'"),
    (dict(init="nanochat"), ValueError, "init='nanochat'.*tie_embeddings=False"),
])  # fmt: skip
def test_bad_values_are_refused_naming_the_field(overrides: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        small_config(**overrides)


# ---------------------------------------------------------------- QK norm's learnable gain


def test_qk_norm_with_a_gain_learns_one_scale_per_feature_of_a_head() -> None:
    """qk_norm="rms" (Qwen3, Gemma 3): q / rms(q) * g_q and k / rms(k) * g_k, g of d_k features shared by the heads,
    starting at 1 and trained; "rms_no_weight" (nanochat) has no parameter."""
    torch.manual_seed(0)
    with_gain = tl.GPT(small_config(qk_norm="rms", n_layers=1))
    without = tl.GPT(small_config(qk_norm="rms_no_weight", n_layers=1))
    attention = with_gain.layers[0].self_attn
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (D // H,)
    assert torch.all(attention.q_norm.weight == 1) and torch.all(attention.k_norm.weight == 1)
    count = sum(p.numel() for p in with_gain.parameters()) - sum(p.numel() for p in without.parameters())
    assert count == 2 * (D // H) * 1  # one gain for q and one for k per layer
    idx, target = tokens(2, BLOCK), tokens(2, BLOCK, seed=2)
    F.cross_entropy(with_gain(idx).flatten(0, 1), target.flatten()).backward()
    assert attention.q_norm.weight.grad.abs().max() > 0 and attention.k_norm.weight.grad.abs().max() > 0
    # the gain scales the logits of the scores: g_q = g_k = s multiplies every score by s^2
    model = make_model(qk_norm="rms", n_layers=1, norm_eps=1e-12)
    attention = tl.record_attention(model, True).layers[0].self_attn
    with torch.no_grad():
        attention.q_norm.weight.fill_(1.0)
        attention.k_norm.weight.fill_(1.0)
        model(idx)
        unit = attention.attention_weights.log()
        attention.q_norm.weight.fill_(2.0)
        attention.k_norm.weight.fill_(2.0)
        model(idx)
        scaled = attention.attention_weights.log()
    # log-softmax of 4 x scores: the same ranking, 4 times sharper (compare the gaps to each row's first key)
    torch.testing.assert_close(scaled - scaled[..., :1], 4 * (unit - unit[..., :1]), rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------- nanochat's initialisation


def test_nanochat_initialisation_is_its_distributions() -> None:
    torch.manual_seed(0)
    config = tl.GPTConfig(500, block_size=64, d_model=128, n_heads=4, n_layers=2, init="nanochat", positions="rope",
                          tie_embeddings=False, bias=False, activation="swiglu", embedding_norm=True,
                          norm="rms_no_weight")  # fmt: skip
    model = tl.GPT(config)
    assert model.token_embedding.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(0.001, rel=0.02)
    for layer in model.layers:
        a, ff = layer.self_attn, layer.feed_forward
        for linear in (a.w_q, a.w_k, a.w_v, ff.w1, ff.w3):
            bound = math.sqrt(3 / linear.in_features)
            assert linear.weight.abs().max().item() <= bound  # uniform(-s, s)
            assert linear.weight.std().item() == pytest.approx(1 / math.sqrt(linear.in_features), rel=0.05)
        assert torch.all(a.w_o.weight == 0) and torch.all(ff.w2.weight == 0)
    # the norm after the embedding: with GPT-2's init it multiplies the stream by about 1 / 0.02 = 50, here by ~1
    idx = torch.randint(0, 500, (4, 64))
    with torch.no_grad():
        for init, tie, scale in (("gpt2", True, 50.0), ("nanochat", False, 1.0)):
            torch.manual_seed(0)
            m = tl.GPT(dataclasses.replace(config, init=init, tie_embeddings=tie))
            x = m.token_embedding(idx)
            gain = (m.embedding_norm(x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()).item()
            assert gain == pytest.approx(scale, rel=0.05), init


def test_nanochat_initialisation_changes_only_the_initial_values() -> None:
    """The same modules and parameter names as GPT-2's init; reset_parameters draws it again; trains."""
    base = dict(positions="rope", tie_embeddings=False, bias=False, norm="rms_no_weight", qk_norm="rms_no_weight")
    torch.manual_seed(0)
    gpt2 = tl.GPT(small_config(**base))
    torch.manual_seed(0)
    nanochat = tl.GPT(small_config(**base, init="nanochat"))
    assert [n for n, _ in gpt2.named_parameters()] == [n for n, _ in nanochat.named_parameters()]
    torch.manual_seed(1)
    nanochat.reset_parameters()
    first = {n: p.clone() for n, p in nanochat.named_parameters()}
    torch.manual_seed(1)
    nanochat.reset_parameters()
    assert nanochat.token_embedding.weight.std().item() > 0.5  # nanochat's again, not GPT-2's
    assert all(torch.equal(first[n], p) for n, p in nanochat.named_parameters())
    assert isinstance(nanochat.lm_head, nn.Linear) and nanochat.lm_head.weight is not nanochat.token_embedding.weight
    stream = torch.randint(0, V, (3000,), generator=torch.Generator().manual_seed(3))
    history = tl.training.train_gpt(nanochat, stream[:2700], stream[2700:], steps=30, batch_size=4, lr=3e-3, warmup=5,
                                    eval_every=30, progress=False)  # fmt: skip
    assert all(math.isfinite(v) for v in history.val_loss)
    assert LAYERS == 2
