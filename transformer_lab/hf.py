"""Llama, Qwen3 and Mistral checkpoints of Hugging Face as a `tl.gpt.GPT` (chapter 11), read offline.

    config_from_hf(hf_config) -> GPTConfig      the switches a LlamaConfig / Qwen3Config / MistralConfig sets
    from_hf(state_dict, hf_config) -> GPT        the same model, holding the checkpoint's weights
    load_hf(folder) -> GPT                        a folder written by `save_pretrained` (config.json + safetensors)

The three families are chapter 11's GPT with these switches: rotary positions (Hugging Face's "halves" layout),
RMSNorm (also over each head's queries and keys in Qwen3: QK norm), SwiGLU, grouped-query attention, no biases
(unless the config asks for them), a head size set apart from D / H (Qwen3, some Mistral models), a tied or untied
head, and sliding-window attention where the config windows layers (`GPTConfig.windows`, one window per layer):

    Qwen3     use_sliding_window with sliding_window, on the layers that layer_types calls "sliding_attention"
              (without layer_types: the layers from max_window_layers on, as transformers' Qwen3Config sets them)
    Mistral   sliding_window on every layer (None: no window; Mistral 7B v0.1 has 4096, later versions none)
    Llama     no window (a config that asks for one is refused)

Hugging Face's window counts the query's own key, as the GPT's does: query i sees keys i - window < j <= i. Their
names map onto the GPT's as follows (a `LlamaModel` state dict has no "model." prefix; both are read):

    model.embed_tokens                    -> token_embedding
    model.layers.i.input_layernorm        -> layers.i.norm1
    model.layers.i.self_attn.q_proj       -> layers.i.self_attn.w_q      (k_proj -> w_k, v_proj -> w_v, o_proj -> w_o)
    model.layers.i.self_attn.q_norm       -> layers.i.self_attn.q_norm   (k_norm -> k_norm; Qwen3 only)
    model.layers.i.post_attention_layernorm -> layers.i.norm2
    model.layers.i.mlp.gate_proj          -> layers.i.feed_forward.w1    (up_proj -> w3, down_proj -> w2)
    model.norm                            -> norm
    lm_head                               -> lm_head (absent when tied to embed_tokens)

The rotary layout is a convention (`tl.modern`): with `rope_layout="pairs"` (chapter 08's), the rows of W^Q and
W^K of each head (and the QK-norm gains) are permuted so that feature i + d_k/2 sits beside feature i; the model
computes the same logits.

Rope scaling: none (Hugging Face's rope_type "default") and Llama 3's "llama3" are supported; "linear",
"dynamic", "yarn", "longrope" and the others are refused with an error.
Hugging Face computes RMSNorm and the rotary tables in float32 even in a float64 model: `hf_float32=True`
reproduces those casts. Measured on small random models in float64 (tests/test_hf_modern.py): with it the logits
are Hugging Face's bit for bit (in the "halves" layout; in "pairs" float32's sums run in another order); without
it they differ by up to ~5e-7 at logits of size ~2.

`transformers` is not needed here: a config is read from a `config.json` or a plain dict as well as from a
transformers config object.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_lab._checks import check_bool, check_positive_int
from transformer_lab.gpt import GPT, GPTConfig, load_gpt2_state_dict
from transformer_lab.modern import ROPE_LAYOUTS, RopeScaling

__all__ = ["SUPPORTED_MODEL_TYPES", "SUPPORTED_ROPE_TYPES", "read_hf_config", "config_from_hf", "from_hf", "load_hf"]

#: The model families this module converts (Hugging Face's `model_type`).
SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "mistral")
#: The rope scalings it reproduces exactly ("default" is no scaling).
SUPPORTED_ROPE_TYPES = ("default", "llama3")

# Hugging Face name (after "model.layers.i.") -> ours (after "layers.i.")
_LAYER_NAMES = {
    "input_layernorm.weight": "norm1.weight",
    "post_attention_layernorm.weight": "norm2.weight",
    "self_attn.q_proj": "self_attn.w_q",
    "self_attn.k_proj": "self_attn.w_k",
    "self_attn.v_proj": "self_attn.w_v",
    "self_attn.o_proj": "self_attn.w_o",
    "self_attn.q_norm.weight": "self_attn.q_norm.weight",
    "self_attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
}


def read_hf_config(hf_config: object) -> dict[str, Any]:
    """A Hugging Face config as a plain dict: from a transformers config object (its `to_dict()`), a mapping, a
    `config.json` file, or a folder holding one."""
    if isinstance(hf_config, (str, os.PathLike)):
        path = Path(hf_config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {os.fspath(path)!r}")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
    elif isinstance(hf_config, Mapping):
        values = dict(hf_config)
    elif callable(getattr(hf_config, "to_dict", None)):
        values = hf_config.to_dict()  # type: ignore[union-attr]
    else:
        raise TypeError(
            "hf_config must be a transformers config (LlamaConfig, Qwen3Config, MistralConfig), a dict, or the path "
            f"of a config.json or of its folder; got {type(hf_config).__name__}"
        )
    if not isinstance(values, dict):
        raise ValueError(f"hf_config must hold a JSON object (a model's config), got {type(values).__name__}")
    return values


def _rope(values: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from transformers 5's `rope_parameters` or older files' rope_theta / rope_scaling."""
    parameters = values.get("rope_parameters")
    if parameters is None:  # config.json before transformers 5: rope_theta beside rope_scaling
        parameters = dict(values.get("rope_scaling") or {})
        parameters.setdefault("rope_theta", values.get("rope_theta", 10000.0))
    if not isinstance(parameters, Mapping) or "rope_theta" not in parameters:
        raise ValueError(
            f"rope_parameters must be one dict holding rope_theta (per-layer-type parameters are not supported), "
            f"got {parameters!r}"
        )
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope scaling {rope_type!r} is not supported: supported are {', '.join(map(repr, SUPPORTED_ROPE_TYPES))} "
            "('default' is no scaling)"
        )
    if parameters.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"partial_rotary_factor={parameters['partial_rotary_factor']} is not supported (rotary positions on "
            "every feature of a head only)"
        )
    theta = float(parameters["rope_theta"])
    if rope_type == "default":
        return theta, None
    try:
        scaling = RopeScaling(
            factor=parameters["factor"],
            low_freq_factor=parameters["low_freq_factor"],
            high_freq_factor=parameters["high_freq_factor"],
            original_max_position_embeddings=parameters["original_max_position_embeddings"],
        )
    except KeyError as error:
        raise ValueError(f"llama3 rope scaling needs {error.args[0]!r}, which the config lacks") from None
    return theta, scaling


