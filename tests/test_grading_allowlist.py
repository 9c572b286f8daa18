# ruff: noqa: E501  (attack code kept on one line each, as a student would write it)
"""Issue 36, part A: each exercise's allow-list of ATen operators, a record the answer cannot undo, chapter 04's
statistics helpers, and the sandbox's memory and POSIX checks.

The answers here run in a real sandbox without the static check in front of them (`grade_exercise`), as code past
that check would: the record of the operators they run is streamed to the grading server, outside the answer's
process, and checked there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import require_sandbox
from test_classroom import NOTEBOOKS, ROOT

from transformer_lab.exercises import grading, policy, runner, sandbox

SECRET = 20261202
HONEST = "def softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\n    return e / e.sum(-1, keepdim=True)\n"
#: answers past the static check that take the record away or reach it from inside (softmax_rows of chapter 01)
UNDO_ATTACKS = {
    "pop_both_modes": (
        "from torch.utils._python_dispatch import _pop_mode\n"
        "def softmax_rows(x):\n    while torch._C._len_torch_function_stack():\n        torch._C._pop_torch_function_stack()\n"
        "    while torch._C._len_torch_dispatch_stack():\n        _pop_mode()\n"
        "    return torch.softmax(x, -1)\n"
    ),
    "pop_record_only": (
        "from torch.utils._python_dispatch import _pop_mode\n"
        "def softmax_rows(x):\n    _pop_mode()\n    return torch.ops.aten._softmax(x, -1, False)\n"
    ),
    # flagged because the function mode refuses `_softmax` before the record is pushed back, so the case ends without
    # its record; popping the record and pushing it back around an operator the function mode lets through is NOT
    # seen by the canary (the runner's docstring says so): only the static check, which refuses the private names
    # it needs, stops that
    "pop_and_push_back": (
        "from torch.utils._python_dispatch import _pop_mode, _push_mode\n"
        "def softmax_rows(x):\n    record = _pop_mode()\n    y = torch.ops.aten._softmax(x, -1, False)\n"
        "    _push_mode(record)\n    return y\n"
    ),
    "clear_record": (
        "from torch.utils._python_dispatch import _get_current_dispatch_mode\n"
        "def softmax_rows(x):\n    record = _get_current_dispatch_mode()\n"
        "    y = torch.ops.aten._softmax(x, -1, False)\n    record.seen.clear()\n    return y\n"
    ),
    "gc_finds_record": (
        "import gc\ndef softmax_rows(x):\n    for o in gc.get_objects():\n"
        "        if type(o).__name__ == 'OperatorRecord':\n            o.seen.clear()\n" + HONEST.split("\n", 1)[1]
    ),
    "rerun_library_source": (
        "import transformer_lab as tl\nmine = {'__name__': 'mine'}\n"
        "exec(open(os.path.join(os.path.dirname(tl.__file__), 'attention.py')).read(), mine)\n" + HONEST
    ),
    "runpy_library": (
        "import runpy, transformer_lab as tl\n"
        "mine = runpy.run_path(os.path.join(os.path.dirname(tl.__file__), 'normalization.py'))\n" + HONEST
    ),
}
#: answers that compute the softmax with a public helper no deny-list names: outside the exercise's allow-list
OUTSIDE_ATTACKS = {
    "normalize": "import torch.nn.functional as F\ndef softmax_rows(x):\n    return F.normalize(torch.exp(x - x.max(-1, keepdim=True).values), p=1, dim=-1)\n",
    "vector_norm": "def softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\n    return e / torch.linalg.vector_norm(e, 1, -1, True)\n",
    "gelu_sprinkled": "import torch.nn.functional as F\ndef softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values + 0 * F.gelu(x))\n    return e / e.sum(-1, keepdim=True)\n",
}

#: honest answers whose library function the exercise is not about: the learner's own check accepts them, so the
#: class grader must too (a cross-entropy or log-softmax where the exercise is the loss built on top of it, a
#: torch.allclose, rotations as complex numbers)
LIBRARY_HONEST = {
    ("ch13_instruction", "response_loss", "cross_entropy"): (
        "import torch.nn.functional as F\ndef response_loss(logits, targets, mask):\n    losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')\n    return losses[mask].mean()\n"
    ),
    ("ch13_instruction", "response_loss", "log_softmax"): (
        "def response_loss(logits, targets, mask):\n    losses = -logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]\n    return losses[mask].mean()\n"
    ),
    ("ch02_masking", "is_causal", "allclose"): (
        "def is_causal(fn, x):\n    base = fn(x)\n    for t in range(x.shape[1]):\n        changed = x.clone()\n        changed[:, t] += 1.0\n        if not torch.allclose(fn(changed)[:, :t], base[:, :t]):\n            return False\n    return True\n"
    ),
    ("ch08_embeddings", "rotary", "polar"): (
        "def rotary(x):\n    L, D = x.shape[-2:]\n    if D % 2:\n        raise ValueError('rotary needs an even d_model')\n    theta = torch.outer(torch.arange(L, dtype=torch.float64), 10000 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D))\n    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2).contiguous())\n    return torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2).to(x.dtype)\n"
    ),
    ("ch12_tokens", "bits_per_byte", "log_softmax"): (
        "import math\nimport torch.nn.functional as F\ndef bits_per_byte(logits, targets, token_bytes):\n    nats = -F.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).sum()\n    return (nats / math.log(2) / token_bytes[targets].sum()).item()\n"
    ),
}


def _verified(stem: str, attribute: str, source: str) -> dict:
    """The grading server's verdict (`runner.verify`) on the operators `source` runs on every case of the exercise,
    streamed as the child streams them, and whether the learner's own check accepts it."""
    import importlib

    import torch

    from transformer_lab.exercises.core import _needs_grad

    exercise = getattr(importlib.import_module(f"transformer_lab.exercises.{stem}"), attribute)
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102 - the honest answers above
    answer = namespace[exercise.name]
    stream, entries = b"", []
    for index, case in enumerate(exercise.cases):
        inputs = case.inputs()
        record = runner.OperatorRecord()
        with record, torch.enable_grad() if _needs_grad(inputs) else torch.no_grad():
            try:
                exercise._run(answer, *inputs)
            except Exception as error:  # a case that asks for an error (an odd d_model) gets it
                if case.raises is None or not isinstance(error, case.raises):
                    raise
            torch.ones(()).frac()  # the runner's canary
        ops = [op for op in sorted(record.seen) if op != runner.CANARY] + [runner.CANARY]
        stream += f"S{index}\n".encode() + b"".join(f"O{op}\n".encode() for op in ops) + f"E{index}\n".encode()
        entries.append({"error": None})
    result = runner.verify(
        {"module": f"transformer_lab.exercises.{stem}", "exercise": attribute}, {"cases": entries}, stream
    )
    return {"local": exercise.run(answer).passed, "result": result}


