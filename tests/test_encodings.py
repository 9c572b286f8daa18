"""Every text file that the package, the tools, the benchmarks and the tests read or write names its encoding
(issue 37), beside ruff's PLW1514 (pyproject.toml), which sees only calls on what it knows to be a path
(`pathlib.Path(...).read_text()`), not `path.read_text()` on a variable. A locale's encoding (GBK on a Chinese
Windows machine) would otherwise decide how Chinese text is written and read.

Checked on the syntax tree: `x.read_text()` without an encoding, `x.write_text(text)` without one, and `open`,
`x.open` and `os.fdopen` in text mode without one. Binary modes, and `open` of an archive member, a socket or a
browser page (not a file), need none.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: objects whose `.open(...)` is not a text file's: archives, and the browser tests' page objects
NOT_FILES = {"os", "zipfile", "tarfile", "gzip", "zipped", "zf", "visit", "lab_page", "webbrowser", "Image"}


def _python_files() -> list[pathlib.Path]:
    found = [p for top in ("transformer_lab", "tools", "tests", "benchmarks") for p in (ROOT / top).rglob("*.py")]
    return sorted(p for p in [*found, *ROOT.glob("*.py")] if "fixtures" not in p.parts)


def _mode(node: ast.Call, position: int) -> str | None:
    """The call's mode if it is a constant ("r" if none is given), else None (not known here)."""
    mode = node.args[position] if len(node.args) > position else None
    mode = mode or next((k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else None


def unnamed_encodings(source: str) -> list[tuple[int, str]]:
    """(line, call) of each text-file call in `source` that names no encoding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        func = node.func
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "read_text" and isinstance(func, ast.Attribute) and not node.args:
            found.append((node.lineno, "read_text()"))
        elif name == "write_text" and isinstance(func, ast.Attribute) and len(node.args) < 2:
            found.append((node.lineno, "write_text(text)"))
        elif name == "open" and isinstance(func, ast.Name) and "b" not in (_mode(node, 1) or "b"):
            found.append((node.lineno, "open(path)"))
        elif name == "open" and isinstance(func, ast.Attribute) and owner not in NOT_FILES:
            if "b" not in (_mode(node, 0) or "b"):
                found.append((node.lineno, "path.open()"))
        elif name == "fdopen" and owner == "os" and "b" not in (_mode(node, 1) or "b"):
            found.append((node.lineno, "os.fdopen(fd)"))
    return sorted(found)


def test_the_check_finds_each_kind_of_unnamed_encoding():
    source = (
        "import os\np = x\np.read_text()\np.write_text('t')\nopen(p)\nopen(p, 'w')\np.open('a')\nos.fdopen(3, 'w')\n"
        "p.read_text(encoding='utf-8')\np.write_text('t', 'utf-8')\nopen(p, 'rb')\np.open('wb')\nzipfile.open(p)\n"
        "open(p, encoding='utf-8')\nos.fdopen(3, 'wb')\n"
    )
    assert [line for line, _ in unnamed_encodings(source)] == [3, 4, 5, 6, 7, 8]


def test_every_text_file_names_its_encoding():
    unnamed = [
        f"{path.relative_to(ROOT)}:{line}: {call}"
        for path in _python_files()
        for line, call in unnamed_encodings(path.read_text(encoding="utf-8"))
    ]
    assert not unnamed, "name the encoding (encoding='utf-8'):\n" + "\n".join(unnamed)
