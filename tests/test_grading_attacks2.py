# ruff: noqa: E501  (attack code kept on one line each, as a student would write it)
"""Attacks on what the grader does around the sandbox (issue 36): collecting the submissions, writing the report
and the feedback, and trusting what comes out of a sandbox. These run without a sandbox (the attacks never reach
one) except where marked; tests/test_grading_attacks.py grades a whole class with attackers in it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import stat
import zipfile

import pytest
from test_classroom import NOTEBOOKS, classroom

CHAPTERS = ["01_attention", "04_normalization"]
TEACHER = next(p for p in NOTEBOOKS if p.name.startswith("01"))


def _notebook(tag: str = "") -> str:
    data = json.loads(TEACHER.read_text(encoding="utf-8"))
    data["metadata"]["tag"] = tag
    return json.dumps(data)


def _class(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A submissions folder with one honest student, ada; and a course directory."""
    subs, course = tmp_path / "subs", tmp_path / "course"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "01_attention.ipynb").write_text(_notebook("ada"), encoding="utf-8")
    course.mkdir()
    return subs, course


def _collected(subs, course):
    students, notes = classroom.collect(subs, course, CHAPTERS)
    assert set(students["ada"]) == {"01_attention"}  # the rest of the class is collected
    assert json.loads(students["ada"]["01_attention"].read_text(encoding="utf-8"))["metadata"]["tag"] == "ada"
    return students, notes


# ------------------------------------------------------------------ collecting: links are never followed


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(lambda subs: TEACHER, id="link_to_the_teachers_notebook"),
        pytest.param(lambda subs: subs / "ada" / "01_attention.ipynb", id="link_to_another_students_notebook"),
        pytest.param(lambda subs: pathlib.Path("../ada/01_attention.ipynb"), id="relative_link_to_another_student"),
        pytest.param(lambda subs: subs / "nowhere.ipynb", id="dangling_link"),
        pytest.param(lambda subs: pathlib.Path("/proc/self/environ"), id="link_to_proc"),
    ],
)
def test_a_link_named_like_a_notebook_is_one_note_and_never_read(tmp_path, target):
    subs, course = _class(tmp_path)
    (subs / "mallory").mkdir()
    (subs / "mallory" / "01_attention.ipynb").symlink_to(target(subs))
    students, notes = _collected(subs, course)
    assert students["mallory"] == {}
    assert not (course / "submitted" / "mallory" / "01_attention").exists()
    assert any("symbolic link" in n and "not graded" in n for n in notes["mallory"]), notes["mallory"]


def test_a_student_folder_that_is_a_link_is_not_graded(tmp_path):
    subs, course = _class(tmp_path)
    (subs / "mallory").symlink_to(subs / "ada")
    (subs / "trudy").symlink_to(TEACHER.parent)  # the teacher's source edition as a student folder
    students, notes = _collected(subs, course)
    assert "mallory" not in students and "trudy" not in students
    folder = notes[classroom.FOLDER_NOTES]
    assert sum("symbolic link" in n for n in folder) == 2, folder


def test_a_link_to_a_folder_inside_a_student_folder_is_not_followed(tmp_path):
    subs, course = _class(tmp_path)
    (subs / "mallory").mkdir()
    (subs / "mallory" / "student").symlink_to(subs / "ada")  # "a whole handed-back folder" that is a link
    (subs / "eve").mkdir()
    (subs / "eve" / "loop").symlink_to(subs / "eve")  # a loop: never walked
    students, notes = _collected(subs, course)
    assert students["mallory"] == {} and students["eve"] == {}


def test_a_folder_or_a_fifo_named_like_a_notebook_is_one_note(tmp_path):
    subs, course = _class(tmp_path)
    (subs / "mallory" / "01_attention.ipynb").mkdir(parents=True)
    (subs / "eve").mkdir()
    os.mkfifo(subs / "eve" / "01_attention.ipynb")  # reading it would wait for ever
    (subs / "trudy").mkdir()
    os.mkfifo(subs / "trudy" / "04_normalization.ipynb")
    (subs / "trudy" / "01_attention (1).ipynb").mkdir()
    students, notes = _collected(subs, course)
    assert students["mallory"] == students["eve"] == students["trudy"] == {}
    assert any("a folder" in n for n in notes["mallory"]), notes["mallory"]
    assert any("named pipe" in n for n in notes["eve"]), notes["eve"]
    assert sum("not graded" in n for n in notes["trudy"]) >= 2, notes["trudy"]


