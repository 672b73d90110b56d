"""Text in every script: each tokenizer reads Chinese, Arabic, Cyrillic, Greek and
Devanagari; a text that gives no token (emoji, "?!") is refused in training data by
file:line, skipped in an index and left out of an evaluation's dense search, never
given a vector shared with other such texts."""
import itertools

import conftest
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax.config import specs
from dualjax.data.pairs_file import read_pairs
from dualjax.errors import DataError
from dualjax.eval import scoring
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime import sharding
from dualjax.text import tokenizers
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import build_word_tokenizer

SCRIPTS = {
    "chinese": "北京大学的图书馆很大 2024",
    "arabic": "مكتبة الجامعة كبيرة جدا",
    "cyrillic": "Библиотека университета очень большая",
    "greek": "Η βιβλιοθήκη του πανεπιστημίου είναι μεγάλη",
    "devanagari": "विश्वविद्यालय का पुस्तकालय बहुत बड़ा है",
    "english": "the university library is very large",
}
NO_TOKEN = ("🙂🎉👍", "?!", "")
TINY_BERT = conftest.FIXTURES / "pretrained" / "tiny_bert"


@pytest.mark.parametrize("kind", tokenizers.TOKENIZERS)
def test_every_tokenizer_reads_every_script(kind):
    texts = list(SCRIPTS.values()) * 20
    tok = tokenizers.build_tokenizer(kind, texts, vocab_size=300, num_oov_buckets=8,
                                     trigram_vocab_size=300)
    ids = {name: tok.token_ids(text) for name, text in SCRIPTS.items()}
    for name, seq in ids.items():
        assert seq and tokenizers.known_tokens(tok, SCRIPTS[name]) > 0, name
    assert len({tuple(seq) for seq in ids.values()}) == len(SCRIPTS)  # no two alike
    for text in NO_TOKEN:
        assert not tokenizers.gives_tokens(tok, text), text


@pytest.mark.parametrize("kind", tokenizers.TOKENIZERS)
def test_a_saved_tokenizer_splits_every_script_as_it_was_built(kind, tmp_path):
    tok = tokenizers.build_tokenizer(kind, list(SCRIPTS.values()) * 20, vocab_size=300,
                                     num_oov_buckets=8, trigram_vocab_size=300)
    tok.save(tmp_path / "vocab.json")
    loaded = tokenizers.load_tokenizer(tmp_path / "vocab.json")
    for text in SCRIPTS.values():
        assert loaded.token_ids(text) == tok.token_ids(text)


def test_an_hf_tokenizer_sees_the_text_as_given():
    """dualjax's normalisation is not applied before a Hugging Face tokenizer: its own
    normaliser decides (the tiny BERT's lowercases and splits CJK characters)."""
    from tokenizers import Tokenizer

    from dualjax.text.hf import HFTokenizer
    path = TINY_BERT / "tokenizer.json"
    hf, raw = HFTokenizer.from_file(path), Tokenizer.from_file(str(path))
    raw.no_padding()
    for text in [*SCRIPTS.values(), "🙂 Café ?!"]:
        assert hf.content_ids(text) == raw.encode(text, add_special_tokens=False).ids
    assert tokenizers.gives_tokens(hf, "?!")  # punctuation is a token of BERT's
    assert not tokenizers.gives_tokens(hf, "   ")
    ids, mask = hf.encode(["", "?!"], 8)
    assert mask[0].sum() == 2 and mask[1].sum() == 4  # [CLS] [SEP] alone; [CLS] ? ! [SEP]


