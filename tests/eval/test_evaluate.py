"""Tests for dualjax.eval.scoring: sharded encoding, hand-computed task metrics, tables."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax.config.specs import model_spec
from dualjax.eval import scoring
from dualjax.models import dual_encoder
from dualjax.retrieval import encoding, hybrid
from dualjax.retrieval.task import RetrievalTask
from dualjax.runtime import sharding
from dualjax.text.sides import Inputs, Side
from dualjax.text.words import WordTokenizer, build_word_tokenizer


@pytest.fixture(scope="module")
def mesh():
    m = sharding.make_mesh()
    assert m.devices.size == 8
    return m


# --- encode_texts ----------------------------------------------------------------------

TEXTS = [f"text number {i} with words w{i % 5} w{i % 7}" + " extra" * (i % 4) for i in range(21)]
TEXTS[4] = ""  # a text with no words: all-padding row


def _masked_mean_encoder(vocab_size, dim=6, seed=0):
    """A jitted encode fn (mean of a fixed random embedding table over real tokens)."""
    table = jax.random.normal(jax.random.PRNGKey(seed), (vocab_size, dim))
    calls = {"traces": 0, "rows": set()}

    @jax.jit
    def encode(x):
        ids, mask = x["ids"], x["mask"]
        calls["traces"] += 1
        calls["rows"].add(ids.shape[0])
        m = mask.astype(jnp.float32)[..., None]
        return (table[ids] * m).sum(1) / jnp.maximum(m.sum(1), 1.0)

    return encode, calls


# batch_size -> the rows its batches run as, on 8 devices: batches of 8 (8, 8, 5 texts:
# the last padded to 8), of 16 (16, then 5 padded to 8, not 16); the 21 texts in one
# batch run as 24 of 64 (three eighths of the batch) and as 32 of 512 (8 devices x 4).
@pytest.mark.parametrize("batch_size,rows", [(5, {8}), (8, {8}), (13, {16, 8}), (64, {24}),
                                             (512, {32})])
def test_encode_texts_matches_one_direct_call(mesh, batch_size, rows):
    tok = build_word_tokenizer(TEXTS, vocab_size=10, num_oov_buckets=7)
    encode, calls = _masked_mean_encoder(tok.vocab_size)
    ids, mask = tok.encode(TEXTS, 12)
    expected = np.asarray(encode({"ids": ids, "mask": mask}))
    calls["traces"], calls["rows"] = 0, set()

    out = encoding.encode_texts(encode, TEXTS, Side(tok, 12), batch_size, mesh)
    assert out.shape == (len(TEXTS), 6)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[4], 0.0)  # the empty text
    # One compile per shape: the full batches' and a short last batch's own.
    assert calls["rows"] == rows and calls["traces"] == len(rows)


@pytest.mark.slow
def test_encode_texts_with_real_model(mesh):
    """The tiny config's dual encoder, batched over the mesh, equals one direct call."""
    cfg = load_config("tiny").model
    tok = build_word_tokenizer(TEXTS, vocab_size=20, num_oov_buckets=cfg.num_oov_buckets)
    model = dual_encoder.make_model(model_spec(cfg), tok.vocab_size)
    params = dual_encoder.init_params(model, jax.random.PRNGKey(0), cfg.max_len)
    encode = jax.jit(lambda x: model.apply({"params": params}, **x, method="encode_queries"))
    ids, mask = tok.encode(TEXTS, cfg.max_len)
    expected = np.asarray(encode({"ids": ids, "mask": mask}))
    out = encoding.encode_texts(encode, TEXTS, Side(tok, cfg.max_len), 6, mesh)
    assert out.shape == (len(TEXTS), cfg.output_dim)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out[np.arange(21) != 4], axis=1), 1.0, atol=1e-5)


# --- evaluate_split on a hand-made task -------------------------------------------------

# Every text is one word; its embedding is the unit vector at an angle (degrees) in 2-D,
# so a score is cos(angle difference) and ranking is by angular distance.
ANGLES = {"alpha": 0.0, "beta": 20.0, "gamma": 50.0, "delta": 90.0, "eps": 180.0,
          "zeta": 85.0}
TOKENIZER = WordTokenizer(vocab=tuple(ANGLES), num_oov_buckets=0)  # ids 1..6, in order
INPUTS = Inputs(Side(TOKENIZER, 4), Side(TOKENIZER, 4))


