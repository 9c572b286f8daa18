"""No POSIX-only module in what a learner runs: as on Windows, where `resource`, `fcntl`, `pwd`, `grp` and `termios`
do not exist (and neither does `os.geteuid`).

In a subprocess those modules are hidden (importing one raises ModuleNotFoundError) and `os.geteuid` removed; then
every module of the package is imported, and `transformer-lab lab --version` makes a working copy and starts
JupyterLab's application, which answers --version and exits. Only the teacher's grading machinery (its sandbox
limits a submission with `resource`) may need them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("resource", "fcntl", "pwd", "grp", "termios")
#: the teacher's grading of submissions (a bubblewrap sandbox, limits set with `resource`): Linux only, by design
TEACHER_ONLY = {
    "transformer_lab.exercises.grading",
    "transformer_lab.exercises.runner",
    "transformer_lab.exercises.sandbox",
}

PROBE = """
import importlib, importlib.abc, json, os, pkgutil, sys
HIDDEN = set(sys.argv[1].split(","))

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

for name in list(sys.modules):
    if name.split(".")[0] in HIDDEN:
        del sys.modules[name]
sys.meta_path.insert(0, Hide())
del os.geteuid
hidden = []
for name in HIDDEN:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        hidden.append(name)

import transformer_lab
from transformer_lab import cli

failed, imported = {}, []
for module in pkgutil.walk_packages(transformer_lab.__path__, "transformer_lab."):
    try:
        importlib.import_module(module.name)
        imported.append(module.name)
    except Exception as error:
        failed[module.name] = f"{type(error).__name__}: {error}"
try:
    status = cli.main(["lab", "--dir", sys.argv[2], "--no-browser", "--version"])
except SystemExit as stop:
    status = stop.code
print(json.dumps({"hidden": hidden, "failed": failed, "imported": imported, "lab": status}))
"""


@pytest.mark.slow
def test_every_learner_module_and_the_lab_command_work_without_posix_only_modules(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HIDDEN), str(tmp_path / "我的 课程")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(result["hidden"]) == sorted(HIDDEN), "the probe did not hide the modules"
    learner_failures = {k: v for k, v in result["failed"].items() if k not in TEACHER_ONLY}
    assert not learner_failures, f"needs a POSIX-only module: {learner_failures}"
    assert "transformer_lab.workspace" in result["imported"] and "transformer_lab.cli" in result["imported"]
    assert len(result["imported"]) >= 30
    assert result["lab"] == 0
    copied = sorted(p.name for p in (tmp_path / "我的 课程").glob("[0-9][0-9]_*.ipynb"))
    assert copied == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
