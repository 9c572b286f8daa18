"""Byte-level BPE from scratch: train, encode, decode, save in GPT-2's and Hugging Face's formats (chapter 12).

Byte-pair encoding (a compression method of Gage 1994, used to cut words into subwords by Sennrich et al. 2016;
byte-level as in GPT-2, Radford et al. 2019) starts from the 256 bytes, so every string has a tokenization and
there is no unknown token. Training repeats one step: find the pair of adjacent tokens that occurs most often in
the training text, and make it a new token. Encoding replays those merges, in the order they were learned, on each
piece of new text.

Three things everyone does and this module does too:

- **Split first.** A regular expression (the *split pattern*) cuts the text into chunks: words with their
  leading space, runs of digits, punctuation, whitespace. Merges never cross a chunk boundary, so " the" can
  become a token but "e." cannot. Training counts each distinct chunk once, with its number of occurrences.
  `GPT2_SPLIT_PATTERN` is GPT-2's; `GPT4_SPLIT_PATTERN` is GPT-4's (tiktoken's cl100k_base), which also splits
  digits into groups of at most three and keeps case-insensitive contractions together.
- **Byte ids in GPT-2's order.** Token ids 0 ... 255 are the single bytes in the order GPT-2's `vocab.json`,
  tiktoken and Hugging Face's trainer give them (`BYTE_ORDER`: "!" is 0, the printable bytes first). Merged
  tokens follow in the order training made them (id 256 + k for the k-th merge), then the special tokens.
- **Tie-breaking.** When several pairs share the highest count, training takes the pair of smallest
  (left id, right id), compared as a tuple. That is Hugging Face `tokenizers`' `BpeTrainer` rule, and since
  the ids agree, our trainer learns the same merges as theirs (tests/test_bpe_equal.py checks it).

Two trainers are here. `_train_direct` recounts every pair of the corpus before each merge: the algorithm as
it is usually stated, slow (the whole corpus per merge). `ByteBPE.train` keeps the pair counts between
merges and updates only the pairs next to each merged occurrence, with an index pair -> words that hold it
and a heap of counts: the same merges (tested), a few seconds instead of minutes.

Encoding replays merges by rank (lowest first), as GPT-2's `encoder.py` and Hugging Face do; tiktoken looks
up the rank of the merged bytes instead; on vocabularies trained this way both give the same ids (tested on
every line of both corpora's validation splits). Decoding joins the tokens' bytes and decodes them as UTF-8;
ids that cut a character in two decode to U+FFFD (errors="replace", the default) or raise (errors="strict").
"""

from __future__ import annotations

import heapq
import json
import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Literal

import regex

__all__ = [
    "ByteBPE",
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "SPLIT_PATTERNS",
    "BYTE_ORDER",
    "bytes_to_unicode",
]

#: GPT-2's split pattern (openai/gpt-2 encoder.py): contractions, optional space + letters, optional space +
#: digits, optional space + other symbols, whitespace not followed by a non-space, the rest of the whitespace.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: GPT-4's split pattern (tiktoken's cl100k_base): contractions in any case, one non-letter glued to the
#: letters after it, digits in groups of 1-3, symbols with the newlines after them, newlines on their own.
GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)

#: The split patterns by name: `ByteBPE.train(..., pattern="gpt4")`.
SPLIT_PATTERNS = {"gpt2": GPT2_SPLIT_PATTERN, "gpt4": GPT4_SPLIT_PATTERN}


#: The bytes GPT-2 writes as themselves: "!" ... "~", "¡" ... "¬", "®" ... "ÿ" (no space, controls, soft hyphen).
_PRINTABLE = (*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1))