def _lookup_encoder(angles):
    """Text (first token id) -> unit vector at angles[word]; padding id 0 -> zeros."""
    table = np.zeros((TOKENIZER.vocab_size, 2), np.float32)
    for word, deg in angles.items():
        table[TOKENIZER.token_ids(word)[0]] = [math.cos(math.radians(deg)),
                                              math.sin(math.radians(deg))]
    table = jnp.asarray(table)
    return jax.jit(lambda x: table[x["ids"][:, 0]])


# corpus ids: 0 alpha (0 deg), 1 beta (20), 2 gamma (50), 3 delta (90), 4 eps (180)
TASK = RetrievalTask(
    corpus=["alpha", "beta", "gamma", "delta", "eps"],
    queries=["alpha", "zeta", "gamma"],
    relevant=[frozenset({2}), frozenset({3, 0}), frozenset({1})],
    query_corpus_index=np.array([0, -1, 2]),
)


BASE = dict(index="exact", top_k=100, batch_size=3)
CHUNKS = dict(query_chunk=2, corpus_chunk=2)


def _eval_cfg(**overrides) -> scoring.EvalSpec:
    chunks = {k: overrides.pop(k) for k in ("query_chunk", "corpus_chunk") if k in overrides}
    return scoring.EvalSpec(**{**BASE, **overrides}, index_settings={**CHUNKS, **chunks})


def _exact_metrics(encode_queries, encode_documents, eval_cfg, mesh):
    """The dual encoder's exact-search metrics from evaluate_split."""
    rows, ranked = scoring.evaluate_split(TASK,
                                          {"dual_encoder": (encode_queries, encode_documents)},
                                          INPUTS, eval_cfg, mesh)
    assert [(r["system"], r["index"]) for r in rows] == [("dual_encoder", "exact")]
    assert list(ranked) == ["dual_encoder [exact]"]
    return {k: v for k, v in rows[0].items() if k not in ("system", "index")}


@pytest.mark.parametrize("cfg_overrides", [{}, {"query_chunk": 256, "corpus_chunk": 4096,
                                                "batch_size": 512}])
