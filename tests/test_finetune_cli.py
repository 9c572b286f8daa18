"""Tests of the command line's chapter 13 commands: sft, rl (a few steps on the shipped Tang model) and poem, with
one clear sentence for each kind of bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from support import require

from transformer_lab import cli
from transformer_lab import finetune as ft

BASE = str(cli.FINETUNE_CHECKPOINTS["base"])


@pytest.fixture(autouse=True)
def _needs_pypinyin() -> None:
    """The rewards read rhymes with pypinyin, a requirement of the package: skipped locally without it, a failure
    under CI (support.require)."""
    require(
        importlib.util.find_spec("pypinyin") is not None, "pypinyin is not installed (pip install -r requirements.txt)"
    )


def fail_message(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    return str(caught.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ft")
    paths = {"sft": folder / "sft.pt", "lora": folder / "lora.pt", "rl": folder / "rl.pt"}
    assert cli.main(["sft", "--steps", "2", "--batch-size", "4", "--out", str(paths["sft"])]) == 0
    assert cli.main(["sft", "--lora-rank", "2", "--steps", "2", "--batch-size", "4", "--out", str(paths["lora"])]) == 0
    assert cli.main(["rl", str(paths["sft"]), "--steps", "2", "--out", str(paths["rl"])]) == 0
    return paths


def test_sft_and_rl_write_checkpoints_that_carry_the_format(trained: dict[str, Path]) -> None:
    model, tokenizer, fmt = ft.load_sft(trained["sft"])
    assert fmt.base_vocab == tokenizer.vocab_size and model.config.vocab_size == fmt.vocab_size
    raw = torch.load(trained["sft"], weights_only=True)
    assert raw["settings"]["steps"] == 2 and raw["state_dict"]["token_embedding.weight"].dtype == torch.float16
    rl_model, _, _ = ft.load_sft(trained["rl"])
    changed = [n for n, p in rl_model.state_dict().items() if not torch.equal(p, model.state_dict()[n])]
    assert changed  # one policy-gradient step moved the weights
    adapter = torch.load(trained["lora"], weights_only=True)
    assert adapter["kind"] == ft.LORA_KIND and adapter["token_rows"].shape == (3, 128)
    assert {layer["rank"] for layer in adapter["layers"].values()} == {2}


def test_sft_data_all_trains_on_every_quatrain_and_says_so(trained: dict[str, Path], tmp_path: Path) -> None:
    """--data all (every quatrain) against the default, the quatrains that rhyme: the same seed draws other
    examples (the two sets differ), so the weights differ, and each file records its data."""
    out = tmp_path / "all.pt"
    assert cli.main(["sft", "--data", "all", "--steps", "2", "--batch-size", "4", "--out", str(out)]) == 0
    every, rhyming = (torch.load(p, weights_only=True) for p in (out, trained["sft"]))
    assert (every["settings"]["data"], rhyming["settings"]["data"]) == ("all", "rhyming")
    assert any(not torch.equal(t, rhyming["state_dict"][n]) for n, t in every["state_dict"].items())


def test_poem_writes_a_poem_from_a_model_and_from_an_adapter(
    trained: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["poem", "春夏秋冬", "--checkpoint", str(trained["rl"]), "--num-samples", "2", "--check"]) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    assert len(lines) == 2 and all("form=" in line and "acrostic=" in line for line in lines)
    assert cli.main(["poem", "春夏秋冬", "--lora", str(trained["lora"]), "--base", BASE]) == 0
    assert capsys.readouterr().out.strip()


def test_poem_refuses_bad_heads(trained: dict[str, Path]) -> None:
    checkpoint = ["--checkpoint", str(trained["sft"])]
    assert "four characters" in fail_message(["poem", "春夏秋", *checkpoint])
    assert "four characters" in fail_message(["poem", "春夏秋冬雪", *checkpoint])
    for bad in ("A", "，", "1"):
        message = fail_message(["poem", "春夏秋" + bad, *checkpoint])
        assert repr(bad) in message and "not a Chinese character" in message and "vocabulary" not in message
    _, tokenizer, _ = ft.load_sft(trained["sft"])
    rare = next(c for c in "龘靐齉麤" if c not in tokenizer.chars)
    message = fail_message(["poem", "春夏秋" + rare, *checkpoint])
    assert rare in message and "vocabulary" in message


def test_poem_refuses_a_model_without_the_format_and_an_adapter_without_its_base(trained: dict[str, Path]) -> None:
    message = fail_message(["poem", "春夏秋冬", "--checkpoint", BASE])
    assert "without a prompt/response format" in message
    message = fail_message(["poem", "春夏秋冬", "--checkpoint", str(trained["lora"])])
    assert "LoRA adapter" in message and "--base" in message
    other = str(cli.ASSETS / "gpt_char_tang.pt")
    message = fail_message(["poem", "春夏秋冬", "--lora", str(trained["lora"]), "--base", other])
    assert "another base" in message or "tokens" in message
    assert "already fine-tuned" in fail_message(
        ["poem", "春夏秋冬", "--lora", str(trained["lora"]), "--base", str(trained["sft"])]
    )
    assert "not both" in fail_message(["poem", "春夏秋冬", "--lora", str(trained["lora"]), "--checkpoint", BASE])
    assert "--base goes with --lora" in fail_message(["poem", "春夏秋冬", "--base", BASE])


def test_sft_and_rl_refuse_bad_options(trained: dict[str, Path], tmp_path: Path) -> None:
    for value in ("-1", "0", "nan", "inf"):
        assert "--lr must be a number > 0" in fail_message(["sft", "--lr", value, "--out", str(tmp_path / "x.pt")])
        assert "--lr must be a number > 0" in fail_message(["rl", str(trained["sft"]), "--lr", value, "--out", "x"])
    assert "--batch-size" in fail_message(["sft", "--batch-size", "0", "--out", str(tmp_path / "x.pt")])
    assert "--steps" in fail_message(["sft", "--steps", "0", "--out", str(tmp_path / "x.pt")])
    assert "--lora-rank" in fail_message(["sft", "--lora-rank", "-1", "--out", str(tmp_path / "x.pt")])
    for value in ("-0.1", "nan", "inf"):
        assert "--kl must be a number >= 0" in fail_message(["rl", str(trained["sft"]), "--kl", value, "--out", "x"])
    assert "without a prompt/response format" in fail_message(["rl", BASE, "--out", str(tmp_path / "x.pt")])
    assert "already fine-tuned" in fail_message(["sft", "--base", str(trained["sft"]), "--out", str(tmp_path / "x")])


def test_shipped_log_was_made_with_the_cli_recipes() -> None:
    import json

    log = json.loads((cli.ASSETS / "finetune_log.json").read_text("utf-8"))
    for stage in ("sft", "lora"):
        assert log["settings"][stage] == cli.FINETUNE_DEFAULTS[stage]
    rl = {k: log["settings"]["rl"][k] for k in cli.FINETUNE_DEFAULTS["rl"]}
    assert rl == cli.FINETUNE_DEFAULTS["rl"]
    sft = torch.load(cli.FINETUNE_CHECKPOINTS["sft"], weights_only=True)
    assert {k: sft["settings"][k] for k in ("steps", "batch_size", "lr", "data")} == {
        k: cli.FINETUNE_DEFAULTS["sft"][k] for k in ("steps", "batch_size", "lr", "data")
    }


def test_a_base_the_format_cannot_use_is_refused_in_one_sentence(trained: dict[str, Path], tmp_path: Path) -> None:
    out = str(tmp_path / "x.pt")
    bpe = str(cli.ASSETS / "gpt_bpe_tang.pt")
    message = fail_message(["sft", "--base", bpe, "--out", out])
    assert "--base" in message and "ByteBPE" in message and "one token per character" in message
    assert "gpt_tang.pt" in message
    message = fail_message(["poem", "春夏秋冬", "--lora", str(trained["lora"]), "--base", bpe])
    assert "--base" in message and "one token per character" in message
    message = fail_message(["sft", "--base", str(cli.ASSETS / "gpt_shakespeare.pt"), "--out", out])
    assert "--base" in message and "has no token for" in message and "gpt_tang.pt" in message
    assert not Path(out).exists()
    # a model fine-tuned (through the API) on a BPE base: rl and poem refuse it too
    from transformer_lab.gpt_training import load_gpt

    base, tokenizer = load_gpt(bpe)
    ft.save_sft(ft.add_special_tokens(base), tmp_path / "bpe_sft.pt", tokenizer, ft.SFTFormat(tokenizer.vocab_size))
    for argv in (
        ["rl", str(tmp_path / "bpe_sft.pt"), "--out", out],
        ["poem", "春夏秋冬", "--checkpoint", str(tmp_path / "bpe_sft.pt")],
    ):
        assert "one token per character" in fail_message(argv)


def test_poem_refuses_an_adapter_file_it_cannot_read_in_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "notes.pt").write_text("not a checkpoint", encoding="utf-8")
    message = fail_message(["poem", "春夏秋冬", "--lora", str(tmp_path / "notes.pt")])
    assert message.startswith("error: --lora") and "LoRA checkpoint" in message and "\n" not in message
    torch.save({"something": 1}, tmp_path / "other.pt")
    assert "not a LoRA checkpoint" in fail_message(["poem", "春夏秋冬", "--lora", str(tmp_path / "other.pt")])


def _benchmark():  # noqa: ANN202 - benchmarks/finetune.py as a module (imported by path)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "finetune.py"
    spec = importlib.util.spec_from_file_location("benchmark_finetune", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_commands_reproduce_the_benchmarks_runs(trained: dict[str, Path], tmp_path: Path) -> None:
    """The shipped models come from benchmarks/finetune.py; the commands say they reproduce them. Short runs of
    both (the same reduced steps and batch on both sides) give the same weights, bit for bit."""
    bench = _benchmark()
    s = bench.setup()
    tok = s["tokenizer"]
    fmt = ft.SFTFormat(tok.vocab_size)
    train = ft.encode_examples(s["sft_data"]["train"], fmt, tok)
    valid = ft.encode_examples(s["sft_data"]["validation"], fmt, tok)
    quiet = {"log": None, "steps": 2, "batch_size": 4}

    sft_model, _, _ = bench.train_sft(s["base"], train, valid, 0, **quiet)
    cli_sft, _, _ = ft.load_sft(trained["sft"])
    for name, tensor in cli_sft.state_dict().items():
        assert torch.equal(tensor, sft_model.state_dict()[name]), name

    lora_model, _, _ = bench.train_sft(s["base"], train, valid, 0, lora=True, rank=2, alpha=4.0, **quiet)
    ft.save_lora(lora_model, tmp_path / "bench_lora.pt", new_rows=3, half=True)
    ours, theirs = (torch.load(p, weights_only=True) for p in (trained["lora"], tmp_path / "bench_lora.pt"))
    assert ours["base_fingerprint"] == theirs["base_fingerprint"] and sorted(ours["layers"]) == sorted(theirs["layers"])
    assert torch.equal(ours["token_rows"], theirs["token_rows"])
    for name, layer in ours["layers"].items():
        assert torch.equal(layer["A"], theirs["layers"][name]["A"]) and torch.equal(
            layer["B"], theirs["layers"][name]["B"]
        )

    assert bench.SETTINGS["rl"]["kl_coef"] > 0  # the recipe's KL penalty to the SFT model: on in both
    rl_model, _ = bench.train_rl(cli_sft, fmt, tok, s["train_heads"], 0, log=None, steps=2)
    cli_rl, _, _ = ft.load_sft(trained["rl"])
    for name, tensor in cli_rl.state_dict().items():
        assert torch.equal(tensor, rl_model.state_dict()[name]), name
    # the penalty's gradient is zero at the first step (the policy is the reference), not at the second
    no_kl, _ = bench.train_rl(cli_sft, fmt, tok, s["train_heads"], 0, log=None, steps=2, kl_coef=0.0)
    assert any(not torch.equal(t, no_kl.state_dict()[n]) for n, t in cli_rl.state_dict().items())


def test_shipped_checkpoints_record_the_cli_recipes() -> None:
    """What the shipped files say they were trained with is the command line's defaults."""
    sft = torch.load(cli.FINETUNE_CHECKPOINTS["sft"], weights_only=True)["settings"]
    lora = torch.load(cli.FINETUNE_CHECKPOINTS["lora"], weights_only=True)["settings"]
    rl = torch.load(cli.FINETUNE_CHECKPOINTS["rl"], weights_only=True)["settings"]
    assert sft == cli.FINETUNE_DEFAULTS["sft"] and lora == cli.FINETUNE_DEFAULTS["lora"]
    assert {k: rl[k] for k in cli.FINETUNE_DEFAULTS["rl"]} == cli.FINETUNE_DEFAULTS["rl"]


