"""Our byte-level BPE against the tools people use (chapter 12): the same vocabulary loaded into tiktoken (an
`Encoding` built from the merge ranks, no download) and into Hugging Face `tokenizers` (from vocab.json +
merges.txt, and from tokenizer.json) gives identical ids on every line of both corpora's validation splits and
on made-up edge cases; and Hugging Face's own trainer learns the same merges from the same text.

Both libraries are pinned in requirements.txt; without them these tests skip with the reason (and fail
under CI, as the other tests of optional tools do).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from support import require

from transformer_lab.bpe import GPT2_SPLIT_PATTERN, ByteBPE, _to_unicode
from transformer_lab.data import load_corpus, split_text

HAS_TIKTOKEN = importlib.util.find_spec("tiktoken") is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
INSTALL = "(pip install -r requirements.txt)"

SPECIAL = "<|endoftext|>"
VOCAB_SIZE = 1024

EDGE_CASES = [
    "",
    " ",
    "a",
    "Hello, world!",
    "I'm sure you're right; THEY'LL see, it'S fine.",
    "12345678901234567890 3.14159 1,000,000 -42 0x1F 2026年11月26日",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    '{"key": [1, 2, 3], "html": "<b>bold</b>"}',
    "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。",
    "日本語のテキスト、한국어 텍스트, Ωμέγα, русский текст, עברית, العربية, हिन्दी",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇨🇳🇫🇷 keycap 1️⃣ ❤️",
    "\x00\x01\x02\x1b[31mred\x1b[0m\x7f\x08",
    "tabs\t\t\tand\x0bvertical\x0cform feed",
    "windows\r\nline\r\n\r\nends\r",
    " " * 300 + "x" + " " * 300,
    "\n" * 50 + "after newlines",
    "    leading and trailing spaces    ",
    "a" * 2000,
    "zero\u200bwidth\u200djoiner\ufeffBOM\u00a0nbsp\u2028line\u2029para",
    "naïve café résumé Ünïcödé ß ﬁ",
    "mixed: English中文English, 123中文456",
    f"with a special token {SPECIAL} inside {SPECIAL}{SPECIAL}",
]


@pytest.fixture(scope="module")
def corpora() -> dict[str, tuple[str, str]]:
    """Each corpus as (train, validation), cut as chapter 10 cuts it (`split_text`: first 90 % / last 10 %)."""
    return {name: split_text(load_corpus(name)) for name in ("shakespeare", "tang")}  # type: ignore[misc]


@pytest.fixture(scope="module")
def training_text(corpora: dict[str, tuple[str, str]]) -> str:
    """English and Chinese together, so the merges include both (kept small: the tests train twice)."""
    return corpora["shakespeare"][0][:150_000] + corpora["tang"][0][:60_000]


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def trained(request: pytest.FixtureRequest, training_text: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tokenizer = ByteBPE.train(training_text, VOCAB_SIZE, pattern=request.param, special_tokens=[SPECIAL])
    directory = tmp_path_factory.mktemp(f"bpe-{request.param}")
    return tokenizer, tokenizer.save(directory)


def as_tiktoken(tokenizer: ByteBPE) -> Any:
    require(HAS_TIKTOKEN, f"tiktoken is not installed {INSTALL}")
    import tiktoken

    return tiktoken.Encoding(
        name="transformer_lab_test",
        pat_str=tokenizer.pattern,
        mergeable_ranks={token: i for i, token in tokenizer.tokens.items()},  # rank = id: merge order
        special_tokens=dict(tokenizer.special_tokens),
    )


def hf_from_files(tokenizer: ByteBPE, paths: dict[str, Path]) -> tuple[Any, Any]:
    """Hugging Face tokenizers from our tokenizer.json, and from vocab.json + merges.txt with a pre-tokenizer."""
    require(HAS_TOKENIZERS, f"Hugging Face tokenizers is not installed {INSTALL}")
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from_json = Tokenizer.from_file(str(paths["tokenizer"]))
    from_gpt2_files = Tokenizer(models.BPE.from_file(str(paths["vocab"]), str(paths["merges"])))
    from_gpt2_files.pre_tokenizer = _hf_pre_tokenizer(tokenizer.pattern, pre_tokenizers, Regex)
    from_gpt2_files.decoder = decoders.ByteLevel()
    from_gpt2_files.add_special_tokens([AddedToken(SPECIAL, special=True, normalized=False)])
    return from_json, from_gpt2_files


def _hf_pre_tokenizer(pattern: str, pre_tokenizers: Any, Regex: Any) -> Any:  # noqa: N803 - the class
    if pattern == GPT2_SPLIT_PATTERN:  # ByteLevel's own regex is GPT-2's
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _assert_same_ids(texts: list[str], tokenizer: ByteBPE, paths: dict[str, Path]) -> None:
    encoding = as_tiktoken(tokenizer)
    from_json, from_gpt2_files = hf_from_files(tokenizer, paths)
    for text in texts:
        ours = tokenizer.encode(text, allowed_special="all")
        assert encoding.encode(text, allowed_special="all") == ours, text[:80]
        assert from_json.encode(text, add_special_tokens=False).ids == ours, text[:80]
        assert from_gpt2_files.encode(text, add_special_tokens=False).ids == ours, text[:80]
        assert tokenizer.decode(ours) == text


def test_every_validation_line_of_both_corpora(trained: Any, corpora: dict[str, tuple[str, str]]) -> None:
    tokenizer, paths = trained
    for name in ("shakespeare", "tang"):
        validation = corpora[name][1]
        lines = validation.splitlines(keepends=True)
        assert len(lines) > 1_000
        _assert_same_ids(lines, tokenizer, paths)
        _assert_same_ids([validation], tokenizer, paths)  # whole: whitespace across lines, 100k+ bytes


def test_made_up_edge_cases(trained: Any) -> None:
    tokenizer, paths = trained
    _assert_same_ids(EDGE_CASES, tokenizer, paths)
    from_json, _ = hf_from_files(tokenizer, paths)
    for text in EDGE_CASES:
        ids = tokenizer.encode(text, allowed_special="all")
        assert from_json.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_refused_alike(trained: Any) -> None:
    tokenizer, _ = trained
    encoding = as_tiktoken(tokenizer)
    text = f"user text with {SPECIAL} in it"
    with pytest.raises(ValueError, match="special token"):
        encoding.encode(text)  # tiktoken's default, which ours follows
    with pytest.raises(ValueError, match="special token"):
        tokenizer.encode(text)
    assert encoding.encode(text, disallowed_special=()) == tokenizer.encode(text, disallowed_special=())
    assert encoding.encode_ordinary(text) == tokenizer.encode_ordinary(text)


def test_hugging_face_trainer_learns_the_same_merges(trained: Any, training_text: str) -> None:
    """Same pre-tokenization, same counts, same tie rule (highest count, then the smallest pair of ids; HF's
    ids for the 256 bytes are GPT-2's order, as ours): the same merges, in the same order."""
    tokenizer, _ = trained
    require(HAS_TOKENIZERS, f"Hugging Face tokenizers is not installed {INSTALL}")
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = _hf_pre_tokenizer(tokenizer.pattern, pre_tokenizers, Regex)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, as ours
        show_progress=False,
    )
    hf.train_from_iterator([training_text], trainer)  # one item: the split sees the text as ours does
    hf_merges = [tuple(m) for m in json.loads(hf.to_str())["model"]["merges"]]
    ours = [(_to_unicode(tokenizer.token_bytes(a)), _to_unicode(tokenizer.token_bytes(b))) for a, b in tokenizer.merges]
    assert len(ours) == VOCAB_SIZE - 256 - 1
    assert hf_merges == ours
