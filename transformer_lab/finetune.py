"""From a language model to one that follows instructions (chapter 13): LoRA, the SFT format, a group-relative
policy gradient, and rewards a program checks.

    LoRALinear(base, rank, alpha, dropout)     y = base(x) + (alpha / r) B A dropout(x); only A and B train
    apply_lora(model, targets, ...)            wrap the named nn.Linear layers, freeze everything else
    merge_lora / unmerge_lora / unload_lora    fold B A into the weights (and back; or drop the wrappers)
    load_peft_lora(model, state_dict)          a Hugging Face PEFT adapter's A and B into a `from_hf` GPT
    SFTFormat                                  <|prompt|> prompt <|response|> response <|end|>, as token ids
    add_special_tokens(model, n)               a copy of a trained GPT with n more tokens (rows: the mean row)
    response_loss(logits, targets, mask)       cross-entropy over the response tokens only
    save_sft / load_sft / check_format         a fine-tuned GPT's checkpoint, which carries its format
    save_lora / load_lora                      LoRA's A and B alone, tied to their base by a fingerprint
    token_logprobs(logits, targets)            log p(target) at every position
    group_advantages(rewards, z_score)         reward minus its group's mean (divided by the group's std)
    policy_gradient_loss(...)                  the group-relative policy gradient objective, token-level
    sample_groups / response_logprobs          G samples per prompt in one batch with the KV cache; their log-probs
    generate_forced_heads                      constrained decoding: each line's first character forced (stage b)
    poem_lines / in_form / acrostic / rhymes   藏头诗's checks, plain functions of the text (the rewards)
    rhyme_class(char)                          the character's class in 中华新韵 (14 classes), by pypinyin
    pretraining_poems / make_examples / sft_splits   SFT data from the corpus, split by poem (test: unseen before)
    poem_rates / diversity                     the benchmarks' shares: form, acrostic, rhyme, all; distinct, copied
    encode_examples / sft                      SFT: the masked response loss with the course's AdamW, fixed steps
    rejection_sample                           the model's own poems that pass every check (stage c')
    rl                                         the group-relative policy gradient loop, rewards plain functions
    sample_poems / evaluate_poems / common_heads   unconstrained sampling at fixed settings and its rates
    held_out_heads / heads_begun               the benchmark's held-out heads; which lines begin with their head

Tested (tests/test_finetune.py): LoRA equal to Hugging Face PEFT on a Llama read by `tl.hf.from_hf` (logits and
A, B gradients to 1e-10 in float64, merged weights to 1e-12); the RL objective equal to a loop implementation;
the rewards on hand-made poems; on the Tang corpus 77.7 % of the five-character quatrains rhyme on lines 2 and 4
under the rhyme table (`corpus_rhyme_rate`).

Shape legend: B batch, T length, D d_model, V vocabulary size, r LoRA's rank, G samples per prompt (a group),
P prompts.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import unicodedata
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

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
    "SFTFormat",
    "add_special_tokens",
    "response_loss",
    "save_sft",
    "load_sft",
    "check_format",
    "base_fingerprint",
    "save_lora",
    "load_lora",
    "token_logprobs",
    "group_advantages",
    "policy_gradient_loss",
    "Rollout",
    "sample_groups",
    "response_logprobs",
    "generate_forced_heads",
    "RHYME_TABLE",
    "rhyme_class",
    "poem_lines",
    "in_form",
    "acrostic",
    "rhymes",
    "poem_checks",
    "poem_reward",
    "rhyme_reward",
    "corpus_rhyme_rate",
    "INSTRUCTIONS",
    "SFTExample",
    "pretraining_poems",
    "quatrains_of",
    "make_examples",
    "sft_splits",
    "continuation_checks",
    "poem_rates",
    "diversity",
    "encode_examples",
    "sft_validation_loss",
    "sft",
    "fine_tune",
    "four_lines",
    "acrostic_prompt",
    "heads_begun",
    "held_out_heads",
    "sample_poems",
    "rejection_sample",
    "rl",
    "evaluate_poems",
    "common_heads",
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


# ---------------------------------------------------------------- the prompt / response format of SFT


@dataclass(frozen=True)
class SFTFormat:
    """How a prompt and its response become one token sequence for supervised fine-tuning (chapter 13).

        <|prompt|> prompt <|response|> response <|end|>

    The three markers are new tokens, appended after a trained model's vocabulary: ids base_vocab,
    base_vocab + 1, base_vocab + 2 (`add_special_tokens` grows the model to match). The text between them is
    encoded by the base model's own tokenizer. Training predicts only the response and <|end|> (`encode`'s
    mask): the prompt is given, not learned. At sampling time the model is fed "<|prompt|> prompt <|response|>"
    and stops at <|end|>. The format travels with a checkpoint as `to_dict()`.

    Args:
        base_vocab: the base tokenizer's vocabulary size.
        tokens: the markers' names (shown in decoded text), in the order prompt, response, end.
    """

    base_vocab: int
    tokens: tuple[str, str, str] = ("<|prompt|>", "<|response|>", "<|end|>")

    def __post_init__(self) -> None:
        if isinstance(self.base_vocab, bool) or not isinstance(self.base_vocab, int) or self.base_vocab <= 0:
            raise ValueError(
                f"base_vocab must be a positive int (the base tokenizer's vocab_size), got {self.base_vocab!r}"
            )
        tokens = tuple(self.tokens) if isinstance(self.tokens, (list, tuple)) else self.tokens
        if not isinstance(tokens, tuple) or len(tokens) != 3 or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError(f"tokens must be three non-empty names (prompt, response, end), got {self.tokens!r}")
        if len(set(tokens)) != 3:
            raise ValueError(f"tokens must be three different names, got {tokens!r}")
        object.__setattr__(self, "tokens", tokens)

    @property
    def prompt_id(self) -> int:
        return self.base_vocab

    @property
    def response_id(self) -> int:
        return self.base_vocab + 1

    @property
    def end_id(self) -> int:
        return self.base_vocab + 2

    @property
    def vocab_size(self) -> int:
        """The grown vocabulary: the base's and the three markers."""
        return self.base_vocab + 3

    def _text_ids(self, name: str, tokenizer: Any, text: object) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
        if getattr(tokenizer, "vocab_size", None) != self.base_vocab:
            raise ValueError(
                f"the tokenizer has {getattr(tokenizer, 'vocab_size', None)} tokens, the format was made for "
                f"base_vocab={self.base_vocab}: use the base model's own tokenizer"
            )
        ids = tokenizer.encode(text)
        return ids.tolist() if isinstance(ids, Tensor) else list(ids)

    def prompt_ids(self, tokenizer: Any, prompt: str) -> list[int]:
        """What sampling starts from: <|prompt|> prompt <|response|>."""
        return [self.prompt_id, *self._text_ids("prompt", tokenizer, prompt), self.response_id]

    def encode(self, tokenizer: Any, prompt: str, response: str) -> tuple[Tensor, Tensor, Tensor]:
        """One example as (inputs, targets, mask) for next-token training.

        Returns:
            inputs (T,) and targets (T,) = the sequence without its last / first token, and mask (T,) bool, True
            where the target is a response token or <|end|>: the positions the loss counts.
        """
        head = self.prompt_ids(tokenizer, prompt)
        tail = [*self._text_ids("response", tokenizer, response), self.end_id]
        ids = torch.tensor(head + tail)  # (T + 1,)
        mask = torch.zeros(len(ids) - 1, dtype=torch.bool)  # (T,)
        mask[len(head) - 1 :] = True  # target t is ids[t + 1]: the first response token is predicted at len(head) - 1
        return ids[:-1], ids[1:], mask

    def batch(self, tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> tuple[Tensor, Tensor, Tensor]:
        """Several (prompt, response) pairs padded on the right to one length: (B, T) inputs, targets, mask.
        Padding is <|end|> with mask False (never counted)."""
        if not isinstance(pairs, Sequence) or not pairs:
            raise ValueError("pairs must be a non-empty list of (prompt, response) strings")
        rows = [self.encode(tokenizer, *pair) for pair in pairs]
        length = max(len(x) for x, _, _ in rows)
        inputs = torch.full((len(rows), length), self.end_id)  # (B, T)
        targets = torch.full((len(rows), length), self.end_id)  # (B, T)
        mask = torch.zeros((len(rows), length), dtype=torch.bool)  # (B, T)
        for i, (x, y, m) in enumerate(rows):
            inputs[i, : len(x)], targets[i, : len(y)], mask[i, : len(m)] = x, y, m
        return inputs, targets, mask

    def decode_response(self, tokenizer: Any, ids: Sequence[int] | Tensor) -> str:
        """The text of sampled response ids, up to (without) the first <|end|>; a marker inside is an error."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if self.end_id in ids:
            ids = ids[: ids.index(self.end_id)]
        stray = [i for i in ids if i >= self.base_vocab]
        if stray:
            names = [self.tokens[i - self.base_vocab] if i < self.vocab_size else str(i) for i in stray]
            raise ValueError(f"the response holds markers before <|end|>: {names[:3]}")
        return tokenizer.decode(ids)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {"base_vocab": self.base_vocab, "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SFTFormat:
        if not isinstance(data, Mapping) or "base_vocab" not in data:
            raise ValueError(f"an SFT format must be a dict with base_vocab and tokens, got {data!r}")
        return cls(
            base_vocab=data["base_vocab"], tokens=tuple(data.get("tokens", cls.__dataclass_fields__["tokens"].default))
        )


@torch.no_grad()
def add_special_tokens(model: nn.Module, count: int = 3) -> nn.Module:
    """A copy of a trained GPT with `count` more tokens, ids V .. V + count - 1 (chapter 13).

    The token embedding grows by `count` rows; an untied head grows too (a tied one is the same matrix). Each new
    row is the MEAN of the existing rows (embedding and head alike), as Hewitt (2021, "Initializing new word
    embeddings for pretrained language models") proposes and Hugging Face's `resize_token_embeddings` does by
    default (`mean_resizing`, there with a little noise added). Why the mean: a new token's logit is then
    h . mean(w_i) = mean(h . w_i), the MEAN of the existing logits, and by Jensen's inequality
    exp(mean logit) <= mean(exp logit), so each new token starts with at most the average probability 1 / V
    and the old tokens keep their ratios: the fine-tuning starts from the trained model's own predictions,
    nearly unchanged. A random row (GPT-2's N(0, 0.02^2)) or a zero row gives logits unrelated to the trained
    scale, which can be far above the others and then dominate every prediction until trained away; as an input,
    the mean row sits in the middle of the embeddings the layers were trained on.

    Returns:
        a new GPT (the model is not changed), config.vocab_size = V + count, in the model's dtype and mode.
    """
    from transformer_lab.gpt import GPT

    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tl.gpt.GPT, got {type(model).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise ValueError(f"count must be a positive int (how many tokens to add), got {count!r}")
    if lora_modules(model):
        raise ValueError("model has LoRA layers: add the special tokens before apply_lora")
    grown = copy.deepcopy(model)
    config = dataclasses.replace(model.config, vocab_size=model.config.vocab_size + count)
    old = model.token_embedding.weight  # (V, D)
    embedding = nn.Embedding(config.vocab_size, config.d_model, dtype=old.dtype, device=old.device)
    embedding.weight.copy_(torch.cat([old, old.mean(0, keepdim=True).expand(count, -1)]))  # (V + count, D)
    grown.token_embedding = embedding
    if config.tie_embeddings:
        grown.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, dtype=old.dtype, device=old.device)
        grown.lm_head.weight = embedding.weight
    else:
        head = model.lm_head.weight  # (V, D)
        grown.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, dtype=head.dtype, device=head.device)
        grown.lm_head.weight.copy_(torch.cat([head, head.mean(0, keepdim=True).expand(count, -1)]))
    grown.config = config
    return grown


def response_loss(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """The mean cross-entropy over the response positions only (chapter 13's SFT loss).

    sum over positions with mask True of -log p(target) / the number of such positions, across the whole batch
    (every response token weighs the same, as nanochat's SFT, whose ignored targets are -1, does). Prompt
    positions and padding contribute nothing, so their logits get a zero gradient.

    Shape:
        logits (B, T, V), targets (B, T) int, mask (B, T) bool -> a scalar.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise ValueError(f"logits must be a (B, T, V) tensor, got {getattr(logits, 'shape', type(logits).__name__)}")
    if not isinstance(targets, Tensor) or targets.shape != logits.shape[:2] or targets.is_floating_point():
        raise ValueError(f"targets must be a (B, T) = {tuple(logits.shape[:2])} integer tensor of token ids")
    if not isinstance(mask, Tensor) or mask.shape != logits.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a (B, T) = {tuple(logits.shape[:2])} bool tensor (True: a response token)")
    if not mask.any():
        raise ValueError("mask has no True position: there is no response token to learn")
    # Only the response positions enter the loss at all: (M, V) logits and (M,) targets, M = mask.sum().
    return F.cross_entropy(logits[mask], targets[mask], reduction="sum") / mask.sum()


def check_format(model: nn.Module, fmt: object) -> None:
    """Raise unless `fmt` is an `SFTFormat` made for this model: its vocabulary is the model's (the base's and
    the three markers). Sampling calls it, so a model is never prompted with markers it does not have (or
    that mean other tokens)."""
    if not isinstance(fmt, SFTFormat):
        raise TypeError(f"fmt must be an SFTFormat (the fine-tuned model's, from load_sft), got {type(fmt).__name__}")
    size = model.config.vocab_size
    if size != fmt.vocab_size:
        raise ValueError(
            f"the format's markers are ids {fmt.prompt_id}-{fmt.end_id} (base_vocab={fmt.base_vocab}), but the "
            f"model has vocab_size={size}: use the format saved with the model (load_sft), or grow a base model "
            "with add_special_tokens"
        )


#: The `kind` of a fine-tuned GPT's checkpoint (`save_sft`); chapter 10's `save_gpt` writes "gpt".
SFT_KIND = "gpt_sft"


def save_sft(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Any, fmt: SFTFormat, *, half: bool = False, **extra: Any
) -> None:
    """Write a fine-tuned GPT: `save_gpt`'s checkpoint (config, the BASE tokenizer, weights, extra plain data)
    with kind "gpt_sft" and the format ("sft_format": `fmt.to_dict()`), read back by `load_sft`. LoRA layers
    are saved merged (`unload_lora` on a copy): the file holds a plain GPT.

    Args:
        half: store the weights in float16 (`load_sft` returns float32).
    """
    from transformer_lab._checks import check_bool, check_plain_data
    from transformer_lab.gpt import GPT

    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tl.gpt.GPT, got {type(model).__name__}")
    check_format(model, fmt)
    if getattr(tokenizer, "vocab_size", None) != fmt.base_vocab or not callable(getattr(tokenizer, "to_dict", None)):
        raise ValueError(
            f"tokenizer must be the base model's ({fmt.base_vocab} tokens, as the format says), got "
            f"{getattr(tokenizer, 'vocab_size', type(tokenizer).__name__)}"
        )
    check_bool("half", half)
    for key in ("kind", "config", "tokenizer", "state_dict", "sft_format"):
        if key in extra:
            raise ValueError(f"extra data may not be called {key!r}: the checkpoint uses that key itself")
    for key, value in extra.items():
        check_plain_data(key, value)
    if lora_modules(model):
        model = unload_lora(copy.deepcopy(model))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if half:
        state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    checkpoint = {
        "kind": SFT_KIND,
        "config": model.config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "sft_format": fmt.to_dict(),
        "state_dict": state,
        **extra,
    }
    torch.save(checkpoint, path)


def load_sft(path: str | os.PathLike[str]) -> tuple[nn.Module, Any, SFTFormat]:
    """(model, base tokenizer, format) from a file of `save_sft`: a float32 GPT in eval mode. A checkpoint
    without a format (chapter 10's `save_gpt`: a base model) or with one that does not fit its model is refused.
    """
    from transformer_lab.gpt import GPT
    from transformer_lab.gpt_training import gpt_checkpoint_parts, load_gpt_weights, read_checkpoint_file

    data = read_checkpoint_file(path, "fine-tuned GPT", "write it with tl.finetune.save_sft")
    if isinstance(data, dict) and data.get("kind") == "gpt":
        raise ValueError(
            f"{os.fspath(path)!r} holds a base GPT without a prompt/response format (it was not fine-tuned): "
            "fine-tune it and save it with tl.finetune.save_sft, or load it with tl.training.load_gpt"
        )
    if not isinstance(data, dict) or data.get("kind") != SFT_KIND:
        raise ValueError(f"{os.fspath(path)!r} is not a fine-tuned GPT checkpoint (write one with save_sft)")
    config, tokenizer = gpt_checkpoint_parts(path, data, "fine-tuned GPT", extra_keys=("sft_format",))
    try:
        fmt = SFTFormat.from_dict(data["sft_format"])
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{os.fspath(path)!r} holds a bad prompt/response format: {error}") from None
    if tokenizer.vocab_size != fmt.base_vocab:
        raise ValueError(
            f"{os.fspath(path)!r}: the format was made for {fmt.base_vocab} base tokens, the tokenizer has "
            f"{tokenizer.vocab_size}"
        )
    model = GPT(config)
    check_format(model, fmt)
    return load_gpt_weights(path, model, data["state_dict"]).eval(), tokenizer, fmt


#: The `kind` of a LoRA adapter's checkpoint (`save_lora`).
LORA_KIND = "gpt_lora"


#: The parameters whose LAST rows are the added tokens' (`add_special_tokens`): the token embedding and a head.
_TOKEN_ROWS = ("token_embedding.weight", "lm_head.weight")


def base_fingerprint(model: nn.Module, skip_rows: int = 0) -> str:
    """A SHA-256 of the model's frozen (non-LoRA) weights as float32 bytes, names and all: an adapter saved on
    one base is refused on any other (`load_lora`). Unmerged LoRA layers count as their base. `skip_rows`
    leaves out the last rows of the token embedding and the head: the added tokens' rows, which a LoRA run may
    train (`sft(..., new_rows=3)`) and its adapter then carries."""
    import hashlib

    if isinstance(skip_rows, bool) or not isinstance(skip_rows, int) or skip_rows < 0:
        raise ValueError(f"skip_rows must be an int >= 0 (the added tokens' rows), got {skip_rows!r}")
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if "lora_" in name:
            continue
        name = name.replace(".base.", ".")
        if skip_rows and name in _TOKEN_ROWS:
            tensor = tensor[:-skip_rows]
        digest.update(name.encode("utf-8"))
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_lora(
    model: nn.Module, path: str | os.PathLike[str], new_rows: int = 0, *, half: bool = False, **extra: Any
) -> None:
    """Write only a model's LoRA layers: their names, rank, alpha, dropout, A and B, and the fingerprint of
    the base they were trained on (`base_fingerprint`), a few kilobytes instead of the whole model. The layers
    must not be merged (the base would then hold the update).

    `new_rows`: also store the last `new_rows` rows of the token embedding, the added tokens' rows that a LoRA
    run trained beside A and B (`sft(..., new_rows=3)`, as PEFT's `trainable_token_indices` does); the
    fingerprint then leaves them out, and `load_lora` puts them back.

    `half`: store A, B and the token rows in float16 (`load_lora` copies them into the model's float32)."""
    from transformer_lab._checks import check_bool, check_plain_data

    modules = _lora_or_error(model)
    if any(m.merged for m in modules.values()):
        raise ValueError("the LoRA layers are merged: unmerge_lora(model) before save_lora (the base must be clean)")
    if isinstance(new_rows, bool) or not isinstance(new_rows, int) or new_rows < 0:
        raise ValueError(f"new_rows must be an int >= 0 (the added tokens' rows to store), got {new_rows!r}")
    check_bool("half", half)
    dtype = torch.float16 if half else None
    for key, value in extra.items():
        if key in ("kind", "layers", "base_fingerprint", "token_rows"):
            raise ValueError(f"extra data may not be called {key!r}: the checkpoint uses that key itself")
        check_plain_data(key, value)
    layers = {
        name: {"rank": m.rank, "alpha": m.alpha, "dropout": m.lora_dropout.p,
               "A": m.lora_A.detach().cpu().to(dtype), "B": m.lora_B.detach().cpu().to(dtype)}
        for name, m in modules.items()
    }  # fmt: skip
    checkpoint = {"kind": LORA_KIND, "layers": layers, "base_fingerprint": base_fingerprint(model, new_rows), **extra}
    if new_rows:
        rows = model.token_embedding.weight[-new_rows:]  # (new_rows, D)
        checkpoint["token_rows"] = rows.detach().cpu().to(dtype).clone()
    torch.save(checkpoint, path)


def load_lora(base: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Put the LoRA layers of a `save_lora` file on `base` (changed in place, and returned): the same layers,
    rank, alpha and dropout, A and B. The base must be the one the adapter was trained on (the fingerprint
    says), since A and B only mean something on top of it."""
    if not isinstance(base, nn.Module):
        raise TypeError(
            f"base must be the model the adapter was trained on (an nn.Module), got {type(base).__name__}: a LoRA "
            "checkpoint holds only A and B, not the model"
        )
    from transformer_lab.gpt_training import read_checkpoint_file

    data = read_checkpoint_file(path, "LoRA", "write it with tl.finetune.save_lora")
    if not isinstance(data, dict) or data.get("kind") != LORA_KIND:
        raise ValueError(f"{os.fspath(path)!r} is not a LoRA checkpoint (write one with save_lora)")
    layers = data.get("layers")
    if (
        not isinstance(layers, dict)
        or not isinstance(data.get("base_fingerprint"), str)
        or not all(
            isinstance(layer, dict)
            and {"rank", "alpha", "dropout", "A", "B"} <= layer.keys()
            and isinstance(layer["A"], Tensor)
            and isinstance(layer["B"], Tensor)
            for layer in layers.values()
        )
    ):
        raise ValueError(
            f"{os.fspath(path)!r} is not a complete LoRA checkpoint (it needs its layers' rank, alpha, dropout, A "
            "and B, and the base's fingerprint): write it with save_lora"
        )
    if lora_modules(base):
        raise ValueError("base already has LoRA layers: load the adapter on the plain base model")
    rows = data.get("token_rows")
    if rows is not None and not isinstance(rows, Tensor):
        raise ValueError(f"{os.fspath(path)!r} holds bad token rows (expected a tensor)")
    if rows is not None and getattr(getattr(base, "lm_head", None), "weight", None) is not getattr(
        getattr(base, "token_embedding", None), "weight", 0
    ):
        raise ValueError(f"{os.fspath(path)!r} carries the added tokens' rows, which need a GPT with a tied head")
    if base_fingerprint(base, 0 if rows is None else len(rows)) != data["base_fingerprint"]:
        raise ValueError(
            f"{os.fspath(path)!r} was trained on another base model (its weights' fingerprint differs): load it on "
            "the base it was trained on"
        )
    for name, layer in layers.items():
        apply_lora(base, [name], rank=layer["rank"], alpha=layer["alpha"], dropout=layer["dropout"])
        module = lora_modules(base)[name]
        with torch.no_grad():
            module.lora_A.copy_(layer["A"])
            module.lora_B.copy_(layer["B"])
    for module in lora_modules(base).values():  # apply_lora froze all but the newest layer's A and B
        module.lora_A.requires_grad_(True)
        module.lora_B.requires_grad_(True)
    if rows is not None:  # the added tokens' rows, trained beside A and B (a tied head reads the same rows)
        with torch.no_grad():
            base.token_embedding.weight[-len(rows) :] = rows.to(base.token_embedding.weight.dtype)
    return base


# ---------------------------------------------------------------- RL: a group-relative policy gradient


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log p(target) under the logits at every position: log_softmax, then the target's entry.

    Shape:
        logits (..., T, V), targets (..., T) -> (..., T).
    """
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor) or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits (..., T, V) and targets (..., T) must agree, got {getattr(logits, 'shape', None)} and "
            f"{getattr(targets, 'shape', None)}"
        )
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (..., T)


#: Added to the group's standard deviation before dividing by it (`z_score`), as TRL's GRPOTrainer does.
STD_EPS = 1e-4


def group_advantages(rewards: Tensor, z_score: bool = False) -> Tensor:
    """Each sample's advantage: its reward minus the mean reward of its group (the samples of one prompt).

    The group's mean is the baseline: no value network (GRPO's point). With `z_score` the difference is also
    divided by the group's standard deviation (the unbiased one, + `STD_EPS`), as GRPO (Shao et al. 2024) does;
    without, as nanochat and Dr. GRPO (Liu et al. 2025) do, arguing that the division over-weights groups whose
    rewards hardly differ. A group whose samples all have the same reward gets advantage 0 either way: it
    teaches nothing.

    Shape:
        rewards (P, G): P prompts, G samples each -> advantages (P, G).
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 2 or not rewards.is_floating_point():
        raise ValueError(
            f"rewards must be a float (P, G) tensor (P prompts, G samples each), got "
            f"{getattr(rewards, 'shape', type(rewards).__name__)}"
        )
    if not isinstance(z_score, bool):
        raise TypeError(f"z_score must be True or False, got {z_score!r}")
    if z_score and rewards.shape[1] < 2:
        raise ValueError(
            f"z_score needs at least 2 samples per prompt (a standard deviation), got G={rewards.shape[1]}"
        )
    advantages = rewards - rewards.mean(1, keepdim=True)  # (P, G)
    if z_score:
        advantages = advantages / (rewards.std(1, keepdim=True) + STD_EPS)  # (P, G)
    return advantages


def policy_gradient_loss(
    logprobs: Tensor,
    rewards: Tensor,
    mask: Tensor,
    *,
    z_score: bool = False,
    old_logprobs: Tensor | None = None,
    clip: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> Tensor:
    """The loss of a group-relative policy gradient step (chapter 13): minus the objective

        J = (1 / N_tok) sum over every response token (i, t) of the batch of  [ s_it - kl_coef KL_it ]

        s_it = log pi(o_it) A_i                                                  (default: on-policy)
        s_it = min(rho_it A_i, clip(rho_it, 1 - clip, 1 + clip) A_i),  rho_it = pi(o_it) / pi_old(o_it)   (clip)
        KL_it = exp(r_it) - r_it - 1,  r_it = log pi_ref(o_it) - log pi(o_it)    (Schulman's k3 estimate, GRPO's)

    with A_i = `group_advantages(rewards, z_score)` and N_tok the number of response tokens in the whole batch.

    The defaults (no z-score, no clip, no KL) are nanochat's RL objective (chat_rl.py, 2025-26): on-policy
    REINFORCE with the group's mean reward as baseline, every token of the batch weighted the same. That token-
    level normalisation is DAPO's (Yu et al. 2025): GRPO (Shao et al. 2024) averages over each sample's tokens
    and then over samples, which gives a long answer's tokens less weight each. With `clip` (and old log-probs
    from the policy that sampled) it is DAPO's clipped objective with one clip range (DAPO widens the upper
    one) and no KL; with z_score, clip and kl_coef together it is GRPO's objective with token-level
    normalisation instead of GRPO's per-sample mean.

    Args:
        logprobs: log pi(o_it) of the sampled tokens under the policy being trained (with its graph).
        rewards: each sample's reward.
        mask: True at the response tokens (the positions that count).
        z_score: divide the advantages by their group's std (GRPO) or not (nanochat; default).
        old_logprobs, clip: the sampling policy's log-probs (no gradient) and the clip range epsilon > 0, both
            or neither (PPO-style; off by default, as on-policy nanochat needs no ratio).
        ref_logprobs, kl_coef: a reference model's log-probs (the SFT model) and the penalty's weight >= 0;
            kl_coef > 0 needs ref_logprobs (off by default, as in nanochat).

    Shape:
        logprobs, mask, old_logprobs, ref_logprobs (P, G, T); rewards (P, G) -> a scalar.
    """
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 3 or not logprobs.is_floating_point():
        raise ValueError(
            f"logprobs must be a float (P, G, T) tensor (P prompts, G samples, T tokens), got "
            f"{getattr(logprobs, 'shape', type(logprobs).__name__)}"
        )
    if not isinstance(rewards, Tensor) or rewards.shape != logprobs.shape[:2]:
        raise ValueError(
            f"rewards must be a (P, G) = {tuple(logprobs.shape[:2])} tensor (one per sample), got "
            f"{getattr(rewards, 'shape', type(rewards).__name__)}"
        )
    if not isinstance(mask, Tensor) or mask.shape != logprobs.shape or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor of logprobs' shape {tuple(logprobs.shape)} (True: response)")
    if not mask.any():
        raise ValueError("mask has no True position: there is no response token")
    if (old_logprobs is None) != (clip is None):
        raise ValueError(
            "old_logprobs and clip go together: the clipped ratio needs the sampling policy's log-probs and a "
            "clip range (e.g. clip=0.2); give both or neither"
        )
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 < clip < 1):
        raise ValueError(f"clip must be a number in (0, 1) (PPO's epsilon, e.g. 0.2), got {clip!r}")
    if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)) or not kl_coef >= 0:
        raise ValueError(f"kl_coef must be a number >= 0 (0: no KL penalty), got {kl_coef!r}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs: the reference (SFT) model's log-probs of the same tokens")
    for name, other in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if other is not None and (not isinstance(other, Tensor) or other.shape != logprobs.shape):
            raise ValueError(f"{name} must have logprobs' shape {tuple(logprobs.shape)}")
    advantages = group_advantages(rewards, z_score).unsqueeze(-1)  # (P, G, 1)
    if old_logprobs is None:
        surrogate = logprobs * advantages  # (P, G, T)
    else:
        ratio = torch.exp(logprobs - old_logprobs.detach())  # (P, G, T)
        clipped = ratio.clamp(1 - clip, 1 + clip)  # type: ignore[operator]
        surrogate = torch.minimum(ratio * advantages, clipped * advantages)  # (P, G, T)
    if kl_coef > 0:
        log_ratio = ref_logprobs.detach() - logprobs  # type: ignore[union-attr]  # (P, G, T)
        surrogate = surrogate - kl_coef * (torch.exp(log_ratio) - log_ratio - 1)
    return -surrogate[mask].sum() / mask.sum()  # only response tokens enter (padding's values never do)


@dataclass
class Rollout:
    """G sampled responses to each of P prompts (`sample_groups`).

    tokens: (P, G, L + N) the prompts (L tokens each) and the N sampled tokens; mask: (P, G, N) True on each
    response's tokens up to and including its first <|end|> (what follows it is not part of the response);
    texts: P lists of G decoded responses (without <|end|>; None where a marker other than <|end|> came out, a
    response no reward can read); prompt_length: L.
    """

    tokens: Tensor
    mask: Tensor
    texts: list[list[str | None]]
    prompt_length: int


@torch.no_grad()
def sample_groups(
    model: nn.Module,
    fmt: SFTFormat,
    tokenizer: Any,
    prompts: Sequence[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Sample `group_size` responses to each prompt, all P G of them in ONE batch through `GPT.generate` with its
    KV cache (chapter 10): the prompts are run once, then each step runs only the P G newest tokens.

    The prompts must encode to one length (the GPT has no padding mask: a left-padded prompt would attend to its
    padding); 藏头 prompts all do (2 + 4 characters), 续写 prompts too (2 + 5). Every sample runs
    `max_new_tokens` steps; `mask` keeps what precedes the first <|end|>, and the <|end|> itself.
    """
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompt texts")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int (samples per prompt), got {group_size!r}")
    check_format(model, fmt)
    heads = [fmt.prompt_ids(tokenizer, p) for p in prompts]
    lengths = sorted({len(h) for h in heads})
    if len(lengths) > 1:
        raise ValueError(
            f"prompts must encode to one length (the model has no padding mask), got lengths {lengths}: sample "
            "each length (each instruction kind) in its own call"
        )
    length = lengths[0]
    block = model.config.block_size
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if length + max_new_tokens > block:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} with prompts of {length} tokens passes block_size={block}: the "
            f"response's log-probs are read in one forward pass; use at most {block - length}"
        )
    device = model.token_embedding.weight.device
    idx = torch.tensor(heads, device=device).repeat_interleave(group_size, dim=0)  # (P G, L), group-major
    tokens = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    new = tokens[:, length:]  # (P G, N)
    ended = (new == fmt.end_id).long()
    before_end = ended.cumsum(1) - ended == 0  # (P G, N): True up to and including the first <|end|>
    texts: list[str | None] = []
    for row, keep in zip(new.tolist(), before_end.tolist(), strict=True):
        try:
            texts.append(fmt.decode_response(tokenizer, [t for t, k in zip(row, keep, strict=True) if k]))
        except ValueError:
            texts.append(None)
    prompts_n = len(prompts)
    return Rollout(
        tokens=tokens.reshape(prompts_n, group_size, -1),  # (P, G, L + N)
        mask=before_end.reshape(prompts_n, group_size, -1),  # (P, G, N)
        texts=[texts[i * group_size : (i + 1) * group_size] for i in range(prompts_n)],
        prompt_length=length,
    )


