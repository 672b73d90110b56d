"""Train-state shardings: FSDP splits the big arrays (params and the optimizer's copies
alike) over the mesh, the state a run's train steps get and return is so split, it trains
as the replicated state does, and a checkpoint saved on 8 devices resumes on 4, split 4
ways."""

import json
import os
import signal

import conftest
import jax
import numpy as np
import optax
import pytest
from conftest import load_config
from jax.sharding import PartitionSpec as P

from dualjax import errors
from dualjax.config.specs import model_spec
from dualjax.models import dual_encoder
from dualjax.runtime import sharding
from dualjax.train import checkpoints
from dualjax.train import loop as train
from dualjax.train import step as step_lib


def test_fsdp_spec_by_hand():
    n = 8
    assert sharding.fsdp_spec((64, 32), n) == P()  # 2,048 elements: small, replicated
    assert sharding.fsdp_spec((50_000, 256), n, ("vocab", "embed")) == P("data", None)
    # 50,001 rows do not split over 8: the named embedding width does.
    assert sharding.fsdp_spec((50_001, 256), n, ("vocab", "embed")) == P(None, "data")
    # Names first, in FSDP_AXES order, though another dimension is larger.
    assert sharding.fsdp_spec((1024, 4096), n, ("mlp", "embed")) == P("data", None)
    assert sharding.fsdp_spec((4096, 1024), n, ("embed", "mlp")) == P(None, "data")
    # No names: the largest dimension the devices divide.
    assert sharding.fsdp_spec((300, 1000, 7), n) == P(None, "data", None)
    assert sharding.fsdp_spec((999, 999), n) == P()  # nothing divides: replicated
    assert sharding.fsdp_spec((50_000, 256), 1) == P()


def test_the_optimizer_state_follows_its_params():
    cfg = load_config("tiny").model
    cfg.update(vocab_size=3000, embed_dim=64, tower="bow_mlp")
    model = dual_encoder.make_model(model_spec(cfg), 3000 + 1 + 50)
    mesh = sharding.make_mesh(8)
    tx = optax.adamw(1e-3)

    def init(seed):
        params = dual_encoder.init_params(model, jax.random.PRNGKey(seed), 16)
        return {"params": params, "opt_state": tx.init(params), "step": 0}

    shapes = jax.eval_shape(init, 0)
    got = sharding.state_shardings(shapes, mesh, "fsdp", dual_encoder.logical_axes(model, 16))
    table = ("tower", "bow", "embed", "embedding")

    def at(tree, keys):
        for k in keys:
            tree = tree[k]
        return tree

    # The token table [3051, 64]: its rows do not divide by 8, its width does.
    assert at(got["params"], table).spec == P(None, "data")
    adam = got["opt_state"][0]
    assert at(adam.mu, table).spec == at(adam.nu, table).spec == P(None, "data")
    assert at(got["params"], ("tower", "hidden", "bias")).spec == P()  # small
    assert got["step"].spec == P()
    replicated = sharding.state_shardings(shapes, mesh, "replicated")
    assert all(s.spec == P() for s in jax.tree.leaves(replicated))
    with pytest.raises(ValueError, match="mesh.param_sharding='zero'"):
        sharding.state_shardings(shapes, mesh, "zero")


OVERRIDES = {"model.similarity": "cosine_temperature",  # no bias with a zero gradient
             "model.vocab_size": 2000, "model.embed_dim": 64, "eval.untrained": False,
             "eval.baselines": "", "eval.index": "exact"}


def tiny(**more):
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({**OVERRIDES, **more})
    return cfg


def step_states(monkeypatch) -> list[list[tuple[str, tuple, jax.sharding.Sharding]]]:
    """Records, for every train step the runs below make, each leaf of the train state the
    step received and of the one it returned: (its path, global shape, sharding)."""
    seen = []
    make = step_lib.make_train_step

    def recording(*args, **kwargs):
        step = make(*args, **kwargs)

        def recorded(state, batch, norms=True):
            leaves = lambda s: [(jax.tree_util.keystr(p), x.shape, x.sharding)
                                for p, x in jax.tree_util.tree_leaves_with_path(s)]
            before = leaves(state)  # read before the call: the step donates its input
            new_state, metrics = step(state, batch, norms)
            seen.extend([before, leaves(new_state)])
            return new_state, metrics
        return recorded

    monkeypatch.setattr(step_lib, "make_train_step", recording)
    return seen


def assert_fsdp_sharded(state: list, n: int) -> None:
    """Every params and optimizer-state array of at least FSDP_MIN_SIZE elements with a
    dimension the n devices divide is split n ways over the mesh (each device holds 1/n of
    it), the smaller ones are replicated; the params and Adam's two moments of each big one
    count, so params and optimizer state alike are sharded."""
    big = {"params": 0, "opt_state": 0}
    for path, shape, where in state:
        part = next((k for k in big if path.startswith(f"['{k}']")), None)
        if part is None:
            continue
        assert len(where.device_set) == n, path
        size = int(np.prod(shape, dtype=np.int64))
        if size >= sharding.FSDP_MIN_SIZE and any(d % n == 0 for d in shape):
            assert not where.is_fully_replicated, path
            assert int(np.prod(where.shard_shape(shape))) * n == size, (path, where)
            big[part] += 1
        else:
            assert where.is_fully_replicated, path
    assert big["params"] >= 1 and big["opt_state"] >= 2 * big["params"], big


