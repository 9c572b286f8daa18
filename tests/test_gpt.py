"""GPTConfig and GPT (chapter 10): equal to Hugging Face's GPT2LMHeadModel (outputs and gradients, float64),
the KV cache (equal to recomputation, also past block_size), the GPT-2 converter and checkpoint loaders,
top-k/top-p sampling, causality, record_attention, and clear errors for bad input.

Tests that need `transformers` build a small random GPT2Config and never touch the network; they skip
locally without it and fail under CI (tests/support.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from support import require
from torch import nn

import transformer_lab as tl
from transformer_lab.gpt import filter_logits, load_gpt2, load_gpt2_state_dict

V, BLOCK, D, H, LAYERS = 37, 12, 16, 4, 2
TOL = dict(rtol=1e-10, atol=1e-10)
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def small_config(**overrides: object) -> tl.GPTConfig:
    settings: dict[str, object] = dict(block_size=BLOCK, d_model=D, n_heads=H, n_layers=LAYERS)
    settings.update(overrides)
    return tl.GPTConfig(V, **settings)


def make_model(record: bool = True, seed: int = 0, **overrides: object) -> tl.GPT:
    """A float64 GPT in eval mode with every parameter perturbed (so biases and LayerNorms are not 0 and 1)."""
    torch.manual_seed(seed)
    model = tl.GPT(small_config(**overrides)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return tl.record_attention(model, record)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the config


def test_config_defaults_and_gpt2_small() -> None:
    c = tl.GPTConfig(65)
    assert (c.block_size, c.d_model, c.n_heads, c.n_layers, c.dropout, c.bias, c.tie_embeddings) == (
        256,
        384,
        6,
        6,
        0.0,
        True,
        True,
    )
    assert c.activation == "gelu_tanh" and c.d_ff == 4 * 384
    g = tl.GPTConfig.gpt2()
    assert (g.vocab_size, g.block_size, g.d_model, g.n_heads, g.n_layers) == (50257, 1024, 768, 12, 12)
    assert tl.GPTConfig.gpt2(n_layers=2, dropout=0.1).n_layers == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 8  # type: ignore[misc]
    assert tl.GPTConfig(**c.to_dict()) == c


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        (dict(d_model=30, n_heads=4), ValueError, "divisible by n_heads"),
        (dict(vocab_size=0), ValueError, "vocab_size"),
        (dict(block_size=2.5), TypeError, "block_size"),
        (dict(n_layers=-1), ValueError, "n_layers"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(bias="yes"), TypeError, "bias"),
        (dict(tie_embeddings=1), TypeError, "tie_embeddings"),
        (dict(activation="swish"), ValueError, "activation"),
    ],
)
def test_config_is_validated(overrides: dict, error: type, words: str) -> None:
    settings = dict(vocab_size=V, d_model=D, n_heads=H)
    settings.update(overrides)
    with pytest.raises(error, match=words):
        tl.GPTConfig(**settings)


def test_model_wants_a_gpt_config() -> None:
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        tl.GPT(tl.TransformerConfig(V, V))  # type: ignore[arg-type]


# ---------------------------------------------------------------- structure, parameters and initialisation


def expected_parameters(v: int, block: int, d: int, n: int, bias: bool, tied: bool) -> int:
    """GPT-2's parameter count written out block by block."""
    b = 1 if bias else 0
    attention = 4 * (d * d + b * d)  # W^Q, W^K, W^V, W^O
    ffn = (d * 4 * d + b * 4 * d) + (4 * d * d + b * d)  # W_1 (D -> 4D), W_2 (4D -> D)
    norm = d + b * d  # gamma (and beta)
    embeddings = v * d + block * d
    head = 0 if tied else v * d
    return embeddings + n * (attention + ffn + 2 * norm) + norm + head


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count(bias: bool, tied: bool) -> None:
    model = tl.GPT(small_config(bias=bias, tie_embeddings=tied))
    count = sum(p.numel() for p in model.parameters())  # a shared tensor is listed once
    assert count == expected_parameters(V, BLOCK, D, LAYERS, bias, tied)
    assert (model.lm_head.weight is model.token_embedding.weight) == tied
    assert not any(name.endswith("bias") for name, _ in model.named_parameters()) or bias
    assert all(not k.startswith("causal") for k in model.state_dict())  # the mask is rebuilt, not saved


