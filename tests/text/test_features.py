"""Categorical features: spec parsing, ids (vocabulary, hashed buckets, missing), the
embedding tables in the towers, and the config checks."""
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

from dualjax import errors
from dualjax.config import validation as config_lib
from dualjax.config.specs import max_lens, model_spec
from dualjax.models import dual_encoder
from dualjax.text import features, sides


def test_parse_spec():
    assert features.parse_spec("category:32, brand", 8) == (("category", 32), ("brand", 8))
    assert features.parse_spec("", 8) == ()
    for bad in ("category:0", "category:x", "9lives", "a b", "shop,shop"):
        with pytest.raises(ValueError, match="model.doc_features"):
            features.parse_spec(bad, 8)


def test_ids_vocabulary_buckets_and_missing():
    side = features.build_side(
        [("shop", 4), ("year", 2)],
        [{"shop": "b", "year": 2020}, {"shop": "a"}, {"shop": "b"}, None, {"shop": ""}],
        vocab_size=2, num_buckets=5)
    shop, year = side.fields
    assert shop.vocab == ("b", "a") and year.vocab == ("2020",)  # most frequent first
    assert (shop.size, year.size) == (1 + 2 + 5, 1 + 1 + 5)
    ids = side.encode([{"shop": "a", "year": 2020}, {"shop": "zzz"}, {"year": None}, None,
                       {"shop": True}])
    assert ids.dtype == np.int32 and ids.shape == (5, 2)
    assert ids[0].tolist() == [2, 1]
    # An unseen value lands in a bucket after the vocabulary, by CRC-32 (stable).
    assert ids[1, 0] == 1 + 2 + zlib.crc32(b"zzz") % 5
    assert ids[1, 1] == ids[2, 0] == ids[2, 1] == features.MISSING_ID  # absent / null
    assert ids[3].tolist() == [0, 0]  # a record without fields
    assert ids[4, 0] == 3 + zlib.crc32(b"true") % 5
    assert side.missing_counts(ids) == {"shop": 2, "year": 4}


def test_bucket_ids_are_the_same_in_another_process():
    side = features.build_side([("shop", 4)], [{"shop": "known"}], 10, 1000)
    here = side.encode([{"shop": v} for v in ("unseen-1", "unseen-2", "ünïcode")])[:, 0]
    code = ("from dualjax.text import features as f;"
            "s = f.build_side([('shop', 4)], [{'shop': 'known'}], 10, 1000);"
            "print(s.encode([{'shop': v} for v in ('unseen-1', 'unseen-2', 'ünïcode')])[:, 0]"
            ".tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123"}).stdout
    assert out.strip() == str(here.tolist())


def test_save_load_round_trip(tmp_path):
    q = features.build_side([("lang", 3)], [{"lang": "pl"}], 5, 2)
    d = features.build_side([("shop", 4), ("brand", 6)], [{"shop": "a", "brand": "x"}], 5, 7)
    features.save(str(tmp_path / "features.json"), q, d)
    assert features.load(str(tmp_path / "features.json")) == (q, d)


def _config(overrides):
    cfg = load_config("tiny")
    cfg.update_from_flattened_dict(overrides)
    return cfg


def _model(**overrides):
    cfg = _config({"model.tower": "bow_mlp", "model.shared_towers": False,
                   "model.doc_features": "shop:4,brand:3", **overrides}).model
    sizes = {"query": (), "document": ((1 + 2 + 3, 4), (1 + 1 + 3, 3))}
    model = dual_encoder.make_model(model_spec(cfg), 50, sizes)
    return model, dual_encoder.init_params(model, jax.random.PRNGKey(0), 8)


@pytest.mark.parametrize("tower", ["bow_mlp", "cnn", "transformer"])
@pytest.mark.slow
def test_features_change_the_document_vector_and_padding_does_not(tower):
    model, params = _model(**{"model.tower": tower})
    assert params["doc_feature_0"]["embedding"].shape == (6, 4)
    assert params["doc_feature_1"]["embedding"].shape == (5, 3)
    assert not any(k.startswith("query_feature") for k in params)
    ids = jnp.asarray([[3, 4, 5, 0, 0, 0]] * 3, jnp.int32)
    mask = ids != 0
    cats = jnp.asarray([[1, 1], [2, 1], [0, 0]], jnp.int32)
    enc = lambda i, m, c: model.apply({"params": params}, i, m, c, method="encode_documents")
    out = np.asarray(enc(ids, mask, cats))
    assert not np.allclose(out[0], out[1]) and not np.allclose(out[0], out[2])
    padded = jnp.pad(ids, ((0, 0), (0, 4)))  # appending pads changes nothing
    np.testing.assert_allclose(enc(padded, padded != 0, cats), out, atol=1e-5)
    # The query side has no fields: it takes none.
    q = model.apply({"params": params}, ids, mask, method="encode_queries")
    assert q.shape == out.shape
    with pytest.raises(ValueError, match="categorical ids for 2"):
        enc(ids, mask, None)


@pytest.mark.parametrize("overrides,message", [
    ({"model.tower": "bow"}, "bow tower has no layer"),
    ({"model.doc_tower": "bow", "model.tower": "bow_mlp", "model.embed_dim": 64,
      "model.output_dim": 64}, "bow tower has no layer"),
    ({"model.shared_towers": True}, "one shared tower"),
    ({"model.doc_features": "shop:-1"}, "model.doc_features"),
    ({"model.feature_buckets": -1}, "model.feature_buckets"),
    ({"model.query_max_len": -4}, "model.query_max_len"),
    ({"model.tower": "transformer", "model.doc_max_len": 600}, "max_positions"),
])
def test_bad_feature_and_length_configs_fail_at_config_time(overrides, message):
    cfg = _config({"model.tower": "bow_mlp", "model.shared_towers": False,
                   "model.doc_features": "shop", **overrides})
    with pytest.raises(errors.ConfigError, match=message):
        config_lib.validate(cfg, 1)


def test_max_lens_default_to_max_len():
    cfg = load_config("tiny").model
    assert max_lens(cfg) == (cfg.max_len, cfg.max_len)
    cfg.query_max_len, cfg.doc_max_len = 64, 288
    assert max_lens(cfg) == (64, 288)


def test_a_text_far_over_max_len_is_warned_about_once(monkeypatch, caplog):
    from dualjax.text import words as text
    tok = text.build_word_tokenizer(["a b c"], 10, 2)
    side = sides.Side(tok, max_len=4)
    monkeypatch.setattr(sides, "_warned_long", [False])
    side.encode(["a " * 400])  # 400 words: exactly 100 x max_len, not over
    assert not [m for m in caplog.messages if "max_len" in m]
    out = side.encode(["a b", "b " * 401, "c " * 999])
    assert out["ids"].shape == (3, 4)
    side.encode(["c " * 999])
    [message] = [m for m in caplog.messages if "max_len" in m]
    assert message.startswith("a text of 401 words (802 characters) is over 100 x max_len=4")
