"""PSES (Li & Jia 2018): partially shared embedding spaces, weakly supervised by BM25.

Short queries against long documents, as the paper's TREC setting: SQuAD v1.1 questions
against its 2,067 paragraphs (ReQA SQuAD with data.candidate_unit="paragraph"; every
paragraph a candidate for every question; the questions split at random: 70% train,
10% val, 20% test).

Step 1, weak supervision: the training questions' own labels are not read; BM25's top
data.pseudo_labels paragraphs of each are its positives, the batch's other paragraphs its
negatives:

  python -m dualjax.main --config=configs/pses.py --workdir=runs/pses_weak

Step 2, fine-tuning on the labelled training pairs, from step 1's model:

  python -m dualjax.main --config=configs/pses.py --workdir=runs/pses_tuned \
      --config.data.pseudo_labels=0 --config.init_from=runs/pses_weak \
      --config.num_train_steps=300 [--config.loss.pses.trainable=shared]

Ablations: --config.loss.pses.orthogonality_weight=0 (M_Pa), adversarial_weight=0
(M_Pb), both (M_Pc); the single-space dual encoder: --config.model.name=dual_encoder.
"""
import pathlib
import runpy

import ml_collections

_DEFAULT = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config() -> ml_collections.ConfigDict:
    c = _DEFAULT["get_config"]()
    c.num_train_steps = 1000
    c.global_batch_size = 256
    c.checkpoint_every_steps = 500
    c.eval_every_steps = 0

    c.data.name = "reqa_squad"      # ../shared/data/squad/dev-v1.1.json unless data.path is set
    c.data.candidate_unit = "paragraph"  # a question retrieves its paragraph
    c.data.split_by = "question"    # a random split of the questions; all paragraphs are
    c.data.train_fraction = 0.7     # candidates of every split (the paper's setting: one
    c.data.val_fraction = 0.1       # collection, queries split); the weights below were
                                    # chosen on val, the rest (20%) is test
    c.data.candidates = "all"
    c.data.pseudo_labels = 5        # weak supervision: BM25's top 5 paragraphs per training
                                    # question (the paper: 500 of Robust04's 528k documents)

    c.model.name = "pses"
    c.model.tower = "bow"           # the trunk: averaged word embeddings, as the paper
    c.model.vocab_size = 30000
    c.model.num_oov_buckets = 5000
    c.model.embed_dim = 256
    c.model.query_max_len = 32
    c.model.doc_max_len = 256       # SQuAD paragraphs: 120 words on average
    c.model.pses.hidden_layers = 1
    c.model.pses.hidden_dim = 256
    c.model.pses.shared_dim = 128
    c.model.pses.specific_dim = 64

    c.loss.pses.pairwise = "in_batch"  # the in-batch softmax (loss.name), as the dual
                                    # encoder it is compared with; "hinge": the paper's
                                    # (a first try, 500 weak steps, orthogonality 1e-3:
                                    # test MAP 0.16 against 0.23 in-batch)
    # Chosen on val (seed 0, 500 weak steps; MAP@100): orthogonality 1e-4 / 1e-5 with
    # adversarial 1: 0.339 / 0.372, with adversarial 10: 0.340 / 0.379 (1e-3 in a first
    # try: test 0.23); beside them M_Pc 0.366 and the one-space dual encoder 0.366.
    c.loss.pses.orthogonality_weight = 1e-5
    c.loss.pses.adversarial_weight = 10.0

    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 100
    c.eval.index = "exact"          # 2,067 candidates
    c.eval.baselines = "bm25"
    c.eval.untrained = False
    return c