def test_gpt2_small_has_124m_parameters_like_hugging_face() -> None:
    with torch.device("meta"):
        model = tl.GPT(tl.GPTConfig.gpt2())
    count = sum(p.numel() for p in model.parameters())
    assert count == expected_parameters(50257, 1024, 768, 12, True, True)
    assert round(count / 1e6) == 124
    require(HAS_TRANSFORMERS, "transformers is not installed (pip install -r requirements.txt)")
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        reference = GPT2LMHeadModel(GPT2Config())
    assert count == sum(p.numel() for p in reference.parameters())


def test_blocks_are_pre_norm_encoder_layers_with_gelu_tanh() -> None:
    model = tl.GPT(small_config())
    assert len(model.layers) == LAYERS
    for layer in model.layers:
        assert type(layer) is tl.EncoderLayer and layer.norm_first
        assert layer.feed_forward.activation == "gelu_tanh"
        assert layer.feed_forward.w1.out_features == 4 * D


def test_gpt2_initialisation() -> None:
    """std 0.02 everywhere, 0.02 / sqrt(2 N) on the two projections into the residual stream, zero biases."""
    n = 6
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(500, block_size=64, d_model=128, n_heads=4, n_layers=n))
    residual = [layer.self_attn.w_o.weight for layer in model.layers] + [
        layer.feed_forward.w2.weight for layer in model.layers
    ]
    residual_std = torch.cat([w.flatten() for w in residual]).std().item()
    assert residual_std == pytest.approx(0.02 / math.sqrt(2 * n), rel=0.03)
    others = [model.token_embedding.weight, model.position_embedding.embedding.weight]
    others += [layer.self_attn.w_q.weight for layer in model.layers] + [
        layer.feed_forward.w1.weight for layer in model.layers
    ]
    assert torch.cat([w.flatten() for w in others]).std().item() == pytest.approx(0.02, rel=0.03)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif "norm" in name:
            assert torch.all(p == 1), name


# ---------------------------------------------------------------- forward: causality, record_attention


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_causality_future_tokens_do_not_change_earlier_logits(record: bool) -> None:
    model = make_model(record)
    idx = tokens(3, BLOCK)
    with torch.no_grad():
        logits = model(idx)
        assert logits.shape == (3, BLOCK, V)
        for t in (1, 5, BLOCK - 1):
            changed = idx.clone()
            changed[:, t:] = (changed[:, t:] + 1 + torch.arange(BLOCK - t)) % V
            other = model(changed)
            torch.testing.assert_close(other[:, :t], logits[:, :t], rtol=0, atol=1e-12)
            assert (other[:, t] - logits[:, t]).abs().max() > 1e-6  # the changed position does see it


def test_record_attention_explicit_keeps_causal_weights_fast_path_equal() -> None:
    model = make_model(record=True)
    idx = tokens(2, 9)
    with torch.no_grad():
        explicit = model(idx)
        for layer in model.layers:
            weights = layer.self_attn.attention_weights
            assert weights.shape == (2, H, 9, 9)
            torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 9, dtype=torch.float64), **TOL)
            assert torch.all(weights.triu(diagonal=1) == 0)  # no weight on future positions
        assert tl.record_attention(model, False) is model
        fast = model(idx)
    assert all(layer.self_attn.attention_weights is None for layer in model.layers)
    torch.testing.assert_close(fast, explicit, **TOL)


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_gradients_of_both_paths_are_equal(record: bool) -> None:
    reference, model = make_model(True), make_model(record)
    idx, target = tokens(2, BLOCK), tokens(2, BLOCK, seed=2)
    for m in (reference, model):
        nn.functional.cross_entropy(m(idx).flatten(0, 1), target.flatten()).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)


