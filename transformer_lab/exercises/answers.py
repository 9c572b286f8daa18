"""A student version without the answers: expected results stored with the cases, answers removed.

A teacher who grades the exercises may hand out the course without `solution()` and without the
exercises' reference code (`python tools/classroom.py student`, the default; `--with-solutions` keeps
them). `write_stored(folder)` runs, in the student's copy of this package, once when the copy is made:

1. it computes every exercise's expected result on each visible case with the reference and stores them
   in `expected.pt` beside this file (plain tensors and numbers, read with `weights_only=True`); a
   predict exercise's answer is stored only sealed (a salted hash, `sealed.py`) and its "why" encrypted
   with a key only the right answer gives;
2. it rewrites each chapter module with `strip.strip_source`: no reference (a stub that raises), no
   known-wrong answers, no recognised mistakes, no shortcuts, no helper that only those use; the
   explanations of known wrong predictions stay, their keys written out as values.

The checks then compare with the stored results (`Exercise` reads `expected.pt` when it is present), so
every visible check works as before; `solution()` says that this version has none. Hints and the cases
stay: they give nothing away that the check cell does not already show.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
from typing import Any

import torch

STORE = "expected.pt"


def write_stored(folder: str, salt: str | None = None) -> dict[str, int]:
    """Store the expected results of every exercise in `folder`'s package, then strip the modules.

    Build, debug and transfer exercises store their expected results on the visible cases; a predict
    exercise stores its answer only sealed (a salted hash, `sealed.seal`) and its "why" (which often states
    the answer) encrypted with a key only the right answer gives. The chapter modules are rewritten by
    `strip.strip_source`: no reference, no wrong answer, no shortcut, no helper only they use; the Chinese
    texts of the "why"s leave the translation files with them.
    """
    import json
    import secrets

    from transformer_lab import i18n
    from transformer_lab.exercises import sealed
    from transformer_lab.exercises.core import Exercise, _plain_result
    from transformer_lab.exercises.strip import strip_source

    salt = salt or secrets.token_hex(16)
    package = pathlib.Path(folder)
    expected: dict[str, Any] = {}
    modules = []
    whys: set[str] = set()
    literals: dict[str, dict[str, dict[str, str]]] = {}
    for info in pkgutil.iter_modules([str(package)]):
        if not info.name.startswith("ch"):
            continue
        module = importlib.import_module(f"transformer_lab.exercises.{info.name}")
        modules.append((info.name, module))
        for variable, value in vars(module).items():
            if isinstance(value, Exercise):
                if value.explain:  # its keys as literals: what computed them may be an answer's helper
                    literals.setdefault(info.name, {})[variable] = {"explain": repr(value.explain)}
                results = []
                for case in value.cases:
                    try:
                        with torch.no_grad():
                            results.append(_plain_result(value._run(value.reference, *case.inputs())))
                    except Exception as exc:  # a case that expects an error: store its type's name
                        results.append({"__raises__": type(exc).__name__})
                key = f"{info.name}.{value.name}"
                if value.kind == "predict":
                    answers = results
                    results = [sealed.seal(r, salt) for r in answers]
                    if value.why:
                        whys.add(value.why)
                        with i18n.language("zh"):
                            texts = {"en": value.why, "zh": i18n.text(value.why)}
                        expected[f"{key}.why"] = sealed.lock(texts, answers[0], salt)
                expected[key] = results
    torch.save(expected, package / STORE)
    for name, _ in modules:
        path = package / f"{name}.py"
        path.write_text(
            strip_source(path.read_text(encoding="utf-8"), keep=("explain",), literals=literals.get(name)),
            encoding="utf-8",
        )
    for path in sorted((package.parent / "locale" / "zh").glob("ch*.json")):
        table = json.loads(path.read_text(encoding="utf-8"))
        kept = {en: zh for en, zh in table.items() if en not in whys}
        path.write_text(json.dumps(kept, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return {"exercises": len([k for k in expected if not k.endswith(".why")]), "modules": len(modules)}
