"""The benchmarks' result files name the processor's bfloat16 instructions beside it (issue 35): the cost of
bfloat16 arithmetic on a CPU (chapter 11's torch.optim.Muon) depends on them and on PyTorch's kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench  # noqa: E402 - benchmarks/bench.py, beside the other benchmarks


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n", "avx512_bf16, amx_bf16"),
        ("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n", "avx512_bf16"),
        ("processor\t: 0\nflags\t\t: fpu sse avx2\n", "none of avx512_bf16, amx_bf16"),
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 svebf16 i8mm\n", "bf16, svebf16"),  # Arm (Graviton 3)
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n", "none of bf16, svebf16"),
    ],
)
def test_the_bfloat16_flags_are_read_from_cpuinfo(cpuinfo, expected):
    assert bench.bfloat16_flags(cpuinfo) == f"bfloat16 flags: {expected}"


def test_without_flags_it_says_unknown():
    assert "unknown" in bench.bfloat16_flags("processor\t: 0\nmodel name\t: something\n")


def test_a_cpu_result_file_names_them_beside_the_processor():
    line = bench.device_line(torch.device("cpu"))
    assert line.startswith(f"- device: {bench.machine_name(torch.device('cpu'))}, ")
    assert "bfloat16 flags: " in line