# ---------------------------------------------------------------- the KV cache


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_cache_step_by_step_equals_full_forward(record: bool, batch: int) -> None:
    model = make_model(record)
    idx = tokens(batch, BLOCK)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :4], cache)]  # a prompt of 4, then one token at a time
        assert cache.length == 4
        for t in range(4, BLOCK):
            steps.append(model(idx[:, t : t + 1], cache))
            assert cache.length == t + 1
            assert all(layer.self_k.shape == (batch, H, t + 1, D // H) for layer in cache.layers)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_cache_step_by_step_gradients_equal_full_forward() -> None:
    """Cached steps under autograd (the cache then concatenates): the same gradients as one full forward."""
    grads = []
    for cached in (True, False):
        model = make_model()
        idx = tokens(1, BLOCK)
        if cached:
            cache = model.new_cache()
            logits = torch.cat(
                [model(idx[:, :2], cache)] + [model(idx[:, t : t + 1], cache) for t in range(2, BLOCK)], 1
            )
        else:
            logits = model(idx)
        (logits**2).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for cached, full in zip(*grads, strict=True):
        torch.testing.assert_close(cached, full, **TOL)


def count_one_token_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the one-token step that runs without the modules (gpt._decode_step)."""
    from transformer_lab import gpt

    calls: list[int] = []
    step = gpt._decode_step

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return step(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(gpt, "_decode_step", counted)
    return calls


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(bias=False), dict(tie_embeddings=False), dict(activation="gelu")],
    ids=["gpt2", "no_bias", "untied", "gelu"],
)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
def test_one_token_step_equals_the_modules(
    record: bool, batch: int, overrides: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cached generation runs each new token without the module machinery; it computes what the modules
    compute: the same tokens, logits and recorded attention weights as the same generation through them."""
    calls = count_one_token_steps(monkeypatch)
    model = make_model(record, **overrides)
    idx = tokens(batch, 3)
    runs, weights = [], []
    for through_modules in (False, True):
        # A forward hook (here one that changes nothing) sends every step through the modules.
        handle = model.register_forward_hook(lambda module, args, out: None) if through_modules else None
        runs.append(model.generate(idx, 8, temperature=0, return_logits=True))
        weights.append([layer.self_attn.attention_weights for layer in model.layers])
        if handle is not None:
            handle.remove()
        assert len(calls) == 7  # the 7 steps after the prompt's, once; none through the modules
    (fast_tokens, fast_logits), (module_tokens, module_logits) = runs
    assert torch.equal(fast_tokens, module_tokens)
    torch.testing.assert_close(fast_logits, module_logits, **TOL)
    for lean, modules in zip(*weights, strict=True):
        if record:
            assert lean.shape == (batch, H, 1, 3 + 7)  # the last step: its query over the 10 positions fed
            torch.testing.assert_close(lean, modules, **TOL)
        else:
            assert lean is None and modules is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_step_in_lower_precision(dtype: torch.dtype) -> None:
    """In float32 and bfloat16 too, the step without the modules gives the modules' logits (to the dtype's
    precision) and keeps the dtype."""
    model = make_model(record=False).to(dtype)
    idx = tokens(1, 3)
    fast = model.generate(idx, 6, temperature=0, return_logits=True)
    model.register_forward_hook(lambda module, args, out: None)
    slow = model.generate(idx, 6, temperature=0, return_logits=True)
    assert fast[1].dtype == dtype
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast[1], slow[1], **tolerance)


def test_through_modules_runs_every_cached_step_through_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """`generate(..., through_modules=True)` (and `forward`'s keyword) keeps the cache but never takes the
    one-token step without the modules: chapter 10 times the cache alone with it. Same tokens and logits."""
    from transformer_lab import gpt

    calls = count_one_token_steps(monkeypatch)
    layer_calls: list[int] = []
    cached_layer = gpt._cached_layer

    def counted_layer(layer: tl.EncoderLayer, x: torch.Tensor, *args: object) -> torch.Tensor:
        layer_calls.append(x.shape[1])
        return cached_layer(layer, x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(gpt, "_cached_layer", counted_layer)
    model = make_model()
    idx = tokens(2, 3)
    slow = model.generate(idx, 6, temperature=0, through_modules=True, return_logits=True)
    assert calls == []  # no step without the modules, though nothing (no hook, no dropout) forbids it
    assert layer_calls == [3] * model.config.n_layers + [1] * (5 * model.config.n_layers)  # the prompt, then 1
    fast = model.generate(idx, 6, temperature=0, return_logits=True)
    assert len(calls) == 5
    assert torch.equal(fast[0], slow[0])
    torch.testing.assert_close(fast[1], slow[1], **TOL)
    cache = model.new_cache()
    model(idx, cache)
    model(idx[:, :1], cache, through_modules=True)
    assert len(calls) == 5 and cache.length == 4
    with pytest.raises(TypeError, match="through_modules"):
        model(idx, through_modules="yes")


def test_hooks_see_every_cached_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook on any module, or a global one, makes every step go through the modules: it sees each token."""
    calls = count_one_token_steps(monkeypatch)
    model = make_model()
    seen: list[int] = []
    handle = model.layers[1].norm2.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    model.generate(tokens(2, 3), 5, temperature=0)
    handle.remove()
    assert seen == [3, 1, 1, 1, 1]
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: seen.append(-1))
    try:
        model.generate(tokens(2, 3), 5, temperature=0)
    finally:
        handle.remove()
    assert len(seen) > 5
    assert calls == []
    model.generate(tokens(2, 3), 5, temperature=0)  # no hook left: the step without the modules again
    assert len(calls) == 4


def test_replaced_modules_and_active_dropout_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subclass or a replaced `forward` computes something else: the cache then runs the modules and still
    gives what recomputation gives. In training mode with dropout, the one-token step never runs."""
    calls = count_one_token_steps(monkeypatch)

    class DoubledFeedForward(tl.FeedForward):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    idx = tokens(2, 3)
    unchanged = make_model().generate(idx, 6, temperature=0, return_logits=True)[1]
    assert len(calls) == 5
    for replace in ("subclass", "instance forward"):
        model = make_model()
        ff = model.layers[0].feed_forward
        if replace == "subclass":
            doubled = DoubledFeedForward(D, 4 * D, activation="gelu_tanh").double()
            doubled.load_state_dict(ff.state_dict())
            model.layers[0].feed_forward = doubled
        else:
            ff.forward = lambda x, ff=ff: 2 * tl.FeedForward.forward(ff, x)
        cached, recomputed = (
            model.generate(idx, 6, temperature=0, use_cache=use, return_logits=True) for use in (True, False)
        )
        assert torch.equal(cached[0], recomputed[0])
        torch.testing.assert_close(cached[1], recomputed[1], **TOL)
        assert not torch.allclose(cached[1], unchanged)  # the replacement did change the model
    assert len(calls) == 5  # none for the replaced ones
    model = make_model(dropout=0.1).train()
    cache = model.new_cache()
    model(tokens(1, 3), cache)
    model(tokens(1, 1), cache)
    assert len(calls) == 5
    model.eval()(tokens(1, 1), cache)  # eval mode: dropout off, the step without the modules
    assert len(calls) == 6


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
@pytest.mark.parametrize(
    ("prompt", "new", "sampling"),
    [
        (3, 6, dict(temperature=0)),  # greedy, inside block_size
        (3, 25, dict(temperature=0)),  # greedy, far past block_size: the cache is rebuilt every step
        (BLOCK + 5, 4, dict(temperature=0)),  # a prompt longer than block_size is cropped
        (2, 30, dict(temperature=1.0)),
        (5, 20, dict(temperature=0.7, top_k=5)),
        (1, 20, dict(temperature=1.3, top_p=0.8)),
        (4, 20, dict(top_k=10, top_p=0.9)),
    ],
)
def test_generate_with_cache_equals_recomputation(record: bool, prompt: int, new: int, sampling: dict) -> None:
    model = make_model(record)
    idx = tokens(3, prompt)
    runs = [
        model.generate(
            idx, new, **sampling, generator=torch.Generator().manual_seed(7), use_cache=use, return_logits=True
        )
        for use in (True, False)
    ]
    (cached, cached_logits), (recomputed, recomputed_logits) = runs
    assert cached.shape == (3, prompt + new)
    assert torch.equal(cached[:, :prompt], idx)
    assert torch.equal(cached, recomputed)
    assert cached_logits.shape == (3, new, V)
    torch.testing.assert_close(cached_logits, recomputed_logits, **TOL)


def test_generate_runs_only_the_new_token_until_the_context_is_full() -> None:
    """What each step feeds the model: the prompt, then one token at a time while the cache has room, then
    (the context full, the cache unable to slide) the whole cropped context every step."""
    model = make_model()
    lengths: list[int] = []
    model.token_embedding.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[1]))
    model.generate(tokens(2, 5), 12, temperature=0)
    assert lengths == [5] + [1] * 6 + [BLOCK] * 5  # contexts of 5, then 6 ... 11 (< 12), then 12 five times
    lengths.clear()
    model.generate(tokens(2, 5), 3, temperature=0, use_cache=False)
    assert lengths == [5, 6, 7]


