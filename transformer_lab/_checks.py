"""Input checks shared by the modules: clear errors that name the argument and what was expected."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

#: Reduced-precision dtypes whose statistics and attention scores are computed in float32 (as PyTorch does).
HALF_DTYPES = (torch.float16, torch.bfloat16)

_INTEGER_IDS = (torch.int64, torch.int32)

# --------------------------------------------------------------------------- validation once per public call
#
# The outermost public call (a `Transformer.forward`, an `Encoder`, a layer called on its own ...) checks its
# inputs, then runs its sub-layers inside `trusted()`: they see `is_trusted()` and skip their own checks, which
# would only repeat the caller's. A layer called on its own (chapters 03 and 06 do) is not inside `trusted()`
# and checks everything.

_state = threading.local()


def is_trusted() -> bool:
    """True inside a public call that has already checked its inputs (its sub-layers skip their checks)."""
    return getattr(_state, "trusted", False)


@contextmanager
def trusted() -> Iterator[None]:
    """Run sub-layers without re-checking what the enclosing public call has checked."""
    previous = getattr(_state, "trusted", False)
    _state.trusted = True
    try:
        yield
    finally:
        _state.trusted = previous


def check_tensor(name: str, value: object, *, min_dim: int | None = None, dim: int | None = None) -> None:
    """Raise TypeError unless `value` is a tensor, ValueError unless its rank is as expected."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(value.shape)}")
    if min_dim is not None and value.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(value.shape)}")


def check_float(name: str, value: Tensor) -> None:
    """Raise TypeError unless `value` is a floating-point tensor (e.g. not token ids)."""
    if not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (embedded vectors), got dtype {value.dtype}; "
            "token ids go through an embedding first"
        )


def check_last_dim(name: str, value: Tensor, size: int, what: str = "d_model") -> None:
    """Raise ValueError unless the last dimension of `value` is `size`."""
    if value.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {what}={size}, got shape {tuple(value.shape)}")


def check_positive_int(name: str, value: object) -> None:
    """Raise TypeError/ValueError unless `value` is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")


def check_bool(name: str, value: object) -> None:
    """Raise TypeError unless `value` is True or False (a string like "no" would be silently truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_probability(name: str, value: object) -> None:
    """Raise TypeError/ValueError unless `value` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def check_mask(
    name: str, mask: object, target_shape: torch.Size | tuple[int, ...], device: torch.device | None = None
) -> None:
    """Raise unless `mask` is a bool tensor broadcastable to `target_shape` (and on `device`, if given).

    The library's convention is True = "may attend". A float mask (PyTorch's additive
    convention) or an int mask is refused rather than silently misread.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor where True means 'may attend', got dtype {mask.dtype}; "
            "convert an additive float mask with `mask == 0`, or a PyTorch-style bool mask "
            "(True = blocked) with tl.invert_mask"
        )
    target = tuple(target_shape)
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), target)
    except RuntimeError:
        broadcast = None
    if broadcast != target:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} cannot be broadcast to the attention scores' shape "
            f"{target} (batch..., T queries, S keys); a padding mask is (B, 1, 1, S) "
            "(tl.padding_mask(tokens, pad_id)), a causal mask (T, T) (tl.causal_mask(T))"
        )
    if device is not None and mask.device != device:
        raise ValueError(
            f"{name} is on {mask.device} but the attention scores are on {device}; "
            f"build the mask on the inputs' device or move it with {name}.to({str(device)!r})"
        )


# --------------------------------------------------------------------------- conventions that shape cannot tell


def check_source_mask(name: str, mask: object, batch: int, length: int, device: torch.device | None = None) -> None:
    """A model-level source mask must be one row per sequence: broadcastable to (B, 1, 1, S).

    A (B, S) padding mask would broadcast as (T, S), one row per *query*, whenever B equals the
    number of queries, and be silently misread; at the model's entry points it is refused.
    """
    if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] != 1 and mask.dtype == torch.bool:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} would be read as one row per query, not per sequence: a source "
            f"mask is (B, 1, 1, S) = ({batch}, 1, 1, {length}); use tl.padding_mask(src, pad_id), or "
            f"{name}[:, None, None, :] for a (B, S) mask"
        )
    check_mask(name, mask, (batch, 1, 1, length), device=device)


def check_target_diagonal(name: str, mask: Tensor, length: int, start: int = 0) -> None:
    """Refuse a target mask in which no query may see its own position (its diagonal is all blocked).

    That is PyTorch's causal mask (True = blocked, `torch.triu(..., diagonal=1)`) passed where
    True = may attend is expected: every query would see only the future. The caller has already
    checked the shape: `mask` broadcasts to (..., length, start + length).
    """
    full = (
        mask.expand(*mask.shape[:-2], length, start + length)
        if mask.dim() >= 2
        else mask.expand(length, start + length)
    )
    if not bool(torch.diagonal(full, offset=start, dim1=-2, dim2=-1).any()):
        raise ValueError(
            f"{name} blocks every position from seeing itself (its diagonal is all False): this looks like "
            "PyTorch's convention (True = blocked), where this library's is True = may attend; pass "
            f"tl.causal_mask(T) or tl.target_mask(tgt, pad_id), or tl.invert_mask({name}). If that is really "
            "the mask you mean, pass check_masks=False"
        )


