"""The full encoder-decoder Transformer (chapter 09).

    src tokens -> TokenEmbedding + PositionalEncoding -> Encoder -> memory
    tgt tokens -> TokenEmbedding + PositionalEncoding -> Decoder(memory) -> Linear -> logits

Shape legend: B batch, S source length, T target length, D d_model, V vocabulary size.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab._checks import (
    as_device,
    check_bool,
    check_like_module,
    check_mask,
    check_plain_data,
    check_positive_int,
    check_probability,
    check_sequence,
    check_source_mask,
    check_source_not_inverted,
    check_target_diagonal,
    check_tensor,
    check_token_tensors,
    is_trusted,
    trusted,
    unreadable_checkpoint,
)
from transformer_lab.decoder import Decoder, DecoderCache
from transformer_lab.embedding import PositionalEncoding, TokenEmbedding
from transformer_lab.encoder import Encoder
from transformer_lab.feedforward import FeedForward
from transformer_lab.masking import causal_mask
from transformer_lab.multihead import MultiHeadAttention
from transformer_lab.normalization import LayerNorm

__all__ = ["TransformerConfig", "Transformer", "count_parameters", "save_checkpoint", "load_checkpoint"]


@dataclass(frozen=True)
class TransformerConfig:
    """Every size of a `Transformer`, frozen and checked when created (chapter 09).

    `TransformerConfig.base(...)` and `.big(...)` give the paper's two settings (Table 3):
    Post-Norm as in the paper's figure, embeddings and output projection tied (section 3.4).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    max_len: int = 512
    norm_first: bool = True
    tie_embeddings: bool = False
    activation: str = "relu"

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            check_positive_int(name, getattr(self, name))
        check_probability("dropout", self.dropout)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads: got d_model={self.d_model}, n_heads={self.n_heads}"
            )
        for name in ("norm_first", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {self.activation!r}")
        if self.tie_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "tie_embeddings=True needs one shared vocabulary: src_vocab_size "
                f"({self.src_vocab_size}) must equal tgt_vocab_size ({self.tgt_vocab_size}); "
                "pass tie_embeddings=False for separate vocabularies"
            )

    @classmethod
    def base(cls, src_vocab_size: int, tgt_vocab_size: int, **overrides: Any) -> TransformerConfig:
        """The paper's base model: N=6, d_model=512, d_ff=2048, h=8, dropout 0.1, Post-Norm, tied."""
        settings: dict[str, Any] = dict(
            d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1, norm_first=False, tie_embeddings=True
        )
        settings.update(overrides)
        return cls(src_vocab_size, tgt_vocab_size, **settings)

    @classmethod
    def big(cls, src_vocab_size: int, tgt_vocab_size: int, **overrides: Any) -> TransformerConfig:
        """The paper's big model: N=6, d_model=1024, d_ff=4096, h=16, dropout 0.3, Post-Norm, tied."""
        settings: dict[str, Any] = dict(
            d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3, norm_first=False, tie_embeddings=True
        )
        settings.update(overrides)
        return cls(src_vocab_size, tgt_vocab_size, **settings)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (for a checkpoint that `torch.load(weights_only=True)` can read)."""
        return dataclasses.asdict(self)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" (chapter 09).

    Args:
        config: a `TransformerConfig`.

    Shape:
        src (B, S) and tgt (B, T) token ids; src_mask broadcastable to (B, 1, 1, S) (True = real
        token, e.g. `tl.padding_mask(src, pad_id)`); tgt_mask broadcastable to (B, 1, T, T).
        `forward` returns logits (B, T, tgt_vocab_size).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        c = config
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = TokenEmbedding(c.tgt_vocab_size, c.d_model)
        self.positional = PositionalEncoding(c.d_model, c.max_len, c.dropout)
        self.encoder = Encoder(
            c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.norm_first, activation=c.activation
        )
        self.decoder = Decoder(
            c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.norm_first, activation=c.activation
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)  # pre-softmax projection
        if c.tie_embeddings:
            # One (V, D) matrix for both embeddings and the output projection (paper, section 3.4).
            self.tgt_embed.embedding.weight = self.src_embed.embedding.weight
            self.generator.weight = self.src_embed.embedding.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform Linear weights, zero biases, N(0, 1/d_model) embeddings.

        With the sqrt(d_model) scale of `TokenEmbedding`, embedded tokens start with unit variance,
        the same scale as the positional encoding.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for embed in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embed.embedding.weight, mean=0.0, std=self.config.d_model**-0.5)

    # The public entry points check everything once (masks' conventions included, see `check_masks`), then
    # run the layers inside `trusted()`, where they do not check again.

    def encode(self, src: Tensor, src_mask: Tensor | None = None, *, check_masks: bool = True) -> Tensor:
        """Source token ids (B, S) -> memory (B, S, D).

        Args:
            src: source token ids (int64 or int32).
            src_mask: None, or a bool mask broadcastable to (B, 1, 1, S), True = real token
                (`tl.padding_mask(src, pad_id)`).
            check_masks: refuse a src_mask that is True exactly where src holds one and the same token id,
                which is what an inverted padding mask `(src == pad_id)` looks like. Pass False if your
                batch's real tokens really are all one id.
        """
        if not is_trusted():
            check_bool("check_masks", check_masks)
            self._check_source(src, src_mask, check_masks)
        with trusted():
            return self._encode(src, src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        *,
        check_masks: bool = True,
    ) -> Tensor:
        """Target token ids (B, T) and memory (B, S, D) -> logits (B, T, V).

        `tgt_mask=None` means the causal mask. With a `cache` (see `new_cache`), `tgt` holds only
        the new tokens, placed after the `cache.length` tokens already decoded; the cache must come from
        this model, the same batch and the same memory.

        Args:
            check_masks: refuse a tgt_mask in which no position may see itself (all of its diagonal blocked),
                which is what PyTorch's causal mask (True = blocked) looks like here. Pass False to use such a
                mask on purpose.
        """
        if not is_trusted():
            check_bool("check_masks", check_masks)
            check_token_tensors(("tgt", tgt, self.config.tgt_vocab_size), device=self._device())
            self._check_decode(tgt, memory, src_mask, tgt_mask, cache, check_masks)
        with trusted():
            return self._decode(tgt, memory, src_mask, tgt_mask, cache)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        check_masks: bool = True,
    ) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt (B, T) -> (B, T, V). `check_masks` as in `encode` and `decode`."""
        if not is_trusted():
            check_bool("check_masks", check_masks)
            check_tensor("src", src, dim=2)
            check_tensor("tgt", tgt, dim=2)
            if src.shape[0] != tgt.shape[0]:
                raise ValueError(
                    f"src and tgt must have the same batch size: src has B={src.shape[0]}, tgt has B={tgt.shape[0]}"
                )
            check_token_tensors(
                ("src", src, self.config.src_vocab_size),
                ("tgt", tgt, self.config.tgt_vocab_size),
                device=self._device(),
            )
            self._check_source(src, src_mask, check_masks, tokens_checked=True)
            self._check_target(tgt, tgt_mask, 0, check_masks)
        with trusted():
            memory = self._encode(src, src_mask)
            return self._decode(tgt, memory, src_mask, tgt_mask, None)

    def new_cache(self) -> DecoderCache:
        """An empty KV cache for incremental decoding with `decode(..., cache=...)`."""
        return DecoderCache.empty(self.config.n_layers)

    # ------------------------------------------------------------------ checks (once per public call)

    def _device(self) -> torch.device:
        return self.src_embed.embedding.weight.device

    def _check_source(self, src: Tensor, src_mask: object, check_masks: bool, tokens_checked: bool = False) -> None:
        if not tokens_checked:
            check_token_tensors(("src", src, self.config.src_vocab_size), device=self._device())
        _check_not_empty("src", src)
        check_like_module("src", src, self.src_embed, dtype=False)  # same device as the model
        if src_mask is not None:
            check_source_mask("src_mask", src_mask, src.shape[0], src.shape[1], device=src.device)
            assert isinstance(src_mask, Tensor)
            if check_masks:
                check_source_not_inverted("src_mask", src_mask, src)

    def _check_target(self, tgt: Tensor, tgt_mask: object, start: int, check_masks: bool) -> None:
        _check_not_empty("tgt", tgt)
        check_like_module("tgt", tgt, self.tgt_embed, dtype=False)
        if tgt_mask is not None:
            batch, length = tgt.shape
            check_mask("tgt_mask", tgt_mask, (batch, self.config.n_heads, length, start + length), device=tgt.device)
            assert isinstance(tgt_mask, Tensor)
            if check_masks:
                check_target_diagonal("tgt_mask", tgt_mask, length, start)

    def _check_decode(
        self,
        tgt: Tensor,
        memory: object,
        src_mask: object,
        tgt_mask: object,
        cache: object,
        check_masks: bool,
    ) -> None:
        check_sequence("memory", memory, self.config.d_model)
        assert isinstance(memory, Tensor)
        check_like_module("memory", memory, self.decoder)
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(
                "tgt and memory must have the same batch size: "
                f"tgt has B={tgt.shape[0]}, memory has B={memory.shape[0]}"
            )
        start = 0
        if cache is not None:
            if not isinstance(cache, DecoderCache):
                raise TypeError(f"cache must be a DecoderCache (model.new_cache()) or None, got {type(cache).__name__}")
            if len(cache.layers) != self.config.n_layers:
                raise ValueError(
                    f"cache has {len(cache.layers)} layers, the model has {self.config.n_layers}: "
                    "use this model's model.new_cache()"
                )
            for layer_cache in cache.layers:
                layer_cache.check(tgt.shape[0], self.config.n_heads, self.config.d_model // self.config.n_heads)
            cache.check_memory(memory)
            start = cache.length
        self._check_target(tgt, tgt_mask, start, check_masks)
        if src_mask is not None:
            check_source_mask("src_mask", src_mask, tgt.shape[0], memory.shape[1], device=tgt.device)

    # ------------------------------------------------------------------ the computation (inputs trusted)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        x = self.positional(self.src_embed(src))  # (B, S, D)
        return self.encoder(x, src_mask)

    def _decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: DecoderCache | None,
    ) -> Tensor:
        start = cache.length if cache is not None else 0
        length = tgt.shape[1]
        if tgt_mask is None:
            tgt_mask = causal_mask(start + length, device=tgt.device)[start:]  # (T, start + T)
        x = self.positional(self.tgt_embed(tgt), start=start)  # (B, T, D)
        x = self.decoder(x, memory, tgt_mask, src_mask, cache)  # (B, T, D)
        return self.generator(x)  # (B, T, V)


