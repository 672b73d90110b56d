"""Tokenizing only the head of a long text: what a tower reads of it.

A tower reads a text's first max_len tokens, but a tokenizer reads all of it and cuts
afterwards (sentence-transformers too): a 3,000-character paragraph costs its whole
length for 128 tokens. `head` cuts a text to its first `limit` characters or a little
more, just before an ASCII space that follows a letter or digit. For a tokenizer that
never joins what lies on the two sides of such a space into one token (`cuts_exactly`),
the head's tokens are the first tokens of the whole text. So when the head gives at
least the tokens kept, its truncated ids are the whole text's to the last id; a head
that gives fewer (long words, URLs) is tokenized again whole (`hf.HFTokenizer.encode`).

`cuts_exactly` reads the tokenizer's JSON and says yes only for pieces whose behaviour
at a space is known:
- normalizers that work a character at a time (BERT's, lowercasing, Unicode forms,
  accents, strip, prepend, and a replacement of one character);
- a pre-tokenizer that splits at whitespace (BERT's, Whitespace, WhitespaceSplit,
  Metaspace with split, ByteLevel with its regex), with only pieces that split further
  beside it (Punctuation, Digits);
- or none, for a BPE model none of whose merges joins a piece ending in a letter with
  one starting at the space's mark (sentencepiece's BPE as Llama and WordLlama ship it:
  the normalizer writes a space as "▁"), with that mark in its vocabulary and no
  end-of-word suffix, subword prefix or `ignore_merges`;
- no added token holding a space, no BPE dropout.
Anything else is tokenized whole, as before.
"""

from __future__ import annotations

import re
from typing import Any

CHARS_PER_TOKEN = 6  # a head is at least this many characters per token kept

_CUT = re.compile(r"[^\W_] ")  # a letter or digit, then an ASCII space
_PER_CHARACTER = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD",
                  "StripAccents", "Strip", "Prepend"}
_SPLITS_AT_SPACES = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_SPLITS_FURTHER = {"Punctuation", "Digits"}


def head(text: str, limit: int) -> str:
    """`text` itself when it is at most `limit` characters long or has no cut after
    them; else its start up to the first letter or digit followed by a space at or
    after character `limit`."""
    if len(text) <= limit:
        return text
    at = _CUT.search(text, limit - 1)
    return text if at is None else text[:at.start() + 1]


def _flat(piece: dict | None) -> list[dict]:
    if piece is None:
        return []
    if piece.get("type") == "Sequence":
        inner = piece.get("normalizers", piece.get("pretokenizers", []))
        return [p for q in inner for p in _flat(q)]
    return [piece]


def _space_mark(normalizers: list[dict]) -> str | None:
    """What a space is after the normalizers (None: one of them is not known to work a
    character at a time)."""
    mark = " "
    for n in normalizers:
        kind = n.get("type")
        if kind == "Replace":
            pattern = n.get("pattern", {}).get("String")
            if not isinstance(pattern, str) or len(pattern) != 1:
                return None
            if pattern == mark:
                mark = n.get("content", "")
        elif kind not in _PER_CHARACTER:
            return None
    return mark if len(mark) == 1 else None


def cuts_exactly(spec: dict[str, Any]) -> bool:
    """Whether every `head` of a text gives that text's first tokens (see the module)."""
    mark = _space_mark(_flat(spec.get("normalizer")))
    model = spec.get("model", {})
    if mark is None or model.get("dropout"):
        return False
    if any(" " in t.get("content", "") for t in spec.get("added_tokens", [])):
        return False
    pre = _flat(spec.get("pre_tokenizer"))
    if pre:
        def splits(p: dict) -> bool:
            return (p.get("type") in _SPLITS_AT_SPACES
                    or p.get("type") == "Metaspace" and p.get("split", True)
                    or p.get("type") == "ByteLevel" and p.get("use_regex", True))
        return any(splits(p) for p in pre) and all(
            splits(p) or p.get("type") in _SPLITS_FURTHER for p in pre)
    # one "word", the whole text: its end must not mark its last piece, a merge must
    # not jump over a whole-text lookup, and the space's mark must be a piece of its own
    if (model.get("type") != "BPE" or model.get("ignore_merges")
            or model.get("end_of_word_suffix") or model.get("continuing_subword_prefix")
            or mark not in model.get("vocab", {})):
        return False
    for merge in model.get("merges", []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if right.startswith(mark) and not left.endswith(mark):
            return False
    return True