def test_cache_in_float32_on_the_fast_path() -> None:
    """The dtype a learner trains in: the cache's logits equal recomputation to float32 precision."""
    model = make_model(record=False).float()
    idx = tokens(2, 3)
    runs = [model.generate(idx, 2 * BLOCK, temperature=0, use_cache=use, return_logits=True) for use in (True, False)]
    assert runs[0][1].dtype == torch.float32
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-5)


def test_generate_logits_are_those_of_forward_on_the_cropped_context() -> None:
    """Step by step, each logits row is forward() of the last block_size tokens, taken at its last position."""
    model = make_model()
    out, logits = model.generate(tokens(2, 5), 2 * BLOCK, temperature=0, return_logits=True)
    with torch.no_grad():
        for step in range(2 * BLOCK):
            end = 5 + step
            expected = model(out[:, max(0, end - BLOCK) : end])[:, -1]
            torch.testing.assert_close(logits[:, step], expected, **TOL)
            assert torch.equal(out[:, end], expected.argmax(-1))  # greedy


def test_same_generator_seed_gives_same_tokens() -> None:
    model = make_model()
    idx = tokens(4, 3)

    def sample(seed: int) -> torch.Tensor:
        return model.generate(idx, 15, top_k=20, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(3), sample(3))
    assert not torch.equal(sample(3), sample(4))