def test_read_regular_refuses_what_is_not_a_regular_file_and_what_is_too_large(tmp_path):
    os.mkfifo(tmp_path / "pipe.ipynb")
    (tmp_path / "link.ipynb").symlink_to(TEACHER)
    (tmp_path / "big.ipynb").write_bytes(b" " * 2048)
    for name, needle in (("pipe.ipynb", "named pipe"), ("link.ipynb", "symbolic link"), ("big.ipynb", "MiB")):
        with pytest.raises(ValueError, match=needle):
            classroom.read_regular(tmp_path / name, limit=1024)


def test_a_notebook_too_large_is_one_note(tmp_path, monkeypatch):
    subs, course = _class(tmp_path)
    (subs / "mallory").mkdir()
    (subs / "mallory" / "01_attention.ipynb").write_text(_notebook("x" * 200_000), encoding="utf-8")
    monkeypatch.setattr(classroom, "MAX_NOTEBOOK_BYTES", 150_000)
    students, notes = classroom.collect(subs, course, CHAPTERS)
    assert students["mallory"] == {} and any("MiB" in n for n in notes["mallory"]), notes["mallory"]


def test_deeply_nested_json_is_an_unreadable_notebook_not_a_crash(tmp_path):
    path = tmp_path / "01_attention.ipynb"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ValueError, match="nested too deeply|not a notebook"):
        classroom.read_notebook(path)


# ------------------------------------------------------------------ collecting: archives


def _zip_with(path: pathlib.Path, members: list[tuple[str, bytes, int]]) -> None:
    with zipfile.ZipFile(path, "w") as zipped:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zipped.writestr(info, data)


def test_an_archive_keeps_only_regular_files_inside_it(tmp_path):
    archive = tmp_path / "class.zip"
    _zip_with(
        archive,
        [
            ("ada/01_attention.ipynb", _notebook("ada").encode(), stat.S_IFREG | 0o644),
            ("mallory/01_attention.ipynb", str(TEACHER).encode(), stat.S_IFLNK | 0o777),  # as `zip -y` stores a link
            ("eve/01_attention.ipynb", b"../ada/01_attention.ipynb", stat.S_IFLNK | 0o777),
            ("../outside.ipynb", b"{}", stat.S_IFREG | 0o644),
            ("/abs/01_attention.ipynb", b"{}", stat.S_IFREG | 0o644),
        ],
    )
    dest = tmp_path / "unpacked"
    dest.mkdir()
    notes = classroom.unpack_archive(archive, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["ada/01_attention.ipynb"]
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert any("symbolic link" in n for n in notes["mallory"]) and any("symbolic link" in n for n in notes["eve"])
    assert sum("outside" in n for n in notes[classroom.FOLDER_NOTES]) == 2
    assert not (tmp_path / "outside.ipynb").exists()


def test_an_archive_that_expands_past_its_limit_is_cut(tmp_path, monkeypatch):
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("ada/01_attention.ipynb", _notebook("ada"))
        zipped.writestr("bomb/01_attention.ipynb", b"0" * (4 << 20))  # 4 MiB of zeros, a few KiB zipped
    monkeypatch.setattr(classroom, "MAX_NOTEBOOK_BYTES", 1 << 20)
    dest = tmp_path / "unpacked"
    dest.mkdir()
    notes = classroom.unpack_archive(archive, dest)
    assert not (dest / "bomb" / "01_attention.ipynb").exists()
    assert any("too large" in n for n in notes["bomb"]), notes


# ------------------------------------------------------------------ the report: student text cannot forge it


def _sections(report: str) -> dict[str, str]:
    sections = {}
    for block in ("\n" + report).split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip()] = body
    return sections


FORGED = "x\n\n## No problem\n\n- mallory\n- [grades](javascript:alert(1)) <img src=x onerror=alert(1)> &amp;"


