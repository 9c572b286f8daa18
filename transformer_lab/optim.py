"""The course's optimizers, in one module: AdamW as nanoGPT configures it (chapter 10) and Muon for the hidden
weight matrices with AdamW for the rest (chapter 11). `tl.muon` and `tl.training` / `tl.gpt_training` re-export
these names, as the chapters call them; keeping them here removes the import circle there was between
gpt_training.py (whose trainer builds a Muon) and muon.py (whose AdamW half is the course's AdamW).

Muon ("MomentUm Orthogonalized by Newton-Schulz", Keller Jordan et al., 2024,
https://kellerjordan.github.io/posts/muon/ and github.com/KellerJordan/Muon) trains nanochat's and
modded-nanogpt's matrices. For one weight matrix W (out, in) with gradient G, each step is

    M <- beta M + (1 - beta) G                       momentum: an average of the recent gradients
    U <- (1 - beta) G + beta M   (Nesterov)          or U <- M without Nesterov
    O <- NS_k(U)                                     ~ the orthogonal factor of U (below)
    W <- W (1 - lr wd) - lr s O                      decoupled weight decay, then the step

NS_k is k steps of a quintic Newton-Schulz iteration. Write U = P S Q^T (its SVD): the iteration moves
every singular value towards 1 (with the published coefficients and 5 steps, into about [0.68, 1.2] for
those above 1/100 of ||U||_F: the coefficients trade exactness for speed), so O ~ P Q^T: the directions
of the momentum, each moved by about the same amount. A plain gradient step moves a matrix mostly along
its few largest singular directions; Muon's step moves it along all of them alike. Starting from
X = U / (||U||_F + eps) (the Frobenius norm bounds the largest singular value, so all of them are <= 1)
and turned to be wide (n <= m) so that X X^T is the smaller Gram matrix, each step is

    A = X X^T,    X <- a X + (b A + c A A) X,    (a, b, c) = (3.4445, -4.7750, 2.0315)

which applies the odd polynomial p(s) = a s + b s^3 + c s^5 to every singular value s at once.

s, the shape scaling, gives every matrix an update of comparable size: "original" (Keller Jordan's)
s = sqrt(max(1, out / in)); "match_rms_adamw" (Moonshot's, "Muon is Scalable for LLM Training")
s = 0.2 sqrt(max(out, in)), which makes the update's RMS that of a typical AdamW step so that AdamW's
learning rate and weight decay carry over.

Muon is for the hidden matrices only, the published recipe says: the embeddings, the output head and the
gains and biases keep AdamW. Embeddings are 2-D too, but an embedding is a table of one vector per token,
looked up rather than multiplied by an input; orthogonalising its gradient would couple the rows and give
a rare token's row a step as large as a frequent one's. `parameter_roles` therefore splits a model's
parameters by their role, not their shape, and `make_muon` builds one `MuonAdamW` optimizer holding both.

PyTorch 2.13 ships `torch.optim.Muon` with the same update, but it runs Newton-Schulz in bfloat16 (float32's
range with 8 bits of precision: its update is 1-2 % away from the exact one on small matrices, measured in
tests/test_muon.py). `Muon` runs it in float32 (float64 for float64 weights) for precision, not for speed:
tests/test_muon.py checks it against `_reference_step`, the published update written out in float64 (to float
precision), and against `torch.optim.Muon` (to bfloat16's precision).

Which of the two runs faster is a property of the machine and of PyTorch's kernels, not of this code. A
bfloat16 matrix product is fast where the hardware has bfloat16 arithmetic and PyTorch's kernels use it: a
GPU's matrix units, and on x86 CPUs the `avx512_bf16` and `amx_bf16` instructions (the flags of /proc/cpuinfo
on Linux); ARM CPUs have a bf16 extension of their own (Apple silicon from the M2 on; not measured for this
course); where a CPU lacks them, PyTorch takes a slower path. One optimizer step of chapter 11's modern
model, one thread, torch 2.13 (chapter 11's cell; benchmarks/README.md, "Chapter 11's optimizer"): on an
Intel Xeon with avx512_bf16 and amx_bf16, torch.optim.Muon's step and this module's take about the same time
(25.8 and 27.3 ms); on an AMD EPYC with avx512_bf16, 24.6 and 31.6 ms; on the AMD EPYC that made the course's
first figures, whose flags were not recorded, 1051 and 60 ms, 18 times as long.

Shape legend: out, in: a weight's rows and columns (nn.Linear's (out_features, in_features));
n <= m: the shorter and longer side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab._checks import check_bool, check_number, check_positive_int, check_probability

__all__ = [
    "FUSED_ADAMW_DEVICES",
    "adamw_fused",
    "make_adamw",
    "NS_COEFFICIENTS",
    "newton_schulz",
    "muon_lr_scale",
    "Muon",
    "parameter_roles",
    "MuonAdamW",
    "make_muon",
]

# ---------------------------------------------------------------- AdamW (chapter 10)


def _check_betas(betas: object) -> None:
    """AdamW's two betas, as make_adamw and make_muon take them: two numbers in [0, 1)."""
    if (
        not isinstance(betas, (tuple, list))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise ValueError(f"betas must be two numbers in [0, 1), e.g. (0.9, 0.99), got {betas!r}")


#: Where `make_adamw` uses PyTorch's fused AdamW by default: the devices the course runs on that have it.
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def adamw_fused(params: Sequence[Tensor], fused: bool | None = None) -> bool:
    """Whether an AdamW over `params` runs PyTorch's fused kernel: `fused` where it is given (True, refused for
    parameters outside FUSED_ADAMW_DEVICES or not floating-point), else True when every parameter allows it."""
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None (where PyTorch has the kernel), True or False, got {fused!r}")
    allowed = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES for p in params)
    if fused and not allowed:
        where = sorted({f"{p.device.type} {p.dtype}" for p in params})
        raise ValueError(
            f"fused=True needs floating-point parameters on {' or '.join(FUSED_ADAMW_DEVICES)}, got {where}; "
            "leave fused=None (the fused kernel where it exists) or pass fused=False"
        )
    return allowed if fused is None else fused


