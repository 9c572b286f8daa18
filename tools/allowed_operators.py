"""Derive each exercise's allow-list of ATen operators, and store it in transformer_lab/exercises/operators.json.

    .venv/bin/python tools/allowed_operators.py           # write the file
    .venv/bin/python tools/allowed_operators.py --check   # exit 1 (and say what differs) if the stored file is stale

While a class is graded, the grading server (transformer_lab/exercises/runner.py, the process that forks each
answer's child and never runs an answer itself) receives, operator by operator, what each case of an answer runs, and
gives no credit to a case that ran an operator outside its exercise's list. A list is

- the generic operators every from-scratch answer may use: PyTorch's pointwise and reduction operators (its own
  `pointwise` and `reduction` tags), the view and shape operators (an operator whose result aliases its input), and
  the indexing, creation, copying, sorting and matrix-product operators named in BASIC below; less every operator
  that some exercise denies as the fused kernel computing its answer whole (grading.FUSED_KERNELS) and every
  operator whose name says it is a finished layer (softmax, norms, attention, distances, convolutions, losses, ...);
- and, for the exercise, the operators its honest answers ran: the exercise's reference and its known wrong
  answers and mistakes (honest answers, only wrong; never its `shortcuts`) on every visible case and on the hidden
  inputs of two class secrets, the source edition's answer cells (notebooks/solutions/) run as the grader runs
  them, the chapter's setup cell first, the honest answers the exercise tests assert to pass (`assert
  ex.NAME.run(answer).passed` in tests/test_exercises_chNN.py), and the standard spellings in STANDARD below (a
  library function where the exercise is not about it, such as `F.cross_entropy` in a loss built on top of it).
  Every one of those must pass the exercise's own check (`Exercise.run`), or the derivation stops: an answer the
  learner's check refuses adds nothing, and an honest answer the check accepts is never refused by the grader.

The list depends on the PyTorch version (which operators exist, how a function decomposes), so the file records it,
and tests/test_grading_allowlist.py fails when the stored lists differ from a fresh derivation.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("TRANSFORMER_LAB_QUICK", "1")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from transformer_lab.exercises import grading  # noqa: E402
from transformer_lab.exercises.core import Exercise, _needs_grad  # noqa: E402
from transformer_lab.exercises.runner import OperatorRecord  # noqa: E402

OUT = ROOT / "transformer_lab" / "exercises" / "operators.json"
SECRETS = (20261202, 7)
#: generic operators no tag names: indexing, creation, copying, sorting, matrix products, random numbers, comparisons
#: of whole tensors (`torch.allclose`), integer division (`//`) and complex numbers (`torch.polar`)
BASIC = frozenset(
    """
    index index_put index_put_ _index_put_impl_ index_select gather scatter scatter_add scatter_reduce masked_fill
    masked_fill_ masked_scatter masked_select where nonzero cat stack split split_with_sizes chunk unbind clone copy_
    _to_copy to contiguous empty empty_like empty_strided zeros zeros_like ones ones_like full full_like fill_ fill
    zero_ arange linspace logspace eye tril triu tril_ triu_ repeat repeat_interleave flip roll tile expand_copy
    mm bmm matmul addmm addbmm baddbmm dot vdot mv addmv outer ger einsum tensordot kron sort argsort topk kthvalue
    msort cumsum cumprod cummax cummin logcumsumexp max min argmax argmin amax amin aminmax median nanmedian mode
    unique unique_dim _unique2 unique_consecutive bincount histc bucketize searchsorted count_nonzero diff
    diag diagonal diag_embed trace lift_fresh lift_fresh_copy _local_scalar_dense item detach alias resize_
    rand rand_like randn randn_like randint randint_like randperm bernoulli bernoulli_ uniform_ normal_
    multinomial exponential_ random_ scalar_tensor _assert_async _assert_scalar set_ isin _unsafe_view
    index_add index_add_ index_copy index_fill masked_fill constant_pad_nd pad new_empty new_zeros new_ones new_full
    new_empty_strided as_strided as_strided_ _reshape_alias view reshape flatten unflatten
    allclose isclose equal floor_divide polar complex block_diag cartesian_prod argwhere
    """.split()
)
#: names of finished layers: never generic, whatever their tags say
#: honest spellings the exercises' references do not use: a library function that computes a step of the answer
#: but not the exercise's point (the log-softmax of a loss, a table lookup). Each is the source of the learner's
#: function; it must pass the exercise's own check. Their operators join the exercise's list (less its fused kernels).
STANDARD: dict[str, tuple[str, ...]] = {
    "ch13_instruction.response_loss": (
        "def response_loss(logits, targets, mask):\n"
        "    return F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')[mask].mean()\n",
        "def response_loss(logits, targets, mask):\n    return F.cross_entropy(logits[mask], targets[mask])\n",
        "def response_loss(logits, targets, mask):\n"
        "    return F.nll_loss(F.log_softmax(logits[mask], dim=-1), targets[mask])\n",
        "def response_loss(logits, targets, mask):\n"
        "    losses = -logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)\n"
        "    return (losses * mask).sum() / mask.sum()\n",
        "def response_loss(logits, targets, mask):\n"
        "    losses = -torch.softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0].log()\n"
        "    return losses[mask].mean()\n",
    ),
    "ch12_tokens.bits_per_byte": (
        "def bits_per_byte(logits, targets, token_bytes):\n"
        "    nats = -F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).sum()\n"
        "    return (nats / math.log(2) / token_bytes[targets].sum()).item()\n",
        "def bits_per_byte(logits, targets, token_bytes):\n"
        "    bits = -torch.log2(logits.softmax(-1).gather(-1, targets[..., None]))\n"
        "    return (bits.sum() / token_bytes[targets].sum()).item()\n",
    ),
    "ch09_full_model.label_smoothed_loss": (
        "def label_smoothed_loss(logits, target, pad_id, smoothing):\n"
        "    V = logits.shape[-1]\n"
        "    q = torch.full_like(logits, smoothing / (V - 2))\n"
        "    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)\n"
        "    q[..., pad_id] = 0\n"
        "    losses = -(q * torch.softmax(logits, dim=-1).log()).sum(-1)\n"
        "    keep = target != pad_id\n"
        "    return losses[keep].mean()\n",
    ),
    "ch08_embeddings.embed_and_encode": (
        "def embed_and_encode(tokens, weight):\n"
        "    L, D = tokens.shape[1], weight.shape[1]\n"
        "    pos = torch.arange(L, dtype=torch.float64)[:, None]\n"
        "    angles = pos / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)\n"
        "    pe = torch.zeros(L, D, dtype=torch.float64)\n"
        "    pe[:, 0::2] = torch.sin(angles)\n"
        "    pe[:, 1::2] = torch.cos(angles[:, : D // 2])\n"
        "    return F.embedding(tokens, weight) * math.sqrt(D) + pe.to(weight.dtype)\n",
    ),
    "ch13_instruction.lora_forward": (
        "def lora_forward(x, weight, bias, A, B, alpha):\n"
        "    scale = alpha / A.shape[0]\n"
        "    y = F.linear(x, weight, bias) + scale * F.linear(F.linear(x, A), B)\n"
        "    return y, torch.addmm(weight, B, A, alpha=scale)\n",
    ),
    "ch05_feed_forward.block_gradient_norms": (
        "def block_gradient_norms(blocks, x, target, residual):\n"
        "    h = x\n"
        "    for block in blocks:\n"
        "        h = h + block(h) if residual else block(h)\n"
        "    F.mse_loss(h, target).backward()\n"
        "    return [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in b.parameters()])).item()\n"
        "            for b in blocks]\n",
        "def block_gradient_norms(blocks, x, target, residual):\n"
        "    h = x\n"
        "    for block in blocks:\n"
        "        h = h + block(h) if residual else block(h)\n"
        "    nn.MSELoss()(h, target).backward()\n"
        "    return [torch.stack([p.grad.norm() for p in b.parameters()]).norm().item() for b in blocks]\n",
    ),
    "ch07_decoder.cached_self_attention": (
        "def cached_self_attention(attn, h_new, k_cache, v_cache):\n"
        "    B, _, D = h_new.shape\n"
        "    H = attn.n_heads\n"
        "    def heads(t):\n"
        "        return t.view(B, -1, H, D // H).transpose(1, 2)\n"
        "    q = heads(attn.w_q(h_new))\n"
        "    k = torch.cat([k_cache, heads(attn.w_k(h_new))], dim=2)\n"
        "    v = torch.cat([v_cache, heads(attn.w_v(h_new))], dim=2)\n"
        "    out = F.scaled_dot_product_attention(q, k, v)\n"
        "    return attn.w_o(out.transpose(1, 2).reshape(B, 1, D)), k, v\n",
    ),
    "ch10_gpt.top_p_filter": (
        "def top_p_filter(logits, top_p):\n"
        "    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)\n"
        "    e = torch.exp(sorted_logits - sorted_logits[..., :1])\n"
        "    probs = e / e.sum(-1, keepdim=True)\n"
        "    drop_sorted = probs.cumsum(-1) - probs >= top_p\n"
        "    drop = torch.zeros_like(drop_sorted)\n"
        "    drop.scatter_(-1, order, drop_sorted)\n"
        "    return logits.clone().masked_fill_(drop, float('-inf'))\n",
    ),
}
FINISHED = re.compile(
    r"softmax|norm|attention|sdp|dist|conv|pool|loss|embedding|dropout|rnn|lstm|gru|linear|bilinear|"
    r"entropy|nll|glu|silu|gelu|mish|interpolate|upsample|grid_sampler|ctc|affine|fused|_mps|cudnn|miopen|mkldnn|"
    r"quantize|sparse|_nested|segment_reduce|_foreach"
)


def generic_operators() -> list[str]:
    """The operators every exercise may run (see the module's docstring), by name."""
    denied = set().union(*grading.FUSED_KERNELS.values())
    names: set[str] = set(BASIC)
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name = schema.name[len("aten::") :]
        packet = getattr(torch.ops.aten, name, None)
        overload = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
        tags = set(getattr(overload, "tags", ()) or ())
        returns = schema.returns
        view = bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
        if torch.Tag.pointwise in tags or torch.Tag.reduction in tags or view:
            names.add(name)
    # the in-place twin of a generic operator (`scatter_`, `squeeze_`, `masked_fill_`) computes nothing more
    names |= {f"{name}_" for name in names if hasattr(torch.ops.aten, f"{name}_")}
    return sorted(n for n in names if n not in denied and not FINISHED.search(n))


def _record(run) -> set[str]:  # noqa: ANN001
    record = OperatorRecord()
    with contextlib.suppress(Exception), record:
        run()
    return record.seen


def _on_cases(exercise: Exercise, candidate) -> set[str]:  # noqa: ANN001
    """The operators `candidate` runs on every visible case and on the hidden inputs of SECRETS."""
    seen: set[str] = set()
    for index, case in enumerate(exercise.cases):
        variants = [case.inputs] + [lambda i=index, s=s: grading.hidden_inputs(exercise, i, s) for s in SECRETS]
        for make in variants:
            try:
                inputs = make()
            except Exception:  # noqa: BLE001, S112 - a case that cannot be built has nothing to record
                continue

            def run(inputs=inputs) -> None:
                with contextlib.nullcontext() if _needs_grad(inputs) else torch.no_grad():
                    exercise._run(candidate, *inputs)

            seen |= _record(run)
    return seen


def _exercises(module) -> dict[str, Exercise]:  # noqa: ANN001
    return {name: value for name, value in vars(module).items() if isinstance(value, Exercise)}


def from_modules() -> dict[str, set[str]]:
    """Each exercise's operators from its reference and its known wrong answers (its mistakes among them)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "transformer_lab" / "exercises").glob("ch[0-9][0-9]_*.py")):
        module = __import__(f"transformer_lab.exercises.{path.stem}", fromlist=["_"])
        for attribute, exercise in _exercises(module).items():
            seen = _on_cases(exercise, exercise.reference)
            for answer in exercise.wrong:  # its known wrong answers, the mistakes' among them: honest, only wrong
                seen |= _on_cases(exercise, answer)
            found[f"{path.stem}.{attribute}"] = seen
    return found


def _honest(exercise: Exercise, candidate, where: str) -> set[str]:  # noqa: ANN001
    """The operators of an honest answer from `where`, which the exercise's own check must accept."""
    result = exercise.run(candidate)
    if not result.passed:
        raise SystemExit(f"{where}: an honest answer of {exercise.name} no longer passes its check: {result.report()}")
    return _on_cases(exercise, candidate)


def _module(stem: str):  # noqa: ANN202
    return __import__(f"transformer_lab.exercises.{stem}", fromlist=["_"])


def from_standard() -> dict[str, set[str]]:
    """Each exercise's operators from its standard honest spellings (STANDARD)."""
    import math

    import torch.nn.functional as F  # noqa: N812

    found: dict[str, set[str]] = {}
    for key, sources in STANDARD.items():
        stem, attribute = key.split(".", 1)
        exercise = getattr(_module(stem), attribute)
        for number, source in enumerate(sources):
            namespace = {"torch": torch, "F": F, "math": math, "nn": torch.nn}
            exec(source, namespace)  # noqa: S102 - the spellings above
            found[key] = found.get(key, set()) | _honest(
                exercise, namespace[exercise.name], f"STANDARD[{key!r}][{number}]"
            )
    return found


def _passes_asserted(test: ast.AST, aliases: dict[str, str]):  # noqa: ANN202
    """(module stem, exercise attribute, answer expression) of each `assert ex.NAME.run(answer).passed` in `test`."""
    for node in ast.walk(test):
        if not isinstance(node, ast.Assert):
            continue
        terms = (
            node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else [node.test]
        )
        for term in terms:
            call = term.value if isinstance(term, ast.Attribute) and term.attr == "passed" else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "run"):
                continue
            target = call.func.value
            if len(call.args) == 1 and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                if target.value.id in aliases:
                    yield aliases[target.value.id], target.attr, call.args[0]