@pytest.mark.parametrize("key", sorted(LIBRARY_HONEST), ids=lambda key: f"{key[1]}-{key[2]}")
def test_an_honest_answer_with_a_library_loss_passes_the_allow_list(key):
    """Review item: F.cross_entropy / log_softmax answers of response_loss and bits_per_byte passed the learner's
    check but were refused by the grader as outside the allow-list (0 points, flagged)."""
    verdict = _verified(key[0], key[1], LIBRARY_HONEST[key])
    assert verdict["local"], key
    result = verdict["result"]
    assert result["record"]["allowlist"] and not result["record"]["outside"], result["record"]
    assert not any(entry.get("shortcut") for entry in result["cases"]), result["cases"]


def test_the_allow_list_check_still_refuses_an_operator_outside_it():
    """The same check refuses a library loss where the exercise forbids it (bits_per_byte: no nll_loss)."""
    source = "import math\ndef bits_per_byte(logits, targets, token_bytes):\n    nats = torch.ops.aten.nll_loss_forward(logits.log_softmax(-1).flatten(0, 1), targets.flatten(), None, 2, -100)[0]\n    return (nats / math.log(2) / token_bytes[targets].sum()).item()\n"
    result = _verified("ch12_tokens", "bits_per_byte", source)["result"]
    assert "nll_loss_forward" in result["record"]["outside"], result["record"]
    assert all("allow-list" in entry["shortcut"] for entry in result["cases"]), result["cases"]


