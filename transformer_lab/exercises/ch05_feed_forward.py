"""Exercises of chapter 05, the feed-forward network (前馈神经网络) and residual connections (残差连接):
notebooks/05_feed_forward_and_residuals.ipynb.

1. `predict_ffn_parameters`: the parameter count of `tl.FeedForward(512, 2048)` (easy, predict).
2. `layer_ffn`: note 000's layer FFN, built from the config with hidden width d_model, fixed (medium, debug the notes).
3. `block_gradient_norms`: the per-block gradient norms of a stack, with or without residual paths (medium, build).
4. `predict_swiglu_width`: the hidden width of a SwiGLU FFN with exactly tl.FeedForward(512, 2048)'s
   parameter count (harder, predict).
5. `swiglu_feed_forward`: the gated FFN that note 003's "third linear layer" comment describes (harder, transfer).

Shape legend: B batch, T sequence length, D d_model, F d_ff, h a SwiGLU's hidden width, L number of blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab import diagnostics
from transformer_lab.exercises.core import Case, Exercise, Mistake
from transformer_lab.feedforward import FeedForward

__all__ = [
    "predict_ffn_parameters",
    "layer_ffn",
    "notes_layer_ffn",
    "block_gradient_norms",
    "predict_swiglu_width",
    "swiglu_feed_forward",
]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- 1. predict: how many parameters in tl.FeedForward(512, 2048)? -----------------------------------------


def _ffn_parameters_reference() -> int:
    weights = 512 * 2048 + 2048 * 512  # W_1 (F, D) and W_2 (D, F)
    biases = 2048 + 512  # b_1 (F,) and b_2 (D,)
    return weights + biases  # 2,099,712


predict_ffn_parameters = Exercise(
    "predict_ffn_parameters",
    reference=_ffn_parameters_reference,
    cases=[Case("your count for tl.FeedForward(512, 2048)", lambda: ())],
    hints=[
        "Count each nn.Linear on its own: a weight matrix and a bias vector. tl.FeedForward has two of them.",
        "nn.Linear(n_in, n_out) stores an (n_out, n_in) weight and an (n_out,) bias. The first layer maps "
        "512 -> 2048, the second 2048 -> 512.",
        "The two weight matrices hold 512 * 2048 numbers each; the biases have as many entries as each layer has "
        "outputs. Add the four up.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: 2 * 512 * 2048, lambda: 512 * 2048 + 2048 + 512, lambda: 2 * 512 * 2048 + 2 * 512],
    why=(
        "2 x 512 x 2048 = 2,097,152 weights and 2048 + 512 = 2,560 biases: 2,099,712. The weights are nearly all "
        "of it; a multi-head attention of d_model 512 has about half as many (4 x 512 x 512 + 4 x 512)."
    ),
    explain={
        2 * 512 * 2048: "those are the two weight matrices. Each nn.Linear also has a bias (bias=True by default).",
        512 * 2048 + 2048 + 512: "there are two weight matrices, one per layer: 512 -> 2048 and 2048 -> 512.",
        2 * 512 * 2048 + 2 * 512: "a bias has one entry per OUTPUT of its layer: how many outputs has the first?",
        2 * 512 * 2048 + 2 * 2048: "a bias has one entry per OUTPUT of its layer: how many outputs has the second?",
        512 * 512 * 2 + 512 * 2: "that is the FFN with hidden width 512. This one's hidden width is 2048.",
        512 * 2048: "that is one weight matrix. Count both layers, and their biases.",
        2 * 512 * 2048 + 2048: "the second layer has a bias too: one entry per output, and it has 512.",
        2 * 512 * 2048 + 512: "the first layer has a bias too: one entry per output, and it has 2048.",
    },
)


# --- 2. debug the notes: the layer's FFN must be d_ff wide -------------------------------------------------


def notes_layer_ffn(args: Any) -> nn.Module:
    """Note 000's `self.feed_forward = MLP(args.dim, args.dim, args.dropout)`, with its MLP: no biases, ReLU,
    dropout after the second layer."""
    return nn.Sequential(
        nn.Linear(args.dim, args.dim, bias=False),  # w1: dim -> hidden_dim, with hidden_dim = args.dim
        nn.ReLU(),
        nn.Linear(args.dim, args.dim, bias=False),  # w2: hidden_dim -> dim
        nn.Dropout(args.dropout),
    )


def _layer_ffn_reference(args: Any) -> nn.Module:
    d_ff = 4 * args.dim  # the hidden width: 2048 for dim 512 (the paper), 4 * n_embd in GPT (note 004)
    return nn.Sequential(
        nn.Linear(args.dim, d_ff, bias=False),  # w1: (..., D) -> (..., F)
        nn.ReLU(),
        nn.Linear(d_ff, args.dim, bias=False),  # w2: (..., F) -> (..., D)
        nn.Dropout(args.dropout),  # after the second layer, as note 000's MLP has it
    )


def _fill(module: nn.Module) -> None:
    """Give every parameter fixed values that depend only on its shape (so any layout of the same layers agrees)."""
    with torch.no_grad():
        for p in module.parameters():
            seed = 1 + sum(size * 1000**i for i, size in enumerate(p.shape))
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=_generator(seed), dtype=p.dtype) / fan_in**0.5)


def _describe_ffn(candidate: Any, args: Any, x: Tensor) -> tuple[int, list[tuple[int, ...]], Tensor]:
    """Build the candidate's FFN from `args` and describe it: its parameter count and shapes, and its output on
    `x` in eval mode with every parameter set by `_fill` (the exercise's output_names name each part)."""
    module = candidate(args)
    if not isinstance(module, nn.Module):
        raise TypeError(f"layer_ffn should return an nn.Module (e.g. an nn.Sequential), got {type(module).__name__}")
    shapes = sorted(tuple(p.shape) for p in module.parameters())
    _fill(module)
    module.eval()  # dropout off
    with torch.no_grad():
        out = module(x)
    return sum(math.prod(s) for s in shapes), shapes, out


def _ffn_case(dim: int, dropout: float, shape: tuple[int, ...], seed: int) -> tuple[Any, Tensor]:
    args = SimpleNamespace(dim=dim, n_embd=dim, n_layer=6, dropout=dropout)  # fields of note 000's config
    return args, torch.randn(*shape, dim, generator=_generator(seed))


def _ffn_with_biases(args):  # noqa: ANN001, ANN202
    d_ff = 4 * args.dim
    return nn.Sequential(nn.Linear(args.dim, d_ff), nn.ReLU(), nn.Linear(d_ff, args.dim), nn.Dropout(args.dropout))


def _ffn_fixed_width(args):  # noqa: ANN001, ANN202
    return nn.Sequential(  # the paper's 2048 written in, whatever dim is
        nn.Linear(args.dim, 2048, bias=False), nn.ReLU(), nn.Linear(2048, args.dim, bias=False), nn.Dropout(0.0)
    )


def _ffn_twice_as_wide(args):  # noqa: ANN001, ANN202
    d_ff = 2 * args.dim
    return nn.Sequential(
        nn.Linear(args.dim, d_ff, bias=False), nn.ReLU(), nn.Linear(d_ff, args.dim, bias=False), nn.Dropout(0.0)
    )


def _ffn_gelu(args):  # noqa: ANN001, ANN202
    d_ff = 4 * args.dim
    return nn.Sequential(
        nn.Linear(args.dim, d_ff, bias=False), nn.GELU(), nn.Linear(d_ff, args.dim, bias=False), nn.Dropout(0.0)
    )


layer_ffn = Exercise(
    "layer_ffn",
    reference=_layer_ffn_reference,
    cases=[
        Case("the paper's size: dim = 512", lambda: _ffn_case(512, 0.1, (2, 3), 0)),
        Case("dim = 8, a batch of 2 sequences of 5 tokens", lambda: _ffn_case(8, 0.1, (2, 5), 1)),
        Case("dim = 3, no dropout, one sequence without a batch axis", lambda: _ffn_case(3, 0.0, (4,), 2)),
        Case("dim = 1", lambda: _ffn_case(1, 0.0, (2, 2), 3)),
    ],
    run=_describe_ffn,
    output_names=[
        "the number of parameters of your module",
        "the shapes of your module's parameters",
        "your module's output",
    ],
    hints=[
        "The shapes fit whatever the hidden width is: print the parameter count of notes_layer_ffn(args) next to "
        "that of tl.FeedForward(512, 2048). Which number in notes_layer_ffn is the hidden width?",
        "The hidden width should be d_ff, not args.dim. The notes' config has no field for it: use the paper's and "
        "GPT's rule, d_ff = 4 * dim (2048 for dim 512).",
        "Keep everything else of note 000's MLP: bias=False, ReLU, dropout after the second layer. Only the two "
        "Linear layers change: dim -> d_ff, then d_ff -> dim.",
    ],
    level="medium",
    kind="debug",
    mistakes=[
        Mistake(
            notes_layer_ffn,
            "The hidden layer is still as wide as the model (dim): the shapes fit, but the paper's FFN first widens "
            "each vector to d_ff, several times dim (section 1).",
        ),
        Mistake(
            _ffn_fixed_width,
            "The hidden width is 2048 whatever dim is: that is the paper's d_ff for dim 512 only; the hidden width "
            "grows with the model's width.",
        ),
        Mistake(
            _ffn_twice_as_wide,
            "The hidden width is twice dim: wider than the notes', but not the ratio of d_ff to d_model that the "
            "paper and GPT use (section 1).",
        ),
        Mistake(
            _ffn_with_biases,
            "Your Linear layers have biases: note 000's MLP has none, and the exercise keeps everything of it but "
            "the one slip.",
        ),
        Mistake(
            _ffn_gelu,
            "GELU in place of ReLU: the parameters are right, but note 000's MLP, like the paper's FFN, uses ReLU, "
            "and the exercise keeps it.",
        ),
    ],
    forbidden=[FeedForward, nn.TransformerEncoderLayer],
    shortcuts=[
        lambda args: FeedForward(args.dim, 4 * args.dim, args.dropout),
        lambda args: getattr(__import__("transformer_lab"), "Feed" + "Forward")(args.dim, 4 * args.dim),
    ],
)


# --- 3. build: the gradient norm of each block of a stack --------------------------------------------------


def _gradient_norms_reference(blocks: Sequence[nn.Module], x: Tensor, target: Tensor, residual: bool) -> list[float]:
    h = x  # (..., D)
    for block in blocks:
        h = h + block(h) if residual else block(h)  # (..., D): with the residual path, or through the block only
    loss = ((h - target) ** 2).mean()  # mean squared error, a scalar
    loss.backward()  # fills p.grad of every parameter
    norms = []
    for block in blocks:  # block 1 (nearest the input) first
        squares = sum((p.grad**2).sum() for p in block.parameters() if p.grad is not None)
        norms.append(math.sqrt(float(squares)))  # the L2 norm of all the block's gradients together
    return norms


def _with_grad(candidate: Any, *inputs: Any) -> Any:
    """Run the candidate with autograd on, as in a notebook (the checker runs other exercises under no_grad).
    L numbers in a tuple or a 1-d tensor count as the list of floats the text asks for."""
    with torch.enable_grad():
        out = candidate(*inputs)
    if isinstance(out, Tensor) and out.dim() == 1 and out.is_floating_point():
        out = out.tolist()
    if isinstance(out, tuple):
        out = list(out)
    return out


def _stack_case(n_blocks: int, d_model: int, shape: tuple[int, ...], residual: bool, seed: int) -> tuple[Any, ...]:
    g = _generator(seed)
    blocks = [
        nn.Sequential(
            nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.ReLU(), nn.Linear(4 * d_model, d_model)
        )
        for _ in range(n_blocks)
    ]
    with torch.no_grad():  # the weights drawn from the case's own generator (the global one is left alone)
        for block in blocks:
            for p in block.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 4.0))
    x = torch.randn(*shape, d_model, generator=g)
    target = torch.randn(*shape, d_model, generator=g)
    return blocks, x, target, residual


