"""Data-parallel training with Muon (tl.muon, chapter 11): two CPU processes under torchrun equal one process.

`train_gpt(..., optimizer="muon")` is run by `torchrun --nproc_per_node=2` (gloo, one thread per process, on
127.0.0.1) for 4 steps on a global batch of 5 rows, split 3 + 2, and by one ordinary process on the same
global batches. DDP averages the gradients, and each process then takes the same Muon step on them: the two
processes must end with IDENTICAL weights (bit for bit: nothing but the all-reduced gradients enters the
step), and those must equal the single process's to float64 rounding (1e-10; the model is float64, so
Newton-Schulz runs in float64 as well), as must the recorded losses.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_muon_worker.py"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, processes: int | None) -> list[dict]:
    """Run the worker (under torchrun with `processes`, or alone); each process's saved results, by rank."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, str(WORKER), str(out)]
    if processes is not None:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--nnodes=1"]
        launcher += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
        command = [*launcher, str(WORKER), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [torch.load(f"{out}.rank{rank}.pt", weights_only=True) for rank in range(processes or 1)]


def test_two_processes_with_muon_agree_and_equal_one_process(tmp_path: Path) -> None:
    (single,) = _run(tmp_path / "single", None)
    first, second = _run(tmp_path / "parallel", 2)
    for name, value in first["state_dict"].items():
        assert torch.equal(second["state_dict"][name], value), name  # the two processes: identical
        torch.testing.assert_close(value, single["state_dict"][name], rtol=0, atol=1e-10, msg=name)
    assert first["state_dict"].keys() == single["state_dict"].keys()
    torch.testing.assert_close(first["history"]["loss"], single["history"]["loss"], rtol=0, atol=1e-10)
    torch.testing.assert_close(first["history"]["val_loss"], single["history"]["val_loss"], rtol=0, atol=1e-12)
    # the comparison is not vacuous: Muon moved every hidden matrix by far more than the tolerance
    moved = {name: (single["state_dict"][name] - start).abs().max().item() for name, start in single["initial"].items()}
    assert min(moved[name] for name in moved if ".self_attn.w_" in name and name.endswith("weight")) > 1e-3
    assert moved["layers.1.feed_forward.w2.weight"] > 1e-3 and moved["lm_head.weight"] > 1e-3
