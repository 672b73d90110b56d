"""In-batch losses: hand-computed values, sharded == unsharded on 8 devices (loss and
gradients, with hard negatives, mixed negatives, accidental hits and logQ), the same for
the blockwise form (columns streamed in blocks) and its memory bound, the column layout,
the streaming frequency estimate and the config checks."""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config
from jax.sharding import PartitionSpec as P

from dualjax import errors, losses, objectives
from dualjax.config import validation as config_lib
from dualjax.config.specs import loss_options, model_spec, objective_spec
from dualjax.losses import frequency
from dualjax.models import dual_encoder
from dualjax.runtime import sharding


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def softplus(x):
    return math.log1p(math.exp(x))


def both(name, rows, **options):
    """The reference and the sharded loss on a mesh of `rows` devices (one row each)."""
    return {"reference": jax.jit(losses.reference(name, **options)),
            "sharded": jax.jit(losses.sharded(name, sharding.make_mesh(rows), **options))}


# ----------------------------------------------------------------------------- hand values
def test_in_batch_softmax_hand_computed_3x3():
    # q = d = identity rows; scale 2, bias 0.5 -> logits = 2*I + 0.5.
    # Each row: positive logit 2.5, two negatives 0.5.
    # loss_i = log(e^2.5 + 2 e^0.5) - 2.5 = log(1 + 2 e^-2)
    q = jnp.eye(3)
    loss, metrics = losses.in_batch_softmax.reference(q, q, jnp.float32(2.0), jnp.float32(0.5))
    assert float(loss) == pytest.approx(math.log(1 + 2 * math.exp(-2)), rel=1e-6)
    assert float(metrics["in_batch_p@1"]) == 1.0


def test_in_batch_softmax_precision_counts_misses():
    # Row 0's best column is column 1 (cos 1 vs 0.6), rows 1 and 2 are right.
    q = jnp.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    d = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    for fn in both("in_batch_softmax", 3).values():
        loss, metrics = fn(q, d, jnp.float32(1.0), jnp.float32(0.0))
        # loss_0 = log(e^.6 + e^.8 + e^0) - .6 ; loss_1 = loss_2 = log(e + 2) - 1
        expected = (math.log(math.exp(.6) + math.exp(.8) + 1) - .6
                    + 2 * (math.log(math.e + 2) - 1)) / 3
        assert float(loss) == pytest.approx(expected, rel=1e-6)
        assert float(metrics["in_batch_p@1"]) == pytest.approx(2 / 3)


# A 2x2 case: q0 = (1, 0), q1 = (0, 1); d0 = (.6, .8), d1 = (0, 1).
# cos = q @ d.T = [[.6, 0], [.8, 1]]; squared distances 2 - 2 cos = [[.8, 2], [.4, 0]].
Q2 = jnp.array([[1.0, 0.0], [0.0, 1.0]])
D2 = jnp.array([[0.6, 0.8], [0.0, 1.0]])

# A 3x3 case: q = identity, so cos[i, j] = d_j[i]; the columns of cos are the d_j:
# d0 = (.6, .8, 0), d1 = (0, 1, 0), d2 = (0, .6, .8)
# cos = [[.6, 0, 0],      row 0: positive .6, negatives 0, 0
#        [.8, 1, .6],     row 1: positive 1,  negatives .8, .6
#        [0,  0, .8]]     row 2: positive .8, negatives 0, 0
Q3 = jnp.eye(3)
D3 = jnp.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8]])
ONE, ZERO = jnp.float32(1.0), jnp.float32(0.0)


def test_in_batch_softmax_symmetric_hand_computed_2x2():
    # scale 1, bias 0: logits = cos = [[.6, 0], [.8, 1]]
    # rows:    r0 = log(e^.6 + e^0) - .6      r1 = log(e^.8 + e^1) - 1
    # columns: c0 = log(e^.6 + e^.8) - .6     c1 = log(e^0 + e^1) - 1
    r0, r1 = math.log(math.exp(.6) + 1) - .6, math.log(math.exp(.8) + math.e) - 1
    c0, c1 = math.log(math.exp(.6) + math.exp(.8)) - .6, math.log(1 + math.e) - 1
    expected = 0.5 * ((r0 + r1) / 2 + (c0 + c1) / 2)
    for fn in both("in_batch_softmax", 2, symmetric=True).values():
        loss, metrics = fn(Q2, D2, ONE, ZERO)
        assert float(loss) == pytest.approx(expected, rel=1e-6)
        assert float(metrics["in_batch_p@1"]) == 1.0  # .6 > 0 and 1 > .8


