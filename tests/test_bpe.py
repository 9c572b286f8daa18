"""Tests of transformer_lab.bpe (chapter 12): the trainer against the direct one, round trips, special tokens,
save/load in both formats, bad input, and the `tl-bpe` command. Equality with tiktoken and Hugging Face
`tokenizers` is in test_bpe_equal.py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lab import bpe, bpe_cli
from transformer_lab.bpe import BYTE_ORDER, GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, ByteBPE
from transformer_lab.data import load_corpus

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)

MIXED = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。\n"
    "def add(a, b):\n    return a + b  # 12345 + 678 = 13023\n"
    "I'm sure you're right; THEY'LL see. Ünïcödé, naïve café, Ωμέγα, русский текст.\n"
    "emoji 😀👍🏽👨‍👩‍👧 🇨🇳 and tabs\t\tand   spaces    here\r\n"
)


@pytest.fixture(scope="module")
def shakespeare() -> str:
    return load_corpus("shakespeare")[:20_000]


@pytest.fixture(scope="module")
def mixed_tokenizer() -> ByteBPE:
    return ByteBPE.train(MIXED * 3, 400, special_tokens=["<|endoftext|>", "<|pad|>"])


# ----------------------------------------------------------------------------- training


def test_the_first_merges_of_a_small_text_and_the_tie_rule() -> None:
    tok = ByteBPE.train("hello hello world, the the the cat sat on the mat", 262)
    learned = [tok.token_bytes(256 + k) for k in range(len(tok.merges))]
    # "he" occurs 6 times (hello x2, the x4); then " t" and "the" tie at 4 and (t, he) wins: "t" has a smaller id
    # than " " (ids follow GPT-2's byte order, printable bytes first), the smallest pair being taken on a tie
    assert learned == [b"he", b"the", b" the", b"at", b"ll", b"hell"]
    assert tok.merge_counts == [6, 4, 4, 3, 2, 2]
    assert BYTE_ORDER[tok.merges[1][0]] == ord("t") and tok.merges[1][0] < BYTE_ORDER.index(ord(" "))


@pytest.mark.parametrize(("pattern", "size"), [("gpt2", 600), ("gpt4", 400)])
def test_incremental_training_equals_the_direct_one(shakespeare: str, pattern: str, size: int) -> None:
    text = shakespeare[:6_000] + load_corpus("tang")[:1_500]
    fast = ByteBPE.train(text, size, pattern=pattern, special_tokens=["<|endoftext|>"])
    slow = ByteBPE._train_direct(text, size, pattern=pattern, special_tokens=["<|endoftext|>"])
    assert fast.merges == slow.merges and fast.merge_counts == slow.merge_counts
    assert fast.to_dict() == slow.to_dict() and fast.vocab_size == size


@PROPERTY
@given(
    text=st.text(alphabet=st.sampled_from("aab ba\n  xyé我"), min_size=1, max_size=120),
    extra=st.integers(0, 60),
)
def test_incremental_training_equals_the_direct_one_on_any_small_text(text: str, extra: int) -> None:
    # few distinct bytes and many repeats: overlapping pairs ("aaa"), ties, early exhaustion
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small texts run out of pairs
        fast = ByteBPE.train(text, 256 + extra, pattern=r"\S+|\s+")
        slow = ByteBPE._train_direct(text, 256 + extra, pattern=r"\S+|\s+")
    assert fast.merges == slow.merges and fast.merge_counts == slow.merge_counts


def test_overlapping_pairs_merge_left_to_right() -> None:
    tok = ByteBPE.train("aaaaa", 258, pattern=r".+")
    # "aaaaa" holds (a, a) 4 times; merged left to right it is [aa, aa, a], where (aa, aa) and (aa, a) tie at 1
    # and (aa, a) is the smaller pair (a's id is below 256)
    assert [tok.token_bytes(i) for i in (256, 257)] == [b"aa", b"aaa"]
    assert tok.merge_counts == [4, 1]
    assert tok.encode("aaaaa") == [256, 257] and tok.encode("aaaa") == [256, 256]


def test_merges_never_cross_a_chunk_or_a_special_token() -> None:
    with pytest.warns(UserWarning, match="ran out of pairs"):
        tok = ByteBPE.train("ab.ab.ab<|endoftext|>ab<|endoftext|>ab", 300, special_tokens=["<|endoftext|>"])
    tokens = {tok.token_bytes(i) for i in range(256, 256 + len(tok.merges))}
    assert tokens == {b"ab"}  # "b." would cross GPT-2's split; "b<" and "|>a" would cross the special token
    assert tok.special_tokens == {"<|endoftext|>": 257} and tok.vocab_size == 258


def test_running_out_of_pairs_warns_and_keeps_ids_dense() -> None:
    with pytest.warns(UserWarning, match="ran out of pairs"):
        tok = ByteBPE.train("abab", 1000, special_tokens=["<s>"])
    assert [tok.token_bytes(i) for i in (256, 257)] == [b"ab", b"abab"]  # then every chunk is one token
    assert tok.vocab_size == 259 and tok.special_tokens == {"<s>": 258}
    assert tok.decode(tok.encode("<s>abab", allowed_special="all")) == "<s>abab"


def test_split_patterns_are_gpt2s_and_gpt4s() -> None:
    import regex

    text = "I'VE 12345 apples!!\n\n  and  it's\tfine"
    assert regex.findall(GPT2_SPLIT_PATTERN, text) == [
        "I", "'", "VE", " 12345", " apples", "!!", "\n\n ", " and", " ", " it", "'s", "\t", "fine",
    ]  # fmt: skip
    # GPT-4's: contractions in any case, digits by three, symbols keep their newlines, one non-letter joins a word
    assert regex.findall(GPT4_SPLIT_PATTERN, text) == [
        "I", "'VE", " ", "123", "45", " apples", "!!\n\n", " ", " and", " ", " it", "'s", "\tfine",
    ]  # fmt: skip
    assert ByteBPE.train(text, 260, pattern="gpt4").pattern == GPT4_SPLIT_PATTERN


# ----------------------------------------------------------------------------- encode and decode


@PROPERTY
@given(
    text=st.one_of(
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),  # any UTF-8-encodable string
        st.text(st.sampled_from("😀👍🏽🇨🇳‍ \u200d\ufe0f"), max_size=30),  # emoji, joiners, flags
        st.text(st.sampled_from("abc 我们的。ÀΩж\x00\x01\x1b\x7f\t\r\n\x0b\x0c\x85\u2028"), max_size=80),
        st.builds(lambda n, c: c * n + "x" + c * n, st.integers(0, 300), st.sampled_from([" ", "\n", "\t", "\r\n"])),
    ),
    pattern=st.sampled_from(["gpt2", "gpt4"]),
)
def test_decode_encode_is_the_identity(mixed_tokenizer: ByteBPE, text: str, pattern: str) -> None:
    tok = mixed_tokenizer if pattern == "gpt2" else _gpt4_mixed()
    ids = tok.encode(text, disallowed_special=())
    assert tok.decode(ids) == text and tok.decode(ids, errors="strict") == text
    assert all(0 <= i < tok.vocab_size for i in ids)


_GPT4_MIXED: list[ByteBPE] = []


def _gpt4_mixed() -> ByteBPE:
    if not _GPT4_MIXED:
        _GPT4_MIXED.append(ByteBPE.train(MIXED * 3, 400, pattern="gpt4"))
    return _GPT4_MIXED[0]


def test_trained_text_compresses_and_ids_follow_the_layout(mixed_tokenizer: ByteBPE) -> None:
    tok = mixed_tokenizer
    assert len(tok.encode(MIXED)) < len(MIXED.encode("utf-8")) / 2
    assert [tok.token_bytes(i) for i in range(3)] == [b"!", b'"', b"#"]  # GPT-2's byte order
    assert tok.special_tokens == {"<|endoftext|>": 398, "<|pad|>": 399}
    assert tok.encode("床前明月光") == tok.encode_ordinary("床前明月光")
    assert tok.decode(torch.tensor(tok.encode("naïve café"))) == "naïve café"  # tensors are accepted too


def test_decoding_ids_that_cut_a_character() -> None:
    tok = ByteBPE.train("我我我 我们", 258)  # learns the first two bytes of 我 (e6 88), then all three
    assert [tok.token_bytes(i) for i in (256, 257)] == ["我".encode()[:2], "我".encode()]
    head, tail = 256, BYTE_ORDER.index("我".encode()[2])
    assert tok.decode([head]) == "\ufffd"  # the default: replaced, never an exception
    assert tok.decode([tail, 257]) == "\ufffd我"
    assert tok.decode([head, tail]) == "我"  # whole again
    assert tok.decode([head], errors="ignore") == "" and tok.decode([head], errors="backslashreplace") == "\\xe6\\x88"
    with pytest.raises(UnicodeDecodeError):
        tok.decode([head], errors="strict")
    assert tok.labels([head, 257, BYTE_ORDER.index(32)]) == ["<e6 88>", "我", "␣"]


def test_special_tokens_follow_tiktoken_rules(mixed_tokenizer: ByteBPE) -> None:
    tok = mixed_tokenizer
    eot, pad = tok.special_tokens["<|endoftext|>"], tok.special_tokens["<|pad|>"]
    text = "end<|endoftext|>next<|pad|>"
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>'.*allowed_special"):
        tok.encode(text)  # disallowed by default: user text must not forge a document boundary
    assert tok.encode(text, allowed_special="all") == [*tok.encode("end"), eot, *tok.encode("next"), pad]
    ordinary = tok.encode(text, disallowed_special=())
    assert eot not in ordinary and ordinary == tok.encode_ordinary(text) and tok.decode(ordinary) == text
    with pytest.raises(ValueError, match="pad"):  # only <|endoftext|> allowed: <|pad|> is still disallowed
        tok.encode(text, allowed_special={"<|endoftext|>"})
    mixed = tok.encode(text, allowed_special={"<|endoftext|>"}, disallowed_special=())
    assert eot in mixed and pad not in mixed
    assert tok.decode([eot, pad]) == "<|endoftext|><|pad|>"
    with pytest.raises(ValueError, match=r"allowed_special: \['<\|bos\|>'\] are not special tokens"):
        tok.encode("x", allowed_special={"<|bos|>"})
    with pytest.raises(ValueError, match="disallowed_special"):
        tok.encode("x", disallowed_special={"<eos>"})
    with pytest.raises(TypeError, match="allowed_special"):
        tok.encode("x", allowed_special="<|pad|>")  # a bare string, not a set


# ----------------------------------------------------------------------------- save and load


def test_save_and_load_both_formats(tmp_path: Path, mixed_tokenizer: ByteBPE) -> None:
    paths = mixed_tokenizer.save(tmp_path / "tok")
    assert sorted(p.name for p in paths.values()) == ["merges.txt", "tokenizer.json", "vocab.json"]
    vocab = json.loads(paths["vocab"].read_text(encoding="utf-8"))
    assert vocab["!"] == 0 and vocab["Ġ"] == BYTE_ORDER.index(32) and vocab["<|endoftext|>"] == 398
    lines = paths["merges"].read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2" and len(lines) == 1 + len(mixed_tokenizer.merges)
    for loaded in (ByteBPE.load(tmp_path / "tok"), ByteBPE.load(paths["tokenizer"])):
        assert loaded.to_dict() == mixed_tokenizer.to_dict()
    paths["tokenizer"].unlink()  # vocab.json + merges.txt alone: the specials are the entries no merge makes
    assert ByteBPE.load(tmp_path / "tok").to_dict() == mixed_tokenizer.to_dict()


def test_a_gpt4_pattern_is_kept_by_tokenizer_json_and_given_for_gpt2_files(tmp_path: Path) -> None:
    tok = _gpt4_mixed()
    tok.save(tmp_path)
    assert ByteBPE.load(tmp_path).pattern == GPT4_SPLIT_PATTERN
    with pytest.raises(ValueError, match="differs from the split pattern"):
        ByteBPE.load(tmp_path, pattern="gpt2")
    (tmp_path / "tokenizer.json").unlink()
    assert ByteBPE.load(tmp_path).pattern == GPT2_SPLIT_PATTERN  # vocab.json + merges.txt do not record it
    assert ByteBPE.load(tmp_path, pattern="gpt4").to_dict() == tok.to_dict()


def test_to_dict_is_plain_data_for_a_checkpoint(tmp_path: Path, mixed_tokenizer: ByteBPE) -> None:
    torch.save({"tokenizer": mixed_tokenizer.to_dict()}, tmp_path / "c.pt")
    data = torch.load(tmp_path / "c.pt", weights_only=True)["tokenizer"]
    again = ByteBPE.from_dict(data)
    assert again.to_dict() == mixed_tokenizer.to_dict() and again.encode(MIXED) == mixed_tokenizer.encode(MIXED)
    with pytest.raises(ValueError, match="to_dict"):
        ByteBPE.from_dict({"pattern": "gpt2", "merges": []})


# ----------------------------------------------------------------------------- bad input


def test_bad_training_input() -> None:
    with pytest.raises(ValueError, match="text must not be empty"):
        ByteBPE.train("", 300)
    with pytest.raises(TypeError, match="text must be a str"):
        ByteBPE.train(b"bytes", 300)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"vocab_size must be at least 256 .* \+ 2 special token\(s\) = 258, got 257"):
        ByteBPE.train("abc", 257, special_tokens=["<a>", "<b>"])
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        ByteBPE.train("abc", 300.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="special_tokens must not repeat"):
        ByteBPE.train("abc", 300, special_tokens=["<a>", "<a>"])
    with pytest.raises(TypeError, match="special_tokens must be a list"):
        ByteBPE.train("abc", 300, special_tokens="<a>")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pattern .* is not a valid regular expression"):
        ByteBPE.train("abc", 300, pattern="(unclosed")


def test_bad_ids_and_modes(mixed_tokenizer: ByteBPE) -> None:
    tok = mixed_tokenizer
    with pytest.raises(ValueError, match=r"ids: token id 400 is outside the vocabulary \[0, 400\)"):
        tok.decode([1, 400])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="ids must hold int token ids"):
        tok.decode([1.0])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ids must be a list"):
        tok.decode("12")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ids must be 1-D"):
        tok.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="errors must be one of"):
        tok.decode([1], errors="loose")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("ok \ud800 not")


def test_wrong_or_corrupt_files(tmp_path: Path, mixed_tokenizer: ByteBPE) -> None:
    with pytest.raises(FileNotFoundError, match="neither a tokenizer.json file nor a directory"):
        ByteBPE.load(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not a JSON file"):
        ByteBPE.load(tmp_path / "notes.txt")
    (tmp_path / "other.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json of a BPE model"):
        ByteBPE.load(tmp_path / "other.json")
    paths = mixed_tokenizer.save(tmp_path / "tok")
    paths["tokenizer"].unlink()
    with paths["merges"].open("a", encoding="utf-8") as merges:
        merges.write("Ġzz qq\n")  # a merge of tokens that are not in vocab.json
    with pytest.raises(ValueError, match="'Ġzz' .* is not in the vocabulary"):
        ByteBPE.load(tmp_path / "tok")
    paths["merges"].write_text("#version: 0.2\nabc\n", encoding="utf-8")
    with pytest.raises(ValueError, match="every merge must be two token strings"):
        ByteBPE.load(tmp_path / "tok")
    data = json.loads(mixed_tokenizer.save(tmp_path / "t2")["tokenizer"].read_text(encoding="utf-8"))
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (tmp_path / "t2" / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="pre_tokenizer is not byte-level BPE's"):
        ByteBPE.load(tmp_path / "t2")
    with pytest.raises(ValueError, match="is a file"):
        mixed_tokenizer.save(tmp_path / "notes.txt")


def test_constructor_checks_the_pieces() -> None:
    byte_tokens = {i: bytes([b]) for i, b in enumerate(BYTE_ORDER)}
    with pytest.raises(ValueError, match="all 256 single bytes"):
        ByteBPE({i: t for i, t in byte_tokens.items() if i < 255} | {255: b"ab"}, [])
    with pytest.raises(ValueError, match="0 ... vocab_size - 1"):
        ByteBPE(byte_tokens, [], special_tokens={"<s>": 300})
    with pytest.raises(ValueError, match=r"merges\[0\] = .* makes b'!!', which is not in tokens"):
        ByteBPE(byte_tokens, [(0, 0)])
    assert ByteBPE(byte_tokens | {256: b"!!"}, [(0, 0)]).encode("!!!") == [256, 0]


# ----------------------------------------------------------------------------- the command line


def test_cli_train_encode_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(MIXED * 4, encoding="utf-8")
    out = tmp_path / "tok"
    argv = ["train", "--corpus", str(corpus), "--vocab-size", "320", "--special", "<|endoftext|>", "--out", str(out)]
    assert bpe_cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "trained 63 merges" in printed and "bytes per token" in printed and "tokenizer.json" in printed
    tok = ByteBPE.load(out)
    assert tok.vocab_size == 320 and tok.special_tokens == {"<|endoftext|>": 319}

    text = "Before we proceed 床前明月光 <|endoftext|>"
    assert bpe_cli.main(["encode", str(out), "--text", text, "--allowed-special", "all"]) == 0
    ids = capsys.readouterr().out.split()
    assert [int(i) for i in ids] == tok.encode(text, allowed_special="all")
    assert bpe_cli.main(["decode", str(out / "tokenizer.json"), *ids]) == 0
    assert capsys.readouterr().out == text + "\n"
    (tmp_path / "ids.txt").write_text(" ".join(ids), encoding="utf-8")
    assert bpe_cli.main(["decode", str(out), "--file", str(tmp_path / "ids.txt")]) == 0
    assert capsys.readouterr().out == text + "\n"

    with pytest.raises(SystemExit, match="special token '<|endoftext|>'"):
        bpe_cli.main(["encode", str(out), "--text", text])
    with pytest.raises(SystemExit, match="outside the vocabulary"):
        bpe_cli.main(["decode", str(out), "320"])
    with pytest.raises(SystemExit, match="ids must be whole numbers"):
        bpe_cli.main(["decode", str(out), "1", "x"])
    with pytest.raises(SystemExit, match=r"vocab_size must be at least 256 .* = 257, got 256"):
        bpe_cli.main([*argv[:4], "256", *argv[5:]])
    with pytest.raises(SystemExit, match="neither a tokenizer.json"):
        bpe_cli.main(["encode", str(tmp_path / "nowhere"), "--text", "x"])


@pytest.mark.slow
def test_cli_help_in_a_subprocess() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "transformer_lab.bpe_cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "train" in done.stdout and "decode" in done.stdout


def test_module_exports() -> None:
    assert set(bpe.__all__) <= set(dir(bpe)) and bpe.SPLIT_PATTERNS["gpt4"] == GPT4_SPLIT_PATTERN