@pytest.mark.slow
def test_an_honest_cross_entropy_answer_gets_full_points_in_the_sandbox(session):
    from transformer_lab.exercises import ch13_instruction

    source = LIBRARY_HONEST[("ch13_instruction", "response_loss", "cross_entropy")]
    grade = _run(session, source, ch13_instruction.response_loss, "response_loss")
    assert grade.points == 1.0 and not grade.shortcut, _said(grade)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or runner._seccomp_program() is None, reason="Linux x86-64/AArch64"
)
def test_a_child_cannot_reach_another_process_memory_and_the_server_is_not_dumpable():
    """The child's seccomp filter refuses process_vm_readv/process_vm_writev (and ptrace); the server sets itself not
    dumpable, so that no child opens its /proc/<pid>/mem."""
    code = (
        "import ctypes, os, platform\n"
        "from transformer_lab.exercises import runner\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('dumpable', runner.not_dumpable(), libc.prctl(3, 0, 0, 0, 0))\n"
        "print('seccomp', runner.give_up_processes_and_signals())\n"
        "numbers = {'x86_64': (310, 311, 101), 'aarch64': (270, 271, 117)}[platform.machine()]\n"
        "buffer = ctypes.create_string_buffer(8)\n"
        "class Iovec(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "iov = Iovec(ctypes.cast(buffer, ctypes.c_void_p), 8)\n"
        "for name, number in zip(('process_vm_readv', 'process_vm_writev'), numbers[:2]):\n"
        "    got = libc.syscall(number, os.getppid(), ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0)\n"
        "    print(name, got, ctypes.get_errno())\n"
        "print('ptrace', libc.syscall(numbers[2], 16, os.getppid(), 0, 0), ctypes.get_errno())\n"
    )
    proc = _python(code, timeout=120)
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert proc.returncode == 0 and lines.get("dumpable") == "None 0", proc.stdout + proc.stderr[-2000:]
    assert lines["seccomp"] == "True", lines
    for name in ("process_vm_readv", "process_vm_writev", "ptrace"):
        assert lines[name] in ("-1 1", "-1 38"), (name, lines)  # EPERM (or ENOSYS)


@pytest.fixture(scope="module")
def session():
    require_sandbox()
    with grading.GradingSession() as made:
        yield made