def test_a_file_name_or_an_error_message_cannot_forge_the_report(tmp_path):
    subs, course = _class(tmp_path)
    (subs / "mallory").mkdir()
    (subs / "mallory" / f"01_attention{FORGED}.ipynb").write_text(
        "not json", encoding="utf-8"
    )  # a misnamed file, a name with newlines
    (subs / f"eve{FORGED}").mkdir()  # a folder that is no student id
    students, notes = classroom.collect(subs, course, CHAPTERS)
    (course / "grading").mkdir()
    (course / "grading" / "notes.json").write_text(json.dumps(notes), encoding="utf-8")
    records = [
        {"student": "ada", "chapter": "01_attention", "exercises": [], "problems": []},
        {
            "student": "trudy",
            "chapter": "01_attention",
            "exercises": [],
            "problems": [f"answer ch01_softmax_rows raised ValueError: {FORGED}", "crashed\n" + FORGED * 50],
        },
    ]
    report = classroom.write_report(course, records, ["ada", "mallory", "trudy"]).read_text(encoding="utf-8")
    sections = _sections(report)
    assert list(sections) == ["Not graded: entries of the submissions folder", "mallory", "trudy", "No problem"]
    assert sections["No problem"].split() == ["-", "ada"]
    assert "\n- mallory" not in report
    for forged in ("<img", "[grades]", "&amp;"):  # shown, but escaped: no tag, no link, no entity
        assert re.search(r"(?<!\\)" + re.escape(forged), report) is None, forged
        assert "\\" + forged[0] in report
    assert max(len(line) for line in report.splitlines()) < 700  # an error message is cut


def test_feedback_pages_escape_student_text(tmp_path):
    record = {
        "student": "trudy",
        "chapter": "01_attention",
        "exercises": [
            {
                "exercise": "softmax_rows",
                "points": 0.0,
                "max_points": 1.0,
                "cases": [[False, "<script>alert(1)</script>"]],
            }
        ],
        "problems": ["answer raised <img src=x onerror=alert(1)>"],
    }
    page = "\n".join(classroom._feedback_body(record))
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page


# ------------------------------------------------------------------ the grader trusts nothing from a sandbox


def test_a_frame_over_the_limit_is_not_read(tmp_path):
    from transformer_lab.exercises import runner

    read, write = os.pipe()
    os.write(write, (50 << 20).to_bytes(8, "little") + b"x" * 1000)  # says 50 MB: refused from its header
    assert runner.read_frame(read, None, limit=runner.MAX_RESULT) is None
    os.close(read)
    os.close(write)
    with pytest.raises(ValueError, match="more than"):
        runner.loads(b"0" * 2048, limit=1024)


def _compressed(value) -> bytes:
    """`value` saved by torch, then its archive's members compressed (what a forged frame may hold)."""
    import io

    from transformer_lab.exercises import runner

    plain = zipfile.ZipFile(io.BytesIO(runner.dumps(value)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for info in plain.infolist():
            packed.writestr(info.filename, plain.read(info))
    return out.getvalue()


def test_a_compressed_frame_is_refused_before_it_expands():
    import torch

    from transformer_lab.exercises import runner

    frame = _compressed({"cases": [{"value": torch.zeros(16 << 20)}]})  # 64 MiB of zeros in a few KiB
    assert len(frame) < 1 << 20
    with pytest.raises(ValueError, match="compressed"):
        runner.loads(frame, limit=runner.MAX_RESULT)
    honest = runner.dumps({"cases": [{"value": torch.ones(3)}]})
    assert runner.loads(honest, limit=runner.MAX_RESULT)["cases"][0]["value"].sum() == 3


def _result(**case) -> dict:
    entry = {"value": None, "error": None, "error_types": [], "shortcut": None, "not_done": False, "ops": []}
    entry.update(case)
    return {"cells": [{"kind": "answer x", "error": None}], "cases": [entry], "tampered": []}


def test_a_forged_result_is_cut_copied_or_refused():
    import torch

    from transformer_lab.exercises import grading

    cleaned = grading.clean_result(
        dict(_result(error="E" * 1_000_000, ops=["mm", "x\n## forged", 7]), tampered=["torch.allclose", "evil" * 100]),
        1,
    )
    case = cleaned["cases"][0]
    assert len(case["error"]) <= grading.MAX_TEXT and case["ops"] == ["<unnamed>", "mm"]
    assert cleaned["tampered"] == ["torch.allclose"]
    shared: list = [1.0]
    for _ in range(64):  # 2**64 leaves by reference, a few hundred bytes pickled
        shared = [shared, shared]
    for forged in (
        _result(value=shared),
        _result(value=torch.zeros(1).expand(1 << 40)),  # a tensor far larger than its storage
        _result(value=torch.zeros(1 << 23)),  # more elements than an answer returns
        {"cells": [], "cases": [], "tampered": []},  # not this exercise's cases
        ["not", "a", "record"],
    ):
        with pytest.raises(grading.Malformed):
            grading.clean_result(forged, 1)


# ------------------------------------------------------------------ answer cells the static passes cannot read


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("x = " + "+".join(["a"] * 20_000), id="a_long_chain"),
        pytest.param("x = " + "-" * 30_000 + "1", id="nested_unary"),
        pytest.param("x = a" + ".b" * 30_000, id="attribute_chain"),
        pytest.param("f = " + "lambda: " * 5_000 + "1", id="nested_lambdas"),
        pytest.param("x = 1\n" * 20_000, id="too_long"),
        pytest.param("x = " + "f(" * 150 + ")" * 150, id="deep_calls"),
    ],
)
def test_deep_or_large_sources_are_unreadable_never_a_crash(source):
    from transformer_lab.exercises import grading, policy

    assert policy.unreadable(source)
    assert policy.refusals(source)  # refused too, should a caller skip unreadable()
    assert grading.suspicious_lines(source) == [] and grading._blank(source) == set()