#: BYTE_ORDER[i] is the byte whose token id is i (0 <= i < 256): GPT-2's order, the printable bytes first.
BYTE_ORDER: tuple[int, ...] = (*_PRINTABLE, *(b for b in range(256) if b not in _PRINTABLE))


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, used to write tokens in vocab.json and merges.txt.

    Printable bytes stand for themselves; the others (controls, space, soft hyphen ...) become the characters
    U+0100, U+0101, ... in byte order, so the space is "Ġ" and the newline "Ċ". No token string then contains
    a space, which merges.txt uses to separate the two halves of a merge.
    """
    others = [b for b in range(256) if b not in _PRINTABLE]
    return {**{b: chr(b) for b in _PRINTABLE}, **{b: chr(256 + n) for n, b in enumerate(others)}}


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _to_unicode(token: bytes) -> str:
    """A token's bytes written as GPT-2's printable characters (b" the" -> "Ġthe")."""
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def _from_unicode(text: str, what: str) -> bytes:
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in text)
    except KeyError:
        raise ValueError(f"{what}: {text!r} is not a byte-level token (GPT-2's bytes_to_unicode characters)") from None


ErrorsMode = Literal["replace", "strict", "ignore", "backslashreplace"]
_DECODE_ERRORS = ("replace", "strict", "ignore", "backslashreplace")


# ---------------------------------------------------------------------------------------------
# Training helpers, shared by both trainers
# ---------------------------------------------------------------------------------------------


def _resolve_pattern(pattern: str) -> tuple[str, regex.Pattern[str]]:
    """A pattern name ("gpt2", "gpt4") or a regular expression -> (its text, compiled)."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a name {sorted(SPLIT_PATTERNS)} or a regular expression, got {pattern!r}")
    text = SPLIT_PATTERNS.get(pattern, pattern)
    if not text:
        raise ValueError(f"pattern must be a name {sorted(SPLIT_PATTERNS)} or a non-empty regular expression")
    try:
        return text, regex.compile(text)
    except regex.error as error:
        raise ValueError(
            f"pattern {text!r} is not a valid regular expression (the `regex` module's): {error}"
        ) from None


def _check_special_names(special_tokens: object) -> list[str]:
    if special_tokens is None:
        return []
    if isinstance(special_tokens, str) or not isinstance(special_tokens, Iterable):
        raise TypeError(
            f"special_tokens must be a list of strings such as ['<|endoftext|>'], got {type(special_tokens).__name__}"
        )
    names = list(special_tokens)
    if any(not isinstance(s, str) or not s for s in names):
        raise ValueError(f"special_tokens must be non-empty strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"special_tokens must not repeat a token, got {names!r}")
    return names


def _special_splitter(names: Iterable[str]) -> regex.Pattern[str] | None:
    """A regex that finds any of `names`, the longest first (so "<|a|>b" is not cut by a shorter "<|a|>")."""
    names = sorted(names, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(s) for s in names)) if names else None


def _word_counts(text: str, compiled: regex.Pattern[str], special_tokens: Sequence[str]) -> Counter[str]:
    """Each distinct chunk of `text` (cut by the split pattern) and how often it occurs.

    Special tokens are cut out first and not counted: no merge may cross or include them.
    """
    splitter = _special_splitter(special_tokens)
    parts = splitter.split(text) if splitter else [text]
    counts: Counter[str] = Counter()
    for part in parts:
        counts.update(compiled.findall(part))
    return counts


_BYTE_TO_ID = {b: i for i, b in enumerate(BYTE_ORDER)}


def _words_as_ids(counts: Mapping[str, int]) -> tuple[list[list[int]], list[int]]:
    """Chunks -> lists of byte ids (in GPT-2's order), and their counts, in a fixed order (sorted chunks)."""
    words, freqs = [], []
    for chunk in sorted(counts):
        words.append([_BYTE_TO_ID[b] for b in chunk.encode("utf-8")])
        freqs.append(counts[chunk])
    return words, freqs


