"""PSES: partially shared embedding spaces (Li & Jia 2018, "Neural Retrieval with
Partially Shared Embedding Spaces").

A trunk from the tower registry (`model.tower`; the paper's averaged word embeddings is
"bow") turns a text into its input representation x. Three feed-forward encoders read x:
NN_s ("shared", both sides) gives z_s, NN_q ("query_specific") gives z_q for queries and
NN_d ("doc_specific") z_d for documents. Two decoders ("query_decoder", "doc_decoder")
reconstruct x from [z_s; z_q] and [z_s; z_d]. The retrieval vectors are the unit vectors
of [z_s(q); z_q(q)] and [z_s(d); z_d(d)] (`model.pses.score="concat"`, our reading: the
paper does not say how the spaces are combined) or of z_s alone ("shared").

With model.shared_towers=True (the default) both sides read one trunk (one word
table, as the paper's); False gives each side its own (query_trunk, doc_trunk). The
critic that reads z_s is not part of the model: it is the PSES objective's second player
(`objectives.pses`). Categorical features are not read.
"""
from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from dualjax.models import towers
from dualjax.models.dual_encoder import l2_normalize, scale_and_bias, similarity_params
from dualjax.models.spec import ModelSpec

SCORES = ("concat", "shared")
PAIRWISE = ("hinge", "in_batch")  # loss.pses.pairwise: the matching loss
TRAINABLE = ("all", "shared")     # loss.pses.trainable: every param, or NN_s alone
ENCODERS = ("shared", "query_specific", "doc_specific")  # NN_s, NN_q, NN_d
DECODERS = ("query_decoder", "doc_decoder")             # NN_rq, NN_rd


class Mlp(nn.Module):
    """`layers` tanh hidden layers of `hidden_dim`, then a linear layer to `output_dim`."""
    layers: int
    hidden_dim: int
    output_dim: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for i in range(self.layers):
            x = jnp.tanh(nn.Dense(self.hidden_dim, name=f"hidden_{i}")(x))
        return nn.Dense(self.output_dim, name="output")(x)


class Codes(NamedTuple):
    """One side's PSES codes for a batch: each [batch, size]."""
    x: jnp.ndarray              # the trunk's input representation
    shared: jnp.ndarray         # z_s
    specific: jnp.ndarray       # z_q (queries) or z_d (documents)
    reconstruction: jnp.ndarray  # the side's decoder on [z_s; z_specific], shaped like x


def retrieval_vector(c: Codes, score: str = "concat") -> jnp.ndarray:
    """The unit vector [batch, size] a side is searched by: of [z_s; z_specific]
    (score="concat") or of z_s ("shared")."""
    if score == "shared":
        return l2_normalize(c.shared)
    return l2_normalize(jnp.concatenate([c.shared, c.specific], axis=-1))


class Pses(nn.Module):
    """Same interface as `dual_encoder.DualEncoder` (encode_queries, encode_documents,
    scale_and_bias, logical axes through the trunk), plus `codes` for the PSES losses."""
    spec: ModelSpec
    vocab_size: int
    query_features: tuple[tuple[int, int], ...] = ()
    doc_features: tuple[tuple[int, int], ...] = ()
    num_tasks: int = 1

    def setup(self):
        cfg, p = self.spec, self.spec.pses
        q_tower, d_tower = cfg.towers
        if cfg.shared_towers:
            self.query_trunk = towers.build(q_tower, cfg, self.vocab_size, "trunk")
            self.doc_trunk = self.query_trunk
        else:
            self.query_trunk = towers.build(q_tower, cfg, self.vocab_size, "query_trunk")
            self.doc_trunk = towers.build(d_tower, cfg, self.vocab_size, "doc_trunk")
        x_dims = towers.output_dim(cfg, q_tower), towers.output_dim(cfg, d_tower)
        self.shared = Mlp(p.hidden_layers, p.hidden_dim, p.shared_dim, name="shared")
        self.query_specific = Mlp(p.hidden_layers, p.hidden_dim, p.specific_dim,
                                  name="query_specific")
        self.doc_specific = Mlp(p.hidden_layers, p.hidden_dim, p.specific_dim,
                                name="doc_specific")
        self.query_decoder = Mlp(p.hidden_layers, p.hidden_dim, x_dims[0], name="query_decoder")
        self.doc_decoder = Mlp(p.hidden_layers, p.hidden_dim, x_dims[1], name="doc_decoder")
        self.similarity = similarity_params(self, cfg, self.num_tasks)

    def codes(self, ids: jnp.ndarray, mask: jnp.ndarray, side: str) -> Codes:
        """The codes of a batch of queries (side="query") or documents ("document")."""
        query = side == "query"
        x = (self.query_trunk if query else self.doc_trunk)(ids, mask)
        z_s = self.shared(x)
        z = (self.query_specific if query else self.doc_specific)(x)
        decoded = (self.query_decoder if query else self.doc_decoder)(
            jnp.concatenate([z_s, z], axis=-1))
        return Codes(x, z_s, z, decoded)

    def encode_queries(self, ids: jnp.ndarray, mask: jnp.ndarray, cats=None) -> jnp.ndarray:
        return retrieval_vector(self.codes(ids, mask, "query"), self.spec.pses.score)

    def encode_documents(self, ids: jnp.ndarray, mask: jnp.ndarray, cats=None) -> jnp.ndarray:
        return retrieval_vector(self.codes(ids, mask, "document"), self.spec.pses.score)

    def scale_and_bias(self, task=None) -> tuple[jnp.ndarray, jnp.ndarray]:
        return scale_and_bias(self.spec, self.similarity, task)

    def __call__(self, q_ids, q_mask, d_ids, d_mask, q_cats=None, d_cats=None, task=None):
        """Both sides' codes and the similarity (creates every parameter at init)."""
        q, d = self.codes(q_ids, q_mask, "query"), self.codes(d_ids, d_mask, "document")
        scale, bias = self.scale_and_bias(task)
        return q, d, scale, bias


def make_model(spec: ModelSpec, vocab_size: int, num_tasks: int = 1) -> Pses:
    return Pses(spec, vocab_size, num_tasks=num_tasks)