@pytest.mark.slow
def test_fsdp_trains_as_replicated_and_resumes_on_fewer_devices(tmp_path, monkeypatch):
    replicated = train.train_and_evaluate(tiny(), str(tmp_path / "replicated"))
    fsdp = str(tmp_path / "fsdp")
    states = step_states(monkeypatch)

    def stop_at_10(step, metrics):
        if step == 10:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(errors.Preempted):
        train.train_and_evaluate(tiny(**{"mesh.param_sharding": "fsdp"}), fsdp, hooks=[stop_at_10])
    # The state a step gets (the initialisation) and returns is FSDP-split over the 8
    # devices, params and optimizer state alike.
    assert len(states) == 20
    assert_fsdp_sharded(states[0], 8)
    assert_fsdp_sharded(states[-1], 8)
    # The same workdir goes on with 4 devices: Orbax re-splits the saved arrays.
    states.clear()
    resumed = train.train_and_evaluate(
        tiny(**{"mesh.param_sharding": "fsdp", "mesh.num_devices": 4}), fsdp)
    assert len(states) == 20  # steps 11..20: the restored state and the last one
    assert_fsdp_sharded(states[0], 4)
    assert_fsdp_sharded(states[-1], 4)
    a = checkpoints.latest_params(str(tmp_path / "replicated"))
    b = checkpoints.latest_params(fsdp)
    assert a[0] == b[0] == 20
    for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    assert resumed["dual_encoder [exact]"]["map@100"] == pytest.approx(
        replicated["dual_encoder [exact]"]["map@100"], abs=1e-3)


def test_model_spec_by_hand():
    """The model axis takes a weight's heads or MLP columns (Megatron's cut), a token
    table's rows when they divide; FSDP then takes another dimension over `data`."""
    mesh = sharding.make_mesh(8, model=4)
    assert (sharding.data_size(mesh), mesh.shape["model"]) == (2, 4)
    spec = lambda shape, names, strategy="replicated": sharding.param_spec(
        shape, mesh, strategy, names)
    assert spec((128, 4, 32), ("embed", "heads", "kv")) == P(None, "model", None)  # q, k, v
    assert spec((4, 32, 128), ("heads", "kv", "embed")) == P("model", None, None)  # out
    assert spec((128, 512), ("embed", "mlp")) == P(None, "model")
    assert spec((512, 128), ("mlp", "embed")) == P("model", None)
    assert spec((128,), ("embed",)) == P()  # a norm, a bias of the width: whole
    assert spec((2000, 128), ("vocab", "embed")) == P("model", None)
    assert spec((2001, 128), ("vocab", "embed")) == P()
    assert spec((128, 512), ("embed", "mlp"), "fsdp") == P("data", "model")
    with pytest.raises(ValueError, match=r"mesh.model_axis=4 does not divide the 37 mlp of "
                                         r"tower/mlp_in/kernel \(32, 37\)"):
        sharding.param_spec((32, 37), mesh, "replicated", ("embed", "mlp"),
                            "tower/mlp_in/kernel")
    with pytest.raises(ValueError, match="mesh.model_axis=3 must be at least 1 and divide"):
        sharding.make_mesh(8, model=3)


