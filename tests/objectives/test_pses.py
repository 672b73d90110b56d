"""PSES (Li & Jia 2018): each loss term by hand (and as the objective wires them from the
model's codes), the sharded orthogonality and the two players' step on 8 devices equal to
one device, the objective's own critic (clipped after every update of a step, raising the
Wasserstein estimate the encoders lower), two-player exact resume, fine-tuning NN_s
alone, and the BM25 pseudo-labels it trains on (from a query file or the training
queries)."""
import dataclasses
import os

import conftest
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import tasks_of
from helpers import preempt_at, tiny, train_rows  # noqa: E402
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dualjax import errors, models, objectives
from dualjax.config import validation as config_lib
from dualjax.config.specs import dataset_spec, model_spec, objective_spec
from dualjax.data import builders, mining, reqa
from dualjax.models import pses as pses_model
from dualjax.objectives import pses
from dualjax.runtime import sharding
from dualjax.train import loop as train

HERE = str(conftest.TESTS)
SQUAD = os.path.join(HERE, "..", "..", "shared", "data", "squad", "dev-v1.1.json")


def tiny_pses(**overrides):
    """A tiny PSES run on 2 devices (a sharded batch, and quicker to compile than 8)."""
    return tiny(**{"model.name": "pses", "model.tower": "bow", "model.pses.hidden_dim": 16,
                   "model.pses.shared_dim": 8, "model.pses.specific_dim": 4,
                   "loss.pses.critic_hidden_dim": 8, "loss.pses.critic_steps": 2,
                   "eval.index": "exact", "mesh.num_devices": 2, **overrides})


def pses_objective(mesh=None, **overrides):
    """(config, model, objective) of `tiny_pses(**overrides)` over 60 token ids, on
    `mesh` (default: the config's 2 devices)."""
    cfg = tiny_pses(**overrides)
    model = models.make_model(model_spec(cfg.model), 60)
    mesh = mesh or sharding.make_mesh(cfg.mesh.num_devices)
    return cfg, model, objectives.make(objective_spec(cfg), model, mesh)


def critic_state(critic, seed: int = 1) -> dict:
    """A fresh critic's state (jitted: op by op, its init compiles every op)."""
    return jax.jit(lambda rng: objectives.init_critic_state(critic, rng))(jax.random.key(seed))


def token_batch(rows: int = 16, seed: int = 0) -> dict:
    """A batch of `rows` random (query, document) token sequences of 16 ids in [1, 60)."""
    rng = np.random.default_rng(seed)
    batch = {k: jnp.asarray(rng.integers(1, 60, (rows, 16)), jnp.int32)
             for k in ("q_ids", "d_ids")}
    batch.update(q_mask=jnp.ones((rows, 16), bool), d_mask=jnp.ones((rows, 16), bool),
                 doc_ids=jnp.arange(rows))
    return batch


# ----------------------------------------------------------------------------- terms
def test_pairwise_hinge_by_hand():
    q = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    d = jnp.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    # shift 1: row i's negative is row i-1's document: d2, d0, d1.
    # row 0: q.d+ = 1, q.d- = 0    -> max(0, 0.5 - 1) = 0
    # row 1: q.d+ = 0.8, q.d- = 0  -> 0
    # row 2: q.d+ = 0, q.d- = 0.6  -> 0.5 + 0.6 = 1.1
    assert float(pses.pairwise_hinge(q, d, 1, 0.5)) == pytest.approx(1.1 / 3)
    # Row 2's negative is one of its positives (same cluster): only rows 0 and 1 count.
    same = jnp.array([False, False, True])
    assert float(pses.pairwise_hinge(q, d, 1, 0.5, same)) == pytest.approx(0.0)
    batch = {"doc_ids": jnp.array([4, 5, 4]), "cluster_ids": jnp.array([0, 1, 2])}
    np.testing.assert_array_equal(pses.same_as_rolled(batch, 1), [True, False, False])


