"""Encoding a corpus with a pretrained start: dualjax's exported encoder (what
`python -m dualjax.index` runs) against sentence-transformers' `encode`, on the same CPU
threads, the same texts (title + text of a BEIR corpus), max length and batch size.

    python scripts/bench/bench_encode.py --corpus=../shared/data/npl [--model=all-MiniLM-L6-v2]
        [--batch_size=32] [--max_len=256] [--limit=0] [--repeats=1] [--json=FILE]
    python scripts/bench/bench_encode.py --matmuls   # the matmul rates alone, XLA vs PyTorch

Both sides sort the texts by length (sentence-transformers by characters, longest first;
dualjax too) and cut each batch's padding (dualjax to a power-of-two length bucket). The
bundle is made once under --work (a workdir evaluated on a small slice with
num_train_steps=0, then `dualjax.export`) and reused. Prints documents/s of each, their
ratio and the largest difference between the two sides' vectors; --json writes
{"dualjax_docs_per_s", "st_docs_per_s", "ratio", "max_abs_diff", ...}.
--matmuls: GFLOP/s of one float32 matmul at MiniLM's shapes (tokens x 384 x 384 / 1,152
/ 1,536 and tokens x 1,536 x 384), jitted `x @ w` against `torch.nn.functional.linear`
on the same threads, medians of 30 calls: the rate both encoders' dense layers are bound by.
Needs torch and sentence-transformers (`pip install sentence-transformers`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def corpus_texts(folder: str, limit: int) -> list[str]:
    from dualjax.data.corpus_file import read_corpus
    _, texts = read_corpus(folder)
    return texts[:limit] if limit else texts


def make_bundle(args) -> str:
    """A bundle of the pretrained start as is (evaluation-only run on a 3-document BEIR
    slice, then export); reused when already there."""
    bundle = os.path.join(args.work, "bundle")
    if os.path.isfile(os.path.join(bundle, "encoder.json")):
        return bundle
    beir = os.path.join(args.work, "slice")
    os.makedirs(os.path.join(beir, "qrels"), exist_ok=True)
    docs = [{"_id": f"d{i}", "text": t} for i, t in enumerate(corpus_texts(args.corpus, 3))]
    with open(os.path.join(beir, "corpus.jsonl"), "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    with open(os.path.join(beir, "queries.jsonl"), "w") as f:
        f.write(json.dumps({"_id": "q0", "text": docs[0]["text"][:40]}) + "\n")
    with open(os.path.join(beir, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    run = os.path.join(args.work, "run")
    flags = [f"--config={os.path.join(REPO, 'configs', 'adapt.py')}", f"--workdir={run}",
             "--config.data.name=beir", f"--config.data.path={beir}",
             "--config.num_train_steps=0", f"--config.model.max_len={args.max_len}",
             "--config.eval.baselines=", "--config.eval.hybrid=", "--config.eval.index=exact",
             f"--config.model.pretrained={args.model}"]
    for cmd in ([sys.executable, "-m", "dualjax.main", *flags],
                [sys.executable, "-m", "dualjax.export", f"--workdir={run}", f"--out={bundle}",
                 "--platforms=cpu"]):
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{' '.join(cmd[:3])} failed:\n{done.stderr[-3000:]}")
    return bundle


MATMUL_SHAPES = ((4096, 384, 384), (4096, 384, 1152), (4096, 384, 1536), (4096, 1536, 384),
                 (8192, 384, 1536))


def matmul_rates() -> None:
    """Prints GFLOP/s of [m, k] x [k, n] in XLA (jitted) and PyTorch (F.linear), per shape."""
    import jax
    import jax.numpy as jnp
    import torch

    def median_s(fn, calls: int = 30) -> float:
        fn(), fn()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    rng = np.random.default_rng(0)
    matmul = jax.jit(lambda x, w: x @ w)
    print(f"torch threads {torch.get_num_threads()}, jax devices {jax.devices()}")
    for m, k, n in MATMUL_SHAPES:
        x, w = (rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n)))
        xj, wj = jnp.asarray(x), jnp.asarray(w)
        xt, wt = torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(w.T))
        flop = 2 * m * k * n / 1e9
        with torch.inference_mode():
            rates = (flop / median_s(lambda xj=xj, wj=wj: matmul(xj, wj).block_until_ready()),
                     flop / median_s(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt)))
        print(f"[{m}, {k}] x [{k}, {n}]: XLA {rates[0]:6.1f} GFLOP/s, PyTorch {rates[1]:6.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "npl"))
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="a fetched pretrained name")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_len", type=int, default=256)
    p.add_argument("--limit", type=int, default=0, help="the first N documents (0: all)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes of each (median)")
    p.add_argument("--work", default=os.path.join(REPO, "runs", "bench_encode"))
    p.add_argument("--json", default="")
    p.add_argument("--matmuls", action="store_true", help="the matmul rates alone")
    args = p.parse_args()
    if args.matmuls:
        return matmul_rates()
    import torch
    from sentence_transformers import SentenceTransformer

    import dualjax
    from dualjax import pretrained

    texts = corpus_texts(args.corpus, args.limit)
    encoder = dualjax.Encoder.load(make_bundle(args))
    st = SentenceTransformer(pretrained.folder_of(args.model), device="cpu")
    st.max_seq_length = args.max_len
    threads = torch.get_num_threads()
    sides = {
        "dualjax": lambda: encoder.encode_documents(texts, batch_size=args.batch_size),
        "sentence-transformers": lambda: st.encode(texts, batch_size=args.batch_size,
                                                   convert_to_numpy=True,
                                                   normalize_embeddings=True),
    }
    # Warm-up on a slice (compilation, allocators), then alternating timed passes.
    warm = texts[:4 * args.batch_size]
    encoder.encode_documents(warm, batch_size=args.batch_size)
    st.encode(warm, batch_size=args.batch_size)
    times, vectors = {k: [] for k in sides}, {}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            start = time.perf_counter()
            vectors[name] = np.asarray(fn(), np.float32)
            times[name].append(time.perf_counter() - start)
    rate = {k: len(texts) / float(np.median(t)) for k, t in times.items()}
    diff = float(np.abs(vectors["dualjax"] - vectors["sentence-transformers"]).max())
    result = {"dualjax_docs_per_s": rate["dualjax"],
              "st_docs_per_s": rate["sentence-transformers"],
              "ratio": rate["dualjax"] / rate["sentence-transformers"], "max_abs_diff": diff,
              "documents": len(texts), "batch_size": args.batch_size, "max_len": args.max_len,
              "torch_threads": threads, "cpus": os.cpu_count(), "machine": platform.node(),
              "seconds": {k: [round(x, 2) for x in t] for k, t in times.items()}}
    for name in sides:
        print(f"{name:>22}: {rate[name]:7.1f} documents/s ({len(texts)} documents, median of "
              f"{args.repeats})")
    print(f"ratio dualjax / sentence-transformers: {result['ratio']:.2f}; largest vector "
          f"difference {diff:.2e}; torch threads {threads}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