def test_in_batch_softmax_accidental_hits_and_hard_negatives_3x3():
    # q = d = I, scale 2, bias .5: logit = 2 cos + .5. doc_ids [5, 5, 6].
    # One hard negative per row: h0 = e1 (id 7), h1 = e2 (id 5: row 1's own document,
    # a mined false negative), h2 = (.6, .8, 0) (id 8).
    # Columns [d0 d1 d2 h0 h1 h2], ids [5 5 6 7 5 8].
    # row 0 (id 5, e0): d0 2.5 (pos), d1 masked (id 5), d2 .5, h0 .5, h1 masked (id 5),
    #   h2 2*.6+.5 = 1.7  -> log(e^2.5 + 2 e^.5 + e^1.7) - 2.5 = log(1 + 2e^-2 + e^-.8); hit
    # row 1 (id 5, e1): d0 masked, d1 2.5 (pos), d2 .5, h0 2.5, h1 masked, h2 2*.8+.5 = 2.1
    #   -> log(2 e^2.5 + e^.5 + e^2.1) - 2.5 = log(2 + e^-2 + e^-.4); miss (h0 ties)
    # row 2 (id 6, e2): d0 .5, d1 .5, d2 2.5 (pos), h0 .5, h1 2.5 (id 5 != 6), h2 .5
    #   -> log(2 e^2.5 + 4 e^.5) - 2.5 = log(2 + 4e^-2); miss (h1 ties)
    e = math.exp
    masked = (math.log(1 + 2 * e(-2) + e(-.8)) + math.log(2 + e(-2) + e(-.4))
              + math.log(2 + 4 * e(-2))) / 3
    # Without removal row 0 also has d1 and h1 at .5: log(1 + 4e^-2 + e^-.8); row 1 has d0
    # .5 and h1 .5: log(2 + 3e^-2 + e^-.4); row 2 unchanged.
    unmasked = (math.log(1 + 4 * e(-2) + e(-.8)) + math.log(2 + 3 * e(-2) + e(-.4))
                + math.log(2 + 4 * e(-2))) / 3
    extras = {"doc_ids": jnp.array([5, 5, 6]),
              "hard_negatives": jnp.array([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]],
                                           [[0.6, 0.8, 0.0]]]),
              "hard_negative_ids": jnp.array([[7], [5], [8]])}
    for remove, expected, p1 in ((True, masked, 1 / 3), (False, unmasked, 1 / 3)):
        for fn in both("in_batch_softmax", 3, remove_accidental_hits=remove).values():
            loss, metrics = fn(Q3, Q3, jnp.float32(2.0), jnp.float32(0.5), extras)
            assert float(loss) == pytest.approx(expected, rel=1e-6)
            assert float(metrics["in_batch_p@1"]) == pytest.approx(p1)


def test_log_q_correction_lowers_frequent_documents_2x2():
    # logits = cos = [[.6, 0], [.8, 1]] (scale 1, bias 0). Document 0 is frequent
    # (q0 = .5, log q0 = -.693), document 1 rare (q1 = .05, log q1 = -2.996).
    # Corrected logit = logit - log q: column 0 gains .693, column 1 gains 2.996, so the
    # frequent document ends up LOWER relative to the rare one (TFRS issue #219 added it).
    # row 0: [.6 + .693, 0 + 2.996] = [1.293, 2.996] -> log(1 + e^(2.996 - 1.293)) = 1.870
    # row 1: [.8 + .693, 1 + 2.996] = [1.493, 3.996] -> log(1 + e^(1.493 - 3.996)) = 0.079
    # (with the sign flipped: row 0 log(1 + e^(-2.996 + .093)) = .053,
    #  row 1 log(1 + e^(.107 + 1.996)) = 2.218)
    l0, l1 = math.log(.5), math.log(.05)
    row0 = math.log(1 + math.exp((0 - l1) - (.6 - l0)))
    row1 = math.log(1 + math.exp((.8 - l0) - (1 - l1)))
    assert (row0 + row1) / 2 == pytest.approx((1.870 + .079) / 2, abs=1e-3)
    for fn in both("in_batch_softmax", 2).values():
        loss, metrics = fn(Q2, D2, ONE, ZERO, {"log_q_pos": jnp.array([l0, l1])})
        assert float(loss) == pytest.approx((row0 + row1) / 2, rel=1e-6)
        assert abs(float(loss) - (.053 + 2.218) / 2) > 0.1  # not the flipped sign
        assert float(metrics["in_batch_p@1"]) == 1.0  # p@1 ranks uncorrected scores


def test_log_q_a_more_frequent_negative_costs_less():
    # One hard negative h0 = (.6, .8) for row 0 and h1 = (.8, .6) for row 1 (columns of
    # both rows). Making h0 frequent lowers its corrected logit in every row, so the loss
    # must drop; the flipped sign (logit + log q) would raise it.
    extras = {"hard_negatives": jnp.array([[[0.6, 0.8]], [[0.8, 0.6]]]),
              "log_q_pos": jnp.log(jnp.array([.1, .1]))}
    fn = jax.jit(losses.reference("in_batch_softmax"))
    rare, frequent = (fn(Q2, D2, ONE, ZERO,
                         {**extras, "log_q_hard": jnp.log(jnp.array([[q0], [.1]]))})[0]
                      for q0 in (.01, .9))
    assert float(frequent) < float(rare) - 0.1