def _windows(values: dict[str, Any], model_type: str, n_layers: int) -> tuple[int | None, ...] | None:
    """Each layer's sliding window as transformers builds it (see the module docstring), or None: no layer windowed."""
    layer_types = values.get("layer_types")
    # transformers' default window is 4096 for both; a config.json may say null (no window), as later Mistrals do
    if model_type == "mistral":  # one window for every layer (transformers' Mistral does not read layer_types)
        window = values.get("sliding_window", 4096)
        windows: list[int | None] = [window] * n_layers
    elif model_type == "qwen3":
        window = values.get("sliding_window", 4096) if values.get("use_sliding_window", False) else None
        if layer_types is None:  # transformers' Qwen3Config: the layers from max_window_layers on are windowed
            first = values.get("max_window_layers", 28)
            windowed = [window is not None and i >= first for i in range(n_layers)]
            layer_types = ["sliding_attention" if w else "full_attention" for w in windowed]
        if not isinstance(layer_types, (list, tuple)) or len(layer_types) != n_layers:
            raise ValueError(f"layer_types must list one type per layer ({n_layers}), got {layer_types!r}")
        unknown = sorted({str(kind) for kind in layer_types} - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(
                f"layer_types {unknown} are not supported: only 'full_attention' and 'sliding_attention' layers"
            )
        if window is None and "sliding_attention" in layer_types:
            raise ValueError(
                "layer_types has 'sliding_attention' layers but the config sets no window (use_sliding_window "
                "with sliding_window): transformers could not build this model either"
            )
        windows = [window if kind == "sliding_attention" else None for kind in layer_types]
    else:  # Llama: transformers' LlamaModel has no sliding window
        if values.get("use_sliding_window", False) or any(kind != "full_attention" for kind in layer_types or ()):
            raise ValueError(
                f"sliding-window attention (use_sliding_window / layer_types) is not supported for model_type "
                f"{model_type!r} (transformers' model has none); Qwen3 and Mistral configs are read with their windows"
            )
        return None
    if all(window is None for window in windows):
        return None
    if any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1) for w in windows):
        raise ValueError(f"sliding_window must be a positive int, got {values.get('sliding_window')!r}")
    return tuple(windows)


