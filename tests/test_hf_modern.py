"""tl.hf: Llama, Qwen3 and Mistral checkpoints of Hugging Face read into the GPT of chapter 11.

Hugging Face's LlamaForCausalLM and Qwen3ForCausalLM are built from small random configs (never downloaded), with
grouped-query attention, their weights copied: greedy tokens identical, float64 logits equal to 1e-6 (Hugging Face
computes RMSNorm and the rotary tables in float32 even in float64), and to 1e-10 with `hf_float32`, which reproduces
those casts. Sliding windows: Qwen3 (its windowed layers, the last one included) and Mistral (every layer) on a
sequence longer than the window, the logits and Hugging Face's own KV-cached steps (its cache keeps only the
window) equal to 1e-10, and its `generate`'s tokens. Also: both rotary layouts, Llama 3's rope scaling, config.json
files old and new, a folder written by `save_pretrained`, and clear refusals of what the converter does not
support. Tests that need `transformers` skip
without it locally and fail under CI (tests/support.py); the others run everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from support import require

import transformer_lab as tl
from transformer_lab import hf
from transformer_lab.modern import RopeScaling, rope_frequencies

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
TRANSFORMERS_REASON = "transformers is not installed (pip install -r requirements.txt)"
V, LENGTH = 61, 24
TOL = dict(rtol=1e-10, atol=1e-10)
COMPAT_TOL = dict(rtol=1e-6, atol=1e-6)  # without hf_float32: Hugging Face's float32 casts, measured ~1e-6


def llama3() -> dict[str, object]:
    """Llama 3's rope scaling, a new dict each time (transformers writes rope_theta into the dict it is given)."""
    return {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }  # fmt: skip


def settings(kind: str, **overrides: object) -> dict[str, object]:
    """A small config with grouped-query attention (4 query heads, 2 key/value heads); Qwen3's head size 12 is
    apart from hidden_size / heads = 8."""
    values: dict[str, object] = dict(
        vocab_size=V, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=LENGTH, rms_norm_eps=1e-6, rope_theta=500.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    if kind == "qwen3":
        values["head_dim"] = 12
    values.update(overrides)
    if values.get("rope_scaling") == "llama3":
        values["rope_scaling"] = llama3()
    return values


def hf_model(kind: str, seed: int = 0, **overrides: object):  # noqa: ANN201 - a transformers model
    """A float64 Hugging Face model in eval mode, every parameter perturbed (gains away from 1)."""
    require(HAS_TRANSFORMERS, TRANSFORMERS_REASON)
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }[kind]
    torch.manual_seed(seed)
    model = model_class(config_class(**settings(kind, **overrides))).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, idx: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return model(idx).logits


KINDS = ["llama", "qwen3"]
VARIANTS = {
    "plain": {},
    "tied": dict(tie_word_embeddings=True),
    "biases": dict(attention_bias=True, mlp_bias=True),  # Llama only (Qwen3 has no mlp_bias)
    "llama3_scaling": dict(rope_scaling="llama3"),
    "mqa": dict(num_key_value_heads=1),
}
CASES = [pytest.param(k, o, id=f"{k}-{n}") for k in KINDS for n, o in VARIANTS.items() if k == "llama" or n != "biases"]


# ---------------------------------------------------------------- equal to Hugging Face's classes


@pytest.mark.parametrize(("kind", "overrides"), CASES)
def test_logits_equal_hugging_face(kind: str, overrides: dict) -> None:
    """Float64 logits: to 1e-6 as is (Hugging Face rounds through float32), to 1e-10 with its casts
    reproduced (hf_float32), on both paths, in both rotary layouts (to the same 1e-6 in the pairs layout, where
    float32's sums run in another order)."""
    reference = hf_model(kind, **overrides)
    assert reference.config.num_key_value_heads < reference.config.num_attention_heads  # grouped-query attention
    idx = tokens(2, LENGTH)
    expected = hf_logits(reference, idx)
    ours = hf.from_hf(reference.state_dict(), reference.config)
    assert ours.config.kv_heads == reference.config.num_key_value_heads
    for record in (True, False):
        with torch.no_grad():
            torch.testing.assert_close(tl.record_attention(ours, record)(idx), expected, **COMPAT_TOL)
    exact = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    for record in (True, False):
        with torch.no_grad():
            torch.testing.assert_close(tl.record_attention(exact, record)(idx), expected, **TOL)
    pairs = hf.from_hf(reference.state_dict(), reference.config, rope_layout="pairs")
    assert pairs.config.rope_layout == "pairs" and not torch.equal(
        pairs.layers[0].self_attn.w_q.weight, ours.layers[0].self_attn.w_q.weight
    )
    with torch.no_grad():
        torch.testing.assert_close(pairs(idx), ours(idx), **TOL)  # the permuted weights: the same model
        torch.testing.assert_close(pairs(idx), expected, **COMPAT_TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_hugging_face_generate(kind: str) -> None:
    """The same greedy continuation as Hugging Face's `generate`, with our KV cache and without."""
    reference = hf_model(kind)
    prompt = tokens(2, 5)
    with torch.no_grad():
        expected = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=15, do_sample=False, pad_token_id=0
        )
    for hf_float32 in (False, True):
        ours = hf.from_hf(reference.state_dict(), reference.config, hf_float32=hf_float32)
        for use_cache in (True, False):
            assert torch.equal(ours.generate(prompt, 15, temperature=0, use_cache=use_cache), expected)


