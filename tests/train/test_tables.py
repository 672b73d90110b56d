"""optimizer.table_updates="lazy" (dualjax/train/lazy_rows.py): a step updates only the token
rows its batch reads, with every other param and the step count as dense Adam has them."""

import jax
import numpy as np
import pytest
from conftest import load_config
from jax.sharding import PartitionSpec as P

from dualjax import errors, losses
from dualjax.config import specs
from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec
from dualjax.models import dual_encoder
from dualjax.objectives import in_batch as de_objective
from dualjax.objectives.optimizer import make_optimizer
from dualjax.runtime import sharding
from dualjax.train import lazy_rows
from dualjax.train import step as step_lib

# Tables of 4,096 x 8, twice sharding.FSDP_MIN_SIZE elements: "fsdp" splits their rows over
# the devices. At most 96 rows read per side and step: most untouched.
VOCAB, B, L = 4096, 16, 6


def batch(seed, place=True):
    rng = np.random.default_rng(seed)
    out = {}
    for side in ("q", "d"):
        out[f"{side}_ids"] = rng.integers(1, VOCAB, (B, L)).astype(np.int32)
        out[f"{side}_mask"] = np.arange(L) < rng.integers(1, L + 1, (B, 1))
    return sharding.put_global_batch(out, sharding.make_mesh()) if place else out


def run(table_updates, batches, shared_towers=False, shared_embedding=False, chunks=0,
        param_sharding="replicated", norms=True):
    """The train states after each batch, from the same init (bow_mlp towers, two unless
    `shared_towers`, Adam with global-norm clipping that binds), on every device of the
    mesh."""
    cfg = load_config("tiny")
    m = cfg.model
    m.tower, m.embed_dim, m.hidden_dim, m.output_dim = "bow_mlp", 8, 8, 8
    m.shared_towers, m.shared_embedding = shared_towers, shared_embedding
    cfg.optimizer.update(name="adam", warmup_steps=0, decay="constant", grad_clip_norm=0.5)
    mesh = sharding.make_mesh()
    model = dual_encoder.make_model(model_spec(m), VOCAB)
    objective = de_objective.objective(model, losses.sharded("in_batch_softmax", mesh), L,
                                       encode_chunks=chunks)
    tx, schedule = make_optimizer(specs.optimizer_spec(cfg.optimizer), 100)
    init = step_lib.make_init_state(objective, tx)
    shardings = sharding.state_shardings(jax.eval_shape(init, 0), mesh, param_sharding,
                                         dual_encoder.logical_axes(model, L))
    state = jax.jit(init, static_argnums=0, out_shardings=shardings)(0)
    step = step_lib.make_train_step(objective, tx, schedule, shardings,
                                    sharding.batch_sharding(mesh), sharding.replicated(mesh),
                                    table_updates=table_updates)
    states = []
    for b in batches:
        state, metrics = step(state, b, norms=norms)
        if param_sharding == "fsdp":
            assert_tables_sharded(state, mesh.devices.size, 1 if shared_towers else 2)
        states.append(jax.tree.map(np.asarray, state))
        if norms:
            assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["param_norm"]) > 0
        else:
            assert (float(metrics["grad_norm"]) == float(metrics["param_norm"])
                    == step_lib.NOT_MEASURED)
    return objective, states