def test_every_honest_answer_is_readable():
    for path in NOTEBOOKS:
        from transformer_lab.exercises import policy

        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["metadata"].get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
                assert policy.unreadable("".join(cell["source"])) is None, path.name


# ------------------------------------------------------------------ in a sandbox, without the static check in front


@pytest.fixture(scope="module")
def session():
    from support import require_sandbox

    from transformer_lab.exercises import grading

    require_sandbox()
    with grading.GradingSession() as made:
        yield made


SOFTMAX = "def softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\n    return e / e.sum(-1, keepdim=True)\n"


def _run(session, source: str, timeout: float = 5.0, deadline: float | None = None):
    from transformer_lab.exercises import ch01_attention, grading

    cells = [("setup", "import torch\nimport os\n"), ("answer", source)]
    with session.server() as server:
        return grading.grade_exercise(
            ch01_attention.softmax_rows, "softmax_rows", cells, 1.0, 7, timeout, server, deadline=deadline
        )


def _said(grade) -> str:
    return " | ".join(text for _, text in grade.cases) + " | " + " | ".join(grade.problems)


@pytest.mark.slow
@pytest.mark.parametrize(
    "wait",
    [
        pytest.param("time.sleep(600)", id="sleep"),
        pytest.param("os.read(os.pipe()[0], 1)", id="blocked_read"),
        pytest.param("threading.Event().wait()", id="event_no_one_sets"),
    ],
)
def test_an_answer_that_waits_without_computing_is_ended(session, wait):

    source = (
        "import signal, threading, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # the time limit's alarm never arrives\n"
        f"def softmax_rows(x):\n    {wait}\n    return x\n"
    )
    grade = _run(session, source, timeout=2.0)
    # the grade says why it was ended (a wall-clock bound here would only measure how busy the machine is)
    assert grade.points == 0 and "waited without computing" in _said(grade), _said(grade)


@pytest.mark.slow
def test_an_answer_that_spins_past_its_alarms_is_held_to_the_chapter_deadline(session):
    import time

    source = (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "def softmax_rows(x):\n    while True:\n        pass\n"
    )
    start = time.monotonic()
    grade = _run(session, source, timeout=10.0, deadline=time.monotonic() + 8)
    # ended at the 8 s deadline, not at the exercise's own budget of (cells + cases) x 10 s + 30 s (over 100 s): the
    # bound leaves a busy machine 7 times the deadline
    assert grade.points == 0 and time.monotonic() - start < 60, _said(grade)


@pytest.mark.slow
def test_threads_are_allowed_and_processes_are_not(session):
    source = (
        "import threading\n"
        "def softmax_rows(x):\n    box = []\n    worker = threading.Thread(target=lambda: box.append(torch.exp(x - x.max(-1, keepdim=True).values)))\n"
        "    worker.start()\n    worker.join()\n    e = box[0]\n    return e / e.sum(-1, keepdim=True)\n"
    )
    assert _run(session, source).points == 1.0, _said(_run(session, source))
    forked = (
        "refused = []\ntry:\n    os.fork()\nexcept OSError as exc:\n    refused.append(type(exc).__name__)\n"
        + SOFTMAX.replace("    return e", "    assert refused == ['PermissionError'], refused\n    return e")
    )
    assert _run(session, forked).points == 1.0, _said(_run(session, forked))


