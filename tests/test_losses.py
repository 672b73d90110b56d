"""In-batch losses: hand-computed values and sharded == unsharded on 8 devices."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_config
from dualjax import losses, sharding
from dualjax.models import dual_encoder


def test_in_batch_softmax_hand_computed_3x3():
    # q = d = identity rows; scale 2, bias 0.5 -> logits = 2*I + 0.5.
    # Each row: positive logit 2.5, two negatives 0.5.
    # loss_i = log(e^2.5 + 2 e^0.5) - 2.5 = log(1 + 2 e^-2)
    q = jnp.eye(3)
    loss, metrics = losses.in_batch_softmax(q, q, jnp.float32(2.0), jnp.float32(0.5))
    assert float(loss) == pytest.approx(math.log(1 + 2 * math.exp(-2)), rel=1e-6)
    assert float(metrics["in_batch_p@1"]) == 1.0


def test_in_batch_softmax_precision_counts_misses():
    # Row 0's best column is column 1 (cos 1 vs 0.6), rows 1 and 2 are right.
    q = jnp.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    d = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    loss, metrics = losses.in_batch_softmax(q, d, jnp.float32(1.0), jnp.float32(0.0))
    # loss_0 = log(e^.6 + e^.8 + e^0) - .6 ; loss_1 = loss_2 = log(e + 2) - 1
    expected = (math.log(math.exp(.6) + math.exp(.8) + 1) - .6 + 2 * (math.log(math.e + 2) - 1)) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["in_batch_p@1"]) == pytest.approx(2 / 3)


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("shared", [True, False])
def test_sharded_loss_and_grads_equal_unsharded_global_batch_8192(shared):
    assert jax.device_count() == 8, "conftest sets 8 fake CPU devices"
    mesh = sharding.make_mesh()
    cfg = load_config("default").model
    cfg.embed_dim, cfg.hidden_dim, cfg.output_dim, cfg.shared_towers = 32, 64, 32, shared
    vocab, batch, max_len = 1000, 8192, 12
    model = dual_encoder.make_model(cfg, vocab)
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
    for r, s in zip(ref_leaves, sh_leaves):
        assert np.linalg.norm(np.asarray(r)) > 0
        assert _rel_err(s, r) < 1e-5
