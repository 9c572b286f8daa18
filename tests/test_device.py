"""tl.pick_device() and tl.mps_gaps(): the device of the optional GPU cells, and what they say where Apple's GPU
lacks an operation (transformer_lab/device.py). The GPUs are mocked: PyTorch's own availability checks are replaced,
so every branch runs on this CPU."""

from __future__ import annotations

import pytest
import torch

import transformer_lab as tl
from transformer_lab import i18n


@pytest.fixture
def machine(monkeypatch):
    """Set what PyTorch reports: machine(cuda=..., mps=...)."""

    def set_(cuda: bool, mps: bool) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return set_


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_pick_device_prefers_cuda_then_mps_then_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    device = tl.pick_device()
    assert isinstance(device, torch.device) and device == torch.device(expected)


def test_pick_device_without_an_mps_backend(machine, monkeypatch):
    """A PyTorch build without torch.backends.mps (an old or stripped build) falls back to the CPU."""
    machine(cuda=False, mps=True)
    monkeypatch.setattr(torch.backends, "mps", None)
    assert tl.pick_device() == torch.device("cpu")


def test_pick_device_on_this_machine_is_what_torch_says():
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert tl.pick_device().type == expected


def missing_operator():
    raise NotImplementedError(
        "The operator 'aten::_fft_r2c' is not currently implemented for the MPS device.\nIf you want this op..."
    )


def no_float64():
    raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64.")


@pytest.mark.parametrize("fail", [missing_operator, no_float64])
@pytest.mark.parametrize("language", ["en", "zh"])
def test_on_mps_a_missing_operation_is_one_sentence(fail, language, capsys):
    with i18n.language(language):
        with tl.mps_gaps(torch.device("mps")):
            fail()
        printed = capsys.readouterr().out
    assert printed.count("\n") == 1, printed
    first_line = str(pytest.raises((NotImplementedError, TypeError), fail).value).splitlines()[0]
    assert first_line in printed
    assert printed.startswith("skipped on mps" if language == "en" else "已在 mps 上跳过")
    assert printed == i18n.messages()["device.mps_missing"][language].format(reason=first_line) + "\n"


@pytest.mark.parametrize("device", ["cuda", "cpu", torch.device("cpu")])
def test_elsewhere_the_error_stands(device):
    with pytest.raises(NotImplementedError), tl.mps_gaps(device):
        missing_operator()


def test_other_errors_stand_on_mps_too(capsys):
    with pytest.raises(TypeError, match="unsupported operand"), tl.mps_gaps("mps"):
        None + 1  # noqa: B018 - a plain TypeError, not a missing mps operation
    with pytest.raises(RuntimeError), tl.mps_gaps("mps"):
        raise RuntimeError("shape mismatch")
    assert capsys.readouterr().out == ""


def test_nothing_is_printed_when_the_block_succeeds(capsys):
    with tl.mps_gaps("mps"):
        torch.ones(2).sum()
    assert capsys.readouterr().out == ""