def config_from_hf(
    hf_config: object, *, block_size: int | None = None, rope_layout: str = "halves", hf_float32: bool = False
) -> GPTConfig:
    """The `GPTConfig` of a Hugging Face Llama, Qwen3 or Mistral config (chapter 11).

    Args:
        hf_config: a LlamaConfig / Qwen3Config / MistralConfig, a dict, or the path of a config.json (or of its
            folder).
        block_size: the context length; None: the config's max_position_embeddings. The GPT's causal mask takes
            block_size^2 bytes, and as much again for the mask of a sliding window: pass a smaller one for
            long-context checkpoints (Qwen3's 40960 would take 1.6 GB, Mistral's 131072 17 GB).
        rope_layout: "halves" (Hugging Face's, the weights unchanged) or "pairs" (chapter 08's; `from_hf`
            then permutes the rows of W^Q and W^K).
        hf_float32: compute RMSNorm and the rotary tables in float32 as Hugging Face does (see the module
            docstring).
    """
    values = read_hf_config(hf_config)
    model_type = values.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported: supported are {', '.join(map(repr, SUPPORTED_MODEL_TYPES))}"
        )
    if rope_layout not in ROPE_LAYOUTS:
        raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {rope_layout!r}")
    check_bool("hf_float32", hf_float32)
    activation = values.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"hidden_act {activation!r} is not supported: the GPT's SwiGLU gates with SiLU ('silu')")
    attention_bias, mlp_bias = bool(values.get("attention_bias", False)), bool(values.get("mlp_bias", False))
    if attention_bias != mlp_bias:
        raise ValueError(
            f"attention_bias={attention_bias} and mlp_bias={mlp_bias} differ; the GPT has one bias switch for all "
            "its Linear layers"
        )
    required = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"hf_config lacks {missing}; is it a Llama, Qwen3 or Mistral config?")
    windows = _windows(values, model_type, values["num_hidden_layers"])
    n_heads = values["num_attention_heads"]
    head_dim = values.get("head_dim") or values["hidden_size"] // n_heads
    theta, scaling = _rope(values)
    if block_size is None:
        block_size = values.get("max_position_embeddings", 2048)
    check_positive_int("block_size", block_size)
    return GPTConfig(
        vocab_size=values["vocab_size"],
        block_size=block_size,
        d_model=values["hidden_size"],
        n_heads=n_heads,
        n_layers=values["num_hidden_layers"],
        dropout=0.0,
        bias=attention_bias,
        tie_embeddings=bool(values.get("tie_word_embeddings", False)),
        activation="swiglu",
        positions="rope",
        rope_base=theta,
        rope_layout=rope_layout,
        rope_scaling=scaling,
        norm="rms",
        norm_eps=float(values.get("rms_norm_eps", 1e-6)),
        qk_norm="rms" if model_type == "qwen3" else None,
        n_kv_heads=values.get("num_key_value_heads") or n_heads,
        head_dim=head_dim if head_dim * n_heads != values["hidden_size"] else None,
        ff_width=values["intermediate_size"],
        hf_float32=hf_float32,
        windows=windows,
    )


def _halves_to_pairs(weight: Tensor, heads: int, d_k: int) -> Tensor:
    """Rows of a projection (or a head's gains) from the halves layout to the pairs one: within each head, new
    feature 2i is old feature i, new 2i + 1 is old i + d_k/2. (heads * d_k, ...) -> the same shape."""
    half = d_k // 2
    order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # 0, d/2, 1, d/2+1, ...
    return weight.reshape(heads, d_k, *weight.shape[1:])[:, order].reshape(weight.shape)


