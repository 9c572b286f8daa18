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
- strings that name `/proc` or hold a dunder (`"__code__"`, a format string `"{0.__globals__}"`);
- in a chapter whose exercise module has `FORBIDDEN_IN_CHAPTER` (chapter 04: the library's statistics helpers and
  normalization layers), any name that resolves to one of those objects, under whatever alias or re-export.

Ordinary methods with such names (`model.eval()`, `module.modules()`) are attributes, not the builtins,
and stay allowed. This layer is one of three: the sandbox also blocks the finished functions while the answer
runs and records the ATen operators it ran (transformer_lab/exercises/grading.py).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import threading
import types
from dataclasses import dataclass

__all__ = ["Finding", "refusals", "unreadable", "TooComplex", "ALLOWED_IMPORTS", "MAX_ANSWER_CHARS", "MAX_DEPTH"]

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
    {
        "ops",
        "library",
        "overrides",
        "cpp_extension",
        "multiprocessing",
        "distributed",
        "hub",
        "exercises",
        "ctypeslib",
        # machinery that loads, compiles or generates code, or reads files: no answer builds on it
        "utils",
        "jit",
        "fx",
        "export",
        "onnx",
        "compiler",
        "package",
        "serialization",
        "testing",
        "f2py",
        "distutils",
        "lib",
        "storage",
    }
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
        # dynamic attribute access, at all: an attribute is reached by a name written in the answer or not at all
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "type",
    }
)
#: kept for callers of the earlier interface: these are now refused outright (REFUSED_NAMES)
ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
#: attribute names that reach an attribute by a string, evaluate text, or read and write files, whatever object
#: they are read on (a module passed through a list escapes the resolution below; these names do not)
DYNAMIC_ATTRIBUTES = frozenset(
    {
        "attrgetter",
        "methodcaller",
        "getattr_static",
        "get_field",
        "get_value",
        "get_type_hints",
        "ForwardRef",
        "get_annotations",
        "load",
        "loads",
        "save",
        "savez",
        "savez_compressed",
        "fromfile",
        "tofile",
        "loadtxt",
        "savetxt",
        "genfromtxt",
        "fromregex",
        "memmap",
        "open_memmap",
        "DataSource",
        "from_file",
        "frombuffer",
        "system",
        "popen",
        "environ",
        "builtins",
    }
)
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


def _attribute_problem(name: str, own: set[str], on_self: bool = False) -> str | None:
    """Why attribute `name` may not be read (None: it may). `own`: the names the answer defines; `on_self`:
    read on `self`, `cls` or `super()`, the only places an answer's own private and dunder names are read."""
    if name in REFUSED_DUNDERS:
        return f"the introspective attribute `{name}`"
    if name in REFUSED_ATTRIBUTES:
        return f"the attribute `{name}` (frames, code objects or the exercise machinery)"
    if name in REFUSED_MODULE_PARTS:
        return f"`.{name}` (PyTorch's or the course's machinery under the public API)"
    if name in DYNAMIC_ATTRIBUTES:
        return f"`.{name}` (reaches an attribute by a string, evaluates text, or reads or writes files)"
    if name in foreign_names() and not on_self:
        return f"`.{name}` (the name under which the allowed modules hold a module an answer may not use)"
    is_dunder = name.startswith("__") and name.endswith("__") and len(name) > 4
    if name.startswith("_") and not (name in own and on_self):
        what = "dunder" if is_dunder else "private"
        return (
            f"the {what} attribute `{name}` (an answer reads a name starting with `_` only on `self` or `super()`, "
            f"and only one it defines itself)"
        )
    return None


# ------------------------------------------------------------------ what a name refers to


#: the names a chapter's setup cell binds, when the grader passes none (what the chapters import)
DEFAULT_CONTEXT = (
    "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport transformer_lab as tl\n"
)
_MISSING = object()


