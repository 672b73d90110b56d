"""Tokenizing a long text's head alone (`text/heads.py`): the same ids as the whole text,
for the tokenizers whose pieces never join across a space, and the whole text for the
others and for heads that give too few tokens."""

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers

from dualjax.text import heads
from dualjax.text.hf import HFTokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "pretrained"
WORDS = ("retrieval", "naïve", "café", "Zürich's", "8001", "北京", "🙂", "—", "x-ray",
         "http://a.b/c", "e.g.", "tab\tbed", "new\nline", "two  spaces")


def long_texts(n: int = 40, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(50, 900)))) for _ in range(n)]
    return texts + [
        "a" * 3000 + " b c d" * 300,  # the head is one long word: too few tokens, whole
        "word " * 2000, "x  " * 900 + "end", "日本語のテキスト " * 300, ""]


def sentencepiece_bpe(extra_merges: tuple[tuple[str, str], ...] = ()) -> dict:
    """A BPE without a pre-tokenizer whose normalizer writes a space as "▁", its merges
    learned word by word (as Llama's and WordLlama's files are: sentencepiece's BPE
    trained within words, converted with no pre-tokenizer)."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"])
    tok.train_from_iterator(long_texts(20, seed=1), trainer)
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = None
    for left, right in extra_merges:
        spec["model"]["vocab"].setdefault(left + right, len(spec["model"]["vocab"]))
        spec["model"]["merges"].insert(0, [left, right])
    return spec


def encode_both(tok: HFTokenizer, texts: list[str], max_len: int):
    with_heads = tok.encode(texts, max_len)
    tok._heads = False
    try:
        return with_heads, tok.encode(texts, max_len)
    finally:
        tok._heads = heads.cuts_exactly(tok.spec)


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_qwen2"])
def test_a_heads_ids_are_the_whole_texts_ids(name):
    """BERT's WordPiece (whitespace and punctuation split) and a byte-level BPE: each
    length's ids and masks equal the whole texts', the specials at the cut included."""
    tok = HFTokenizer.from_file(FIXTURES / name / "tokenizer.json")
    assert tok._heads
    texts = long_texts()
    for max_len in (4, 16, 128, 512):
        (ids, mask), (want_ids, want_mask) = encode_both(tok, texts, max_len)
        np.testing.assert_array_equal(ids, want_ids, err_msg=f"max_len {max_len}")
        np.testing.assert_array_equal(mask, want_mask)


def test_a_sentencepiece_bpe_is_cut_unless_a_merge_joins_across_a_space():
    tok = HFTokenizer(sentencepiece_bpe(), lowercase=True, add_special_tokens=False)
    assert tok._heads
    texts = long_texts()
    for max_len in (8, 64, 256):
        (ids, _), (want, _) = encode_both(tok, texts, max_len)
        np.testing.assert_array_equal(ids, want)
    joining = sentencepiece_bpe(extra_merges=(("d", "▁"),))  # "…d" + "▁…": across
    assert not heads.cuts_exactly(joining)
    spec = sentencepiece_bpe()
    for key, value in (("end_of_word_suffix", "</w>"), ("ignore_merges", True),
                       ("dropout", 0.1)):  # the whole text is one "word" to it
        assert not heads.cuts_exactly({**spec, "model": {**spec["model"], key: value}})


def test_a_head_with_too_few_tokens_is_tokenized_whole(monkeypatch):
    tok = HFTokenizer.from_file(FIXTURES / "tiny_bert" / "tokenizer.json")
    text = "a" * 3000 + " b c d" * 300  # head: one word, [UNK]: the rest is needed
    assert len(heads.head(text, 16 * heads.CHARS_PER_TOKEN)) == 3000
    ids, mask = tok.encode([text], 16)
    assert mask.sum() == 16
    monkeypatch.setattr(tok, "_heads", False)
    np.testing.assert_array_equal(tok.encode([text], 16)[0], ids)


@pytest.mark.parametrize("change", [
    {"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\S+"}, "behavior": "Isolated",
                       "invert": False}},
    {"normalizer": {"type": "Replace", "pattern": {"String": "  "}, "content": " "}},
    {"normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}},
    {"added_tokens": [{"id": 0, "content": "new york", "single_word": False, "lstrip": False,
                       "rstrip": False, "normalized": True, "special": False}]},
    {"pre_tokenizer": None},  # WordPiece with nothing splitting its words
])
def test_pieces_whose_behaviour_at_a_space_is_unknown_are_tokenized_whole(change):
    spec = json.loads((FIXTURES / "tiny_bert" / "tokenizer.json").read_text())
    assert heads.cuts_exactly(spec)
    assert not heads.cuts_exactly({**spec, **change})


def test_a_head_ends_at_a_letter_or_digit_before_a_space():
    assert heads.head("short text", 100) == "short text"
    assert heads.head("abc def  ghi jkl", 5) == "abc def"
    assert heads.head("abc , ; def ghi", 4) == "abc , ; def"
    assert heads.head("abcdefghij", 3) == "abcdefghij"  # no cut after the limit


def test_only_a_tokenizer_that_reads_whole_texts_warns_of_very_long_ones(caplog,
                                                                         monkeypatch):
    from dualjax.text import sides
    spec = json.loads((FIXTURES / "tiny_bert" / "tokenizer.json").read_text())
    whole = {**spec, "pre_tokenizer": None}
    for tokenizer_spec, warns in ((spec, False), (whole, True)):
        monkeypatch.setattr(sides, "_warned_long", [False])
        caplog.clear()
        sides.Side(HFTokenizer(tokenizer_spec), 8).encode(["word " * 1000])
        assert ("only its first 8 tokens are read" in caplog.text) == warns
