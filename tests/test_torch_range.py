"""The PyTorch range: pyproject.toml asks pip for it, and `import transformer_lab` checks the runtime's own PyTorch
(a hosted notebook's, or one under an install with --no-deps), in one sentence that says how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from transformer_lab import _torch_range
from transformer_lab._torch_range import TORCH_REQUIREMENT, check_torch

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_asks_pip_for_the_range_the_package_checks():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (torch_requirement,) = [Requirement(d) for d in dependencies if Requirement(d).name == "torch"]
    assert torch_requirement == Requirement(TORCH_REQUIREMENT)
    assert torch_requirement.specifier.contains(torch.__version__.split("+")[0]), "CI's torch is outside the range"


def test_the_first_release_with_muon_is_the_lower_end():
    assert hasattr(torch.optim, "Muon")
    assert _torch_range.TORCH_MINIMUM == (2, 9)
    for version in ("2.9.0", "2.9.1+cpu", "2.13.0", "2.14.0.dev20260101", "2.15.0+cu130"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_torch(version)


def test_an_older_torch_is_one_sentence_that_says_how_to_fix_it():
    with pytest.raises(ImportError) as raised:
        check_torch("2.8.0+cpu")
    message = str(raised.value)
    assert "torch 2.8.0+cpu" in message and f'pip install "{TORCH_REQUIREMENT}"' in message
    assert message.count(". ") == 0 and message.endswith(".") and "\n" not in message
    with pytest.raises(ImportError, match="cannot read the version"):
        check_torch("unknown")


def test_a_newer_major_release_warns_once():
    with pytest.warns(UserWarning, match=r"tested with torch>=2\.9,<3, and this Python has torch 3\.0\.0"):
        check_torch("3.0.0")


def test_importing_the_package_with_an_old_torch_stops_with_the_sentence():
    code = "import torch; torch.__version__ = '2.8.0'; import transformer_lab"
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8"),
        timeout=300,
    )
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: transformer_lab needs PyTorch 2.9 or newer") and "torch 2.8.0" in last
