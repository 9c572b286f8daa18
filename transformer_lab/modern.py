"""Chapter 11's building blocks that the earlier chapters do not already hold.

- `RotaryEmbedding`: rotary position embeddings (RoPE; Su et al., 2021), chapter 08's exercise as a module. Each
  query and key is turned by its own position: pair i of the vector at position t by the angle t * omega_i, with
  omega_i = base^(-2i / d_k). Two layouts of the pairs are in use, and both are conventions:
      "pairs"  (x_2i, x_2i+1)        chapter 08, the RoPE paper, Meta's original Llama code;
      "halves" (x_i, x_i+d_k/2)      Hugging Face's `rotate_half` (Llama, Qwen3 and most checkpoints on the Hub),
                                     nanochat.
  A model trained in one layout runs in the other once the rows of W^Q and W^K (and a QK norm's weights) of every
  head are permuted the same way (`tl.hf` does so); scores q . k do not change, since both sides move alike.
  Llama 3's frequency scaling (`RopeScaling`, rope_type "llama3") is supported; other scalings are not.
- `Float32RMSNorm`: RMSNorm computed the way Hugging Face's Llama and Qwen3 compute it (the statistic in float32
  whatever the model's dtype). Only needed to equal those models to 1e-10 in float64; otherwise the GPT uses
  PyTorch's own `nn.RMSNorm`.
- `soft_cap`: Gemma 2's logit soft-cap, c * tanh(z / c).
- `sliding_window_mask`: the causal mask of sliding-window attention (Mistral, Gemma, nanochat's window pattern):
  query i sees only the last `window` keys, i - window < j <= i.

Shape legend: B batch, H heads, L positions, d_k the size of one head.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer_lab._checks import check_bool, check_positive_int

__all__ = [
    "ROPE_LAYOUTS",
    "RopeScaling",
    "rope_frequencies",
    "rotate_pairs",
    "rotate_halves",
    "RotaryEmbedding",
    "Float32RMSNorm",
    "soft_cap",
    "sliding_window_mask",
]

#: The two ways of grouping a head's d_k features into the pairs that RoPE turns (see the module docstring).
ROPE_LAYOUTS = ("pairs", "halves")


def _check_positive_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    if not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's scaling of the rotary frequencies (Llama 3.1 and later; Hugging Face's rope_type "llama3").

    Wavelengths 2 pi / omega_i shorter than original_max_position_embeddings / high_freq_factor are kept, those
    longer than original_max_position_embeddings / low_freq_factor are stretched by `factor` (omega_i / factor),
    and those in between are interpolated smoothly. The fields are Hugging Face's names.
    """

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ValueError(
                f"rope_scaling: rope_type {self.rope_type!r} is not supported; supported are no scaling (None, "
                "Hugging Face's 'default') and 'llama3'"
            )
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            object.__setattr__(self, name, _check_positive_number(f"rope_scaling.{name}", getattr(self, name)))
        check_positive_int("rope_scaling.original_max_position_embeddings", self.original_max_position_embeddings)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"rope_scaling: high_freq_factor ({self.high_freq_factor}) must be larger than low_freq_factor "
                f"({self.low_freq_factor}); they bound the band of wavelengths that is interpolated"
            )

    @classmethod
    def from_dict(cls, values: object) -> RopeScaling:
        """From a dict with these field names (what `dataclasses.asdict` and a checkpoint hold)."""
        if isinstance(values, RopeScaling):
            return values
        if not isinstance(values, dict):
            raise TypeError(f"rope_scaling must be a RopeScaling, a dict of its fields or None, got {values!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"rope_scaling has unknown keys {unknown}; its keys are {sorted(names)}")
        return cls(**values)


def rope_frequencies(
    d_k: int, base: float = 10000.0, scaling: RopeScaling | None = None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """The rotary frequencies omega_i = 1 / base^(2i / d_k), one per pair, computed in `dtype` (chapter 11).

    Chapter 08's frequencies with d_k for d_model and `base` for 10000, written as Hugging Face writes them
    (so that in float32 they are Hugging Face's numbers exactly). With `scaling`, Llama 3's rule is applied.

    Shape:
        -> (d_k / 2,).
    """
    check_positive_int("d_k", d_k)
    inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=dtype) / d_k))  # (d_k/2,)
    if scaling is None:
        return inv_freq
    # Llama 3's rule, step by step as Hugging Face's `_compute_llama3_parameters` computes it.
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # (d_k/2,)
    stretched = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)  # long: slowed down
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * stretched / scaling.factor + smooth * stretched
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, stretched)


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn each pair (x_2i, x_2i+1) by its angle (chapter 08's layout).

    Read as the complex number a + ib, a pair (a, b) turned by the angle theta is that number times
    e^(i theta) = cos theta + i sin theta: (a + ib)(c + is) = (ac - bs) + i(as + bc), the rotation's two rows.
    That is how Meta's Llama code applies RoPE, and the fast way in PyTorch: one complex product over a view of x
    (and one in the backward pass), where the real formula below takes strided slices of both members, four
    products, a sum, a difference and a stack: about three times slower, forward and backward, at chapter 11's
    size. Each part is the same two products and one sum, so the numbers are the real formula's (tested; on CPU
    bit for bit). Half precision takes the real formula (bfloat16 has no complex type, float16's complex32 few
    kernels), and so do devices other than CPU and CUDA.

    Shape:
        x (..., L, d_k); cos, sin (L, d_k / 2), the cosine and sine of each position's angles -> (..., L, d_k).
    """
    if _complex_ready(x, cos, sin):
        pairs = x.unflatten(-1, (-1, 2))  # (..., L, d_k/2, 2), a view: (a, b) of every pair side by side
        if not _viewable_as_complex(pairs):
            pairs = pairs.contiguous()
        turned = torch.view_as_complex(pairs) * torch.complex(cos, sin)  # (..., L, d_k/2): (a + ib) e^(i theta)
        return torch.view_as_real(turned).flatten(-2)  # (..., L, d_k), a view
    a, b = x[..., 0::2], x[..., 1::2]  # (..., L, d_k/2): first and second member of every pair
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (..., L, d_k)


_COMPLEX_PARTS = (torch.float32, torch.float64)  # the real dtypes that have a complex one (complex64, complex128)


def _complex_ready(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether `rotate_pairs` may compute in complex numbers: float32 or float64 tensors on CPU or CUDA."""
    return (
        x.dtype in _COMPLEX_PARTS
        and cos.dtype in _COMPLEX_PARTS
        and sin.dtype == cos.dtype
        and x.device.type in ("cpu", "cuda")
    )