WINDOW = 5  # shorter than the sequences (LENGTH = 24) and than what generation reaches (3 + 18)
WINDOWED = {
    # transformers' Qwen3Config windows the layers from max_window_layers on: here the last two of three
    "qwen3-max_window_layers": ("qwen3", dict(use_sliding_window=True, max_window_layers=1), (None, 5, 5)),
    "qwen3-layer_types": (
        "qwen3",
        dict(use_sliding_window=True, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        (5, None, 5),
    ),
    "mistral": ("mistral", {}, (5, 5, 5)),  # Mistral 7B v0.1's kind: every layer windowed
}


def hf_cached_steps(model, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:  # noqa: ANN001
    """Greedy decoding through Hugging Face's own KV cache (`DynamicCache` from the config: its windowed layers keep
    only the last window - 1 keys), in float64: the tokens, each step's logits (B, steps, V) and the keys each
    layer's cache holds at the end. Its `generate` hands back logits cast to float32, so these are read from the
    model's output."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    sequence, logits = prompt, []
    with torch.no_grad():
        out = model(prompt, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            logits.append(out.logits[:, -1])
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            out = model(token, past_key_values=cache, use_cache=True)
    return sequence, torch.stack(logits, dim=1), [layer.keys.shape[2] for layer in cache.layers]


@pytest.mark.parametrize(("kind", "overrides", "windows"), WINDOWED.values(), ids=WINDOWED.keys())
def test_sliding_window_models_equal_hugging_face(kind: str, overrides: dict, windows: tuple) -> None:
    """Qwen3 and Mistral with sliding windows, read by `from_hf` (GPTConfig.windows: any layer may be windowed, the
    last one too, which window_pattern cannot say): float64 logits on a sequence longer than the window, and the
    KV-cached generation, step by step against Hugging Face's own cache, equal to 1e-10 (hf_float32)."""
    reference = hf_model(kind, num_hidden_layers=3, sliding_window=WINDOW, **overrides)
    exact = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    assert exact.config.windows == windows and exact.config.layer_windows == windows
    assert hf.config_from_hf(reference.config.to_dict()) == hf.config_from_hf(reference.config)
    idx = tokens(2, LENGTH)
    expected = hf_logits(reference, idx)
    for record in (True, False):
        with torch.no_grad():
            torch.testing.assert_close(tl.record_attention(exact, record)(idx), expected, **TOL)
    plain = hf.from_hf(reference.state_dict(), reference.config)  # without Hugging Face's float32 casts
    with torch.no_grad():
        torch.testing.assert_close(plain(idx), expected, **COMPAT_TOL)
        unwindowed = tl.GPT(dataclasses.replace(exact.config, windows=None)).double().eval()
        unwindowed.load_state_dict(exact.state_dict())
        assert (unwindowed(idx)[:, WINDOW:] - expected[:, WINDOW:]).abs().max() > 1e-3  # the windows matter
        torch.testing.assert_close(unwindowed(idx)[:, :WINDOW], expected[:, :WINDOW], **TOL)
    prompt = idx[:, :3]
    their_tokens, their_logits, kept = hf_cached_steps(reference, prompt, 18)
    assert kept == [3 + 18 if window is None else window - 1 for window in windows]  # its cache: the window only
    for use_cache in (True, False):
        for record in (True, False):
            ours, our_logits = tl.record_attention(exact, record).generate(
                prompt, 18, temperature=0, use_cache=use_cache, return_logits=True
            )
            assert torch.equal(ours, their_tokens)
            torch.testing.assert_close(our_logits, their_logits, **TOL)
    with torch.no_grad():
        generated = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=18, do_sample=False, pad_token_id=0
        )
    assert torch.equal(generated, their_tokens)
    assert torch.equal(plain.generate(prompt, 18, temperature=0), generated)


def test_mistral_without_a_window_is_llamas_model() -> None:
    """Mistral with sliding_window=None (its later versions): no window, the same logits as Hugging Face's."""
    reference = hf_model("mistral", sliding_window=None)
    ours = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    assert ours.config.windows is None and ours.config.qk_norm is None
    assert ours.config == hf.config_from_hf(dict(reference.config.to_dict(), model_type="llama"), hf_float32=True)
    idx = tokens(2, LENGTH)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf_logits(reference, idx), **TOL)


