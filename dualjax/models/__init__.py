"""Models: `dual_encoder` (two towers) and `pses` (partially shared spaces), chosen by
`model.name`; both give encode_queries / encode_documents and the similarity's scale and
bias, so evaluation and search treat them alike."""

from __future__ import annotations

from collections.abc import Callable

import jax

# Each tower's module registers it (`towers.TOWERS`), in the order model.tower's errors
# list them.
# isort: off
from dualjax.models import bow, cnn, transformer  # noqa: F401
from dualjax.models import bert, decoder, modernbert  # noqa: F401
# isort: on
from dualjax.models import dual_encoder, pses, towers
from dualjax.models.spec import ModelSpec

MODELS = ("dual_encoder", "pses")


def make_model(spec: ModelSpec, vocab_size: int, feature_sizes: dict | None = None,
               num_tasks: int = 1, architecture=None):
    """The model `spec.name` names (see `dual_encoder.make_model`); architecture: a
    pretrained start's (`BertConfig`, `DecoderConfig`), for the tower built from it."""
    if spec.name == "pses":
        return pses.make_model(spec, vocab_size, num_tasks)
    return dual_encoder.make_model(spec, vocab_size, feature_sizes, num_tasks, architecture)


def vector_dim(spec: ModelSpec, architecture=None) -> int:
    """The width of the unit vectors the model's towers return (both sides agree: the
    config checks say so first); architecture: a pretrained start's."""
    if spec.name == "pses":
        return spec.pses.shared_dim + (spec.pses.specific_dim if spec.pses.score == "concat"
                                       else 0)
    return towers.output_dim(spec, spec.query_tower, architecture)


def logical_axes(model, max_lens: tuple[int, int]):
    """The params tree with a PartitionSpec of logical axis names per param (what the
    towers declare), for sharding; None for a model that declares none (PSES)."""
    if isinstance(model, dual_encoder.DualEncoder):
        return dual_encoder.logical_axes(model, max(max_lens))
    return None


def make_encoders(model) -> tuple[Callable, Callable]:
    """Jitted (params, inputs) -> unit vectors, for the query and the document side;
    inputs: `sides.Side.encode`'s dict {"ids", "mask"[, "cats"]}."""
    q = jax.jit(lambda p, x: model.apply({"params": p}, **x, method="encode_queries"))
    d = jax.jit(lambda p, x: model.apply({"params": p}, **x, method="encode_documents"))
    return q, d