def _viewable_as_complex(pairs: Tensor) -> bool:
    """`torch.view_as_complex`'s conditions: the two parts adjacent, every other stride and the offset even."""
    return (
        pairs.stride(-1) == 1
        and all(stride % 2 == 0 for stride in pairs.stride()[:-1])
        and pairs.storage_offset() % 2 == 0
    )


def rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn each pair (x_i, x_i+d_k/2) by its angle (Hugging Face's layout: `q * cos + rotate_half(q) * sin`).

    Shape:
        x (..., L, d_k); cos, sin (L, d_k / 2) -> (..., L, d_k).
    """
    a, b = x.chunk(2, dim=-1)  # (..., L, d_k/2) each: the first and the second half
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)  # (..., L, d_k)


_ROTATIONS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"pairs": rotate_pairs, "halves": rotate_halves}


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings for the queries and keys of one head size (chapter 11; Su et al., 2021).

    The cosines and sines of the angles t * omega_i are computed once per dtype and device, for positions
    0 .. max_len - 1: in float64 and then rounded to the model's dtype, or, with `float32_tables`, in float32
    as Hugging Face computes them (its Llama and Qwen3 do, whatever the model's dtype). They are not buffers:
    nothing to save, and `.double()` cannot turn float32-rounded tables into float64 ones.

    One instance may serve every attention layer of a model (the tables depend on the head size only).

    Args:
        d_k: the head size; even.
        max_len: the number of positions the tables cover (the model's block_size).
        base: the base of the frequencies (10000 in the paper and GPT-NeoX; Llama 3 uses 500000).
        layout: "pairs" or "halves" (see the module docstring).
        scaling: Llama 3's frequency scaling, or None.
        float32_tables: compute the angles, cosines and sines in float32 (Hugging Face's numbers).

    Shape:
        x (..., L, d_k) with positions start .. start + L - 1 on the second-to-last axis -> (..., L, d_k).
    """

    def __init__(
        self,
        d_k: int,
        max_len: int,
        base: float = 10000.0,
        layout: str = "pairs",
        scaling: RopeScaling | None = None,
        float32_tables: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("d_k", d_k)
        check_positive_int("max_len", max_len)
        if d_k % 2:
            raise ValueError(f"d_k must be even for rotary position embeddings (they turn pairs), got {d_k}")
        if layout not in ROPE_LAYOUTS:
            raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        check_bool("float32_tables", float32_tables)
        self.d_k = d_k
        self.max_len = max_len
        self.base = _check_positive_number("base", base)
        self.layout = layout
        self.scaling = scaling
        self.float32_tables = float32_tables
        self.rotate = _ROTATIONS[layout]  # the layout is picked here, once
        self._tables: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}

    def tables(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """cos and sin of the angles t * omega_i, each (max_len, d_k / 2), in `dtype` on `device`."""
        key = (dtype, torch.device(device))
        if key not in self._tables:
            exact = torch.float32 if self.float32_tables else torch.float64
            inv_freq = rope_frequencies(self.d_k, self.base, self.scaling, exact)  # (d_k/2,)
            positions = torch.arange(self.max_len, dtype=exact)  # (max_len,)
            angles = positions.unsqueeze(1) * inv_freq  # (max_len, d_k/2), angle of pair i at position t
            self._tables[key] = (angles.cos().to(device, dtype), angles.sin().to(device, dtype))
        return self._tables[key]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        length = x.shape[-2]
        if start < 0 or start + length > self.max_len:
            raise ValueError(
                f"positions {start}..{start + length - 1} are beyond the {self.max_len} positions the rotary tables "
                f"cover (max_len={self.max_len})"
            )
        if x.shape[-1] != self.d_k:
            raise ValueError(f"x must end with the head size d_k={self.d_k}, got shape {tuple(x.shape)}")
        cos, sin = self.tables(x.dtype, x.device)
        return self.rotate(x, cos[start : start + length], sin[start : start + length])  # (..., L, d_k)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_tables"] = {}  # a copy computes its own tables (they are a cache, not state)
        return state

    def extra_repr(self) -> str:
        extra = f", scaling={self.scaling}" if self.scaling is not None else ""
        extra += ", float32_tables=True" if self.float32_tables else ""
        return f"d_k={self.d_k}, max_len={self.max_len}, base={self.base:g}, layout={self.layout!r}{extra}"


class Float32RMSNorm(nn.Module):
    """RMSNorm as Hugging Face's Llama and Qwen3 compute it (chapter 11): the statistic in float32, whatever
    the input's dtype.

        y = (x / sqrt(mean(x^2) + eps), computed in float32, cast back to x's dtype) * gamma

    In float32 this is `nn.RMSNorm`'s formula; in float64 it rounds to float32 in the middle, which is why a
    float64 model equals Hugging Face's only to about 1e-7 without it. The GPT uses it where its config asks
    for `hf_float32`; otherwise `nn.RMSNorm`.

    Args:
        d_model: the size of the normalised last axis.
        eps: added to the mean square.
        weight: learn a gain gamma (D,) (True) or not (False: nanochat's RMSNorm without parameters).

    Shape:
        x (..., D) -> (..., D).
    """

    def __init__(self, d_model: int, eps: float = 1e-6, weight: bool = True) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_bool("weight", weight)
        self.d_model = d_model
        self.eps = _check_positive_number("eps", eps)
        self.weight = nn.Parameter(torch.ones(d_model)) if weight else None

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., D) in float32
        h = h.to(x.dtype)
        return h if self.weight is None else self.weight * h

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, weight={self.weight is not None}"


def soft_cap(logits: Tensor, cap: float) -> Tensor:
    """Gemma 2's logit soft-cap: cap * tanh(logits / cap), close to the identity for |logits| << cap and never
    beyond +-cap (chapter 11). Shape: any -> the same."""
    return cap * torch.tanh(logits / cap)


def sliding_window_mask(size: int, window: int, device: torch.device | str | None = None) -> Tensor:
    """The mask of sliding-window attention (chapter 11): True where query i may attend to key j.

    Query i sees the `window` most recent keys, itself included: i - window < j <= i. A window of 1 is the
    token alone; a window of `size` or more is the plain causal mask (`tl.causal_mask`). Hugging Face's Mistral
    counts its `sliding_window` the same way; nanochat's (left, 0) windows count the keys before the query
    (left = window - 1).

    Shape:
        (size, size), broadcastable to (B, H, T, T).
    """
    check_positive_int("size", size)
    check_positive_int("window", window)
    i = torch.arange(size, device=device).unsqueeze(1)  # (T, 1), the query's position
    j = torch.arange(size, device=device).unsqueeze(0)  # (1, T), the key's position
    return (j <= i) & (j > i - window)  # (T, T)
