"""`python benchmarks/modern_decoder.py costs --device ...`: every variant's step cost on a chosen device.

No GPU is needed: the CPU goes through the same code path (the device's synchronisation hook is recorded by a
monkeypatch), a GPU is faked only where no training runs (the file name, the refusal to replace the CPU's file),
and an unavailable device must give an error naming --device.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

#: The variants a test times: chapter 10, one "+" (another optimizer), the full model, and a variant whose cost is
#: copied from its twin (SAME_STEP_AS) instead of timed.
FEW = ("chapter 10", "+ Muon", "full modern", "full + nanochat init")


def _md():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("modern_decoder")


@pytest.fixture()
def md(monkeypatch: pytest.MonkeyPatch):
    module = _md()
    table = module.variants()
    few = {name: table[name] for name in (*FEW, module.TIMED_REFERENCE)}
    monkeypatch.setattr(module, "variants", lambda: few)
    monkeypatch.setattr(module, "_init_worker", lambda: None)  # leave the test process's thread count alone
    return module


def test_costs_on_the_cpu_synchronises_around_every_timed_region_and_records_the_device(
    md, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformer_lab.loop as loop

    events: list[object] = []
    monkeypatch.setattr(md, "_synchronize", lambda device: events.append(device))
    run_steps = loop.run_steps

    def counted(*args, **kwargs):
        events.append("steps")
        return run_steps(*args, **kwargs)

    monkeypatch.setattr(loop, "run_steps", counted)
    out = tmp_path / "costs.json"
    rounds = 2
    assert md.main(["costs", "--device", "cpu", "--rounds", str(rounds), "--steps", "1", "--out", str(out)]) == 0

    timed = [name for name in FEW if name not in md.SAME_STEP_AS]
    # each variant's steps of each round (the warm-up round too) between two synchronisations of the CPU device
    assert events == [torch.device("cpu"), "steps", torch.device("cpu")] * (len(timed) * (rounds + 1))

    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["device"] == "cpu" and result["cuda"] is None
    assert result["device_name"] == md.processor_name() != ""
    assert result["torch"] == torch.__version__ and f"torch {torch.__version__}" in result["made_on"]
    assert result["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert result["made_by"] == "python benchmarks/modern_decoder.py costs"
    assert result["rounds"] == rounds and result["steps_per_round"] == 1
    assert list(result["step_ms"]) == list(FEW) and all(ms > 0 for ms in result["step_ms"].values())
    for name, (low, high) in result["spread_ms"].items():
        assert low <= result["step_ms"][name] <= high, name
    assert result["same_step_as"] == {"full + nanochat init": "full modern"}
    assert result["step_ms"]["full + nanochat init"] == result["step_ms"]["full modern"]
    assert result["steps"]["chapter 10"] == md.CHAPTER_10["steps"]
    ms = result["step_ms"]
    assert result["steps"]["+ Muon"] == max(1, round(md.CHAPTER_10["steps"] * ms["chapter 10"] / ms["+ Muon"]))
    assert result["budget_seconds"] == round(md.CHAPTER_10["steps"] * ms["chapter 10"] / 1000, 2)


def test_the_cpu_writes_the_chapters_file_and_a_gpu_its_own(md, monkeypatch: pytest.MonkeyPatch) -> None:
    assert md.costs_path(torch.device("cpu")) == md.COSTS
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    path = md.costs_path(torch.device("cuda"))
    assert path == md.COSTS.with_name("modern-step-costs-cuda-nvidia-h200.json") != md.COSTS
    assert md.device_name(torch.device("cuda:0")) == "NVIDIA H200"


def test_a_gpu_run_may_not_replace_the_cpus_file(
    md, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(md, "step_costs", lambda *a, **k: pytest.fail("nothing may be timed"))
    before = md.COSTS.read_bytes()
    assert md.main(["costs", "--device", "cuda", "--out", str(md.COSTS)]) == 2
    error = capsys.readouterr().err
    assert "--out" in error and "--device cuda" in error and "modern-step-costs-cuda-nvidia-h200.json" in error
    assert md.COSTS.read_bytes() == before


@pytest.mark.parametrize(
    ("device", "patch", "said"),
    [
        ("cuda", ("cuda", "is_available"), "no CUDA GPU"),
        ("cuda:1", ("cuda", "is_available"), "no CUDA GPU"),
        ("mps", ("backends.mps", "is_available"), "no Apple GPU (MPS)"),
        ("gpu", None, "not a device PyTorch knows"),
    ],
)
def test_an_unavailable_device_is_an_error_naming_device(
    md,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device: str,
    patch: tuple[str, str] | None,
    said: str,
) -> None:
    if patch is not None:  # as on a machine without that GPU, whatever this one has
        owner = torch
        for part in patch[0].split("."):
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, patch[1], lambda: False)
    monkeypatch.setattr(md, "step_costs", lambda *a, **k: pytest.fail("nothing may be timed"))
    out = tmp_path / "costs.json"
    assert md.main(["costs", "--device", device, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"--device={device!r}" in error and said in error and "'cpu'" in error
    assert not out.exists()