@pytest.mark.slow
def test_dev_holds_nothing_an_answer_writes(session):
    source = (
        "said = []\nfor path in ('/dev/big', '/dev/shm/big', '/dev/mqueue/big'):\n    try:\n"
        "        with open(path, 'wb') as f:\n            f.write(b'x' * (1 << 20))\n        said.append('written')\n"
        "    except OSError as exc:\n        said.append(type(exc).__name__)\n"
        "with open('/dev/null', 'wb') as f:\n    f.write(b'x')\n"
        + SOFTMAX.replace("    return e", "    assert 'written' not in said, said\n    return e")
    )
    grade = _run(session, source)
    assert grade.points == 1.0, _said(grade)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["compressed", "large", "many_cases"])
def test_a_frame_forged_from_inside_is_not_credited(session, kind):
    """The answer writes its own result to the pipe its child answers on (the only descriptor left open)."""
    import resource

    forge = {
        "compressed": "payload = forged_zip({'cells': [], 'cases': [{'value': torch.zeros(1 << 23)}] * 6, 'tampered': []})",  # 32 MiB of zeros, a few KiB packed
        "large": "payload = b'0' * (50 << 20)",
        "many_cases": "payload = plain_save({'cells': [], 'cases': [{'value': 1.0}] * 600, 'tampered': []})",
    }[kind]
    source = (
        "import io, zipfile, struct\n"
        "def plain_save(value):\n    buffer = io.BytesIO()\n    torch.save(value, buffer)\n    return buffer.getvalue()\n"
        "def forged_zip(value):\n    plain = zipfile.ZipFile(io.BytesIO(plain_save(value)))\n    out = io.BytesIO()\n"
        "    with zipfile.ZipFile(out, 'w', compression=zipfile.ZIP_DEFLATED) as z:\n"
        "        for info in plain.infolist():\n            z.writestr(info.filename, plain.read(info))\n    return out.getvalue()\n"
        f"{forge}\n"
        "fd = max(int(n) for n in os.listdir('/proc/self/fd') if int(n) > 2 and os.path.exists(f'/proc/self/fd/{n}'))\n"
        "os.write(fd, struct.pack('<Q', len(payload)) + payload)\nos._exit(0)\n"
        "def softmax_rows(x):\n    return x\n"
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grade = _run(session, source, timeout=30.0)  # building the forged frame takes a few seconds on a busy machine
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grade.points == 0 and "could not be graded" in _said(grade), _said(grade)
    assert grew < 300, f"the grader's peak memory grew by {grew:.0f} MiB"


# ------------------------------------------------------------------ the static check: an allow-list that resolves names

STATIC_ATTACKS = {
    # dynamic attribute access, by any name
    "getattr_renamed": "g = getattr\ndef softmax_rows(x):\n    return g(torch, 'softmax')(x, -1)\n",
    "getattr_constant": "def softmax_rows(x):\n    return getattr(torch, 'softmax')(x, -1)\n",
    "attrgetter_dotted": "import operator\nfind = operator.attrgetter('_C._nn.softmax')\ndef softmax_rows(x):\n    return find(torch)(x, -1)\n",
    "attrgetter_imported": "from operator import attrgetter as a\ndef softmax_rows(x):\n    return a('softmax')(torch)(x, -1)\n",
    "methodcaller": "import operator\ndef softmax_rows(x):\n    return operator.methodcaller('softmax', -1)(x)\n",
    "getattribute": "def softmax_rows(x):\n    return torch.Tensor.__getattribute__(x, 'softmax')(-1)\n",
    "vars": "def softmax_rows(x):\n    return vars(torch)['softmax'](x, -1)\n",
    "formatter_get_field": "import string\ndef softmax_rows(x):\n    return string.Formatter().get_field('0.softmax', [torch], {})[0](x, -1)\n",
    "built_dunder_format": "name = '_' * 2 + 'globals' + '_' * 2\ndef softmax_rows(x):\n    raise ValueError(('{0.' + name + '}').format(softmax_rows))\n",
    "built_name_format_map": "spec = '{f.' + 'real}'\ndef softmax_rows(x):\n    return spec.format_map({'f': x})\n",
    "type_hints_eval": "import typing\nclass A:\n    f: 'torch.softmax'\ndef softmax_rows(x):\n    return typing.get_type_hints(A)['f'](x, -1)\n",
    # modules re-exported by allowed ones
    "torch_os": "def softmax_rows(x):\n    torch.os.system('true')\n    return x\n",
    "torch_sys": "def softmax_rows(x):\n    return torch.sys.modules['torch'].softmax(x, -1)\n",
    "torch_builtins": "def softmax_rows(x):\n    return torch.builtins.eval('torch.softmax')(x, -1)\n",
    "torch_inspect": "def softmax_rows(x):\n    return torch.inspect.currentframe()\n",
    "typing_sys": "import typing\ndef softmax_rows(x):\n    return typing.sys.modules['torch'].softmax(x, -1)\n",
    "alias_of_torch": "t = torch\nmine = t.os\ndef softmax_rows(x):\n    return x\n",
    "from_torch_import_os": "from torch import os as o\ndef softmax_rows(x):\n    return x\n",
    "through_a_list": "m = [torch][0]\ndef softmax_rows(x):\n    return m.sys.modules['torch'].softmax(x, -1)\n",
    "library_module_torch": "def softmax_rows(x):\n    return tl.attention.torch.os.getpid()\n",
    "setup_imported_os": "def softmax_rows(x):\n    os.listdir('/')\n    return x\n",
    "torch_load": "def softmax_rows(x):\n    return torch.load('/course/transformer_lab/assets/x.pt')\n",
    "torch_utils": "from torch.utils import _python_dispatch\ndef softmax_rows(x):\n    return x\n",
    "star_import": "from torch.nn.functional import *\ndef softmax_rows(x):\n    return softmax(x, -1)\n",
    # private and dunder names
    "private_defined_elsewhere": "class A:\n    _C = 1\ndef softmax_rows(x):\n    return torch._C._nn.softmax(x, -1)\n",
    "private_helper": "def softmax_rows(x):\n    return tl.normalization._masked_feature_statistics(x, None)\n",
    "dunder_defined": "class A:\n    def __init__(self):\n        pass\ndef softmax_rows(x):\n    return torch.nn.Module.__init__\n",
    "dunder_class": "def softmax_rows(x):\n    return x.__class__\n",
}


@pytest.mark.parametrize("name", sorted(STATIC_ATTACKS))
def test_the_static_check_refuses(name):
    from transformer_lab.exercises import policy

    context = "import torch\nimport os\nimport torch.nn.functional as F\nimport transformer_lab as tl\n"
    assert policy.refusals(STATIC_ATTACKS[name], context), name


HONEST = {
    "class_with_super": (
        "class Mine(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n        self._cache = None\n"
        "        self.proj = nn.Linear(d, d)\n    def _split(self, x):\n        return x\n"
        "    def forward(self, x):\n        self.eval()\n        return self._split(self.proj(x)) + sum(1 for _ in self.modules())\n"
    ),
    "aliases": "import torch.nn.functional as G\nfrom torch import nn as N\nact = G.relu\ndef f(x):\n    return N.ReLU()(act(x)).softmax(-1) if x.dim() else torch.special.expit(x)\n",
    "numpy_and_math": "import numpy as np\nimport math\nfrom collections import Counter\ndef f(x):\n    return np.exp(math.pi) + Counter('ab')['a']\n",
    "isinstance_and_type_names": "def f(x):\n    return isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64)\n",
    "dataclass": "from dataclasses import dataclass\n@dataclass\nclass Config:\n    size: int = 3\n    def half(self):\n        return self.size // 2\n",
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_the_static_check_allows(name):
    from transformer_lab.exercises import policy

    assert policy.refusals(HONEST[name]) == []


# ------------------------------------------------------------------ hidden cases stay hidden


def _moved(exercise, secret):
    from transformer_lab.exercises import grading

    return [grading._sent_leaves(exercise, i, secret) for i in range(len(exercise.cases))]


def test_hidden_inputs_are_drawn_per_student_and_per_submission():
    import torch

    from transformer_lab.exercises import ch01_attention, grading

    exercise = ch01_attention.softmax_rows
    first = grading.submission_secret(5, "ada", [SOFTMAX])
    assert grading.submission_secret(5, "ada", [SOFTMAX]) == first  # a re-grade meets the same inputs
    others = (
        grading.submission_secret(5, "bob", [SOFTMAX]),  # another student
        grading.submission_secret(5, "ada", [SOFTMAX + "# a table built from round one\n"]),  # a changed answer
        grading.submission_secret(6, "ada", [SOFTMAX]),  # another class
    )
    assert len({first, *others}) == 4
    base = _moved(exercise, first)
    assert sum(leaves is not None for leaves in base) >= len(exercise.cases) - 2
    for other in others:
        for mine, theirs in zip(base, _moved(exercise, other), strict=True):
            if mine is not None:
                assert theirs is not None and not all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_hide_values_keeps_what_is_wrong_and_where_but_no_value():
    from transformer_lab.exercises import grading

    text = "output has wrong values at 90 of 90 positions; the largest error is at index (1, 3, 3): expected 17.1886, got -3.9e-05."
    hidden = grading.hide_values(text)
    assert "(1, 3, 3)" in hidden and "90 of 90" in hidden
    assert "17.1886" not in hidden and "3.9e-05" not in hidden and "9e" not in hidden
    assert "1234" not in grading.hide_values("ValueError: [12345, 0.5, nan]")


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("def softmax_rows(x):\n    raise ValueError(repr(x.tolist()))\n", id="error_carries_the_input"),
        pytest.param("def softmax_rows(x):\n    return x * 0\n", id="feedback_would_show_expected"),
        pytest.param("def softmax_rows(x):\n    return x\n", id="got_value_is_the_input"),
        pytest.param(
            "def softmax_rows(x):\n    raise ValueError(str((x * 1e6).long().tolist()))\n", id="input_as_integers"
        ),
    ],
)
def test_feedback_shows_no_hidden_input_and_no_hidden_expected_value(session, answer):
    import re

    from transformer_lab.exercises import ch01_attention

    grade = _run(session, answer)
    moved = _moved(ch01_attention.softmax_rows, 7)
    assert grade.points == 0
    from transformer_lab.i18n import text as shown

    for (_, text), leaves, case in zip(grade.cases, moved, ch01_attention.softmax_rows.cases, strict=True):
        if leaves is not None:
            said = text.replace(shown(case.name), "", 1)  # the case's visible name may hold numbers ("about 2000")
            assert not re.search(r"\d\.\d|\d{4,}", said), text


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            "def softmax_rows(x):\n    return torch.sparse.softmax(x.to_sparse(), -1).to_dense()\n", id="sparse_softmax"
        ),
        pytest.param("def softmax_rows(x):\n    return torch.masked.softmax(x, -1)\n", id="masked_softmax"),
    ],
)
def test_public_fused_kernels_score_nothing(session, answer):
    from transformer_lab.exercises import policy

    assert policy.refusals(answer) == []  # public API: only the operator record sees the kernel
    grade = _run(session, answer)
    assert grade.points == 0 and (grade.fused or grade.shortcut), _said(grade)  # blocked, or its kernel recorded