def _convert(state_dict: Mapping[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Hugging Face's names -> ours (the table in the module docstring), checking for leftovers."""
    # A LlamaForCausalLM's names start with "model." (but lm_head); a LlamaModel's do not.
    prefixed = any(k.startswith("model.") for k in state_dict)
    original = {(k[len("model.") :] if k.startswith("model.") else k): k for k in state_dict}
    sd = {k: state_dict[name] for k, name in original.items()}
    used: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in sd:
            shown = f"model.{name}" if prefixed and name != "lm_head.weight" else name
            raise ValueError(f"state_dict is missing {shown!r} (a model with this config has it)")
        tensor = sd[name]
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise TypeError(f"state_dict[{name!r}] must be a floating-point torch.Tensor, got {type(tensor).__name__}")
        used.add(name)
        return tensor.detach()

    # The parameters of one layer, by their Hugging Face name: Linear layers with their biases where there are some.
    linears = [theirs for theirs in _LAYER_NAMES if not theirs.endswith(".weight")]
    names = [f"{theirs}.{part}" for theirs in linears for part in (("weight", "bias") if config.bias else ("weight",))]
    names += ["input_layernorm.weight", "post_attention_layernorm.weight"]
    names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] if config.qk_norm is not None else []
    ours = {"token_embedding.weight": take("embed_tokens.weight"), "norm.weight": take("norm.weight")}
    for i in range(config.n_layers):
        for name in names:
            part = name.rsplit(".", 1)[1]
            mapped = _LAYER_NAMES.get(name) or f"{_LAYER_NAMES[name.rsplit('.', 1)[0]]}.{part}"
            ours[f"layers.{i}.{mapped}"] = take(f"layers.{i}.{name}")
    # Older checkpoints saved the rotary frequencies as buffers: not weights (the GPT computes its own tables).
    used.update(k for k in sd if k.endswith("rotary_emb.inv_freq"))
    head = sd.get("lm_head.weight")
    if config.tie_embeddings:
        if head is not None and not torch.equal(head, ours["token_embedding.weight"]):
            raise ValueError(
                "the config ties the head to the embedding (tie_word_embeddings), but lm_head.weight differs"
            )
        used.add("lm_head.weight")
        ours["lm_head.weight"] = ours["token_embedding.weight"]
    else:
        if head is None:
            raise ValueError(
                "state_dict has no 'lm_head.weight', and the config does not tie the head to the embedding"
            )
        ours["lm_head.weight"] = take("lm_head.weight")
    unknown = sorted(set(sd) - used)
    if unknown:
        shown = ", ".join(repr(original[k]) for k in unknown[:5])
        raise ValueError(f"state_dict has {len(unknown)} entries this converter does not know, e.g. {shown}")
    if config.rope_layout == "pairs":  # Hugging Face's weights turn halves: move each head's features into pairs
        for i in range(config.n_layers):
            prefix = f"layers.{i}.self_attn."
            for name, heads in (("w_q", config.n_heads), ("w_k", config.kv_heads), ("q_norm", 1), ("k_norm", 1)):
                for part in ("weight", "bias"):
                    if prefix + name + "." + part in ours:
                        key = prefix + name + "." + part
                        ours[key] = _halves_to_pairs(ours[key], heads, config.d_k)
    return ours


def from_hf(
    state_dict: Mapping[str, Tensor],
    hf_config: object,
    *,
    block_size: int | None = None,
    rope_layout: str = "halves",
    hf_float32: bool = False,
) -> GPT:
    """A `GPT` holding a Hugging Face LlamaForCausalLM / Qwen3ForCausalLM / MistralForCausalLM state dict
    (chapter 11).

    Args:
        state_dict: the tensors by name (`model.state_dict()`, or `tl.gpt.load_gpt2_state_dict(folder)`, which
            reads the safetensors and bin files of any model).
        hf_config: the model's config: a transformers config object, a dict, or a config.json path.
        block_size, rope_layout, hf_float32: as in `config_from_hf`.

    Returns:
        the model in eval mode, in the state dict's dtype.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    config = config_from_hf(hf_config, block_size=block_size, rope_layout=rope_layout, hf_float32=hf_float32)
    ours = _convert(state_dict, config)
    dtypes = sorted({str(v.dtype) for v in ours.values()})
    if len(dtypes) > 1:
        raise ValueError(f"state_dict mixes dtypes {dtypes}; convert every tensor to one dtype first")
    model = GPT(config).to(ours["token_embedding.weight"].dtype)
    try:
        model.load_state_dict(ours, strict=True)
    except RuntimeError as error:  # shapes that do not fit the config, or tensors on the meta device
        raise ValueError(f"state_dict does not fit the config: {str(error)[:400]}") from None
    return model.eval()


def load_hf(
    path: str | os.PathLike[str],
    *,
    block_size: int | None = None,
    rope_layout: str = "halves",
    hf_float32: bool = False,
) -> GPT:
    """A `GPT` from a Llama, Qwen3 or Mistral folder written by `save_pretrained` (or downloaded): config.json and
    model.safetensors (or its sharded index, or pytorch_model.bin), read without any network (chapter 11).

    Args: as `from_hf`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder path (str or pathlib.Path), got {type(path).__name__}")
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{os.fspath(folder)!r} is not a folder (save_pretrained writes a folder)")
    return from_hf(
        load_gpt2_state_dict(folder), folder, block_size=block_size, rope_layout=rope_layout, hf_float32=hf_float32
    )