def check_source_not_inverted(name: str, mask: Tensor, tokens: Tensor) -> None:
    """Refuse a source mask that is True exactly where the source holds one and the same token id
    while the positions it blocks hold several different ids.

    That is `(src == pad_id)` (or PyTorch's key_padding_mask, True = padded) where this library wants
    True = real token: every query would attend to padding only. A right padding mask blocks one id
    (the padding) and never trips the rule; when both sides hold a single id each the two conventions
    cannot be told apart and nothing is raised. `mask` broadcasts to (B, 1, 1, S) (checked by the caller).
    """
    keep = mask.expand(tokens.shape[0], 1, 1, tokens.shape[1])[:, 0, 0, :]  # (B, S)
    if bool(keep.all()) or not bool(keep.any()):
        return
    first = tokens[keep][0]
    blocked = tokens[~keep]
    if bool(torch.equal(keep, tokens == first)) and bool((blocked != blocked[0]).any()):
        raise ValueError(
            f"{name} is True exactly where the source holds token id {int(first)}: this looks like an inverted "
            f"padding mask ((src == pad_id), or PyTorch's key_padding_mask, True = padded), where this library's "
            f"is True = real token; pass tl.padding_mask(src, pad_id) or tl.invert_mask({name}). If every real "
            "token of your batch really is that one id, pass check_masks=False"
        )


def check_token_dtype(name: str, tokens: Tensor) -> None:
    """Raise TypeError unless `tokens` holds int64 or int32 ids (what `nn.Embedding` can index with)."""
    if tokens.dtype not in _INTEGER_IDS:
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(
                f"{name} must be an integer tensor of token ids (torch.long), got dtype {tokens.dtype}; "
                "token ids are whole numbers: build them with dtype=torch.long"
            )
        raise TypeError(
            f"{name} must hold token ids as torch.long (or torch.int32), got dtype {tokens.dtype}; "
            f"convert with {name}.long()"
        )


def check_tokens(name: str, tokens: object, vocab_size: int, device: torch.device | None = None) -> None:
    """Raise unless `tokens` is a 2-D int64/int32 tensor of ids in [0, vocab_size) (on `device`, if given).

    The range check reads the smallest and largest id back to the host once (one sync on a GPU).
    """
    check_token_tensors((name, tokens, vocab_size), device=device)


def check_token_tensors(*items: tuple[str, object, int], device: torch.device | None = None) -> None:
    """`check_tokens` for several (name, tokens, vocab_size) at once, with ONE read-back to the host for all.

    With `device` (where the embedding is), tokens elsewhere are refused before anything is read back.
    """
    extremes = []
    for name, tokens, _ in items:
        check_tensor(name, tokens)
        assert isinstance(tokens, Tensor)
        check_token_dtype(name, tokens)
        if tokens.dim() != 2:
            raise ValueError(f"{name} must have shape (batch, seq_len), got shape {tuple(tokens.shape)}")
        if device is not None and tokens.device != device:
            raise ValueError(
                f"{name} is on {tokens.device} but the model is on {device}; "
                f"move the ids with {name}.to({str(device)!r})"
            )
        check_has_values(name, tokens)
        if tokens.numel() > 0:
            extremes += list(torch.aminmax(tokens))
    if not extremes:
        return
    values = torch.stack([e.to(extremes[0].device, torch.int64) for e in extremes]).tolist()  # one sync
    it = iter(values)
    for name, tokens, vocab_size in items:
        if tokens.numel() == 0:  # type: ignore[union-attr]
            continue
        low, high = next(it), next(it)
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size}); "
                "check the tokenizer (or the config's vocabulary size)"
            )


def check_sequence(name: str, x: object, d_model: int) -> None:
    """Raise unless `x` is a float (B, L, d_model) tensor."""
    check_tensor(name, x, dim=3)
    assert isinstance(x, Tensor)
    check_float(name, x)
    check_last_dim(name, x, d_model)


def check_like_module(name: str, x: Tensor, module: nn.Module, dtype: bool = True) -> None:
    """Raise unless `x` has the device (and, if `dtype`, the dtype) of `module`'s parameters (PyTorch would
    fail deep inside with its own words). A module without parameters accepts anything.
    """
    param = next(module.parameters(), None)
    if param is None:
        return
    if x.device != param.device:
        raise ValueError(
            f"{name} is on {x.device} but the {type(module).__name__}'s parameters are on {param.device}; "
            f"move one to the other, e.g. {name}.to({str(param.device)!r}) or model.to({str(x.device)!r})"
        )
    if dtype and x.dtype != param.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the {type(module).__name__}'s parameters are {param.dtype}; "
            f"convert one to the other, e.g. {name}.to({param.dtype}) or model.to({x.dtype})"
        )


