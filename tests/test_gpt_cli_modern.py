"""Tests of gpt-train's model switches (chapter 11) and --tokenizer (chapter 12): tiny models, a few steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_lab import cli, training
from transformer_lab.bpe import ByteBPE
from transformer_lab.data import TextTokenizer
from transformer_lab.gpt import GPTConfig

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "transformer_lab" / "assets"
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16", "--batch-size", "4"]
SHORT = ["--steps", "3", "--warmup", "1", "--eval-every", "3", "--no-progress"]
VERSE = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 10


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "verse.txt"
    path.write_text(VERSE, "utf-8")
    return path


def _train(tmp_path: Path, text_file: Path, *extra: str, name: str = "m.pt") -> Path:
    out = tmp_path / name
    assert cli.main(["gpt-train", "--text", str(text_file), *TINY, *SHORT, *extra, "--out", str(out)]) == 0
    return out


# Each switch alone: (options, the GPTConfig fields they must set). Everything else stays GPT-2's.
SWITCHES = [
    (["--no-bias"], {"bias": False}),
    (["--untied"], {"tie_embeddings": False}),
    (["--activation", "relu2"], {"activation": "relu2"}),
    (["--activation", "swiglu"], {"activation": "swiglu"}),
    (["--positions", "rope"], {"positions": "rope"}),
    (["--positions", "rope", "--rope-base", "500000"], {"positions": "rope", "rope_base": 500000.0}),
    (["--positions", "rope", "--rope-layout", "halves"], {"positions": "rope", "rope_layout": "halves"}),
    (["--norm", "rms"], {"norm": "rms"}),
    (["--norm", "rms_no_weight"], {"norm": "rms_no_weight"}),
    (["--norm-eps", "1e-6"], {"norm_eps": 1e-6}),
    (["--embedding-norm"], {"embedding_norm": True}),
    (["--qk-norm", "rms"], {"qk_norm": "rms"}),
    (["--qk-norm", "rms_no_weight"], {"qk_norm": "rms_no_weight"}),
    (["--n-kv-heads", "1"], {"n_kv_heads": 1}),
    (["--head-dim", "12"], {"head_dim": 12}),
    (["--ff-width", "40"], {"ff_width": 40}),
    (["--logit-softcap", "15"], {"logit_softcap": 15.0}),
    (["--zero-init-output"], {"zero_init_output": True}),
]


def test_the_defaults_are_gpt2s_and_every_switch_reaches_the_config() -> None:
    """Parsing only (no training): the defaults give chapter 10's config, each option sets its one field."""
    parser = cli.build_parser()
    base = ["gpt-train", *TINY, "--out", "x.pt"]
    default = cli._gpt_config(parser.parse_args(base), vocab_size=30)
    assert default == GPTConfig(vocab_size=30, block_size=16, d_model=16, n_heads=2, n_layers=1)
    for options, fields in SWITCHES:
        config = cli._gpt_config(parser.parse_args([*base, *options]), vocab_size=30)
        changed = {k: v for k, v in config.to_dict().items() if v != default.to_dict()[k]}
        assert changed == fields, options


