"""Zero-shot retrieval from a pretrained start, adapted to a collection without labels.

Starts from all-MiniLM-L6-v2 (fetch it once: python -m dualjax.pretrained fetch
all-MiniLM-L6-v2), trains on pairs the collection's own documents make (no query, no
label is read), then evaluates on the collection's queries, if it has judgements
(qrels/), against BM25 and fused with it, beside the start as is (the "start" rows):
    python -m dualjax.main --config=configs/adapt.py --workdir=runs/adapt_npl \\
        --config.data.path=../shared/data/npl
data.path: a BEIR folder, or a documents .jsonl (adaptation only: nothing to evaluate).
The recipe (tasks, steps, learning rate) was chosen on the four shared collections only;
BENCHMARKS.md ("Zero-shot from pretrained starts") has the figures.
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 300         # adaptation steps, at most (NPL: 2 passes)
    c.max_epochs = 2.0              # and at most 2 passes over the documents: more spoils a
                                    # strong start on a small collection (ADI: 3 steps)
    c.global_batch_size = 64        # pairs per step
    c.checkpoint_every_steps = 100
    c.train.encode_chunks = 8       # GradCache: the towers see 8 pairs at a time, so one
                                    # chunk's activations are alive, not the batch's (peak
                                    # 1.9 GB against 9.9 GB unchunked at 64 x 256 tokens,
                                    # and no slower on CPU: BENCHMARKS.md, "Adapting MiniLM")
    c.eval_every_steps = 0          # no val split: the final evaluation only
    c.log_every_steps = 10
    c.data.name = "pretrain"        # pairs made from the collection's documents
    c.data.path = "../shared/data/npl"  # a BEIR folder (evaluated on its queries) or documents
    c.data.tasks = "pseudo"         # a sentence of each document, labelled with the first other
                                    # document of the start's hybrid with BM25 (weak_labels.py;
                                    # ICT and crops did worse, BENCHMARKS.md)
    c.data.pseudo_weight = 0.5      # the labelling hybrid's dense weight
    c.data.max_query_words = 48     # a pseudo-query is cut to 48 words (~64 tokens): a few
                                    # unbroken "sentences" of hundreds of words (reference
                                    # lists, TIME's paragraphs) otherwise pad a batch's
                                    # queries to 256 tokens, 80% of the batches on 5,000
                                    # Wikipedia paragraphs (BENCHMARKS.md, "Adapting MiniLM")
    c.data.ignore_identical_ids = False  # the shared collections number queries and documents
                                    # independently (True for BEIR's quora)
    c.model.pretrained = "all-MiniLM-L6-v2"
    c.model.tower = "bert"
    c.model.tokenizer = "hf"
    c.model.max_len = 256           # tokens per text, [CLS] and [SEP] included: MiniLM's
                                    # max_seq_length in sentence-transformers (a batch of
                                    # shorter texts runs at a shorter padded length)
    c.model.similarity = "cosine_temperature"
    c.model.temperature = 0.05      # sentence-transformers' MultipleNegativesRankingLoss (x20)
    c.optimizer.learning_rate = 1e-5
    c.optimizer.warmup_steps = 30
    c.optimizer.weight_decay = 0.01
    c.eval.index = "exact"
    c.eval.batch_size = 64
    c.eval.baselines = "bm25"
    c.eval.hybrid = "bm25"          # at eval.hybrid_weight (default.py: 0.5, chosen on the
                                    # shared collections)
    return c