def test_in_batch_sigmoid_hand_computed_2x2():
    # scale 2, bias -1: logits = 2 cos - 1 = [[.2, -1], [.6, 1]]
    # positives (label 1): softplus(-.2), softplus(-1); negatives (label 0): softplus(-1)
    # for entry (0, 1) = -1 and softplus(.6) for entry (1, 0) = .6; mean over 4 entries.
    expected = (softplus(-.2) + softplus(-1) + softplus(.6) + softplus(-1)) / 4
    for fn in both("in_batch_sigmoid", 2).values():
        loss, metrics = fn(Q2, D2, jnp.float32(2.0), jnp.float32(-1.0))
        assert float(loss) == pytest.approx(expected, rel=1e-6)
        assert float(metrics["in_batch_p@1"]) == 1.0


def test_in_batch_triplet_hardest_hand_computed_3x3():
    # margin .7 on the cosines (scale and bias unused):
    # row 0: max(0, .7 - .6 + max(0, 0))  = .1
    # row 1: max(0, .7 - 1  + max(.8, .6)) = .5
    # row 2: max(0, .7 - .8 + max(0, 0))  = max(0, -.1) = 0
    for fn in both("in_batch_triplet_hardest", 3, margin=0.7).values():
        loss, metrics = fn(Q3, D3, jnp.float32(5.0), jnp.float32(3.0))
        assert float(loss) == pytest.approx((.1 + .5 + 0) / 3, rel=1e-5)
        assert float(metrics["in_batch_p@1"]) == 1.0
    # Default margin .5: row 0: -.1 -> 0; row 1: .5 - 1 + .8 = .3; row 2: -.3 -> 0
    loss, _ = losses.reference("in_batch_triplet_hardest")(Q3, D3, ONE, ZERO)
    assert float(loss) == pytest.approx(.3 / 3, rel=1e-5)


@pytest.mark.parametrize("distance,margin,hard,expected", [
    # cosine distance 1 - cos: row 0: D+ .4, D- 1, 1;  row 1: D+ 0, D- .2, .4;
    # row 2: D+ .2, D- 1, 1.  Margin .9, mean over negatives:
    #   row 0: (.4-1+.9)*2/2 = .3; row 1: ((0-.2+.9) + (0-.4+.9))/2 = (.7+.5)/2 = .6;
    #   row 2: .2-1+.9 = .1  -> (.3 + .6 + .1)/3
    ("cosine", 0.9, False, (.3 + .6 + .1) / 3),
    # hardest (nearest) negative only: row 0: .3; row 1: 0-.2+.9 = .7; row 2: .1
    ("cosine", 0.9, True, (.3 + .7 + .1) / 3),
    # default cosine margin .3: row 1: (0-.2+.3) = .1 and (0-.4+.3) -> 0, mean .05;
    # rows 0 and 2 clip to 0 -> .05/3
    ("cosine", -1.0, False, .05 / 3),
    # squared euclidean 2 - 2cos: row 0: D+ .8, D- 2, 2; row 1: D+ 0, D- .4, .8;
    # row 2: D+ .4, D- 2, 2.  Margin 1.5: row 0: .8-2+1.5 = .3; row 1: (1.1 + .7)/2 = .9;
    # row 2: .4-2+1.5 = -.1 -> 0
    ("squared_euclidean", 1.5, False, (.3 + .9 + 0) / 3),
    # euclidean sqrt(2 - 2cos), margin 1: row 0: sqrt(.8) - sqrt(2) + 1 (both negatives);
    # row 1: mean(1 - sqrt(.4), 1 - sqrt(.8)); row 2: sqrt(.4) - sqrt(2) + 1
    ("euclidean", 1.0, False,
     ((math.sqrt(.8) - math.sqrt(2) + 1) + ((1 - math.sqrt(.4)) + (1 - math.sqrt(.8))) / 2
      + (math.sqrt(.4) - math.sqrt(2) + 1)) / 3),
])
def test_triplet_margin_hand_computed_3x3(distance, margin, hard, expected):
    for fn in both("triplet_margin", 3, distance=distance, margin=margin, hard=hard).values():
        loss, metrics = fn(Q3, D3, jnp.float32(5.0), jnp.float32(3.0))
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        assert float(metrics["in_batch_p@1"]) == 1.0  # every D+ < every D- of its row


def test_sdml_hand_computed_2x2():
    # logits = -||q - d||^2 = -[[.8, 2], [.4, 0]]; eps = .3, N = 2 columns:
    # target = 1 - .3 + .3/2 = .85 on the positive, .3/2 = .15 on the negative.
    # row 0: p+ = e^-.8 / (e^-.8 + e^-2) = sigmoid(1.2) = .768525
    # row 1: p+ = e^0 / (e^0 + e^-.4)   = sigmoid(.4)  = .598688
    # KL_r = .85 log(.85 / p+) + .15 log(.15 / (1 - p+));  loss = (KL_0 + KL_1)/2 = .085440
    def kl(p):
        return .85 * math.log(.85 / p) + .15 * math.log(.15 / (1 - p))
    expected = (kl(sigmoid(1.2)) + kl(sigmoid(.4))) / 2
    assert expected == pytest.approx(0.085440, abs=1e-6)
    for fn in both("sdml", 2).values():
        loss, metrics = fn(Q2, D2, jnp.float32(5.0), jnp.float32(3.0))
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        assert float(metrics["in_batch_p@1"]) == 1.0


