"""Chapter 09's shipped copy model (transformer_lab/assets/copy_model.pt): it loads, it copies, and it is what
`shipped.COPY_RECIPE` (the notebook's section 6) makes."""

from __future__ import annotations

import pytest
import torch

from transformer_lab import cli, data, shipped, training


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
    for steps in (0, 401, 2.5, True):
        with pytest.raises(ValueError, match="steps must be an int from 1 to 400"):
            shipped.train_copy_model(steps=steps)  # type: ignore[arg-type]