def test_a_model_axis_that_splits_no_weight_is_refused_naming_it_before_anything_is_written(
        tmp_path):
    """It was refused when the sharded state was made (after the tables and the
    vocabulary), naming the optimizer's copy (opt_state/.../key_bias) of the weight."""
    from dualjax.errors import ConfigError
    cfg = tiny(**{"model.tower": "bert", "model.tokenizer": "hf", "mesh.model_axis": 4,
                  "model.pretrained": tiny_bert_with_mlp(tmp_path / "bert", 37)})
    with pytest.raises(ConfigError, match=r"^config.mesh.model_axis=4 does not divide the 37 "
                                          r"mlp of params/tower/layer_0/mlp_in/bias \(37,\)"):
        train.train_and_evaluate(cfg, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def tiny_bert_with_mlp(folder, mlp: int):
    """The tiny BERT fixture with an MLP of `mlp` columns (random weights there): its
    37 columns split over no model axis."""
    import shutil

    from safetensors.numpy import load_file, save_file
    source = os.path.join(conftest.FIXTURES, "pretrained", "tiny_bert")
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    old, config["intermediate_size"] = config["intermediate_size"], mlp
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    tensors = {k: (rng.normal(0, 0.2, [mlp if d == old else d for d in v.shape])
                   .astype(v.dtype) if old in v.shape else v)
               for k, v in load_file(folder / "model.safetensors").items()}
    save_file(tensors, folder / "model.safetensors")
    return str(folder)


def transformer_state():
    """A tiny transformer tower's train state (params and AdamW's moments) as shapes,
    and its params' logical axis names."""
    cfg = tiny(**{"model.tower": "transformer", "model.transformer.width": 32,
                  "model.transformer.mlp_dim": 64, "model.transformer.num_heads": 4}).model
    model = dual_encoder.make_model(model_spec(cfg), 2000 + 1 + 50)
    tx = optax.adamw(1e-3)

    def init(seed):
        params = dual_encoder.init_params(model, jax.random.PRNGKey(seed), 16)
        return {"params": params, "opt_state": tx.init(params)}

    return jax.eval_shape(init, 0), dual_encoder.logical_axes(model, 16)


def test_the_transformer_towers_weights_split_over_the_model_axis():
    """Every attention and MLP weight of the transformer tower (and its Adam moments)
    gets `model` on its heads or MLP columns; norms and the width's biases stay whole.
    (The BERT tower, made of the same layers, trains below.)"""
    shapes, names = transformer_state()
    got = sharding.state_shardings(shapes, sharding.make_mesh(8, model=4), "replicated", names)
    specs = {jax.tree_util.keystr(p): s.spec for p, s in
             jax.tree_util.tree_leaves_with_path(got)}
    weights = {p: s for p, s in specs.items() if "layer" in p and "kernel" in p}
    assert len(weights) >= 12 and all("model" in tuple(s) for s in weights.values()), weights
    assert all(s == P() for p, s in specs.items() if "norm" in p or "out_bias" in p)


def test_the_names_are_looked_up_only_where_they_can_change_a_sharding():
    """A data mesh with replicated params shards the state the same without the params'
    logical names, so a run does not trace the model's initialisation once more to find
    them (`sharding.names_matter`); a model axis splits what they name, and FSDP prefers
    the dimensions they name."""
    shapes, names = transformer_state()
    same = lambda mesh, strategy: (sharding.state_shardings(shapes, mesh, strategy, names)
                                   == sharding.state_shardings(shapes, mesh, strategy, None))
    for devices in (1, 2, 8):
        mesh = sharding.make_mesh(devices)
        assert not sharding.names_matter(mesh, "replicated") and same(mesh, "replicated")
        assert sharding.names_matter(mesh, "fsdp")
    mesh = sharding.make_mesh(8, model=4)
    assert sharding.names_matter(mesh, "replicated") and not same(mesh, "replicated")


@pytest.mark.slow
def test_a_data_by_model_mesh_trains_as_the_data_mesh(tmp_path, monkeypatch):
    """8 devices as 2 (data) x 4 (model): every BERT weight and its Adam
    moments split 4 ways on heads or MLP columns, the batch 2 ways, the in-batch softmax
    still over the whole global batch; 6 steps end within 1e-5 of the 8 x 1 run: the
    loss of every step and every parameter (but the key bias, whose gradient is 0)."""
    more = {"model.tower": "bert", "num_train_steps": 6, "checkpoint_every_steps": 6,
            "optimizer.warmup_steps": 1, "data.tfds_dir": str(tmp_path / "tfds")}
    more.update({"model.pretrained": tiny_bert_with_mlp(tmp_path / "bert", 40),
                 "model.tokenizer": "hf", "model.max_len": 16})
    a = train.train_and_evaluate(tiny(**more), str(tmp_path / "data"))
    states = step_states(monkeypatch)
    b = train.train_and_evaluate(tiny(**more, **{"mesh.model_axis": 4}), str(tmp_path / "dm"))
    split = {path: s.spec for path, _, s in states[-1]}
    kernels = [spec for path, spec in split.items() if "params" in path
               and ("mlp_in" in path or "'q_kernel'" in path)]
    assert kernels and all("model" in tuple(spec) for spec in kernels), split
    assert any("model" in tuple(spec) for path, spec in split.items() if "opt_state" in path)
    losses = lambda w: [r["loss"] for r in map(json.loads, open(w / "metrics.jsonl"))
                        if r["split"] == "train"]
    np.testing.assert_allclose(losses(tmp_path / "dm"), losses(tmp_path / "data"), atol=1e-5)
    (step_a, pa), (step_b, pb) = (checkpoints.latest_params(str(tmp_path / w))
                                  for w in ("data", "dm"))
    assert step_a == step_b == 6
    # The attention's key bias adds one constant to every logit of a query: the softmax
    # ignores it, its true gradient is 0, and Adam turns the rounding noise of a sum
    # ordered otherwise into steps of the learning rate's size (the multi-process test
    # meets the same with the affine similarity's bias). Every other weight must agree.
    bad = [(jax.tree_util.keystr(path), float(np.max(np.abs(x - y))))
           for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(pa),
                                   jax.tree.leaves(pb), strict=True)
           if "key_bias" not in jax.tree_util.keystr(path)
           and not np.allclose(x, y, atol=1e-5, rtol=0)]
    assert not bad, bad
    assert b["dual_encoder [exact]"]["map@100"] == pytest.approx(
        a["dual_encoder [exact]"]["map@100"], abs=1e-4)