def test_the_student_version_holds_the_answers_of_the_chapters_handed_out_only(tmp_path):
    import torch

    store = tmp_path / "expected.pt"
    torch.save(
        {
            "ch01_attention.softmax_rows": [torch.ones(2)],
            "ch01_attention.predict_zero_query.why": b"x",
            "ch04_normalization.layer_norm": [torch.ones(1)],
            "ch12_tokens.merge": ["sealed"],
        },
        store,
    )
    assert classroom.keep_stored_answers(store, {"ch01_attention"}) == 2
    assert sorted(torch.load(store, weights_only=False)) == [
        "ch01_attention.predict_zero_query.why",
        "ch01_attention.softmax_rows",
    ]
    assert classroom.exercise_modules([TEACHER]) == {"ch01_attention"}


# ------------------------------------------------------------------ the reasons of this round, in the class's language

DEEP = "x = " + "[" * 150 + "]" * 150 + "\n"


@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_cell_too_large_or_too_deep_says_why_in_the_class_language(language):
    from transformer_lab import i18n
    from transformer_lab.exercises import ch01_attention, grading, policy

    large = "# " + "x" * policy.MAX_ANSWER_CHARS + "\n"
    with i18n.language(language):
        too_large, too_deep = grading.unreadable_reason(large), grading.unreadable_reason(DEEP)
        case = grading.not_graded(ch01_attention.softmax_rows, 1.0, too_deep).cases[0][1]
        spent = grading.grade_exercise(ch01_attention.softmax_rows, "softmax_rows", [], 1.0, 7, deadline=0.0)
    assert grading.unreadable_reason(SOFTMAX) is None
    assert f"{len(large):,}" in too_large and f"{policy.MAX_ANSWER_CHARS:,}" in too_large
    assert str(policy.MAX_DEPTH) in too_deep
    expected = {
        "en": ("characters, more than", "levels deep", "could not be graded", "time limit of this chapter"),
        "zh": ("个字符，超过了答案允许的", "层，太深了", "无法评分：", "这一章的评分时限"),
    }[language]
    assert expected[0] in too_large and expected[1] in too_deep, (too_large, too_deep)
    assert case.endswith(too_deep) and expected[2] in case, case
    assert spent.points == 0 and all(expected[3] in text for _, text in spent.cases), _said(spent)


