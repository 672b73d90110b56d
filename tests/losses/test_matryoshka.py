"""Matryoshka embeddings (issue 32; Kusupati et al. 2022): loss.matryoshka_dims sums the
in-batch loss over nested prefixes of the vectors, eval.dims evaluates the trained model
at them, and `Encoder(dim=)` / `dualjax.index --dim` read a bundle's vectors cut and
renormalised, the search reading its queries at the index's width."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors, losses
from dualjax.config import specs, validation


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.slow
def test_the_loss_is_the_full_ones_plus_each_renormalised_prefixs():
    rng = np.random.default_rng(0)
    q, d = (jnp.asarray(_unit(rng.normal(size=(6, 8))), jnp.float32) for _ in range(2))
    mixed = jnp.asarray(_unit(rng.normal(size=(3, 8))), jnp.float32)
    fn = losses.reference("in_batch_softmax")
    scale, bias = jnp.float32(10.0), jnp.float32(0.0)
    extras = {"mixed_negatives": mixed}
    total, metrics = losses.matryoshka(fn, (2, 4))(q, d, scale, bias, extras)
    by_hand = fn(q, d, scale, bias, extras)[0]
    for m in (2, 4):
        cut = lambda x, m=m: jnp.asarray(_unit(np.asarray(x)[:, :m]))
        part = fn(cut(q), cut(d), scale, bias, {"mixed_negatives": cut(mixed)})[0]
        np.testing.assert_allclose(metrics[f"loss@{m}"], part, rtol=1e-6)
        by_hand = by_hand + part
    np.testing.assert_allclose(total, by_hand, rtol=1e-6)
    assert losses.matryoshka(fn, ()) is fn
    with pytest.raises(ValueError, match="8 is not below the embedding's 8 dimensions"):
        losses.matryoshka(fn, (8,))(q, d, scale, bias)


@pytest.mark.parametrize("key, value, message", [
    ("loss.matryoshka_dims", "64,x", "'x' is not a dimension"),
    ("loss.matryoshka_dims", "128,64", "smallest first"),
    ("eval.dims", "0", "'0' is not a dimension"),
])
def test_dimension_lists_that_do_not_parse_are_refused(key, value, message):
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({key: value})
    with pytest.raises(errors.ConfigError, match=f"config.{key}=.*{message}"):
        validation.validate(cfg, 8)


@pytest.mark.parametrize("key, value, width", [
    ("loss.matryoshka_dims", "4,32", 16), ("eval.dims", "16", 16),
    ("loss.matryoshka_dims", "8", "bow")])
def test_prefixes_as_wide_as_the_model_are_refused_before_anything_is_written(
        tmp_path, key, value, width):
    """The jitted loss found loss.matryoshka_dims=32 on a 16-wide model after the data,
    the vocabulary and config.json were written; eval.dims, after every step."""
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({key: value})
    if width == "bow":  # a bow tower's vectors are embed_dim wide, not output_dim
        cfg.update_from_flattened_dict({"model.tower": "bow", "model.embed_dim": 8})
        width = 8
    top = value.split(",")[-1]
    with pytest.raises(errors.ConfigError, match=rf"^config.{key}='{value}': {top} is not "
                                                     rf"below the model's {width} dimensions"):
        train.train_and_evaluate(cfg, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_pses_has_no_matryoshka_loss():
    cfg = load_config("pses")
    cfg.loss.matryoshka_dims = "16"
    with pytest.raises(errors.ConfigError, match="model.name='pses' and MLM"):
        validation.validate(cfg, 8)


@pytest.mark.slow
def test_a_run_trains_on_each_prefix_and_serves_them(tmp_path):
    from dualjax import export, index, search
    from dualjax.train import loop as train
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict({"loss.matryoshka_dims": "4,8", "eval.dims": "4,8",
                                    "eval.untrained": False, "eval.baselines": "",
                                    "num_train_steps": 4, "log_every_steps": 2})
    assert specs.objective_spec(cfg).matryoshka_dims == (4, 8)
    workdir = str(tmp_path / "run")
    rows = train.train_and_evaluate(cfg, workdir)
    assert {"dual_encoder@4 [exact]", "dual_encoder@8 [exact]"} <= set(rows)
    logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert any("loss@4" in r and "loss@8" in r for r in logged if r.get("split") == "train")

    full = export.export(workdir, str(tmp_path / "bundle"), platforms=("cpu",))
    texts = ["how do i cook rice", "best way to learn guitar", "cheap flights to rome"]
    at4 = full.at_dim(4)
    assert at4.dim == 4 and at4.id == full.id + "@4"
    np.testing.assert_allclose(at4.encode_documents(texts),
                               _unit(full.encode_documents(texts)[:, :4]), atol=1e-6)
    with pytest.raises(ValueError, match="dim=17: this bundle's vectors have 16"):
        full.at_dim(17)
    for odd in ("8", True, 4.0):  # a comparison's TypeError, and 1-d vectors for True
        with pytest.raises(TypeError, match=rf"dim={odd!r}: give the number of dimensions as "
                                            r"an int \(1 to 16\), or None for all"):
            full.at_dim(odd)

    # An index built at 4 dimensions: the search reads its queries at 4 too.
    ids = [f"d{i}" for i in range(len(texts))]
    index.build(at4, ids, texts, str(tmp_path / "idx4"), kind="exact")
    assert index.recorded_dim(str(tmp_path / "idx4")) == 4
    searcher = search.from_bundle(str(tmp_path / "bundle"), str(tmp_path / "idx4"), k=1)
    assert [r[0][1] for r in searcher.search(texts)] == texts
    with pytest.raises(ValueError, match="build it again with this encoder"):
        index.CorpusIndex(str(tmp_path / "idx4"), full.id)  # the full width: refused
    jax.clear_caches()
