"""Chapter 09's shipped copy model (transformer_lab/assets/copy_model.pt): it loads, it copies, and it is what
`shipped.COPY_RECIPE` (the notebook's section 6) makes."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

from transformer_lab import cli, data, shipped, training

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "09_full_model.ipynb"


@pytest.fixture(scope="module")
def checkpoint() -> dict:
    return torch.load(cli.SHIPPED_COPY_CHECKPOINT, weights_only=True)


def test_the_shipped_copy_model_loads_and_copies_as_recorded(checkpoint: dict) -> None:
    model, tokenizer, task = cli.load_shipped("copy")
    assert isinstance(task, data.CopyTask) and task.to_dict() == shipped.COPY_RECIPE["task"]
    assert not model.training and model.config.to_dict() == checkpoint["config"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert tokenizer.to_dict() == data.CharTokenizer().to_dict()  # the notebook's tokenizer
    test = task.examples("test", shipped.COPY_RECIPE["test_examples"])
    right, n = checkpoint["test_exact_match"]["all"]
    assert n == len(test) and training.exact_match(model, test, tokenizer) == pytest.approx(right / n)
    assert right / n > 0.8  # the notebook's own bound on its copy model
    assert shipped.copy_model()[2].to_dict() == task.to_dict()


def test_the_shipped_copy_model_is_the_recipes(checkpoint: dict) -> None:
    recipe = shipped.COPY_RECIPE
    options = checkpoint["options"]
    assert {k: options[k] for k in recipe["train"]} == recipe["train"]
    assert {k: options[k] for k in recipe["model"]} == recipe["model"]
    assert {k: checkpoint["config"][k] for k in recipe["model"]} == recipe["model"]
    history = checkpoint["history"]
    assert history["step"] == list(range(1, recipe["train"]["steps"] + 1))
    assert history["eval_step"] == [100, 200, 300, 400]
    # The first 15 steps again, by the recipe: the same batches, rates and losses as the shipped run's (up to the
    # float rounding of another CPU). Another seed, batch size, rate or model would give other losses from step 1.
    _, _, _, prefix = shipped.train_copy_model(steps=15)
    assert prefix.lr == pytest.approx(history["lr"][:15], rel=1e-12)
    assert prefix.loss == pytest.approx(history["loss"][:15], rel=1e-4)


def test_bad_requests_are_refused_with_the_argument_named() -> None:
    with pytest.raises(ValueError, match="task must be 'dates' or 'copy'"):
        cli.load_shipped("reverse")
    for task in (["copy"], 5, None):  # not a name: the same sentence, not a TypeError from the lookup
        with pytest.raises(ValueError, match="task must be 'dates' or 'copy'"):
            cli.load_shipped(task)  # type: ignore[arg-type]
    for steps in (0, 401, 2.5, True):
        with pytest.raises(ValueError, match="steps must be an int from 1 to 400"):
            shipped.train_copy_model(steps=steps)  # type: ignore[arg-type]


def _call_keywords(tree: ast.AST, name: str) -> dict[str, object]:
    """The literal keywords of the one call to `name` (e.g. "training.train") in a cell; an `a if QUICK else b`
    keyword is read as b, the full run's value."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]
    assert len(calls) == 1, f"{len(calls)} calls to {name} in the cell"
    keywords = {}
    for k in calls[0].keywords:
        value = k.value.orelse if isinstance(k.value, ast.IfExp) else k.value
        if isinstance(value, ast.Constant):
            keywords[k.arg] = value.value
    return keywords


def test_the_recipe_is_the_one_chapter_09_trains() -> None:
    """COPY_RECIPE says what section 6's cell does; the chapter's own copy model is trained by the same options."""
    notebook = json.loads(CHAPTER.read_text(encoding="utf-8"))
    [cell] = [c for c in notebook["cells"] if c["cell_type"] == "code" and "copy_config = " in "".join(c["source"])]
    tree = ast.parse("".join(cell["source"]))
    recipe = shipped.COPY_RECIPE
    assert _call_keywords(tree, "data.CopyTask") == {"max_len": recipe["task"]["max_len"]}
    assert data.CopyTask(max_len=recipe["task"]["max_len"]).to_dict() == recipe["task"]
    assert _call_keywords(tree, "tl.TransformerConfig") == recipe["model"]
    called = _call_keywords(tree, "training.train")
    defaults = {k: p.default for k, p in inspect.signature(training.train).parameters.items() if k in recipe["train"]}
    assert {**defaults, **called} == recipe["train"]  # smoothing: train's default, 0.1
    assert "shipped_copy" in "".join(c for cell in notebook["cells"] for c in cell["source"])  # section 8 reads it