def test_pairs_in_every_script_train_and_a_pair_without_a_letter_is_named(tmp_path):
    path = tmp_path / "p.tsv"
    rows = [f"{q}\t{d}" for q, d in itertools.pairwise(SCRIPTS.values())]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert len(read_pairs(path)) == len(rows)
    path.write_text("\n".join(rows[:2] + ["什么\t🙂🎉"]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"p\.tsv:3: document has no letter or digit"):
        read_pairs(path)


def test_an_index_skips_documents_without_a_token():
    from dualjax import index
    tok = build_word_tokenizer(SCRIPTS.values(), 100, 4)
    ids = ["zh", "e1", "ru", "e2", "hi"]
    texts = [SCRIPTS["chinese"], "🙂🎉", SCRIPTS["cyrillic"], "?!", SCRIPTS["devanagari"]]
    assert index.with_tokens(ids, texts, tok) == (
        ["zh", "ru", "hi"], [texts[0], texts[2], texts[4]], ["e1", "e2"])
    assert index.with_tokens(["a"], ["?!"], tok) == ([], [], ["a"])


def _bias_encoder(vocab_size, dim=8):
    """A tower with a bias, as real ones have: a text without tokens is the bias alone,
    the same vector for every such text."""
    table = jax.random.normal(jax.random.PRNGKey(0), (vocab_size, dim))
    bias = jax.random.normal(jax.random.PRNGKey(1), (dim,))

    @jax.jit
    def encode(x):
        m = x["mask"].astype(jnp.float32)[..., None]
        v = (table[x["ids"]] * m).sum(1) / jnp.maximum(m.sum(1), 1.0) + bias
        return v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    return encode


def test_an_evaluation_never_retrieves_a_document_without_a_token():
    mesh = sharding.make_mesh()
    tok = build_word_tokenizer(SCRIPTS.values(), 100, 4)
    corpus = ["🙂🎉", SCRIPTS["chinese"], "?!", SCRIPTS["arabic"], SCRIPTS["greek"], ""]
    queries = ["👍", SCRIPTS["arabic"], SCRIPTS["greek"]]  # the first is a miss, no match
    task = RetrievalTask(queries=queries, corpus=corpus,
                         relevant=[np.array([0]), np.array([3]), np.array([4])],
                         query_corpus_index=np.array([-1, 3, -1]))
    config = load_config("tiny")
    config.eval.index, config.eval.baselines = "exact", ""
    cfg = specs.eval_spec(config)
    encode = _bias_encoder(tok.vocab_size)
    side = Side(tok, 16)
    _, ranked = scoring.evaluate_split(task, {"dual_encoder": (encode, encode)},
                                        Inputs(side, side), cfg, mesh)
    ids = ranked["dual_encoder [exact]"].ids
    found = set(ids[ids >= 0].tolist())
    assert found <= {1, 3, 4} and {1, 4} <= found  # the no-token documents never come
    assert 3 not in ids[1]  # a query never retrieves itself, counted in corpus positions
    assert ids[2][0] == 4  # the Greek query finds the Greek document first


@pytest.mark.slow
def test_a_run_on_pairs_in_every_script_trains_and_evaluates(tmp_path):
    """Questions and answers in six scripts, with digits: the run builds its tables (the
    digits alone once made data preparation yield no example), trains, and its
    vocabulary holds the scripts' words."""
    from dualjax.text.words import WordTokenizer
    from dualjax.train import loop as train
    objects = {"chinese": ("自行车", "修理"), "arabic": ("دراجة", "إصلاح"),
               "cyrillic": ("велосипед", "ремонт"), "greek": ("ποδήλατο", "επισκευή"),
               "devanagari": ("साइकिल", "मरम्मत"), "english": ("bicycle", "repair")}
    lines = [f"{thing} {verb} {i}?\t{verb} {thing} {i}"
             for i in range(12) for thing, verb in objects.values()]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = load_config("tiny")
    cfg.eval.untrained, cfg.eval.baselines, cfg.eval.index = False, "", "exact"
    cfg.update_from_flattened_dict({"data.name": "pairs", "data.path": str(path),
                                    "data.test_fraction": 0.2})
    results = train.train_and_evaluate(cfg, str(tmp_path / "run"))
    assert results["dual_encoder [exact]"]["num_queries"] > 5
    vocab = set(WordTokenizer.load(tmp_path / "run" / "vocab.json").vocab)
    assert {"自", "دراجة", "велосипед", "ποδηλατο", "साइकिल"} <= vocab
