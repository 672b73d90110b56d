"""What `dualjax.export` writes from a trained model: a serving bundle (`bundle.py`:
the towers lowered with jax.export, the params, the vocabularies) or a
sentence-transformers folder (`st_folder.py`). Each is written beside its output folder,
then renamed: a failure leaves the folder as it was and nothing else behind.

The model comes from a `load` the caller passes (`dualjax.export` reads a training
workdir with `train.trained.load_trained`; serve/ never imports train/), called only
once the output folder is checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from dualjax.models import layers, lora
from dualjax.models.lora import LoraSpec
from dualjax.runtime.files import (
    OUTPUT_MARKERS,
    atomic_write,
    check_output,
    file_digests,
    staged_output,
)
from dualjax.serve import st_folder
from dualjax.serve.bundle import FORMAT, SIDES, Encoder, bundle_id
from dualjax.text import sides

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for
# A bundle never lies inside another bundle or an index, whose --overwrite would delete
# it (inside the workdir it came from is fine: runs/NAME/export).
NOT_INSIDE = ("bundle", "corpus index", "sentence-transformers folder")
FORMATS = ("bundle", "sentence-transformers")
ST_MARKER = OUTPUT_MARKERS["sentence-transformers folder"]  # records the folder's files


class Exported(NamedTuple):
    """A trained model as it is exported: the Flax model (`models.make_model`'s), its
    inputs (tokenizers, max lengths, prompts, fields), its params, its step and the
    system it trained ("dual_encoder", "pses")."""
    model: Any
    inputs: sides.Inputs
    params: dict
    step: int
    system: str


def write_bundle(workdir: str, out: str, load: Callable[[], Exported],
                 platforms: Sequence[str] = ("cpu", "cuda", "tpu"),
                 overwrite: bool = False) -> Encoder:
    """Writes the bundle of the model `load()` gives (trained in `workdir`, whose
    vocabularies it copies) to `out`.

    Args:
      workdir: the training run's workdir.
      out: new, empty or (with `overwrite`) a bundle holding only its own files; never the
        workdir, a folder holding it, or a folder inside a bundle or an index
        (`runtime.files.check_output`).
      load: the model, called once `out` is checked.
      platforms: the jax platforms the exported functions are lowered for.

    Returns:
      The bundle, loaded from `out`.
    """
    check_platforms(platforms)
    with staged_output(out) as stage:  # one writer: a second export into `out` is refused
        check_output(out, "encoder.json", "bundle", inputs=[workdir], overwrite=overwrite,
                     not_inside=NOT_INSIDE)
        trained, params = merged(load())
        _write_bundle(stage(), workdir, trained, params, platforms)
    return Encoder.load(out)


def merged(trained: Exported) -> tuple[Exported, dict]:
    """(the model as exported, its params on the host), LoRA's adapters folded into the
    weights (`models.lora.merge`) and the model without them: an export's reader
    needs no adapters."""
    model, params = trained.model, jax.device_get(trained.params)
    if not model.spec.lora.rank:
        return trained, params
    plain = model.clone(spec=dataclasses.replace(model.spec, lora=LoraSpec()))
    params = lora.merge(params, model.spec.lora)
    return trained._replace(model=plain, params=params), params


def check_platforms(platforms: Sequence[str]) -> None:
    """ValueError naming a platform jax.export does not lower for."""
    unknown = sorted(set(platforms) - set(PLATFORMS)) or ([] if platforms else ["(none)"])
    if unknown:
        raise ValueError(f"--platforms: {', '.join(unknown)} is not one of jax's: "
                         f"{', '.join(PLATFORMS)}")


def write_st_folder(workdir: str, out: str, load: Callable[[], Exported],
                    overwrite: bool = False) -> dict:
    """Writes the model `load()` gives (trained in `workdir`) as a sentence-transformers
    folder at `out` (`st_folder.py`): `SentenceTransformer(out)` gives the bundle's
    vectors.

    Args:
      workdir: the training run (a BERT-family tower on each side).
      out: as `write_bundle`'s; an existing folder must be one this wrote.
      load: the model, called once `out` is checked.

    Returns:
      The folder's record (dualjax_export.json): the run, the step and every file's
      sha256. ValueError, before anything is written, for a model sentence-transformers
      cannot represent, naming the part.
    """
    with staged_output(out) as stage:
        check_output(out, ST_MARKER, "sentence-transformers folder", inputs=[workdir],
                     overwrite=overwrite, not_inside=NOT_INSIDE)
        trained, params = merged(load())
        why = st_folder.refusal(trained.model.spec, trained.inputs, trained.model.architecture)
        if why:
            raise ValueError(f"--format=sentence-transformers: {why}")
        tmp = stage()
        names = st_folder.write(tmp, trained.model.spec, trained.inputs, params,
                                trained.model.architecture)
        record = {"format": "sentence-transformers", "workdir": os.path.abspath(workdir),
                  "step": trained.step, "files": file_digests(tmp, sorted(names))}
        atomic_write(os.path.join(tmp, ST_MARKER), json.dumps(record, indent=1) + "\n")
    return record


def _write_bundle(tmp: str, workdir: str, trained: Exported, params: dict,
                  platforms: Sequence[str]) -> None:
    """The bundle's files in `tmp`: each side's encoder lowered with jax.export (batch
    and length symbolic), the params, the vocabularies and encoder.json."""
    model, inputs = trained.model, trained.inputs
    dims = {}
    for side, method in zip(SIDES, ("encode_queries", "encode_documents"), strict=True):
        s = getattr(inputs, side)

        def encode(params, ids, mask, cats=None, method=method):
            return model.apply({"params": params}, ids, mask, cats, method=method)

        # Batch size and length symbolic: a batch of short texts runs at its own length.
        batch, length = jax.export.symbolic_shape(
            "b, l", constraints=(f"l <= {s.max_len}", "l >= 1"))
        args = [jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params),
                jax.ShapeDtypeStruct((batch, length), jnp.int32),
                jax.ShapeDtypeStruct((batch, length), jnp.bool_)]
        if s.features:
            args.append(jax.ShapeDtypeStruct((batch, len(s.features.fields)), jnp.int32))
        with layers.portable_attention():  # (no cuDNN kernel in a program for every platform)
            exported = jax.export.export(jax.jit(encode), platforms=tuple(platforms))(*args)
        dims[side] = exported.out_avals[0].shape[-1]
        with open(os.path.join(tmp, f"{side}.jax_export"), "wb") as f:
            f.write(exported.serialize())
    with open(os.path.join(tmp, "params.msgpack"), "wb") as f:
        f.write(serialization.msgpack_serialize(jax.tree.map(np.asarray, params)))
    for name in ("vocab.json", "features.json"):
        if os.path.exists(os.path.join(workdir, name)):
            shutil.copyfile(os.path.join(workdir, name), os.path.join(tmp, name))
    files = file_digests(tmp, sorted(os.listdir(tmp)))  # checked by Encoder.load
    meta = {"format": FORMAT, "id": bundle_id(files), "files": files,
            "model": trained.system,
            "step": trained.step,
            "workdir": os.path.abspath(workdir), "dim": dims["query"],
            "max_len": {side: getattr(inputs, side).max_len for side in SIDES},
            "prompts": {side: getattr(inputs, side).prompt for side in SIDES},
            "length": "symbolic",  # texts are encoded at their batch's length bucket
            "platforms": list(platforms), "jax": jax.__version__}
    atomic_write(os.path.join(tmp, "encoder.json"), json.dumps(meta, indent=1) + "\n")
