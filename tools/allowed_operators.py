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
  inputs of two class secrets, and the source edition's answer cells (notebooks/solutions/) run as the grader runs
  them, the chapter's setup cell first.

The list depends on the PyTorch version (which operators exist, how a function decomposes), so the file records it,
and tests/test_grading_allowlist.py fails when the stored lists differ from a fresh derivation.
"""

from __future__ import annotations

import argparse
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
#: generic operators no tag names: indexing, creation, copying, sorting, matrix products, random numbers
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
    """.split()
)
#: names of finished layers: never generic, whatever their tags say
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
    for key, seen in from_notebooks().items():
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
