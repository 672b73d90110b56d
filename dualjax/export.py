"""Export a trained workdir's latest checkpoint as a serving bundle (see `serve/bundle.py`)
or as a sentence-transformers folder (see `serve/st_folder.py`).

    python -m dualjax.export --workdir=runs/default --out=runs/default/export
    [--platforms=cpu,cuda,tpu] [--format=bundle|sentence-transformers]

Then `dualjax.Encoder.load(DIR)` encodes texts anywhere jax runs, without the workdir,
the config or the optimizer state; or, for a BERT-family run, `SentenceTransformer(DIR)`
does, with PyTorch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import flags

from dualjax import cli
from dualjax.eval.metrics_log import setup_logging
from dualjax.serve import exporting
from dualjax.serve.bundle import Encoder
from dualjax.serve.exporting import FORMATS, PLATFORMS, ST_MARKER, check_platforms
from dualjax.train import trained as trained_lib

__all__ = ["FORMATS", "PLATFORMS", "ST_MARKER", "check_platforms", "export",
           "export_sentence_transformers"]


def _loader(workdir: str):
    """`workdir`'s latest checkpoint as `serve.exporting` writes it (read when called)."""
    def load() -> exporting.Exported:
        t = trained_lib.load_trained(workdir)
        return exporting.Exported(t.model, t.inputs, t.params, t.step, t.spec.system)
    return load


def export(workdir: str, out: str, platforms: Sequence[str] = ("cpu", "cuda", "tpu"),
           overwrite: bool = False) -> Encoder:
    """Writes the bundle of `workdir`'s latest checkpoint to `out`
    (`serve.exporting.write_bundle`). Written beside `out`, then renamed: a failure
    leaves `out` as it was and nothing else behind.

    Args:
      workdir: a training run's workdir with at least one checkpoint.
      out: new, empty or (with `overwrite`) a bundle holding only its own files; never the
        workdir, a folder holding it, or a folder inside a bundle or an index
        (`runtime.files.check_output`).
      platforms: the jax platforms the exported functions are lowered for.

    Returns:
      The bundle, loaded from `out`.
    """
    return exporting.write_bundle(workdir, out, _loader(workdir), platforms, overwrite)


def export_sentence_transformers(workdir: str, out: str, overwrite: bool = False) -> dict:
    """Writes `workdir`'s latest checkpoint as a sentence-transformers folder at `out`
    (`serve.exporting.write_st_folder`): `SentenceTransformer(out)` gives the bundle's
    vectors.

    Args:
      workdir: a training run with a BERT-family tower (model.pretrained) on each side.
      out: as `export`'s; an existing folder must be one this command wrote.

    Returns:
      The folder's record (dualjax_export.json): the run, the step and every file's
      sha256. ValueError, before anything is written, for a model sentence-transformers
      cannot represent, naming the part.
    """
    return exporting.write_st_folder(workdir, out, _loader(workdir), overwrite)


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