def from_tests() -> dict[str, set[str]]:
    """Each exercise's operators from the honest answers its tests assert to pass: a function defined in the test
    (or a lambda) handed to `ex.NAME.run(...)` under `assert ... .passed`."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_exercises_ch[0-9][0-9]*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        imports: list[ast.stmt] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "transformer_lab.exercises":
                aliases.update({a.asname or a.name: a.name for a in node.names if a.name.startswith("ch")})
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(node)
        namespace: dict = {"__name__": "allowed_operators_tests"}
        # the file's imports, then its helpers and constants (what an answer written in a test may call)
        helpers = [
            node
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.ClassDef))
            or (isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"))
        ]
        for node in [*imports, *helpers]:
            with contextlib.suppress(Exception):  # a test helper module (support, ...) is not needed here
                exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
        for test in tree.body:
            if not isinstance(test, ast.FunctionDef) or not test.name.startswith("test_"):
                continue
            local = {n.name: n for n in test.body if isinstance(n, ast.FunctionDef)}
            local_imports = [n for n in test.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            for stem, attribute, answer in _passes_asserted(test, aliases):
                exercise = getattr(_module(stem), attribute, None)
                if isinstance(answer, ast.Name) and answer.id in local:
                    code = ast.Module(body=[*local_imports, local[answer.id]], type_ignores=[])
                    scope = dict(namespace)
                    exec(compile(code, str(path), "exec"), scope)  # noqa: S102 - the course's own tests
                    candidate = scope[answer.id]
                elif isinstance(answer, ast.Lambda):
                    candidate = eval(compile(ast.Expression(answer), str(path), "eval"), dict(namespace))  # noqa: S307
                else:
                    continue  # an answer the exercise module defines: from_modules has it, or it is a shortcut
                if isinstance(exercise, Exercise):
                    key = f"{stem}.{attribute}"
                    where = f"{path.name}::{test.name}"
                    found[key] = found.get(key, set()) | _honest(exercise, candidate, where)
    return found


def from_notebooks() -> dict[str, set[str]]:
    """Each exercise's operators from the source edition's answer cells, run as the grader runs them."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = [c for c in cells if c.get("cell_type") == "code"]
        modules = [m.group(1) for c in code for m in [grading._IMPORT_LINE.search("".join(c["source"]))] if m]
        if not code or not modules:
            continue
        module = __import__(f"transformer_lab.exercises.{modules[0]}", fromlist=["_"])
        namespace: dict = {"__name__": "__main__"}
        with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
            exec("".join(code[0]["source"]), namespace)  # noqa: S102 - the course's own setup cell
            exec(f"from transformer_lab.exercises import {modules[0]} as exercises", namespace)  # noqa: S102
            for cell in cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                if cell.get("cell_type") != "code":
                    continue
                if meta.get("solution"):
                    exec("".join(cell["source"]), namespace)  # noqa: S102 - the source edition's answer
                if meta.get("grade"):
                    match = grading._CHECK_LINE.search("".join(cell["source"]))
                    if not match:
                        continue
                    attribute = match.group(1)
                    exercise = getattr(module, attribute, None)
                    candidate = namespace.get(match.group(2))
                    if isinstance(exercise, Exercise) and callable(candidate):
                        key = f"{modules[0]}.{attribute}"
                        found[key] = found.get(key, set()) | _on_cases(exercise, candidate)
    return found