def test_sdml_smoothing_counts_only_unmasked_columns_3x3():
    # q = d = I, sdml_scale .5: logits -.5 * ||q - d||^2 = 0 on the positive, -1 elsewhere.
    # doc_ids [5, 5, 6]: rows 0 and 1 lose each other's column, so N = 2 there and N = 3
    # for row 2; eps = .3.
    # rows 0, 1: target (.85, .15), p = (1, e^-1)/(1 + e^-1) = (.731059, .268941)
    # row 2: target (.8, .1, .1), p = (1, e^-1, e^-1)/(1 + 2e^-1) = (.576117, .211942 x2)
    # KL_01 = .85 log(.85/.731059) + .15 log(.15/.268941) = .040553
    # KL_2 = .8 log(.8/.576117) + 2 * .1 log(.1/.211942) = .112413; loss = (2 KL_01 + KL_2)/3
    p0, p2 = 1 / (1 + math.exp(-1)), 1 / (1 + 2 * math.exp(-1))
    kl01 = .85 * math.log(.85 / p0) + .15 * math.log(.15 / (1 - p0))
    kl2 = .8 * math.log(.8 / p2) + 2 * .1 * math.log(.1 / (math.exp(-1) * p2))
    assert (kl01, kl2) == pytest.approx((.040553, .112413), abs=1e-6)
    for fn in both("sdml", 3, sdml_scale=0.5).values():
        loss, _ = fn(Q3, Q3, ONE, ZERO, {"doc_ids": jnp.array([5, 5, 6])})
        assert float(loss) == pytest.approx((2 * kl01 + kl2) / 3, rel=1e-5)


def test_pointwise_logistic_hand_computed_2x2():
    # pairs (q0, d0) cos .6 label 1; (q1, d1) cos 0 label 0 with d1 = (1, 0).
    # scale 2, bias -1: logits .2 and -1 -> loss = (softplus(-.2) + softplus(-1)) / 2
    # in_batch_p@1 over label-1 rows only: row 0's logits [.2, 2*1-1 = 1] -> a miss.
    d = jnp.array([[0.6, 0.8], [1.0, 0.0]])
    extras = {"labels": jnp.array([1, 0])}
    for fn in both("pointwise_logistic", 2).values():
        loss, metrics = fn(Q2, d, jnp.float32(2.0), jnp.float32(-1.0), extras)
        assert float(loss) == pytest.approx((softplus(-.2) + softplus(-1)) / 2, rel=1e-6)
        assert float(metrics["in_batch_p@1"]) == 0.0


# ----------------------------------------------------------------------------- layout
def test_every_device_gathers_positives_then_hard_negatives_in_row_order():
    # 16 rows over 8 devices, k = 3: each device must see [d_0..d_15, h_0,0 h_0,1 h_0,2,
    # h_1,0, ..., h_15,2, m_0, m_1], exactly as the reference builds it (P P ... P N N ...
    # N; the interleaved P N N N P N N N of sentence-transformers PR #3453 fails here).
    mesh = sharding.make_mesh()
    rng = np.random.default_rng(1)
    b, k, dim = 16, 3, 4
    d = rng.normal(size=(b, dim)).astype(np.float32)
    hard = rng.normal(size=(b, k, dim)).astype(np.float32)
    mixed = rng.normal(size=(2, dim)).astype(np.float32)

    def per_device(d, hard, mixed):
        cols, _, _ = losses.gather_columns(d, {"hard_negatives": hard, "mixed_negatives": mixed},
                                           with_ids=False)
        return cols[None]

    seen = jax.shard_map(per_device, mesh=mesh, in_specs=(P("data"), P("data"), P()),
                         out_specs=P("data"))(d, hard, mixed)  # [8 devices, C, dim]
    ref, _, _ = losses.reference_columns(d, {"hard_negatives": hard, "mixed_negatives": mixed},
                                         with_ids=False)
    assert seen.shape == (8, b + b * k + 2, dim)
    for device in range(8):
        np.testing.assert_array_equal(seen[device], ref)
    np.testing.assert_array_equal(ref[:b], d)
    for r in range(b):
        for j in range(k):
            np.testing.assert_array_equal(ref[b + r * k + j], hard[r, j])
    np.testing.assert_array_equal(ref[-2:], mixed)
    interleaved = np.concatenate([np.concatenate([d[r:r + 1], hard[r]]) for r in range(b)])
    assert not np.array_equal(np.asarray(ref[:b * (1 + k)]), interleaved)


