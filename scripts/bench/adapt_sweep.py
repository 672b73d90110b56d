"""Choose an adaptation recipe for a pretrained start: variants x collections in one process.

    python scripts/bench/adapt_sweep.py [--collections=../shared/data/npl,...]
        [--variants=asis,crop,ict,ict+crop,pseudo] [--steps=300] [--batch=64]
        [--lr=1e-5] [--json=FILE]

A lighter loop than `python -m dualjax.main` (no TFDS tables, no checkpoints, one jit):
the start's towers (`dualjax.pretrained`, one shared tower) trained with the in-batch
softmax (temperature 0.05) on pairs from the collection's own documents, then scored on
its queries: nDCG@10 and recall@100 of the dense model, BM25, and their score
interpolation at every weight of `hybrid.WEIGHTS` (so the zero-shot default weight can be
chosen on the same runs). Variants:
- asis: no training (the start as is);
- crop / ict / ict+crop: `data.pretraining` pairs (Contriever's crops, ICT);
- pseudo: weak supervision from the hybrid of the start and BM25: each document yields
  a pseudo-query (one of its sentences, or a crop), whose positive is the document the
  hybrid (w 0.5) ranks first among the others (the query's own document excluded, so
  the pair is never a copy), distilling the fused ranking into the dense model.
It reads the collections with dualjax's own readers, so its figures are the same as the
main program's for the same model; configs/adapt.py takes the recipe it picks.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualjax import losses, pretrained
from dualjax.data import beir, documents, pretraining
from dualjax.models.bert import BertTower
from dualjax.retrieval import baselines, hybrid, metrics
from dualjax.text.sides import length_bucket

SHARED = [f"../shared/data/{c}" for c in ("npl", "med", "time", "adi")]


def encoder(start):
    tower = BertTower(start.architecture)

    @jax.jit
    def encode(params, ids, mask):
        x = tower.apply({"params": params}, ids, mask)
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return encode


def encode_all(encode, params, tok, texts, max_len, batch=128) -> np.ndarray:
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = None
    for s in range(0, len(texts), batch):
        rows = order[s:s + batch]
        chunk = [texts[i] for i in rows] + [""] * (batch - len(rows))
        ids, mask = tok.encode(chunk, max_len)
        n = length_bucket(int(mask.sum(1).max()), max_len)
        v = np.asarray(encode(params, ids[:, :n], mask[:, :n]))
        if out is None:
            out = np.zeros((len(texts), v.shape[1]), np.float32)
        out[rows] = v[:len(rows)]
    return out


def top_k(q: np.ndarray, d: np.ndarray, k: int, exclude=None):
    scores = q @ d.T
    if exclude is not None:
        scores[np.arange(len(q))[exclude >= 0], exclude[exclude >= 0]] = -np.inf
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else \
        np.tile(np.arange(scores.shape[1]), (len(q), 1))
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    ids = np.take_along_axis(part, order, 1)
    return ids, np.take_along_axis(scores, ids, 1)


def evaluate(encode, params, tok, task, lexical, args) -> dict:
    k = min(100, len(task.corpus))
    d = encode_all(encode, params, tok, task.corpus, args.doc_len)
    q = encode_all(encode, params, tok, task.queries, args.query_len)
    dense = top_k(q, d, k)
    m = lambda ranked: {key: metrics.retrieval_metrics(ranked, task.relevant)[key]
                        for key in ("ndcg@10", "recall@100")}
    out = {"dense": m(dense[0])}
    for w in hybrid.WEIGHTS:
        out[f"hybrid_{w:.1f}"] = m(hybrid.fuse_scores(dense, lexical, float(w), k))
    return out


def pseudo_pairs(collection, corpus_vectors, tok_encode, texts, rng) -> list[tuple[str, str]]:
    """Per document: a sentence of it (or a crop), labelled with the hybrid's first
    other document."""
    gen = pretraining.PairGenerator(collection, ("crop",), 0)
    queries = []
    for p in range(len(collection.passages)):
        sents = [s for s in collection.passage_sentences(p) if len(s.split()) >= 5]
        queries.append(sents[rng.integers(len(sents))] if sents else gen._crop(p, rng))
    own = np.arange(len(queries))
    k = min(20, len(texts))
    dense = top_k(tok_encode(queries), corpus_vectors, k, exclude=own)
    lex_scores, lex_ids = baselines.rank_texts("bm25", texts, queries, k, own)
    fused = hybrid.fuse_scores(dense, (lex_ids, lex_scores), 0.5, 1)
    return [(q, texts[int(j)]) for q, j in zip(queries, fused[:, 0], strict=True) if j >= 0]


def train(start, params, tok, pair_fn, args, seed=0):
    encode_tower = BertTower(start.architecture)
    warmup = min(args.warmup, args.steps // 10 + 1)
    tx = optax.adamw(optax.join_schedules(
        [optax.linear_schedule(0.0, args.lr, warmup),
         optax.linear_schedule(args.lr, 0.0, max(args.steps - warmup, 1))], [warmup]),
        weight_decay=0.01)
    opt = tx.init(params)

    def loss_fn(p, q_ids, q_mask, d_ids, d_mask):
        norm = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
        q = norm(encode_tower.apply({"params": p}, q_ids, q_mask))
        d = norm(encode_tower.apply({"params": p}, d_ids, d_mask))
        return losses.in_batch_softmax.reference(q, d, 1 / args.temperature, 0.0,
                                                 symmetric=args.symmetric)[0]

    @jax.jit
    def step(p, o, q_ids, q_mask, d_ids, d_mask):
        loss, g = jax.value_and_grad(loss_fn)(p, q_ids, q_mask, d_ids, d_mask)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    losses_seen = []
    for i in range(args.steps):
        pairs = [pair_fn(i * args.batch + j) for j in range(args.batch)]
        q_ids, q_mask = tok.encode([a for a, _ in pairs], args.query_len)
        d_ids, d_mask = tok.encode([b for _, b in pairs], args.doc_len)
        params, opt, loss = step(params, opt, q_ids, q_mask, d_ids, d_mask)
        losses_seen.append(float(loss) if i % 50 == 0 or i == args.steps - 1 else None)
    return params, [x for x in losses_seen if x is not None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collections", default=",".join(SHARED))
    p.add_argument("--start", default="all-MiniLM-L6-v2")
    p.add_argument("--variants", default="asis,crop,ict,ict+crop,pseudo")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--max_epochs", type=float, default=0,
                   help="at most this many passes over the collection's documents (0: off)")
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--symmetric", action="store_true")
    p.add_argument("--query_len", type=int, default=64)
    p.add_argument("--doc_len", type=int, default=256)
    p.add_argument("--json", default="")
    args = p.parse_args()
    start = pretrained.resolve(args.start)
    tok = start.tokenizer()
    encode = encoder(start)
    base = jax.device_put(start.tower_params())
    results = {"args": vars(args), "device": str(jax.devices()[0]), "runs": {}}
    for path in args.collections.split(","):
        c = os.path.basename(path.rstrip("/"))
        task = beir.load_beir({"path": path, "ignore_identical_ids": False}).tasks["test"]
        lex_scores, lex_ids = baselines.rank_texts("bm25", task.corpus, task.queries,
                                                   min(100, len(task.corpus)))
        lexical = (lex_ids, lex_scores)
        results["runs"].setdefault(c, {})["bm25"] = {
            key: metrics.retrieval_metrics(lex_ids, task.relevant)[key]
            for key in ("ndcg@10", "recall@100")}
        collection = documents.read_collection(path)
        for variant in args.variants.split(","):
            t0 = time.time()
            params, seen = base, []
            if variant != "asis":
                if variant == "pseudo":
                    vectors = encode_all(encode, base, tok, task.corpus, args.doc_len)
                    pairs = pseudo_pairs(collection, vectors,
                                         lambda qs: encode_all(encode, base, tok, qs,
                                                               args.query_len),
                                         task.corpus, np.random.default_rng(0))
                    order = np.random.default_rng(1).permutation(len(pairs))
                    pair_fn = lambda i, pairs=pairs, order=order: pairs[order[i % len(pairs)]]
                else:
                    gen = pretraining.PairGenerator(collection, tuple(variant.split("+")), 0)
                    pair_fn = lambda i, gen=gen: gen.pair(i)[:2]
                cap = int(args.max_epochs * len(task.corpus) / args.batch) or 1
                params, seen = train(start, base, tok, pair_fn,
                                     argparse.Namespace(**{**vars(args), "steps": min(
                                         args.steps, cap) if args.max_epochs else args.steps}))
            row = evaluate(encode, params, tok, task, lexical, args)
            row.update(seconds=time.time() - t0, losses=seen)
            results["runs"][c][variant] = row
            print(c, variant, f"dense {row['dense']['ndcg@10']:.4f}",
                  f"hybrid0.5 {row['hybrid_0.5']['ndcg@10']:.4f}",
                  f"bm25 {results['runs'][c]['bm25']['ndcg@10']:.4f}",
                  f"{row['seconds']:.0f}s", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