def response_logprobs(model: nn.Module, rollout: Rollout) -> Tensor:
    """log pi(token) of every sampled token under `model` (with its graph, for the policy gradient), from ONE
    forward pass over prompt and response: position t's logits score token t + 1.

    Shape:
        -> (P, G, N), the positions of `rollout.mask`.
    """
    prompts_n, group, total = rollout.tokens.shape
    flat = rollout.tokens.reshape(prompts_n * group, total)  # (P G, L + N)
    logits = model(flat[:, :-1])  # (P G, L + N - 1, V)
    logprobs = token_logprobs(logits, flat[:, 1:])  # (P G, L + N - 1)
    return logprobs[:, rollout.prompt_length - 1 :].reshape(prompts_n, group, -1)  # (P, G, N)


@torch.no_grad()
def generate_forced_heads(
    model: nn.Module,
    idx: Tensor,
    heads: Sequence[str],
    tokenizer: Any,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sample a continuation of each prompt in which every line BEGINS with the asked head: the first new token,
    and the token after each "，" or "。", is replaced by the next head until the four are placed (constrained
    decoding, chapter 13's stage b). Each line that starts gets its head, whatever the model; where a line ends,
    and with which mark, the model still chooses, so an answer read up to its second "。" can miss a head (2 in
    1,000 samples measured). This is not instruction following (the model is never asked, it is overruled), and
    the rest of each line is written after a head the model may find unlikely. With the KV cache: the prompts run
    once, then one token per step.

    Args:
        idx: (B, T0) prompts of one length (any prompt: a base model's one-shot example, or an SFT prompt).
        heads: B strings of four characters.
        max_new_tokens: T0 + max_new_tokens must fit in block_size.
        temperature: 0 is greedy (the most likely token); top_k, generator: as `GPT.generate`.

    Returns:
        (B, T0 + max_new_tokens) tokens.
    """
    from transformer_lab.gpt import filter_logits

    if not isinstance(idx, Tensor) or idx.dim() != 2 or len(heads) != idx.shape[0]:
        raise ValueError(
            f"idx must be (B, T0) token ids and heads B strings, got {getattr(idx, 'shape', None)}, {len(heads)}"
        )
    for head in heads:
        _check_heads(head)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if idx.shape[1] + max_new_tokens > model.config.block_size:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} after {idx.shape[1]} prompt tokens passes block_size="
            f"{model.config.block_size}; use at most {model.config.block_size - idx.shape[1]}"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    head_ids = torch.stack([torch.as_tensor(tokenizer.encode(h)).reshape(4) for h in heads]).to(idx.device)  # (B, 4)
    marks = torch.as_tensor(tokenizer.encode("，。")).to(idx.device)  # (2,)
    rows = torch.arange(idx.shape[0], device=idx.device)
    placed = torch.zeros(idx.shape[0], dtype=torch.long, device=idx.device)  # heads placed so far, per row
    at_line_start = torch.ones(idx.shape[0], dtype=torch.bool, device=idx.device)
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache()
        logits = model(idx, cache)[:, -1]  # (B, V)
        tokens = idx
        for step in range(max_new_tokens):
            if step > 0:
                logits = model(tokens[:, -1:], cache)[:, -1]  # (B, V): only the newest token runs
            if temperature == 0:
                sampled = logits.argmax(-1)  # (B,)
            else:
                probs = filter_logits(logits / temperature, top_k).softmax(-1)  # (B, V)
                sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
            force = at_line_start & (placed < 4)
            token = torch.where(force, head_ids[rows, placed.clamp(max=3)], sampled)  # (B,)
            placed += force.long()
            at_line_start = torch.isin(token, marks)
            tokens = torch.cat([tokens, token[:, None]], dim=1)  # (B, T + 1)
    finally:
        model.train(was_training)
    return tokens


# ---------------------------------------------------------------- rewards: 藏头诗, checked by a program

#: 中华新韵 in its 14-class form (十四韵), as the 中华诗词学会 (Chinese Poetry Society) issued it in 2005
#: (《中华新韵（十四韵）简表》): each class (named by its representative character) and the pinyin finals it
#: holds, written as `pypinyin` writes them with strict=True: "v" for ü, "iou" / "uei" / "uen" for iu / ui / un.
#: "-i" is the apical vowel of zhi chi shi ri zi ci si (支), apart from the i of 衣 (齐).
#: The 18-class form (《诗韵新编》's 十八韵) splits 波 (o / uo) from 歌 (e), 齐 from 儿 (er) and 鱼 (ü), and
#: 庚 (eng, ing) from 东 (ong, iong).
RHYME_TABLE: dict[str, tuple[str, ...]] = {
    "麻": ("a", "ia", "ua"),
    "波": ("o", "e", "uo", "io"),
    "皆": ("ie", "ve", "ê"),
    "开": ("ai", "uai"),
    "微": ("ei", "uei"),
    "豪": ("ao", "iao"),
    "尤": ("ou", "iou"),
    "寒": ("an", "ian", "uan", "van"),
    "文": ("en", "in", "uen", "vn"),
    "唐": ("ang", "iang", "uang"),
    "庚": ("eng", "ing", "ong", "iong", "ueng"),
    "齐": ("i", "er", "v"),
    "支": ("-i",),
    "姑": ("u",),
}
_CLASS_OF_FINAL = {final: name for name, finals in RHYME_TABLE.items() for final in finals}
_APICAL_INITIALS = ("zh", "ch", "sh", "r", "z", "c", "s")
#: The marks that end the lines of a quatrain: "，" after lines 1 and 3, "。" after lines 2 and 4.
LINE_ENDS = ("，", "。", "，", "。")


def _is_hanzi(char: str) -> bool:
    return len(char) == 1 and unicodedata.category(char) == "Lo" and not char.isascii()


@lru_cache(maxsize=65536)
def rhyme_class(char: str) -> str | None:
    """The class of `RHYME_TABLE` of a character's final, in its most common modern reading (`pypinyin`'s default
    for the character alone; no context, so a polyphonic character always gets the same one), or None for a
    character without a reading or a final outside the table (嗯's "n", say)."""
    try:
        from pypinyin import Style, pinyin
    except ImportError:
        raise ImportError(
            "the rhyme check reads characters' finals with pypinyin, which is not installed: pip install pypinyin"
        ) from None
    if not isinstance(char, str) or not _is_hanzi(char):
        return None
    finals = pinyin(char, style=Style.FINALS, strict=True, errors="ignore")
    if not finals or not finals[0] or not finals[0][0]:
        return None
    final = finals[0][0]
    if final == "i":
        initial = pinyin(char, style=Style.INITIALS, strict=True, errors="ignore")[0][0]
        if initial in _APICAL_INITIALS:
            final = "-i"
    return _CLASS_OF_FINAL.get(final)


def poem_lines(text: str) -> list[str]:
    """The text cut after each "，" and "。" into lines, the marks dropped; the empty piece after a final mark
    is dropped, any other empty piece kept ("春，，" has two lines, the second empty)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    pieces = re.split("[，。]", text)
    return pieces[:-1] if pieces and pieces[-1] == "" and text else pieces


def in_form(text: str) -> bool:
    """A five-character quatrain exactly: four lines of five Chinese characters, "，" "。" "，" "。" after them,
    nothing else (no space, no newline)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if len(text) != 24:
        return False
    lines = [text[6 * i : 6 * i + 5] for i in range(4)]
    marks = tuple(text[6 * i + 5] for i in range(4))
    return marks == LINE_ENDS and all(_is_hanzi(c) for line in lines for c in line)


def four_lines(text: str) -> str:
    """A base model's answer: its text up to the newline, or to the end of the fourth line (the second "。") if
    that comes first (a base model trained on whole poems goes on to an eight-line one)."""
    text = text.split("\n")[0]
    first = text.find("。")
    second = text.find("。", first + 1) if first >= 0 else -1
    return text[: second + 1] if second >= 0 else text


def _check_heads(heads: object) -> str:
    if not isinstance(heads, str) or len(heads) != 4 or not all(_is_hanzi(c) for c in heads):
        raise ValueError(f"heads must be four Chinese characters (one per line, e.g. '春夏秋冬'), got {heads!r}")
    return heads


def acrostic(text: str, heads: str) -> bool:
    """藏头: the text has four lines (`poem_lines`) and line i begins with heads[i]. Whether the lines are five
    characters long is `in_form`'s question, not this one's."""
    heads = _check_heads(heads)
    lines = poem_lines(text)
    return len(lines) == 4 and all(line.startswith(head) for line, head in zip(lines, heads, strict=True))


def heads_begun(text: str | None, heads: str) -> list[bool]:
    """For each of the four heads, whether line i of `text` (`poem_lines`) begins with it: which lines an
    acrostic misses. A line that is not there misses; None (an undecodable sample) misses all four. `acrostic`
    asks for all four, and for exactly four lines."""
    heads = _check_heads(heads)
    lines = poem_lines(text) if text is not None else []
    return [i < len(lines) and lines[i].startswith(head) for i, head in enumerate(heads)]


def rhymes(text: str, distinct: bool = False) -> bool:
    """Lines 2 and 4 rhyme: the text has four lines, and their last characters' classes (`rhyme_class`) are one
    class. With `distinct`, the two characters must also differ (a rhyme on the same character, 重韵, which a
    policy can learn to game, does not count)."""
    lines = poem_lines(text)
    if len(lines) != 4 or not lines[1] or not lines[3]:
        return False
    second, fourth = lines[1][-1], lines[3][-1]
    if distinct and second == fourth:
        return False
    kind = rhyme_class(second)
    return kind is not None and kind == rhyme_class(fourth)


def poem_checks(text: str, heads: str) -> dict[str, bool]:
    """The three checks of a 藏头诗 and all of them at once: {"form", "acrostic", "rhyme", "all"}."""
    checks = {"form": in_form(text), "acrostic": acrostic(text, heads), "rhyme": rhymes(text)}
    checks["all"] = all(checks.values())
    return checks


def poem_reward(text: str | None, heads: str, distinct: bool = False) -> float:
    """The reward of a sampled 藏头诗: the share of the three checks it passes (0, 1/3, 2/3 or 1), so that a
    poem in form that misses the rhyme still scores above one that fails everything. With `distinct`, a rhyme
    on the same character (重韵) does not count (`rhymes`): chapter 13's RL uses it, after the reward-hacking
    run. None (an undecodable sample) gets 0."""
    if text is None:
        _check_heads(heads)
        return 0.0
    return (in_form(text) + acrostic(text, heads) + rhymes(text, distinct)) / 3


def rhyme_reward(text: str | None, heads: str) -> float:
    """1 if lines 2 and 4 rhyme (`rhymes`), else 0: the reward the reward-hacking run of chapter 13 games (the
    same character at the end of both lines rhymes, whatever the poem)."""
    return float(text is not None and rhymes(text))


def corpus_rhyme_rate(text: str) -> tuple[int, int]:
    """(quatrains whose lines 2 and 4 rhyme, quatrains): over the lines of a corpus (one poem a line) that are
    five-character quatrains (`in_form`).

    On the course's Tang corpus, under `RHYME_TABLE`: 2,868 of 3,692 quatrains, 77.7 % (tested). Exact modern
    finals (pypinyin's, strict) would give 42.7 %: most of that gap is the medial (iao against ao, ia against a),
    which never counts in a rhyme, and the table's own mergers (en/in, eng/ing); the 22.3 % that fail even under
    the classes are mostly what a thousand years of sound change took apart (Middle Chinese rhymes, which the
    poets followed, are not modern ones). Measured with

    python -c "from transformer_lab import data, finetune as f; print(f.corpus_rhyme_rate(data.load_corpus('tang')))"
    """
    quatrains = [line for line in text.split("\n") if in_form(line)]
    return sum(rhymes(q) for q in quatrains), len(quatrains)


# ---------------------------------------------------------------- SFT data made from the corpus itself

#: The instruction kinds and the words that open their prompts: 藏头 + four heads -> the quatrain; 续写 + a first
#: line -> lines 2 to 4. Every character is in the Tang corpus, so the base tokenizer encodes the prompts.
INSTRUCTIONS = {"acrostic": "藏头", "continue": "续写"}


@dataclass(frozen=True)
class SFTExample:
    """One instruction and its answer, made from one quatrain of the corpus.

    kind: a key of `INSTRUCTIONS`; argument: the heads (acrostic) or the first line (continue); prompt: the
    instruction word and the argument; response: what the model should write; poem: the quatrain itself.
    """

    kind: str
    argument: str
    prompt: str
    response: str
    poem: str


def pretraining_poems(text: str, train_fraction: float = 0.9) -> tuple[list[str], list[str]]:
    """The corpus's poems (one a line) on either side of pretraining's cut: (seen, held_out).

    Chapter 10 pretrains on the first `train_fraction` of the characters (`tl.data.split_text`; gpt_tang.pt's
    options say 0.9). `seen` are the poems wholly before the cut, `held_out` those wholly after it (the one
    poem the cut runs through is in neither): on the Tang corpus 16,039 and 1,793 poems, 391 of these
    quatrains. The corpus is sorted by first character, so the held-out poems' heads are skewed towards the
    end of that order.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("text must be the corpus: a non-empty str, one poem a line")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) or not 0 < train_fraction < 1:
        raise ValueError(
            f"train_fraction must be in (0, 1) (pretraining's, 0.9 for gpt_tang.pt), got {train_fraction!r}"
        )
    cut = int(len(text) * train_fraction)
    seen, held_out, start = [], [], 0
    for line in text.split("\n"):
        end = start + len(line)
        if line and end <= cut:
            seen.append(line)
        elif line and start >= cut:
            held_out.append(line)
        start = end + 1
    return seen, held_out


def quatrains_of(poem: str) -> list[str]:
    """The five-character quatrains a poem gives: itself if it is one (`in_form`), both halves of an eight-line
    poem of five-character lines (a 律诗's halves, each "，。，。"), none otherwise."""
    if in_form(poem):
        return [poem]
    if len(poem) == 48 and in_form(poem[:24]) and in_form(poem[24:]):
        return [poem[:24], poem[24:]]
    return []


def make_examples(poems: Sequence[str], kinds: Sequence[str] = tuple(INSTRUCTIONS)) -> list[SFTExample]:
    """Every quatrain of `poems` as one example of each kind, in the poems' order."""
    unknown = [k for k in kinds if k not in INSTRUCTIONS]
    if unknown or not kinds:
        raise ValueError(f"kinds must be some of {list(INSTRUCTIONS)}, got {list(kinds)!r}")
    examples = []
    for poem in poems:
        for quatrain in quatrains_of(poem):
            for kind in kinds:
                argument = (
                    quatrain[0] + quatrain[6] + quatrain[12] + quatrain[18] if kind == "acrostic" else quatrain[:5]
                )
                response = quatrain if kind == "acrostic" else quatrain[6:]
                examples.append(SFTExample(kind, argument, INSTRUCTIONS[kind] + argument, response, quatrain))
    return examples


def sft_splits(
    text: str,
    validation: float = 0.05,
    train_fraction: float = 0.9,
    kinds: Sequence[str] = tuple(INSTRUCTIONS),
    rhyming_only: bool = False,
) -> dict[str, list[SFTExample]]:
    """SFT's train, validation and test examples, split by poem (chapter 13).

    train and validation come from the poems pretraining saw (`pretraining_poems`): a fixed hash of each poem's
    text (CRC-32, the same on every machine) puts `validation` of them in validation. test comes from the
    held-out poems, which neither pretraining nor SFT sees. A poem's examples (both kinds, both halves of a 律诗)
    stay in one split; and since the corpus repeats some quatrains (in two poems, or a poem twice), a test
    quatrain that also appears anywhere in pretraining's training text is dropped (3 on the Tang corpus), and a
    validation quatrain that SFT trains on likewise.

    rhyming_only: keep in train and validation only the examples whose quatrain rhymes on lines 2 and 4
    (`rhymes`): answers that meet the instruction's own rule, the data the course's SFT recipe trains on (on the
    Tang corpus 44,094 of the 54,726 training examples). The split by poem is made first, so each poem stays in
    the split it had; test is never filtered.
    """
    if isinstance(validation, bool) or not isinstance(validation, (int, float)) or not 0 <= validation < 1:
        raise ValueError(f"validation must be a share in [0, 1) of the seen poems, e.g. 0.05, got {validation!r}")
    if not isinstance(rhyming_only, bool):
        raise ValueError(f"rhyming_only must be True or False, got {rhyming_only!r}")
    seen, held_out = pretraining_poems(text, train_fraction)
    chosen = [zlib.crc32(p.encode("utf-8")) / 2**32 < validation for p in seen]
    train = make_examples([p for p, v in zip(seen, chosen, strict=True) if not v], kinds)
    trained = {e.poem for e in train}
    valid = [
        e for e in make_examples([p for p, v in zip(seen, chosen, strict=True) if v], kinds) if e.poem not in trained
    ]
    # Every 24 characters of the pretraining text that start a line (after a newline or a mark): where a seen
    # quatrain would have to start.
    before = text[: int(len(text) * train_fraction)]
    starts = [0] + [i + 1 for i, c in enumerate(before) if c in "\n，。"]
    windows = {before[i : i + 24] for i in starts}
    test = [e for e in make_examples(held_out, kinds) if e.poem not in windows]
    if rhyming_only:
        train = [e for e in train if rhymes(e.poem)]
        valid = [e for e in valid if rhymes(e.poem)]
    return {"train": train, "validation": valid, "test": test}


def continuation_checks(first_line: str, response: str) -> dict[str, bool]:
    """The checks of a continuation (续写): the given line, "，" and the response make a quatrain in form, lines
    2 and 4 rhyme, and the response does not repeat the given line; and all of them at once."""
    if not isinstance(first_line, str) or len(first_line) != 5 or not all(_is_hanzi(c) for c in first_line):
        raise ValueError(f"first_line must be five Chinese characters, got {first_line!r}")
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    poem = first_line + "，" + response
    checks = {"form": in_form(poem), "rhyme": rhymes(poem), "new": first_line not in response}
    checks["all"] = all(checks.values())
    return checks


# ---------------------------------------------------------------- what the benchmarks measure


def poem_rates(texts: Sequence[str | None], heads: Sequence[str]) -> dict[str, float]:
    """The share of samples passing each check of `poem_checks` ("form", "acrostic", "rhyme", "all"); a sample
    that could not be decoded (None, see `Rollout.texts`) fails them all."""
    if len(texts) != len(heads) or not texts:
        raise ValueError(
            f"texts and heads must be two non-empty lists of one length, got {len(texts)} and {len(heads)}"
        )
    totals = dict.fromkeys(("form", "acrostic", "rhyme", "all"), 0)
    for text, head in zip(texts, heads, strict=True):
        if text is None:
            _check_heads(head)
            continue
        for name, passed in poem_checks(text, head).items():
            totals[name] += passed
    return {name: count / len(texts) for name, count in totals.items()}


def diversity(texts: Sequence[str | None], training_lines: set[str] | frozenset[str]) -> dict[str, float]:
    """How varied samples are, and how much they copy: over every line (`poem_lines`, non-empty) of the samples,
    "distinct": the share of lines that differ from each other (distinct lines / lines), "copied": the share of
    lines that stand in `training_lines` (e.g. every line of SFT's training poems), "last_chars": distinct last
    characters of lines 2 and 4 / their number (a rhyme-only reward games this one: the same rhyme everywhere).
    Undecodable samples (None) are skipped. NaN where there is no line."""
    split = [poem_lines(text) for text in texts if text is not None]
    lines = [line for poem in split for line in poem if line]
    ends = [poem[i][-1] for poem in split if len(poem) == 4 for i in (1, 3) if poem[i]]  # lines 2 and 4
    nan = float("nan")
    return {
        "distinct": len(set(lines)) / len(lines) if lines else nan,
        "copied": sum(line in training_lines for line in lines) / len(lines) if lines else nan,
        "last_chars": len(set(ends)) / len(ends) if ends else nan,
    }


# ---------------------------------------------------------------- the training loops: SFT, rejection sampling, RL


def encode_examples(
    examples: Sequence[SFTExample] | Sequence[tuple[str, str]], fmt: SFTFormat, tokenizer: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """Every example (an `SFTExample` or a (prompt, response) pair) as one padded batch: (N, T) inputs, targets
    and mask (`SFTFormat.batch`), encoded once so that a training step only indexes rows."""
    pairs = [(e.prompt, e.response) if isinstance(e, SFTExample) else tuple(e) for e in examples]
    if not pairs:
        raise ValueError("examples must not be empty")
    return fmt.batch(tokenizer, pairs)


def _check_positive(name: str, value: object, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or not value > 0:
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {value!r}")


@torch.no_grad()
def sft_validation_loss(model: nn.Module, data: tuple[Tensor, Tensor, Tensor], batch_size: int = 256) -> float:
    """The masked response loss (`response_loss`) over a whole encoded set, every response token weighing the
    same: a fixed number for a fixed set."""
    inputs, targets, mask = data
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, len(inputs), batch_size):
            rows = slice(start, start + batch_size)
            logits = model(inputs[rows])  # (b, T, V)
            m = mask[rows]
            total += F.cross_entropy(logits[m], targets[rows][m], reduction="sum").item()
            count += int(m.sum())
    finally:
        model.train(was_training)
    return total / count


def fine_tune(
    base: nn.Module,
    train: tuple[Tensor, Tensor, Tensor],
    validation: tuple[Tensor, Tensor, Tensor] | None = None,
    *,
    seed: int = 0,
    lora_rank: int = 0,
    lora_alpha: float | None = None,
    lora_targets: Sequence[str] = (),
    **sft_options: Any,
) -> tuple[nn.Module, dict[str, list[float]]]:
    """The SFT stage as the command line (`transformer-lab sft`) and chapter 13's benchmark run it: `base` grown
    by the format's three tokens (`add_special_tokens`, under `seed`), wrapped with LoRA on `lora_targets` when
    `lora_rank` > 0 (alpha 2 × rank unless given; the three new rows are trained too), then `sft` with
    `sft_options`. Returns (model, history)."""
    torch.manual_seed(seed)
    model = add_special_tokens(base)
    if lora_rank:
        alpha = 2.0 * lora_rank if lora_alpha is None else lora_alpha
        apply_lora(model, lora_targets, rank=lora_rank, alpha=alpha)
    history = sft(model, train, validation, seed=seed, new_rows=3 if lora_rank else 0, **sft_options)
    return model, history


def sft(
    model: nn.Module,
    train: tuple[Tensor, Tensor, Tensor],
    validation: tuple[Tensor, Tensor, Tensor] | None = None,
    *,
    steps: int = 600,
    batch_size: int = 32,
    lr: float = 5e-4,
    min_lr: float | None = None,
    warmup: int = 20,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    eval_every: int = 100,
    new_rows: int = 0,
    seed: int = 0,
    log: Any = None,
    evaluate: Any = None,
) -> dict[str, list[float]]:
    """Supervised fine-tuning (chapter 13): `steps` steps of the masked response loss (`response_loss`) on
    batches drawn at random from `train`, with the course's AdamW (`tl.gpt_training.make_adamw`, fused where
    PyTorch has it) over the parameters that require a gradient: all of them (full fine-tuning), or LoRA's A
    and B after `apply_lora`. The learning rate warms up for `warmup` steps, then decays along a cosine to
    `min_lr` (lr / 10 unless given), as chapter 10's. No weight decay by default, as nanochat's SFT.

    Args:
        model: the GPT with the format's tokens (`add_special_tokens`), changed in place; left in eval mode.
        train, validation: encoded examples (`encode_examples`): (N, T) inputs, targets, mask.
        clip_norm: the gradients' global norm is clipped to it (None: not clipped).
        eval_every: the validation loss every so many steps, and after the last.
        new_rows: also train the last `new_rows` rows of the token embedding (the added tokens), the rest of it
            staying frozen: a LoRA run, whose base cannot otherwise learn what its new tokens mean (the tied head
            reads the same rows, so <|end|> could not be learned to be predicted). Needs weight_decay 0 (decay
            would move the frozen rows).
        seed: draws the batches (a `torch.Generator`), not the model.
        log: called with a progress line now and then (e.g. print), or None.
        evaluate: called as evaluate(model, step) at each validation step (the model in eval mode), its results
            kept in the history's "eval" (e.g. the poems' rates: the curve of a run), or None.

    Returns:
        the history: "step" and "loss" (every step), "eval_step" and "val_loss", "eval" (evaluate's results),
        "seconds" (CPU time, `time.process_time`, of the whole run, evaluations included).
    """
    import time

    from transformer_lab.gpt_training import cosine_lr, make_adamw

    _check_positive("steps", steps)
    _check_positive("batch_size", batch_size)
    _check_positive("eval_every", eval_every)
    _check_positive("lr", lr, float)
    if isinstance(new_rows, bool) or not isinstance(new_rows, int) or new_rows < 0:
        raise ValueError(f"new_rows must be an int >= 0 (the added tokens' rows to train), got {new_rows!r}")
    if new_rows and weight_decay:
        raise ValueError("new_rows needs weight_decay=0: decay would move the frozen rows of the embedding too")
    inputs, targets, mask = train
    if not (isinstance(inputs, Tensor) and inputs.shape == targets.shape == mask.shape and inputs.dim() == 2):
        raise ValueError("train must be (inputs, targets, mask) of one (N, T) shape: use encode_examples")
    start = time.process_time()
    min_lr = lr / 10 if min_lr is None else min_lr
    hook = None
    embedding = model.token_embedding.weight
    if new_rows:
        embedding.requires_grad_(True)
        keep = torch.zeros(embedding.shape[0], 1, dtype=embedding.dtype)
        keep[-new_rows:] = 1.0
        hook = embedding.register_hook(lambda grad: grad * keep)  # only the added tokens' rows learn
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameter that requires a gradient: nothing to train")
    optimizer = make_adamw(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list] = {"step": [], "loss": [], "eval_step": [], "val_loss": [], "eval": []}
    model.train()
    try:
        for step in range(1, steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step - 1, lr, min_lr, min(warmup, steps), steps)
            rows = torch.randint(len(inputs), (batch_size,), generator=generator)  # (B,)
            loss = response_loss(model(inputs[rows]), targets[rows], mask[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(params, clip_norm)
            optimizer.step()
            history["step"].append(step)
            history["loss"].append(loss.item())
            if validation is not None and (step % eval_every == 0 or step == steps):
                history["eval_step"].append(step)
                history["val_loss"].append(sft_validation_loss(model, validation))
                if evaluate is not None:
                    model.eval()
                    history["eval"].append(evaluate(model, step))
                    model.train()
                if log is not None:
                    log(f"sft step {step}/{steps}: loss {loss.item():.3f}, validation {history['val_loss'][-1]:.3f}")
    finally:
        if hook is not None:
            hook.remove()
            embedding.requires_grad_(False)
        model.eval()
    history["seconds"] = [time.process_time() - start]
    return history


def acrostic_prompt(heads: str) -> str:
    """The 藏头 instruction for four heads: "藏头" + heads (`INSTRUCTIONS`)."""
    return INSTRUCTIONS["acrostic"] + _check_heads(heads)


def sample_poems(
    model: nn.Module,
    fmt: SFTFormat,
    tokenizer: Any,
    heads: Sequence[str],
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    samples: int = 1,
    batch_size: int = 500,
    seed: int = 0,
) -> list[list[str | None]]:
    """`samples` responses of a fine-tuned model to the 藏头 prompt of each heads (`sample_groups`, with the KV
    cache, `batch_size` prompts at a time): unconstrained sampling at fixed settings. Returns one list per
    heads."""
    generator = torch.Generator().manual_seed(seed)
    out: list[list[str | None]] = []
    for start in range(0, len(heads), batch_size):
        chunk = [acrostic_prompt(h) for h in heads[start : start + batch_size]]
        rollout = sample_groups(
            model, fmt, tokenizer, chunk, samples, 25, temperature=temperature, top_k=top_k, generator=generator
        )
        out += rollout.texts
    return out


def rejection_sample(
    model: nn.Module,
    fmt: SFTFormat,
    tokenizer: Any,
    heads: Sequence[str],
    *,
    samples: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    keep_per_prompt: int = 1,
) -> list[tuple[str, str]]:
    """Rejection sampling's data (chapter 13's stage c'): `samples` poems per heads from the model, kept where
    all three checks pass (`poem_checks`, the same checks RL rewards; a rhyme on one character twice does not
    count), at most `keep_per_prompt` distinct ones per heads. Returns (prompt, response) pairs to fine-tune
    on: the model's own successes, the data filtered by the reward (rejection-sampling fine-tuning, as in
    Yuan et al. 2023's RFT and Llama 2's rejection sampling)."""
    pairs: list[tuple[str, str]] = []
    for head, texts in zip(
        heads,
        sample_poems(model, fmt, tokenizer, heads, temperature=temperature, samples=samples, seed=seed),
        strict=True,
    ):
        good = []
        for text in texts:
            if text is not None and text not in good and poem_checks(text, head)["all"] and rhymes(text, True):
                good.append(text)
        pairs += [(acrostic_prompt(head), text) for text in good[:keep_per_prompt]]
    return pairs


def rl(
    model: nn.Module,
    fmt: SFTFormat,
    tokenizer: Any,
    heads: Sequence[str],
    reward: Any = poem_reward,
    *,
    steps: int = 100,
    prompts_per_step: int = 16,
    group_size: int = 8,
    lr: float = 1e-4,
    temperature: float = 1.0,
    top_k: int | None = None,
    z_score: bool = False,
    kl_coef: float = 0.0,
    reference: nn.Module | None = None,
    clip_norm: float | None = 1.0,
    seed: int = 0,
    evaluate: Any = None,
    eval_every: int = 25,
    log: Any = None,
) -> dict[str, list]:
    """Reinforcement learning with a reward a program checks (chapter 13): a group-relative policy gradient,
    on-policy as nanochat's chat_rl.

    Each step draws `prompts_per_step` heads, samples `group_size` poems for each in ONE batch with the KV
    cache (`sample_groups`), scores each poem with `reward(text, heads)` (a plain Python function; text None
    where the sample could not be decoded), and takes one AdamW step on `policy_gradient_loss`: advantage =
    reward - the group's mean (z-score, KL penalty as switches, off by default), every response token of the
    batch weighted the same. The learning rate is constant (nanochat's RL decays it linearly; at this length a
    constant rate learned as much in our runs).

    Args:
        model: the SFT model, changed in place (left in eval mode).
        heads: the heads the prompts are drawn from (training poems' heads: never the test's).
        reward: reward(text, heads) -> float.
        kl_coef, reference: the KL penalty to a frozen reference model (the SFT model), off by default.
        evaluate: called as evaluate(model) -> dict of numbers before the first step, every `eval_every` steps
            and after the last (the curves), or None.

    Returns:
        the history: "step", "reward" (the batch's mean reward), "eval_step", "eval" (evaluate's dicts),
        "seconds" (CPU time of the whole run, evaluation included).
    """
    import time

    from transformer_lab.gpt_training import make_adamw

    _check_positive("steps", steps)
    _check_positive("prompts_per_step", prompts_per_step)
    _check_positive("group_size", group_size)
    _check_positive("lr", lr, float)
    if not callable(reward):
        raise TypeError(f"reward must be a function reward(text, heads) -> float, got {type(reward).__name__}")
    if not heads:
        raise ValueError("heads must be a non-empty list of four-character heads")
    if kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs reference: the frozen SFT model the penalty measures the policy against")
    start = time.process_time()
    optimizer = make_adamw(model, lr, weight_decay=0.0)
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list] = {"step": [], "reward": [], "eval_step": [], "eval": []}

    def run_eval(step: int) -> None:
        if evaluate is not None:
            history["eval_step"].append(step)
            history["eval"].append(evaluate(model))
            if log is not None:
                log(f"rl step {step}/{steps}: {history['eval'][-1]}")

    run_eval(0)
    for step in range(1, steps + 1):
        chosen = [heads[int(i)] for i in torch.randint(len(heads), (prompts_per_step,), generator=generator)]
        rollout = sample_groups(
            model,
            fmt,
            tokenizer,
            [acrostic_prompt(h) for h in chosen],
            group_size,
            25,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
        )
        rewards = torch.tensor(
            [[float(reward(text, head)) for text in texts] for head, texts in zip(chosen, rollout.texts, strict=True)]
        )  # (P, G)
        model.train()
        logprobs = response_logprobs(model, rollout)  # (P, G, N)
        ref = None
        if kl_coef:
            with torch.no_grad():
                ref = response_logprobs(reference, rollout)
        loss = policy_gradient_loss(logprobs, rewards, rollout.mask, z_score=z_score, ref_logprobs=ref, kl_coef=kl_coef)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_norm is not None:
            nn.utils.clip_grad_norm_(params, clip_norm)
        optimizer.step()
        model.eval()
        history["step"].append(step)
        history["reward"].append(rewards.mean().item())
        if step % eval_every == 0 or step == steps:
            run_eval(step)
    history["seconds"] = [time.process_time() - start]
    return history


def evaluate_poems(
    model: nn.Module,
    fmt: SFTFormat,
    tokenizer: Any,
    heads: Sequence[str],
    training_lines: set[str] | frozenset[str] = frozenset(),
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One poem per heads from a fine-tuned model (`sample_poems`, fixed settings and seed), and its rates:
    form, acrostic, rhyme, all three (`poem_rates`), and the diversity measures (`diversity`: distinct lines,
    lines copied from `training_lines`, distinct rhyme characters). "texts" holds the samples."""
    texts = [
        group[0]
        for group in sample_poems(model, fmt, tokenizer, heads, temperature=temperature, top_k=top_k, seed=seed)
    ]
    return {**poem_rates(texts, list(heads)), **diversity(texts, training_lines), "texts": texts}


def held_out_heads(splits: Mapping[str, Sequence[SFTExample]], count: int = 500, seed: int = 0) -> list[str]:
    """Chapter 13's held-out heads: `count` heads of the 藏头 examples of `splits["test"]` (`sft_splits`: poems
    neither pretraining nor SFT saw), drawn with `random.Random(seed)`; benchmarks/finetune.py measures every stage
    on them and the chapter draws the same ones."""
    import random

    heads = [e.argument for e in splits["test"] if e.kind == "acrostic"]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= len(heads):
        raise ValueError(f"count must be an int in [1, {len(heads)}] (the test split's 藏头 examples), got {count!r}")
    return random.Random(seed).sample(heads, count)


def common_heads(poems: Sequence[str], count: int, seed: int = 0, top: int = 300) -> list[str]:
    """`count` sets of four heads drawn at random (4 different characters each, `seed`) from the `top` most
    common line-initial characters of `poems` (chapter 13's second kind of held-out heads: not skewed by the
    corpus's order)."""
    import random
    from collections import Counter

    counts = Counter(line[0] for poem in poems for line in poem_lines(poem) if line and _is_hanzi(line[0]))
    chars = [c for c, _ in counts.most_common(top)]
    rng = random.Random(seed)
    return ["".join(rng.sample(chars, 4)) for _ in range(count)]