def _norms_parts(blocks, x, target, residual, loss_fn=None, params=None):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = h + block(h) if residual else block(h)
    loss = (loss_fn or (lambda d: (d**2).mean()))(h - target)
    loss.backward()
    pick = params or (lambda block: list(block.parameters()))
    return [math.sqrt(sum(float((p.grad**2).sum()) for p in pick(block))) for block in blocks]


def _norms_no_residual(blocks, x, target, residual):  # noqa: ANN001, ANN202
    return _norms_parts(blocks, x, target, False)


def _norms_input_added(blocks, x, target, residual):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = x + block(h) if residual else block(h)  # the stack's input added back, not the block's own
    ((h - target) ** 2).mean().backward()
    return [math.sqrt(sum(float((p.grad**2).sum()) for p in block.parameters())) for block in blocks]


def _norms_summed_loss(blocks, x, target, residual):  # noqa: ANN001, ANN202
    return _norms_parts(blocks, x, target, residual, loss_fn=lambda d: (d**2).sum())


def _norms_top_first(blocks, x, target, residual):  # noqa: ANN001, ANN202
    return _norms_parts(blocks, x, target, residual)[::-1]


def _norms_weights_not_gradients(blocks, x, target, residual):  # noqa: ANN001, ANN202
    return [math.sqrt(sum(float((p.detach() ** 2).sum()) for p in block.parameters())) for block in blocks]


