"""Towers and the dual encoder around them: shapes, padding invariance, masked pooling,
attention masking, shared token tables, per-side towers, bfloat16 compute (model.dtype)
for every tower, logical axes, config
checks, and short training runs with the cnn and transformer towers."""

import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config
from jax.sharding import PartitionSpec as P

from dualjax import errors
from dualjax.config import validation as config_lib
from dualjax.config.specs import model_spec
from dualjax.models import dual_encoder, layers, pses, towers
from dualjax.train import loop as train

VOCAB = 50
KINDS = ("bow", "bow_mlp", "cnn", "transformer_cls", "transformer_mean")


def model_cfg(kind: str = "bow", **overrides):
    """tiny's model group, sized for fast CPU tests; kind "transformer_mean" sets the
    transformer tower with mean pooling."""
    cfg = load_config("tiny").model
    cfg.tower = kind.split("_")[0] if kind.startswith("transformer") else kind
    cfg.cnn_windows, cfg.cnn_filters = "2,3", 8  # an even and an odd window
    t = cfg.transformer
    t.num_layers, t.width, t.num_heads, t.mlp_dim, t.max_positions = 1, 16, 2, 32, 24
    t.pooling = "mean" if kind == "transformer_mean" else "cls"
    cfg.update_from_flattened_dict(overrides)
    return cfg


def texts(lengths, total_len, seed=0, pad_ids="zero"):
    """ids [b, total_len] with random real tokens (the same for a seed whatever total_len)
    and mask [b, total_len]; pad ids are 0 or random ("random")."""
    rng = np.random.default_rng(seed)
    real = rng.integers(1, VOCAB, (len(lengths), max(lengths)))
    mask = np.arange(total_len)[None] < np.array(lengths)[:, None]
    junk = rng.integers(1, VOCAB, mask.shape) if pad_ids == "random" else np.zeros(mask.shape)
    ids = np.where(mask, np.pad(real, ((0, 0), (0, total_len - real.shape[1]))), junk)
    return jnp.asarray(ids, jnp.int32), jnp.asarray(mask)


@functools.lru_cache
def _build(kind, overrides):
    cfg = model_cfg(kind, **dict(overrides))
    tower = towers.build(cfg.tower, model_spec(cfg), VOCAB, "tower")
    if kind == "transformer_mean":  # the same params as with [CLS] pooling
        params = _build("transformer_cls", overrides)[2]
    else:
        ids, mask = texts([3], 8)
        params = nn.meta.unbox(jax.jit(tower.init)(jax.random.key(0), ids, mask)["params"])
    apply = jax.jit(lambda p, ids, mask: tower.apply({"params": p}, ids, mask))
    return cfg, tower, params, apply