def test_orthogonality_reconstruction_and_weights_by_hand():
    shared = jnp.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    specific = jnp.array([[1.0], [1.0], [0.0]])
    # Z_s^T Z = [[1], [2]]: squared Frobenius norm 5.
    assert float(pses.orthogonality_reference(shared, specific)) == pytest.approx(5.0)
    c = pses_model.Codes(x=jnp.array([[1.0, 2.0], [0.0, 0.0]]), shared=None, specific=None,
                         reconstruction=jnp.array([[0.0, 2.0], [3.0, 4.0]]))
    assert float(pses.reconstruction(c)) == pytest.approx((1 + 25) / 2)
    # x is a target: the reconstruction's gradient reaches the decoder side only.
    grad_x = jax.grad(lambda x: pses.reconstruction(c._replace(x=x)))(c.x)
    np.testing.assert_array_equal(grad_x, 0)
    params = {"trunk": {"embed": {"embedding": jnp.ones((5, 2))}},
              "shared": {"hidden_0": {"kernel": jnp.full((2, 2), 2.0), "bias": jnp.ones(2)},
                         "output": {"kernel": jnp.ones((2, 1))}}}
    assert float(pses.weight_penalty(params)) == pytest.approx(4 * 4 + 2)


@pytest.mark.slow
def test_weight_penalty_counts_the_transformer_s_attention_weights():
    # A Transformer trunk: its attention projections are params named query_kernel,
    # key_kernel, value_kernel and out_kernel ([width, heads, kv] / [heads, kv, width]);
    # they count with every Dense kernel, and no table, bias, norm, [CLS] or similarity
    # param does.
    _, _, objective = pses_objective(**{
        "model.tower": "transformer", "model.transformer.num_layers": 2,
        "model.transformer.width": 16, "model.transformer.num_heads": 2,
        "model.transformer.mlp_dim": 32, "model.transformer.max_positions": 16,
        "model.max_len": 16})
    params = jax.jit(objective.init)(jax.random.key(0))
    flat = flax.traverse_util.flatten_dict(params)
    squares = lambda keep: sum(float(np.sum(np.asarray(x, np.float64) ** 2))
                               for path, x in flat.items() if keep(path))
    attention = lambda path: path[-2:-1] == ("attn",) and path[-1].endswith("_kernel")
    assert sum(map(attention, flat)) == 2 * 4  # 2 layers x query, key, value, out
    assert squares(attention) > 0
    dense = lambda path: path[-1] == "kernel"
    assert {path[1] for path in flat if path[0] == "trunk" and dense(path)} == {
        "layer_0", "layer_1", "output"}  # the MLPs' mlp_in, mlp_out and the output layer
    not_weights = {"embedding", "pos_embed", "cls", "bias", "scale", "alpha", "beta"}
    assert all(dense(p) or attention(p) or p[-1] in not_weights or p[-1].endswith("_bias")
               for p in flat)
    penalty = float(jax.jit(pses.weight_penalty)(params))
    assert penalty == pytest.approx(squares(dense) + squares(attention), rel=1e-5)
    assert penalty - squares(dense) == pytest.approx(squares(attention), rel=1e-3)


def test_wasserstein_estimate_and_critic_accuracy_by_hand():
    f_q, f_d = jnp.array([0.3, 0.1, 0.2, -0.4]), jnp.array([-0.1, 0.0])
    assert float(pses.wasserstein(f_q, f_d)) == pytest.approx(0.05 - (-0.05))
    # Midpoint of the means 0: queries above it 3 of 4, documents at or below 2 of 2.
    assert float(pses.critic_accuracy(f_q, f_d)) == pytest.approx((0.75 + 1.0) / 2)
    # f is the log-odds of "query" under the critic's softmax over {query, document}.
    net = pses.CriticNet(3)
    params = net.init(jax.random.key(0), jnp.zeros((1, 2)))["params"]
    z = jnp.array([[0.5, -1.0]])
    logits = net.apply({"params": params}, z)
    p = jax.nn.softmax(logits)[0]
    assert float(pses.critic_value(net, params, z)[0]) == pytest.approx(
        float(jnp.log(p[0] / p[1])), rel=1e-5)


