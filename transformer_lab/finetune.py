"""From a language model to one that follows instructions (chapter 13): LoRA, the SFT format, a group-relative
policy gradient, and rewards a program checks.

    LoRALinear(base, rank, alpha, dropout)     y = base(x) + (alpha / r) B A dropout(x); only A and B train
    apply_lora(model, targets, ...)            wrap the named nn.Linear layers, freeze everything else
    merge_lora / unmerge_lora / unload_lora    fold B A into the weights (and back; or drop the wrappers)
    load_peft_lora(model, state_dict)          a Hugging Face PEFT adapter's A and B into a `from_hf` GPT

Shape legend: B batch, T length, D d_model, V vocabulary size, r LoRA's rank, G samples per prompt (a group),
P prompts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.multihead import MultiHeadAttention

__all__ = [
    "LoRALinear",
    "apply_lora",
    "lora_modules",
    "lora_parameters",
    "merge_lora",
    "unmerge_lora",
    "unload_lora",
    "load_peft_lora",
]


# ---------------------------------------------------------------- LoRA


def _check_rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be a positive int (LoRA's r, e.g. 8), got {rank!r}")
    if rank <= 0:
        raise ValueError(f"rank must be a positive int (LoRA's r, e.g. 8), got {rank}")
    return rank


def _check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise TypeError(f"alpha must be a positive number (the update is scaled by alpha / rank), got {alpha!r}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (the update is scaled by alpha / rank; e.g. alpha = 2 rank), got {alpha}")
    return float(alpha)


def _check_dropout(dropout: object) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a number in [0, 1), got {dropout!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(
            f"dropout must be in [0, 1) (the probability of zeroing an input of A; 0: none), got {dropout}"
        )
    return float(dropout)


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable low-rank update (LoRA, Hu et al. 2021; chapter 13).

        y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,    A (r, in), B (out, r)

    Only A and B train: r (in + out) numbers instead of in * out. B starts at zero, so the wrapped layer starts
    as the base layer; A starts as `nn.Linear` (and Hugging Face PEFT) starts its weights: Kaiming-uniform with
    a = sqrt(5), i.e. uniform(-1/sqrt(in), 1/sqrt(in)). `merge()` adds (alpha / r) B A into W, after which the
    layer is an ordinary Linear again (no extra matmul at inference); `unmerge()` subtracts it.

    `weight` and `bias` read like a Linear's: `weight` is the effective W + (alpha / r) B A (differentiable in A
    and B). The course's attention reads W^Q, W^K and W^V through `.weight` on its fast path (one packed matmul,
    `MultiHeadAttention.packed_projections`), so a LoRA on them is honoured there too. That path cannot apply
    dropout to A's input: `weight` refuses to be read in training mode with dropout > 0, and `apply_lora` refuses
    dropout on those three layers.

    Args:
        base: the layer to adapt (its parameters are frozen: requires_grad False).
        rank: r > 0.
        alpha: > 0; the update is scaled by alpha / r (PEFT's `lora_alpha`).
        dropout: in [0, 1), on the input of A only (PEFT's `lora_dropout`).

    Shape:
        x (..., in) -> (..., out).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be an nn.Linear, got {type(base).__name__}")
        rank, alpha, dropout = _check_rank(rank), _check_alpha(alpha), _check_dropout(dropout)
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        kind = dict(dtype=base.weight.dtype, device=base.weight.device)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kind))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kind))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(dropout)
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """The update (alpha / r) B A, (out, in): rank at most r."""
        return self.scale * (self.lora_B @ self.lora_A)  # (out, r) @ (r, in) -> (out, in)

    @property
    def weight(self) -> Tensor:
        """W + (alpha / r) B A (W alone once merged, since W then holds the update)."""
        if self.merged:
            return self.base.weight
        if self.training and self.lora_dropout.p > 0:
            raise RuntimeError(
                "this LoRA layer has dropout, which a weight cannot express: it must be called, not read through "
                ".weight, while training (use dropout=0 on layers read through their weight, e.g. W^Q, W^K, W^V)"
            )
        return self.base.weight + self.delta_weight()

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A: the same outputs (without dropout), one matmul fewer."""
        if self.merged:
            raise RuntimeError("this LoRA layer is already merged; unmerge() it first")
        self.base.weight += self.delta_weight()
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W <- W - (alpha / r) B A: back to the frozen base weight (up to rounding) and the separate update."""
        if not self.merged:
            raise RuntimeError("this LoRA layer is not merged; merge() it first")
        self.base.weight -= self.delta_weight()
        self.merged = False

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:
            return y
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)  # (..., r) -> (..., out)
        return y + self.scale * update

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, merged={self.merged}"


def _matches(name: str, target: str) -> bool:
    """PEFT's rule for a plain target name: the module's full name, or its last dotted parts."""
    return name == target or name.endswith("." + target)


def apply_lora(
    model: nn.Module, targets: Sequence[str] | str, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0
) -> list[str]:
    """Wrap every `nn.Linear` of `model` whose name matches a target in a `LoRALinear`, and freeze every other
    parameter (chapter 13). Like PEFT's `LoraConfig(target_modules=...)`: a target matches a module whose full
    name is the target or ends with "." + target ("w_q" matches "layers.0.self_attn.w_q").

    Args:
        model: the model, changed in place (a GPT: targets such as "w_q", "w_v", "feed_forward.w1", "lm_head").
        targets: module names (a str is one name).
        rank, alpha, dropout: as in `LoRALinear`.

    Returns:
        the full names of the wrapped layers, in the model's order.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, Sequence) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise TypeError(f"targets must be a non-empty list of module names (e.g. ['w_q', 'w_v']), got {targets!r}")
    rank, alpha, dropout = _check_rank(rank), _check_alpha(alpha), _check_dropout(dropout)
    modules = dict(model.named_modules())
    linears = [n for n, m in modules.items() if type(m) is nn.Linear]
    wrapped = [n for n, m in modules.items() if isinstance(m, LoRALinear)]
    chosen: list[str] = []
    for target in targets:
        found = [n for n in linears if _matches(n, target)]
        if not found:
            others = [f"{n} ({type(modules[n]).__name__})" for n in modules if n and _matches(n, target)]
            already = [n for n in wrapped if _matches(n, target)]
            why = (
                f"it already has LoRA: {already[:3]}"
                if already
                else f"it names {others[:3]}, not nn.Linear layers"
                if others
                else f"the model's Linear layers are e.g. {linears[:4]}"
            )
            raise ValueError(f"targets: {target!r} matches no nn.Linear of the model; {why}")
        chosen += [n for n in found if n not in chosen]
    chosen.sort(key=linears.index)
    tied = getattr(model, "token_embedding", None)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        linear = modules[name]
        if tied is not None and linear.weight is getattr(tied, "weight", None):
            raise ValueError(
                f"targets: {name!r} shares its weight with the token embedding (tied); merging would change the "
                "embedding too: leave it out, or untie the head first"
            )
        if dropout > 0 and isinstance(parent, MultiHeadAttention) and child in ("w_q", "w_k", "w_v"):
            raise ValueError(
                f"dropout must be 0 on {name!r}: the attention's fast path reads W^Q, W^K, W^V as one packed weight "
                "and cannot apply dropout to A's input"
            )
    for p in model.parameters():
        p.requires_grad_(False)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, child, LoRALinear(modules[name], rank, alpha, dropout))
    for module in lora_modules(model).values():
        module.lora_A.requires_grad_(True)
        module.lora_B.requires_grad_(True)
    return chosen


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's `LoRALinear` layers by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every A and B of the model (what an optimizer of a LoRA run gets)."""
    return [p for m in lora_modules(model).values() for p in (m.lora_A, m.lora_B)]