def test_generate_runs_in_eval_mode_and_restores_the_mode() -> None:
    torch.manual_seed(0)
    model = tl.GPT(small_config(dropout=0.3)).double()
    idx = tokens(2, 3)
    model.train()
    in_training = model.generate(idx, 10, generator=torch.Generator().manual_seed(1))
    assert model.training
    model.eval()
    assert torch.equal(in_training, model.generate(idx, 10, generator=torch.Generator().manual_seed(1)))
    assert not model.training


def test_generate_zero_new_tokens() -> None:
    model = make_model()
    idx = tokens(2, 4)
    out, logits = model.generate(idx, 0, return_logits=True)
    assert torch.equal(out, idx) and logits.shape == (2, 0, V) and logits.dtype == torch.float64


# ---------------------------------------------------------------- top-k and top-p


def brute_force_filter(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """The definition, one row and one token at a time in Python."""
    out = logits.clone()
    for row in range(logits.shape[0]):
        values = [float(v) for v in logits[row]]
        keep = set(range(len(values)))
        if top_k is not None:
            kth = sorted(values, reverse=True)[min(top_k, len(values)) - 1]
            keep = {i for i in keep if values[i] >= kth}
        if top_p is not None:
            kept = sorted(keep, key=lambda i: -values[i])
            total = sum(math.exp(values[i]) for i in kept)
            mass, nucleus = 0.0, set()
            for i in kept:
                if mass >= top_p:
                    break
                nucleus.add(i)
                mass += math.exp(values[i]) / total
            keep = nucleus
        for i in range(len(values)):
            if i not in keep:
                out[row, i] = float("-inf")
    return out


@pytest.mark.parametrize(
    ("top_k", "top_p"), [(1, None), (3, None), (V, None), (100, None), (None, 0.5), (None, 0.9), (None, 1.0), (8, 0.7)]
)
def test_filter_logits_is_the_definition(top_k: int | None, top_p: float | None) -> None:
    logits = torch.randn(6, V, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    filtered = filter_logits(logits, top_k, top_p)
    assert torch.equal(filtered, brute_force_filter(logits, top_k, top_p))
    kept = torch.isfinite(filtered)
    assert torch.equal(filtered[kept], logits[kept]) and kept.sum(-1).min() >= 1
    if top_k is not None and top_p is None:
        assert torch.all(kept.sum(-1) == min(top_k, V))


def test_filter_logits_equals_hugging_face_warpers() -> None:
    require(HAS_TRANSFORMERS, "transformers is not installed (pip install -r requirements.txt)")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(8, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    for k in (1, 4, 20):
        assert torch.equal(filter_logits(logits, top_k=k), TopKLogitsWarper(k)(None, logits.clone()))
    for p in (0.3, 0.75, 0.95):
        assert torch.equal(filter_logits(logits, top_p=p), TopPLogitsWarper(p)(None, logits.clone()))


def test_sampling_frequencies_follow_the_filtered_softmax() -> None:
    """20,000 draws with temperature 0.8, top-k 6, top-p 0.8: only kept tokens, at their renormalized rates."""
    from transformer_lab.gpt import _sample

    row = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2
    draws = _sample(row.expand(20000, V), 0.8, 6, 0.8, torch.Generator().manual_seed(0)).squeeze(1)
    expected = torch.softmax(brute_force_filter((row / 0.8)[None], 6, 0.8)[0], dim=-1)
    frequencies = torch.bincount(draws, minlength=V).double() / draws.numel()
    assert torch.all(frequencies[expected == 0] == 0)
    assert (frequencies - expected).abs().max() < 0.015


# ---------------------------------------------------------------- equal to Hugging Face's GPT-2


def hf_model(seed: int = 0, tied: bool = True, n_positions: int = BLOCK):  # noqa: ANN201 - transformers optional
    """A small random GPT2LMHeadModel in float64 with every parameter perturbed, no download."""
    require(HAS_TRANSFORMERS, "transformers is not installed (pip install -r requirements.txt)")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=V,
        n_positions=n_positions,
        n_embd=D,
        n_layer=LAYERS,
        n_head=H,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("record", [True, False], ids=["explicit", "fast"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_equal_to_gpt2_lm_head_model_outputs_and_gradients(record: bool, tied: bool) -> None:
    reference = hf_model(tied=tied)
    model = tl.record_attention(tl.GPT.from_gpt2(reference.state_dict(), n_heads=H), record)
    assert model.config == small_config(tie_embeddings=tied)
    assert next(model.parameters()).dtype == torch.float64
    idx, target = tokens(3, BLOCK), tokens(3, BLOCK, seed=2)
    ours, theirs = model(idx), reference(idx).logits
    torch.testing.assert_close(ours, theirs, **TOL)
    for logits in (ours, theirs):
        nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    # Their gradients, in their layout, converted the same way as the weights.
    grads = {name: p.grad for name, p in reference.named_parameters()}
    if tied:
        grads["lm_head.weight"] = reference.lm_head.weight.grad
    from transformer_lab.gpt import _convert_gpt2

    expected = _convert_gpt2({k.removeprefix("transformer."): g for k, g in grads.items()}, model.config)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], **TOL, msg=name)


def test_greedy_tokens_equal_hugging_face_generate() -> None:
    reference = hf_model()
    model = tl.GPT.from_gpt2(reference.state_dict(), n_heads=H)
    idx = tokens(3, 4)
    theirs = reference.generate(
        idx, attention_mask=torch.ones_like(idx), max_new_tokens=BLOCK - 4, do_sample=False, pad_token_id=V - 1
    )
    assert torch.equal(model.generate(idx, BLOCK - 4, temperature=0), theirs)
    assert torch.equal(model.generate(idx, BLOCK - 4, temperature=0, use_cache=False), theirs)


def test_sampled_tokens_equal_hugging_face_generate_with_the_same_seed() -> None:
    """Same temperature, top-k and top-p, same global seed: the same draws (both call torch.multinomial)."""
    reference = hf_model()
    model = tl.GPT.from_gpt2(reference.state_dict(), n_heads=H)
    idx = tokens(3, 2)
    settings = dict(temperature=0.9, top_k=12, top_p=0.85)
    torch.manual_seed(5)
    theirs = reference.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        max_new_tokens=BLOCK - 2,
        do_sample=True,
        pad_token_id=V - 1,
        **settings,
    )
    torch.manual_seed(5)
    assert torch.equal(model.generate(idx, BLOCK - 2, **settings), theirs)


def original_layout(state_dict: dict[str, torch.Tensor], n_positions: int) -> dict[str, torch.Tensor]:
    """GPT-2's original checkpoint layout: no "transformer." prefix, no lm_head (tied), the old mask buffers."""
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items() if k != "lm_head.weight"}
    for i in range(LAYERS):
        sd[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_positions, n_positions)).view(1, 1, n_positions, n_positions)
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return sd