def assert_tables_sharded(state, n: int, num_tables: int) -> None:
    """The token tables and their Adam moments, as the step returns them, are split by
    rows over the n devices (each holds VOCAB / n rows); nothing else is that big."""
    tables_and_moments = [x for x in jax.tree.leaves(state) if x.shape == (VOCAB, 8)]
    assert len(tables_and_moments) == 3 * num_tables
    for x in tables_and_moments:
        assert x.sharding.spec == P("data", None)
        assert {s.data.shape for s in x.addressable_shards} == {(VOCAB // n, 8)}


@pytest.mark.slow
def test_lazy_adam_moves_only_the_rows_a_batch_reads_and_is_adam_on_them():
    b1, b2 = batch(1), batch(2)
    objective, (dense1, dense2) = run("dense", [b1, b2])
    _, (lazy1, lazy2) = run("lazy", [b1, b2])

    # Step 1 from zero moments: Adam leaves an unread row where it is, so the two agree.
    for x, y in zip(jax.tree.leaves(lazy1), jax.tree.leaves(dense1), strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-7)

    # Step 2 (same params, so the same gradient): the rows batch 2 reads, and every other
    # param, as Adam has them; the unread rows and their moments as step 1 left them,
    # where Adam moves them on.
    index = jax.tree.map(np.asarray, lazy_rows.touched(lazy1["params"], b2,
                                                    objective.tables(lazy1["params"])))
    slots = lazy_rows._slots(lazy2["opt_state"], lazy2["params"], index)
    table_params = {keys + ("embedding",) for keys in index}
    slot_paths = {kp: path for kp, path in slots.items()}
    moved = 0
    for (kp, x2), x1, d2 in zip(jax.tree_util.tree_flatten_with_path(lazy2)[0],
                                jax.tree.leaves(lazy1), jax.tree.leaves(dense2), strict=True):
        keys = tuple(getattr(k, "key", None) for k in kp)
        path = next((p for p in index if keys[-len(p) - 1:] == p + ("embedding",)
                     and x2.shape == (VOCAB, 8)), None)
        if path is None:
            np.testing.assert_allclose(x2, d2, rtol=2e-5, atol=1e-7, err_msg=str(keys))
            continue
        read = np.asarray(index[path][0])
        read = read[read < VOCAB]
        unread = np.setdiff1d(np.arange(VOCAB), read)
        assert 0 < len(read) < VOCAB / 2
        np.testing.assert_allclose(x2[read], d2[read], rtol=2e-5, atol=1e-7)
        np.testing.assert_array_equal(x2[unread], x1[unread])
        moved += int((d2[unread] != x1[unread]).any())
    assert len(slot_paths) == 4 and len(table_params) == 2
    assert moved == 6  # dense Adam moves both tables' unread rows and both their moments


@pytest.mark.parametrize("options", [
    {"shared_towers": True}, {"chunks": 2},
    {"param_sharding": "fsdp"}])
@pytest.mark.slow
def test_lazy_first_step_equals_adam_with_shared_tables_cached_towers_and_fsdp(options):
    """Adam's first step from zero moments leaves every unread row where it is, so the
    lazy step must equal it exactly: with one tower for both sides (its table read by
    queries and documents), towers encoded in chunks (the rows read inside jax.checkpoint and
    lax.map), and tables sharded over the devices."""
    b = batch(1)
    _, (dense,) = run("dense", [b], **options)
    _, (lazy,) = run("lazy", [b], **options)
    for x, y in zip(jax.tree.leaves(lazy), jax.tree.leaves(dense), strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-7)


def test_table_updates_key_is_checked():
    cfg = load_config("tiny")
    cfg.optimizer.table_updates = "sparse"
    with pytest.raises(errors.ConfigError, match="optimizer.table_updates"):
        config_lib.validate(cfg, 1)
    cfg.optimizer.table_updates = "lazy"
    cfg.model.name = "pses"
    with pytest.raises(errors.ConfigError, match="table_updates='lazy'"):
        config_lib.validate(cfg, 1)


def test_row_count_ladder():
    sizes = [lazy_rows.row_count(n, 50_000) // lazy_rows.CHUNK
             for n in (0, 1024, 1025, 2049, 6145, 14_600, 16_384, 16_615, 33_000, 40_000,
                       50_000)]
    # steps of one CHUNK up to 16, then of two up to 32, then four...; 49 x 1,024: the
    # table, rounded up
    assert sizes == [1, 1, 2, 3, 7, 15, 16, 18, 36, 40, 49]
    for n in range(1, 50_000, 97):  # past 8 x CHUNK, at most 1/8 more than n
        assert n <= lazy_rows.row_count(n, 50_000) <= max(8 * lazy_rows.CHUNK, -(-n * 9 // 8))
    assert lazy_rows.row_count(5000, 4096) == 4096


@pytest.mark.slow
def test_rows_listed_by_the_host_give_the_same_steps():
    """The training loop's lazy step on one process: the host lists each table's distinct
    ids (`BatchRows`) and the step reads them instead of finding them. Two steps, one
    tower per side, equal to the step that finds them itself; the lists are sorted,
    padded past the table's end, and as long as the longest so far."""
    host = [batch(1, place=False), batch(2, place=False)]
    objective, found = run("lazy", [batch(1), batch(2)])
    state_params = found[0]["params"]
    rows = lazy_rows.BatchRows(objective.tables(state_params), state_params)
    listed = [rows(b) for b in host]
    mesh = sharding.make_mesh()
    _, given = run("lazy", [sharding.put_global_batch(b, mesh) for b in listed])
    for x, y in zip(jax.tree.leaves(given), jax.tree.leaves(found), strict=True):
        np.testing.assert_array_equal(x, y)
    field = lazy_rows.rows_field(("query_tower", "bow", "embed"))
    ids = listed[0][field]
    read = np.unique(host[0]["q_ids"])
    assert ids.shape == (lazy_rows.CHUNK,)
    np.testing.assert_array_equal(ids[:len(read)], read)
    assert (ids[len(read):] == VOCAB).all()
    assert listed[1][field].shape == ids.shape


@pytest.mark.parametrize("table_updates", ["dense", "lazy"])
@pytest.mark.slow
def test_steps_without_norms_update_the_same(table_updates):
    """The training loop asks for grad_norm and param_norm only on the steps that write a
    train row; a step without them makes the same update."""
    b = [batch(1), batch(2)]
    _, with_norms = run(table_updates, b)
    _, without = run(table_updates, b, norms=False)
    for x, y in zip(jax.tree.leaves(without), jax.tree.leaves(with_norms), strict=True):
        np.testing.assert_array_equal(x, y)
