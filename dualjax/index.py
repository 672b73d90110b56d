"""A corpus encoded by an exported encoder and saved with its index, for serving.

    python -m dualjax.index --encoder=runs/default/export --corpus=corpus.jsonl --out=IDX
    python -m dualjax.search --encoder=runs/default/export --index=IDX --query="..."

The corpus is a TSV, a JSONL or a BEIR folder (`data/corpus_file.py`). OUT holds
corpus.jsonl (id and text per line, in index order), embeddings.npy (float32 [n, dim];
with --quantize=int8|binary, quantized.npz: the codes alone), scann/ or hnsw/ (the
searcher of --kind, none for exact) and index.json, written last,
with the encoder's id (a digest of its bundle). Loading checks the encoder's id against
it and never re-encodes the corpus: the searcher is keyed by the saved vectors.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from absl import flags, logging

from dualjax import cli
from dualjax.data.corpus_file import read_corpus
from dualjax.retrieval import ann, quantized
from dualjax.runtime.files import (
    atomic_write,
    check_output,
    file_digests,
    files_under,
    staged_output,
    verify_digests,
)
from dualjax.runtime.progress import Progress
from dualjax.serve.bundle import Encoder
from dualjax.text import sides, tokenizers

META = "index.json"
FORMAT = 2  # 2: index.json records its files' digests
# An index never lies inside a bundle or another index (whose --overwrite would delete
# it) or inside a run's workdir.
NOT_INSIDE = ("bundle", "corpus index", "sentence-transformers folder", "workdir")


def _eval_config() -> dict:
    return {"query_chunk": 256, "corpus_chunk": 4096, "scann": ann.default_scann_config(),
            "hnsw": ann.default_hnsw_config()}


def build(encoder: Encoder, ids: list[str], texts: list[str], out: str, kind: str = "scann",
          k: int = 100, batch_size: int = 256, inputs: tuple[str, ...] = (),
          overwrite: bool = False, quantize: str = "", rescore: int = 0) -> "CorpusIndex":
    """Encodes a corpus with the encoder's document side (a progress bar over batches),
    builds its index and writes it all to `out`. Written beside `out`, then renamed: a
    failure leaves `out` as it was and nothing else behind.

    Args:
      encoder: the bundle whose document tower encodes the corpus.
      ids, texts: the corpus, one id per text (texts that give no token are skipped).
      out: new, empty or (with `overwrite`) an index holding only its own files; never one
        of `inputs` (the bundle, the corpus file), a folder holding one, or a folder
        inside a bundle, an index or a workdir.
      kind: "scann", "hnsw" (faiss) or "exact".
      k: the results a search returns at most.
      batch_size: texts per encoding call.
      quantize: "int8" or "binary": keep the corpus vectors quantized alone
        (`retrieval.quantized`; kind "exact"), the top `rescore` (0: 4 x k) candidates
        of each search rescored with the float query; "": float vectors.

    Returns:
      The index, loaded from `out` (its files checked).
    """
    check_build(kind, batch_size, quantize, rescore)
    with staged_output(out) as stage:  # one writer: a second build into `out` is refused
        check_output(out, META, "corpus index", inputs=(encoder.directory, *inputs),
                     overwrite=overwrite, not_inside=NOT_INSIDE)
        ids, texts = with_tokens(ids, texts, encoder.sides["document"].tokenizer)
        start = time.perf_counter()
        embeddings = _encode(encoder, texts, batch_size)
        encoded = time.perf_counter() - start
        _write(stage(), encoder, ids, texts, embeddings, kind, k, start, encoded,
               quantize, rescore)
    return CorpusIndex(out, encoder.id)


def _encode(encoder: Encoder, texts: list[str], batch_size: int) -> np.ndarray:
    """The documents' vectors, in corpus order, encoded longest first (so that each batch
    runs at the length bucket of texts of about its own length), with a progress bar."""
    order = sides.longest_first(texts)
    out = np.zeros((len(texts), encoder.dim), np.float32)
    step = 16 * batch_size  # texts per progress update
    with Progress(len(texts), "encode corpus", "text") as bar:
        for at in range(0, len(texts), step):
            rows = order[at:at + step]
            out[rows] = encoder.encode_documents([texts[i] for i in rows], batch_size=batch_size)
            bar.update(len(rows))
    return out


def check_build(kind: str, batch_size: int, quantize: str = "", rescore: int = 0) -> None:
    """ValueError (ImportError for a missing faiss or ScaNN) naming the setting that
    cannot work, before anything is read or encoded."""
    if kind not in ann.INDEXES:
        raise ValueError(f"--kind={kind!r} is not one of: {', '.join(ann.INDEXES)}")
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size}: give the texts per batch, at least 1")
    if quantize and quantize not in quantized.KINDS:
        raise ValueError(f"--quantize={quantize!r} is not one of: {', '.join(quantized.KINDS)}")
    if quantize and kind != "exact":
        raise ValueError(f"--quantize={quantize} searches the codes themselves: give "
                         f"--kind=exact (not {kind!r}, which keeps float vectors)")
    if rescore < 0 or (rescore and not quantize):
        raise ValueError(f"--rescore={rescore}: the candidates a quantized index rescores "
                         "(>= 0, with --quantize)")
    if kind == "hnsw":
        ann.require_faiss()
    if kind == "scann":
        ann.require_scann()


def with_tokens(ids: list[str], texts: list[str], tokenizer) -> tuple[list[str], list[str]]:
    """The documents that give the tokenizer some token: one that gives none (empty, or
    only punctuation, symbols or emoji for a word tokenizer) would be the towers' bias
    alone, one vector shared by all such documents that ranks them first for every query
    the model knows nothing of. The skipped ones are counted in the log."""
    skipped = set(tokenizers.without_tokens(tokenizer, texts))
    if len(skipped) == len(texts):
        raise ValueError("the corpus holds no document that gives the encoder a token")
    if skipped:
        named = [ids[i] for i in sorted(skipped)[:5]]
        logging.warning("skipped %d documents that give the encoder no token (empty, or no "
                        "letter or digit; ids %s%s)", len(skipped), ", ".join(named),
                        ", ..." if len(skipped) > 5 else "")
    return ([i for n, i in enumerate(ids) if n not in skipped],
            [t for n, t in enumerate(texts) if n not in skipped])


def _write(tmp: str, encoder: Encoder, ids: list[str], texts: list[str], embeddings: np.ndarray,
           kind: str, k: int, start: float, encoded: float, quantize: str = "",
           rescore: int = 0) -> None:
    if quantize:  # the codes alone: the float vectors are what it saves
        quantized.QuantizedIndex.build(embeddings, quantize, rescore).save(tmp)
    else:
        np.save(os.path.join(tmp, "embeddings.npy"), embeddings)
    with open(os.path.join(tmp, "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                     for i, t in zip(ids, texts))
    k = min(k, len(texts))
    info = {"settings": {"quantize": quantize, "rescore": rescore}} if quantize else (
        ann.make_index(kind, embeddings, _eval_config(), k,
                       directory=_searcher_dir(tmp, kind), extra=encoder.id)[1])
    # Every file the index reads, the searcher's own included, checked on loading.
    files = file_digests(tmp, [name for name in files_under(tmp) if name != META])
    meta = {"format": FORMAT, "encoder_id": encoder.id, "files": files, "kind": kind, "k": k,
            "n": len(texts), "dim": int(embeddings.shape[1]), "settings": info["settings"],
            **({"quantize": quantize, "rescore": rescore} if quantize else {}),
            "encode_seconds": round(encoded, 3),
            "build_seconds": round(time.perf_counter() - start - encoded, 3)}
    atomic_write(os.path.join(tmp, META), json.dumps(meta, indent=1) + "\n")


def recorded_dim(directory: str) -> int | None:
    """The width of the vectors an index was built over (index.json's "dim"; None when it
    cannot be read: `CorpusIndex` then says why)."""
    try:
        with open(os.path.join(directory, META), encoding="utf-8") as f:
            dim = json.load(f).get("dim")
    except (OSError, ValueError, AttributeError):
        return None
    return dim if isinstance(dim, int) else None


def _searcher_dir(directory: str, kind: str) -> str | None:
    return None if kind == "exact" else os.path.join(directory, kind)


class CorpusIndex:
    """A saved corpus index: its ids, texts and searcher (ScaNN, HNSW or exact)."""

    def __init__(self, directory: str, encoder_id: str | None = None):
        path = os.path.join(directory, META)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{directory}: no {META}; build one with python -m "
                                    "dualjax.index --encoder=DIR --corpus=FILE --out=DIR")
        try:
            with open(path) as f:
                self.meta = json.load(f)
            if self.meta.get("format") != FORMAT:
                raise ValueError(f"format {self.meta.get('format')}, this dualjax reads "
                                 f"{FORMAT}; build it again")
            n, dim, recorded = self.meta["n"], self.meta["dim"], self.meta["files"]
            built_with, kind, k = self.meta["encoder_id"], self.meta["kind"], self.meta["k"]
        except KeyError as e:
            raise ValueError(f"{path}: no {e.args[0]!r}; build the index again") from None
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not a readable index.json ({e})") from None
        for key, ok in (("files", isinstance(recorded, dict)), ("kind", kind in ann.INDEXES),
                        *((key, isinstance(self.meta[key], int)) for key in ("n", "dim", "k"))):
            if not ok:
                raise ValueError(f"{path}: its {key!r} is not valid; build the index again")
        if encoder_id is not None and built_with != encoder_id:
            raise ValueError(f"{directory} was built with encoder {built_with}, "
                             f"not {encoder_id}: build it again with this encoder")
        # Its parts as they were written, before anything is answered or rebuilt.
        verify_digests(directory, recorded, "index")
        with open(os.path.join(directory, "corpus.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        self.ids, self.texts = [r["id"] for r in rows], [r["text"] for r in rows]
        if self.meta.get("quantize"):
            self.searcher = quantized.QuantizedIndex.load(directory)
            if len(rows) != n or len(self.searcher.codes) != n or self.searcher.dim != dim:
                raise ValueError(f"{directory}: {len(rows)} documents and "
                                 f"{len(self.searcher.codes)} x {self.searcher.dim} codes, "
                                 f"but {META} records {n} x {dim}")
            return
        # The saved vectors, not the texts again: the searcher saved beside them is loaded
        # when their fingerprint matches (else rebuilt from them, with a warning).
        embeddings = np.load(os.path.join(directory, "embeddings.npy"), mmap_mode="r")
        if len(rows) != n or embeddings.shape != (n, dim):
            raise ValueError(f"{directory}: {len(rows)} documents and embeddings of shape "
                             f"{embeddings.shape}, but {META} records {n} x {dim}")
        self.searcher, _ = ann.make_index(kind, embeddings, _eval_config(), k,
                                          directory=_searcher_dir(directory, kind),
                                          extra=built_with)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [nq, k], ids [nq, k]) of queries [nq, dim], best first, -1 padding."""
        return self.searcher.search(queries, min(k, len(self.texts)))