def test_from_gpt2_reads_the_original_checkpoint_layout() -> None:
    reference = hf_model()
    model = tl.GPT.from_gpt2(original_layout(reference.state_dict(), BLOCK), n_heads=H)
    assert model.config.tie_embeddings
    idx = tokens(2, BLOCK)
    torch.testing.assert_close(model(idx), reference(idx).logits, **TOL)


def test_bias_free_model_equals_gpt2_with_zero_biases() -> None:
    """bias=False: GPT-2 with every bias (and LayerNorm beta) set to zero, loaded without the bias entries."""
    reference = hf_model()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    without = {k: v for k, v in reference.state_dict().items() if not k.endswith("bias")}
    model = tl.GPT.from_gpt2(without, n_heads=H)
    assert model.config.bias is False
    idx = tokens(2, BLOCK)
    torch.testing.assert_close(model(idx), reference(idx).logits, **TOL)


def test_save_pretrained_folder_read_back_by_the_loading_code(tmp_path: Path) -> None:
    """The same code that reads a downloaded GPT-2 folder: model.safetensors (and config.json for the heads)."""
    reference = hf_model()
    reference.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    state = load_gpt2_state_dict(tmp_path)
    assert all(v.dtype == torch.float64 for v in state.values())
    model = load_gpt2(tmp_path)  # n_heads from config.json
    assert model.config.n_heads == H
    idx = tokens(3, 6)
    torch.testing.assert_close(model(idx), reference(idx).logits, **TOL)
    theirs = reference.generate(
        idx, attention_mask=torch.ones_like(idx), max_new_tokens=BLOCK - 6, do_sample=False, pad_token_id=V - 1
    )
    assert torch.equal(model.generate(idx, BLOCK - 6, temperature=0), theirs)
    with pytest.raises(ValueError, match="disagrees with n_head"):
        load_gpt2(tmp_path, n_heads=2)