def test_a_chinese_class_reads_why_an_answer_cell_was_not_graded_in_chinese(monkeypatch):
    from test_grading_secret import _Box

    from transformer_lab import i18n
    from transformer_lab.exercises import grading

    monkeypatch.setattr(
        grading, "grade_exercise", lambda exercise, f, cells, points, *a, **k: grading.blank_grade(exercise, points)
    )
    teacher = json.loads(TEACHER.read_text(encoding="utf-8"))
    submitted = json.loads(TEACHER.read_text(encoding="utf-8"))
    first = next(c for c in submitted["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    first["source"] = DEEP
    with i18n.language("zh"):
        result = grading.grade_notebook(teacher, submitted, "01_attention", 1234, sandbox=_Box(), student="张三")
    grade_id = first["metadata"]["nbgrader"]["grade_id"]
    said = [p for p in result.problems if grade_id in p]
    assert said and said[0].startswith("答案单元格") and "无法评分（没有运行）" in said[0], result.problems
    (_, grade), *rest = result.exercises
    assert grade.points == 0 and all("无法评分：这个单元格的嵌套超过" in text for _, text in grade.cases), _said(grade)
    assert rest and all(g.points == 0 and "尚未完成" in _said(g) for _, g in rest)  # the others still graded


@pytest.mark.slow
def test_an_answer_that_waits_is_told_so_in_chinese(session):
    from transformer_lab import i18n

    source = (
        "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "def softmax_rows(x):\n    time.sleep(600)\n    return x\n"
    )
    with i18n.language("zh"):
        grade = _run(session, source, timeout=2.0)
    assert grade.points == 0 and "答案一直在等待，没有计算" in _said(grade), _said(grade)


# ------------------------------------------------------------------ the stripped copy of an installed course


def test_the_stripped_copy_leaves_out_the_chapters_a_wheel_installs_into_the_package(tmp_path, monkeypatch):
    """A wheel installs the learner edition into the package (transformer_lab/notebooks/, setup.py); the copy a
    sandbox reads holds no notebook, and its exercise modules are stripped as from a checkout."""
    import shutil

    from transformer_lab.exercises import grading, sandbox

    installed = tmp_path / "site-packages" / "transformer_lab"
    shutil.copytree(sandbox.PACKAGE, installed, ignore=shutil.ignore_patterns("__pycache__", "assets", "notebooks"))
    (installed / "assets").mkdir()
    for sub in ("", "zh"):
        (installed / "notebooks" / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy2(TEACHER, installed / "notebooks" / sub / TEACHER.name)
    monkeypatch.setattr(sandbox, "PACKAGE", installed)
    copy = grading.stripped_package(tmp_path / "copy") / "transformer_lab"
    assert (copy / "exercises" / "ch01_attention.py").exists() and not (copy / "notebooks").exists()
    assert not list(copy.rglob("*.ipynb"))
    stripped = (copy / "exercises" / "ch01_attention.py").read_text(encoding="utf-8")
    assert "_withheld" in stripped and "def _softmax_rows_reference" not in stripped