# ----------------------------------------------------------------------------- sharded == reference
def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _batch(b=64, dim=16, k=2, u=8, seed=0):
    rng = np.random.default_rng(seed)
    q = _unit(rng.normal(size=(b, dim)))
    d = _unit(q + 0.35 * rng.normal(size=(b, dim)))
    hard = _unit(q[:, None, :] + 0.5 * rng.normal(size=(b, k, dim)))
    mixed = _unit(rng.normal(size=(u, dim)))
    doc_ids = rng.integers(0, 40, b)
    hard_ids = rng.integers(0, 40, (b, k))
    hard_ids[::4, 0] = doc_ids[::4]  # mined false negatives: the row's own document
    ids = {"doc_ids": doc_ids.astype(np.int32),
           "query_ids": rng.integers(0, 40, b).astype(np.int32),
           "cluster_ids": rng.integers(0, 24, b).astype(np.int32),
           "mixed_negative_clusters": rng.integers(0, 24, u).astype(np.int32),
           "hard_negative_ids": hard_ids.astype(np.int32),
           "mixed_negative_ids": rng.integers(0, 40, u).astype(np.int32)}
    log_q = {"log_q_pos": rng.uniform(-6, -1, b).astype(np.float32),
             "log_q_hard": rng.uniform(-6, -1, (b, k)).astype(np.float32),
             "log_q_mixed": rng.uniform(-6, -1, u).astype(np.float32)}
    labels = {"labels": (rng.uniform(size=b) < 0.5).astype(np.int32),
              "doc_ids": ids["doc_ids"]}
    return q, d, hard, mixed, ids, log_q, labels


Q, D, HARD, MIXED, IDS, LOG_Q, LABELS = _batch()


def test_test_batch_has_accidental_hits():
    # So that the masking below is exercised: duplicate positives, and mined negatives.
    doc, hard = IDS["doc_ids"], IDS["hard_negative_ids"]
    assert (doc[:, None] == doc[None, :]).sum() - len(doc) >= 20
    assert (hard == doc[:, None]).sum() >= 16
    assert (IDS["query_ids"][:, None] == doc[None, :]).sum() >= 20  # own query as a column
    c = IDS["cluster_ids"]
    assert (c[:, None] == c[None, :]).sum() - len(c) >= 100  # paraphrases in the batch
    assert (c[:, None] == IDS["mixed_negative_clusters"][None, :]).sum() >= 10


@pytest.mark.slow
def test_a_column_holding_the_rows_own_query_or_a_paraphrase_is_not_a_negative():
    # q = d = I, logit = 2 cos + .5; doc_ids [5, 6, 7], query_ids [6, 9, 9]: row 0's query
    # text is row 1's document, so column 1 leaves row 0's softmax (and, symmetric, query
    # 0 leaves document 1's): row 0 log(1 + e^-2), rows 1 and 2 log(1 + 2 e^-2).
    e = math.exp
    expected = (math.log(1 + e(-2)) + 2 * math.log(1 + 2 * e(-2))) / 3
    extras = {"doc_ids": jnp.array([5, 6, 7]), "query_ids": jnp.array([6, 9, 9])}
    for symmetric in (False, True):
        for fn in both("in_batch_softmax", 3, symmetric=symmetric).values():
            loss, _ = fn(Q3, Q3, jnp.float32(2.0), jnp.float32(0.5), extras)
            assert float(loss) == pytest.approx(expected, rel=1e-6)
    # cluster_ids [0, 0, 1]: rows 0 and 1 are paraphrases, each leaves the other's column.
    extras = {"doc_ids": jnp.array([5, 6, 7]), "cluster_ids": jnp.array([0, 0, 1])}
    expected = (2 * math.log(1 + e(-2)) + math.log(1 + 2 * e(-2))) / 3
    for symmetric in (False, True):
        for fn in both("in_batch_softmax", 3, symmetric=symmetric).values():
            loss, _ = fn(Q3, Q3, jnp.float32(2.0), jnp.float32(0.5), extras)
            assert float(loss) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match=r"query_ids'\] need extras\['doc_ids"):
        losses.reference("in_batch_softmax")(Q3, Q3, 2.0, 0.5, {"query_ids": jnp.array([1, 2, 3])})