def _norms_matrices_only(blocks, x, target, residual):  # noqa: ANN001, ANN202
    return _norms_parts(blocks, x, target, residual, params=lambda b: [p for p in b.parameters() if p.dim() == 2])


def _norms_added_up(blocks, x, target, residual):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = h + block(h) if residual else block(h)
    ((h - target) ** 2).mean().backward()
    return [sum(float(p.grad.norm()) for p in block.parameters()) for block in blocks]  # norms added, not squares


def _norms_with_library(blocks, x, target, residual):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = h + block(h) if residual else block(h)
    F.mse_loss(h, target).backward()
    return diagnostics.gradient_norms(blocks)


def _norms_with_clipping(blocks, x, target, residual):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = h + block(h) if residual else block(h)
    F.mse_loss(h, target).backward()
    clip = nn.utils.clip_grad_norm_
    return [float(clip(block.parameters(), math.inf)) for block in blocks]


block_gradient_norms = Exercise(
    "block_gradient_norms",
    reference=_gradient_norms_reference,
    cases=[
        Case("3 blocks with the residual path", lambda: _stack_case(3, 4, (2, 3), True, 0)),
        Case("the same 3 blocks without it", lambda: _stack_case(3, 4, (2, 3), False, 0)),
        Case(
            "8 blocks without the residual path (block 1 gets much less)", lambda: _stack_case(8, 6, (2, 4), False, 1)
        ),
        Case("8 blocks with it", lambda: _stack_case(8, 6, (2, 4), True, 1)),
        Case("a single block, inputs without a batch axis", lambda: _stack_case(1, 5, (3,), True, 2)),
    ],
    run=_with_grad,
    hints=[
        "Three steps: a forward pass through the blocks in order, one backward pass of the loss, then one number "
        "per block from the .grad of its parameters.",
        "The forward pass: h = x, then for each block h = h + block(h) (residual) or h = block(h). The loss is the "
        "MEAN of (h - target) ** 2 over all entries; loss.backward() fills p.grad for every parameter.",
        "A block's gradient norm is the square root of the sum, over ALL of its parameters (LayerNorm's too), of "
        "(p.grad ** 2).sum(). Return the numbers as a list of floats, block 1 first.",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _norms_no_residual,
            "The residual path is missing: with residual=True the blocks were still chained one after the other "
            "without adding each block's input back, so the gradient of the first blocks shrinks.",
        ),
        Mistake(
            _norms_input_added,
            "With residual=True each block's output was added to the stack's input x, not to the block's own input: "
            "the residual path carries h forward, so every block adds its output to what the blocks below made.",
        ),
        Mistake(
            _norms_summed_loss,
            "The loss is the sum of the squared errors, not their mean: every gradient is as many times too large "
            "as the output has entries.",
        ),
        Mistake(
            _norms_top_first,
            "Your numbers are in reverse order: the list should start with block 1, the one nearest the input.",
        ),
        Mistake(
            _norms_weights_not_gradients,
            "Those are the norms of the blocks' parameter values, not of their gradients.",
        ),
        Mistake(
            _norms_matrices_only,
            "Only the weight matrices were counted: the biases and the LayerNorm's gamma and beta belong to the "
            "block too, and so do their gradients.",
        ),
        Mistake(
            _norms_added_up,
            "The norms of the separate parameters were added up: a block's norm takes all its gradients together, "
            "as one long vector, which is less than the sum of the parts' norms.",
        ),
    ],
    forbidden=[
        diagnostics.gradient_norms,
        diagnostics.deep_stack_gradient_norms,
        diagnostics.FeedForwardStack,
        nn.utils.clip_grad_norm_,
        *([nn.utils.get_total_norm] if hasattr(nn.utils, "get_total_norm") else []),
    ],
    shortcuts=[_norms_with_library, _norms_with_clipping],
)