def _merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of `pair` in `word`, left to right ("aaa" with (a, a) -> [aa, a])."""
    left, right = pair
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == left and word[i + 1] == right:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


class _Vocab:
    """The growing vocabulary of a training run: id -> bytes, and bytes -> id for the merged tokens.

    A merge whose bytes are already a token (two different pairs spelling the same string) reuses that
    token's id and does not grow the vocabulary, as Hugging Face's trainer does.
    """

    def __init__(self) -> None:
        self.tokens: list[bytes] = [bytes([b]) for b in BYTE_ORDER]
        self.ids: dict[bytes, int] = {t: i for i, t in enumerate(self.tokens)}

    def add(self, left: int, right: int) -> int:
        token = self.tokens[left] + self.tokens[right]
        if token not in self.ids:
            self.ids[token] = len(self.tokens)
            self.tokens.append(token)
        return self.ids[token]


def _train_direct(
    words: list[list[int]], freqs: list[int], size: int
) -> tuple[list[tuple[int, int, int]], list[int], list[bytes]]:
    """The reference trainer: recount every pair of every word before each merge. Slow; for the tests.

    Args:
        words: chunks as byte ids; freqs: how often each occurs; size: stop when the vocabulary (specials
            excluded) has this many tokens, or when no pair is left.

    Returns:
        merges as (left, right, new id), the count of each merge when it was made, and the tokens' bytes.
    """
    vocab = _Vocab()
    merges, merge_counts = [], []
    words = [list(w) for w in words]
    while len(vocab.tokens) < size:
        stats: Counter[tuple[int, int]] = Counter()
        for word, freq in zip(words, freqs, strict=True):
            for pair in pairwise(word):
                stats[pair] += freq
        if not stats:
            break  # every chunk is a single token
        best = min(stats, key=lambda pair: (-stats[pair], pair))  # highest count, then the smallest pair
        new_id = vocab.add(*best)
        merges.append((*best, new_id))
        merge_counts.append(stats[best])
        words = [_merge_word(w, best, new_id) for w in words]
    return merges, merge_counts, vocab.tokens


def _train_incremental(
    words: list[list[int]], freqs: list[int], size: int
) -> tuple[list[tuple[int, int, int]], list[int], list[bytes]]:
    """The same merges as `_train_direct`, updating only the pair counts next to each merged occurrence.

    State kept between merges:
        counts: pair -> its number of occurrences (each word's adjacent pairs times the word's count);
        where:  pair -> the indices of the words that hold it (a superset: a word that lost the pair stays,
                and may be listed twice; visiting it again finds nothing to merge, so lists do, cheaper
                than sets);
        heap:   (-count, left, right) entries; the smallest is the highest count, then the smallest pair.
                An entry whose count is stale (the pair lost occurrences since) is pushed again with
                its current count when it comes to the top, so only current counts are ever merged.

    Merging (a, b) -> z at position i of a word, with x before it and y after, changes exactly:
        (x, a) -1, (x, z) +1, (a, b) -1, (b, y) -1, (z, y) +1.
    x is read from the merged word (it may be a z just made: "abab" -> z z), y from the old one.
    """
    vocab = _Vocab()
    words = [list(w) for w in words]
    counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
    for index, (word, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(word):
            counts[pair] += freq
            where[pair].append(index)
    heap = [(-count, *pair) for pair, count in counts.items()]
    heapq.heapify(heap)

    merges, merge_counts = [], []
    while len(vocab.tokens) < size and heap:
        negative, left, right = heapq.heappop(heap)
        pair = (left, right)
        count = counts.get(pair, 0)
        if -negative != count:  # stale: the pair lost occurrences after this entry was pushed
            if count > 0:
                heapq.heappush(heap, (-count, left, right))
            continue
        new_id = vocab.add(left, right)
        merges.append((left, right, new_id))
        merge_counts.append(count)

        grown: set[tuple[int, int]] = set()  # pairs that gained occurrences: they need a fresh heap entry
        for index in where.pop(pair):
            word, freq = words[index], freqs[index]
            out: list[int] = []
            i, n = 0, len(word)
            while True:
                try:
                    j = word.index(left, i)  # the next candidate, found in C: words are short, merges many
                except ValueError:
                    break
                if j + 1 == n or word[j + 1] != right:
                    out.extend(word[i : j + 1])
                    i = j + 1
                    continue
                out.extend(word[i:j])  # the tokens before the pair are unchanged
                counts[pair] -= freq
                if out:  # a token x before the pair: (x, a) -> (x, z)
                    before = out[-1]
                    counts[before, left] -= freq
                    counts[before, new_id] += freq
                    where[before, new_id].append(index)
                    grown.add((before, new_id))
                if j + 2 < n:  # a token y after the pair: (b, y) -> (z, y)
                    after = word[j + 2]
                    counts[right, after] -= freq
                    counts[new_id, after] += freq
                    where[new_id, after].append(index)
                    grown.add((new_id, after))
                out.append(new_id)
                i = j + 2
            out.extend(word[i:])
            words[index] = out
        for changed in grown:
            if counts[changed] > 0:
                heapq.heappush(heap, (-counts[changed], *changed))
        if counts.get(pair) == 0:
            del counts[pair]
    return merges, merge_counts, vocab.tokens


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------


class ByteBPE:
    """A byte-level BPE tokenizer: token ids <-> text, through the tokens' bytes (chapter 12).

    Build one with `ByteBPE.train(text, vocab_size)` or `ByteBPE.load(path)`; the constructor takes the
    pieces directly (what `load` and `from_dict` read).

    Args:
        tokens: id -> the token's bytes, for every ordinary (not special) id; all 256 single bytes included.
        merges: (left id, right id) in the order they were learned; each makes the token
            tokens[left] + tokens[right], which must be in `tokens`. Encoding applies them in this order.
        pattern: the split pattern: "gpt2", "gpt4" or a regular expression (the `regex` module's syntax).
        special_tokens: name -> id of each special token (e.g. {"<|endoftext|>": 4095}).

    The ordinary and special ids together must be exactly 0 ... vocab_size - 1.
    """

    #: The chunk cache: each tokenizer keeps a dict from every chunk of the split it has encoded to that chunk's
    #: ids, so a word met again costs one lookup instead of the merge loop. It is emptied when it holds this many
    #: chunks, which bounds its memory; a text with more distinct chunks (the Tang poems have 123,491) then encodes
    #: most of them again on a second pass.
    cache_limit: int = 100_000

    def __init__(
        self,
        tokens: Mapping[int, bytes],
        merges: Sequence[tuple[int, int]],
        pattern: str = "gpt2",
        special_tokens: Mapping[str, int] | None = None,
    ) -> None:
        self.pattern, self._compiled = _resolve_pattern(pattern)
        if not isinstance(tokens, Mapping):
            raise TypeError(f"tokens must be a dict id -> bytes, got {type(tokens).__name__}")
        special_tokens = dict(special_tokens or {})
        for name, i in special_tokens.items():
            if not isinstance(name, str) or not name or isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"special_tokens must map non-empty strings to int ids, got {name!r}: {i!r}")
        ids = sorted([*tokens, *special_tokens.values()])
        if ids != list(range(len(ids))):
            clash = sorted(set(tokens) & set(special_tokens.values()))
            raise ValueError(
                "the ids of tokens and special_tokens must be 0 ... vocab_size - 1, each once"
                + (f"; ids {clash[:5]} are both ordinary and special" if clash else f", got {ids[:3]} ... {ids[-3:]}")
            )
        self.tokens: dict[int, bytes] = {}
        self._ids: dict[bytes, int] = {}  # bytes -> id of the ordinary tokens
        for i, token in tokens.items():
            if isinstance(i, bool) or not isinstance(i, int) or not isinstance(token, bytes) or not token:
                raise TypeError(f"tokens must map int ids to non-empty bytes, got {i!r}: {token!r}")
            if token in self._ids:
                raise ValueError(f"tokens: ids {self._ids[token]} and {i} both spell {token!r}; each must be once")
            self.tokens[i] = token
            self._ids[token] = i
        missing = [b for b in range(256) if bytes([b]) not in self._ids]
        if missing:
            raise ValueError(f"tokens must hold all 256 single bytes (byte-level BPE), missing {missing[:8]}")
        self.special_tokens = special_tokens
        self._special_ids = {i: name for name, i in special_tokens.items()}

        # (left, right) -> (rank, new id); encoding merges the pair of lowest rank first
        self.merges: list[tuple[int, int]] = []
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(merges):
            if not (isinstance(merge, (tuple, list)) and len(merge) == 2 and all(m in self.tokens for m in merge)):
                raise ValueError(f"merges[{rank}] must be a pair of ordinary token ids, got {merge!r}")
            left, right = int(merge[0]), int(merge[1])
            joined = self.tokens[left] + self.tokens[right]
            if joined not in self._ids:
                raise ValueError(f"merges[{rank}] = ({left}, {right}) makes {joined!r}, which is not in tokens")
            if (left, right) in self._ranks:
                raise ValueError(f"merges[{rank}] = ({left}, {right}) repeats merge {self._ranks[left, right][0]}")
            self.merges.append((left, right))
            self._ranks[left, right] = (rank, self._ids[joined])
        self._byte_ids = [self._ids[bytes([b])] for b in range(256)]  # byte value -> its token id
        self._cache: dict[str, list[int]] = {}  # chunk -> ids; natural text repeats its words (see cache_limit)
        #: the count of each merge when training made it (None for a loaded tokenizer)
        self.merge_counts: list[int] | None = None

    # ----------------------------------------------------------------------------- training

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str = "gpt2",
        special_tokens: Sequence[str] | None = None,
    ) -> ByteBPE:
        """Learn vocab_size - 256 - len(special_tokens) merges from `text`.

        Args:
            text: the training text. Occurrences of the special tokens in it are cut out before counting.
            vocab_size: the size of the vocabulary: 256 bytes + merges + special tokens.
            pattern: "gpt2" (`GPT2_SPLIT_PATTERN`), "gpt4" (`GPT4_SPLIT_PATTERN`) or a regular expression.
            special_tokens: strings such as "<|endoftext|>", given the last ids, in this order.

        Returns:
            the tokenizer. If the text runs out of pairs first (every chunk already one token), it has fewer
            tokens than asked, and a warning says so. Ties are broken by the smallest (left id, right id).
        """
        text, names, size, compiled_pattern = cls._check_training(text, vocab_size, pattern, special_tokens)
        words, freqs = _words_as_ids(_word_counts(text, compiled_pattern[1], names))
        merges, merge_counts, tokens = _train_incremental(words, freqs, size)
        return cls._trained(merges, merge_counts, tokens, compiled_pattern[0], names, vocab_size)

    @classmethod
    def _train_direct(
        cls, text: str, vocab_size: int, pattern: str = "gpt2", special_tokens: Sequence[str] | None = None
    ) -> ByteBPE:
        """`train` with the reference trainer that recounts every pair before each merge (slow; for tests)."""
        text, names, size, compiled_pattern = cls._check_training(text, vocab_size, pattern, special_tokens)
        words, freqs = _words_as_ids(_word_counts(text, compiled_pattern[1], names))
        merges, merge_counts, tokens = _train_direct(words, freqs, size)
        return cls._trained(merges, merge_counts, tokens, compiled_pattern[0], names, vocab_size)

    @staticmethod
    def _check_training(
        text: object, vocab_size: object, pattern: object, special_tokens: object
    ) -> tuple[str, list[str], int, tuple[str, regex.Pattern[str]]]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str (the training text), got {type(text).__name__}")
        if not text:
            raise ValueError("text must not be empty: training counts the pairs of adjacent bytes in it")
        names = _check_special_names(special_tokens)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TypeError(f"vocab_size must be an int, got {vocab_size!r}")
        smallest = 256 + len(names)
        if vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be at least 256 (one token per byte) + {len(names)} special token(s) = "
                f"{smallest}, got {vocab_size}"
            )
        resolved = _resolve_pattern(pattern)  # type: ignore[arg-type]
        return text, names, vocab_size - len(names), resolved

    @classmethod
    def _trained(
        cls,
        merges: list[tuple[int, int, int]],
        merge_counts: list[int],
        tokens: list[bytes],
        pattern: str,
        names: list[str],
        vocab_size: int,
    ) -> ByteBPE:
        specials = {name: len(tokens) + k for k, name in enumerate(names)}
        tokenizer = cls(dict(enumerate(tokens)), [(a, b) for a, b, _ in merges], pattern, specials)
        tokenizer.merge_counts = merge_counts
        if tokenizer.vocab_size < vocab_size:
            warnings.warn(
                f"the text ran out of pairs to merge: the vocabulary has {tokenizer.vocab_size} tokens, "
                f"not the {vocab_size} asked for (every chunk of the text is now a single token)",
                stacklevel=3,
            )
        return tokenizer

    # ----------------------------------------------------------------------------- encoding

    @property
    def vocab_size(self) -> int:
        """Number of ids: 256 bytes + merged tokens + special tokens."""
        return len(self.tokens) + len(self.special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def _encode_chunk(self, chunk: str) -> list[int]:
        """One chunk of the split -> ids: its bytes, then the lowest-ranked merge present, again and again."""
        cached = self._cache.get(chunk)
        if cached is not None:
            return cached
        ids = [self._byte_ids[b] for b in chunk.encode("utf-8")]
        ranks = self._ranks
        while len(ids) >= 2:
            best = None  # (rank, new id) of the lowest-ranked merge among the adjacent pairs
            for pair in pairwise(ids):
                found = ranks.get(pair)
                if found is not None and (best is None or found < best):
                    best, best_pair = found, pair
            if best is None:
                break
            ids = _merge_word(ids, best_pair, best[1])
        if len(self._cache) >= self.cache_limit:  # bound the memory a long stream of new words can take
            self._cache.clear()
        self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids, treating special-token strings as ordinary text (tiktoken's `encode_ordinary`)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        try:
            for chunk in self._compiled.findall(text):
                ids.extend(self._encode_chunk(chunk))
        except UnicodeEncodeError as error:  # a lone surrogate ("\ud800"): a str that UTF-8 cannot encode
            bad = error.object[error.start : error.end]
            raise ValueError(
                f"text contains {bad!r}, a lone surrogate that UTF-8 cannot encode (half of a UTF-16 pair, e.g. "
                "from a file read with errors='surrogateescape'); a byte-level tokenizer needs UTF-8 text"
            ) from None
        return ids

    def encode(
        self,
        text: str,
        allowed_special: Literal["all"] | Collection[str] = (),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        """Text -> token ids, with tiktoken's rules for special tokens.

        Special tokens are strings such as "<|endoftext|>". Text from a user may contain one by chance or on
        purpose, and a model reading the special id would take it for a real document boundary; so by default
        a special token's string in `text` is an error, and you say what to do with it:

        - `allowed_special`: the specials encoded as their single id ("all", or a set of names);
        - `disallowed_special`: the specials whose presence raises ValueError ("all": every special not
          allowed; or a set of names). A special in neither set is encoded as ordinary text.

        Args:
            text: any str (every str that UTF-8 can encode: lone surrogates cannot be).
            allowed_special, disallowed_special: names from `special_tokens`, or "all"; an unknown name is an
                error.

        Returns:
            the ids, a list of ints; `decode(encode(text)) == text`.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        allowed = self._special_set("allowed_special", allowed_special)
        disallowed = (
            set(self.special_tokens) - allowed
            if disallowed_special == "all"
            else self._special_set("disallowed_special", disallowed_special)
        )
        if disallowed:
            found = _special_splitter(disallowed).search(text)  # type: ignore[union-attr]
            if found:
                raise ValueError(
                    f"text contains the special token {found.group()!r}, which encode does not allow by default; "
                    f"pass allowed_special={{{found.group()!r}}} (or 'all') to encode it as its id, or "
                    "disallowed_special=() to encode it as ordinary text"
                )
        splitter = _special_splitter(allowed)
        if splitter is None:
            return self.encode_ordinary(text)
        ids: list[int] = []
        start = 0
        for match in splitter.finditer(text):
            ids.extend(self.encode_ordinary(text[start : match.start()]))
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        ids.extend(self.encode_ordinary(text[start:]))
        return ids

    def _special_set(self, name: str, value: object) -> set[str]:
        if value == "all":
            return set(self.special_tokens)
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise TypeError(f"{name} must be 'all' or a set of special-token strings, got {value!r}")
        chosen = set(value)
        unknown = sorted(str(s) for s in chosen - set(self.special_tokens))
        if unknown:
            known = sorted(self.special_tokens) or "none"
            raise ValueError(f"{name}: {unknown} are not special tokens of this tokenizer (it has: {known})")
        return chosen

    # ----------------------------------------------------------------------------- decoding

    def _id_list(self, ids: object) -> list[int]:
        if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):  # a torch tensor or numpy array
            shape = getattr(ids, "shape", ())
            if len(shape) != 1:
                raise ValueError(f"ids must be 1-D (one sequence), got shape {tuple(shape)}")
            ids = ids.tolist()  # type: ignore[union-attr]
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"ids must be a list of ints (or a 1-D integer tensor), got {type(ids).__name__}")
        out = []
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"ids must hold int token ids, got {i!r}")
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"ids: token id {i} is outside the vocabulary [0, {self.vocab_size})")
            out.append(i)
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Token ids -> the bytes they stand for (a special token -> its string's UTF-8 bytes)."""
        return b"".join(self._token_bytes(i) for i in self._id_list(ids))

    def _token_bytes(self, i: int) -> bytes:
        token = self.tokens.get(i)
        return token if token is not None else self._special_ids[i].encode("utf-8")

    def decode(self, ids: Iterable[int], errors: ErrorsMode = "replace") -> str:
        """Token ids -> text.

        A token is bytes, not characters: "我" is the three bytes e6 88 91, and a vocabulary may hold a token
        of the first two. Ids that end (or start) inside a character cannot be decoded to it; with
        errors="replace" (the default, as tiktoken) each broken piece becomes U+FFFD "�", with "strict" a
        UnicodeDecodeError is raised, "ignore" drops it, "backslashreplace" shows it as "\\xe6\\x88".

        Args:
            ids: a list of ints or a 1-D integer tensor, each in [0, vocab_size).
            errors: "replace", "strict", "ignore" or "backslashreplace" (Python's `bytes.decode` modes).
        """
        if errors not in _DECODE_ERRORS:
            raise ValueError(f"errors must be one of {_DECODE_ERRORS}, got {errors!r}")
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token."""
        return self._token_bytes(self._id_list([token_id])[0])

    def labels(self, ids: Iterable[int]) -> list[str]:
        """One readable label per id (for plots): its text, spaces as "␣", newlines as "↵", broken bytes as hex."""
        out = []
        for i in self._id_list(ids):
            token = self._token_bytes(i)
            try:
                out.append(token.decode("utf-8").replace(" ", "␣").replace("\n", "↵"))
            except UnicodeDecodeError:
                out.append("<" + token.hex(" ") + ">")
        return out

    def __repr__(self) -> str:
        name = next((k for k, v in SPLIT_PATTERNS.items() if v == self.pattern), "custom")
        return (
            f"ByteBPE(vocab_size={self.vocab_size}, merges={len(self.merges)}, pattern={name!r}, "
            f"special_tokens={sorted(self.special_tokens)})"
        )

    # ----------------------------------------------------------------------------- plain data and files

    def to_dict(self) -> dict[str, object]:
        """Plain data (str, int, lists, dicts) for a checkpoint, readable with `torch.load(weights_only=True)`.

        {"pattern": str, "byte_ids": [id of byte 0, ..., id of byte 255], "merges": [[left, right, new id], ...],
        "special_tokens": {name: id}}. Every ordinary token is a byte or made by a merge, so this is all of it.
        """
        return {
            "pattern": self.pattern,
            "byte_ids": list(self._byte_ids),
            "merges": [[left, right, self._ranks[left, right][1]] for left, right in self.merges],
            "special_tokens": dict(self.special_tokens),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ByteBPE:
        """The tokenizer `to_dict` described."""
        try:
            byte_ids = list(data["byte_ids"])  # type: ignore[call-overload]
            merges = [tuple(m) for m in data["merges"]]  # type: ignore[union-attr]
            pattern, specials = data["pattern"], data["special_tokens"]
            if len(byte_ids) != 256 or any(len(m) != 3 for m in merges):
                raise ValueError
            tokens = {int(i): bytes([b]) for b, i in enumerate(byte_ids)}
            for left, right, new_id in merges:
                tokens.setdefault(int(new_id), tokens[left] + tokens[right])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                "data must be a ByteBPE's to_dict(): keys pattern, byte_ids (256 ids), merges ([left, right, id] "
                f"each), special_tokens; got {str(data)[:80]}"
            ) from None
        return cls(tokens, [(a, b) for a, b, _ in merges], pattern, specials)  # type: ignore[arg-type]

    def save(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Write the tokenizer to `directory` (made if missing) in the two standard formats.

        - vocab.json + merges.txt: GPT-2's files (tokens written with `bytes_to_unicode`; merges.txt one merge a
          line, "#version: 0.2" first), read by Hugging Face's `BPE.from_file`, GPT-2's encoder.py and most
          tools. They do not hold the split pattern; special tokens sit in vocab.json as themselves.
        - tokenizer.json: Hugging Face `tokenizers`' file (`Tokenizer.from_file`), with the split pattern and the
          special tokens.

        Returns:
            {"vocab": path, "merges": path, "tokenizer": path}.
        """
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"directory {str(directory)!r} is a file; save writes three files into a directory")
        directory.mkdir(parents=True, exist_ok=True)
        vocab = self._unicode_vocab()
        merges = [[_to_unicode(self.tokens[a]), _to_unicode(self.tokens[b])] for a, b in self.merges]
        paths = {k: directory / f for k, f in (("vocab", "vocab.json"), ("merges", "merges.txt"))}
        paths["tokenizer"] = directory / "tokenizer.json"
        paths["vocab"].write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        paths["merges"].write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
        paths["tokenizer"].write_text(json.dumps(self._hf_json(vocab, merges), ensure_ascii=False), encoding="utf-8")
        return paths

    def _unicode_vocab(self) -> dict[str, int]:
        vocab = {_to_unicode(t): i for i, t in self.tokens.items()}
        vocab.update(self.special_tokens)
        return dict(sorted(vocab.items(), key=lambda item: item[1]))

    def _hf_json(self, vocab: dict[str, int], merges: list[list[str]]) -> dict[str, object]:
        """Hugging Face's tokenizer.json: a BPE model, the split as a pre-tokenizer, byte-level decoding."""
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
        if self.pattern == GPT2_SPLIT_PATTERN:  # HF's ByteLevel splits with GPT-2's pattern itself
            pre_tokenizer: dict[str, object] = {**byte_level, "use_regex": True}
        else:
            split = {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False}
            pre_tokenizer = {"type": "Sequence", "pretokenizers": [split, byte_level]}
        added = [
            {"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
            for name, i in sorted(self.special_tokens.items(), key=lambda item: item[1])
        ]  # fmt: skip
        model = {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges,
        }  # fmt: skip
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": model,
        }  # fmt: skip

    @classmethod
    def load(cls, path: str | os.PathLike[str], pattern: str | None = None) -> ByteBPE:
        """Read a tokenizer that `save` (or GPT-2, or Hugging Face) wrote.

        Args:
            path: a tokenizer.json file; or a directory holding tokenizer.json; or a directory holding
                vocab.json + merges.txt (tokenizer.json is preferred when both are there).
            pattern: the split pattern for vocab.json + merges.txt, which do not record it (default "gpt2");
                for a tokenizer.json, None reads it from the file and a value must agree with it.

        In vocab.json + merges.txt, a vocabulary entry that is neither a single byte nor made by a merge is a
        special token (GPT-2's "<|endoftext|>" is one).
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a file or directory path, got {type(path).__name__}")
        path = Path(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        if path.is_file():
            return cls._load_hf_json(path, pattern)
        if path.is_dir() and (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            vocab = _read_json(path / "vocab.json")
            merges_text = (path / "merges.txt").read_text(encoding="utf-8")
            lines = [line for line in merges_text.splitlines() if line and not line.startswith("#version")]
            merges = [line.split(" ") for line in lines]
            return cls._from_unicode_vocab(vocab, merges, pattern or "gpt2", set(), str(path / "vocab.json"))
        raise FileNotFoundError(
            f"path {str(path)!r} is neither a tokenizer.json file nor a directory holding tokenizer.json or "
            "vocab.json + merges.txt (what ByteBPE.save writes)"
        )

    @classmethod
    def _load_hf_json(cls, path: Path, pattern: str | None) -> ByteBPE:
        data = _read_json(path)
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, dict) or model.get("type") != "BPE" or "vocab" not in model or "merges" not in model:
            raise ValueError(f"{path} is not a Hugging Face tokenizer.json of a BPE model (its model.type is not BPE)")
        found = _pattern_of(data.get("pre_tokenizer"), path)
        if pattern is not None and _resolve_pattern(pattern)[0] != found:
            raise ValueError(f"pattern {pattern!r} differs from the split pattern recorded in {path}: {found!r}")
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        added = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
        return cls._from_unicode_vocab(model["vocab"], merges, found, added, str(path))

    @classmethod
    def _from_unicode_vocab(
        cls, vocab: object, merges: list[object], pattern: str, added: set[str], where: str
    ) -> ByteBPE:
        if not isinstance(vocab, dict) or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) for k, v in vocab.items()
        ):
            raise ValueError(f"{where}: the vocabulary must map token strings to int ids")
        if any(not (isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m)) for m in merges):
            bad = next(m for m in merges if not (isinstance(m, list) and len(m) == 2))
            raise ValueError(f"{where}: every merge must be two token strings, got {bad!r}")
        ordinary: dict[int, bytes] = {}
        ids_of: dict[bytes, int] = {}

        def ordinary_id(text: str) -> int:
            token = _from_unicode(text, where)
            if token not in ids_of:
                if text not in vocab:
                    raise ValueError(f"{where}: token {text!r} (used by a merge) is not in the vocabulary")
                ids_of[token] = vocab[text]
                ordinary[vocab[text]] = token
            return ids_of[token]

        for b in range(256):
            ordinary_id(_BYTE_TO_CHAR[b])
        pairs = []
        for left, right in merges:  # type: ignore[misc]
            pairs.append((ordinary_id(left), ordinary_id(right)))
            ordinary_id(left + right)
        specials = {text: i for text, i in vocab.items() if i not in ordinary}
        unexpected = sorted(set(specials) - added) if added else []
        if unexpected:
            raise ValueError(f"{where}: vocabulary entries {unexpected[:5]} are neither bytes, merges nor added tokens")
        return cls(ordinary, pairs, pattern, specials)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file that ByteBPE.save writes: {error}") from None


def _pattern_of(pre_tokenizer: object, path: Path) -> str:
    """The split pattern of a Hugging Face pre-tokenizer: ByteLevel(use_regex) or Sequence[Split, ByteLevel]."""
    if isinstance(pre_tokenizer, dict):
        if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True):
            if pre_tokenizer.get("add_prefix_space"):
                raise ValueError(f"{path}: add_prefix_space=True is not supported (it changes the text)")
            return GPT2_SPLIT_PATTERN
        steps = pre_tokenizer.get("pretokenizers")
        if pre_tokenizer.get("type") == "Sequence" and isinstance(steps, list) and len(steps) == 2:
            split, byte_level = steps
            if (
                isinstance(split, dict)
                and split.get("type") == "Split"
                and split.get("behavior") == "Isolated"
                and not split.get("invert")
                and isinstance(split.get("pattern"), dict)
                and isinstance(split["pattern"].get("Regex"), str)
                and isinstance(byte_level, dict)
                and byte_level.get("type") == "ByteLevel"
                and not byte_level.get("use_regex", True)
                and not byte_level.get("add_prefix_space")
            ):
                return split["pattern"]["Regex"]
    raise ValueError(
        f"{path}: its pre_tokenizer is not byte-level BPE's (ByteLevel with use_regex, or Split(Regex, Isolated) "
        f"then ByteLevel without), got {str(pre_tokenizer)[:120]}"
    )
