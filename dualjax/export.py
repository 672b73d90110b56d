"""Export a trained workdir's latest checkpoint as a serving bundle (see `serve/bundle.py`)
or as a sentence-transformers folder (see `serve/st_folder.py`).

    python -m dualjax.export --workdir=runs/default --out=runs/default/export
    [--platforms=cpu,cuda,tpu] [--format=bundle|sentence-transformers]

Then `dualjax.Encoder.load(DIR)` encodes texts anywhere jax runs, without the workdir,
the config or the optimizer state; or, for a BERT-family run, `SentenceTransformer(DIR)`
does, with PyTorch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import serialization

from dualjax import cli
from dualjax.eval.metrics_log import setup_logging
from dualjax.runtime.files import (
    OUTPUT_MARKERS,
    atomic_write,
    check_output,
    file_digests,
    staged_output,
)
from dualjax.serve import st_folder
from dualjax.serve.bundle import FORMAT, SIDES, Encoder, bundle_id
from dualjax.train import trained as trained_lib

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for
# A bundle never lies inside another bundle or an index, whose --overwrite would delete
# it (inside the workdir it came from is fine: runs/NAME/export).
NOT_INSIDE = ("bundle", "corpus index", "sentence-transformers folder")
FORMATS = ("bundle", "sentence-transformers")
ST_MARKER = OUTPUT_MARKERS["sentence-transformers folder"]  # records the folder's files


def export(workdir: str, out: str, platforms: Sequence[str] = ("cpu", "cuda", "tpu"),
           overwrite: bool = False) -> Encoder:
    """Writes the bundle of `workdir`'s latest checkpoint to `out`. Written beside `out`,
    then renamed: a failure leaves `out` as it was and nothing else behind.

    Args:
      workdir: a training run's workdir with at least one checkpoint.
      out: new, empty or (with `overwrite`) a bundle holding only its own files; never the
        workdir, a folder holding it, or a folder inside a bundle or an index
        (`runtime.files.check_output`).
      platforms: the jax platforms the exported functions are lowered for.

    Returns:
      The bundle, loaded from `out`.
    """
    check_platforms(platforms)
    with staged_output(out) as stage:  # one writer: a second export into `out` is refused
        check_output(out, "encoder.json", "bundle", inputs=[workdir], overwrite=overwrite,
                     not_inside=NOT_INSIDE)
        trained = trained_lib.load_trained(workdir)
        params = jax.device_get(trained.params)
        _write_bundle(stage(), workdir, trained, params, platforms)
    return Encoder.load(out)


def check_platforms(platforms: Sequence[str]) -> None:
    """ValueError naming a platform jax.export does not lower for."""
    unknown = sorted(set(platforms) - set(PLATFORMS)) or ([] if platforms else ["(none)"])
    if unknown:
        raise ValueError(f"--platforms: {', '.join(unknown)} is not one of jax's: "
                         f"{', '.join(PLATFORMS)}")


def export_sentence_transformers(workdir: str, out: str, overwrite: bool = False) -> dict:
    """Writes `workdir`'s latest checkpoint as a sentence-transformers folder at `out`
    (`serve/st_folder.py`): `SentenceTransformer(out)` gives the bundle's vectors. Written
    beside `out`, then renamed, as `export`.

    Args:
      workdir: a training run with a BERT-family tower (model.pretrained) on each side.
      out: as `export`'s; an existing folder must be one this command wrote.

    Returns:
      The folder's record (dualjax_export.json): the run, the step and every file's
      sha256. ValueError, before anything is written, for a model sentence-transformers
      cannot represent, naming the part.
    """
    with staged_output(out) as stage:
        check_output(out, ST_MARKER, "sentence-transformers folder", inputs=[workdir],
                     overwrite=overwrite, not_inside=NOT_INSIDE)
        trained = trained_lib.load_trained(workdir)
        why = st_folder.refusal(trained.model.spec, trained.inputs, trained.model.bert)
        if why:
            raise ValueError(f"--format=sentence-transformers: {why}")
        tmp = stage()
        names = st_folder.write(tmp, trained.model.spec, trained.inputs,
                                jax.device_get(trained.params), trained.model.bert)
        record = {"format": "sentence-transformers", "workdir": os.path.abspath(workdir),
                  "step": trained.step, "files": file_digests(tmp, sorted(names))}
        atomic_write(os.path.join(tmp, ST_MARKER), json.dumps(record, indent=1) + "\n")
    return record


def _write_bundle(tmp: str, workdir: str, trained, params, platforms) -> None:
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
            "model": trained.spec.system,
            "step": trained.step,
            "workdir": os.path.abspath(workdir), "dim": dims["query"],
            "max_len": {side: getattr(inputs, side).max_len for side in SIDES},
            "prompts": {side: getattr(inputs, side).prompt for side in SIDES},
            "length": "symbolic",  # texts are encoded at their batch's length bucket
            "platforms": list(platforms), "jax": jax.__version__}
    atomic_write(os.path.join(tmp, "encoder.json"), json.dumps(meta, indent=1) + "\n")


def main(argv: list[str]) -> None:
    del argv
    setup_logging()
    f = flags.FLAGS
    try:
        check_platforms(f.platforms)
        if f.format == "sentence-transformers":
            if f["platforms"].present:  # (it was ignored without a word)
                raise ValueError("--platforms is for --format=bundle (jax.export); a "
                                 "sentence-transformers folder runs wherever PyTorch does")
            record = export_sentence_transformers(f.workdir, f.out, f.overwrite)
        else:
            encoder = export(f.workdir, f.out, f.platforms, f.overwrite)
    except (FileNotFoundError, ValueError) as e:  # OutputError is a ValueError
        sys.exit(f"dualjax.export: {e}")
    if f.format == "sentence-transformers":
        size = sum(os.path.getsize(os.path.join(f.out, n)) for n in record["files"])
        print(f"{f.out}: a sentence-transformers folder of step {record['step']}, "
              f"{size / 2**20:.1f} MB; load it with SentenceTransformer({f.out!r})")
        return
    size = sum(os.path.getsize(os.path.join(f.out, n)) for n in os.listdir(f.out))
    print(f"{f.out}: {encoder.meta['model']} at step {encoder.meta['step']}, "
          f"{encoder.dim}-d vectors, {size / 2**20:.1f} MB, for {', '.join(f.platforms)}")


def run() -> None:
    """The `dualjax-export` console script: the same as `python -m dualjax.export`. The
    flags are defined here, not on import: `search` defines a --workdir of its own."""
    flags.DEFINE_string("workdir", None, "A trained dualjax workdir.")
    flags.DEFINE_string("out", None, "The bundle's folder: new, empty, or a bundle to "
                        "replace with --overwrite (never the workdir).")
    flags.DEFINE_bool("overwrite", False, "Replace the bundle already at --out.")
    flags.DEFINE_list("platforms", ["cpu", "cuda", "tpu"],
                      "Platforms the exported encoders run on (--format=bundle).")
    flags.DEFINE_enum("format", "bundle", FORMATS,
                      "bundle: dualjax.Encoder's (jax.export); sentence-transformers: a "
                      "folder SentenceTransformer(DIR) loads (BERT-family towers).")
    flags.mark_flags_as_required(["workdir", "out"])
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