# --- 4. predict: the hidden width of a SwiGLU FFN of the same size ----------------------------------------


def _swiglu_width_reference() -> int:
    relu_ffn = 2 * 512 * 2048 + 2048 + 512  # tl.FeedForward(512, 2048): two matrices and two biases
    per_unit = 3 * 512  # one hidden unit of a bias-free SwiGLU: a row of W1, a row of W3, a column of W2
    return relu_ffn // per_unit  # 2,099,712 / 1,536 = 1367 exactly


predict_swiglu_width = Exercise(
    "predict_swiglu_width",
    reference=_swiglu_width_reference,
    cases=[Case("your hidden width h", lambda: ())],
    hints=[
        "Count the parameters of the SwiGLU FFN as a function of h, and set it equal to tl.FeedForward(512, 2048)'s "
        "count (exercise 1).",
        "Three bias-free matrices, W1 and W3 of shape (h, 512) and W2 of shape (512, h): 3 x 512 x h parameters. "
        "The ReLU FFN has two matrices AND two biases.",
        "Solve 3 x 512 x h = 2 x 512 x 2048 + 2048 + 512 for h. (It comes out a whole number.)",
    ],
    level="harder",
    kind="predict",
    wrong=[lambda: 1365, lambda: 2048, lambda: 1024, lambda: 1366],
    why=(
        "3 x 512 x h = 2,099,712 gives h = 1367: the biases of the ReLU FFN (2,560 numbers) buy the SwiGLU 2 more "
        "hidden units than the 2/3 x 2048 = 1365.3 of a bias-free comparison. LLaMA-style models use that 2/3 rule, "
        "then round h up to a multiple of 256 or so for fast matrix products."
    ),
    explain={
        1365: "that is 2/3 of 2048, rounded: it matches a ReLU FFN WITHOUT biases. tl.FeedForward has biases.",
        1366: "close: 2/3 of 2048 rounded up. Count tl.FeedForward's biases into its size too.",
        2048: "at the same width the three matrices hold 1.5 times the two matrices' parameters. Narrower, then.",
        1024: "half the width would make 3 matrices hold 3/4 of the ReLU FFN's parameters. Count again.",
        3072: "the SwiGLU has MORE matrices, so at the same size it must be narrower, not wider.",
        683: (
            "683 is 2048 / 3: the three matrices would then hold only half of the ReLU FFN's parameters. "
            "Set them equal to all of it."
        ),
    },
)


