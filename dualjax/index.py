"""A corpus encoded by an exported encoder and saved with its index, for serving.

    python -m dualjax.index --encoder=runs/default/export --corpus=corpus.jsonl --out=IDX
    python -m dualjax.search --encoder=runs/default/export --index=IDX --query="..."

The corpus is a TSV, a JSONL or a BEIR folder (`data/corpus_file.py`). It is streamed: a
block of documents at a time is encoded (longest first, on every local device) and
written, so memory holds the vectors' block, not the corpus (`serve/corpus_index.py`
describes OUT). Several processes (a TPU pod slice, GPU hosts) build one index with the
flags of `dualjax.main`: --coordinator_address, --num_processes and --process_id (or
--distributed); each reads only its own byte range of the corpus file and writes its own
shard, and process 0 writes the manifest last, after checking every shard, so a build
that stops anywhere leaves no index that looks finished. OUT must be a folder every
process sees (shared storage), as a training workdir is.
"""

from __future__ import annotations

import sys

from absl import flags

from dualjax import cli
from dualjax.errors import DataError
from dualjax.retrieval import ann, quantized
from dualjax.runtime.files import check_output
from dualjax.serve.bundle import Encoder
from dualjax.serve.corpus_index import (  # noqa: F401 (CorpusIndex, recorded_dim: the API)
    META,
    NOT_INSIDE,
    CorpusIndex,
    recorded_dim,
)
from dualjax.serve.indexing import (  # noqa: F401 (the command's library: dualjax.index.build)
    Settings,
    Source,
    build,
    build_file,
    check_build,
    with_tokens,
)


def main(argv: list[str]) -> None:
    del argv
    from dualjax.errors import WorkdirError
    from dualjax.eval.metrics_log import setup_logging
    setup_logging()
    f = flags.FLAGS
    try:
        check_build(f.kind, f.batch_size, f.quantize, f.rescore)  # before anything is read
        cli.init_processes("dualjax.index")
        import jax
        encoder = Encoder.load(f.encoder, f.dim or None)
        if jax.process_count() == 1:  # refused before the corpus is read (several
            # processes: the build checks it in process 0 and tells the others)
            check_output(f.out, META, "corpus index", inputs=(f.encoder, f.corpus),
                         overwrite=f.overwrite, not_inside=NOT_INSIDE)
        m = build_file(encoder, f.corpus, f.out, f.kind, batch_size=f.batch_size,
                       overwrite=f.overwrite, quantize=f.quantize, rescore=f.rescore,
                       devices=jax.local_devices())
    except (FileNotFoundError, DataError, ImportError, ValueError, WorkdirError) as e:
        sys.exit(f"dualjax.index: {e}")
    if jax.process_index() == 0:
        print(f"{f.out}: {m['n']} documents, {m['dim']}-d, {m['kind']} index, "
              f"{len(m['shards'])} shard(s), encoder {m['encoder_id']}")


def run() -> None:
    """`python -m dualjax.index` and the `dualjax-index` console script."""
    flags.DEFINE_string("encoder", None, "An exported encoder (python -m dualjax.export).")
    flags.DEFINE_string("corpus", None, "A corpus: .jsonl, .json, .tsv, .txt or a BEIR folder.")
    flags.DEFINE_string("out", None, "The index's folder: new, empty, or an index to replace "
                        "with --overwrite (never the bundle or the corpus); in a run of "
                        "several processes, on storage every process sees.")
    flags.DEFINE_bool("overwrite", False, "Replace the index already at --out.")
    flags.DEFINE_enum("kind", "scann", list(ann.INDEXES), "The searcher to build "
                      "(hnsw needs faiss-cpu).")
    flags.DEFINE_integer("batch_size", 256, "Texts per encoding batch.")
    flags.DEFINE_enum("quantize", "", ["", *quantized.KINDS], "Keep the corpus vectors "
                      "as int8 codes (a byte a dimension) or binary (a bit), searched over "
                      "the codes and rescored (with --kind=exact); '': float32.")
    flags.DEFINE_integer("rescore", 0, "With --quantize: the candidates rescored with the "
                         "float query (0: 4 x k).")
    flags.DEFINE_integer("dim", 0, "Index the vectors cut to their first DIM coordinates, "
                         "renormalised (a model trained with loss.matryoshka_dims); 0: all. "
                         "dualjax.search reads the queries at the same width.")
    cli.define_process_flags(__name__)
    flags.mark_flags_as_required(["encoder", "corpus", "out"])
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
