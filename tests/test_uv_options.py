"""run.sh's setup installs with uv, handing it pip's configuration through tools/uv_options.py (uv reads no pip.conf
and no PIP_* variable): what pip would look at must be what uv looks at, or uv would install other files (on a
machine whose pip finds a CPU build of torch on its disk, a several-GB CUDA build from PyPI)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from support import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]
uv_options = load_tool("uv_options")


def test_each_setting_becomes_the_uv_option_that_says_the_same():
    settings = [
        ("find-links", "/opt/wheels"),
        ("extra-index-url", "file:///a/simple file:///b/simple"),
        ("constraint", "/etc/constraints.txt"),
        ("cert", "/etc/ssl/certs/ca-certificates.crt"),
        ("index-url", "https://mirror.example/simple"),
        ("index-url", "https://ignored.example/simple"),  # the first one pip lists wins, as in pip
        ("find-links", "/opt/wheels"),  # a variable that repeats a file's setting
        ("timeout", "180"),  # changes nothing uv would install
        ("trusted-host", "mirror.example"),
    ]
    assert uv_options.uv_options(settings) == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://mirror.example/simple",
        "--find-links",
        "/opt/wheels",
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--constraint",
        "/etc/constraints.txt",
        "--native-tls",
        "--allow-insecure-host",
        "mirror.example",
    ]
    assert uv_options.uv_options([("no-index", "true")])[-1] == "--no-index"
    assert "--no-index" not in uv_options.uv_options([("no-index", "false")])


def test_pips_own_listing_is_read(tmp_path):
    """A pip.conf and a PIP_ variable, as `pip config list` shows them to this interpreter's pip."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /somewhere/wheels\nextra-index-url = file:///x/simple\n", encoding="utf-8")
    env = dict(os.environ, PIP_CONFIG_FILE=str(conf), PIP_CONSTRAINT=str(tmp_path / "c.txt"))
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "uv_options.py"), sys.executable],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    pairs = {tuple(out[i : i + 2]) for i in range(len(out) - 1)}
    assert ("--find-links", "/somewhere/wheels") in pairs
    assert ("--extra-index-url", "file:///x/simple") in pairs
    assert ("--constraint", str(tmp_path / "c.txt")) in pairs


def test_a_wrong_call_says_how_to_call_it():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "uv_options.py")], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: python tools/uv_options.py PYTHON" in done.stderr