# --- 5. transfer: the SwiGLU FFN ---------------------------------------------------------------------------


def _swiglu_reference(x: Tensor, w1: Tensor, w3: Tensor, w2: Tensor) -> Tensor:
    a = x @ w1.T  # (..., D) @ (D, h) -> (..., h)
    gate = a * torch.sigmoid(a)  # SiLU(a) = a * sigmoid(a), element-wise
    up = x @ w3.T  # (..., h): the "third linear layer" of note 003's comment
    return (gate * up) @ w2.T  # (..., h) @ (h, D) -> (..., D)


def _swiglu_inputs(shape: tuple[int, ...], hidden: int, seed: int, offset: float = 0.0) -> tuple[Tensor, ...]:
    g = _generator(seed)
    d = shape[-1]
    return (
        torch.randn(*shape, generator=g) + offset,
        torch.randn(hidden, d, generator=g) / d**0.5,
        torch.randn(hidden, d, generator=g) / d**0.5,
        torch.randn(d, hidden, generator=g) / hidden**0.5,
    )


def _swiglu_gate_swapped(x, w1, w3, w2):  # noqa: ANN001, ANN202
    b = x @ w3.T
    return (b * torch.sigmoid(b) * (x @ w1.T)) @ w2.T


def _swiglu_relu(x, w1, w3, w2):  # noqa: ANN001, ANN202
    return (torch.relu(x @ w1.T) * (x @ w3.T)) @ w2.T


