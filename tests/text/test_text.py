"""Tests for dualjax.text.words: normalisation, word tokenizer, OOV hashing, save/load."""
import itertools
import json
import os
import subprocess
import sys

import conftest
import numpy as np
import pytest

from dualjax.text import words as text
from dualjax.text.words import WordTokenizer, build_word_tokenizer, normalize, words


@pytest.mark.parametrize("raw, expected", [
    ("Hello World", "hello world"),
    ("Café Über", "cafe uber"),
    ("naïve façade", "naive facade"),
    ("What's up?!", "what s up"),
    ("  many \t\n  spaces  ", "many spaces"),
    ("a-b_c.d,e", "a b c d e"),
    ("日本 tokyo", "日 本 tokyo"),  # a CJK ideograph is a word alone
    ("Straße", "strasse"),
    ("R2-D2 & C3PO", "r2 d2 c3po"),
    # Non-ASCII characters other than accents split words instead of vanishing inside them.
    ("CD33’s", "cd33 s"),
    ("motif‐bearing", "motif bearing"),
    ("x²y", "x2y"),  # NFKD: a superscript two is a two
    ("", ""),
    ("?!...", ""),
])
def test_normalize(raw, expected):
    assert normalize(raw) == expected


def test_ascii_normalize_and_has_word_equal_their_plain_definitions():
    """normalize's ASCII path (bytes.translate) equals the plain rule (every run of
    characters outside a-z0-9, after casefolding, is one space; stripped), and has_word
    says whether anything is left, on random ASCII strings with every control character."""
    import random
    import re
    rng = random.Random(0)
    plain = re.compile(r"[^a-z0-9]+")
    for _ in range(20000):
        s = "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(10)))
        expected = plain.sub(" ", s.casefold()).strip()
        assert normalize.__wrapped__(s) == expected, repr(s)
        assert text.has_word(s) == bool(expected), repr(s)
    for s in ("Café", "?!…", "🙂", "北"):  # non-ASCII: normalize decides
        assert text.has_word(s) == bool(normalize(s))


@pytest.mark.parametrize("raw, expected", [
    ("北京大学的图书馆 2024", "北 京 大 学 的 图 书 馆 2024"),                  # Chinese
    ("東京タワー", "東 京 タ ワ ー"),                                           # Japanese
    ("مرحبا بالعالم!", "مرحبا بالعالم"),                                       # Arabic
    ("مَرْحَبًا", "مرحبا"),                       # Arabic's optional vowel marks fold away
    ("Привет, Мир 3", "привет мир 3"),                                         # Cyrillic
    ("Ελληνικά: Αθήνα", "ελληνικα αθηνα"),              # Greek, its tonos folded as accents
    ("हिन्दी भाषा।", "हिन्दी भाषा"),      # Devanagari: the vowel signs stay in the word
    ("한국어 텍스트", "한국어 텍스트"),                       # Hangul, recomposed after NFKD
    ("Tokyo 🗼🙂 is fun 🎉", "tokyo is fun"),                                 # emoji
    ("🙂🎉?!", ""),
])
def test_every_script_keeps_its_letters_and_digits(raw, expected):
    assert normalize(raw) == expected


def test_the_ascii_form_is_the_one_tokenizers_were_saved_with_before(tmp_path):
    """A vocab.json without "normalizer" (every one written before it was recorded) keeps
    splitting texts as it was trained: non-ASCII letters are spaces."""
    assert normalize("Привет, Мир 3 Café", "ascii") == "3 cafe"
    assert normalize("日本 tokyo", "ascii") == "tokyo"
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"type": "word", "vocab": ["tokyo", "cafe"],
                                "num_oov_buckets": 2, "version": 1}))
    old = WordTokenizer.load(str(path))
    assert old.normalizer == "ascii"
    assert old.token_ids("日本 tokyo café") == [1, 2]
    new = WordTokenizer(vocab=("tokyo", "cafe"), num_oov_buckets=2)
    assert len(new.token_ids("日本 tokyo café")) == 4  # 日, 本 hash into buckets
    with pytest.raises(ValueError, match="unknown normalizer 'nfc'"):
        WordTokenizer(vocab=(), num_oov_buckets=1, normalizer="nfc")
    path.write_text(json.dumps({"type": "word", "vocab": [], "num_oov_buckets": 2,
                                "version": 1, "normalizer": "nfc"}))
    with pytest.raises(ValueError, match="old.json: unknown normalizer"):
        WordTokenizer.load(str(path))


