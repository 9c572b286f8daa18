"""Exercise modules without their answers: what a student version ships and what a grading sandbox reads.

`strip_source(source, keep)` rewrites one chapter's exercise module (`transformer_lab/exercises/chNN_*.py`)
so that it keeps only what running the exercises' cases needs:

- every `Exercise(...)` keeps its name, cases, `run`, `forbidden` list, level, kind and hints; its
  `reference=` becomes `_withheld` (a function that raises), and `wrong=`, `mistakes=` (the recognisers of
  known mistakes: they run in the grader), `shortcuts=` and `why=` go
  (`explain=`, what a learner is told about a known wrong prediction, stays only where `keep` asks for it);
- of the module's own functions, classes and constants, only those the kept expressions reach (the case
  builders, `run` helpers, the functions a case passes in as input) stay; the reference, the known-wrong
  answers, the shortcuts and every helper only they use (chapter 08's `_rotate_pairs`, say) are gone.

The result is checked: a stripped module that still defines a reference, a wrong answer or a shortcut
raises, so a case builder that needs one is found when the copy is made, not by a student.
"""

from __future__ import annotations

import ast

from transformer_lab.exercises.policy import parse

__all__ = ["strip_source", "WITHHELD", "StripError"]

WITHHELD = "the reference answer is not in this copy of the course"
STUB = f"def _withheld(*args, **kwargs):\n    raise NotImplementedError({WITHHELD!r})\n"


class StripError(ValueError):
    """A module that cannot be stripped without keeping an answer."""


def _names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _exercise_call(node: ast.stmt) -> ast.Call | None:
    value = getattr(node, "value", None)
    if isinstance(node, ast.Assign) and isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Exercise":
        return value
    return None


_POSITIONAL = ("name", "reference", "cases", "hints")


def strip_source(source: str, keep: tuple[str, ...] = (), literals: dict[str, dict[str, str]] | None = None) -> str:
    """The module's source without answers (see the module docstring). `keep` may hold "explain".

    `literals` ({exercise variable: {argument: Python literal}}) replaces a kept argument by its value, so that
    what computed it (chapter 06's explain keys call the helper that counts the answer) need not stay."""
    literals = literals or {}
    tree = parse(source)
    answers: set[str] = set()
    needed: set[str] = set()
    for node in tree.body:
        call = _exercise_call(node)
        if call is None:
            continue
        arguments = dict(zip(_POSITIONAL, call.args, strict=False))
        arguments.update({k.arg: k.value for k in call.keywords if k.arg})
        variable = next(iter(_defined(node)), "")
        for argument, literal in literals.get(variable, {}).items():
            if argument in arguments:
                arguments[argument] = parse(literal, mode="eval").body
        for key in ("reference", "wrong", "shortcuts", "mistakes"):
            answers |= _names(arguments.get(key))
        kept = {"name", "cases", "hints", "level", "kind", "run", "forbidden", "output_names"} | set(keep)
        call.args = []
        call.keywords = [ast.keyword(arg=k, value=v) for k, v in arguments.items() if k in kept]
        call.keywords.insert(1, ast.keyword(arg="reference", value=ast.Name("_withheld", ast.Load())))
        needed |= {n for k in kept for n in _names(arguments.get(k))}
    # the module's own definitions the kept expressions reach, and what those reach in turn
    definitions = {name: node for node in tree.body for name in _defined(node) if _exercise_call(node) is None}
    todo = list(needed)
    while todo:
        name = todo.pop()
        node = definitions.get(name)
        if node is None:
            continue
        for used in _names(node) - needed:
            needed.add(used)
            todo.append(used)
    body: list[ast.stmt] = []
    for index, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _exercise_call(node) is not None:
            body.append(node)
        elif index == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
            body.append(node)  # the module's docstring
        elif _defined(node) & needed and "__all__" not in _defined(node):
            body.append(node)
    stub = parse(STUB).body
    first = next(i for i, n in enumerate(body) if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr)))
    body[first:first] = stub
    tree.body = body
    left = {name for node in body for name in _defined(node)} & answers
    if left:
        raise StripError(f"source: the stripped module still defines answers {sorted(left)} (a case needs them)")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