def module_allowed(name: str) -> bool:
    """Whether an answer may use module `name`: an allowed top-level module or a public submodule of one."""
    parts = name.split(".")
    return parts[0] in ALLOWED_IMPORTS and not any(p.startswith("_") or p in REFUSED_MODULE_PARTS for p in parts[1:])


def _module(name: str) -> types.ModuleType | None:
    """The grader's own copy of module `name` (an allowed top-level module is imported if it is not yet)."""
    module = sys.modules.get(name)
    if module is None and "." not in name and name in ALLOWED_IMPORTS and name != "__future__":
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed here: nothing to resolve against
            module = None
    return module if isinstance(module, types.ModuleType) else None


def _lookup(module_name: str, attribute: str) -> tuple[str, object]:
    """What `module_name.attribute` is, read from the module's own namespace (never through a module's
    `__getattr__`, which may import): ("module", its name), ("object", it), ("missing", None) or ("unknown", None)
    where the grader does not hold the module."""
    module = _module(module_name)
    if module is None:
        return "unknown", None
    value = module.__dict__.get(attribute, _MISSING)
    if value is _MISSING:
        sub = f"{module_name}.{attribute}"
        return ("module", sub) if isinstance(sys.modules.get(sub), types.ModuleType) else ("missing", None)
    if isinstance(value, types.ModuleType):
        return "module", value.__name__
    return "object", value


#: modules of the standard library an answer may not use, by the names under which the allowed modules hold
#: them (`torch.os`, `typing.sys`, `torch.builtins`, `torch.inspect`, `numpy.ctypeslib`'s `ctypes`, ...): a fixed
#: list, so that what is refused does not depend on what the grader happens to have imported
FOREIGN_MODULE_NAMES = frozenset(
    {
        "os",
        "sys",
        "builtins",
        "bltns",
        "inspect",
        "importlib",
        "gc",
        "ctypes",
        "subprocess",
        "pickle",
        "marshal",
        "types",
        "io",
        "shutil",
        "pathlib",
        "tempfile",
        "socket",
        "signal",
        "threading",
        "multiprocessing",
        "mp",
        "runpy",
        "codeop",
        "dis",
        "weakref",
        "traceback",
        "linecache",
        "copyreg",
        "warnings",
        "platform",
        "glob",
        "json",
        "ast",
        "contextlib",
        "contextvars",
        "mmap",
        "resource",
        "posix",
        "atexit",
        "faulthandler",
        "sysconfig",
        "site",
        "zipimport",
        "pkgutil",
        "zipfile",
        "tarfile",
        "gzip",
        "bz2",
        "lzma",
        "select",
        "selectors",
        "asyncio",
        "concurrent",
        "logging",
        "uuid",
        "keyword",
        "typing_extensions",
        "textwrap",
    }
)


def foreign_names() -> frozenset[str]:
    """FOREIGN_MODULE_NAMES (refused as an attribute on any object but `self`: a module passed through a list or
    a function's argument, where no resolution follows it, is still refused by its name)."""
    return FOREIGN_MODULE_NAMES


def _object_problem(shown: str, value: object, forbidden: tuple[object, ...] = ()) -> str | None:
    """Why a resolved non-module object may not be used: a builtin an answer may not call, under another name, or
    one of `forbidden` (the library's finished versions of what the chapter's exercises compute)."""
    if getattr(value, "__module__", None) == "builtins" and getattr(value, "__name__", None) in REFUSED_NAMES:
        return f"`{shown}` (the builtin `{getattr(value, '__name__', '')}` under another name)"
    if any(value is item for item in forbidden):
        return f"`{shown}` (the library's finished version of what this chapter's exercises compute)"
    return None


#: the line of a chapter's setup that names its exercise module (what grading.grade_notebook adds to the setup)
_CHAPTER_LINE = re.compile(r"^from transformer_lab\.exercises import (ch\d\d_\w+) as exercises\s*$", re.M)


