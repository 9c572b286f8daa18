"""Exercises of chapter 09 (the full model): the Noam learning rate, shifted targets, the
label-smoothed loss, and the parameter count of a Transformer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab.exercises.core import Case, Exercise
from transformer_lab.training import label_smoothed_loss as _label_smoothed_loss
from transformer_lab.training import noam_lr as _noam_lr

__all__ = ["noam_lr", "shift_targets", "label_smoothed_loss", "parameter_count"]


# --- 1. the Noam learning rate at a step ---------------------------------------------------


def _noam_reference(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    return float(_noam_lr(step, d_model, warmup, factor))


def _noam_max(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    return factor * d_model**-0.5 * max(step**-0.5, step * warmup**-1.5)


def _noam_no_dmodel(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    return factor * min(step**-0.5, step * warmup**-1.5)


noam_lr = Exercise(
    "noam_lr",
    _noam_reference,
    [
        Case("step 1 (the start of the warm-up)", lambda: (1, 512, 4000), atol=1e-12, rtol=1e-9),
        Case("during the warm-up", lambda: (1000, 512, 4000), atol=1e-12, rtol=1e-9),
        Case("at the peak (step == warmup)", lambda: (4000, 512, 4000), atol=1e-12, rtol=1e-9),
        Case("after the warm-up", lambda: (20000, 512, 4000), atol=1e-12, rtol=1e-9),
        Case("a small model with a scale factor", lambda: (50, 64, 200, 2.0), atol=1e-12, rtol=1e-9),
    ],
    hints=[
        """
    lr = factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5).
    The first term of the min wins after the warm-up, the second during it; they meet at step == warmup.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_noam_max, _noam_no_dmodel],
)


# --- 2. teacher forcing: decoder input and output from a padded target ----------------------


def _shift_reference(target: Tensor, bos_id: int, eos_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    b = target.shape[0]
    pad_column = torch.full((b, 1), pad_id, dtype=target.dtype)
    tgt_in = torch.cat([torch.full((b, 1), bos_id, dtype=target.dtype), target], dim=1)  # (B, T + 1)
    tgt_out = torch.cat([target, pad_column], dim=1)  # (B, T + 1)
    lengths = (target != pad_id).sum(dim=1)  # (B,)
    tgt_out[torch.arange(b), lengths] = eos_id  # EOS right after the last real token
    return tgt_in, tgt_out


def _shift_eos_at_end(target: Tensor, bos_id: int, eos_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    b = target.shape[0]
    tgt_in = torch.cat([torch.full((b, 1), bos_id, dtype=target.dtype), target], dim=1)
    tgt_out = torch.cat([target, torch.full((b, 1), eos_id, dtype=target.dtype)], dim=1)
    return tgt_in, tgt_out


def _shift_no_shift(target: Tensor, bos_id: int, eos_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    tgt_in, tgt_out = _shift_reference(target, bos_id, eos_id, pad_id)
    return tgt_out, tgt_out  # the decoder would see the token it must predict


shift_targets = Exercise(
    "shift_targets",
    _shift_reference,
    [
        Case("one full row", lambda: (torch.tensor([[7, 8, 9]]), 1, 2, 0)),
        Case("rows of different lengths, padded", lambda: (torch.tensor([[7, 8, 9, 5], [6, 4, 0, 0]]), 1, 2, 0)),
        Case("an empty target (all padding)", lambda: (torch.tensor([[5, 6], [0, 0]]), 1, 2, 0)),
        Case("other special ids", lambda: (torch.tensor([[10, 11, 3, 3], [12, 3, 3, 3]]), 0, 1, 3)),
    ],
    hints=[
        """
    Both outputs have T + 1 columns. tgt_in puts BOS in front of the target (the decoder's input is
    the answer shifted right). tgt_out is the target followed by EOS, then padding: EOS goes at
    column `length` of each row, where length = number of non-PAD tokens, not at the very end.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_shift_eos_at_end, _shift_no_shift],
)


# --- 3. the label-smoothed loss --------------------------------------------------------------


def _smoothing_reference(logits: Tensor, target: Tensor, pad_id: int, smoothing: float) -> Tensor:
    return _label_smoothed_loss(logits, target, pad_id, smoothing)


def _smoothing_pytorch(logits: Tensor, target: Tensor, pad_id: int, smoothing: float) -> Tensor:
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), target.reshape(-1), ignore_index=pad_id, label_smoothing=smoothing)


def _smoothing_counts_pad(logits: Tensor, target: Tensor, pad_id: int, smoothing: float) -> Tensor:
    log_p = logits.log_softmax(-1)
    v = logits.shape[-1]
    q = torch.full_like(log_p, smoothing / (v - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0
    return -(q * log_p).sum(-1).mean()  # averages over padded positions too


def _logits_case(seed: int, v: int = 6) -> tuple[Tensor, Tensor, int, float]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 4, v, generator=g)
    target = torch.randint(1, v, (2, 4), generator=g)
    target[1, 2:] = 0
    return logits, target, 0, 0.1


label_smoothed_loss = Exercise(
    "label_smoothed_loss",
    _smoothing_reference,
    [
        Case("no smoothing (plain cross-entropy)", lambda: (*_logits_case(0)[:3], 0.0)),
        Case("eps = 0.1 with padded positions", lambda: _logits_case(1)),
        Case("eps = 0.3, a bigger vocabulary", lambda: (*_logits_case(2, v=11)[:3], 0.3)),
    ],
    hints=[
        """
    Build q of shape (B, T, V): smoothing / (V - 2) everywhere, 1 - smoothing at the true token
    (scatter_), 0 in the PAD column. The loss at a position is -(q * log_softmax(logits)).sum(-1);
    average it over the positions whose target is not PAD only.
    """
    ],
    level="medium",
    kind="build",
    wrong=[_smoothing_pytorch, _smoothing_counts_pad],
)


# --- 4. the parameter count of a Transformer -------------------------------------------------


def _params_reference(vocab_size: int, d_model: int, d_ff: int, n_layers: int) -> int:
    d = d_model
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    ffn = d * d_ff + d_ff + d_ff * d + d  # two Linear layers with biases
    norm = 2 * d  # gamma and beta
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    embeddings = vocab_size * d  # one matrix, tied to the output projection
    return embeddings + n_layers * (encoder_layer + decoder_layer)


def _params_no_bias(vocab_size: int, d_model: int, d_ff: int, n_layers: int) -> int:
    d = d_model
    return vocab_size * d + n_layers * (3 * 4 * d * d + 2 * 2 * d * d_ff)


def _params_untied(vocab_size: int, d_model: int, d_ff: int, n_layers: int) -> int:
    return _params_reference(vocab_size, d_model, d_ff, n_layers) + 2 * vocab_size * d_model


parameter_count = Exercise(
    "parameter_count",
    _params_reference,
    [
        Case("a tiny model", lambda: (10, 4, 8, 1)),
        Case("the chapter's date model", lambda: (71, 64, 128, 2)),
        Case("the paper's base model (37000 tokens)", lambda: (37000, 512, 2048, 6)),
    ],
    hints=[
        """
    Count one encoder layer (self-attention: four d_model x d_model Linear layers with biases; the
    FFN: d_model -> d_ff -> d_model with biases; two LayerNorms of 2 * d_model each) and one decoder
    layer (two attentions, one FFN, three LayerNorms), times n_layers, plus ONE vocab_size x d_model
    embedding matrix shared by the source, the target and the output projection (Post-Norm: no final norm).
    """
    ],
    level="medium",
    kind="build",
    wrong=[_params_no_bias, _params_untied],
)
