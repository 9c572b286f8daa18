"""The Muon optimizer for the hidden weight matrices, AdamW for the rest (chapter 11).

The code lives in `transformer_lab.optim` (the course's optimizers in one module, with chapter 10's AdamW); this
module keeps chapter 11's names, `tl.muon.Muon`, `tl.muon.make_muon` and the rest, which it re-exports. Read
`tl.optim`'s docstring for the update, the Newton-Schulz iteration and the measured speeds.
"""

from __future__ import annotations

from transformer_lab.optim import (
    ADAMW,
    ADAMW_NO_DECAY,
    ADJUST_LR_FNS,
    EPS,
    MUON,
    NS_COEFFICIENTS,
    NS_STEPS,
    Muon,
    MuonAdamW,
    _check_coefficients,
    _check_ns_dtype,
    _reference_step,
    make_muon,
    muon_lr_scale,
    newton_schulz,
    parameter_roles,
)

__all__ = [
    "NS_COEFFICIENTS",
    "newton_schulz",
    "muon_lr_scale",
    "Muon",
    "parameter_roles",
    "MuonAdamW",
    "make_muon",
]
# chapter 11's exercises and tests read these private names here too
_PRIVATE = (ADAMW, ADAMW_NO_DECAY, ADJUST_LR_FNS, EPS, MUON, NS_STEPS)
_PRIVATE_FUNCTIONS = (_check_coefficients, _check_ns_dtype, _reference_step)