def test_evaluate_split_hand_computed(mesh, cfg_overrides):
    enc = _lookup_encoder(ANGLES)
    got = _exact_metrics(enc, enc, _eval_cfg(**cfg_overrides), mesh)
    # top_k = min(100, 5) = 5. Rankings (angular distance from the query):
    # q0 "alpha" (0 deg, itself excluded): beta 20, gamma 50, delta 90, eps 180, then -1.
    #    relevant {gamma}: hit at rank 2. (Retrieving itself would push it to rank 3.)
    # q1 "zeta" (85 deg, not in corpus): delta 5, gamma 35, beta 65, alpha 85, eps 95.
    #    relevant {delta, alpha}: hits at ranks 1 and 4.
    # q2 "gamma" (50 deg, itself excluded): beta 30, delta 40, alpha 50, eps 130, then -1.
    #    relevant {beta}: hit at rank 1. (Retrieving itself would push it to rank 2.)
    expected = {
        "recall@1": (0 + 1 / 2 + 1) / 3,
        "recall@5": (1 + 1 + 1) / 3,
        "recall@10": (1 + 1 + 1) / 3,
        "recall@50": 1.0,
        "recall@100": 1.0,
        "success@1": (0 + 1 + 1) / 3,
        "success@10": 1.0,
        "mrr@10": (1 / 2 + 1 + 1) / 3,
        # AP: q0 P@2 / R = 0.5; q1 (P@1 + P@4) / 2 = (1 + 2/4) / 2 = 0.75; q2 1.
        "map@100": (0.5 + 0.75 + 1.0) / 3,
        # nDCG@10: q0 (1/log2 3) / 1; q1 (1 + 1/log2 5) / (1 + 1/log2 3); q2 1.
        "ndcg@10": (1 / math.log2(3)
                    + (1 + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
                    + 1.0) / 3,
        # Every relevant item is within the top 5 returned: nDCG@20 = nDCG@10.
        "ndcg@20": (1 / math.log2(3)
                    + (1 + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
                    + 1.0) / 3,
        # P@k: 1, 2 and 1 hits over the nominal k.
        "p@10": (1 + 2 + 1) / 10 / 3,
        "p@20": (1 + 2 + 1) / 20 / 3,
        "num_queries": 3,
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert got["mrr@10"] == pytest.approx(0.8333333333)
    assert got["map@100"] == pytest.approx(0.75)


def test_reciprocal_rank_fusion_by_hand():
    dense = np.array([[3, 1, 2, -1], [5, 6, -1, -1]])
    words = np.array([[2, 4, 3, -1], [-1, -1, -1, -1]])
    fused = hybrid.fuse_rrf([dense, words], k=4, rrf_k=1.0)
    # q0: 3: 1/2 + 1/4 = 0.75; 2: 1/4 + 1/2 = 0.75 (tie: the first ranking's order);
    #     1: 1/3; 4: 1/3 (tie: 1 came first, from the first ranking).
    np.testing.assert_array_equal(fused[0], [3, 2, 1, 4])
    # q1: only the first ranking has results: its order, then padding.
    np.testing.assert_array_equal(fused[1], [5, 6, -1, -1])
    np.testing.assert_array_equal(hybrid.fuse_rrf([dense, words], k=2)[0], [3, 2])


def test_score_interpolation_by_hand():
    dense = (np.array([[3, 1, 2]]), np.array([[0.9, 0.5, 0.1]]))  # scaled: 1, 0.5, 0
    words = (np.array([[2, 4, -1]]), np.array([[8.0, 2.0, -np.inf]]))  # scaled: 1, 0
    # w = 0.6: 3: 0.6; 1: 0.3; 2: 0 + 0.4 = 0.4; 4: 0 (tie with nothing above it).
    np.testing.assert_array_equal(hybrid.fuse_scores(dense, words, 0.6, 4), [[3, 2, 1, 4]])
    # w = 0.2: 3: 0.2; 1: 0.1; 2: 0.8; 4: 0.
    np.testing.assert_array_equal(hybrid.fuse_scores(dense, words, 0.2, 3), [[2, 3, 1]])
    # One document only: its scaled score is 1; an empty list adds nothing.
    one = (np.array([[7, -1]]), np.array([[0.3, -np.inf]]))
    none = (np.array([[-1, -1]]), np.array([[-np.inf, -np.inf]]))
    np.testing.assert_array_equal(hybrid.fuse_scores(one, none, 0.5, 2), [[7, -1]])
    # The weight chosen is the grid's best on these labels: only the lexical order puts
    # 2 first, so a low dense weight wins; 0.0 is the first of the best.
    weight, value = hybrid.choose_weight(dense, words, [frozenset({2})], 3, "mrr@10")
    assert (weight, value) == (0.0, 1.0)
    # With grades, nDCG prefers the order that puts the higher grade first: 3 (dense's
    # first) over 2 (the lexical first). Without them both orders score alike and the
    # grid's first weight, 0, is kept.
    relevant, grades = [frozenset({2, 3})], [{2: 1, 3: 3}]
    assert hybrid.choose_weight(dense, words, relevant, 3, "ndcg@10")[0] == 0.0
    weight, _ = hybrid.choose_weight(dense, words, relevant, 3, "ndcg@10", grades=grades)
    assert weight == 0.5  # the first where 3 leads (tied with 2 at 0.5: dense order first)


def test_hybrid_search_fuses_each_tower_with_bm25(mesh):
    enc = _lookup_encoder(ANGLES)
    cfg = _eval_cfg(hybrid="bm25", hybrid_rrf_k=60.0, hybrid_weight=0.5)
    rows, ranked = scoring.evaluate_split(TASK, {"dual_encoder": (enc, enc)}, INPUTS, cfg,
                                           mesh, baselines=("bm25",))
    assert [r["system"] for r in rows] == ["dual_encoder", "bm25", "dual_encoder+bm25",
                                           "dual_encoder+bm25_interp"]
    k = min(100, len(TASK.corpus))
    np.testing.assert_array_equal(
        ranked["dual_encoder+bm25 [exact]"].ids,
        hybrid.fuse_rrf([ranked["dual_encoder [exact]"].ids, ranked["bm25 [exact]"].ids], k, 60.0))
    # Chosen here (a val split): the best weight of the grid, by map@100 of its ranking.
    weight = rows[-1]["hybrid_weight"]
    assert weight in hybrid.WEIGHTS
    fixed = {w: scoring.evaluate_split(TASK, {"dual_encoder": (enc, enc)}, INPUTS, cfg, mesh,
                                        hybrid_weights={"dual_encoder": w})[0][-1]["map@100"]
             for w in hybrid.WEIGHTS}
    assert rows[-1]["map@100"] == max(fixed.values()) == fixed[weight]
    # Given (a test split): that weight; w = 1 is the dense ranking itself.
    rows, ranked = scoring.evaluate_split(TASK, {"dual_encoder": (enc, enc)}, INPUTS, cfg,
                                           mesh, hybrid_weights={"dual_encoder": 1.0})
    assert [r["system"] for r in rows] == ["dual_encoder", "dual_encoder+bm25",
                                           "dual_encoder+bm25_interp"]
    assert rows[-1]["hybrid_weight"] == 1.0
    np.testing.assert_array_equal(ranked["dual_encoder+bm25_interp [exact]"].ids,
                                  ranked["dual_encoder [exact]"].ids)
    # No weight for this tower: eval.hybrid_weight.
    rows, _ = scoring.evaluate_split(TASK, {"dual_encoder": (enc, enc)}, INPUTS, cfg, mesh,
                                      hybrid_weights={})
    assert rows[-1]["hybrid_weight"] == 0.5


def test_evaluate_split_uses_query_and_document_towers(mesh):
    """Queries go through encode_queries, the corpus through encode_documents."""
    documents = _lookup_encoder(ANGLES)
    queries = _lookup_encoder({**ANGLES, "alpha": 45.0})  # only the query "alpha" moves
    got = _exact_metrics(queries, documents, _eval_cfg(), mesh)
    # q0 "alpha" now at 45 deg: gamma 5, beta 25, delta 45, eps 135 -> hit at rank 1.
    # q1, q2 as in the test above (the corpus "alpha" stays at 0 deg): ranks 1 (+4), 1.
    # Swapped towers would give q0 rank 2 (beta 20, gamma 50) and q1 its alpha at rank 3.
    assert got["mrr@10"] == pytest.approx(1.0)
    assert got["recall@1"] == pytest.approx((1 + 1 / 2 + 1) / 3)
    assert got["map@100"] == pytest.approx((1.0 + 0.75 + 1.0) / 3)


def test_evaluate_split_top_k_cutoff(mesh):
    """top_k=1 keeps one result: recall@10 counts only the first."""
    enc = _lookup_encoder(ANGLES)
    got = _exact_metrics(enc, enc, _eval_cfg(top_k=1), mesh)
    # First results: q0 beta (miss), q1 delta (hit, 1 of 2), q2 beta (hit).
    assert got["recall@10"] == pytest.approx((0 + 1 / 2 + 1) / 3)
    assert got["success@10"] == pytest.approx(2 / 3)


# --- format_table ----------------------------------------------------------------------

def test_format_table_rows_and_aligned_columns():
    rows = [{"system": "untrained", "map@100": 0.123456, "num_queries": 65},
            {"system": "trained_long_name", "map@100": 0.25, "num_queries": 1200},
            {"system": "partial"}]
    table = scoring.format_table(rows, ["map@100", "num_queries"])
    assert table == "\n".join([
        "system             map@100  num_queries",
        "-----------------  -------  -----------",
        "untrained           0.1235           65",
        "trained_long_name   0.2500         1200",
        "partial                                ",
    ])
    lines = table.split("\n")
    assert len({len(line) for line in lines}) == 1
    # Numeric columns are right-aligned: values end where the header ends.
    end = lines[0].index("map@100") + len("map@100")
    assert lines[2][:end].endswith("0.1235") and lines[3][:end].endswith("0.2500")


def test_batches_are_cut_to_a_power_of_two_length():
    """length_bucket: the next power of two from the minimum, at most max_len; trim_padding
    cuts each text field of a training batch longer than 128 tokens to its own bucket (of
    half steps; hard negatives [b, k, len] too) and leaves fields of at most 128 tokens as
    they are."""
    from dualjax.text import sides
    assert [sides.length_bucket(n, 256) for n in (0, 1, 32, 33, 64, 65, 200, 256)] == \
        [32, 32, 32, 64, 64, 128, 256, 256]
    assert sides.length_bucket(300, 288) == 288
    assert sides.length_bucket(5, 512, min_bucket=128) == 128
    lengths = lambda *shape_and_longest: np.arange(shape_and_longest[-2]) < shape_and_longest[-1]
    batch = {"q_ids": np.ones((4, 64), np.int32), "q_mask": np.tile(lengths(64, 20), (4, 1)),
             "d_ids": np.ones((4, 512), np.int32), "d_mask": np.tile(lengths(512, 130), (4, 1)),
             "n_ids": np.ones((4, 2, 512), np.int32),
             "n_mask": np.tile(lengths(512, 10), (4, 2, 1)), "doc_ids": np.arange(4)}
    out = sides.trim_padding(batch)
    assert out["q_ids"].shape == (4, 64)  # max_len 64 <= 128: never cut
    assert out["d_ids"].shape == out["d_mask"].shape == (4, 192)  # 130 tokens: 192
    assert out["n_ids"].shape == (4, 2, 32)
    assert out["d_mask"].sum() == batch["d_mask"].sum() and out["doc_ids"] is batch["doc_ids"]