def test_words():
    assert words("The cat's HAT.") == ["the", "cat", "s", "hat"]
    assert words(" !! ") == []


def test_vocab_order_ties_and_min_count():
    texts = ["b a c", "a b", "a d", "e"]  # a:3, b:2, c:1, d:1, e:1
    tok = build_word_tokenizer(texts, vocab_size=10, num_oov_buckets=2)
    assert tok.vocab == ("a", "b", "c", "d", "e")
    assert build_word_tokenizer(texts, vocab_size=3, num_oov_buckets=2).vocab == ("a", "b", "c")
    assert build_word_tokenizer(texts, vocab_size=10, num_oov_buckets=2,
                                min_count=2).vocab == ("a", "b")
    # counting happens on normalised words
    tok2 = build_word_tokenizer(["Zed zed ZED!", "Ünder under"], 10, 1)
    assert tok2.vocab == ("zed", "under")
    # input order does not matter
    assert build_word_tokenizer(texts[::-1], 10, 2).vocab == tok.vocab


def test_id_layout():
    tok = WordTokenizer(vocab=("a", "b", "c"), num_oov_buckets=4)
    assert tok.vocab_size == 1 + 3 + 4
    assert tok.token_ids("a b c") == [1, 2, 3]
    oov = tok.token_ids("x y z zebra quux unknown words here")
    assert all(4 <= i <= 7 for i in oov)
    assert len(set(oov)) > 1  # hashing spreads words over buckets
    assert tok.token_ids("zebra")[0] == tok.token_ids("ZEBRA!")[0]  # deterministic
    assert tok.token_ids("zebra a zebra") == [oov[3], 1, oov[3]]


def test_no_oov_buckets_uses_single_unk():
    tok = WordTokenizer(vocab=("a", "b"), num_oov_buckets=0)
    assert tok.vocab_size == 4
    assert tok.token_ids("a x b y") == [1, 3, 2, 3]


def test_invalid_construction():
    with pytest.raises(ValueError):
        WordTokenizer(vocab=("a", "a"), num_oov_buckets=1)
    with pytest.raises(ValueError):
        WordTokenizer(vocab=("a",), num_oov_buckets=-1)


_CHILD = """
import json, sys
from dualjax.text.words import WordTokenizer
tok = WordTokenizer(vocab=("a",), num_oov_buckets=1000)
print(json.dumps(tok.token_ids(sys.argv[1])))
"""


@pytest.mark.slow
def test_oov_bucket_stable_across_processes():
    text = "zebra quux xylophone flibbertigibbet a"
    repo_root = str(conftest.REPO)
    results = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed,
                   PYTHONPATH=repo_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", _CHILD, text], env=env,
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    local = WordTokenizer(vocab=("a",), num_oov_buckets=1000).token_ids(text)
    assert results[0] == results[1] == results[2] == local
    assert local[-1] == 1


def test_encode_padding_truncation_and_mask():
    tok = WordTokenizer(vocab=("a", "b", "c"), num_oov_buckets=2)
    ids, mask = tok.encode(["a b", "c a b a c", "", "!!"], max_len=4)
    assert ids.shape == mask.shape == (4, 4)
    assert ids.dtype == np.int32 and mask.dtype == np.bool_
    np.testing.assert_array_equal(ids, [[1, 2, 0, 0], [3, 1, 2, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, ids != 0)
    assert mask.sum(axis=1).tolist() == [2, 4, 0, 0]
    empty_ids, empty_mask = tok.encode([], max_len=3)
    assert empty_ids.shape == empty_mask.shape == (0, 3)
    with pytest.raises(ValueError):
        tok.encode(["a"], max_len=0)


def test_save_load_round_trip(tmp_path):
    texts = ["The quick brown fox", "jumps over the lazy dog", "the fox again", "Café"]
    tok = build_word_tokenizer(texts, vocab_size=5, num_oov_buckets=3)
    path = tmp_path / "tok.json"
    tok.save(path)
    payload = json.loads(path.read_text())
    assert payload == {"type": "word", "vocab": list(tok.vocab), "num_oov_buckets": 3,
                       "normalizer": "unicode", "version": 1}
    loaded = WordTokenizer.load(str(path))
    assert loaded == tok
    probe = texts + ["unseen words everywhere", ""]
    for a, b in zip(tok.encode(probe, 6), loaded.encode(probe, 6), strict=True):
        np.testing.assert_array_equal(a, b)


def test_load_missing_file_names_path(tmp_path):
    path = tmp_path / "does_not_exist.json"
    with pytest.raises(FileNotFoundError, match="does_not_exist.json"):
        WordTokenizer.load(path)


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps([1, 2]),
    json.dumps({"type": "bpe", "vocab": [], "num_oov_buckets": 1, "version": 1}),
    json.dumps({"type": "word", "vocab": ["a"], "version": 1}),
    json.dumps({"type": "word", "vocab": ["a", "a"], "num_oov_buckets": 1, "version": 1}),
])
def test_load_corrupt_file_names_path(tmp_path, content):
    path = tmp_path / "corrupt_tok.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="corrupt_tok.json"):
        WordTokenizer.load(path)