def check_plain_data(name: str, value: object) -> None:
    """Raise TypeError unless `value` is plain data that `torch.load(weights_only=True)` reads back: None, bool,
    int, float, str, tensors, and lists, tuples and dicts (with str or int keys) of these. A checkpoint holding
    anything else would be written without complaint and then refused when loaded."""
    if value is None or isinstance(value, (bool, int, float, str, Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain_data(f"{name}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{name} has a key {key!r} of type {type(key).__name__}; use str or int keys")
            check_plain_data(f"{name}[{key!r}]", item)
        return
    raise TypeError(
        f"{name} is a {type(value).__name__}, which a weights_only checkpoint cannot hold (it would be saved but "
        "refused when loaded); store plain data instead (numbers, strings, lists, dicts, tensors), e.g. its to_dict()"
    )


def unreadable_checkpoint(path: object, error: BaseException, what: str, advice: str) -> ValueError:
    """The ValueError for a file that `torch.load(weights_only=True)` could not read, naming the path.

    Python objects (a whole model pickled with `torch.save(model)`: "Unsupported global") are told apart from a
    corrupt or truncated file (random bytes fail anywhere in the unpickler: an unknown opcode, a KeyError, an
    IndexError, ...). The reason shown is the unpickler's own line, not PyTorch's long preamble about
    weights_only. `advice` says how to write a readable file.
    """
    import os
    import re

    text = str(error)
    found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\n\n|$)", text, re.S)
    reason = (found.group(1) if found else f"{type(error).__name__}: {text}").strip().replace("\n", " ")[:200]
    shown = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    if "Unsupported global" in text:
        return ValueError(
            f"path {shown!r} could not be read as {what}: it holds Python objects, not plain data and tensors "
            f"(was it written with torch.save(model)?); {advice}; this library never unpickles code "
            f"(weights_only=True). ({reason})"
        )
    return ValueError(f"path {shown!r} could not be read as {what} (a corrupt or truncated file?): {reason}")


def check_same_device(name: str, value: Tensor, device: torch.device, other: str) -> None:
    """Raise ValueError unless `value` is on `device` (where `other` is)."""
    if value.device != device:
        raise ValueError(
            f"{name} is on {value.device} but {other} is on {device}; move it with {name}.to({other}.device)"
        )


def as_device(name: str, device: object) -> torch.device:
    """`device` as a torch.device, or a ValueError naming the argument (e.g. "gpu" is not a device)."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, (str, int)) or isinstance(device, bool):
        raise TypeError(f"{name} must be a torch.device or a string like 'cpu' or 'cuda', got {device!r}")
    try:
        result = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"{name}={device!r} is not a device PyTorch knows; use 'cpu', 'cuda', 'cuda:1' or 'mps'"
        ) from None
    check_device_available(name, result)
    return result


def check_device_available(name: str, device: torch.device) -> None:
    """Raise ValueError if `device` is a CUDA GPU or an Apple GPU this machine does not have (PyTorch would fail
    later, at the first tensor moved there, with an AssertionError that names no argument)."""
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{name}={str(device)!r}, but PyTorch sees no CUDA GPU on this machine; use 'cpu'")
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{name}={str(device)!r}, but this machine has {count} CUDA GPU(s): 'cuda:0' to 'cuda:{count - 1}'"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}={str(device)!r}, but PyTorch sees no Apple GPU (MPS) on this machine; use 'cpu'")


def check_has_values(name: str, value: Tensor) -> None:
    """Raise ValueError if `value` is on the meta device: it has a shape but no values to read (PyTorch would
    fail deep inside with "cannot be called on meta tensors")."""
    if value.device.type == "meta":
        raise ValueError(
            f"{name} is on the meta device: it has a shape but no values; build it on 'cpu' (or a GPU) instead"
        )


def check_integer_vector(name: str, value: object, what: str) -> None:
    """Raise TypeError unless `value` is a 1-D integer tensor (token ids, offsets), not float or bool."""
    if not isinstance(value, Tensor) or value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool:
        is_tensor = isinstance(value, Tensor)
        shown = f"shape {tuple(value.shape)}, dtype {value.dtype}" if is_tensor else type(value).__name__
        raise TypeError(f"{name} must be a 1-D integer tensor of {what}, got {shown}")
    check_has_values(name, value)


def check_int(name: str, value: object, low: int | None = None, high: int | None = None) -> None:
    """Raise TypeError unless `value` is an int (not a bool), ValueError unless low <= value < high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if (low is not None and value < low) or (high is not None and value >= high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'})"
        raise ValueError(f"{name} must be an int in {bounds}, got {value}")


def check_number(name: str, value: object, *, positive: bool = False, non_negative: bool = False) -> None:
    """Raise TypeError unless `value` is a finite real number, ValueError unless its sign is as asked."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if non_negative and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
