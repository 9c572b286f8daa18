"""Predict answers stored as salted hashes, for a student version of a graded class.

A "predict" exercise's answer is a small value (a shape, a count, a number, a word). A student version
must let its check say "right" or "wrong" without holding the answer in readable form, so it stores
`seal(answer, salt)`: the SHA-256 of the salt and the answer's canonical text. A candidate is right when
its own canonical text, or for a number one of its neighbours on the rounding grid, hashes to the same
digest (`opened`). Numbers are rounded to `DIGITS` significant digits, the grid that matches the check's
relative tolerance (1e-4), and a candidate one step away on that grid is accepted, as the check accepts a
value within its tolerance.

The exercise's "why" (said once the answer is right, and often stating it) is stored encrypted with a key
made from the answer's canonical text (`lock`/`unlock`), so only a right answer opens it.

What this cannot do: a predict answer is small. A student can try every plausible shape or count and
watch which one the check accepts, or compute the answer by running code; a hash only keeps the answer
from being read off the files. docs/teaching.md says what a predict exercise's points can prove.
"""

from __future__ import annotations

import decimal
import hashlib
import itertools
import json
import math
from typing import Any

import torch

__all__ = ["DIGITS", "seal", "opened", "lock", "unlock", "SealError"]

DIGITS = 5
MARK = "__sealed__"


class SealError(ValueError):
    """An answer of a kind that cannot be sealed (a tensor, say)."""


def _form(value: Any) -> Any:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (tuple, list, torch.Size)):
        return ["seq", [_form(v) for v in value]]
    raise SealError(f"answer: a predict answer must be a number, a string or a sequence of them, got {type(value)}")


def _float_texts(value: float, neighbours: bool) -> list[str]:
    if math.isnan(value) or math.isinf(value):
        return [f"float:{value}"]
    if value == 0:
        base, step = decimal.Decimal(0), decimal.Decimal(1).scaleb(-(DIGITS + 5))
    else:
        exponent = math.floor(math.log10(abs(value))) - (DIGITS - 1)
        step = decimal.Decimal(1).scaleb(exponent)
        base = decimal.Decimal(repr(value)).quantize(step, rounding=decimal.ROUND_HALF_EVEN)
    values = [base - step, base, base + step] if neighbours else [base]
    return [f"float:{v.normalize():e}" if v != 0 else "float:0" for v in values]


def _texts(value: Any, form: Any, neighbours: bool) -> list[str] | None:
    """The canonical texts of `value` read as `form` (several for numbers near a grid line); None: not that form."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or form in ("str",) or isinstance(form, list):
            return None
        value = value.item()
    if form == "bool":
        return [f"bool:{value}"] if isinstance(value, bool) else None
    if form == "str":
        return [f"str:{value}"] if isinstance(value, str) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and form in ("int", "float"):
        return None
    if form == "int":
        if isinstance(value, float) and not value.is_integer():
            return None
        return [f"int:{int(value)}"]
    if form == "float":
        return _float_texts(float(value), neighbours)
    if isinstance(form, list) and form[0] == "seq":
        if not isinstance(value, (tuple, list, torch.Size)) or len(value) != len(form[1]):
            return None
        parts = [_texts(v, f, neighbours) for v, f in zip(value, form[1], strict=True)]
        if any(p is None for p in parts):
            return None
        combos = itertools.islice(itertools.product(*parts), 729)
        return ["[" + ",".join(combo) + "]" for combo in combos]
    return None


def _digest(salt: str, text: str) -> str:
    return hashlib.sha256(f"{salt}\x00{text}".encode()).hexdigest()


def seal(answer: Any, salt: str) -> dict[str, Any]:
    """The stored form of a predict answer: its form and the digest of its canonical text."""
    form = _form(answer)
    (text,) = _texts(answer, form, neighbours=False) or [None]
    if text is None:
        raise SealError(f"answer: cannot seal {answer!r}")
    return {MARK: _digest(salt, text), "salt": salt, "form": json.dumps(form)}


def is_sealed(entry: Any) -> bool:
    return isinstance(entry, dict) and MARK in entry


def opened(candidate: Any, entry: dict[str, Any]) -> str | None:
    """The canonical text of the sealed answer if `candidate` is right (within the rounding grid), else None."""
    texts = _texts(candidate, json.loads(entry["form"]), neighbours=True)
    for text in texts or []:
        if _digest(entry["salt"], text) == entry[MARK]:
            return text
    return None


def _stream(key: str, size: int) -> bytes:
    return hashlib.shake_256(key.encode()).digest(size)


def lock(texts: dict[str, str], answer: Any, salt: str) -> torch.Tensor:
    """`texts` (the "why" in each language) encrypted with a key only the right answer gives."""
    (text,) = _texts(answer, _form(answer), neighbours=False) or [""]
    data = json.dumps(texts, ensure_ascii=False).encode()
    key = _stream(f"why\x00{salt}\x00{text}", len(data))
    return torch.tensor(list(bytes(a ^ b for a, b in zip(data, key, strict=True))), dtype=torch.uint8)


def unlock(blob: torch.Tensor, text: str, salt: str) -> dict[str, str] | None:
    """The texts `lock` encrypted, given the canonical text `opened` returned; None if it does not open."""
    data = bytes(blob.tolist())
    key = _stream(f"why\x00{salt}\x00{text}", len(data))
    try:
        return json.loads(bytes(a ^ b for a, b in zip(data, key, strict=True)).decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