def _sentences(paragraph: str) -> list[str]:
    spans = text.sentence_spans(paragraph)
    # Spans are ordered, disjoint and cover every non-blank character.
    covered = "".join(paragraph[s:e] for s, e in spans)
    assert "".join(covered.split()) == "".join(paragraph.split())
    assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans))
    return [paragraph[s:e] for s, e in spans]


@pytest.mark.parametrize("paragraph, expected", [
    ("  First one.\nSecond one!  Third?  ", ["First one.", "Second one!", "Third?"]),
    ("Mr. Smith met Dr. Jones on St. Mark's Square. They talked.",
     ["Mr. Smith met Dr. Jones on St. Mark's Square.", "They talked."]),
    ("J. K. Rowling wrote it. It sold.", ["J. K. Rowling wrote it.", "It sold."]),
    ("The U.S. Army won. Some, e.g. Paris, fell. Others, i.e. Rome, held.",
     ["The U.S. Army won.", "Some, e.g. Paris, fell.", "Others, i.e. Rome, held."]),
    ("It grew 3.5 percent. 1990 was calm.", ["It grew 3.5 percent.", "1990 was calm."]),
    ("It was No. 5 on the chart. No. It was not.",
     ["It was No. 5 on the chart.", "No.", "It was not."]),
    ("Wait... What?! Yes.", ["Wait...", "What?!", "Yes."]),
    # Wikipedia markers and page references never stand alone.
    ("It grew.[citation needed] Then it fell. [3] [4]", ["It grew.", "[citation needed] Then "
                                                         "it fell. [3] [4]"]),
    ("Oxygen forms O\n2 gas. It is reactive.", ["Oxygen forms O\n2 gas.", "It is reactive."]),
    ("no terminal punctuation", ["no terminal punctuation"]),
    ("", []),
    (" \n ", []),
])
def test_sentence_spans(paragraph, expected):
    assert _sentences(paragraph) == expected


def test_sentence_spans_are_character_spans():
    assert text.sentence_spans(" Ab. Cd.") == [(1, 4), (5, 8)]


def test_a_side_tokenizes_each_distinct_text_once_with_the_same_rows():
    """A collection's documents come back with each of their queries (SQuAD's 42 k pairs
    hold 2 k paragraphs): `Side.encode` tokenizes each distinct text once and gives
    every row what tokenizing it alone gives, prompt and fields included."""
    from dualjax.text.sides import Side

    tok = build_word_tokenizer(["how do i fix my bike", "cook rice fast", "what is a bike"],
                               vocab_size=50, num_oov_buckets=4)
    seen = []

    class Counting:
        vocab_size = tok.vocab_size

        def encode(self, texts, max_len):
            seen.extend(texts)
            return tok.encode(texts, max_len)

    texts = ["how do i fix my bike", "cook rice fast", "how do i fix my bike", "",
             "cook rice fast", "what is a bike", "how do i fix my bike"]
    side = Side(Counting(), 6, prompt="q ")
    got = side.encode(texts)
    assert sorted(seen) == sorted({"q " + t for t in texts})  # each distinct text once
    for i, t in enumerate(texts):
        alone = Side(tok, 6, prompt="q ").encode([t])
        np.testing.assert_array_equal(got["ids"][i], alone["ids"][0])
        np.testing.assert_array_equal(got["mask"][i], alone["mask"][0])
