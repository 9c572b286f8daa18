"""What a graded answer may not write: the static layer of grading, read from the answer's syntax tree.

The grader reads every answer cell with Python's own parser (`ast`) before anything of it runs, in the
teacher's process, where the student's code cannot reach. A cell that uses a private or introspective name
is refused: it does not run at all, its exercise gets 0 points, the feedback says why (in the class's
language) and the report flags it. What is refused, and why an honest answer never needs it:

- private attributes: an attribute whose name starts with `_` (`torch._C`, `F._canonical_mask`,
  `x._version`), unless the answer itself defines that name (`self._cache = ...`, a method `_split` of the
  student's own class); dunder methods (`super().__init__()`, `__call__`) are fine, except the
  introspective ones that reach code, frames, globals or other classes (`__code__`, `__globals__`,
  `__subclasses__`, `__dict__`, `__class__`, ...);
- frames and code objects by their attribute names (`f_back`, `f_globals`, `gi_frame`, `tb_frame`,
  `co_code`, ...);
- the operator registry and the machinery under the public API: `torch.ops`, `torch.library`,
  `torch.overrides`, `torch.utils.cpp_extension`, `torch.multiprocessing`, `torch.distributed`, `torch.hub`;
- `eval`, `exec`, `compile`, `__import__`, `globals`, `locals`, `vars`, `open`, `breakpoint`, `input`, and
  `getattr`/`setattr`/`delattr`/`hasattr` unless the attribute is a constant string that is itself allowed;
- any import but the modules an answer uses for arithmetic (torch and its public submodules, math,
  numpy, itertools, functools, collections, ...): not `os`, `sys`, `importlib`, `inspect`, `gc`,
  `ctypes`, `subprocess`, `builtins`, `pickle`, ...;
- the course's exercise machinery (`exercises`, `transformer_lab.exercises`, `.reference`, `.solution`);
- strings that name `/proc` or hold a dunder (`"__code__"`, a format string `"{0.__globals__}"`).

Ordinary methods with such names (`model.eval()`, `module.modules()`) are attributes, not the builtins,
and stay allowed. This layer is one of three: the sandbox also blocks the finished functions while the answer
runs and records the ATen operators it ran (transformer_lab/exercises/grading.py).
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass

__all__ = ["Finding", "refusals", "ALLOWED_IMPORTS"]

#: the top-level modules an answer may import (with their public submodules)
ALLOWED_IMPORTS = frozenset(
    {
        "torch",
        "math",
        "cmath",
        "numpy",
        "itertools",
        "functools",
        "collections",
        "dataclasses",
        "typing",
        "random",
        "string",
        "re",
        "copy",
        "operator",
        "statistics",
        "fractions",
        "decimal",
        "enum",
        "abc",
        "heapq",
        "bisect",
        "transformer_lab",
        "__future__",
    }
)
#: submodules of allowed modules that an answer may not import or reach by attribute
REFUSED_MODULE_PARTS = frozenset(
    {"ops", "library", "overrides", "cpp_extension", "multiprocessing", "distributed", "hub", "exercises", "ctypeslib"}
)
#: builtins an answer may not call or name
REFUSED_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "open",
        "breakpoint",
        "input",
        "memoryview",
        "exit",
        "quit",
        "help",
        "exercises",  # the chapter's exercise module: an answer never needs it
        "Exercise",
    }
)
ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
#: dunder attributes that reach code, frames, globals, other classes or the interpreter's internals
REFUSED_DUNDERS = frozenset(
    {
        "__code__",
        "__globals__",
        "__closure__",
        "__builtins__",
        "__dict__",
        "__class__",
        "__bases__",
        "__base__",
        "__mro__",
        "__subclasses__",
        "__self__",
        "__func__",
        "__wrapped__",
        "__getattribute__",
        "__getattr__",
        "__setattr__",
        "__delattr__",
        "__reduce__",
        "__reduce_ex__",
        "__traceback__",
        "__loader__",
        "__spec__",
        "__import__",
        "__module__",
        "__defaults__",
        "__kwdefaults__",
        "__file__",
        "__cached__",
        "__path__",
        "__qualname__",
        "__torch_function__",
        "__torch_dispatch__",
    }
)
#: attributes of frames, code objects, generators, coroutines and tracebacks, and of the exercise machinery
REFUSED_ATTRIBUTES = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "f_trace",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "reference",
        "solution",
        "reference_copy",
        "setprofile",
        "settrace",
    }
)


@dataclass(frozen=True)
class Finding:
    """One refused use: its line in the cell and what it is."""

    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def _own_names(tree: ast.AST) -> set[str]:
    """Attribute and method names the answer defines itself (`self._x = ...`, `def _split(self)` in a class)."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(item.name)
                elif isinstance(item, ast.Assign):
                    own.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    own.add(item.target.id)
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    own.add(sub.attr)
    return own


def _attribute_problem(name: str, own: set[str]) -> str | None:
    if name in REFUSED_DUNDERS:
        return f"the introspective attribute `{name}`"
    if name in REFUSED_ATTRIBUTES:
        return f"the attribute `{name}` (frames, code objects or the exercise machinery)"
    if name in REFUSED_MODULE_PARTS:
        return f"`.{name}` (PyTorch's or the course's machinery under the public API)"
    is_dunder = name.startswith("__") and name.endswith("__") and len(name) > 4
    if name.startswith("_") and not is_dunder and name not in own:
        return f"the private attribute `{name}` (a name starting with `_` that the answer did not define)"
    return None


def _module_problem(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in ALLOWED_IMPORTS:
        return f"`import {module}` (an answer imports only what it computes with: torch, math, numpy, ...)"
    for part in parts[1:]:
        if part.startswith("_") or part in REFUSED_MODULE_PARTS:
            return f"`import {module}` (a private or internal module)"
    return None


# CPython 3.11's ast.parse is not safe in two threads at once: building the Python AST objects keeps one
# recursion counter per interpreter, and concurrent parses raise "SystemError: AST constructor recursion depth
# mismatch" (seen in CI: grade_folder grades in threads). Every parse of the grading path goes through here.
_PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse(source, mode=mode)`, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source, mode=mode)


def refusals(source: str) -> list[Finding]:
    """Every refused use in one answer cell's source ([] for an honest answer). A cell that does not parse
    is not refused here: it fails when it runs, as in the notebook."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return []
    own = _own_names(tree)
    found: list[Finding] = []

    def add(node: ast.AST, what: str) -> None:
        finding = Finding(getattr(node, "lineno", 0), what)
        if finding not in found:
            found.append(finding)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            problem = _attribute_problem(node.attr, own)
            if problem:
                add(node, problem)
        elif isinstance(node, ast.Name):
            if node.id in REFUSED_NAMES:
                add(node, f"`{node.id}`")
            elif node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__":
                add(node, f"the name `{node.id}`")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                problem = _module_problem(alias.name)
                if problem:
                    add(node, problem)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.level:
                add(node, f"the relative import `from {module} import ...`")
                continue
            problem = _module_problem(module)
            if problem:
                add(node, problem)
                continue
            for alias in node.names:
                problem = _attribute_problem(alias.name, set()) or _module_problem(f"{module}.{alias.name}")
                if problem and alias.name != "*":
                    add(node, problem)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                add(node, f"`{node.func.id}` with an attribute name computed at run time")
            else:
                problem = _attribute_problem(name.value, own)
                if problem:
                    add(node, problem)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if "/proc" in text:
                add(node, "a path under `/proc`")
            elif "__" in text:
                add(node, "a string holding a dunder name (how an attribute is reached by its name)")
    return sorted(found, key=lambda f: (f.line, f.what))