def _sharded(x, mesh):
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def test_sharded_orthogonality_equals_one_device():
    mesh = sharding.make_mesh()
    assert mesh.devices.size == 8
    rng = np.random.default_rng(0)
    shared = jnp.asarray(rng.normal(size=(16, 5)), jnp.float32)
    specific = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    ref = jax.value_and_grad(pses.orthogonality_reference, argnums=(0, 1))(shared, specific)
    got = jax.jit(jax.value_and_grad(pses.orthogonality(mesh), argnums=(0, 1)))(
        _sharded(shared, mesh), _sharded(specific, mesh))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for a, b in zip(got[1], ref[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_critic_update_and_loss_on_8_devices_equal_one_device():
    """A train step's two players (update_critic's 3 updates, then the objective's loss
    reading the updated critic) with the batch split over an 8-device mesh give the
    critic state, the critic's metrics and every loss term of a 1-device mesh."""
    overrides = {"loss.pses.pairwise": "in_batch", "loss.pses.critic_steps": 3,
                 "loss.pses.critic_learning_rate": 1e-2, "loss.pses.critic_clip": 0.05}
    _, _, objective = pses_objective(sharding.make_mesh(1), **overrides)
    params = jax.jit(objective.init)(jax.random.key(0))
    start = critic_state(objective.critic)
    batch = token_batch()
    out = {}
    for n in (8, 1):
        mesh = sharding.make_mesh(n)
        _, _, objective = pses_objective(mesh, **overrides)

        @jax.jit
        def players(start, params, batch, objective=objective):
            state, critic_metrics = objectives.update_critic(
                objective.critic, start, params, batch, jax.random.key(1))
            loss, terms = objective.loss(params, batch, jax.random.key(2),
                                         {"critic": state["params"], "doc_ids": batch["doc_ids"]})
            return state, {**critic_metrics, **terms, "loss": loss}

        replicated = sharding.replicated(mesh)
        out[n] = jax.device_get(players(jax.device_put(start, replicated),
                                        jax.device_put(params, replicated),
                                        jax.device_put(batch, sharding.batch_sharding(mesh))))
    (critic8, m8), (critic1, m1) = out[8], out[1]
    assert int(critic8["step"]) == 3
    assert set(m8) == set(m1) >= {"pairwise", "orthogonality", "adversarial", "reconstruction",
                                  "regularization", "wasserstein", "critic_accuracy",
                                  "critic_loss", "critic_weight_max"}
    for key in m1:
        np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert float(m1["orthogonality"]) > 0 and abs(float(m1["adversarial"])) > 1e-4
    for a, b in zip(jax.tree.leaves(critic8), jax.tree.leaves(critic1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- critic
def _separable_critic(steps: int, clip: float, lr: float = 1e-2):
    """The PSES objective's own critic (its loss, optimizer, clip), reading fixed shared
    codes where queries and documents differ by a shift."""
    _, _, objective = pses_objective(**{
        "model.pses.shared_dim": 4, "loss.pses.critic_hidden_dim": 8,
        "loss.pses.critic_steps": steps, "loss.pses.critic_clip": clip,
        "loss.pses.critic_learning_rate": lr})
    rng = np.random.default_rng(0)
    base = rng.normal(size=(64, 4)).astype(np.float32)
    z_q, z_d = jnp.asarray(base[:32] + 1.0), jnp.asarray(base[32:] - 1.0)
    critic = objective.critic
    assert (critic.steps, critic.clip) == (steps, clip)
    return dataclasses.replace(critic, inputs=lambda params, batch, rng: (z_q, z_d))


@pytest.mark.slow
def test_critic_weights_are_clipped_after_every_update():
    critic = _separable_critic(steps=1, clip=0.01)
    state = objectives.init_critic_state(critic, jax.random.key(0))
    update = jax.jit(lambda s: objectives.update_critic(critic, s, {}, {}, jax.random.key(1)))
    for _ in range(5):
        state, _ = update(state)
        bound = max(float(jnp.abs(w).max()) for w in jax.tree.leaves(state["params"]))
        assert bound <= 0.01 + 1e-9
    assert int(state["step"]) == 5
    # Unclipped, the same updates leave [-0.01, 0.01] (the clip is what holds them).
    free = _separable_critic(steps=5, clip=0.0)
    s, _ = objectives.update_critic(free, objectives.init_critic_state(free, jax.random.key(0)),
                                    {}, {}, jax.random.key(1))
    assert max(float(jnp.abs(w).max()) for w in jax.tree.leaves(s["params"])) > 0.02


def test_critic_learns_to_tell_queries_from_documents():
    critic = _separable_critic(steps=1, clip=0.01)
    state = objectives.init_critic_state(critic, jax.random.key(3))
    _, before = critic.loss(state["params"], critic.inputs({}, {}, None))
    state, after = jax.jit(lambda s: objectives.update_critic(
        dataclasses.replace(critic, steps=50), s, {}, {}, jax.random.key(1)))(state)
    assert int(state["step"]) == 50
    assert float(after["wasserstein"]) > float(before["wasserstein"]) + 1e-3
    assert float(after["critic_accuracy"]) > 0.9 > float(before["critic_accuracy"])


def test_every_critic_update_inside_a_step_is_clipped():
    """With critic_steps > 1, every update of the scan is clipped, not only the last:
    update_critic reports the largest |weight| held after any of the step's updates."""
    critic = _separable_critic(steps=5, clip=0.01)
    start = critic_state(critic, 0)
    state, m = jax.jit(lambda s: objectives.update_critic(
        critic, s, {}, {}, jax.random.key(1)))(start)
    assert int(state["step"]) == 5
    assert 0.009 < float(m["critic_weight_max"]) <= 0.01 + 1e-9
    # One unclipped update from the same weights already leaves [-0.01, 0.01]: clipping
    # once after the 5 updates would let the next 4 read weights out of bounds.
    free = dataclasses.replace(critic, steps=1, clip=0.0)
    _, m = objectives.update_critic(free, start, {}, {}, jax.random.key(1))
    assert float(m["critic_weight_max"]) > 0.02


@pytest.mark.slow
def test_critic_ascends_and_the_encoders_descend_the_wasserstein_estimate():
    """The objective's own players on one fixed batch: the critic's updates raise the
    Wasserstein estimate W of the current shared codes, the loss's adversarial term is
    that W under the updated critic, and an encoder step on the adversarial term alone
    (the loss minus its pairwise part, the other weights 0) lowers it."""
    _, _, objective = pses_objective(**{
        "loss.pses.critic_steps": 5, "loss.pses.critic_learning_rate": 1e-2,
        "loss.pses.orthogonality_weight": 0.0, "loss.pses.reconstruction_weight": 0.0,
        "loss.pses.regularization_weight": 0.0, "loss.pses.adversarial_weight": 1.0})
    critic, batch, rng = objective.critic, token_batch(), jax.random.key(2)
    params = jax.jit(objective.init)(jax.random.key(0))
    start = critic_state(critic)
    w_of = lambda cparams, p: critic.loss(cparams, critic.inputs(p, batch, rng))[1]["wasserstein"]

    @jax.jit
    def play(start, params):
        state, m = objectives.update_critic(critic, start, params, batch, rng)
        extras = {"critic": state["params"], "doc_ids": batch["doc_ids"]}
        adversarial = lambda p: (lambda out: (out[0] - out[1]["pairwise"], out[1]))(
            objective.loss(p, batch, rng, extras))
        (value, terms), grads = jax.value_and_grad(adversarial, has_aux=True)(params)
        norm = optax.tree.norm(grads)
        moved = jax.tree.map(lambda p, g: p - 0.1 * g / norm, params, grads)
        return (state, m, value, terms, w_of(start["params"], params),
                w_of(state["params"], params), w_of(state["params"], moved))

    state, m, value, terms, w_start, w_critic, w_encoders = play(start, params)
    assert int(state["step"]) == 5
    # The critic maximises W: W rose under its updates (its loss is -W).
    assert float(w_critic) > float(w_start) + 1e-4, (w_start, w_critic)
    assert float(m["critic_loss"]) == pytest.approx(-float(m["wasserstein"]), rel=1e-6)
    # A step against the adversarial term's gradient lowers the critic's W ...
    assert float(w_encoders) < float(w_critic) - 0.1 * abs(float(w_critic)), (
        w_critic, w_encoders)
    # ... as the term is W under the updated critic, with weight +1 in the loss.
    assert float(terms["adversarial"]) == pytest.approx(float(w_critic), rel=1e-5)
    assert float(value) == pytest.approx(float(w_critic), abs=1e-6)  # total - pairwise


# ----------------------------------------------------------------------------- model
def test_retrieval_vectors_concatenate_or_keep_the_shared_code():
    c = pses_model.Codes(x=None, shared=jnp.array([[3.0, 0.0]]), specific=jnp.array([[4.0]]),
                         reconstruction=None)
    np.testing.assert_allclose(pses_model.retrieval_vector(c, "concat"), [[0.6, 0.0, 0.8]])
    np.testing.assert_allclose(pses_model.retrieval_vector(c, "shared"), [[1.0, 0.0]])


@pytest.mark.parametrize("pairwise", ["hinge", "in_batch"])
@pytest.mark.slow
def test_objective_loss_is_the_weighted_sum_of_its_terms(pairwise):
    cfg = tiny_pses(**{"loss.pses.orthogonality_weight": 0.5, "loss.pses.adversarial_weight": 2.0,
                       "loss.pses.reconstruction_weight": 0.25,
                       "loss.pses.regularization_weight": 0.125, "loss.pses.pairwise": pairwise})
    mesh = sharding.make_mesh()
    model = models.make_model(model_spec(cfg.model), 60)
    objective = objectives.make(objective_spec(cfg), model, mesh)
    params = jax.jit(objective.init)(jax.random.key(0))
    assert set(params) == {"trunk", "shared", "query_specific", "doc_specific", "query_decoder",
                           "doc_decoder", "alpha", "beta"}
    critic = jax.jit(objective.critic.init)(jax.random.key(1))  # unclipped: a larger W
    batch = token_batch()
    loss, m = jax.jit(objective.loss)(params, batch, jax.random.key(2),
                                      {"critic": critic, "doc_ids": batch["doc_ids"]})
    expected = (m["pairwise"] + 0.5 * m["orthogonality"] + 2.0 * m["adversarial"]
                + 0.25 * m["reconstruction"] + 0.125 * m["regularization"])
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)

    # Each term by hand (float64) from the model's codes: each side's own spaces.
    q, d, _, _ = jax.jit(lambda p: model.apply({"params": p}, batch["q_ids"], batch["q_mask"],
                                               batch["d_ids"], batch["d_mask"]))(params)
    q, d = (pses_model.Codes(*(np.asarray(x, np.float64) for x in c)) for c in (q, d))
    ortho = sum(np.sum((c.shared.T @ c.specific) ** 2) for c in (q, d))
    recon = sum(np.mean(np.sum((c.reconstruction - c.x) ** 2, axis=-1)) for c in (q, d))
    w = jax.tree.map(lambda x: np.asarray(x, np.float64), critic)

    def f(z):  # the critic: ReLU hidden layer, logits over {query, document}, log-odds
        h = np.maximum(z @ w["hidden"]["kernel"] + w["hidden"]["bias"], 0.0)
        logits = h @ w["output"]["kernel"] + w["output"]["bias"]
        return logits[:, 0] - logits[:, 1]

    adversarial = f(q.shared).mean() - f(d.shared).mean()
    regularization = sum(np.sum(np.asarray(x, np.float64) ** 2) for path, x in
                         flax.traverse_util.flatten_dict(params).items()
                         if path[-1] == "kernel" or path[-1].endswith("_kernel"))
    assert float(m["orthogonality"]) == pytest.approx(ortho, rel=1e-4) and ortho > 0
    assert float(m["reconstruction"]) == pytest.approx(recon, rel=1e-4) and recon > 0
    assert float(m["adversarial"]) == pytest.approx(adversarial, rel=1e-4)
    assert abs(adversarial) > 1e-3
    assert float(m["regularization"]) == pytest.approx(regularization, rel=1e-4)
    if pairwise == "in_batch":  # the in-batch softmax over the retrieval vectors, scale 10
        encode_q, encode_d = models.make_encoders(model)
        q = encode_q(params, {"ids": batch["q_ids"], "mask": batch["q_mask"]})
        d = encode_d(params, {"ids": batch["d_ids"], "mask": batch["d_mask"]})
        logits = 10.0 * np.asarray(q) @ np.asarray(d).T
        ref = -np.mean(np.diag(jax.nn.log_softmax(logits, axis=1)))
        assert float(m["pairwise"]) == pytest.approx(float(ref), rel=1e-5)


# ----------------------------------------------------------------------------- training
TRAINED = {"loss.pses.critic_learning_rate": 1e-3, "eval.hybrid": "bm25"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny PSES run of 20 steps: (its workdir, its results)."""
    whole = str(tmp_path_factory.mktemp("pses") / "whole")
    return whole, train.train_and_evaluate(tiny_pses(**TRAINED), whole)


@pytest.mark.slow
def test_pses_trains_both_players_and_resumes_exactly(tmp_path, trained):
    cfg = tiny_pses(**TRAINED)
    (whole, results), split = trained, str(tmp_path / "split")
    assert {"pses [exact]", "pses+bm25 [exact]"} <= set(results)  # and its hybrid search
    rows = train_rows(whole)
    for key in ("pairwise", "orthogonality", "adversarial", "reconstruction", "regularization",
                "wasserstein", "critic_accuracy", "critic_loss"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert len({round(r["critic_accuracy"], 6) for r in rows}) > 1  # the critic moves
    assert all(r["critic_weight_max"] <= cfg.loss.pses.critic_clip + 1e-9 for r in rows)

    with pytest.raises(errors.Preempted):
        train.train_and_evaluate(cfg, split, hooks=[preempt_at(7)])
    train.train_and_evaluate(cfg, split)
    path = lambda w: os.path.join(w, "checkpoints", "20", "state")
    a, b = (ocp.PyTreeCheckpointer().restore(path(w)) for w in (whole, split))
    assert int(a["critic"]["step"]) == 20 * cfg.loss.pses.critic_steps
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    # towers, critic, both optimizers, both counts
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(x, y)
    for w in jax.tree.leaves(a["critic"]["params"]):
        assert np.abs(w).max() <= cfg.loss.pses.critic_clip + 1e-9


@pytest.mark.slow
def test_exported_pses_encodes_as_the_model(tmp_path, trained):
    from dualjax import export
    from dualjax.train import trained as trained_lib
    encoder = export.export(trained[0], str(tmp_path / "bundle"), platforms=("cpu",))
    assert encoder.meta["model"] == "pses" and encoder.dim == 8 + 4  # [z_s; z_q]
    model = trained_lib.load_trained(trained[0])
    texts = ["how do i fix my car", "what is the best phone", ""]
    encode_q, encode_d = models.make_encoders(model.model)
    np.testing.assert_allclose(encoder.encode_queries(texts),
                               encode_q(model.params, model.inputs.query.encode(texts)), atol=1e-6)
    np.testing.assert_allclose(encoder.encode_documents(texts),
                               encode_d(model.params, model.inputs.document.encode(texts)),
                               atol=1e-6)


@pytest.mark.slow
def test_fine_tuning_the_shared_encoder_alone():
    """loss.pses.trainable=shared: the optimizer moves NN_s (and the similarity) only."""
    cfg = tiny_pses(**{"loss.pses.trainable": "shared", "loss.pses.pairwise": "in_batch"})
    model = models.make_model(model_spec(cfg.model), 60)
    objective = objectives.make(objective_spec(cfg), model, sharding.make_mesh())
    params = jax.jit(objective.init)(jax.random.key(0))
    critic = objectives.init_critic_state(objective.critic, jax.random.key(1))["params"]
    rng = np.random.default_rng(0)
    batch = {k: jnp.asarray(rng.integers(1, 60, (16, 16)), jnp.int32) for k in ("q_ids", "d_ids")}
    batch.update(q_mask=jnp.ones((16, 16), bool), d_mask=jnp.ones((16, 16), bool))
    tx = objectives.restrict(optax.adam(1e-2), objective)

    @jax.jit
    def step(params):
        grads = jax.grad(lambda p: objective.loss(p, batch, jax.random.key(2),
                                                  {"critic": critic})[0])(params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return grads, optax.apply_updates(params, updates)

    grads, after = step(params)
    moved = {k for k in params if any(not np.array_equal(x, y) for x, y in
                                      zip(jax.tree.leaves(params[k]), jax.tree.leaves(after[k]),
                                          strict=True))}
    has_grad = {k for k in params if any(np.abs(g).max() > 0 for g in jax.tree.leaves(grads[k]))}
    assert {"trunk", "query_specific", "doc_decoder"} <= has_grad  # they would move ...
    assert "shared" in moved and moved <= {"shared", "alpha", "beta"}  # ... only these do


def test_pses_config_errors():
    for overrides, match in (
            ({"model.pses.score": "sum"}, "model.pses.score"),
            ({"loss.pses.pairwise": "listwise"}, "loss.pses.pairwise"),
            ({"loss.pses.critic_steps": 0}, "loss.pses.critic_steps"),
            ({"model.pses.hidden_layers": 0}, "model.pses.hidden_layers=0 must be 1, 2 or 3"),
            ({"model.pses.hidden_layers": 4}, "model.pses.hidden_layers=4 must be 1, 2 or 3"),
            ({"loss.pses.adversarial_weight": -1.0}, "loss.pses.adversarial_weight"),
            ({"model.tower": "bow_mlp", "model.query_features": "brand",
              "model.doc_features": "brand"}, "reads text only"),
            ({"data.hard_negatives": 2}, "hard_negatives"),
            ({"data.pseudo_labels": 2, "data.hard_negatives": 2}, "pseudo_labels"),
            ({"data.pseudo_label_queries": "q.txt"}, "pseudo_labels > 0")):
        with pytest.raises(errors.ConfigError, match=match):
            config_lib.validate(tiny_pses(**overrides), 8)
    for layers in (1, 3):
        config_lib.validate(tiny_pses(**{"model.pses.hidden_layers": layers}), 8)


# ----------------------------------------------------------------------------- weak labels
def test_pseudo_labels_are_bm25_top_k_clustered_by_query():
    corpus = ["red apples grow on trees", "green pears", "apples and pears", "blue sky"]
    pairs, clusters = mining.pseudo_label_pairs(
        ["apples", "pears", "apples", "sky"], corpus, 2)
    # "apples": the short "apples and pears" outranks the longer document (BM25 length
    # normalisation); "pears": likewise; "sky": one match only. The repeated query once.
    assert pairs == [("apples", "apples and pears"), ("apples", "red apples grow on trees"),
                     ("pears", "green pears"), ("pears", "apples and pears"),
                     ("sky", "blue sky")]
    assert clusters == [0, 0, 1, 1, 2]


@pytest.mark.slow
def test_weakly_supervised_pairs_table_from_a_query_file(tmp_path):
    """data.pseudo_labels with data.pseudo_label_queries: the pairs table holds those
    queries with BM25's documents, one cluster per query."""
    queries = tmp_path / "queries.txt"
    queries.write_text("how do i learn python\n\nwhat is the capital of france\n")
    cfg = tiny(**{"data.pseudo_labels": 3, "data.pseudo_label_queries": str(queries)})
    task = tasks_of(cfg, str(tmp_path / "run"))[0]
    source = task.train_source
    records = [source[i] for i in range(len(source))]
    assert {r["query"].decode() for r in records} <= {"how do i learn python",
                                                      "what is the capital of france"}
    assert 1 <= len(records) <= 6
    by_query = {}
    for r in records:  # one cluster per query
        by_query.setdefault(r["query"], set()).add(int(r["cluster"]))
    assert all(len(c) == 1 for c in by_query.values())
    assert len({next(iter(c)) for c in by_query.values()}) == len(by_query)
    # ... and a run trains on them (two steps, batch 8).
    cfg.update_from_flattened_dict({"num_train_steps": 2, "global_batch_size": 8,
                                    "eval.index": "exact"})
    train.train_and_evaluate(cfg, str(tmp_path / "run"))
    assert [r["step"] for r in train_rows(tmp_path / "run")] == [2]


def test_weakly_supervised_pairs_table_from_the_training_queries(tmp_path):
    """data.pseudo_labels without a query file (the default): the pairs table holds the
    training split's queries, each paired with BM25's top documents of the dataset, not
    with its labelled document. Query i is the word w_i; its labelled document names
    w_(i+1) only, so BM25's one match for w_i is document i-1 (another pair's label)."""
    w = ["apple", "bridge", "candle", "dolphin", "engine", "forest", "guitar", "harbor",
         "island", "jacket", "kettle", "lemon", "meadow", "needle", "orchid", "pepper",
         "quartz", "river", "saddle", "tunnel"]
    n = len(w)
    doc = [f"notes on {w[(i + 1) % n]} page {i}" for i in range(n)]
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{w[i]}\t{doc[i]}\n" for i in range(n)))
    tfds_dir = str(tmp_path / "tfds")

    def table(pseudo_labels: int) -> list[tuple[str, str, int]]:
        data = tiny(**{"data.name": "pairs", "data.path": str(path), "data.val_fraction": 0.2,
                       "data.test_fraction": 0.2, "data.pseudo_labels": pseudo_labels}).data
        source = builders.train_source(dataset_spec(data, 0), tfds_dir)
        return [(r["query"].decode(), r["document"].decode(), int(r["cluster"]))
                for r in (source[i] for i in range(len(source)))]

    labelled = table(0)
    train_ids = sorted(w.index(q) for q, _, _ in labelled)
    assert {(q, d) for q, d, _ in labelled} == {(w[i], doc[i]) for i in train_ids}
    assert 8 <= len(train_ids) < n  # the other pairs are val and test
    weak = table(3)
    assert sorted((q, d) for q, d, _ in weak) == sorted((w[i], doc[i - 1]) for i in train_ids)
    assert not {(q, d) for q, d, _ in weak} & {(q, d) for q, d, _ in labelled}
    assert len({c for _, _, c in weak}) == len(weak)  # one cluster per query


@pytest.mark.skipif(not os.path.exists(SQUAD), reason="needs ../shared/data/squad")
def test_squad_paragraphs_as_candidates():
    squad = reqa.read_squad(SQUAD, paragraphs=True)
    assert len(squad.candidates) == 2067  # SQuAD v1.1 dev's paragraphs
    a, question, relevant = squad.questions[0]
    assert len(relevant) == 1 and squad.candidates[relevant[0]][0] == a
    # Every answer of the first question lies in its paragraph.
    sentences = reqa.read_squad(SQUAD)
    assert sentences.candidates[sentences.questions[0][2][0]][1] in squad.candidates[relevant[0]][1]
