"""Cached tower gradients (config.train.encode_chunks, GradCache): the towers encode the global
batch K chunks at a time under jax.checkpoint, and the loss and every gradient equal the
unchunked ones on 8 devices; every chunk of every side draws its own dropout masks, and
the recomputation replays them; one chunk's activations per device; config checks."""

import functools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, losses, objectives
from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec, objective_spec
from dualjax.models import dual_encoder, towers
from dualjax.objectives import in_batch as de_objective
from dualjax.runtime import sharding

VOCAB, B, L, K_HARD, U = 60, 32, 11, 2, 32  # 32 mixed negatives: a multiple of 4 x 8 devices
MLP_DIM = 48  # the transformer's MLP width, found by it in the compiled program


def model_cfg(tower: str):
    cfg = load_config("tiny").model
    cfg.embed_dim, cfg.hidden_dim, cfg.output_dim = 16, 24, 16
    if tower == "bow_mlp":  # two towers: the query tower's params get their own gradient
        cfg.tower, cfg.shared_towers = "bow_mlp", False
    else:
        cfg.tower = tower
        t = cfg.transformer
        t.num_layers, t.width, t.num_heads, t.mlp_dim, t.max_positions = 1, 16, 2, MLP_DIM, 24
    return cfg


def make_batch(seed=0, negatives=True):
    """A global batch on the mesh: texts of random lengths, repeated documents (accidental
    hits), own-query and cluster ids, and with `negatives` k mined hard negatives per
    pair (some the row's own document) and U mixed negatives: per-row extras, so that
    embeddings put back in the wrong row order change the loss."""
    rng = np.random.default_rng(seed)
    texts = lambda *lead: (rng.integers(1, VOCAB, (*lead, L)).astype(np.int32),
                           np.arange(L) < rng.integers(1, L + 1, (*lead, 1)))
    batch = {}
    for key, lead in (("q", (B,)), ("d", (B,))) + ((("n", (B, K_HARD)), ("m", (U,)))
                                                    if negatives else ()):
        batch[f"{key}_ids"], batch[f"{key}_mask"] = texts(*lead)
    doc_ids = rng.integers(0, 20, B).astype(np.int32)
    batch.update(doc_ids=doc_ids, query_ids=rng.integers(0, 20, B).astype(np.int32),
                 cluster_ids=rng.integers(0, 16, B).astype(np.int32))
    if negatives:
        hard_ids = rng.integers(0, 20, (B, K_HARD)).astype(np.int32)
        hard_ids[::4, 0] = doc_ids[::4]
        batch.update(n_doc_ids=hard_ids, m_doc_ids=rng.integers(0, 20, U).astype(np.int32),
                     m_cluster_ids=rng.integers(0, 16, U).astype(np.int32))
    mesh = sharding.make_mesh()
    placed = sharding.put_global_batch(batch, mesh)
    return placed, {"doc_ids": placed["doc_ids"]}


@functools.lru_cache
def value_and_grad(tower: str, chunks: int, rematerialise: bool = True):
    """(model, jitted value_and_grad of the objective's loss) as step.make_train_step
    takes it."""
    model = dual_encoder.make_model(model_spec(model_cfg(tower)), VOCAB)
    loss_fn = losses.sharded("in_batch_softmax", sharding.make_mesh(), symmetric=True)
    objective = de_objective.objective(model, loss_fn, L, encode_chunks=chunks,
                                       rematerialise=rematerialise)
    return model, objective, jax.jit(jax.value_and_grad(objective.loss, has_aux=True))