# (loss, options, extras: "none" | "negatives" (hard + mixed + ids) | "log_q" (+ log q) |
#  "labels", grads that are zero by definition)
CASES = [
    ("in_batch_softmax", {}, "none", {"bias"}),
    ("in_batch_softmax", {}, "log_q", {"bias"}),
    ("in_batch_softmax", {"symmetric": True}, "log_q", {"bias"}),
    ("in_batch_softmax", {"remove_accidental_hits": False}, "negatives", {"bias"}),
    ("in_batch_sigmoid", {}, "negatives", set()),
    ("in_batch_triplet_hardest", {}, "negatives", {"scale", "bias"}),
    ("triplet_margin", {}, "negatives", {"scale", "bias"}),
    ("triplet_margin", {"distance": "euclidean", "hard": True}, "negatives", {"scale", "bias"}),
    ("triplet_margin", {"distance": "squared_euclidean", "margin": 1.0}, "negatives",
     {"scale", "bias"}),
    ("sdml", {}, "log_q", {"scale", "bias"}),
    ("sdml", {"label_smoothing": 0.0, "sdml_scale": 4.0}, "none", {"scale", "bias"}),
    ("pointwise_logistic", {}, "labels", set()),
]


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _assert_sharded_equals_reference(name, options, which, zero_grads, column_block):
    """Loss, in_batch_p@1 and the gradients w.r.t. q, d, scale, bias and the hard and mixed
    negatives of the sharded loss on 8 devices equal the reference's."""
    mesh = sharding.make_mesh()
    extras = {"none": {}, "negatives": IDS, "log_q": {**IDS, **LOG_Q}, "labels": LABELS}[which]
    with_negatives = which in ("negatives", "log_q")
    put = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))

    def value_and_grad(loss, q, d, hard, extras):
        def objective(q, d, scale, bias, hard, mixed):
            more = {"hard_negatives": hard, "mixed_negatives": mixed} if with_negatives else {}
            return loss(q, d, scale, bias, {**extras, **more})
        f = jax.jit(jax.value_and_grad(objective, argnums=tuple(range(6)), has_aux=True))
        return f(q, d, jnp.float32(5.0), jnp.float32(-1.0), hard, MIXED)

    (ref_loss, ref_m), ref_g = value_and_grad(losses.reference(name, **options), Q, D, HARD, extras)
    sharded_extras = {k: v if k in losses.REPLICATED_EXTRAS else put(v) for k, v in extras.items()}
    (sh_loss, sh_m), sh_g = value_and_grad(
        losses.sharded(name, mesh, column_block=column_block, **options),
        put(Q), put(D), put(HARD), sharded_extras)

    assert float(ref_loss) > 0.01  # a real loss, not a degenerate zero
    assert 0 < float(ref_m["in_batch_p@1"]) < 1
    assert float(sh_loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert float(sh_m["in_batch_p@1"]) == pytest.approx(float(ref_m["in_batch_p@1"]), abs=1e-7)
    for arg, r, s in zip(("q", "d", "scale", "bias", "hard", "mixed"), ref_g, sh_g, strict=True):
        if arg in zero_grads or (arg in ("hard", "mixed") and not with_negatives):
            assert np.abs(np.asarray(r)).max() < 1e-5 and np.abs(np.asarray(s)).max() < 1e-5, arg
        else:
            assert np.linalg.norm(np.asarray(r)) > 1e-4, arg
            assert _rel_err(s, r) < 1e-5, arg


@pytest.mark.parametrize("name,options,which,zero_grads", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.slow
def test_sharded_loss_and_grads_equal_reference(name, options, which, zero_grads):
    _assert_sharded_equals_reference(name, options, which, zero_grads, column_block=0)


# Blockwise: the same checks with the columns streamed `column_block` at a time. 48 does
# not divide C = 64 + 64*2 + 8 = 200 (5 blocks, 40 padding columns) nor the 64 columns of
# the symmetric direction and of the no-negatives cases; 16 divides 64 (no mask at all).
BLOCK_CASES = [
    ("in_batch_softmax", {}, "log_q", {"bias"}, 48),
    ("in_batch_softmax", {"symmetric": True}, "log_q", {"bias"}, 48),
    ("in_batch_softmax", {}, "none", {"bias"}, 16),
    ("in_batch_sigmoid", {}, "negatives", set(), 48),
    ("in_batch_triplet_hardest", {}, "negatives", {"scale", "bias"}, 48),
    ("triplet_margin", {}, "negatives", {"scale", "bias"}, 48),
    ("triplet_margin", {"distance": "euclidean", "hard": True}, "negatives",
     {"scale", "bias"}, 48),
    ("sdml", {}, "log_q", {"scale", "bias"}, 48),
    ("pointwise_logistic", {}, "labels", set(), 48),
]


@pytest.mark.parametrize("name,options,which,zero_grads,column_block", BLOCK_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[4]}" for c in BLOCK_CASES])
def test_blockwise_loss_and_grads_equal_reference(name, options, which, zero_grads,
                                                  column_block):
    _assert_sharded_equals_reference(name, options, which, zero_grads, column_block)


@pytest.mark.slow
def test_blockwise_grad_never_holds_a_rows_by_all_columns_buffer():
    # 96 rows over 8 devices: b = 12 local rows, C = 96 + 96*2 + 8 = 296 columns. The
    # compiled per-device program of the plain loss + gradient holds f32[12,296] scores;
    # the blockwise one (64 columns a block) holds f32[12,64], and no buffer with a row
    # axis is larger than that, not even stacked over the 5 blocks for the backward pass.
    mesh = sharding.make_mesh()
    q, d, hard, mixed, ids, log_q, _ = _batch(b=96)
    put = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))
    extras = {k: v if k in losses.REPLICATED_EXTRAS else put(v)
              for k, v in {**ids, **log_q}.items()}
    args = (put(q), put(d), jnp.float32(5.0), jnp.float32(-1.0), put(hard), mixed)

    def buffers(column_block):
        loss = losses.sharded("in_batch_softmax", mesh, column_block, symmetric=True)

        def objective(q, d, scale, bias, hard, mixed):
            return loss(q, d, scale, bias, {**extras, "hard_negatives": hard,
                                            "mixed_negatives": mixed})[0]
        grad = jax.jit(jax.grad(objective, argnums=tuple(range(6))))
        hlo = grad.lower(*args).compile().as_text()
        shapes = re.findall(r"f32\[([\d,]+)\]", hlo)  # the per-device program's buffers
        return {tuple(int(n) for n in dims.split(",")) for dims in shapes}

    b, c = 12, 296
    with_rows = lambda shapes: {s for s in shapes if b in s}
    plain, blockwise = buffers(0), buffers(64)
    assert (b, c) in plain
    assert (b, 64) in blockwise
    largest = max(with_rows(blockwise), key=math.prod)
    assert math.prod(largest) == b * 64, sorted(with_rows(blockwise))
    assert not any(c in s or c + 24 in s for s in with_rows(blockwise))


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.slow
def test_sharded_loss_and_grads_equal_unsharded_global_batch_8192(shared):
    assert jax.device_count() == 8, "conftest sets 8 fake CPU devices"
    mesh = sharding.make_mesh()
    cfg = load_config("default").model
    cfg.embed_dim, cfg.hidden_dim, cfg.output_dim, cfg.shared_towers = 32, 64, 32, shared
    vocab, batch, max_len = 1000, 8192, 12
    model = dual_encoder.make_model(model_spec(cfg), vocab)
    params = dual_encoder.init_params(model, jax.random.key(0), max_len)
    rng = np.random.default_rng(0)
    ids = {k: rng.integers(1, vocab, (batch, max_len)).astype(np.int32) for k in ("q", "d")}
    mask = {k: (np.arange(max_len)[None] < rng.integers(1, max_len + 1, (batch, 1))) for k in ids}

    def loss_fn(params, q_ids, q_mask, d_ids, d_mask, loss):
        q, d, scale, bias = model.apply({"params": params}, q_ids, q_mask, d_ids, d_mask)
        return loss(q, d, scale, bias)

    def value_and_grad(loss, inputs):
        f = jax.jit(jax.value_and_grad(lambda p, *a: loss_fn(p, *a, loss), has_aux=True))
        return f(params, *inputs)

    plain = (ids["q"], mask["q"], ids["d"], mask["d"])
    (ref_loss, ref_m), ref_g = value_and_grad(losses.reference("in_batch_softmax"), plain)
    sharded_inputs = [jax.device_put(x, sharding.batch_sharding(mesh)) for x in plain]
    (sh_loss, sh_m), sh_g = value_and_grad(losses.sharded("in_batch_softmax", mesh), sharded_inputs)

    assert float(ref_loss) > 1.0  # a real loss, not a degenerate zero
    assert float(sh_loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert float(sh_m["in_batch_p@1"]) == pytest.approx(float(ref_m["in_batch_p@1"]), abs=1e-7)
    ref_leaves, sh_leaves = jax.tree.leaves(ref_g), jax.tree.leaves(sh_g)
    assert len(ref_leaves) == len(sh_leaves) >= 5
    for r, s in zip(ref_leaves, sh_leaves, strict=True):
        if r.shape == () and abs(float(r)) < 1e-6:
            # beta: a softmax over each row ignores a shift shared by the row, so its
            # gradient is zero up to rounding (~5e-10), which differs between the two.
            assert abs(float(s)) < 1e-6
            continue
        assert np.linalg.norm(np.asarray(r)) > 1e-4
        assert _rel_err(s, r) < 1e-5


# ----------------------------------------------------------------------------- extras checks
def test_extras_that_cannot_work_fail_with_what_would():
    q = jnp.eye(2)
    fn = losses.reference("in_batch_sigmoid")
    with pytest.raises(ValueError, match="applies to in_batch_softmax, sdml"):
        fn(q, q, ONE, ZERO, {"log_q_pos": jnp.zeros(2)})
    hard = {"doc_ids": jnp.array([1, 2]), "hard_negatives": jnp.ones((2, 1, 2))}
    with pytest.raises(ValueError, match="hard_negative_ids"):
        fn(q, q, ONE, ZERO, hard)
    losses.reference("in_batch_sigmoid", remove_accidental_hits=False)(q, q, ONE, ZERO, hard)
    with pytest.raises(ValueError, match="log_q_hard"):
        losses.reference("sdml")(q, q, ONE, ZERO, {"log_q_pos": jnp.zeros(2),
                                                   "hard_negatives": jnp.ones((2, 1, 2))})
    with pytest.raises(ValueError, match="known: doc_ids"):
        fn(q, q, ONE, ZERO, {"doc_id": jnp.array([1, 2])})
    with pytest.raises(ValueError, match="needs extras\\['labels'\\]"):
        losses.reference("pointwise_logistic")(q, q, ONE, ZERO)
    with pytest.raises(ValueError, match="one of: in_batch_softmax"):
        losses.reference("softmax")
    with pytest.raises(ValueError, match="its options: margin, remove_accidental_hits"):
        losses.sharded("in_batch_triplet_hardest", sharding.make_mesh(), symmetric=True)
    with pytest.raises(ValueError, match="column_block=-1 must be an int >= 0"):
        losses.sharded("in_batch_softmax", sharding.make_mesh(), column_block=-1)


# ----------------------------------------------------------------------------- logQ estimate
def test_streaming_frequency_converges_to_known_rates():
    # id 7 appears every 2 steps, id 8 every 10 steps, id 9 twice in every 5th step (counts
    # once per step). Yi et al.'s estimate B -> the gap, q = 1/B: q7/q8 -> 5.
    update = jax.jit(frequency.update_frequency, static_argnames="alpha")
    state = frequency.init_frequency(1024)
    for step in range(400):
        ids = [i for i, every in ((7, 2), (8, 10)) if step % every == 0]
        ids += [9, 9] if step % 5 == 0 else []
        if ids:
            state = update(state, jnp.array(ids), step, alpha=0.1)
    q7, q8, q9 = np.exp(np.asarray(frequency.log_q(state, jnp.array([7, 8, 9]))))
    assert q7 / q8 == pytest.approx(5, rel=0.2)
    assert q7 == pytest.approx(1 / 2, rel=0.1)
    assert q8 == pytest.approx(1 / 10, rel=0.2)
    assert q9 == pytest.approx(1 / 5, rel=0.2)
    assert jax.tree.map(jnp.shape, state) == frequency.StreamingFrequency((1024,), (1024,))


# ----------------------------------------------------------------------------- config checks
def _validate(**loss):
    cfg = load_config("tiny")
    for key, value in loss.items():
        cfg.loss[key] = value
    config_lib.validate(cfg, 8)
    return cfg


def test_config_accepts_every_in_batch_loss_and_passes_its_options():
    for name in ("in_batch_softmax", "in_batch_sigmoid", "in_batch_triplet_hardest",
                 "triplet_margin", "sdml"):
        _validate(name=name)
    cfg = _validate(name="triplet_margin", distance="euclidean", hard=True, margin=0.2)
    assert loss_options(cfg.loss) == {"distance": "euclidean", "margin": 0.2,
                                               "hard": True, "remove_accidental_hits": True}
    cfg = _validate(name="sdml", label_smoothing=0.1)
    assert losses.resolve_options("sdml", loss_options(cfg.loss))["label_smoothing"] == 0.1
    _validate(name="sdml", column_block=1024)
    cfg = _validate(name="triplet_margin", distance="squared_euclidean")
    resolved = losses.resolve_options("triplet_margin", loss_options(cfg.loss))
    assert resolved["margin"] == 0.5


@pytest.mark.parametrize("loss,message", [
    ({"name": "softmax"}, "config.loss.name='softmax' is not one of: in_batch_softmax"),
    ({"name": "pointwise_logistic"}, "labelled negative pairs"),
    ({"name": "sdml", "symmetric": True}, "loss.symmetric=True only applies to in_batch_softmax"),
    ({"name": "triplet_margin", "distance": "manhattan"},
     "config.loss.distance='manhattan' is not one of: cosine, euclidean, squared_euclidean"),
    ({"name": "in_batch_softmax", "hard": True}, "loss.hard=True only applies to triplet_margin"),
    ({"name": "in_batch_sigmoid", "margin": 0.2},
     "loss.margin=0.2 only applies to in_batch_triplet_hardest, triplet_margin"),
    ({"name": "sdml", "label_smoothing": 1.0}, "config.loss.label_smoothing=1.0 must be in"),
    ({"name": "sdml", "sdml_scale": 0.0}, "config.loss.sdml_scale=0.0 must be > 0"),
    ({"name": "in_batch_softmax", "column_block": -64},
     "config.loss.column_block=-64 must be an int >= 0"),
])
def test_config_rejects_losses_that_cannot_work(loss, message):
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        _validate(**loss)


def test_the_dual_encoder_objective_streams_config_loss_column_block(monkeypatch):
    seen = []
    real = losses.sharded

    def spy(name, mesh, column_block=0, **options):
        seen.append(column_block)
        return real(name, mesh, column_block, **options)

    monkeypatch.setattr(losses, "sharded", spy)
    cfg = _validate(name="in_batch_softmax", column_block=256)
    objectives.make(objective_spec(cfg), dual_encoder.make_model(model_spec(cfg.model), 100),
                    sharding.make_mesh())
    assert seen == [256]
