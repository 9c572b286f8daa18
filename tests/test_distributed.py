"""Data-parallel training (tl.distributed): two CPU processes under torchrun equal one process.

Both trainers (chapter 09's `train` and chapter 10's `train_gpt`) are run by `torchrun
--nproc_per_node=2` (gloo, one thread per process, on 127.0.0.1) for a few steps on a global batch of 5
rows, split 3 + 2 between the processes, and by one ordinary process on the same global batches. The
weights after those steps must agree to rounding (float64 models, no dropout: the processes cannot draw
the masks one process would), and so must the recorded losses. Chapter 09's `label_smoothed_loss` computes
in float32, so that trainer agrees to float32 rounding (1e-6), the GPT trainer to float64 rounding (1e-10).
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
WORKER = ROOT / "tests" / "distributed_worker.py"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(kind: str, out: Path, processes: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, str(WORKER), kind, str(out)]
    if processes is not None:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--nnodes=1"]
        launcher += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
        command = [*launcher, str(WORKER), kind, str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("kind", ["gpt", "transformer"])
def test_two_processes_equal_one_process_on_the_global_batch(kind: str, tmp_path: Path) -> None:
    single = _run(kind, tmp_path / "single.pt", None)
    parallel = _run(kind, tmp_path / "parallel.pt", 2)
    assert single["state_dict"].keys() == parallel["state_dict"].keys()
    atol = 1e-10 if kind == "gpt" else 1e-6
    for name, expected in single["state_dict"].items():
        torch.testing.assert_close(parallel["state_dict"][name], expected, rtol=0, atol=atol, msg=name)
    torch.testing.assert_close(parallel["history"]["loss"], single["history"]["loss"], rtol=0, atol=atol)
    if kind == "gpt":  # the validation windows shared out between the processes, the sums added
        torch.testing.assert_close(parallel["history"]["val_loss"], single["history"]["val_loss"], rtol=0, atol=1e-12)
    else:
        assert parallel["history"]["val_exact_match"] == single["history"]["val_exact_match"]


def test_the_runs_compared_above_do_train(tmp_path: Path) -> None:
    """Guards the comparison above against runs that changed nothing: the weights move by far more than atol."""
    sys.path.insert(0, str(ROOT / "tests"))
    import distributed_worker

    from transformer_lab.data import TextTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    trained = _run("gpt", tmp_path / "single.pt", None)["state_dict"]
    vocab = TextTokenizer.from_text(distributed_worker.TEXT).vocab_size
    torch.manual_seed(0)
    initial = GPT(GPTConfig(vocab, block_size=16, d_model=16, n_heads=2, n_layers=2)).double().state_dict()
    assert max((initial[k] - trained[k]).abs().max().item() for k in initial) > 1e-3