def _check_not_empty(name: str, tokens: Tensor) -> None:
    """At least one position (an empty sequence has nothing to attend)."""
    if tokens.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token per sequence, got shape {tuple(tokens.shape)}")


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Number of parameters by component (chapter 09), each shared tensor counted once.

    Returns a dict with keys "embeddings", "attention", "feed_forward", "norms", "output" (the
    pre-softmax Linear, 0 when tied to the embeddings), "other" and "total".
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    counts = dict.fromkeys(("embeddings", "attention", "feed_forward", "norms", "output", "other"), 0)
    seen: set[int] = set()
    kinds = (
        (TokenEmbedding, "embeddings"),
        (nn.Embedding, "embeddings"),
        (MultiHeadAttention, "attention"),
        (FeedForward, "feed_forward"),
        (LayerNorm, "norms"),
        (nn.LayerNorm, "norms"),
    )
    generator = getattr(model, "generator", None)
    for module in model.modules():
        kind = next((name for cls, name in kinds if isinstance(module, cls)), None)
        if module is generator:
            kind = "output"
        if kind is None:
            continue
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                counts[kind] += p.numel()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            counts["other"] += p.numel()
    counts["total"] = sum(counts.values())
    return counts


def save_checkpoint(model: Transformer, path: str | os.PathLike[str], **extra: Any) -> None:
    """Save the config (as a plain dict) and the state dict, readable with `weights_only=True`.

    `extra` adds plain data (numbers, strings, lists, dicts, tensors) beside them; it may not be
    called "config" or "state_dict".
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    _check_path("path", path)
    for key in ("config", "state_dict"):
        if key in extra:
            raise ValueError(f"extra data may not be called {key!r}: the checkpoint keeps the model's own there")
    for key, value in extra.items():
        check_plain_data(key, value)
    if os.path.isdir(path):
        raise ValueError(f"path {os.fspath(path)!r} is a folder; give a file name such as 'model.pt' inside it")
    folder = os.path.dirname(os.fspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"path {os.fspath(path)!r}: the folder {folder!r} does not exist; create it first")
    torch.save({"config": model.config.to_dict(), "state_dict": model.state_dict(), **extra}, path)


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Transformer:
    """Rebuild a `Transformer` saved by `save_checkpoint`, on the device `map_location`.

    The file is read with `weights_only=True` (plain data and tensors only, never code); anything else
    (a whole model saved with `torch.save(model)`, a corrupt or truncated file, a config that does not
    match the weights) is refused with a ValueError that says which.
    """
    _check_path("path", path)
    device = as_device("map_location", map_location)
    if os.path.isdir(path):
        raise ValueError(f"path {os.fspath(path)!r} is a folder; give the checkpoint file inside it (e.g. model.pt)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at path {os.fspath(path)!r}")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # noqa: BLE001 - a corrupt file can fail anywhere in the unpickler (KeyError, ...)
        advice = "load it where it was made and save it with tl.save_checkpoint(model, path)"
        raise unreadable_checkpoint(path, error, "a transformer_lab checkpoint", advice) from None
    if not isinstance(checkpoint, dict) or "config" not in checkpoint or "state_dict" not in checkpoint:
        raise ValueError(
            f"path {os.fspath(path)!r} is not a transformer_lab checkpoint (expected a dict with keys 'config' and "
            "'state_dict', as tl.save_checkpoint writes)"
        )
    if checkpoint.get("kind") == "gpt":
        raise ValueError(
            f"path {os.fspath(path)!r} holds a GPT checkpoint (chapter 10), not a Transformer's; "
            "load it with tl.training.load_gpt(path)"
        )
    config = checkpoint["config"]
    if not isinstance(config, dict):
        raise ValueError(f"the checkpoint's config must be a dict, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"the checkpoint's config has unknown keys {unknown}; a TransformerConfig knows {sorted(known)}"
        )
    try:
        model = Transformer(TransformerConfig(**config)).to(device)
    except TypeError as error:
        raise ValueError(f"the checkpoint's config is not a valid TransformerConfig: {error}") from None
    state = checkpoint["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"the checkpoint's state_dict must be a dict of tensors, got {type(state).__name__}")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(getattr(state[k], "shape", ())))
    if missing or unexpected or wrong:
        details = "; ".join(
            f"{what}: {keys[:4]}{' ...' if len(keys) > 4 else ''}"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
            if keys
        )
        raise ValueError(f"the checkpoint's weights do not match its config ({details}); was the config edited?")
    model.load_state_dict(state)
    return model


def _check_path(name: str, path: object) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a file path (str or pathlib.Path), got {type(path).__name__}")