def make_adamw(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    *,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW as nanoGPT configures it: weight decay on the matrices (Linear weights, embeddings) only.

    Biases and LayerNorm gains/shifts (the 1-D parameters) are not decayed: pulling a gain towards 0 would
    shrink the activations, not regularise a mapping. A tied matrix is one parameter, decayed once.

    `fused`: nanoGPT asks for PyTorch's fused AdamW wherever PyTorch had it when nanoGPT was written (CUDA);
    PyTorch has had one for CPUs too since 2.4. By default (None) this uses it on a CPU or a CUDA GPU: one
    kernel per tensor does the whole update, where the plain implementation makes about eight passes over each
    tensor (mul_, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_). At chapter 10's size on one CPU thread an
    AdamW step took 2.1 ms of CPU instead of 5.4 ms (under the profiler), and a whole training step 1-4 % less
    (`benchmarks/nanogpt_speed.py`, results in benchmarks/README.md). The update rule is the same; the rounding
    of its last bits is not, so fused and plain runs drift apart by float32's rounding (about 1e-6 in the loss
    over the benchmark's 66 steps). False: the plain implementation (chapter 11's ablation was measured with it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_number("lr", lr, positive=True)
    check_number("weight_decay", weight_decay, non_negative=True)
    _check_betas(betas)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    use_fused = adamw_fused(params, fused)
    return torch.optim.AdamW(groups, lr=lr, betas=(float(betas[0]), float(betas[1])), fused=use_fused)


#: `make_muon`'s name for `adamw_fused` (its own argument is called adamw_fused).
use_fused_adamw = adamw_fused


# ---------------------------------------------------------------- Muon (chapter 11)

#: The quintic's coefficients (a, b, c) from Keller Jordan's muon.py (also torch.optim.Muon's default).
NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def _check_coefficients(coefficients: object) -> tuple[float, float, float]:
    if (
        not isinstance(coefficients, (tuple, list))
        or len(coefficients) != 3
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in coefficients)
    ):
        raise ValueError(
            f"ns_coefficients must be three finite numbers (a, b, c), e.g. {NS_COEFFICIENTS}, got {coefficients!r}"
        )
    return (float(coefficients[0]), float(coefficients[1]), float(coefficients[2]))


def _check_ns_dtype(dtype: object) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and not dtype.is_complex):
        raise TypeError(
            f"ns_dtype must be None (float32, or float64 for float64 weights) or a floating torch.dtype such as "
            f"torch.float32 or torch.bfloat16, got {dtype!r}"
        )


