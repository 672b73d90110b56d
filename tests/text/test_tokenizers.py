"""Tests for dualjax.text.tokenizers: trigram/bigram/word+trigram/sentencepiece tokenizers,
their id layouts, cross-process hashing, save/load and build determinism."""
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import zlib

import conftest
import numpy as np
import pytest

from dualjax.text import tokenizers
from dualjax.text.tokenizers import (
    BigramTokenizer,
    CharTrigramTokenizer,
    WordTrigramTokenizer,
    build_sentencepiece,
    build_tokenizer,
    char_trigrams,
    load_tokenizer,
    word_bigrams,
)
from dualjax.text.words import WordTokenizer, build_word_tokenizer

KINDS = tokenizers.TOKENIZERS
REPO_ROOT = str(conftest.REPO)


def _corpus(n: int = 300, seed: int = 0) -> list[str]:
    """Deterministic short texts over a small Zipf-ish vocabulary, with punctuation."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 8)))
             for _ in range(150)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(1, 10))).capitalize() + "?"
            for _ in range(n)]


CORPUS = _corpus()
BUILD_ARGS = dict(vocab_size=60, num_oov_buckets=7, trigram_vocab_size=40)


def _build(kind: str, texts=CORPUS):
    return build_tokenizer(kind, texts, **BUILD_ARGS)


@pytest.fixture(scope="module")
def built():
    """One tokenizer of each kind built from CORPUS (sentencepiece trains once)."""
    return {kind: _build(kind) for kind in KINDS}


def _bucket(key: str, first: int, m: int) -> int:
    return first + zlib.crc32(key.encode("utf-8")) % m


# ----------------------------------------------------------------------------- token lists
def test_silver_fork_trigrams_include_the_space_spanning_ones():
    expected = ["sil", "ilv", "lve", "ver", "er ", "r f", " fo", "for", "ork"]
    assert char_trigrams("silver fork") == expected
    assert char_trigrams("  Silver-FORK!! ") == expected  # normalised first


@pytest.mark.parametrize("text, expected", [
    ("abc", ["abc"]), ("ab", ["ab"]), ("A", ["a"]), ("a b", ["a b"]), ("", []), ("?!", []),
    ("abcd", ["abc", "bcd"]),
])
def test_trigram_edge_cases(text, expected):
    assert char_trigrams(text) == expected


def test_word_bigrams():
    assert word_bigrams("New York city!") == ["new", "york", "city", "new york", "york city"]
    assert word_bigrams("one") == ["one"]
    assert word_bigrams(" .. ") == []


# ----------------------------------------------------------------------------- id layouts
def test_char_trigram_ids_follow_word_layout():
    tok = CharTrigramTokenizer(vocab=("sil", "ilv"), num_oov_buckets=4)
    assert isinstance(tok, WordTokenizer)
    assert tok.vocab_size == 1 + 2 + 4
    assert tok.token_ids("Silver") == [1, 2, _bucket("lve", 3, 4), _bucket("ver", 3, 4)]
    unk = CharTrigramTokenizer(vocab=("sil",), num_oov_buckets=0)
    assert unk.vocab_size == 3 and unk.token_ids("silver") == [1, 2, 2, 2]


def test_word_trigram_layout_and_prefixed_hashing():
    tok = WordTrigramTokenizer.from_vocabs(("silver", "fork"), ("sil", "for"), num_oov_buckets=5)
    assert tok.vocab_size == 1 + 2 + 2 + 5
    assert tok.word_vocab == ("silver", "fork") and tok.trigram_vocab == ("sil", "for")
    assert tok.vocab == ("w:silver", "w:fork", "t:sil", "t:for")

    def b(key):
        return _bucket(key, 5, 5)
    # words first, then the trigrams of the whole string
    assert tok.token_ids("Silver fork") == [1, 2, 3, b("t:ilv"), b("t:lve"), b("t:ver"),
                                            b("t:er "), b("t:r f"), b("t: fo"), 4, b("t:ork")]
    # the word "for" is unknown even though the trigram "for" is known
    assert tok.token_ids("for") == [b("w:for"), 4]
    # an unknown word and the same unknown trigram hash different keys
    wide = WordTrigramTokenizer.from_vocabs((), (), num_oov_buckets=1000)
    word_id, trigram_id = wide.token_ids("xyz")
    assert word_id == _bucket("w:xyz", 1, 1000) and trigram_id == _bucket("t:xyz", 1, 1000)
    assert word_id != trigram_id
    with pytest.raises(ValueError):
        WordTrigramTokenizer(vocab=("t:abc", "w:abc"), num_oov_buckets=1, num_words=1)


def test_word_trigram_budgets():
    tok = _build("word+char_trigram")
    assert len(tok.word_vocab) == 60 and len(tok.trigram_vocab) == 40
    assert tok.vocab_size == 1 + 60 + 40 + 7
    # same ranking as the word and trigram tokenizers with those budgets
    assert tok.word_vocab == build_word_tokenizer(CORPUS, 60, 7).vocab
    assert tok.trigram_vocab == _build("char_trigram").vocab


def test_trigram_vocab_is_most_frequent_trigrams():
    tok = build_tokenizer("char_trigram", ["aaaa", "abc", "Abc!", "xyz"], vocab_size=99,
                          num_oov_buckets=3, trigram_vocab_size=2)
    assert tok.vocab == ("aaa", "abc")  # aaa:2, abc:2 (tie: alphabetical), xyz:1
    assert tok.token_ids("xyz") == [_bucket("xyz", 3, 3)]


def test_bigram_shared_budget_and_ids():
    texts = ["New York", "new york", "new jersey"]
    # counts: new 3, new york 2, york 2, jersey 1, new jersey 1 (ties alphabetical)
    full = build_tokenizer("bigram", texts, vocab_size=10, num_oov_buckets=2)
    assert full.vocab == ("new", "new york", "york", "jersey", "new jersey")
    tok = build_tokenizer("bigram", texts, vocab_size=3, num_oov_buckets=2)
    assert isinstance(tok, BigramTokenizer) and tok.vocab == ("new", "new york", "york")
    assert tok.token_ids("new york") == [1, 3, 2]
    assert tok.token_ids("york new") == [3, 1, _bucket("york new", 4, 2)]


def test_word_kind_is_the_word_tokenizer():
    tok = _build("word")
    assert type(tok) is WordTokenizer and tok == build_word_tokenizer(CORPUS, 60, 7)


def test_unknown_kind():
    with pytest.raises(ValueError, match="char_trigram"):
        build_tokenizer("chars", CORPUS, vocab_size=5, num_oov_buckets=1)


# ----------------------------------------------------------------------------- sentencepiece
def test_sentencepiece_ids_shifted_and_no_unk(built):
    tok = built["sentencepiece"]
    sp = tok._processor
    assert (sp.unk_id(), sp.pad_id(), sp.bos_id(), sp.eos_id()) == (0, -1, -1, -1)
    assert tok.vocab_size == sp.get_piece_size() + 1 == 61
    text = "Zebra 2024 quiz"  # z, q, digits never occur in CORPUS
    assert tok.token_ids(text) == [i + 1 for i in sp.encode("zebra 2024 quiz")]
    ids = tok.token_ids(text)
    assert min(ids) >= 2 and max(ids) < tok.vocab_size  # 0 = pad, 1 = <unk> never used
    assert "".join(tok.pieces(text)).replace("\u2581", " ").strip() == "zebra 2024 quiz"


def test_sentencepiece_small_corpus_bpe_and_errors():
    tiny = ["silver fork", "golden spoon", "silver spoon"]
    uni = build_sentencepiece(tiny, vocab_size=1000)
    bpe = build_sentencepiece(tiny, vocab_size=1000, model_type="bpe")
    assert 38 <= uni.vocab_size < 1000 and 38 <= bpe.vocab_size < 1000
    assert uni.model_proto != bpe.model_proto
    for tok in (uni, bpe):
        assert tok.token_ids("silver spoon") and 0 not in tok.token_ids("silver spoon")
    with pytest.raises(ValueError, match="vocab_size=10"):
        build_sentencepiece(tiny, vocab_size=10)
    with pytest.raises(ValueError, match="model_type"):
        build_sentencepiece(tiny, vocab_size=100, model_type="word")
    with pytest.raises(ValueError, match="non-empty"):
        build_sentencepiece(["", "?!"], vocab_size=100)


def test_sentencepiece_trains_on_texts_longer_than_its_sentence_limit():
    long_text = " ".join(CORPUS)  # ~11k characters; sentencepiece alone would skip it
    assert len(long_text) > 2 * 4192
    tok = build_sentencepiece([long_text], vocab_size=80)
    assert tok.vocab_size > 50  # learned pieces beyond unk + the 37 required characters


# ----------------------------------------------------------------------------- every kind
@pytest.mark.parametrize("kind", KINDS)
def test_encode_padding_truncation_and_empty(built, kind):
    tok = built[kind]
    long_text = " ".join(CORPUS) * 20  # ~100k characters
    texts = ["", "?!", "ab", CORPUS[0], long_text]
    ids, mask = tok.encode(texts, max_len=8)
    assert ids.shape == mask.shape == (5, 8)
    assert ids.dtype == np.int32 and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, ids != 0)
    assert not mask[:2].any()
    for row, text in enumerate(texts[2:], start=2):
        expected = tok.token_ids(text)[:8]
        assert len(expected) >= 1
        np.testing.assert_array_equal(ids[row, :len(expected)], expected)
        assert not ids[row, len(expected):].any()
    assert mask[4].all() and mask[2].sum() == len(tok.token_ids("ab")) < 8
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.encode([], max_len=3)[0].shape == (0, 3)
    with pytest.raises(ValueError):
        tok.encode(["a"], max_len=0)


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_from_another_directory(built, kind, tmp_path, monkeypatch):
    tok = built[kind]
    run = tmp_path / "run"
    run.mkdir()
    tok.save(run / "vocab.json")
    assert json.loads((run / "vocab.json").read_text())["type"] == kind
    monkeypatch.chdir(tmp_path)  # relative path; the sp model must resolve next to the JSON
    loaded = load_tokenizer(os.path.join("run", "vocab.json"))
    assert type(loaded) is type(tok) and loaded == tok
    probe = CORPUS[:20] + ["unseen zzzz words 42", "", " ".join(CORPUS)]
    for a, b in zip(tok.encode(probe, 16), loaded.encode(probe, 16), strict=True):
        np.testing.assert_array_equal(a, b)
    unpickled = pickle.loads(pickle.dumps(tok))  # what data-loading workers receive
    assert unpickled == tok and unpickled.token_ids(probe[0]) == tok.token_ids(probe[0])


def test_sentencepiece_saved_files_and_errors(built, tmp_path):
    tok = built["sentencepiece"]
    tok.save(tmp_path / "vocab.json")
    payload = json.loads((tmp_path / "vocab.json").read_text())
    model = tmp_path / payload["model_file"]
    assert payload["model_file"] == "vocab.sentencepiece.model"
    assert model.read_bytes() == tok.model_proto
    assert payload["model_sha256"] == hashlib.sha256(tok.model_proto).hexdigest()
    model.write_bytes(tok.model_proto[:-1])
    with pytest.raises(ValueError, match="sha256"):
        load_tokenizer(tmp_path / "vocab.json")
    (tmp_path / "vocab.json").write_text(json.dumps(
        {**payload, "model_sha256": hashlib.sha256(b"garbage").hexdigest()}))
    model.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt sentencepiece model"):
        load_tokenizer(tmp_path / "vocab.json")
    model.unlink()
    with pytest.raises(FileNotFoundError, match="vocab.sentencepiece.model"):
        load_tokenizer(tmp_path / "vocab.json")


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps([1]),
    json.dumps({"type": "chars", "version": 1}),
    json.dumps({"type": "char_trigram", "vocab": ["abc"], "version": 1}),
    json.dumps({"type": "char_trigram", "vocab": ["abc"], "num_oov_buckets": 1, "version": 2}),
    json.dumps({"type": "word+char_trigram", "word_vocab": ["a"], "num_oov_buckets": 1,
                "version": 1}),
    json.dumps({"type": "bigram", "vocab": ["a", "a"], "num_oov_buckets": 1, "version": 1}),
    json.dumps({"type": "sentencepiece", "version": 1}),
])
def test_load_corrupt_file_names_path(tmp_path, content):
    path = tmp_path / "corrupt_tok.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="corrupt_tok.json"):
        load_tokenizer(path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tokenizer(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("kind", KINDS)
def test_build_is_deterministic(built, kind):
    again = _build(kind, iter(list(CORPUS)))  # an iterator, read once
    assert again == built[kind]
    if kind != "sentencepiece":  # counts do not depend on text order
        assert _build(kind, CORPUS[::-1]) == built[kind]


_CHILD = """
import hashlib, json, sys
from dualjax.text import tokenizers
texts, probe = json.loads(sys.argv[1]), sys.argv[2]
out = {}
for kind in tokenizers.TOKENIZERS:
    tok = tokenizers.build_tokenizer(kind, iter(texts), vocab_size=60, num_oov_buckets=997,
                                     trigram_vocab_size=40, input_sentence_size=150)
    out[kind] = tok.token_ids(probe)
    if kind == "sentencepiece":
        out["sp_sha"] = hashlib.sha256(tok.model_proto).hexdigest()
print(json.dumps(out))
"""


def test_hashing_and_builds_stable_across_processes():
    """Buckets come from crc32, never the salted `hash`; builds (sentencepiece's sample
    of 150 of the 300 texts included) are identical in every process."""
    probe = "Quixotic zephyrs vex 42 jumbled words, new york"
    results = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed,
                   PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(CORPUS), probe], env=env,
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    toks = {kind: build_tokenizer(kind, CORPUS, vocab_size=60, num_oov_buckets=997,
                                  trigram_vocab_size=40, input_sentence_size=150)
            for kind in KINDS}
    local = {kind: tok.token_ids(probe) for kind, tok in toks.items()}
    local["sp_sha"] = hashlib.sha256(toks["sentencepiece"].model_proto).hexdigest()
    assert results[0] == results[1] == local
    assert len(set(local["char_trigram"])) > 10  # mostly distinct OOV buckets
    # the sample matters: training on all 300 texts gives another model
    assert toks["sentencepiece"] != build_sentencepiece(CORPUS, vocab_size=60)