def test_windows_read_from_config_dicts() -> None:
    """Without transformers: Qwen3's windows from use_sliding_window, sliding_window, max_window_layers (the
    defaults transformers gives them: 4096 and 28) or layer_types; Mistral's from sliding_window."""
    qwen = dict(BASE, model_type="qwen3", num_hidden_layers=4, head_dim=8)
    assert hf.config_from_hf(qwen).windows is None
    assert hf.config_from_hf(dict(qwen, sliding_window=3)).windows is None  # use_sliding_window is False
    on = dict(qwen, use_sliding_window=True, sliding_window=3)
    assert hf.config_from_hf(on).windows is None  # max_window_layers 28: no layer of 4 reaches it
    assert hf.config_from_hf(dict(on, max_window_layers=2)).windows == (None, None, 3, 3)
    assert hf.config_from_hf(dict(qwen, use_sliding_window=True, max_window_layers=3)).windows == (None,) * 3 + (4096,)
    types = ["sliding_attention", "full_attention"] * 2
    assert hf.config_from_hf(dict(on, layer_types=types, max_window_layers=0)).windows == (3, None, 3, None)
    assert hf.config_from_hf(dict(on, layer_types=["full_attention"] * 4, max_window_layers=0)).windows is None
    mistral = dict(BASE, model_type="mistral", num_hidden_layers=2)
    assert hf.config_from_hf(dict(mistral, sliding_window=7)).windows == (7, 7)
    assert hf.config_from_hf(dict(mistral, sliding_window=None)).windows is None
    assert hf.config_from_hf(mistral).windows == (4096, 4096)  # transformers' default for Mistral


def test_llama3_frequencies_are_hugging_faces() -> None:
    """The scaled rotary frequencies, computed in float32 as Hugging Face computes them: the same numbers."""
    require(HAS_TRANSFORMERS, TRANSFORMERS_REASON)
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(**settings("llama", rope_scaling="llama3"))
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = rope_frequencies(8, 500.0, RopeScaling.from_dict(llama3()), torch.float32)
    assert torch.equal(ours, theirs)


def test_save_pretrained_folder_read_back(tmp_path: Path) -> None:
    """A folder written by `save_pretrained` (config.json + model.safetensors) reads back into the same model,
    float64 kept, the tied head tied."""
    reference = hf_model("qwen3", tie_word_embeddings=True)
    reference.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = hf.load_hf(tmp_path, hf_float32=True)
    assert loaded.token_embedding.weight.dtype == torch.float64
    assert loaded.lm_head.weight is loaded.token_embedding.weight
    direct = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    idx = tokens(2, LENGTH)
    with torch.no_grad():
        assert torch.equal(loaded(idx), direct(idx))
        torch.testing.assert_close(loaded(idx), hf_logits(reference, idx), **TOL)
    assert hf.config_from_hf(tmp_path) == hf.config_from_hf(reference.config)  # the folder, or its config.json


