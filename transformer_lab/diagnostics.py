"""Training diagnostics for chapter 05: gradient norms layer by layer, and Post-Norm vs Pre-Norm.

Two experiments that make the residual connection (残差连接) and the place of the LayerNorm visible:

- `deep_stack_gradient_norms`: a deep stack of feed-forward blocks, with and without the residual
  path; one backward pass; the gradient norm of every block's weights.
- `train_norm_placement`: the same small encoder stack trained with Post-Norm (the paper's figure,
  note 002's "Add & Norm") or Pre-Norm (the notes' code) on a small synthetic task, with the same
  seed, data and learning rate, with or without a learning-rate warm-up; returns the loss curve and
  the per-layer gradient norms. `compare_norm_placement` trains several such arms over several seeds.

Both are deterministic for a given seed on one thread, fast enough for a notebook (seconds), and
general: they build everything from the library's own modules.

Shape legend: B batch, T sequence length, D d_model, V vocabulary size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab._checks import check_bool, check_int, check_number, check_positive_int, trusted
from transformer_lab.embedding import PositionalEncoding, TokenEmbedding
from transformer_lab.encoder import Encoder
from transformer_lab.feedforward import FeedForward
from transformer_lab.normalization import LayerNorm

__all__ = [
    "gradient_norms",
    "FeedForwardStack",
    "deep_stack_gradient_norms",
    "reverse_task_batch",
    "ReverseTaskModel",
    "train_norm_placement",
    "compare_norm_placement",
]


def gradient_norms(modules: Sequence[nn.Module]) -> list[float]:
    """The L2 norm of the gradients of each module's parameters, after a backward pass (chapter 05).

    Args:
        modules: e.g. the layers of a stack; parameters without a gradient count as zero.

    Returns:
        one float per module: sqrt(sum over its parameters of sum(grad ** 2)).
    """
    if isinstance(modules, nn.Module):
        raise TypeError("modules must be a sequence of nn.Module (e.g. model.layers), got a single module")
    if not isinstance(modules, Iterable) or isinstance(modules, (str, bytes)):
        raise TypeError(f"modules must be a sequence of nn.Module (e.g. model.layers), got {type(modules).__name__}")
    per_module = []
    for i, module in enumerate(modules):
        if not isinstance(module, nn.Module):
            raise TypeError(f"modules[{i}] must be an nn.Module, got {type(module).__name__}")
        grads = [p.grad.detach() for p in module.parameters() if p.grad is not None]
        if not grads:
            per_module.append(None)
            continue
        # the norm of all gradients together = the norm of the per-parameter norms (in float64)
        norms = torch.stack([n.double() for n in torch._foreach_norm(grads)])
        per_module.append(torch.linalg.vector_norm(norms))
    known = [n for n in per_module if n is not None]
    values = iter(torch.stack(known).tolist() if known else [])  # one conversion for all modules
    return [0.0 if n is None else next(values) for n in per_module]


class FeedForwardStack(nn.Module):
    """`n_layers` feed-forward blocks, each `LayerNorm -> FeedForward`, with or without a residual path.

    With `residual=True` block i computes x + FFN(LN(x)) (Pre-Norm); with `residual=False` it computes
    FFN(LN(x)), so the signal and its gradient must pass through every block. Chapter 05 compares
    the gradient norms of the two.

    Shape:
        x (..., D) -> (..., D).
    """

    def __init__(self, d_model: int, d_ff: int, n_layers: int, residual: bool) -> None:
        super().__init__()
        check_positive_int("n_layers", n_layers)
        check_bool("residual", residual)  # a string such as "no" would be silently true
        self.residual = residual
        self.norms = nn.ModuleList(LayerNorm(d_model) for _ in range(n_layers))
        self.layers = nn.ModuleList(FeedForward(d_model, d_ff) for _ in range(n_layers))

    def forward(self, x: Tensor) -> Tensor:
        for norm, ffn in zip(self.norms, self.layers, strict=True):
            update = ffn(norm(x))  # (..., D)
            x = x + update if self.residual else update
        return x


def deep_stack_gradient_norms(
    n_layers: int, residual: bool, d_model: int = 32, d_ff: int = 128, seed: int = 0
) -> list[float]:
    """Per-block gradient norms of a freshly initialised `FeedForwardStack` after one backward pass.

    The loss is the mean squared error between the stack's output on random inputs and random
    targets, so every block gets a gradient. Block 1 is the one nearest the input.

    Returns:
        n_layers floats, the gradient norm of each block's FeedForward weights and biases.
    """
    check_positive_int("n_layers", n_layers)
    check_bool("residual", residual)
    check_int("seed", seed, 0)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    stack = FeedForwardStack(d_model, d_ff, n_layers, residual)
    x = torch.randn(8, 10, d_model, generator=generator)  # (B, T, D)
    target = torch.randn(8, 10, d_model, generator=generator)  # (B, T, D)
    loss = F.mse_loss(stack(x), target)
    loss.backward()
    return gradient_norms(list(stack.layers))


def reverse_task_batch(
    batch_size: int, length: int, vocab_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """A batch of the "reverse" task: the target at position t is the input token at position T-1-t.

    Tokens are drawn uniformly from [0, vocab_size). An encoder can solve it only by attending to the
    right position, so it needs attention and the positional encoding.

    Shape:
        returns tokens (B, T) and targets (B, T), int64.
    """
    for name, value in (("batch_size", batch_size), ("length", length), ("vocab_size", vocab_size)):
        check_positive_int(name, value)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), got {generator!r}"
        )
    tokens = torch.randint(0, vocab_size, (batch_size, length), generator=generator)  # (B, T)
    return tokens, tokens.flip(1)


class ReverseTaskModel(nn.Module):
    """Token embedding + positional encoding + `Encoder` + a linear read-out, for `train_norm_placement`.

    The embedding table starts as `tl.Transformer`'s does (N(0, 1/d_model), chapter 09), so that after the
    sqrt(d_model) scale the embedded tokens have the positional encoding's size and the positions are visible.
    """

    def __init__(
        self, vocab_size: int, d_model: int, n_heads: int, d_ff: int, n_layers: int, norm_first: bool, max_len: int
    ) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, d_model)
        self.position = PositionalEncoding(d_model, max_len=max_len)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, dropout=0.0, norm_first=norm_first)
        self.readout = nn.Linear(d_model, vocab_size)
        nn.init.normal_(self.embed.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.position(self.embed(tokens))  # (B, T, D)
        with trusted():  # the shapes are ours: skip the layers' per-call argument checks
            return self.readout(self.encoder(x))  # (B, T, V)


def train_norm_placement(
    norm_first: bool,
    lr: float,
    steps: int = 200,
    warmup_steps: int = 0,
    n_layers: int = 6,
    d_model: int = 32,
    n_heads: int = 4,
    d_ff: int = 64,
    vocab_size: int = 10,
    length: int = 8,
    batch_size: int = 32,
    seed: int = 0,
) -> dict[str, list[float] | list[list[float]]]:
    """Train the same small encoder on the reverse task, Post-Norm or Pre-Norm (chapter 05).

    The same seed gives the same initial weights (for both placements: the modules are created in the
    same order) and the same batches. The optimizer is Adam; the learning rate rises linearly over
    `warmup_steps` steps (0: no warm-up, the full rate from step 1) and then stays constant.

    Args:
        norm_first: True for Pre-Norm (the notes' code), False for Post-Norm (the paper's figure).
        lr: the peak learning rate.
        steps: optimizer steps.
        warmup_steps: length of the linear warm-up.

    Returns:
        {"loss": the training loss at each step (steps floats),
         "grad_norms": per-layer gradient norms at each step (steps lists of n_layers floats),
         "accuracy": token accuracy on a fixed held-out batch after training (one float, in a list)}.
    """
    sizes = {"steps": steps, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff}
    sizes |= {"vocab_size": vocab_size, "length": length, "batch_size": batch_size}
    for name, value in sizes.items():
        check_positive_int(name, value)
    check_bool("norm_first", norm_first)
    check_number("lr", lr, positive=True)  # NaN, inf or True would train on without a word
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
    check_int("seed", seed, 0)
    torch.manual_seed(seed)
    model = ReverseTaskModel(vocab_size, d_model, n_heads, d_ff, n_layers, norm_first, max_len=length)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    )
    data = torch.Generator().manual_seed(seed + 1)
    losses: list[float] = []
    grad_norms: list[list[float]] = []
    for _ in range(steps):
        tokens, targets = reverse_task_batch(batch_size, length, vocab_size, data)
        logits = model(tokens)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))  # (B*T, V) vs (B*T,)
        optimizer.zero_grad()
        loss.backward()
        losses.append(float(loss.detach()))
        grad_norms.append(gradient_norms(list(model.encoder.layers)))
        optimizer.step()
        schedule.step()
    held_out = torch.Generator().manual_seed(seed + 2)
    tokens, targets = reverse_task_batch(256, length, vocab_size, held_out)
    with torch.no_grad():
        accuracy = float((model(tokens).argmax(-1) == targets).float().mean())
    return {"loss": losses, "grad_norms": grad_norms, "accuracy": [accuracy]}


def compare_norm_placement(
    arms: Mapping[str, Mapping[str, Any]], seeds: Sequence[int] = (0, 1, 2), **setting: Any
) -> dict[str, list[dict[str, list[float] | list[list[float]]]]]:
    """Train every arm once per seed with `train_norm_placement` (chapter 05).

    For one seed every arm starts from the same initial weights and sees the same batches, so the arms
    differ only in what their keyword arguments change.

    Args:
        arms: {arm name: the keyword arguments of `train_norm_placement` that this arm sets}, e.g.
            {"Post-Norm": {"norm_first": False, "lr": 2e-2},
             "Post-Norm + warm-up": {"norm_first": False, "lr": 2e-2, "warmup_steps": 60}}.
            Each arm must set `norm_first` and `lr`.
        seeds: the seeds; each gives its own initial weights, batches and held-out batch.
        **setting: the keyword arguments shared by every arm (steps, n_layers, d_model, ...).

    Returns:
        {arm name: [the run of each seed, in the order of `seeds`]}, each run as `train_norm_placement`
        returns it.
    """
    if not isinstance(arms, Mapping) or not arms:
        raise TypeError(f"arms must be a non-empty dict {{name: keyword arguments}}, got {arms!r}")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise TypeError(f"seeds must be a non-empty list of ints, got {seeds!r}")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise TypeError(f"seeds must be ints, got {list(seeds)!r}")
    if "seed" in setting:
        raise ValueError("pass the seeds as seeds=(...), not seed= in the shared setting")
    for name, kwargs in arms.items():
        if not isinstance(kwargs, Mapping) or not {"norm_first", "lr"} <= set(kwargs):
            raise ValueError(f"arms[{name!r}] must be a dict that sets at least norm_first and lr, got {kwargs!r}")
        if "seed" in kwargs or set(kwargs) & set(setting):
            clash = sorted(({"seed"} & set(kwargs)) | (set(kwargs) & set(setting)))
            raise ValueError(f"arms[{name!r}] sets {clash}, which the seeds or the shared setting already set")
    return {
        name: [train_norm_placement(**kwargs, **setting, seed=seed) for seed in seeds] for name, kwargs in arms.items()
    }