def derive() -> dict:
    """The file's content: the generic operators and, per exercise, the further operators its honest answers ran."""
    torch.set_num_threads(1)
    generic = generic_operators()
    lists = from_modules()
    for source in (from_notebooks, from_tests, from_standard):
        for key, seen in source().items():
            lists[key] = lists.get(key, set()) | seen
    exercises = {}
    for key, seen in sorted(lists.items()):
        module, attribute = key.split(".", 1)
        denied = grading.FUSED_KERNELS.get(attribute, frozenset())
        exercises[key] = sorted(op for op in seen - set(generic) - denied)
    return {
        "about": "tools/allowed_operators.py: each exercise's ATen allow-list (generic + its own); do not edit",
        "torch": torch.__version__.split("+")[0],
        "generic": generic,
        "exercises": exercises,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args(argv)
    fresh = derive()
    if args.check:
        stored = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
        if stored == fresh:
            print(f"{OUT.relative_to(ROOT)} is up to date ({len(fresh['exercises'])} exercises)")
            return 0
        for key in sorted(set(stored.get("exercises", {})) | set(fresh["exercises"])):
            old, new = stored.get("exercises", {}).get(key), fresh["exercises"].get(key)
            if old != new:
                print(f"{key}: stored {old}, derived {new}")
        if stored.get("generic") != fresh["generic"]:
            old, new = set(stored.get("generic", [])), set(fresh["generic"])
            print(f"generic: {sorted(new - old)[:20]} new, {sorted(old - new)[:20]} gone")
        if stored.get("torch") != fresh["torch"]:
            print(f"torch: stored {stored.get('torch')}, here {fresh['torch']}")
        print(f"{OUT.relative_to(ROOT)} is stale: run `python tools/allowed_operators.py`")
        return 1
    OUT.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sizes = [len(v) for v in fresh["exercises"].values()]
    print(f"wrote {OUT.relative_to(ROOT)}: {len(fresh['generic'])} generic operators, {len(sizes)} exercises")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