def main(argv: list[str]) -> None:
    del argv
    from dualjax.data.pairs_file import DataError
    from dualjax.eval.metrics_log import setup_logging
    setup_logging()
    f = flags.FLAGS
    try:
        check_build(f.kind, f.batch_size, f.quantize, f.rescore)  # before anything is read
        encoder = Encoder.load(f.encoder, f.dim or None)
        check_output(f.out, META, "corpus index", inputs=(f.encoder, f.corpus),
                     overwrite=f.overwrite, not_inside=NOT_INSIDE)
        ids, texts = read_corpus(f.corpus)
        built = build(encoder, ids, texts, f.out, f.kind, batch_size=f.batch_size,
                      inputs=(f.corpus,), overwrite=f.overwrite, quantize=f.quantize,
                      rescore=f.rescore)
    except (FileNotFoundError, DataError, ImportError, ValueError) as e:
        sys.exit(f"dualjax.index: {e}")
    m = built.meta
    logging.info("encoded in %.1fs, index built in %.1fs", m["encode_seconds"], m["build_seconds"])
    print(f"{f.out}: {m['n']} documents, {m['dim']}-d, {m['kind']} index, "
          f"encoder {m['encoder_id']}")


def run() -> None:
    """`python -m dualjax.index` and the `dualjax-index` console script."""
    flags.DEFINE_string("encoder", None, "An exported encoder (python -m dualjax.export).")
    flags.DEFINE_string("corpus", None, "A corpus: .jsonl, .json, .tsv, .txt or a BEIR folder.")
    flags.DEFINE_string("out", None, "The index's folder: new, empty, or an index to replace "
                        "with --overwrite (never the bundle or the corpus).")
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
    flags.mark_flags_as_required(["encoder", "corpus", "out"])
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