def chapter_forbidden(context: str) -> tuple[object, ...]:
    """What the chapter named in `context` forbids in every answer, statically: its exercise module's
    `FORBIDDEN_IN_CHAPTER` (chapter 04: the library's statistics helpers and normalization layers), from the
    grader's own copy of the module; () for a chapter without such a list."""
    match = _CHAPTER_LINE.search(context)
    if not match:
        return ()
    try:
        module = importlib.import_module(f"transformer_lab.exercises.{match.group(1)}")
    except Exception:  # noqa: BLE001 - a chapter the grader cannot import forbids nothing here
        return ()
    return tuple(getattr(module, "FORBIDDEN_IN_CHAPTER", ()))


class _Resolver:
    """Follows what each name of a cell refers to: the modules bound by imports (the setup cell's and the
    answer's), and by assignments of a module (`F = torch.nn.functional`, `o = torch.os`)."""

    def __init__(self, context: str, forbidden: tuple[object, ...] = ()) -> None:
        self.modules: dict[str, str] = {}  # name -> the module it refers to
        self.forbidden = forbidden
        try:
            tree = ast.parse(context)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = ast.parse(DEFAULT_CONTEXT)
        self.bind(tree, [])

    def bind(self, tree: ast.AST, found: list[tuple[ast.AST, str]]) -> None:
        """Record the modules `tree` binds to names (two passes: an alias of an alias); add refusals to `found`."""
        for _ in range(2):
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            self.modules[alias.asname] = alias.name
                        else:
                            self.modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    for alias in node.names:
                        kind, value = _lookup(node.module, alias.name)
                        if kind == "module":
                            self.modules[alias.asname or alias.name] = str(value)
                        elif kind == "object":
                            problem = _object_problem(f"{node.module}.{alias.name}", value, self.forbidden)
                            if problem:
                                found.append((node, problem))
                elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    kind, value, _ = self.resolve(node.value)
                    if kind == "module":
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            for sub in ast.walk(target):
                                if isinstance(sub, ast.Name):
                                    self.modules[sub.id] = str(value)

    def resolve(self, node: ast.AST) -> tuple[str, object, str | None]:
        """(kind, value, problem) of a `name.attr.attr` chain: kind "module" (value: its name), "object", or
        "other" (not a chain rooted at a module); problem: why the chain may not be used, or None."""
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.modules:
            return "other", None, None
        module = self.modules[node.id]
        shown = node.id
        if not module_allowed(module):
            return "module", module, f"`{shown}` (the module `{module}`, which an answer may not use)"
        kind: str = "module"
        value: object = module
        for attribute in reversed(attributes):
            shown += f".{attribute}"
            if kind != "module":
                return "other", None, None  # an attribute of an object (a method of a class): not resolved
            kind, value = _lookup(str(value), attribute)
            if kind == "module" and not module_allowed(str(value)):
                return kind, value, f"`{shown}` (the module `{value}`, which an answer may not use)"
            if kind == "missing" and not attribute.startswith("_"):
                return kind, None, f"`{shown}` (no public name of the module `{module}`)"
            if kind == "object":
                problem = _object_problem(shown, value, self.forbidden)
                if problem:
                    return kind, value, problem
            if kind in ("missing", "unknown"):
                return "other", None, None
            module = str(value) if kind == "module" else module
        return kind, value, None