def _python(code: str, timeout: int) -> subprocess.CompletedProcess:
    """`code` run by a fresh Python in the repository, one thread, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def _run(session, source: str, exercise=None, function: str = "softmax_rows"):
    from transformer_lab.exercises import ch01_attention

    exercise = exercise or ch01_attention.softmax_rows
    cells = [("setup", "import torch\nimport os\n"), ("answer", source)]
    with session.server() as server:
        return grading.grade_exercise(exercise, function, cells, 1.0, SECRET, 5.0, server)


def _said(grade) -> str:
    return " | ".join(text for _, text in grade.cases) + " | " + " | ".join(grade.problems)


@pytest.mark.slow
def test_honest_answers_pass_and_their_operators_are_recorded_outside(session):
    grade = _run(session, HONEST)
    assert grade.points == 1.0 and not grade.shortcut, _said(grade)
    variant = "def softmax_rows(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n    return e / e.sum(dim=-1, keepdim=True)\n"
    assert _run(session, variant).points == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(UNDO_ATTACKS))
def test_an_answer_that_undoes_or_reaches_the_record_gets_nothing_and_is_flagged(session, name):
    grade = _run(session, UNDO_ATTACKS[name])
    assert grade.points == 0, _said(grade)
    assert grade.shortcut or grade.fused, _said(grade)
    assert grade.problems, _said(grade)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OUTSIDE_ATTACKS))
def test_an_operator_outside_the_allow_list_scores_nothing_and_is_named(session, name):
    grade = _run(session, OUTSIDE_ATTACKS[name])
    assert grade.points == 0 and grade.shortcut, _said(grade)
    assert "allow-list" in grade.shortcut, grade.shortcut
    assert any(op in grade.shortcut for op in ("linalg_vector_norm", "gelu")), grade.shortcut


@pytest.mark.slow
def test_the_library_statistics_helpers_are_blocked_in_the_sandbox_too(session):
    """Past the static check, chapter 04's answers cannot reach the library's statistics either."""
    from transformer_lab.exercises import ch04_normalization

    sources = {
        "layer_norm": "import transformer_lab as tl\ndef layer_norm(x, gamma, beta, eps=1e-5):\n    mean, var = tl.layer_norm_statistics(x)\n    return gamma * (x - mean) / torch.sqrt(var + eps) + beta\n",
        "rms_norm": "import transformer_lab as tl\ndef rms_norm(x, gamma, eps=1e-6):\n    mean, var = tl.layer_norm_statistics(x)\n    return gamma * x / torch.sqrt(var + mean ** 2 + eps)\n",
    }
    for function, source in sources.items():
        grade = _run(session, source, getattr(ch04_normalization, function), function)
        assert grade.points == 0 and grade.shortcut, (function, _said(grade))


def test_the_record_stream_is_read_strictly():
    ok = b"S0\nOexp\nOsum\nOfrac\nE0\nS1\nOexp\nOfrac\nE1\n"
    record = runner.read_record(ok, 2)
    assert record["ops"] == [["exp", "sum"], ["exp"]] and record["undone"] == [False, False] and not record["tampered"]
    popped = runner.read_record(b"S0\nOexp\nE0\n", 1)  # no canary before the end: the record was taken away
    assert popped["undone"] == [True]
    forged = runner.read_record(b"S0\nOexp\nOfrac\nE0\nE0\nXyz\n", 1)
    assert forged["tampered"], forged
    audit = runner.read_record(b"Agc.get_objects\nS0\nOfrac\nE0\n", 1)
    assert audit["tampered"] == ["audit event gc.get_objects"]
    assert runner.read_record(b"O" * (runner.MAX_RECORD + 10), 1)["tampered"]


def test_every_exercise_has_an_allow_list_and_no_list_allows_its_fused_kernels():
    data = json.loads((ROOT / "transformer_lab" / "exercises" / "operators.json").read_text(encoding="utf-8"))
    generic = set(data["generic"])
    assert {"exp", "sum", "amax", "sub", "div", "mean", "var", "sqrt", "view", "masked_fill"} <= generic
    assert not generic & {"_softmax", "native_layer_norm", "linalg_vector_norm", "_cdist_forward", "gelu"}
    for key, own in data["exercises"].items():
        denied = grading.FUSED_KERNELS.get(key.split(".", 1)[1], frozenset())
        assert not (generic | set(own)) & denied, key
    for path in NOTEBOOKS:
        chapter = path.name[:2]
        if chapter in ("01", "04"):
            assert any(key.startswith(f"ch{chapter}_") for key in data["exercises"]), chapter


@pytest.mark.slow
def test_the_stored_allow_lists_are_derived_afresh(tmp_path):
    """tools/allowed_operators.py --check derives every list again and fails on any difference."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", MPLCONFIGDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "allowed_operators.py"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_chapter_04_refuses_the_library_statistics_before_anything_runs():
    context = policy.DEFAULT_CONTEXT + "from transformer_lab.exercises import ch04_normalization as exercises\n"
    attacks = [
        "def masked_batch_norm(x, mask, gamma, beta, eps=1e-5):\n    mean, var, _ = tl.normalization.batch_norm_statistics_per_position(x, mask)\n    return x\n",
        "from transformer_lab.normalization import layer_norm_statistics as stats\n",
        "helper = tl.batch_norm_statistics\n",
        "norm = tl.LayerNorm\n",
    ]
    for source in attacks:
        assert policy.refusals(source, context), source
    honest = "def layer_norm(x, gamma, beta, eps=1e-5):\n    mean = x.mean(-1, keepdim=True)\n    var = x.var(-1, keepdim=True, unbiased=False)\n    return gamma * (x - mean) / torch.sqrt(var + eps) + beta\n"
    assert not policy.refusals(honest, context)
    # chapter 01 has no such list: tl.LayerNorm is refused only where the chapter computes the statistics
    assert not policy.refusals("norm = tl.LayerNorm\n", policy.DEFAULT_CONTEXT)


def test_every_tmpfs_of_the_sandbox_has_a_size_and_the_memory_limit_says_which(tmp_path):
    argv = sandbox.command(tmp_path, tmp_path, sandbox.Limits(), hide=(str(ROOT),))
    for index, word in enumerate(argv):
        if word == "--tmpfs":
            assert "--size" in argv[max(0, index - 3) : index], argv[index - 3 : index + 2]
    assert "--remount-ro" in argv and argv[argv.index("--dev") + 2] == "--remount-ro"
    where, said = sandbox.memory_cgroup()
    assert said and (where is None) == ("RLIMIT_AS" in said), said


def test_without_posix_modules_the_sandbox_says_so_in_one_sentence(tmp_path):
    code = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('resource', 'fcntl'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "for name in ('resource', 'fcntl'):\n    sys.modules.pop(name, None)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import importlib.util\nimportlib.util.find_spec = lambda name, *a: None if name in ('resource', 'fcntl') else __import__('importlib').machinery.PathFinder.find_spec(name)\n"
        "from transformer_lab.exercises import grading, sandbox\n"
        "print(sandbox.probe())\n"
        "try:\n    sandbox.SandboxServer(None, None, sandbox.Limits())\nexcept sandbox.SandboxUnavailable as exc:\n    print('REFUSED', exc)\n"
    )
    proc = _python(code, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr[-2000:]
    assert lines[0].startswith("grading a class needs Linux") and "resource" in lines[0], lines
    assert lines[1] == "REFUSED " + lines[0]