def _swiglu_sigmoid_gate(x, w1, w3, w2):  # noqa: ANN001, ANN202
    return (torch.sigmoid(x @ w1.T) * (x @ w3.T)) @ w2.T  # GLU: a sigmoid gate, not SiLU


def _swiglu_no_gate(x, w1, w3, w2):  # noqa: ANN001, ANN202
    a = x @ w1.T
    return (a * torch.sigmoid(a)) @ w2.T  # w3 is never used: a two-layer FFN with SiLU


def _swiglu_silu_after_product(x, w1, w3, w2):  # noqa: ANN001, ANN202
    a = (x @ w1.T) * (x @ w3.T)
    return (a * torch.sigmoid(a)) @ w2.T


def _swiglu_sign_flipped(x, w1, w3, w2):  # noqa: ANN001, ANN202
    a = x @ w1.T
    return (a / (1 + torch.exp(a)) * (x @ w3.T)) @ w2.T  # a * sigmoid(-a): the sign in the exponent flipped


swiglu_feed_forward = Exercise(
    "swiglu_feed_forward",
    reference=_swiglu_reference,
    cases=[
        Case("a (2, 3, 4) batch, h = 6", lambda: _swiglu_inputs((2, 3, 4), 6, 0)),
        Case("D = 6 and h = 16, the 2/3 of d_ff = 24", lambda: _swiglu_inputs((2, 5, 6), 16, 1)),
        Case("one position, shape (8,), h = 11", lambda: _swiglu_inputs((8,), 11, 2)),
        Case("inputs far below zero (SiLU is not ReLU there)", lambda: _swiglu_inputs((3, 4), 5, 3, offset=-2.0)),
    ],
    hints=[
        "Two branches read the same x: one goes through SiLU and then gates the other, element by element; W2 "
        "brings the product back to width D. No biases anywhere.",
        "The weights are laid out as nn.Linear stores them: x @ w1.T is (..., h). SiLU(a) is a * sigmoid(a); "
        "torch.sigmoid is allowed, F.silu and nn.SiLU are the finished version.",
        "a = x @ w1.T and b = x @ w3.T, both (..., h). Multiply SiLU(a) with b element-wise, then apply w2 "
        "the same way as w1.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _swiglu_gate_swapped,
            "w1 and w3 swapped roles: SiLU went on the w3 branch, but in the formula of section 6 it is W1's branch "
            "that passes through SiLU and gates the other.",
        ),
        Mistake(
            _swiglu_relu,
            "ReLU in place of SiLU: the two agree on large positive inputs only; SiLU is smooth and lets a little "
            "of the negative side through.",
        ),
        Mistake(
            _swiglu_sigmoid_gate,
            "The gate is the sigmoid of W1's branch alone, the gate of the original GLU; SiLU multiplies that "
            "sigmoid by its input as well.",
        ),
        Mistake(
            _swiglu_no_gate,
            "w3 is never used: that is a two-layer FFN with SiLU, with no second branch for the gate to act on.",
        ),
        Mistake(
            _swiglu_silu_after_product,
            "SiLU was applied after the product of the two branches; in SwiGLU it acts on one branch only, before "
            "the product.",
        ),
        Mistake(
            _swiglu_sign_flipped,
            "The sign in your SiLU's exponential is flipped: a / (1 + exp(a)) is a times sigmoid(-a), which damps "
            "the positive inputs instead of the negative ones.",
        ),
    ],
    forbidden=["silu", "glu"],
    shortcuts=[
        lambda x, w1, w3, w2: (
            (F.glu(torch.cat([x @ w1.T, x @ w1.T], dim=-1)) * (x @ w3.T)) @ w2.T
        ),  # glu(a, a) = SiLU(a)
        lambda x, w1, w3, w2: (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T,
        lambda x, w1, w3, w2: (nn.SiLU()(x @ w1.T) * (x @ w3.T)) @ w2.T,
        lambda x, w1, w3, w2: (getattr(F, "si" + "lu")(x @ w1.T) * (x @ w3.T)) @ w2.T,
    ],
)