def assert_same(got, want, rtol=1e-5):
    """Every leaf of `got` equals `want`'s (relative norm error, plus float32 rounding of
    the O(1) terms that a small sum like alpha's gradient cancels; a gradient that is zero
    but for rounding, like beta's under a softmax, only needs to stay near zero)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(want)]
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want) >= 5
    for path, g, w in zip(paths, got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if np.linalg.norm(w) < 1e-6:
            assert np.abs(g).max() < 1e-6, path
        else:
            assert np.linalg.norm(g - w) < rtol * np.linalg.norm(w) + 1e-7, path


@pytest.mark.parametrize("tower, chunks", [("bow_mlp", 2), ("bow_mlp", 4), ("transformer", 4)])
@pytest.mark.slow
def test_cached_loss_and_every_gradient_equal_uncached(tower, chunks):
    batch, extras = make_batch()
    model, objective, cached = value_and_grad(tower, chunks)
    params = objective.init(jax.random.key(0))
    rng = jax.random.key(1)
    (loss, aux), grads = cached(params, batch, rng, extras)
    (ref_loss, ref_aux), ref_grads = value_and_grad(tower, 0)[2](params, batch, rng, extras)

    assert float(ref_loss) > 1.0
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert float(aux["in_batch_p@1"]) == pytest.approx(float(ref_aux["in_batch_p@1"]), abs=1e-7)
    assert_same(grads, ref_grads)
    # The embeddings come back in the batch's row order, every side.
    cached_embeddings, embeddings = jax.jit(functools.partial(both_embeddings, model, chunks))(
        params, batch, rng)
    for name, want in embeddings.items():
        np.testing.assert_allclose(cached_embeddings[name], want, rtol=0, atol=1e-6, err_msg=name)


def both_embeddings(model, chunks, params, batch, rng):
    """({side: embeddings} of `encode_in_chunks`, the same of the towers on the batch)."""
    q, d, negatives = de_objective.encode_in_chunks(model, params, batch, rng, chunks)
    encode = lambda method, ids, mask: model.apply({"params": params}, ids, mask, method=method)
    hard = encode("encode_documents", batch["n_ids"].reshape(B * K_HARD, L),
                  batch["n_mask"].reshape(B * K_HARD, L))
    return {"q": q, "d": d, **negatives}, {
        "q": encode("encode_queries", batch["q_ids"], batch["q_mask"]),
        "d": encode("encode_documents", batch["d_ids"], batch["d_mask"]),
        "mixed_negatives": encode("encode_documents", batch["m_ids"], batch["m_mask"]),
        "hard_negatives": hard.reshape(B, K_HARD, -1)}


class DropoutTower(nn.Module):
    """Mean of word vectors, a tanh layer with dropout 0.5, a linear layer (no shipped
    tower has dropout yet; the objective passes it the step's "dropout" rng)."""
    vocab_size: int

    @nn.compact
    def __call__(self, ids, mask, extra=None):
        x = nn.Embed(self.vocab_size, 16)(ids) * mask[..., None]
        x = x.sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1)
        x = nn.Dropout(0.5, deterministic=False)(jnp.tanh(nn.Dense(32)(x)))
        return nn.Dense(16)(x)


@pytest.mark.slow
def test_recomputation_replays_the_dropout_masks(monkeypatch):
    # With dropout on, the checkpointed chunks' gradient equals that of the same chunked
    # computation keeping its activations (one forward pass, its own masks): the backward
    # pass's recomputation drew exactly the forward pass's masks.
    monkeypatch.setitem(towers.TOWERS, "dropout_test", towers.Tower(
        lambda vocab, name, embed=None: DropoutTower(vocab, name=name)))
    model = dual_encoder.make_model(model_spec(model_cfg("dropout_test")), VOCAB)
    loss_fn = losses.sharded("in_batch_softmax", sharding.make_mesh())
    batch, extras = make_batch(negatives=False)
    run = {}
    for remat in (True, False):
        objective = de_objective.objective(model, loss_fn, L, encode_chunks=4, rematerialise=remat)
        run[remat] = jax.jit(jax.value_and_grad(objective.loss, has_aux=True))
    params = objective.init(jax.random.key(0))
    (loss, _), grads = run[True](params, batch, jax.random.key(1), extras)
    (plain_loss, _), plain_grads = run[False](params, batch, jax.random.key(1), extras)
    (other_loss, _), other_grads = run[True](params, batch, jax.random.key(2), extras)

    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    assert_same(grads, plain_grads, rtol=1e-5)
    # Dropout is on: another rng, other masks, another loss and gradient.
    assert abs(float(other_loss) - float(loss)) > 1e-3
    kernel = lambda g: np.asarray(g["tower"]["Dense_0"]["kernel"])
    assert (np.linalg.norm(kernel(other_grads) - kernel(grads))
            > 1e-2 * np.linalg.norm(kernel(grads)))


