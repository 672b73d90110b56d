"""The dual encoder: a query tower and a document tower (one shared, or two), L2-
normalised outputs, and the similarity's scale and bias that turn cosines into logits.

Pure-functional: build the module with `make_model(spec, vocab_size, feature_sizes)` (a
`ModelSpec`: `dualjax.config.specs.model_spec(config.model)`), get the params pytree (plain
arrays) from `init_params`, and call `model.apply({"params": p}, ids, mask, cats,
method="encode_queries")` and friends (cats: the side's categorical feature ids [batch,
num_fields], when it has any). `logical_axes` gives every param's logical axis names (a
PartitionSpec per param, same tree) for sharding them over a mesh.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dualjax.models import towers
from dualjax.models.spec import ModelSpec
from dualjax.models.towers import TOWERS


def tower_kinds() -> tuple[str, ...]:
    """model.tower names: the registered towers ("bert" and "decoder" among them)."""
    return tuple(TOWERS)


SIMILARITIES = ("cosine_affine", "cosine_temperature", "cosine_learned_temperature")
# cosine_learned_temperature: log tau is clipped to this range (CLIP clips its logit scale
# 1/tau to at most 100).
LOG_TEMPERATURE_RANGE = (math.log(0.01), math.log(1.0))
SIMILARITY_PARAMS = ("alpha", "beta", "log_temperature")  # every other param is a tower's


def l2_normalize(x: jnp.ndarray, eps: float = 1e-12) -> jnp.ndarray:
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


def similarity_params(module: nn.Module, cfg: ModelSpec, num_tasks: int
                      ) -> dict[str, jnp.ndarray]:
    """The similarity's own params, made in `module`'s setup (top-level names in
    SIMILARITY_PARAMS; one per task when num_tasks > 1)."""
    shape = () if num_tasks == 1 else (num_tasks,)
    if cfg.similarity == "cosine_affine":
        return {"alpha": module.param("alpha", nn.initializers.constant(cfg.init_scale), shape),
                "beta": module.param("beta", nn.initializers.constant(cfg.init_bias), shape)}
    if cfg.similarity == "cosine_learned_temperature":
        return {"log_temperature": module.param(
            "log_temperature", nn.initializers.constant(math.log(cfg.temperature)), shape)}
    return {}


def scale_and_bias(cfg: ModelSpec, params: dict[str, jnp.ndarray],
                   task: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(scale, bias) such that logits = scale * cosine + bias, from `similarity_params`
    (of task `task` when there is one per task; None: task 0)."""
    pick = lambda x: x if x.ndim == 0 else x[0 if task is None else task]
    if cfg.similarity == "cosine_affine":
        return pick(params["alpha"]), pick(params["beta"])
    if cfg.similarity == "cosine_learned_temperature":
        log_tau = jnp.clip(pick(params["log_temperature"]), *LOG_TEMPERATURE_RANGE)
        return jnp.exp(-log_tau), jnp.float32(0.0)
    return jnp.float32(1.0 / cfg.temperature), jnp.float32(0.0)