def build(kind, **overrides):
    """(model config, tower module, params, jitted apply(params, ids, mask)) of a tower
    kind; cached across tests: do not mutate."""
    return _build(kind, tuple(sorted(overrides.items())))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_padding_never_changes_a_vector_and_an_empty_text_is_finite(kind):
    cfg, _, params, apply = build(kind)
    lengths = [0, 1, 3, 7, 7]  # an empty text, one with no pad at length 7, and a copy of it
    ids, mask = texts(lengths, 7)
    ids = ids.at[4, 2].set(ids[3, 2] % (VOCAB - 1) + 1)  # ... with one real token changed
    out = apply(params, ids, mask)
    dim = towers.output_dim(model_spec(cfg), cfg.tower)
    assert out.shape == (5, dim) and out.dtype == jnp.float32
    assert np.isfinite(np.asarray(out)).all()
    assert np.abs(np.asarray(out[4] - out[3])).max() > 1e-4  # the vector depends on the text
    # Pads appended, with arbitrary ids at the pads (the transformer's attention mask, the
    # cnn's zeroed pad embeddings and masked max, the bow mean all ignore them).
    ids_long, mask_long = texts(lengths, 12, pad_ids="random")
    ids_long = ids_long.at[4, 2].set(ids[4, 2])
    np.testing.assert_allclose(apply(params, ids_long, mask_long), out, atol=1e-5)
    if kind in ("cnn", "transformer_cls"):  # finite gradients, empty text included (no -inf*0)
        grads = jax.jit(jax.grad(lambda p: apply(p, ids, mask).sum()))(params)
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_bow_is_the_mean_of_the_real_tokens_embeddings():
    _, tower, params, _ = build("bow")
    ids, mask = texts([2, 5], 6, pad_ids="random")
    table = np.asarray(params["embed"]["embedding"])
    expected = [table[np.asarray(ids[i, :n])].mean(0) for i, n in enumerate([2, 5])]
    np.testing.assert_allclose(tower.apply({"params": params}, ids, mask), expected, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.slow
def test_bag_sum_and_its_table_gradient_equal_the_sum_of_gathered_token_vectors(dtype):
    """towers.bag_sum (a loop over positions, with its own backward pass) against the plain
    gather-then-sum it replaces: the same sums, and the same gradient w.r.t. the table,
    with repeated ids, pads and an empty text; in bfloat16 the rows are rounded before
    the float32 sum, both ways."""
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(30, 8)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 6, (5, 7)), jnp.int32)  # few ids: many repeats
    mask = jnp.asarray(rng.random((5, 7)) < 0.6).at[2].set(False)
    weights = jnp.asarray(rng.normal(size=(5, 8)), jnp.float32)

    def reference(t):
        x = jnp.where(mask[..., None], t[ids].astype(dtype), 0)
        return x.sum(axis=1, dtype=jnp.float32)

    bag = lambda t: towers.bag_sum(t, ids, mask, dtype)
    np.testing.assert_array_equal(jax.jit(bag)(table), reference(table))
    assert (np.asarray(bag(table))[2] == 0).all()  # the empty text
    grad = lambda f: jax.jit(jax.grad(lambda t: (f(t) * weights).sum()))(table)
    np.testing.assert_allclose(grad(bag), grad(reference), rtol=1e-6, atol=1e-6)
    untouched = np.setdiff1d(np.arange(30), np.asarray(ids)[np.asarray(mask)])
    assert (np.asarray(grad(bag))[untouched] == 0).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.slow