def test_the_log_is_one_recipe_and_a_line_of_another_is_refused() -> None:
    """Every line of the committed log ran the benchmark's SETTINGS (so its seeds may be averaged), and `table` /
    `ship` refuse a line that ran another recipe or does not say which, naming its stage and seed."""
    import json

    bench = _benchmark()
    rows = [json.loads(line) for line in bench.LOG.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert rows and all(r["settings"] == bench.SETTINGS and r["made_on"] for r in rows)
    bench.check_one_recipe(rows)  # the committed log passes
    other = json.loads(json.dumps(rows[0]))
    other["settings"]["sft"]["steps"] = 250  # last session's recipe
    with pytest.raises(SystemExit, match=r"stage 'a_base_one_shot', seed 0 ran another recipe"):
        bench.check_one_recipe([*rows, other])
    bare = {k: v for k, v in rows[-1].items() if k != "settings"}
    with pytest.raises(SystemExit, match="records no recipe"):
        bench.check_one_recipe([bare])
    shipped = json.loads((bench.ASSETS / "finetune_log.json").read_text(encoding="utf-8"))
    assert shipped["settings"] == bench.SETTINGS and len(shipped["runs"]) == len(rows)


def test_the_all_quatrains_comparison_differs_from_the_recipe_by_the_data_alone(tmp_path: Path) -> None:
    """`ship`'s "all_quatrains" (the first recipe's (c) and (d), SFT on every quatrain) is what the shipped log
    holds, and a line whose SFT recipe differs in more than the data, or that was measured another way, is
    refused."""
    import json

    bench = _benchmark()
    shipped = json.loads((bench.ASSETS / "finetune_log.json").read_text(encoding="utf-8"))
    assert shipped["all_quatrains"] == json.loads(json.dumps(bench.all_quatrains_summary()))
    assert set(shipped["all_quatrains"]) == {"c_sft", "d_lora"}
    lines = bench.ALL_QUATRAINS_LOG.read_text(encoding="utf-8").splitlines()
    changes = ((("sft", "lr"), "recipe is not SETTINGS' but for the data"), (("temperature",), "another way"))
    for change, message in changes:
        rows = [json.loads(line) for line in lines if line.strip()]
        target = next(r for r in rows if r["stage"] == "c_sft")["settings"]
        if len(change) == 2:
            target[change[0]][change[1]] = 1e-3
        else:
            target[change[0]] = 1.0
        bad = tmp_path / "all.jsonl"
        bad.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
        bench.ALL_QUATRAINS_LOG = bad
        with pytest.raises(SystemExit, match=message):
            bench.all_quatrains_summary()