def test_sharded_and_pytorch_bin_checkpoints(tmp_path: Path) -> None:
    reference = hf_model()
    idx = tokens(2, BLOCK)
    sharded = tmp_path / "sharded"
    reference.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(load_gpt2(sharded)(idx), reference(idx).logits, **TOL)
    binary = tmp_path / "bin"
    binary.mkdir()
    torch.save(original_layout(reference.state_dict(), BLOCK), binary / "pytorch_model.bin")
    model = load_gpt2(binary, n_heads=H)  # no config.json: the heads are an argument
    torch.testing.assert_close(model(idx), reference(idx).logits, **TOL)
    (binary / "config.json").write_text(json.dumps({"n_head": H, "activation_function": "relu"}), encoding="utf-8")
    with pytest.raises(ValueError, match="activation_function"):
        load_gpt2(binary)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("idx", "error", "words"),
    [
        ([[1, 2, 3]], TypeError, "idx must be a torch.Tensor"),
        (torch.rand(2, 5), TypeError, "idx must be an integer tensor"),
        (torch.tensor([1, 2, 3]), ValueError, r"idx must have shape \(batch, seq_len\)"),
        (torch.tensor([[1, V]]), ValueError, f"token id {V}, outside the vocabulary"),
        (torch.tensor([[-1, 2]]), ValueError, "token id -1"),
        (torch.zeros(2, 0, dtype=torch.long), ValueError, "at least one token"),
        (torch.zeros(1, BLOCK + 1, dtype=torch.long), ValueError, f"block_size={BLOCK}"),
    ],
)
def test_forward_bad_idx(idx: object, error: type, words: str) -> None:
    model = tl.GPT(small_config())
    with pytest.raises(error, match=words):
        model(idx)