def test_attention_equals_jax_dot_product_attention_with_its_mask(dtype):
    """layers.attention (keys-major logits, padded keys as a bias) against
    jax.nn.dot_product_attention(mask=) it replaces: the same values and gradients w.r.t.
    q, k and v, in float32 and bfloat16 inputs; a text whose keys are all padded averages
    its values as there (its gradient, which no tower reads, is left out)."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(4, 9, 3, 8)), dtype) for _ in range(3))
    mask = jnp.asarray(rng.random((4, 9)) < 0.6).at[:, 0].set(True).at[2].set(False)
    weights = jnp.asarray(rng.normal(size=(4, 9, 3, 8)), jnp.float32)

    def reference(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :])

    ours = lambda q, k, v: layers.attention(q, k, v, mask)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == jnp.float32 else dict(rtol=0, atol=2e-2)
    got, want = jax.jit(ours)(q, k, v), jax.jit(reference)(q, k, v)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **tol)
    np.testing.assert_allclose(np.asarray(got[2], np.float32),
                               np.broadcast_to(np.asarray(v[2], np.float32).mean(0), (9, 3, 8)),
                               **tol)
    grad = lambda f: jax.jit(jax.grad(
        lambda *a: (f(*a).astype(jnp.float32) * weights).sum(), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(grad(ours), grad(reference), strict=True):
        np.testing.assert_allclose(np.delete(np.asarray(a, np.float32), 2, 0),
                                   np.delete(np.asarray(b, np.float32), 2, 0), **tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_attention_equals_attention_on_right_padded_texts(dtype):
    """The fused path (cuDNN's kernel on a GPU; here the same call with XLA's, since
    this machine has none): the padded keys given as lengths, it equals layers.attention
    on right-padded texts, values and gradients w.r.t. q, k, v, except rows of padding,
    which no tower reads."""
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(4, 9, 3, 8)), dtype) for _ in range(3))
    lengths = np.array([9, 4, 1, 6])
    mask = jnp.asarray(np.arange(9)[None] < lengths[:, None])
    weights = jnp.asarray(rng.normal(size=(4, 9, 3, 8)) * mask[..., None, None], jnp.float32)
    fused = lambda q, k, v: layers.fused_attention(q, k, v, mask, implementation="xla")
    plain = lambda q, k, v: layers.attention(q, k, v, mask)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == jnp.float32 else dict(rtol=0, atol=2e-2)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(jax.jit(fused)(q, k, v), np.float32)[real],
                               np.asarray(jax.jit(plain)(q, k, v), np.float32)[real], **tol)
    grad = lambda f: jax.jit(jax.grad(
        lambda *a: (f(*a).astype(jnp.float32) * weights).sum(), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(grad(fused), grad(plain), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)


@pytest.mark.slow
def test_the_fused_attention_runs_where_cudnn_can_and_the_tower_is_the_same(monkeypatch):
    """On this CPU the towers keep layers.attention; where fused_attention_ok says yes
    (a GPU, bf16, a head width of a multiple of 8 up to 128), the bert tower's attention
    goes through fused_attention, and its vectors are the same."""
    attn = layers.SelfAttention(num_heads=2, init_std=0.5, dtype=jnp.bfloat16)
    h = jnp.asarray(np.random.default_rng(3).normal(size=(3, 6, 32)), jnp.bfloat16)
    mask = jnp.asarray(np.arange(6)[None] < np.array([[6], [2], [4]]))
    params = attn.init(jax.random.PRNGKey(0), h, mask)
    x = jnp.zeros((2, 5, 4, 32), jnp.bfloat16)
    assert not layers.fused_attention_ok(x)  # (no GPU here)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert layers.fused_attention_ok(x)
    assert not layers.fused_attention_ok(x.astype(jnp.float32))
    assert not layers.fused_attention_ok(jnp.zeros((2, 5, 4, 12), jnp.bfloat16))
    assert not layers.fused_attention_ok(jnp.zeros((2, 5, 1, 256), jnp.bfloat16))
    with layers.portable_attention():  # (bundles: lowered for cpu, cuda and tpu at once)
        assert not layers.fused_attention_ok(x)
    assert layers.fused_attention_ok(x)

    calls = []
    real_fused = layers.fused_attention

    def fused(q, k, v, mask):
        calls.append(q.shape)
        return real_fused(q, k, v, mask, implementation="xla")
    monkeypatch.setattr(layers, "fused_attention", fused)
    got = attn.apply(params, h, mask)
    assert calls == [(3, 6, 2, 16)]
    monkeypatch.setattr(layers, "fused_attention_ok", lambda q: False)
    want = attn.apply(params, h, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got, np.float32)[real],
                               np.asarray(want, np.float32)[real], atol=3e-2)


@pytest.mark.slow
def test_attention_bias_and_its_gradient_equal_jax_dot_product_attention():
    """A shared bias [heads, keys, queries] (MPNet's relative positions): the values and
    the gradients w.r.t. q, k, v and the bias itself (summed over the batch) are
    jax.nn.dot_product_attention(bias=)'s."""
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 7, 2, 4)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(rng.random((3, 7)) < 0.7).at[:, 0].set(True)
    bias = jnp.asarray(rng.normal(size=(2, 7, 7)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(3, 7, 2, 4)), jnp.float32)

    def reference(q, k, v, bias):  # its bias is [b, heads, queries, keys]
        full = jnp.broadcast_to(jnp.swapaxes(bias, 1, 2)[None], (3, 2, 7, 7))
        return jax.nn.dot_product_attention(q, k, v, bias=full, mask=mask[:, None, None, :])

    ours = lambda q, k, v, bias: layers.attention(q, k, v, mask, bias)
    np.testing.assert_allclose(ours(q, k, v, bias), reference(q, k, v, bias), atol=1e-6)
    grad = lambda f: jax.jit(jax.grad(lambda *a: (f(*a) * weights).sum(),
                                      argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for a, b in zip(grad(ours), grad(reference), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_masked_max_ignores_pads_even_over_negative_values():
    x = -jnp.arange(1.0, 13.0).reshape(2, 3, 2)  # every value negative
    mask = jnp.array([[True, True, False], [False, False, False]])
    out = towers.masked_max(x, mask)
    np.testing.assert_array_equal(out, [[-1.0, -2.0], [0.0, 0.0]])  # empty row: zeros
    g = jax.grad(lambda x: towers.masked_max(x, mask).sum())(x)
    np.testing.assert_array_equal(g[0], [[1, 1], [0, 0], [0, 0]])
    np.testing.assert_array_equal(g[1], np.zeros((3, 2)))


def cnn_reference(params, ids, windows):
    """The cnn tower on one unpadded text, in numpy: 'SAME' convolutions (zeros around the
    text), tanh, max over positions, concatenated, linear. Returns (output, activations)."""
    x = np.asarray(params["embed"]["embedding"])[ids]  # [len, embed]
    pooled, acts = [], []
    for w in windows:
        k, b = np.asarray(params[f"conv_{w}"]["kernel"]), np.asarray(params[f"conv_{w}"]["bias"])
        lo = (w - 1) // 2
        xp = np.pad(x, ((lo, w - 1 - lo), (0, 0)))
        h = np.tanh(np.stack([np.einsum("we,wef->f", xp[t:t + w], k) for t in range(len(ids))]) + b)
        acts.append(h)
        pooled.append(h.max(0))
    out = np.concatenate(pooled) @ np.asarray(params["output"]["kernel"]) + np.asarray(
            params["output"]["bias"])
    return out, np.concatenate(acts)


@pytest.mark.slow
def test_cnn_equals_a_reference_and_its_max_pooling_ignores_pads_over_negative_activations():
    _, tower, params, _ = build("cnn")
    params = jax.tree.map(lambda x: x, params)  # a copy of the cached dicts
    for w in (2, 3):  # every real activation negative: a pad's 0 would win a plain max
        params[f"conv_{w}"]["kernel"] = params[f"conv_{w}"]["kernel"] * 0.1
        params[f"conv_{w}"]["bias"] = jnp.full_like(params[f"conv_{w}"]["bias"], -2.0)
    lengths = [1, 4, 6]
    ids, mask = texts(lengths, 10, pad_ids="random")
    out = tower.apply({"params": params}, ids, mask)
    for i, n in enumerate(lengths):
        expected, acts = cnn_reference(params, np.asarray(ids[i, :n]), (2, 3))
        assert acts.max() < -0.5
        np.testing.assert_allclose(out[i], expected, atol=1e-5)


def test_transformer_takes_texts_up_to_max_positions_and_names_the_key_beyond():
    _, tower, params, _ = build("transformer_cls")
    apply = lambda n: jax.eval_shape(lambda: tower.apply({"params": params}, *texts([3], n)))
    assert apply(24).shape == (1, 16)  # = max_positions: fine
    with pytest.raises(ValueError, match="model.transformer.max_positions=24"):
        apply(25)


def _eqns(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (jit, custom_jvp, ...) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    sub = sub.jaxpr
                if isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _eqns(sub)


def compute_dtypes(fn, *args):
    """What `fn(*args)` computes in: (dtypes of the operands of every matmul, i.e.
    dot_general / conv_general_dilated; dtypes of the operands of every reduce_sum;
    whether bfloat16 token vectors appear: a [batch, len, d] value, or the [batch, d]
    vectors of one position that `towers.bag_sum` casts inside its loop)."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    eqns = list(_eqns(jaxpr))
    ids = args[1]
    matmul = {v.aval.dtype for e in eqns if e.primitive.name in ("dot_general",
              "conv_general_dilated") for v in e.invars}
    sums = {v.aval.dtype for e in eqns if e.primitive.name == "reduce_sum" for v in e.invars}
    tokens = any(v.aval.dtype == jnp.bfloat16 and v.aval.shape[:1] == ids.shape[:1]
                 and len(v.aval.shape) in (2, 3) and v.aval.shape[-1] > 1
                 for e in eqns for v in e.outvars)
    return matmul, sums, tokens


FEATURES = {"query": ((5, 4), (3, 2)), "document": ((5, 4), (3, 2))}  # two categorical fields


@pytest.mark.parametrize("kind", KINDS + ("pses",))
@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params_and_unit_float32_embeddings(kind):
    """model.dtype="bfloat16", per tower kind (with categorical features where the tower
    takes them; pses: its trunk, a bow_mlp, from the same registry): the params are float32
    (the same tree as the float32 model's), every matmul / convolution reads bfloat16
    operands (so the key is not ignored) and every sum runs in float32 (masked means,
    LayerNorm statistics, the norms), and the embeddings are float32 unit vectors close
    to the float32 model's on the same params. Close: bfloat16 keeps 8 mantissa bits, a
    relative rounding of at most 2**-9 ~ 2e-3 per value; a few layers of it leave a
    relative error e of a few 1e-3 in a vector, hence 1 - cos ~ e**2 / 2 < 1e-4: 1e-3
    leaves room, and is still far tighter than an unrelated vector (1 - cos ~ 1)."""
    is_pses = kind == "pses"
    tower_kind = "bow_mlp" if is_pses else kind
    sizes = None if tower_kind == "bow" or is_pses else FEATURES
    models = {}
    for dtype in ("float32", "bfloat16"):
        cfg = model_cfg(tower_kind, dtype=dtype)
        models[dtype] = (pses.make_model(model_spec(cfg), VOCAB) if is_pses
                         else dual_encoder.make_model(model_spec(cfg), VOCAB, sizes))
    shapes = [jax.eval_shape(lambda m=m: dual_encoder.init_params(m, jax.random.key(0), 8))
              for m in models.values()]
    assert jax.tree.structure(shapes[1]) == jax.tree.structure(shapes[0])
    assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
    rng = np.random.default_rng(0)  # random params (no init to compile), shared by both
    params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.5, x.shape), jnp.float32),
                          shapes[0])

    ids, mask = texts([0, 1, 3, 7, 7], 8)
    cats = jnp.asarray(np.arange(10).reshape(5, 2) % [5, 3], jnp.int32) if sizes else None
    out, matmuls, sums, tokens = {}, {}, {}, {}
    for dtype, model in models.items():
        encode = lambda p, ids, mask, model=model: model.apply({"params": p}, ids, mask, cats,
                                                               method="encode_queries")
        out[dtype] = np.asarray(jax.jit(encode)(params, ids, mask))
        assert out[dtype].dtype == np.float32
        matmuls[dtype], sums[dtype], tokens[dtype] = compute_dtypes(encode, params, ids, mask)
    f32, bf16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)
    # float32: nothing in bfloat16; bfloat16: every matmul's operands (none in bow).
    assert matmuls["float32"] <= {f32} and not tokens["float32"]
    assert tokens["bfloat16"]
    if is_pses:  # the trunk in bfloat16; the PSES encoders / decoders above it in float32
        assert matmuls["bfloat16"] == {bf16, f32}
    elif tower_kind != "bow":
        assert matmuls["bfloat16"] == {bf16}
    assert sums["bfloat16"] == {f32}  # float32 accumulation everywhere
    norms = np.linalg.norm(out["bfloat16"], axis=-1)
    zero = np.linalg.norm(out["float32"], axis=-1) == 0  # an empty text in bow: zeros
    assert not zero[1:].any() and (norms[zero] == 0).all()
    np.testing.assert_allclose(norms[~zero], 1.0, atol=1e-5)
    cos = np.sum(out["bfloat16"] * out["float32"], -1)[~zero]
    assert (1 - cos < 1e-3).all(), 1 - cos
    assert np.abs(out["bfloat16"] - out["float32"]).max() > 0  # really another computation


def test_masked_mean_of_bfloat16_accumulates_in_float32():
    """1000 ones in bfloat16: a bfloat16 running sum stalls at 256 (its spacing there is 2),
    a float32 one reaches 1000; the mean is float32 and exact."""
    x = jnp.ones((2, 1000, 3), jnp.bfloat16)
    mask = jnp.arange(1000)[None] < jnp.array([[1000], [0]])
    out = jax.jit(towers.masked_mean)(x, mask)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, [[1.0] * 3, [0.0] * 3])


@pytest.mark.parametrize("kinds", [("bow", "bow"), ("bow_mlp", "bow_mlp"), ("cnn", "transformer")])
@pytest.mark.slow
def test_shared_embedding_is_one_table_that_both_sides_train(kinds):
    cfg = model_cfg(shared_towers=False, shared_embedding=True, query_tower=kinds[0],
                    doc_tower=kinds[1], embed_dim=16)
    model = dual_encoder.make_model(model_spec(cfg), VOCAB)
    params = jax.jit(lambda key: dual_encoder.init_params(model, key, 8))(jax.random.key(0))
    tables = [jax.tree_util.keystr(path) for path, _ in
              jax.tree_util.tree_leaves_with_path(params) if "embedding" in str(path)]
    assert tables == ["['embed']['embedding']"]
    ids, mask = texts([2, 5], 8)

    def side_loss(p, method):
        return model.apply({"params": p}, ids, mask, method=method)[:, 0].sum()

    grads = jax.jit(lambda p: [jax.grad(side_loss)(p, m) for m in
                               ("encode_queries", "encode_documents")])(params)
    for g, other in zip(grads, ("doc_tower", "query_tower"), strict=True):
        assert np.abs(np.asarray(g["embed"]["embedding"])).max() > 1e-6, other
        if other in g:  # bow has no params above the table
            assert max(np.abs(np.asarray(x)).max() for x in jax.tree.leaves(g[other])) == 0
    if kinds[0] != kinds[1]:  # different towers per side
        assert "conv_2" in params["query_tower"] and "layer_0" in params["doc_tower"]


def test_logical_axes_name_the_transformer_embedding_and_mlp_kernels():
    model = dual_encoder.make_model(
        model_spec(model_cfg("transformer_cls", **{"transformer.num_layers": 2})), VOCAB)
    axes = dual_encoder.logical_axes(model, 8)
    shapes = jax.eval_shape(lambda: dual_encoder.init_params(model, jax.random.key(0), 8))
    assert jax.tree.structure(axes) == jax.tree.structure(shapes)  # one spec per param
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(shapes))  # unboxed
    t = axes["tower"]
    assert t["embed"]["embedding"] == P("vocab", "embed")
    assert t["layer_0"]["mlp_in"]["kernel"] == P("embed", "mlp")
    assert t["layer_0"]["mlp_out"]["kernel"] == P("mlp", "embed")
    assert t["layer_1"]["attn"]["query_kernel"] == P("embed", "heads", "kv")
    assert t["layer_1"]["attn"]["out_kernel"] == P("heads", "kv", "embed")
    assert axes["alpha"] == P()


@pytest.mark.slow
def test_bert_base_preset_sizes():
    cfg = model_cfg("transformer_cls", **{"transformer.preset": "bert_base",
                                          "transformer.max_positions": 512})
    model = dual_encoder.make_model(model_spec(cfg), VOCAB)
    shapes = jax.eval_shape(lambda: dual_encoder.init_params(model, jax.random.key(0), 8))
    t = shapes["tower"]
    assert sorted(k for k in t if k.startswith("layer_")) == sorted(f"layer_{i}" for i in range(12))
    assert t["layer_11"]["mlp_in"]["kernel"].shape == (768, 3072)
    assert t["layer_0"]["attn"]["query_kernel"].shape == (768, 12, 64)
    assert t["pos_embed"].shape == (512, 768)


@pytest.mark.parametrize("overrides, message", [
    ({"tower": "lstm"}, "model.tower='lstm' is not one of: bow, bow_mlp, cnn, transformer"),
    ({"doc_tower": "rnn", "shared_towers": False}, "model.doc_tower='rnn' is not one of"),
    ({"query_tower": "cnn"}, "model.query_tower='cnn' needs two towers"),
    ({"shared_embedding": True}, "model.shared_embedding=True needs two towers"),
    ({"shared_towers": False, "shared_embedding": True, "query_tower": "bow_mlp",
      "doc_tower": "transformer", "embed_dim": 32}, "token tables of one width"),
    ({"shared_towers": False, "tower": "bow_mlp", "query_tower": "bow", "embed_dim": 32},
     "must output vectors of one size"),
    ({"tower": "cnn", "cnn_windows": "3,x"}, "model.cnn_windows='3,x'"),
    ({"tower": "cnn", "cnn_windows": "3,3"}, "distinct positive window sizes"),
    ({"tower": "cnn", "cnn_filters": 0}, "model.cnn_filters=0"),
    ({"tower": "transformer", "transformer.num_heads": 3}, "divisible"),
    ({"tower": "transformer", "transformer.pooling": "max"}, "model.transformer.pooling='max'"),
    ({"dtype": "fp16"}, "model.dtype='fp16' is not one of: float32, bfloat16"),
    ({"tower": "transformer", "transformer.preset": "bert_huge"}, "bert_base"),
    ({"tower": "transformer", "max_len": 25}, "max_len=25 is longer than"),
])
def test_bad_tower_settings_fail_with_the_key(overrides, message):
    config = load_config("tiny")
    config.model = model_cfg("bow", **overrides)
    with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(")):
        config_lib.validate(config, 8)


@pytest.mark.slow
def test_tiny_training_run_with_cnn_queries_and_transformer_documents(tmp_path):
    """Both new towers (bfloat16 activations: model.dtype) through the train path
    in one run: the tiny config, 6 steps."""
    config = load_config("tiny")
    config.model = model_cfg(shared_towers=False, query_tower="cnn", doc_tower="transformer",
                             dtype="bfloat16")
    config.mesh.num_devices = 2  # still a sharded batch and in-batch loss; faster than 8
    config.eval.baselines, config.eval.untrained, config.eval.index = "", False, "exact"
    config.num_train_steps = 6
    results = train.train_and_evaluate(config, str(tmp_path))
    assert list(results) == ["dual_encoder [exact]"]
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert losses and all(np.isfinite(losses)) and losses[0] > 0
    test_rows = [r for r in rows if r["split"] == "test"]
    assert test_rows and 0 <= test_rows[0]["map@100"] <= 1


@pytest.mark.slow
def test_learned_temperature_starts_at_tau_is_clipped_and_trained():
    cfg = model_cfg("bow", similarity="cosine_learned_temperature", temperature=0.05)
    model = dual_encoder.make_model(model_spec(cfg), VOCAB)
    params = dual_encoder.init_params(model, jax.random.key(0), 8)
    assert set(params) == {"tower", "log_temperature"}
    np.testing.assert_allclose(params["log_temperature"], np.log(0.05), rtol=1e-6)
    scale = lambda p: model.apply({"params": p}, method="scale_and_bias")[0]
    np.testing.assert_allclose(scale(params), 20.0, rtol=1e-5)           # 1 / tau
    for log_tau, expected in ((-9.0, 100.0), (3.0, 1.0)):                 # tau in [0.01, 1]
        np.testing.assert_allclose(scale({**params, "log_temperature": jnp.float32(log_tau)}),
                                   expected, rtol=1e-5)
    # The loss moves log tau: a gradient step on positives scored above negatives
    # sharpens the softmax (lowers tau).
    ids, mask = texts([3, 4, 5, 2], 8)

    def loss(p):
        q, d, s, b = model.apply({"params": p}, ids, mask, ids, mask)
        logits = s * q @ d.T + b
        return -jnp.mean(jnp.diag(jax.nn.log_softmax(logits, axis=1)))

    grad = jax.grad(loss)(params)["log_temperature"]
    assert grad > 0  # d loss / d log tau > 0: descending lowers tau