class DualEncoder(nn.Module):
    """Two towers over token ids; embeddings are unit vectors [batch, dim].

    shared_towers=True: one tower (params under "tower") encodes both sides. Otherwise
    "query_tower" and "doc_tower" (each its own kind when model.query_tower / doc_tower
    are set); with shared_embedding=True they read one token table, params["embed"], built
    as the query tower would build its own, while the layers above stay separate.

    similarity = "cosine_affine": logits = alpha * cos + beta with learned alpha, beta
    (Gillick et al. 2018); "cosine_temperature": logits = cos / temperature, fixed
    (Mościcki 2022 uses 0.1); "cosine_learned_temperature": logits = cos / tau with
    log tau learned (CLIP, SigLIP), initialised at log(temperature) and clipped to
    LOG_TEMPERATURE_RANGE (tau in [0.01, 1]).
    """
    spec: ModelSpec
    vocab_size: int
    query_features: tuple[tuple[int, int], ...] = ()  # (table rows, size) per categorical field
    doc_features: tuple[tuple[int, int], ...] = ()
    num_tasks: int = 1  # several training tasks: one alpha and beta each (Gillick et al. §2)
    # the sizes of a tower built from model.pretrained (a BertConfig, a DecoderConfig)
    architecture: Any = None

    def _tower(self, kind: str, name: str, embed: nn.Module | None = None) -> nn.Module:
        return towers.build(kind, self.spec, self.vocab_size, name, embed, self.architecture)

    def setup(self):
        cfg = self.spec
        q_tower, d_tower = cfg.towers
        # Categorical fields: one table per field and side (shared towers: one set).
        self.query_tables = [self._feature_table(n, d, f"query_feature_{i}")
                             for i, (n, d) in enumerate(self.query_features)]
        self.doc_tables = (self.query_tables if cfg.shared_towers else
                           [self._feature_table(n, d, f"doc_feature_{i}")
                            for i, (n, d) in enumerate(self.doc_features)])
        if cfg.shared_towers:
            self.query_tower = self._tower(q_tower, "tower")
            self.doc_tower = self.query_tower
        else:
            embed = None
            if cfg.shared_embedding:
                self.embed = towers.make_embedding(cfg, self.vocab_size, q_tower, name="embed")
                embed = self.embed
            self.query_tower = self._tower(q_tower, "query_tower", embed)
            self.doc_tower = self._tower(d_tower, "doc_tower", embed)
        self.similarity = similarity_params(self, cfg, self.num_tasks)

    def _feature_table(self, rows: int, dim: int, name: str) -> nn.Embed:
        init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.1),
                                            ("feature_vocab", "feature_embed"))
        return nn.Embed(rows, dim, embedding_init=init, name=name)

    @staticmethod
    def _features(tables, cats: jnp.ndarray | None) -> jnp.ndarray | None:
        """The concatenated feature vectors [b, sum of sizes] of cats [b, num_fields]."""
        if not tables:
            return None
        if cats is None or cats.shape[-1] != len(tables):
            raise ValueError(f"expected categorical ids for {len(tables)} field(s), got "
                             f"{None if cats is None else cats.shape}")
        return jnp.concatenate([t(cats[:, i]) for i, t in enumerate(tables)], axis=-1)

    def encode_queries(self, ids: jnp.ndarray, mask: jnp.ndarray,
                       cats: jnp.ndarray | None = None) -> jnp.ndarray:
        return l2_normalize(self.query_tower(ids, mask, self._features(self.query_tables, cats)))

    def encode_documents(self, ids: jnp.ndarray, mask: jnp.ndarray,
                         cats: jnp.ndarray | None = None) -> jnp.ndarray:
        return l2_normalize(self.doc_tower(ids, mask, self._features(self.doc_tables, cats)))

    def document_token_states(self, ids: jnp.ndarray, mask: jnp.ndarray,
                              replace: jnp.ndarray, replacement: jnp.ndarray) -> jnp.ndarray:
        """The document tower's final token states [batch, len, width] (a Transformer),
        with the `replace`d tokens' embeddings set to `replacement` (MLM)."""
        return self.doc_tower(ids, mask, None, replace=replace, replacement=replacement,
                              return_states=True)[1]

    def scale_and_bias(self, task: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(scale, bias) such that logits = scale * cosine + bias (of task `task`, an int
        scalar, when the model has several; None: task 0)."""
        return scale_and_bias(self.spec, self.similarity, task)

    def __call__(self, q_ids, q_mask, d_ids, d_mask, q_cats=None, d_cats=None, task=None):
        """Both towers and the similarity (used to create every parameter at init)."""
        q = self.encode_queries(q_ids, q_mask, q_cats)
        d = self.encode_documents(d_ids, d_mask, d_cats)
        scale, bias = self.scale_and_bias(task)
        return q, d, scale, bias


# Which batch texts each tower's token table reads (prefixes of the "<prefix>_ids" fields:
# queries, documents, mixed and hard negatives), by the params' top-level key.
TABLE_READERS = {"tower": ("q", "d", "m", "n"), "embed": ("q", "d", "m", "n"),
                 "query_tower": ("q",), "doc_tower": ("d", "m", "n")}


def token_tables(params: dict) -> dict[tuple[str, ...], tuple[str, ...]]:
    """{module path of a token table (towers.TokenTable): the batch fields that index it},
    for `dualjax.train.lazy_rows` (the categorical feature tables are not token tables)."""
    out = {}
    for keypath, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(k.key for k in keypath)
        if keys[-1] == "embedding" and keys[0] in TABLE_READERS:
            out[keys[:-1]] = TABLE_READERS[keys[0]]
    return out


def make_model(spec: ModelSpec, vocab_size: int,
               feature_sizes: dict[str, tuple[tuple[int, int], ...]] | None = None,
               num_tasks: int = 1, architecture: Any = None) -> DualEncoder:
    """feature_sizes: {"query": ((rows, size), ...), "document": ...} of the categorical
    fields (`sides.Inputs.feature_sizes()`); None: none. num_tasks: training tasks,
    each with its own learned scale and bias. architecture: a pretrained start's sizes."""
    sizes = feature_sizes or {}
    return DualEncoder(spec, vocab_size,
                       tuple(sizes.get("query", ())), tuple(sizes.get("document", ())),
                       num_tasks, architecture)


def _init_boxed(model: nn.Module, rng: jax.Array, max_len: int) -> dict:
    """The params with their nn.LogicallyPartitioned boxes, from dummy inputs [1, max_len]."""
    ids = jnp.ones((1, max_len), jnp.int32)
    mask = jnp.ones((1, max_len), bool)
    cats = lambda sizes: jnp.zeros((1, len(sizes)), jnp.int32) if sizes else None
    return model.init(rng, ids, mask, ids, mask, cats(model.query_features),
                      cats(model.doc_features))["params"]


def init_params(model: nn.Module, rng: jax.Array, max_len: int) -> dict:
    """The params pytree for `model` (plain arrays, logical-axis boxes removed), from dummy
    inputs of length `max_len`."""
    return nn.meta.unbox(_init_boxed(model, rng, max_len))


def logical_axes(model: DualEncoder, max_len: int) -> dict:
    """The params tree of `model` with, per param, a PartitionSpec of logical axis names
    (e.g. P("vocab", "embed") for a token table, P("embed", "mlp") for a Transformer MLP
    kernel; P() for a param without names). Nothing is computed (jax.eval_shape)."""
    boxed = jax.eval_shape(lambda: _init_boxed(model, jax.random.key(0), max_len))
    return nn.get_partition_spec(boxed)