def test_an_older_config_json_reads_like_transformers_5s(tmp_path: Path) -> None:
    """config.json files before transformers 5 hold rope_theta and rope_scaling; transformers 5's objects hold
    rope_parameters. Both give the same GPTConfig."""
    old_style = {
        "model_type": "llama", "vocab_size": V, "hidden_size": 32, "intermediate_size": 56,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "rope_scaling": {"type": "llama3", **{k: v for k, v in llama3().items() if k != "rope_type"}},
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old_style), encoding="utf-8")
    config = hf.config_from_hf(path)
    new_style = {k: v for k, v in old_style.items() if k not in ("rope_theta", "rope_scaling")}
    new_style["rope_parameters"] = dict(llama3(), rope_theta=500000.0)
    assert hf.config_from_hf(new_style) == config
    assert (config.rope_base, config.rope_scaling, config.norm_eps) == (500000.0, RopeScaling(**llama3()), 1e-5)
    assert (config.positions, config.rope_layout, config.norm, config.activation) == ("rope", "halves", "rms", "swiglu")
    assert (config.n_kv_heads, config.ff_width, config.head_dim, config.block_size) == (2, 56, None, 64)
    assert (config.bias, config.tie_embeddings, config.qk_norm) == (False, False, None)
    assert hf.config_from_hf(path, block_size=16).block_size == 16
    no_scaling = dict(old_style, rope_scaling=None)
    assert hf.config_from_hf(no_scaling).rope_scaling is None
    qwen = dict(new_style, model_type="qwen3", head_dim=12, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert (hf.config_from_hf(qwen).qk_norm, hf.config_from_hf(qwen).head_dim) == ("rms", 12)


# ---------------------------------------------------------------- what is refused


BASE = {
    "model_type": "llama", "vocab_size": V, "hidden_size": 32, "intermediate_size": 56, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(model_type="gpt2"), "model_type 'gpt2' is not supported: supported are 'llama', 'qwen3'"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "'yarn'.*'default', 'llama3'"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}), "'linear' is not supported"),
        (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}), "'dynamic' is not supported"),
        (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}), "llama3.*low_freq_factor"),
        (dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
        (dict(rope_parameters={"full_attention": {"rope_theta": 1e4}}), "rope_parameters must be one dict"),
        (dict(use_sliding_window=True), "sliding-window .* not supported for model_type 'llama'"),
        (dict(layer_types=["sliding_attention"]), "sliding-window .* not supported for model_type 'llama'"),
        (dict(model_type="qwen3", layer_types=["sliding_attention"]), "'sliding_attention' layers but .* no window"),
        (dict(model_type="qwen3", layer_types=["chunked_attention"]), r"layer_types \['chunked_attention'\] are not"),
        (dict(model_type="qwen3", layer_types=["full_attention"] * 2), "one type per layer \\(1\\)"),
        (dict(model_type="mistral", sliding_window=0), "sliding_window must be a positive int, got 0"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(attention_bias=True), "attention_bias=True and mlp_bias=False"),
        (dict(hidden_size=None), "lacks \\['hidden_size'\\]"),
    ],
)
def test_unsupported_configs_are_refused(change: dict, words: str) -> None:
    values = {k: v for k, v in {**BASE, **change}.items() if v is not None or k == "rope_parameters"}
    if values.get("rope_parameters") is None:
        values.pop("rope_parameters", None)
    with pytest.raises(ValueError, match=words):
        hf.config_from_hf(values)


def test_bad_arguments_and_state_dicts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="hf_config must be"):
        hf.config_from_hf(42)
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.config_from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        hf.config_from_hf(tmp_path / "config.json")
    with pytest.raises(ValueError, match="rope_layout"):
        hf.config_from_hf(BASE, rope_layout="interleaved")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        hf.load_hf(tmp_path / "missing")
    torch.manual_seed(0)
    ours = tl.GPT(hf.config_from_hf(BASE))
    theirs = {"model.embed_tokens.weight": ours.token_embedding.weight, "model.norm.weight": ours.norm.weight}
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        hf.from_hf([1, 2], BASE)
    with pytest.raises(ValueError, match="missing 'model.layers.0.self_attn.q_proj.weight'"):
        hf.from_hf(theirs, BASE)
    complete = _state_dict_of(ours)
    assert isinstance(hf.from_hf(complete, BASE), tl.GPT)
    with pytest.raises(ValueError, match="1 entries this converter does not know, e.g. 'model.extra'"):
        hf.from_hf({**complete, "model.extra": torch.zeros(1)}, BASE)
    with pytest.raises(ValueError, match="no 'lm_head.weight'"):
        hf.from_hf({k: v for k, v in complete.items() if k != "lm_head.weight"}, BASE)
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        hf.from_hf(complete, dict(BASE, tie_word_embeddings=True))
    with pytest.raises(ValueError, match="mixes dtypes"):
        hf.from_hf({**complete, "lm_head.weight": complete["lm_head.weight"].double()}, BASE)
    with pytest.raises(ValueError, match="does not fit the config"):
        hf.from_hf(complete, dict(BASE, intermediate_size=40))


def _state_dict_of(model: tl.GPT) -> dict[str, torch.Tensor]:
    """Hugging Face's names for a GPT built from a Llama config: the module docstring's table, backwards."""
    names = {value: key for key, value in hf._LAYER_NAMES.items()}
    out = {"model.embed_tokens.weight": model.token_embedding.weight, "model.norm.weight": model.norm.weight}
    out["lm_head.weight"] = model.lm_head.weight
    for name, tensor in model.state_dict().items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            base, part = rest.rsplit(".", 1)
            key = names.get(rest) or f"{names[base]}.{part}"
            out[f"model.layers.{i}.{key}"] = tensor
    return {k: v.detach().clone() for k, v in out.items()}


def test_lazy_submodule() -> None:
    assert tl.hf is hf
