"""The options of `uv pip install` that say what this machine's pip configuration says (run.sh's setup).

run.sh installs the requirements with uv, which unpacks and byte-compiles on every core (a fresh setup: 68 s
with an empty cache, against 141 s with pip). pip reads its configuration files and PIP_* variables; uv reads
neither. So this asks pip for its configuration (`pip config list`: every file and variable pip would read, in
pip's order) and prints, one per line, the uv options that say the same: where packages are found (find-links,
index-url, extra-index-url, no-index, and pip's rule of the best version from any index), the constraints, the
hosts trusted without TLS, and the system's certificates where pip was given a certificate file. pip's other
settings change nothing uv would install and are left out. If uv fails anyway, run.sh installs with pip.

Usage: python tools/uv_options.py PYTHON   (PYTHON: the interpreter whose pip is asked; standard library only)
"""

from __future__ import annotations

import ast
import subprocess
import sys

REPEATED = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "constraint": "--constraint"}
REPEATED |= {"trusted-host": "--allow-insecure-host"}


def pip_settings(python: str) -> list[tuple[str, str]]:
    """(name, value) of every setting `pip config list` shows, in its order (e.g. ("find-links", "/opt/wheels"))."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    settings = []
    for line in listed:  # global.find-links='/opt/wheels', :env:.find-links='/opt/wheels', install.no-index='1'
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            continue
        settings.append((key.split(".", 1)[1], str(value)))
    return settings


def uv_options(settings: list[tuple[str, str]]) -> list[str]:
    options: list[str] = []
    given: set[tuple[str, str]] = set()  # a file and a variable may say the same
    index_url = None
    for name, value in settings:
        if name in REPEATED:
            for item in value.split():
                if (REPEATED[name], item) not in given:
                    given.add((REPEATED[name], item))
                    options += [REPEATED[name], item]
        elif name == "index-url" and index_url is None:
            index_url = value
        elif name == "no-index" and value.lower() in ("1", "true", "yes", "on"):
            options.append("--no-index")
        elif name == "cert" and "--native-tls" not in options:
            options.append("--native-tls")  # the system's certificates, which pip's file usually is
    # pip takes the best version from all its indexes; uv by default only from the first index that has the package
    return ["--index-strategy", "unsafe-best-match"] + (["--index-url", index_url] if index_url else []) + options


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/uv_options.py PYTHON", file=sys.stderr)
        return 2
    print("\n".join(uv_options(pip_settings(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