@pytest.mark.parametrize(
    "options, fields",
    [
        (["--positions", "rope", "--norm", "rms_no_weight", "--qk-norm", "rms_no_weight", "--activation", "relu2",
          "--no-bias", "--untied", "--zero-init-output", "--logit-softcap", "15", "--embedding-norm"], None),
        (["--positions", "rope", "--rope-layout", "halves", "--rope-base", "500000", "--norm", "rms", "--qk-norm",
          "rms", "--activation", "swiglu", "--n-kv-heads", "1", "--head-dim", "12", "--ff-width", "24",
          "--norm-eps", "1e-6", "--no-bias", "--untied"], None),
    ],
    ids=["nanochat-like", "qwen3-like"],
)  # fmt: skip
def test_a_modern_model_trains_saves_and_loads_back_the_same(
    options: list[str], fields: None, tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The switches round-trip through the checkpoint: load_gpt rebuilds the same config and weights, and the
    reloaded model generates the tokens the trained one does."""
    out = _train(tmp_path, text_file, *options, "--optimizer", "muon")
    capsys.readouterr()
    raw = torch.load(out, weights_only=True)  # plain data only
    expected = cli._gpt_config(cli.build_parser().parse_args(["gpt-train", *TINY, *options, "--out", "x"]), 1)
    assert raw["config"] == {**expected.to_dict(), "vocab_size": raw["config"]["vocab_size"]}
    model, tokenizer = training.load_gpt(out)
    assert model.config == GPTConfig(**raw["config"])
    for name, weight in model.state_dict().items():
        assert torch.equal(weight, raw["state_dict"][name]), name
    # the CLI's greedy sample equals the reloaded model's own greedy generation
    assert cli.main(["gpt-sample", str(out), "--prompt", "Thou", "--length", "10", "--temperature", "0"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    with torch.no_grad():
        ids = model.generate(tokenizer.encode("Thou")[None], 10, temperature=0.0)[0]
    assert printed == tokenizer.decode(ids) and len(printed) == 4 + 10


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--n-kv-heads", "0"], "--n-kv-heads must be at least 1"),
        (["--head-dim", "0"], "--head-dim must be at least 1"),
        (["--ff-width", "-3"], "--ff-width must be at least 1"),
        (["--rope-base", "0"], "--rope-base must be a number > 0"),
        (["--norm-eps=-1e-5"], "--norm-eps must be a number > 0"),
        (["--logit-softcap", "inf"], "--logit-softcap must be a number > 0"),
        (["--n-kv-heads", "3"], "--n-kv-heads / --n-heads: n_kv_heads must divide n_heads"),
        (["--rope-base", "500"], "--rope-base / --positions: rope_base=500.0 needs positions='rope'"),
        (["--rope-layout", "halves"], "--rope-layout / --positions"),
        (["--positions", "rope", "--head-dim", "7"], "--positions / .*--head-dim: .*d_k must be even"),
    ],
)
def test_bad_switches_are_refused_naming_the_option(
    extra: list[str], match: str, tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started although the options are bad")

    monkeypatch.setattr(cli, "train_gpt", never)
    with pytest.raises(SystemExit, match=match):
        cli.main(["gpt-train", "--text", str(text_file), *TINY, *extra, "--out", str(tmp_path / "x.pt")])


@pytest.mark.parametrize("option", ["--positions", "--rope-layout", "--norm", "--qk-norm", "--activation"])
def test_unknown_switch_values_are_refused_by_the_parser(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["gpt-train", option, "nonsense", "--out", "x.pt"])
    assert f"argument {option}: invalid choice: 'nonsense'" in capsys.readouterr().err


def test_head_dim_frees_d_model_from_n_heads() -> None:
    args = cli.build_parser().parse_args(
        ["gpt-train", "--d-model", "18", "--n-heads", "4", "--head-dim", "8", "--out", "x"]
    )
    assert cli._gpt_config(args, 5).d_k == 8  # 18 is not divisible by 4, but each head is given its size


def test_a_tokenizer_run_trains_saves_reloads_and_samples(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bpe = ByteBPE.train(VERSE, vocab_size=300, special_tokens=["<|endoftext|>"])
    folder = tmp_path / "bpe"
    paths = bpe.save(folder)
    out = _train(tmp_path, text_file, "--tokenizer", str(folder), "--positions", "rope", "--norm", "rms")
    assert "checkpoint written" in capsys.readouterr().out
    raw = torch.load(out, weights_only=True)  # the merges travel as plain data
    assert raw["tokenizer"] == bpe.to_dict() and raw["config"]["vocab_size"] == 300
    model, tokenizer = training.load_gpt(out)
    assert isinstance(tokenizer, ByteBPE) and tokenizer.to_dict() == bpe.to_dict()
    assert model.config.vocab_size == 300 and model.config.positions == "rope"

    prompt = "Thou art"
    sample = ["gpt-sample", str(out), "--prompt", prompt, "--length", "8", "--temperature", "0"]
    assert cli.main(sample) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    with torch.no_grad():
        ids = model.generate(torch.tensor([bpe.encode(prompt)]), 8, temperature=0.0)[0]
    assert printed == bpe.decode(ids) and printed.startswith(prompt)
    # the same tokenizer given explicitly (as a folder or its tokenizer.json) is accepted, and changes nothing
    for given in (folder, paths["tokenizer"]):
        assert cli.main([*sample, "--tokenizer", str(given)]) == 0
        assert capsys.readouterr().out.rstrip("\n") == printed
    # the default prompt (a newline) and sampling with a seed work too
    assert cli.main(["gpt-sample", str(out), "--length", "5", "--seed", "2", "--num-samples", "2"]) == 0
    assert capsys.readouterr().out.count("--- sample") == 2

    # another tokenizer is refused: its ids would mean other text
    other = tmp_path / "other"
    ByteBPE.train(VERSE, vocab_size=290).save(other)
    with pytest.raises(SystemExit, match="is not the tokenizer .* was trained with"):
        cli.main([*sample, "--tokenizer", str(other)])
    with pytest.raises(SystemExit, match="not a byte-level BPE tokenizer"):
        cli.main([*sample, "--tokenizer", str(text_file)])
    # --init goes on only with the same tokenizer
    _train(tmp_path, text_file, "--tokenizer", str(folder), "--positions", "rope", "--norm", "rms",
           "--init", str(out), name="more.pt")  # fmt: skip
    with pytest.raises(SystemExit, match="--init .* another tokenizer"):
        _train(tmp_path, text_file, "--tokenizer", str(other), "--init", str(out), name="no.pt")
    with pytest.raises(SystemExit, match="--init .* another tokenizer"):
        _train(tmp_path, text_file, "--init", str(out), name="no.pt")


def test_a_character_checkpoint_refuses_a_tokenizer(tmp_path: Path, text_file: Path) -> None:
    out = _train(tmp_path, text_file)
    folder = tmp_path / "bpe"
    ByteBPE.train(VERSE, vocab_size=280).save(folder)
    with pytest.raises(SystemExit, match="trained on characters"):
        cli.main(["gpt-sample", str(out), "--prompt", "Thou", "--tokenizer", str(folder)])
    _, tokenizer = training.load_gpt(out)
    assert isinstance(tokenizer, TextTokenizer)


def test_bad_tokenizer_paths_are_refused_before_training(
    tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "train_gpt", lambda *a, **k: pytest.fail("training started"))
    base = ["gpt-train", "--text", str(text_file), *TINY, "--out", str(tmp_path / "x.pt")]
    with pytest.raises(SystemExit, match="--tokenizer .*no such file or folder"):
        cli.main([*base, "--tokenizer", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="--tokenizer .*not a byte-level BPE tokenizer"):
        cli.main([*base, "--tokenizer", str(text_file)])
    short = tmp_path / "bpe"
    ByteBPE.train(VERSE, vocab_size=300).save(short)  # long merges: a line becomes few tokens
    tiny_text = tmp_path / "tiny.txt"
    tiny_text.write_text("Shall I compare thee to a summer's day?\n", "utf-8")
    with pytest.raises(SystemExit, match="tokens, fewer than --block-size"):
        cli.main(["gpt-train", "--text", str(tiny_text), *TINY, "--tokenizer", str(short), "--out", "x.pt"])


def test_newline_share_with_a_tokenizer(tmp_path: Path, text_file: Path) -> None:
    """Windows can begin at a newline token: the same offsets token_starts gives for its id."""
    folder = tmp_path / "bpe"
    bpe = ByteBPE.train(VERSE, vocab_size=270)
    bpe.save(folder)
    out = _train(tmp_path, text_file, "--tokenizer", str(folder), "--newline-share", "1.0")
    assert torch.load(out, weights_only=True)["options"]["newline_share"] == 1.0


@pytest.mark.parametrize("name", ["gpt_shakespeare.pt", "gpt_tang.pt"])
def test_chapter_10_checkpoints_still_load(name: str) -> None:
    """Saved before the switches existed (their configs lack the fields): GPT-2's model, characters."""
    path = ASSETS / name
    if not path.is_file():
        pytest.skip(f"{name} is not shipped")
    raw = torch.load(path, weights_only=True)
    model, tokenizer = training.load_gpt(path)
    assert isinstance(tokenizer, TextTokenizer) and tokenizer.to_dict() == raw["tokenizer"]
    config = model.config
    assert (config.positions, config.norm, config.activation, config.qk_norm) == ("learned", "layer", "gelu_tanh", None)
    assert config.bias and config.tie_embeddings and config.kv_heads == config.n_heads