@pytest.mark.slow
def test_every_chunk_and_side_draws_its_own_dropout_masks(monkeypatch):
    # Every row of every side is the same text, and one tower (shared_towers) encodes
    # them all: without dropout all the embeddings would be equal, so two rows' embeddings
    # differ only where their dropout masks do. Chunks are [B/K] rows of one shape on every
    # side: the same rng would draw the same masks, and row r of chunk j would equal row r
    # of chunk 0, a side's chunk j the other sides' chunk j. Each draws its own.
    monkeypatch.setitem(towers.TOWERS, "dropout_test", towers.Tower(
        lambda vocab, name, embed=None: DropoutTower(vocab, name=name)))
    cfg = model_cfg("dropout_test")
    assert cfg.shared_towers
    model = dual_encoder.make_model(model_spec(cfg), VOCAB)
    text = np.arange(1, L + 1, dtype=np.int32)
    same = lambda rows: (np.broadcast_to(text, (rows, L)).copy(), np.ones((rows, L), bool))
    batch = {}
    for key in ("q", "d", "m"):  # U = B mixed negatives: chunks of the same shape
        batch[f"{key}_ids"], batch[f"{key}_mask"] = same(B)
    batch = sharding.put_global_batch(batch, sharding.make_mesh())
    params = jax.jit(lambda rng: dual_encoder.init_params(model, rng, L))(jax.random.key(0))
    chunks = 4
    q, d, negatives = jax.jit(functools.partial(de_objective.encode_in_chunks, model,
                                                chunks=chunks))(params, batch,
                                                                jax.random.key(1))
    sides = np.stack([np.asarray(x) for x in (q, d, negatives["mixed_negatives"])])
    # [side, B, dim] -> [side, chunk, position in the chunk, dim] (row r: chunk r % K).
    by_chunk = sides.reshape(3, B // chunks, chunks, -1).swapaxes(1, 2)
    gap = lambda a, b: np.abs(a - b).max(-1)  # per row
    for j in range(1, chunks):  # chunk j against chunk 0, row by row, on every side
        assert (gap(by_chunk[:, j], by_chunk[:, 0]) > 1e-3).all(), j
    for s, t in ((0, 1), (0, 2), (1, 2)):  # side against side, chunk by chunk, row by row
        assert (gap(by_chunk[s], by_chunk[t]) > 1e-3).all(), (s, t)


@pytest.mark.slow
def test_one_chunk_of_mlp_activations_per_device():
    # Transformer, 32 rows over 8 devices: each device encodes 4 rows, and its compiled
    # loss + gradient holds the MLP's hidden activations f32[4, 12, 48] (12 = [CLS] + 11
    # tokens). With K chunks the largest buffer with a token axis and the MLP axis has
    # 4 / K rows: one chunk, split over the devices (not the whole batch, not stacked
    # over the chunks for the backward pass), and no all-to-all moves rows.
    batch, extras = make_batch(negatives=False)

    def largest_mlp_buffer(chunks):
        _, objective, f = value_and_grad("transformer", chunks)
        params = objective.init(jax.random.key(0))
        hlo = f.lower(params, batch, jax.random.key(1), extras).compile().as_text()
        assert "all-to-all" not in hlo
        shapes = {tuple(int(n) for n in dims.split(","))
                  for dims in re.findall(r"f32\[([\d,]+)\]", hlo)}
        return max(math.prod(s) for s in shapes if MLP_DIM in s and L + 1 in s)

    rows = B // 8
    assert largest_mlp_buffer(0) == rows * (L + 1) * MLP_DIM
    chunks = 4  # (2 holds as well: one more compile of the 8-device step, 7 s)
    assert largest_mlp_buffer(chunks) == rows // chunks * (L + 1) * MLP_DIM


def test_encode_chunks_config_checks_and_plumbing():
    cfg = load_config("tiny")  # global batch 32 on 8 devices
    for chunks in (0, 1, 2, 4):
        cfg.train.encode_chunks = chunks
        config_lib.validate(cfg, 8)
    for chunks in (3, 8, -2):  # 3 does not divide 32; 32 / 8 = 4 rows for 8 devices
        cfg.train.encode_chunks = chunks
        with pytest.raises(errors.ConfigError, match=r"config\.train\.encode_chunks"):
            config_lib.validate(cfg, 8)
    cfg.train.encode_chunks, cfg.loss.num_mixed_negatives = 2, 8  # 8 mixed negatives: 4 a chunk
    with pytest.raises(errors.ConfigError, match=r"config\.train\.encode_chunks=2"):
        config_lib.validate(cfg, 8)
    cfg.loss.num_mixed_negatives = 16
    config_lib.validate(cfg, 8)
    pses = load_config("pses")
    pses.train.encode_chunks = 2
    with pytest.raises(errors.ConfigError, match=r"config\.train\.encode_chunks=2.*pses"):
        config_lib.validate(pses, 8)
    # from_config hands the key to the objective: its loss maps checkpointed chunks.
    cfg = load_config("tiny")
    model = dual_encoder.make_model(model_spec(cfg.model), VOCAB)
    batch, extras = make_batch(negatives=False)
    for chunks, chunked in ((0, False), (4, True)):
        cfg.train.encode_chunks = chunks
        objective = objectives.make(objective_spec(cfg), model, sharding.make_mesh())
        params = jax.eval_shape(objective.init, jax.random.key(0))
        jaxpr = str(jax.make_jaxpr(objective.loss)(params, batch, jax.random.key(1), extras))
        assert ("checkpoint" in jaxpr or "remat" in jaxpr) == chunked