def _lora_or_error(model: nn.Module) -> dict[str, LoRALinear]:
    modules = lora_modules(model)
    if not modules:
        raise ValueError("model has no LoRA layers: apply_lora(model, targets) first")
    return modules


def merge_lora(model: nn.Module) -> None:
    """`merge()` every LoRA layer: the same function, no extra matmuls."""
    for module in _lora_or_error(model).values():
        module.merge()


def unmerge_lora(model: nn.Module) -> None:
    """`unmerge()` every LoRA layer."""
    for module in _lora_or_error(model).values():
        module.unmerge()


def unload_lora(model: nn.Module) -> nn.Module:
    """Merge every LoRA layer and put its base `nn.Linear` back in its place (PEFT's `merge_and_unload`): a plain
    model again, with the update in its weights, every parameter trainable again. Returns the model."""
    for name, module in _lora_or_error(model).items():
        if not module.merged:
            module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, module.base)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


# PEFT's name for a Llama / Qwen3 linear layer ("self_attn.q_proj") -> the GPT's ("self_attn.w_q"), as tl.hf maps it.
_PEFT_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(\w+\.\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)


def load_peft_lora(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Copy a Hugging Face PEFT adapter's A and B (a `get_peft_model(...)` state dict, or its adapter file) into a
    GPT read by `tl.hf.from_hf` and wrapped by `apply_lora` on the same layers (chapter 13).

    In the "pairs" rotary layout `from_hf` permutes the rows of W^Q and W^K within each head; the update B A
    must turn with them, so B's rows of q and k are permuted the same way (A, which acts on the input, is not).

    Returns:
        the GPT names of the layers filled.
    """
    from transformer_lab.hf import _LAYER_NAMES, _halves_to_pairs

    modules = lora_modules(model)
    config = getattr(model, "config", None)
    if config is None or not modules:
        raise ValueError("model must be a GPT wrapped by apply_lora (no LoRA layers found)")
    filled: list[str] = []
    for key, tensor in state_dict.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            continue
        layer, theirs, which = match.groups()
        if theirs not in _LAYER_NAMES:
            raise ValueError(f"state_dict[{key!r}]: no GPT layer corresponds to {theirs!r}")
        name = f"layers.{layer}.{_LAYER_NAMES[theirs]}"
        if name not in modules:
            raise ValueError(f"state_dict has LoRA for {name!r} ({key!r}), which the model has no LoRA on")
        module = modules[name]
        value = tensor.detach()
        if which == "B" and config.rope_layout == "pairs" and theirs in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = config.n_heads if theirs == "self_attn.q_proj" else config.kv_heads
            value = _halves_to_pairs(value, heads, config.d_k)  # (out, r): rows turn like W's
        target = module.lora_A if which == "A" else module.lora_B
        if target.shape != value.shape:
            raise ValueError(
                f"state_dict[{key!r}] has shape {tuple(value.shape)}, {name}.lora_{which} has {tuple(target.shape)} "
                "(is the rank the same?)"
            )
        with torch.no_grad():
            target.copy_(value)
        filled.append(f"{name}.lora_{which}")
    missing = sorted({f"{n}.lora_{w}" for n in modules for w in "AB"} - set(filled))
    if missing:
        raise ValueError(f"state_dict holds no A or B for {missing[:4]} ({len(missing)} in all)")
    return sorted({f.rsplit(".", 1)[0] for f in filled})