def _module_problem(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in ALLOWED_IMPORTS:
        return f"`import {module}` (an answer imports only what it computes with: torch, math, numpy, ...)"
    for part in parts[1:]:
        if part.startswith("_") or part in REFUSED_MODULE_PARTS:
            return f"`import {module}` (a private or internal module)"
    return None


#: the longest answer cell read (characters); the course's longest honest answer has about 1,300
MAX_ANSWER_CHARS = 64 * 1024
#: the deepest syntax tree read (nodes from the module to a leaf); the course's honest answers stay under 25
MAX_DEPTH = 100


class TooComplex(ValueError):
    """An answer cell too large or too deeply nested to be read: its exercise is not graded, and nothing of it
    runs. Every static pass (`parse`) raises it rather than let Python's parser run out of stack."""


# CPython 3.11's ast.parse is not safe in two threads at once: building the Python AST objects keeps one
# recursion counter per interpreter, and concurrent parses raise "SystemError: AST constructor recursion depth
# mismatch" (seen in CI: grade_folder grades in threads). Every parse of the grading path goes through here.
_PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse(source, mode=mode)`, one thread at a time; TooComplex for a source longer than MAX_ANSWER_CHARS
    or nested deeper than MAX_DEPTH (measured without recursion), whatever it holds."""
    if len(source) > MAX_ANSWER_CHARS:
        raise TooComplex(
            f"the cell has {len(source):,} characters, more than the {MAX_ANSWER_CHARS:,} an answer may have"
        )
    try:
        with _PARSE_LOCK:
            tree = ast.parse(source, mode=mode)
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise TooComplex(f"the cell is nested too deeply to be read ({type(exc).__name__})") from None
    except SystemError as exc:  # the parser's own recursion guard, in some versions
        raise TooComplex(f"the cell could not be read ({str(exc)[:80]})") from None
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooComplex(f"the cell is nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return tree


def unreadable(source: str) -> str | None:
    """Why an answer cell cannot be read by the static passes (too large, too deep), or None."""
    try:
        parse(source)
    except TooComplex as exc:
        return str(exc)
    except (SyntaxError, ValueError):
        return None  # a cell that does not parse fails when it runs, as in the notebook
    return None


def refusals(source: str, context: str = DEFAULT_CONTEXT) -> list[Finding]:
    """Every refused use in one answer cell's source ([] for an honest answer). A cell that does not parse
    is not refused here: it fails when it runs, as in the notebook. `context`: the code that runs before the
    answer (the chapter's setup cell), whose imports say what the answer's names refer to."""
    try:
        tree = parse(source)
    except TooComplex as exc:
        return [Finding(0, str(exc))]
    except (SyntaxError, ValueError):
        return []
    own = _own_names(tree)
    found: list[Finding] = []

    def add(node: ast.AST, what: str) -> None:
        finding = Finding(getattr(node, "lineno", 0), what)
        if finding not in found:
            found.append(finding)

    resolver = _Resolver(context, chapter_forbidden(context))
    bound: list[tuple[ast.AST, str]] = []
    resolver.bind(tree, bound)
    for node, problem in bound:
        add(node, problem)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("format", "format_map"):
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                add(node, f"`.{node.attr}` of a format string built at run time (it reads attributes by name)")
        if isinstance(node, ast.Attribute):
            receiver = node.value
            on_self = (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")) or (
                isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super"
            )
            problem = _attribute_problem(node.attr, own, on_self) or resolver.resolve(node)[2]
            if problem:
                add(node, problem)
        elif isinstance(node, ast.Name):
            if node.id in REFUSED_NAMES:
                add(node, f"`{node.id}`")
            elif node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__":
                add(node, f"the name `{node.id}`")
            else:
                problem = resolver.resolve(node)[2]
                if problem:
                    add(node, problem)
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
                if alias.name == "*":
                    add(node, f"`from {module} import *` (say which names the answer uses)")
                    continue
                problem = _attribute_problem(alias.name, set()) or _module_problem(f"{module}.{alias.name}")
                kind, value = _lookup(module, alias.name)
                if not problem and kind == "module" and not module_allowed(str(value)):
                    problem = f"`from {module} import {alias.name}` (the module `{value}`, which an answer may not use)"
                if not problem and kind == "missing":
                    problem = f"`from {module} import {alias.name}` (no public name of the module `{module}`)"
                if problem:
                    add(node, problem)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if "/proc" in text:
                add(node, "a path under `/proc`")
            elif "__" in text:
                add(node, "a string holding a dunder name (how an attribute is reached by its name)")
    return sorted(found, key=lambda f: (f.line, f.what))