def newton_schulz(
    update: Tensor,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = EPS,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Orthogonalise a matrix approximately: `steps` quintic Newton-Schulz steps (chapter 11).

    For update = P S Q^T (its SVD) the result is close to P Q^T: the singular vectors kept, every singular
    value moved towards 1 (with the default coefficients and 5 steps, into about [0.68, 1.2] for those above
    1/100 of the Frobenius norm; much smaller ones grow but stay below).

    Args:
        update: a 2-D tensor (out, in), e.g. Muon's momentum.
        steps: Newton-Schulz steps (5 in the published recipe).
        coefficients: (a, b, c) of p(s) = a s + b s^3 + c s^5.
        eps: added to the Frobenius norm before dividing by it (a zero matrix stays zero).
        dtype: where to compute; None: float32, or float64 for a float64 update. torch.optim.Muon uses
            torch.bfloat16.

    Shape:
        update (out, in) -> (out, in), in `dtype`.
    """
    if not isinstance(update, Tensor) or update.dim() != 2:
        shown = tuple(update.shape) if isinstance(update, Tensor) else type(update).__name__
        raise ValueError(f"update must be a 2-D matrix (out, in), got {shown}")
    if not update.is_floating_point():
        raise TypeError(f"update must be a floating-point matrix, got dtype {update.dtype}")
    check_positive_int("steps", steps)
    a, b, c = _check_coefficients(coefficients)
    check_number("eps", eps, positive=True)
    _check_ns_dtype(dtype)
    dtype = dtype or torch.promote_types(update.dtype, torch.float32)
    x = update.to(dtype)  # (out, in)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # (n, m), n <= m: the Gram matrix X X^T is then the smaller one
    x = x / (x.norm() + eps)  # Frobenius norm >= the largest singular value: all of them now <= 1
    for _ in range(steps):
        gram = x @ x.T  # A = X X^T, (n, n)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A A, (n, n)
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A A) X, (n, m)
    return x.T if tall else x  # (out, in)


def muon_lr_scale(shape: tuple[int, ...] | torch.Size, adjust_lr_fn: str | None = None) -> float:
    """The factor s on Muon's learning rate for a weight of `shape` (out, in) (chapter 11).

    None or "original": sqrt(max(1, out / in)) (Keller Jordan's); "match_rms_adamw": 0.2 sqrt(max(out, in))
    (Moonshot's). The same rule as torch.optim.Muon's `adjust_lr_fn`.
    """
    if adjust_lr_fn not in ADJUST_LR_FNS:
        raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weight matrices, Newton-Schulz in float32 (chapter 11; the update in the module's docstring).

    The same update as `torch.optim.Muon` (same defaults for momentum, Nesterov, coefficients, steps, eps and
    `adjust_lr_fn`) with two differences: Newton-Schulz runs in float32 (float64 for float64 weights, or
    `ns_dtype`) instead of bfloat16, and the matrix is divided by ||U||_F + eps as the published code does,
    where torch divides by max(||U||_F, eps) (the same unless ||U||_F is near eps). lr and weight_decay default
    to Keller Jordan's 0.02 and 0 (torch's: 1e-3 and 0.1). Parameters without a gradient are skipped.

    Args:
        params: 2-D weight matrices (or parameter groups, or (name, parameter) pairs).
        lr: the learning rate, in units of the orthogonalised update (times `muon_lr_scale`).
        momentum: beta in [0, 1).
        nesterov: step along (1 - beta) G + beta M instead of M.
        weight_decay: decoupled: W <- W (1 - lr weight_decay) before the step.
        ns_steps, ns_coefficients, eps: Newton-Schulz's (`newton_schulz`).
        adjust_lr_fn: the shape scaling, None / "original" or "match_rms_adamw" (`muon_lr_scale`).
        ns_dtype: where Newton-Schulz computes (None: float32, float64 for float64 weights).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_steps: int = NS_STEPS,
        adjust_lr_fn: str | None = None,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = EPS,
        ns_dtype: torch.dtype | None = None,
    ) -> None:
        check_number("lr", lr, non_negative=True)  # 0 is allowed: a schedule may end there
        check_probability("momentum", momentum)
        check_bool("nesterov", nesterov)
        check_number("weight_decay", weight_decay, non_negative=True)
        check_positive_int("ns_steps", ns_steps)
        if adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")
        ns_coefficients = _check_coefficients(ns_coefficients)
        check_number("eps", eps, positive=True)
        _check_ns_dtype(ns_dtype)
        if isinstance(params, Tensor):
            raise TypeError(
                "params must be an iterable of parameters (e.g. [weight] or model.parameters()), got one tensor"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_coefficients=ns_coefficients,
            eps=eps,
            ns_dtype=ns_dtype,
        )
        super().__init__(params, defaults)
        for g, group in enumerate(self.param_groups):
            names = group.get("param_names", [f"params[{i}] of group {g}" for i in range(len(group["params"]))])
            for name, p in zip(names, group["params"], strict=True):
                if p.dim() != 2:
                    raise ValueError(
                        f"Muon updates 2-D weight matrices only, but {name} has shape {tuple(p.shape)}: give it to "
                        "AdamW instead (make_muon splits a model's parameters by role)"
                    )
                if not p.is_floating_point():
                    raise TypeError(f"Muon needs floating-point weights, but {name} has dtype {p.dtype}")

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """One Muon step on every parameter that has a gradient; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, beta, decay = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad  # G, (out, in)
                if grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients (nn.Embedding(sparse=True)): use AdamW")
                state = self.state[p]
                if "momentum_buffer" not in state:  # torch.optim.Muon's name, so the states read alike
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]  # M, (out, in)
                buffer.lerp_(grad, 1 - beta)  # M <- beta M + (1 - beta) G
                update = grad.lerp(buffer, beta) if group["nesterov"] else buffer  # U, (out, in); G is not changed
                ortho = newton_schulz(
                    update, group["ns_steps"], group["ns_coefficients"], group["eps"], group["ns_dtype"]
                )
                p.mul_(1 - lr * decay)  # decoupled weight decay, with the unscaled lr (as torch and Keller)
                p.add_(ortho, alpha=-lr * muon_lr_scale(p.shape, group["adjust_lr_fn"]))
        return loss


def _reference_step(
    weight: Tensor,
    grad: Tensor,
    buffer: Tensor,
    *,
    lr: float,
    momentum: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.0,
    ns_steps: int = NS_STEPS,
    adjust_lr_fn: str | None = None,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = EPS,
) -> tuple[Tensor, Tensor]:
    """The published Muon update written out plainly in float64, to check `Muon` (and the chapter's exercise).

    Keller Jordan's muon.py (zeropower_via_newtonschulz5, muon_update) line by line, with no in-place
    operations and no fused matmuls. Returns (the new weight, the new momentum buffer), both float64.
    """
    w, g, m = weight.double(), grad.double(), buffer.double()
    m = momentum * m + (1 - momentum) * g  # momentum.lerp_(grad, 1 - beta)
    u = (1 - momentum) * g + momentum * m if nesterov else m  # grad.lerp_(momentum, beta)
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / (torch.linalg.matrix_norm(x) + eps)
    a, b, c = coefficients
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    o = x.T if u.shape[0] > u.shape[1] else x
    w = w * (1 - lr * weight_decay) - lr * muon_lr_scale(w.shape, adjust_lr_fn) * o
    return w, m


# ---------------------------------------------------------------------------------------------
# A model's parameters by role, and one optimizer for both halves
# ---------------------------------------------------------------------------------------------

MUON, ADAMW, ADAMW_NO_DECAY = "muon", "adamw", "adamw_no_decay"


def parameter_roles(model: nn.Module, blocks: str = "layers") -> dict[str, str]:
    """Which optimizer trains each parameter of `model`, by its role in the model (chapter 11).

    "muon": the weight of every nn.Linear inside the blocks (`model.<blocks>`: attention's and the MLP's
    projections); "adamw": every other matrix, the embeddings (token and position, although 2-D), the output
    head and any matrix outside the blocks (weight decay, as `make_adamw`); "adamw_no_decay": every parameter
    with fewer than 2 dimensions, gains, biases and norm weights. A matrix also used outside the blocks (tied)
    keeps AdamW. Frozen parameters (requires_grad False) are left out.

    Args:
        model: e.g. a `tl.gpt.GPT`.
        blocks: the name of the submodule that holds the blocks (`GPT.layers`).

    Returns:
        {parameter name: role}, in `model.named_parameters()` order.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(blocks, str):
        raise TypeError(f"blocks must be the name of the submodule holding the blocks (a str), got {blocks!r}")
    body = getattr(model, blocks, None)
    if not isinstance(body, nn.Module):
        raise ValueError(
            f"model ({type(model).__name__}) has no submodule {blocks!r} holding its blocks; pass blocks= with the "
            f"name of the one that does (its children: {[name for name, _ in model.named_children()]})"
        )
    hidden = {id(m.weight) for m in body.modules() if isinstance(m, nn.Linear) and m.weight.dim() == 2}
    # A matrix reached from outside the blocks (weight tying) plays that other role as well: AdamW.
    outside = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if not name.startswith(blocks + ".")}
    roles = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in hidden and id(p) not in outside:
            roles[name] = MUON
        else:
            roles[name] = ADAMW if p.dim() >= 2 else ADAMW_NO_DECAY
    return roles


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer made of a `Muon` and a `torch.optim.AdamW` over disjoint parameters (chapter 11).

    `param_groups` lists Muon's groups, then AdamW's (the same dicts: setting group["lr"] reaches the inner
    optimizer), so a learning-rate schedule, `torch.optim.lr_scheduler` included, drives both. `step` and
    `zero_grad` act on both; `state_dict()` is {"muon": ..., "adamw": ...}, which `load_state_dict` reads back.
    The per-parameter states live in `.muon.state` and `.adamw.state`.

    Args:
        muon: the optimizer of the hidden matrices: a `Muon`, or a `torch.optim.Muon` to compare with.
        adamw: the optimizer of everything else.
    """

    def __init__(self, muon: Muon | torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        if not isinstance(muon, (Muon, torch.optim.Muon)):
            raise TypeError(f"muon must be a tl.muon.Muon or a torch.optim.Muon, got {type(muon).__name__}")
        if not isinstance(adamw, torch.optim.AdamW):
            raise TypeError(f"adamw must be a torch.optim.AdamW, got {type(adamw).__name__}")
        self.muon, self.adamw = muon, adamw
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})  # checks that they are disjoint

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """Muon's step on the matrices, then AdamW's on the rest; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def __getstate__(self) -> dict[str, Any]:  # copy.deepcopy and pickle keep the two optimizers
        return {**super().__getstate__(), "muon": self.muon, "adamw": self.adamw}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        if not isinstance(state_dict, dict) or set(state_dict) != {"muon", "adamw"}:
            shown = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(
                f"state_dict must be a MuonAdamW's state_dict(), a dict with the keys 'muon' and 'adamw', got {shown}"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        # Loading gives the inner optimizers new group dicts: share them again.
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def make_muon(
    model: nn.Module,
    lr: float = 0.02,
    adamw_lr: float = 1e-3,
    *,
    momentum: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.0,
    ns_steps: int = NS_STEPS,
    adjust_lr_fn: str | None = None,
    adamw_weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    blocks: str = "layers",
    adamw_fused: bool | None = None,
) -> MuonAdamW:
    """Muon for the model's hidden matrices, AdamW for the rest, split by `parameter_roles` (chapter 11).

    Args:
        model: e.g. a `tl.gpt.GPT`.
        lr, momentum, nesterov, weight_decay, ns_steps, adjust_lr_fn: Muon's (see `Muon`).
        adamw_lr, adamw_weight_decay, betas: AdamW's, as `tl.training.make_adamw` (decay on the matrices only).
        blocks: the submodule holding the blocks (`parameter_roles`).
        adamw_fused: AdamW's `fused`, as `make_adamw`'s: None, PyTorch's fused kernel on a CPU or a CUDA GPU.

    Returns:
        a `MuonAdamW`; its groups carry the parameters' names ("param_names").
    """
    roles = parameter_roles(model, blocks)
    check_number("adamw_lr", adamw_lr, non_negative=True)
    check_number("adamw_weight_decay", adamw_weight_decay, non_negative=True)
    _check_betas(betas)
    named = dict(model.named_parameters())
    by_role = {role: [(n, named[n]) for n, r in roles.items() if r == role] for role in (MUON, ADAMW, ADAMW_NO_DECAY)}
    if not by_role[MUON]:
        raise ValueError(
            f"model.{blocks} holds no nn.Linear weight for Muon to train; use tl.training.make_adamw for this model"
        )
    muon = Muon(
        by_role[MUON],
        lr=lr,
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
        ns_steps=ns_steps,
        adjust_lr_fn=adjust_lr_fn,
    )
    groups = [
        {"params": by_role[ADAMW], "weight_decay": adamw_weight_decay},
        {"params": by_role[ADAMW_NO_DECAY], "weight_decay": 0.0},
    ]
    fused = use_fused_adamw([p for g in groups for _, p in g["params"]], adamw_fused)
    adamw = torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=adamw_lr, betas=(float(betas[0]), float(betas[1])), fused=fused
    )
    return MuonAdamW(muon, adamw)