def test_forward_bad_cache() -> None:
    model = tl.GPT(small_config())
    with pytest.raises(TypeError, match="cache must be a DecoderCache"):
        model(tokens(1, 3), cache={})
    cache = model.new_cache()
    model(tokens(2, BLOCK - 1), cache)
    with pytest.raises(ValueError, match="cache's batch size"):
        model(tokens(3, 1), cache)
    with pytest.raises(ValueError, match=f"the cache holds {BLOCK - 1} positions and idx adds 2"):
        model(tokens(2, 2), cache)
    with pytest.raises(ValueError, match="cache has 1 layers"):
        model(tokens(1, 1), tl.DecoderCache.empty(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
        (dict(max_new_tokens=2.0), ValueError, "max_new_tokens"),
        (dict(temperature=-0.5), ValueError, "temperature"),
        (dict(temperature="hot"), ValueError, "temperature"),
        (dict(temperature=float("inf")), ValueError, "temperature must be finite"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(top_k=2.5), ValueError, "top_k"),
        (dict(top_p=0.0), ValueError, "top_p"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(generator=0), TypeError, "generator must be a torch.Generator"),
        (dict(use_cache="no"), TypeError, "use_cache"),
        (dict(through_modules=1), TypeError, "through_modules"),
        (dict(idx=torch.rand(1, 3)), TypeError, "idx must be an integer tensor"),
        (dict(idx=torch.zeros(1, 0, dtype=torch.long)), ValueError, "idx must hold at least one token"),
    ],
)
def test_generate_bad_arguments(kwargs: dict, error: type, words: str) -> None:
    model = tl.GPT(small_config())
    arguments = dict(idx=tokens(1, 3), max_new_tokens=2)
    arguments.update(kwargs)
    with pytest.raises(error, match=words):
        model.generate(**arguments)


def test_from_gpt2_bad_state_dicts() -> None:
    reference = hf_model()
    sd = dict(reference.state_dict())
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        tl.GPT.from_gpt2([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no 'wte.weight'"):
        tl.GPT.from_gpt2({k: v for k, v in sd.items() if "wte" not in k}, n_heads=H)
    with pytest.raises(ValueError, match="missing 'h.1.mlp.c_fc.weight'"):
        tl.GPT.from_gpt2({k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.weight"}, n_heads=H)
    with pytest.raises(ValueError, match="not GPT-2 weights, e.g. 'extra.weight'"):
        tl.GPT.from_gpt2({**sd, "extra.weight": torch.zeros(1)}, n_heads=H)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        tl.GPT.from_gpt2(sd, n_heads=3)
    with pytest.raises(TypeError, match="n_heads"):
        tl.GPT.from_gpt2(sd, n_heads="4")  # type: ignore[arg-type]


def test_load_gpt2_state_dict_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_gpt2_state_dict(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        load_gpt2_state_dict(tmp_path / "nothing.bin")
