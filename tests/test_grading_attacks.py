# ruff: noqa: E501  (attack code kept on one line each, as a student would write it)
"""A class with cheaters in it: every attack earns nothing it did not earn, is flagged, and hurts no one else.

One class (chapters 01 and 04) is graded with two jobs. Besides honest students (right, blank, a real
mistake), each attacker hands in a blank notebook with ONE answer cell replaced by an attack on the grader:
reading what they must not (the teacher's notebooks, another student's submission, stored answers, the class
secret, the grader's memory), writing what they must not (the grader's records, the teacher's tools, another
student's grade), the finished function by another door (private operators, fused kernels, aliases,
another exercise's reference, the package's internals, code that behaves differently when graded), and
hurting others (signals, memory, endless loops, processes left behind). Each attacker must score what a
blank notebook scores (0), be flagged in the report, and the honest students must get exactly their
grades. Below the class, the sandbox's own layers are tested without the static check in front of them.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from support import require_sandbox
from test_classroom import NOTEBOOKS, ROOT, classroom
from test_classroom_class import cells_by_id, exercises_of, fair_points, put

from transformer_lab.exercises import grading, policy

CHAPTERS = [p for p in NOTEBOOKS if p.name[:2] in ("01", "04")]
SECRET = 20261125
TIMEOUT = 5.0

pytestmark = pytest.mark.slow  # grades a whole class: notebooks run in the sandbox


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    require_sandbox()  # skipped on a machine without bubblewrap, a failure under CI


def attacks(course: pathlib.Path, subs: pathlib.Path, port: int) -> dict[str, tuple[str, str, str]]:
    """{attacker: (chapter prefix, function attacked, the answer cell's source)}; each defines the function."""
    teacher = ROOT / "notebooks" / "solutions" / "01_attention.ipynb"
    other = subs / "ada" / "01_attention.ipynb"
    records = course / "grading" / "ada" / "01_attention.json"
    secret = course / ".grading_secret"
    tool = ROOT / "tools" / "classroom.py"
    sm = "softmax_rows"
    return {
        # ---------------------------------------------------------- reading what they must not
        "r_teacher_notebook": (
            "01",
            "predict_zero_query",
            "import numpy as np, re\n"
            f"text = bytes(np.fromfile({str(teacher)!r}, dtype=np.uint8)).decode()\n"
            "def predict_zero_query():\n    return float(re.findall(r'return ([0-9.]+)', text)[0])\n",
        ),
        "r_other_student": (
            "01",
            "predict_zero_query",
            "import numpy as np, re\n"
            f"text = bytes(np.fromfile({str(other)!r}, dtype=np.uint8)).decode()\n"
            "def predict_zero_query():\n    return float(re.findall(r'return ([0-9.]+)', text)[0])\n",
        ),
        "r_expected_pt": (
            "01",
            "predict_zero_query",
            "found = torch.load('/course/transformer_lab/exercises/expected.pt')\n"
            "def predict_zero_query():\n    return found['ch01_attention.predict_zero_query'][0]\n",
        ),
        "r_secret_file": (
            "01",
            sm,
            f"import numpy as np\nsecret = int(np.loadtxt({str(secret)!r}))\n"
            "def softmax_rows(x):\n    return x * 0 + secret\n",
        ),
        "r_reference_code": (
            "01",
            sm,
            "def softmax_rows(x):\n    return exercises.softmax_rows.reference(x)\n",
        ),
        "r_stack_frame_seed": (
            "01",
            sm,
            "import inspect\ndef softmax_rows(x):\n    frame = inspect.currentframe()\n"
            "    while frame:\n        if 'secret' in frame.f_locals:\n            return x * 0 + frame.f_locals['secret']\n"
            "        frame = frame.f_back\n    raise NotImplementedError\n",
        ),
        "r_code_objects": (
            "01",
            sm,
            "import gc\ndef softmax_rows(x):\n    for f in gc.get_objects():\n"
            "        if getattr(f, '__name__', '') == '_softmax_reference':\n            return f(x)\n"
            "    raise NotImplementedError\n",
        ),
        "r_helper_of_package": (
            "01",
            sm,
            "from transformer_lab.exercises import ch01_attention as mine\n"
            "def softmax_rows(x):\n    return mine._softmax_reference(x)\n",
        ),
        "r_proc": (
            "01",
            sm,
            "import numpy as np\nenviron = bytes(np.fromfile('/proc/1/environ', dtype=np.uint8))\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "r_subclasses": (
            "01",
            sm,
            "def softmax_rows(x):\n    for c in ().__class__.__bases__[0].__subclasses__():\n"
            "        if c.__name__ == 'Exercise':\n            return c\n    raise NotImplementedError\n",
        ),
        "r_format_string": (
            "01",
            sm,
            "def softmax_rows(x):\n    leak = '{0.__globals__}'.format(softmax_rows)\n    raise NotImplementedError\n",
        ),
        # ---------------------------------------------------------- writing what they must not
        "w_own_record": (
            "01",
            sm,
            "import numpy as np\n"
            f"np.savetxt({str(course / 'grading' / 'w_own_record' / '01_attention.json')!r}, [], "
            "header='{\"exercises\": [{\"points\": 9}]}', comments='')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "w_other_record": (
            "01",
            sm,
            f"import numpy as np\nnp.savetxt({str(records)!r}, [], header='{{}}', comments='')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "w_teacher_tool": (
            "01",
            sm,
            f"import numpy as np\nnp.savetxt({str(tool)!r}, [], header='raise SystemExit', comments='')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "w_result_file": (
            "01",
            sm,
            "import torch\ntorch.save({'cases': []}, '/tmp/result.pt')\n"
            f"torch.save({{'cases': []}}, {str(course / 'result.pt')!r})\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "w_patch_checker": (
            "01",
            sm,
            "from transformer_lab.exercises import core\ncore.compare = lambda *a, **k: None\n"
            "torch.allclose = lambda *a, **k: True\ndef softmax_rows(x):\n    return x\n",
        ),
        "w_process_left_behind": (
            "01",
            sm,
            "import os\nif os.fork() == 0:\n    import time\n    time.sleep(30)\n"
            f"    open({str(records)!r}, 'w').write('{{}}')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        # ---------------------------------------------------------- the finished function by another door
        "f_torch_softmax": ("01", sm, "def softmax_rows(x):\n    return torch.softmax(x, dim=-1)\n"),
        "f_alias": ("01", sm, "normalise = F.softmax\ndef softmax_rows(x):\n    return normalise(x, -1)\n"),
        "f_method": ("01", sm, "def softmax_rows(x):\n    return x.softmax(-1)\n"),
        "f_module": ("01", sm, "def softmax_rows(x):\n    return torch.nn.Softmax(dim=-1)(x)\n"),
        "f_log_softmax": ("01", sm, "def softmax_rows(x):\n    return torch.log_softmax(x, -1).exp()\n"),
        "f_getattr_constant": ("01", sm, "def softmax_rows(x):\n    return getattr(F, 'softmax')(x, -1)\n"),
        "f_getattr_built": ("01", sm, "def softmax_rows(x):\n    return getattr(torch, 'soft' + 'max')(x, -1)\n"),
        "f_aten": ("01", sm, "def softmax_rows(x):\n    return torch.ops.aten._softmax(x, -1, False)\n"),
        "f_torch_c": ("01", sm, "def softmax_rows(x):\n    return torch._C._nn.softmax(x, -1)\n"),
        "f_private_torch": ("01", sm, "def softmax_rows(x):\n    return torch._softmax(x, -1, False)\n"),
        "f_eval": ("01", sm, "def softmax_rows(x):\n    return eval('torch.softmax')(x, -1)\n"),
        "f_exec": ("01", sm, "exec('def softmax_rows(x):\\n    return torch.softmax(x, -1)')\n"),
        "f_importlib": (
            "01",
            sm,
            "import importlib\nmine = importlib.import_module('transformer_lab.exercises.ch01_attention')\n"
            "def softmax_rows(x):\n    return mine._softmax_reference(x)\n",
        ),
        "f_sys_modules": (
            "01",
            sm,
            "import sys\ndef softmax_rows(x):\n    return sys.modules['torch'].softmax(x, -1)\n",
        ),
        "f_reload_file": (
            "01",
            sm,
            "import runpy\nmine = runpy.run_path('/course/transformer_lab/attention.py')\n"
            "def softmax_rows(x):\n    return x\n",
        ),
        "f_library_attention": (
            "01",
            "attention",
            "def attention(query, key, value, mask=None, dropout=None):\n"
            "    return tl.scaled_dot_product_attention(query, key, value, mask, dropout)\n",
        ),
        "f_sdpa": (
            "01",
            "attention",
            "def attention(query, key, value, mask=None, dropout=None):\n"
            "    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)\n"
            "    return out, out\n",
        ),
        "f_when_graded": (
            "01",
            sm,
            "def softmax_rows(x):\n    try:\n        demo_scores  # a variable of the notebook: absent while graded\n"
            "        e = torch.exp(x - x.max(-1, keepdim=True).values)\n        return e / e.sum(-1, keepdim=True)\n"
            "    except NameError:\n        return torch.softmax(x, -1)\n",
        ),
        "f_layer_norm": ("04", "layer_norm", None),  # filled below: F.layer_norm
        "f_group_norm": ("04", "layer_norm", None),  # filled below: group_norm with one group
        "f_library_layer_norm": ("04", "layer_norm", None),  # filled below: tl.LayerNorm
        "f_rms_norm": (
            "04",
            "rms_norm",
            "import torch.nn.functional as F\ndef rms_norm(x, gamma, eps=1e-6):\n    return F.rms_norm(x, (x.shape[-1],), gamma, eps)\n",
        ),
        "f_private_helper": (
            "04",
            "masked_batch_norm",
            "def masked_batch_norm(x, mask, gamma, beta, eps=1e-5):\n"
            "    return tl.normalization._masked_feature_statistics(x, mask)\n",
        ),
        # ---------------------------------------------------------- hurting others
        "h_kill_server": (
            "01",
            sm,
            "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "h_kill_all": (
            "01",
            sm,
            "import os\nos.kill(-1, 9)\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "h_memory": (
            "01",
            sm,
            "hog = torch.ones(2_000_000_000, dtype=torch.float64)\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "h_memory_bytes": (
            "01",
            sm,
            "hog = [bytearray(1 << 28) for _ in range(64)]\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "h_endless": ("01", sm, "while True:\n    pass\ndef softmax_rows(x):\n    raise NotImplementedError\n"),
        "h_network": (
            "01",
            sm,
            "import numpy as np\n"
            f"page = np.DataSource(None).open('http://127.0.0.1:{port}/grades').read()\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        # ---------------------------------------------------------- past the static check (issue 36)
        "f_getattr_renamed": (
            "01",
            sm,
            "g = getattr\ndef softmax_rows(x):\n    return g(torch, 'soft' + 'max')(x, -1)\n",
        ),
        "f_attrgetter": (
            "01",
            sm,
            "import operator\nfind = operator.attrgetter('_C._nn.softmax')\ndef softmax_rows(x):\n    return find(torch)(x, -1)\n",
        ),
        "f_torch_sys": ("01", sm, "def softmax_rows(x):\n    return torch.sys.modules['torch'].softmax(x, -1)\n"),
        "f_typing_sys": (
            "01",
            sm,
            "import typing\nmods = typing.sys.modules\ndef softmax_rows(x):\n    return mods['torch.nn.functional'].softmax(x, -1)\n",
        ),
        "f_own_private_name": (
            "01",
            sm,
            "class Mine:\n    _C = None\ndef softmax_rows(x):\n    return torch._C._nn.softmax(x, -1)\n",
        ),
        "f_torch_builtins_eval": (
            "01",
            sm,
            "def softmax_rows(x):\n    return torch.builtins.eval('torch.softmax')(x, -1)\n",
        ),
        "h_wait_torch_os": (
            "01",
            sm,
            "def softmax_rows(x):\n    torch.os.read(torch.os.pipe()[0], 1)\n    return x\n",
        ),
        "h_huge_cell": ("01", sm, "pad = 1\n" * 40_000 + "def softmax_rows(x):\n    return x\n"),
        "h_deep_cell": ("01", sm, "pad = " + "+".join(["x"] * 20_000) + "\ndef softmax_rows(x):\n    return x\n"),
        # ---------------------------------------------------------- issue 36, part A: outside the allow-list (a_),
        # undoing the record (u_), the library's statistics in chapter 04 (s_), memory (m_)
        "a_normalize": (
            "01",
            sm,
            "def softmax_rows(x):\n    return F.normalize(torch.exp(x - x.max(-1, keepdim=True).values), p=1, dim=-1)\n",
        ),
        "a_vector_norm": (
            "01",
            sm,
            "def softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\n    return e / torch.linalg.vector_norm(e, 1, -1, True)\n",
        ),
        "a_distance_attention": (
            "01",
            "attention",
            "def attention(query, key, value, mask=None, dropout=None):\n"
            "    scores = -torch.cdist(query, key) ** 2 / 2 + (query ** 2).sum(-1, keepdim=True) / 2 + (key ** 2).sum(-1)[..., None, :] / 2\n"
            "    scores = scores / query.shape[-1] ** 0.5\n"
            "    if mask is not None:\n        scores = scores.masked_fill(mask == 0, -1e9)\n"
            "    weights = torch.softmax(scores, -1)\n    return weights @ value, weights\n",
        ),
        "u_pop_mode": (
            "01",
            sm,
            "from torch.utils._python_dispatch import _pop_mode\n"
            "def softmax_rows(x):\n    _pop_mode()\n    return torch.ops.aten._softmax(x, -1, False)\n",
        ),
        "u_clear_record": (
            "01",
            sm,
            "import gc\ndef softmax_rows(x):\n    y = torch.softmax(x, -1)\n    for o in gc.get_objects():\n"
            "        if type(o).__name__ == 'OperatorRecord':\n            o.seen.clear()\n    return y\n",
        ),
        "u_rerun_source": (
            "01",
            sm,
            "import numpy as np\nsource = bytes(np.fromfile(tl.__file__.replace('__init__', 'attention'), dtype=np.uint8)).decode()\n"
            "mine = {}\nexec(source, mine)\ndef softmax_rows(x):\n    return mine['softmax'](x, -1)\n",
        ),
        "s_layer_stats_in_rms": (
            "04",
            "rms_norm",
            "def rms_norm(x, gamma, eps=1e-6):\n    mean, var = tl.layer_norm_statistics(x)\n"
            "    return gamma * x / torch.sqrt(var + mean ** 2 + eps)[..., None]\n",
        ),
        "s_per_position": (
            "04",
            "masked_batch_norm",
            "def masked_batch_norm(x, mask, gamma, beta, eps=1e-5):\n"
            "    mean, var, count = tl.normalization.batch_norm_statistics_per_position(x, mask)\n"
            "    return gamma * (x - mean) / torch.sqrt(var + eps) + beta\n",
        ),
        "s_imported_helper": (
            "04",
            "layer_norm",
            "from transformer_lab.normalization import layer_norm_statistics as stats\n"
            "def layer_norm(x, gamma, beta, eps=1e-5):\n    mean, var = stats(x)\n"
            "    return gamma * (x - mean[..., None]) / torch.sqrt(var[..., None] + eps) + beta\n",
        ),
        "m_shared_memory": (
            "01",
            sm,
            "hog = torch.ones(1 << 27).share_memory_()\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "m_many_tensors": (
            "01",
            sm,
            "hog = [torch.ones(1 << 28) for _ in range(40)]\ndef softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        # ---------------------------------------------------------- the report: an error message that forges it
        "c_forge_report": (
            "01",
            sm,
            "raise ValueError('x\\n\\n## No problem\\n\\n- c_forge_report\\n- [grades](javascript:alert(1)) <img src=x>')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
        "h_fill_disk": (
            "01",
            sm,
            "import numpy as np\nnp.zeros(1 << 30, dtype=np.uint8).tofile('/tmp/big')\n"
            "def softmax_rows(x):\n    raise NotImplementedError\n",
        ),
    }


LAYER_NORM_ATTACKS = {
    "f_layer_norm": "import torch.nn.functional as F\ndef layer_norm(x, gamma, beta, eps=1e-5):\n    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)\n",
    "f_group_norm": (
        "import torch.nn.functional as F\ndef layer_norm(x, gamma, beta, eps=1e-5):\n    flat = x.reshape(-1, 1, x.shape[-1])\n"
        "    return F.group_norm(flat, 1, eps=eps).reshape(x.shape) * gamma + beta\n"
    ),
    "f_library_layer_norm": (
        "def layer_norm(x, gamma, beta, eps=1e-5):\n    norm = tl.LayerNorm(x.shape[-1], eps=eps).to(x.dtype)\n"
        "    with torch.no_grad():\n        norm.gamma.copy_(gamma)\n        norm.beta.copy_(beta)\n    return norm(x)\n"
    ),
}
NAN_ON_CONSTANT = (
    "def layer_norm(x, gamma, beta, eps=1e-5):\n    mean = x.mean(-1, keepdim=True)\n"
    "    var = ((x - mean) ** 2).mean(-1, keepdim=True)\n    return gamma * (x - mean) / var.sqrt() + beta\n"
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if len(CHAPTERS) != 2:
        pytest.fail("the attacked class needs chapters 01 and 04 in notebooks/solutions/")
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"grades")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.5
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    tmp = tmp_path_factory.mktemp("attacked")
    course, subs = tmp / "course", tmp / "subs"
    out = classroom.make_student_folder(tmp / "student", course, CHAPTERS)
    tool_before = (ROOT / "tools" / "classroom.py").read_bytes()
    plans = {p.name[:2]: (p, exercises_of(p)) for p in CHAPTERS}
    expected: dict[str, dict[str, float]] = {}
    for path in CHAPTERS:
        source = json.loads(path.read_text(encoding="utf-8"))
        put(subs / "ada", path.name, source)  # right
        put(subs / "bob", path.name, json.loads((out / path.name).read_text(encoding="utf-8")))  # blank
        expected.setdefault("ada", {})[path.stem] = sum(points for *_, points in plans[path.name[:2]][1])
        expected.setdefault("bob", {})[path.stem] = 0.0
    # cy: right everywhere but chapter 04's layer_norm returns NaN on a constant vector (no eps)
    path, plan = plans["04"]
    mistake = json.loads(path.read_text(encoding="utf-8"))
    (cell_id, function, exercise, points) = next(p for p in plan if p[1] == "layer_norm")
    cells_by_id(mistake)[cell_id]["source"] = NAN_ON_CONSTANT
    namespace: dict = {}
    exec("import torch\n" + NAN_ON_CONSTANT, namespace)  # noqa: S102 - the test's own wrong answer
    own = grading.submission_secret(SECRET, "cy", [NAN_ON_CONSTANT])  # cy's own hidden inputs
    cy_layer_norm = fair_points(exercise, namespace["layer_norm"], points, own)
    expected["cy"] = {
        path.stem: sum(p for *_, p in plan) - points + cy_layer_norm,
        plans["01"][0].stem: sum(p for *_, p in plans["01"][1]),
    }
    put(subs / "cy", path.name, mistake)
    put(subs / "cy", plans["01"][0].name, json.loads(plans["01"][0].read_text(encoding="utf-8")))
    table = attacks(course, subs, server.server_address[1])
    for name, (prefix, function, code) in table.items():
        code = code or LAYER_NORM_ATTACKS[name]
        path, plan = plans[prefix]
        blank = json.loads((out / path.name).read_text(encoding="utf-8"))
        cell_id = next(p[0] for p in plan if p[1] == function)
        cells_by_id(blank)[cell_id]["source"] = code
        put(subs / name, path.name, blank)
        expected[name] = {path.stem: 0.0}
    # collecting: what is not a regular file is never read, and costs only its student a line in the report
    links = {
        "c_link_teacher": lambda name: ROOT / "notebooks" / "solutions" / name,  # scored 35/35 before issue 36
        "c_link_other": lambda name: subs / "ada" / name,
        "c_link_relative": lambda name: pathlib.Path("..") / "ada" / name,
        "c_dangling_link": lambda name: subs / "nobody" / name,
    }
    for name, target in links.items():
        (subs / name).mkdir(parents=True)
        for path in CHAPTERS:
            (subs / name / path.name).symlink_to(target(path.name))
        expected[name] = {}
    (subs / "c_folder" / CHAPTERS[0].name).mkdir(parents=True)
    (subs / "c_folder" / "04_normalization (1).ipynb").mkdir()
    (subs / "c_fifo").mkdir()
    for path in CHAPTERS:
        os.mkfifo(subs / "c_fifo" / path.name)  # reading one would wait for ever
    (subs / "c_link_folder").mkdir()
    (subs / "c_link_folder" / "student").symlink_to(subs / "ada")
    (subs / "c_link_student").symlink_to(subs / "ada")  # a whole student folder that is a link
    expected.update(c_folder={}, c_fifo={}, c_link_folder={})
    records = classroom.grade_folder(subs, course, chapters=None, timeout=TIMEOUT, jobs=2, secret=SECRET)
    server.shutdown()
    report = (course / "grading_report.md").read_text(encoding="utf-8")
    with (course / "grades.csv").open(encoding="utf-8", newline="") as f:
        grades = {row["student_id"]: row for row in csv.DictReader(f)}
    yield {
        "records": records,
        "report": report,
        "grades": grades,
        "expected": expected,
        "attacks": table,
        "course": course,
        "hits": hits,
        "tool_changed": (ROOT / "tools" / "classroom.py").read_bytes() != tool_before,
        "cy_layer_norm": (cy_layer_norm, points),
    }


COLLECT_ATTACKS = (
    "c_link_teacher",
    "c_link_other",
    "c_link_relative",
    "c_dangling_link",
    "c_folder",
    "c_fifo",
    "c_link_folder",
)


def test_what_is_not_a_regular_file_is_never_graded_and_costs_only_its_student(graded):
    sections = {}
    for block in graded["report"].split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip()] = body
    for name in COLLECT_ATTACKS:
        assert not any(r["student"] == name for r in graded["records"]), name
        assert graded["grades"][name]["total"] == "0", graded["grades"][name]
        assert "not graded" in sections[name] or "no notebook" in sections[name], sections[name]
    for name in ("c_link_teacher", "c_link_other", "c_link_relative", "c_dangling_link"):
        assert "symbolic link" in sections[name], sections[name]
    assert "named pipe" in sections["c_fifo"] and "a folder" in sections["c_folder"]
    assert "c_link_student" not in graded["grades"]
    assert "symbolic link" in sections["Not graded: entries of the submissions folder"]
    forged = sections["c_forge_report"]
    assert "\\#\\# No problem" in forged and "\\<img" in forged
    assert list(sections).count("No problem") == 1 and "c_forge_report" not in sections["No problem"]


def _points(graded, student: str, chapter: str) -> float:
    record = next(r for r in graded["records"] if r["student"] == student and r["chapter"] == chapter)
    return round(sum(e["points"] for e in record["exercises"]), 4)


def test_at_least_forty_attacks_of_every_kind(graded):
    names = list(graded["attacks"])
    assert len(names) >= 40
    for kind in ("r_", "w_", "f_", "h_"):
        assert sum(n.startswith(kind) for n in names) >= 5, kind


def test_two_attacks_or_more_of_each_kind_of_issue_36(graded):
    names = list(graded["attacks"])
    for kind in ("a_", "u_", "s_", "m_"):
        assert sum(n.startswith(kind) for n in names) >= 2, kind
    records = {(r["student"], r["chapter"]): r for r in graded["records"]}
    for name in ("a_normalize", "a_vector_norm"):  # past the static check: the grading server's allow-list
        softmax = next(e for e in records[name, "01_attention"]["exercises"] if e["exercise"] == "softmax_rows")
        assert "allow-list" in softmax["cases"][0][1], softmax["cases"][0]
    for name in ("s_layer_stats_in_rms", "s_per_position", "s_imported_helper"):  # before anything runs
        assert "finished version of what this chapter" in graded["report"].split(f"## {name}\n", 1)[1][:2000], name


def test_every_attack_earns_nothing_and_is_flagged(graded):
    report = graded["report"]
    clean = report.split("## No problem", 1)[1]
    failures = []
    for name in graded["attacks"]:
        for chapter, want in graded["expected"][name].items():
            got = _points(graded, name, chapter)
            if got != want:
                failures.append(f"{name}: {got} points in {chapter}")
        if f"## {name}\n" not in report or f"- {name}" in clean:
            failures.append(f"{name}: not flagged in the report")
    assert not failures, "\n".join(failures)


def test_honest_students_get_what_their_answers_deserve(graded):
    for student in ("ada", "bob", "cy"):
        for chapter, want in graded["expected"][student].items():
            assert _points(graded, student, chapter) == pytest.approx(want), (student, chapter)
    assert "- ada" in graded["report"].split("## No problem", 1)[1]
    got, most = graded["cy_layer_norm"]
    assert 0 < got < most  # the NaN-on-constant answer loses exactly the constant case


def test_nothing_outside_the_sandbox_was_touched(graded):
    assert not graded["tool_changed"], "tools/classroom.py was changed by an answer"
    assert graded["hits"] == [], f"an answer reached the network: {graded['hits']}"
    course = graded["course"]
    assert not (course / "result.pt").exists()
    ada = json.loads((course / "grading" / "ada" / "01_attention.json").read_text(encoding="utf-8"))
    assert ada["exercises"] and all(e["points"] == e["max_points"] for e in ada["exercises"])
    own = json.loads((course / "grading" / "w_own_record" / "01_attention.json").read_text(encoding="utf-8"))
    assert own["student"] == "w_own_record"


def test_the_report_says_why_in_the_feedback_language(graded):
    records = {r["student"]: r for r in graded["records"] if r["chapter"] == "01_attention"}
    aten = next(e for e in records["f_aten"]["exercises"] if e["exercise"] == "softmax_rows")
    assert "torch.ops" in aten["cases"][0][1] or "ops" in aten["cases"][0][1]
    module = next(e for e in records["f_module"]["exercises"] if e["exercise"] == "softmax_rows")
    assert "softmax" in module["cases"][0][1] and module["points"] == 0
    memory = records["h_memory"]
    assert any("answer ch01_softmax_rows raised" in p for p in memory["problems"])


# ------------------------------------------------------------------ the sandbox's layers, without the static check


@pytest.fixture(scope="module")
def session():
    with grading.GradingSession() as made:
        yield made


def _run(session, source: str, timeout: float = 5.0):
    from transformer_lab.exercises import ch01_attention

    cells = [("setup", "import torch\nimport os\n"), ("answer", source)]
    with session.server() as server:
        return grading.grade_exercise(ch01_attention.softmax_rows, "softmax_rows", cells, 1.0, SECRET, timeout, server)


def _errors(grade) -> str:
    return " | ".join(text for _, text in grade.cases) + " | " + " | ".join(grade.problems)


def test_one_student_one_sandbox_for_all_chapters_started_again_if_stopped(session):
    """A student's chapters share one sandbox (its start, Python and PyTorch, paid once per student), and an
    answer that stops it costs that student a fresh one, not the grading of their other chapters."""
    teachers = [(path.stem, json.loads(path.read_text(encoding="utf-8"))) for path in CHAPTERS]
    with grading.StudentSandbox(session) as sandbox:
        for chapter, teacher in teachers:
            graded = grading.grade_notebook(teacher, teacher, chapter, SECRET, TIMEOUT, sandbox=sandbox)
            assert graded.points == graded.max_points > 0 and not graded.problems, (chapter, graded.problems)
        assert sandbox.started == 1
        first = sandbox.server()
        first.process.kill()  # as an answer that brought its sandbox down
        first.process.wait()
        chapter, teacher = teachers[0]
        graded = grading.grade_notebook(teacher, teacher, chapter, SECRET, TIMEOUT, sandbox=sandbox)
        last = sandbox.server()
        assert graded.points == graded.max_points and sandbox.started == 2 and last is not first
    assert last.process.poll() is not None  # stopped with the block


def test_the_sandbox_sees_no_repository_no_home_and_no_secret(session):
    probe_source = (
        "seen = []\nfor path in [{!r}, {!r}, '/etc/passwd', '/home', '/course/transformer_lab/exercises/grading.py', "
        "'/course/transformer_lab/exercises/expected.pt', '/course/transformer_lab/locale/zh/ch01_attention.json']:\n"
        "    seen.append(os.path.exists(path))\n"
        "def softmax_rows(x):\n    raise ValueError(repr(seen) + ' ' + repr(sorted(os.listdir('/'))))\n"
    ).format(str(ROOT / "tools"), str(ROOT / "notebooks"))
    grade = _run(session, probe_source)
    text = _errors(grade)
    assert "[False, False, False, False, False, False, False]" in text, text


def test_the_stripped_copy_holds_no_answer(session):
    source_dir = session.package / "transformer_lab" / "exercises"
    text = (source_dir / "ch08_embeddings.py").read_text(encoding="utf-8")
    assert "_rotate_pairs" not in text and "_rotary_reference" not in text
    for module in source_dir.glob("ch*.py"):
        body = module.read_text(encoding="utf-8")
        assert "wrong=" not in body and "shortcuts=" not in body and "why=" not in body, module.name
    assert not (source_dir / "expected.pt").exists() and not (source_dir / "grading.py").exists()


def test_an_answer_can_neither_fork_nor_signal_nor_write_outside(session):
    source = (
        "results = []\n"
        "for attempt in (lambda: os.fork(), lambda: os.kill(1, 9), lambda: os.kill(os.getppid(), 9),\n"
        "                lambda: open({!r}, 'a'), lambda: open('/course/x', 'w')):\n"
        "    try:\n        attempt()\n        results.append('allowed')\n"
        "    except OSError as exc:\n        results.append(type(exc).__name__)\n"
        "def softmax_rows(x):\n    raise ValueError(repr(results))\n"
    ).format(str(ROOT / "tools" / "classroom.py"))
    text = _errors(_run(session, source))
    assert "allowed" not in text and "PermissionError" in text, text


def test_a_fused_kernel_is_caught_by_the_operator_record(session):
    """`_safe_softmax` is no forbidden name of the exercise: only the dispatch-level record sees it."""
    grade = _run(session, "def softmax_rows(x):\n    return torch.ops.aten._safe_softmax(x, -1)\n")
    # the grading server's allow-list names it first (the grader's deny-list of fused kernels would too)
    assert grade.points == 0 and "_safe_softmax" in (grade.shortcut or "") and "allow-list" in grade.shortcut, _errors(
        grade
    )
    honest = "def softmax_rows(x):\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\n    return e / e.sum(-1, keepdim=True)\n"
    assert _run(session, honest).points == 1.0


def test_memory_and_time_are_limited_and_cost_only_the_answer(session):
    grade = _run(session, "hog = bytearray(8 << 30)\ndef softmax_rows(x):\n    raise NotImplementedError\n")
    assert "MemoryError" in _errors(grade)
    grade = _run(session, "def softmax_rows(x):\n    while True:\n        pass\n", timeout=1.0)
    assert grade.points == 0 and "time limit" in _errors(grade)


def test_the_static_check_allows_every_honest_answer_of_the_course():
    refused = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["metadata"].get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
                found = policy.refusals("".join(cell["source"]))
                if found:
                    refused.append(f"{path.stem} {cell['metadata']['nbgrader']['grade_id']}: {found}")
    assert not refused, refused


def test_the_static_check_allows_ordinary_methods():
    honest = (
        "class Mine(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self._cache = None\n"
        "    def _split(self, x):\n        return x\n    def forward(self, x):\n        self.eval()\n"
        "        return self._split(x) + sum(1 for _ in self.modules())\n"
    )
    assert policy.refusals(honest) == []
    assert policy.refusals("x = torch._C") and policy.refusals("y = getattr(torch, name)")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the grading as nobody, which needs root to switch to")
def test_grading_as_an_unprivileged_user(tmp_path):
    """Teachers are not root: grade with the sandbox as `nobody`, with Debian's Python (this environment's own
    interpreter may sit in root's home, which nobody can enter) and this environment's site-packages."""
    python = shutil.which("python3.11", path="/usr/bin")
    if python is None:
        pytest.skip("Debian's python3.11 is not installed")
    site_dir = next(p for p in sys.path if p.endswith("site-packages"))
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(work, 0o777)
    code = (
        f"import sys, os; sys.path[:0] = [{str(ROOT)!r}, {site_dir!r}]\n"
        "from transformer_lab.exercises import grading, sandbox, ch01_attention\n"
        "assert os.getuid() != 0\n"
        "reason = sandbox.probe()\n"
        "assert reason is None, reason\n"
        "with grading.GradingSession() as s, s.server() as server:\n"
        "    src = 'def softmax_rows(x):\\n    e = torch.exp(x - x.max(-1, keepdim=True).values)\\n"
        "    return e / e.sum(-1, keepdim=True)\\n'\n"
        "    g = grading.grade_exercise(ch01_attention.softmax_rows, 'softmax_rows', "
        "[('setup', 'import torch'), ('answer', src)], 1.0, 7, 10.0, server)\n"
        "    print('POINTS', g.points, g.cases)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "OMP_NUM_THREADS": "1", "TMPDIR": str(work)}
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=300,
    )
    assert "POINTS 1.0" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
