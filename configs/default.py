"""Quick start: a bow_mlp dual encoder on the embedded synthetic paraphrase data.

Trains and evaluates in about two minutes on 2 CPU cores:
    python -m dualjax.main --config=configs/default.py --workdir=runs/default
Any field can be overridden: --config.model.tower=bow --config.num_train_steps=100
"""
import ml_collections

from dualjax.retrieval import ann


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0                      # seeds params init, data shuffling and the step rng
    c.init_from = ""                # another run's WORKDIR: start from its latest checkpoint's
                                    # towers and its vocabulary (fresh optimizer, step, data);
                                    # the towers must match (pre-train, then fine-tune)
    c.num_train_steps = 1200        # optimizer steps (0: evaluate the initialisation only)
    c.max_epochs = 0.0              # fewer steps when the data is small: at most this many
                                    # passes over the training pairs (a pre-training
                                    # collection: its passages), rounded up (0: off)
    c.global_batch_size = 256       # pairs per step over all devices; each query sees all
                                    # other documents of the global batch as negatives
    c.train = ml_collections.ConfigDict()
    c.train.encode_chunks = 0       # dual encoder: the towers encode the global batch this many
                                    # chunks at a time, recomputing each in the backward pass
                                    # (GradCache: one chunk's activations alive; 0, 1: off;
                                    # -1: the fewest whose compiled step fits the device's
                                    # memory, from mesh.memory_plan's compiled peaks)
    c.checkpoint_every_steps = 400  # Orbax save cadence (a save also happens at the end)
    c.keep_checkpoints = 2          # how many recent checkpoints to keep
    c.eval_every_steps = 400        # evaluate on the "val" split every this many steps (0: off)
    c.log_every_steps = 50          # metrics.jsonl train rows and non-finite checks

    c.mesh = ml_collections.ConfigDict()
    c.mesh.num_devices = 0          # devices of the mesh (0: all visible devices)
    c.mesh.param_sharding = "replicated"  # train state: "replicated" on every device, or
                                    # "fsdp": each big array split over `data` (1/n per device)
    c.mesh.model_axis = 1           # devices on the `model` axis (of mesh.num_devices): the
                                    # Transformer and BERT weights split over it by attention
                                    # heads and MLP columns (tensor parallelism), the batch
                                    # over the rest (`data`); 1: off
    c.mesh.memory_plan = "auto"     # the train step's memory per device, logged before its
                                    # first step and refused in one line when it does not fit
                                    # the device: "auto" (compiled on GPUs and TPUs; on CPU
                                    # parameters and optimizer only) | "compile" | "off"

    c.data = ml_collections.ConfigDict()
    c.data.name = "synthetic_paraphrase"  # "synthetic_paraphrase" | "pairs" | "quora" |
                                    # "beir" (a BEIR folder) | "reqa_squad" (SQuAD v1.1 JSON)
    c.data.tfds_dir = ""            # where TFDS writes the array_record files ("": WORKDIR/tfds)
    c.data.path = ""                # pairs: TSV (query<TAB>document) or JSONL file;
                                    # quora: default ../shared/data/quora/pairs.tsv;
                                    # beir: the folder; reqa_squad: default
                                    # ../shared/data/squad/dev-v1.1.json
    c.data.rebuild = False          # resume on input files whose content changed since the
                                    # workdir recorded them (WORKDIR/data.json; else refused):
                                    # rebuild the tables from them, keep the vocabulary (the
                                    # checkpoints' embedding rows are tied to it)
    c.data.skip_bad_lines = False   # pairs: skip (and count) bad lines instead of stopping
    c.data.val_fraction = 0.05      # pairs/quora: clusters (reqa_squad: articles) for "val"
    c.data.test_fraction = 0.1      # pairs/quora: clusters (reqa_squad: articles) for "test"
    c.data.candidate_context = False  # reqa_squad: candidate = sentence + its paragraph
    c.data.candidate_unit = "sentence"  # reqa_squad: candidates are "sentence"s (ReQA) or
                                    # whole "paragraph"s (a question's own is relevant)
    c.data.num_train_clusters = 3000  # synthetic: paraphrase clusters to train on
    c.data.num_val_clusters = 200   # synthetic: clusters in the "val" split
    c.data.num_test_clusters = 500  # synthetic: clusters in the "test" split
    c.data.candidates = "split"     # eval candidates: the split's own questions ("split") or
                                    # every question of the dataset, train included ("all")
    c.data.min_cluster_coherence = 0.0  # drop clusters whose mean member/union word Jaccard
                                    # is below this (Bonadiman et al. eq. 4-5; 0: keep all)
    c.data.hard_negatives = 0       # k BM25-mined negatives per training pair (documents of
                                    # other clusters), extra columns of the in-batch loss
                                    # for every row (0: off)
    c.data.ignore_identical_ids = True  # beir: a document with the query's id is not a
                                    # candidate for it (BEIR's evaluation; right for BEIR's
                                    # quora); False where the numberings are unrelated (NPL)
    c.data.pseudo_labels = 0        # weak supervision: k > 0 replaces the training pairs
                                    # by (query, each of BM25's top k documents) for the
                                    # training queries (their labels unused), over every
                                    # document of the dataset (Dehghani et al. 2017)
    c.data.pseudo_label_queries = ""  # with pseudo_labels: a file of queries (one per line)
                                    # to label instead of the training queries
    c.data.worker_count = -1        # grain worker processes (0: read in the main process;
                                    # -1: none when the pairs are tokenized up front, as
                                    # every source under 2 GiB of token ids is, or generated
                                    # (pre-training), else one a core but the main one's,
                                    # at most 8)
    c.data.prefetch_batches = 4     # training batches built ahead, by as many threads
    c.data.split_by = "article"     # reqa_squad: split "article"s into train/val/test
                                    # (val_fraction, test_fraction), or "question"s (Chang et
                                    # al., Ahmad et al.: train_fraction to train, val_fraction
                                    # to val, the rest to test; every candidate in every split)
    c.data.train_fraction = 0.8     # reqa_squad with split_by="question": questions to train on
    # data.name = "pretrain": pairs generated from an unlabelled collection at data.path (a
    # SQuAD .json, a BEIR folder, or a documents .jsonl; see dualjax/data/documents.py)
    c.data.tasks = "ict,bfs,wlp"    # pretrain: any of "ict", "bfs", "wlp", "crop" (Contriever's
                                    # two random spans of a passage), "pseudo" (a sentence of
                                    # each passage, labelled by the start's hybrid with BM25:
                                    # needs model.pretrained or init_from), mixed uniformly;
                                    # or "mlm" alone (masked language modelling, transformer);
                                    # or "distill" alone (a sentence of each passage with
                                    # candidates scored by distill.teacher, learnt as c.distill
                                    # says)
    c.data.ict_mask_rate = 0.9      # pretrain ICT: P(the query sentence is removed from its
                                    # passage) (ORQA: 0.9)
    c.data.min_query_words = 5      # pretrain: shorter sentences are never queries
    c.data.max_query_words = 0      # pretrain: a query (sentence, pseudo-query, distill
                                    # query) is cut to this many words (0: whole;
                                    # configs/adapt.py: 48)
    c.data.pseudo_weight = 0.5      # pretrain "pseudo": the dense weight of the start's hybrid
                                    # with BM25 that labels each pseudo-query (weak_labels.py)
    c.data.passage_words = 288      # pretrain, .jsonl with plain "text": words per passage

    c.tasks = ml_collections.ConfigDict()  # multi-task (Gillick et al. 2018 2): name ->
                                    # {"data": a group like c.data, "weight": 1.0}; each step
                                    # trains on one task drawn by weight, one shared encoder,
                                    # a scale and bias per task, evaluation per task. When
                                    # set, c.data is not used (configs/multitask.py)

    c.model = ml_collections.ConfigDict()
    c.model.name = "dual_encoder"   # "dual_encoder" (two towers) | "pses" (partially shared
                                    # embedding spaces, Li & Jia 2018: model.pses, loss.pses)
    c.model.tokenizer = "word"      # "word" (unigrams) | "char_trigram" | "word+char_trigram" |
                                    # "bigram" (unigrams + word bigrams) | "sentencepiece"
                                    # (trained on the training texts); all + hashed OOV buckets;
                                    # "hf": model.tokenizer_path's or model.pretrained's
    c.model.vocab_size = 20000      # most frequent training words (bigram: unigrams + bigrams;
                                    # sentencepiece: pieces) kept in the vocabulary
    c.model.trigram_vocab_size = 40000  # char_trigram, word+char_trigram: trigrams kept
    c.model.num_oov_buckets = 1000  # hashed buckets for every other word
    c.model.tokenizer_path = ""     # tokenizer="hf": a Hugging Face tokenizer.json (or a folder
                                    # holding one); "" with model.pretrained: the start's own
    c.model.pretrained = ""         # start the towers from pretrained weights: a fetched name
                                    # ("all-MiniLM-L6-v2", "wordllama:l2_supercat_256",
                                    # "potion-base-8M": python -m dualjax.pretrained fetch NAME)
                                    # or a folder (Hugging Face BERT, MPNet, Llama, Mistral,
                                    # Qwen2, Qwen3, model2vec). A BERT needs tower="bert", a
                                    # decoder LLM tower="decoder"; a static table tower="bow"
                                    # or "bow_mlp" with embed_dim its width; all tokenizer="hf"
    c.model.pretrained_pooling = ""  # a folder without sentence-transformers' Pooling module:
                                    # BERT "cls" or "mean" ("": cls); a decoder "last_token"
                                    # or "mean" ("": last_token); with one: its own
    c.model.lora_rank = 0           # LoRA adapters of this rank on the towers' projections,
                                    # the towers' own weights frozen (0: off, all train);
                                    # the decoder, bert and modernbert towers take them
    c.model.lora_alpha = 16.0       # the adapters' update is A B lora_alpha / lora_rank
    c.model.lora_targets = ""       # the projections adapted: decoder "query,key,value,out,
                                    # mlp_gate,mlp_up,mlp_down" (or Hugging Face's "q_proj,...,
                                    # down_proj"), bert "query,key,value,out,mlp_in,mlp_out",
                                    # modernbert "qkv,out,mlp_in,mlp_out" (or "Wqkv,Wo,Wi")
                                    # ("": all of the tower's)
    c.model.lora_base_dtype = "bfloat16"  # the frozen weights' dtype with LoRA: "bfloat16" |
                                    # "float32"
    c.model.max_len = 32            # tokens per text (longer texts are truncated)
    c.model.query_max_len = 0       # tokens per query (0: max_len); Chang et al.: 64
    c.model.doc_max_len = 0         # tokens per document (0: max_len); Chang et al.: 288
    c.model.query_prompt = ""       # put before every query, in training, evaluation, the
                                    # bundle and an exported folder (E5: "query: "; its
                                    # tokens count in the max length). "": the pretrained
                                    # start's (its config_sentence_transformers.json), if any
    c.model.document_prompt = ""    # the same for documents (E5: "passage: ")
    c.model.tower = "bow_mlp"       # "bow" (mean of embeddings) | "bow_mlp" (+ 2-layer tanh MLP)
                                    # | "cnn" (convolutions + max pooling, Bonadiman et al.
                                    # 2019) | "transformer" (pre-LN encoder, Chang et al. 2020)
                                    # | "bert" (model.pretrained's BERT encoder, its sizes)
                                    # | "decoder" (model.pretrained's decoder LLM, its sizes)
    c.model.query_tower = ""        # the query side's tower instead of model.tower ("": same);
                                    # needs shared_towers=False
    c.model.doc_tower = ""          # the document side's tower instead of model.tower ("": same);
                                    # needs shared_towers=False
    c.model.shared_towers = True    # one tower for queries and documents, or two
    c.model.remat = False           # decoder, modernbert: each layer's activations computed
                                    # again in the backward pass instead of kept (less memory,
                                    # about a third more compute; see mesh.memory_plan)
    c.model.dtype = "float32"       # every tower's activations: "float32" | "bfloat16" (params
                                    # stay float32; embeddings and loss are float32)
    c.model.shared_embedding = False  # two towers (shared_towers=False) reading ONE token
                                    # table (Moscicki 2022); the layers above stay separate.
                                    # Both sides' tables must have the same width
    c.model.embed_dim = 128         # word embedding size (= output size for "bow"); bow,
                                    # bow_mlp, cnn (the transformer's is transformer.width)
    c.model.embed_init_std = 1.0    # stddev of the normal init of word embeddings (with plain
                                    # SGD, smaller means larger relative updates); bow, bow_mlp, cnn
    c.model.hidden_dim = 256        # bow_mlp: hidden layer size
    c.model.output_dim = 128        # bow_mlp, cnn, transformer: embedding size
    c.model.cnn_windows = "5"       # cnn: convolution window sizes, comma separated ("3,4,5");
                                    # 'SAME' padding, pads never seen as content
    c.model.cnn_filters = 256       # cnn: filters per window size (max-pooled, concatenated,
                                    # then a linear layer to output_dim)
    c.model.query_features = ""     # categorical fields of queries, "name[:size],..." (Moscicki
                                    # 2022 4.2): each its own embedding table, concatenated
                                    # with the text vector before the tower's dense layers
                                    # (bow_mlp, cnn, transformer). Read from pairs JSONL
                                    # "query_fields": {"name": value}
    c.model.doc_features = ""       # the same for documents ("document_fields"), e.g.
                                    # "category:32,brand:16"
    c.model.feature_dim = 32        # embedding size of a field given without ":size"
    c.model.feature_vocab_size = 1000  # most frequent training values of each field with their
                                    # own id; a missing value (absent, null, "") gets id 0
    c.model.feature_buckets = 100   # hashed (CRC-32) buckets for every other value
    c.model.transformer = ml_collections.ConfigDict()
    c.model.transformer.preset = ""  # "bert_base" (12 layers, width 768, 12 heads, mlp 3072,
                                    # overriding the four sizes below) | "": the sizes below
    c.model.transformer.num_layers = 2  # pre-LN encoder layers (CPU-sized default)
    c.model.transformer.width = 128  # hidden size (= token embedding size)
    c.model.transformer.num_heads = 4  # attention heads (width must be divisible by it)
    c.model.transformer.mlp_dim = 512  # hidden size of each layer's GELU MLP
    c.model.transformer.max_positions = 512  # learned positions: texts up to this many
                                    # tokens (the prepended [CLS] vector has no position)
    c.model.transformer.pooling = "cls"  # final linear layer on the "cls" state (a learned
                                    # vector prepended inside the tower) | "mean" of the
                                    # text's token states
    c.model.transformer.init_std = 0.02  # stddev of the normal init of every weight (BERT)
    c.model.pses = ml_collections.ConfigDict()  # model.name="pses": model.tower (the trunk,
                                    # the paper's "bow") gives x; NN_s, NN_q, NN_d map x to
                                    # the shared and specific codes; decoders rebuild x
    c.model.pses.hidden_layers = 1  # tanh hidden layers of each encoder and decoder (paper: 1-3)
    c.model.pses.hidden_dim = 256   # their width
    c.model.pses.shared_dim = 128   # size of z_s, the shared space
    c.model.pses.specific_dim = 64  # size of z_q and z_d, the query and document spaces
    c.model.pses.score = "concat"   # retrieval vector: unit [z_s; z_q] / [z_s; z_d] ("concat")
                                    # or unit z_s ("shared")
    c.model.similarity = "cosine_affine"  # "cosine_affine": alpha*cos+beta, learned |
                                    # "cosine_temperature": cos/temperature, fixed |
                                    # "cosine_learned_temperature": cos/tau, log tau learned
                                    # (CLIP), clipped to tau in [0.01, 1]
    c.model.temperature = 0.1       # cosine_temperature: tau; cosine_learned_temperature:
                                    # its initial value
    c.model.init_scale = 10.0       # cosine_affine: initial alpha
    c.model.init_bias = 0.0         # cosine_affine: initial beta

    c.loss = ml_collections.ConfigDict()
    c.loss.name = "in_batch_softmax"  # over the global batch (every query against all the
                                    # batch's documents; positives on the diagonal):
                                    # "in_batch_softmax" | "in_batch_sigmoid" (logistic loss
                                    # on every entry, Gillick et al. 2018) |
                                    # "in_batch_triplet_hardest" (hardest negative, cosine,
                                    # Gillick) | "triplet_margin" (Moscicki 2022 eq. 4.2,
                                    # Bonadiman et al. 2019 TL) | "sdml" (smoothed softmax on
                                    # -||q-d||^2, Bonadiman) | "pointwise_logistic" (needs
                                    # labelled negative pairs: no dataset has them yet)
    c.loss.symmetric = False        # in_batch_softmax: average with the documents -> queries
                                    # softmax (over each positive's column)
    c.loss.margin = -1.0            # triplet margin (< 0: the source's default: 0.5 for
                                    # in_batch_triplet_hardest; triplet_margin: 0.3 cosine,
                                    # 0.5 euclidean and squared_euclidean)
    c.loss.distance = "cosine"      # triplet_margin: "cosine" (1 - cos) | "euclidean" |
                                    # "squared_euclidean"
    c.loss.hard = False             # triplet_margin: hardest negative only (TL(Hard)) instead
                                    # of the mean over every negative (TL(Rand))
    c.loss.label_smoothing = 0.3    # sdml: epsilon spread over the row's N columns
    c.loss.sdml_scale = 1.0         # sdml: logits = -sdml_scale * ||q - d||^2 (paper: 1;
                                    # unit embeddings keep ||q - d||^2 in [0, 4])
    c.loss.remove_accidental_hits = True  # when batches carry document ids: a column with the
                                    # row's positive's id is not one of its negatives
    c.loss.remove_query_hits = True # ... nor a column whose document is the row's own query
                                    # text (a pairs file with both (a, b) and (b, a))
    c.loss.remove_cluster_hits = True  # ... nor a document of the row's cluster (transitive
                                    # closure of the training pairs: its paraphrases)
    c.loss.num_mixed_negatives = 0  # U documents drawn uniformly from the training pairs'
                                    # documents per step, added as negatives of every row
                                    # (Yang et al. 2020's mixed negative sampling; a multiple
                                    # of the device count; 0: off)
    c.loss.log_q_buckets = 0        # logQ correction (Yi et al. 2019) for in_batch_softmax and
                                    # sdml: subtract log of each document's estimated sampling
                                    # probability; buckets of its streaming estimate (0: off)
    c.loss.log_q_alpha = 0.01       # logQ: moving-average rate of the estimated sampling gap
    c.loss.column_block = 0         # in-batch losses: each device scores its rows against the
                                    # gathered columns this many at a time, recomputing each
                                    # block in the backward pass ([rows, column_block] scores
                                    # at most instead of [rows, C]); 0: all columns at once
    c.loss.matryoshka_dims = ""     # "64,128": the loss also on each prefix of the vectors
                                    # (their first m coordinates, renormalised), summed with
                                    # the full one, so each prefix is usable alone
                                    # (Kusupati et al. 2022; sentence-transformers'
                                    # MatryoshkaLoss). "": the full vectors only

    c.loss.pses = ml_collections.ConfigDict()  # model.name="pses": loss = pairwise + the
                                    # weighted terms below (Li & Jia 2018 eq. 6)
    c.loss.pses.pairwise = "hinge"  # "hinge": max(0, margin - (cos(q,d+) - cos(q,d-))), d- a
                                    # random document of the batch (the paper) | "in_batch":
                                    # loss.name over the global batch
    c.loss.pses.margin = 0.5        # hinge margin (beta)
    c.loss.pses.orthogonality_weight = 1e-5  # ||Z_sQ^T Z_Q||_F^2 + ||Z_sD^T Z_D||_F^2 over the
                                    # global batch (a sum: it grows with the batch squared)
    c.loss.pses.adversarial_weight = 10.0  # the critic's Wasserstein estimate, minimised
    c.loss.pses.reconstruction_weight = 0.01  # squared L2 error of rebuilding x, both sides
    c.loss.pses.regularization_weight = 1e-5  # squared Frobenius norms of the dense weights
    c.loss.pses.critic_hidden_dim = 64  # the critic: z_s -> hidden (ReLU) -> {query, document}
    c.loss.pses.critic_steps = 5    # critic updates per encoder update (WGAN, ADAN: 5)
    c.loss.pses.critic_clip = 0.01  # critic weights clipped to [-c, c] after each update
    c.loss.pses.critic_learning_rate = 5e-5  # the critic's RMSProp (WGAN)
    c.loss.pses.trainable = "all"   # params that train: "all" | "shared" (NN_s and the
                                    # similarity only: fine-tuning as the paper does)

    c.distill = ml_collections.ConfigDict()  # data.tasks="distill": the student learns a
                                    # teacher's scores of each pseudo-query's candidates,
                                    # mined and scored once before training and kept in
                                    # WORKDIR/teacher_scores.jsonl (dualjax/train/teacher.py)
    c.distill.teacher = ""          # a pretrained start, by name (all-mpnet-base-v2, ...) or
                                    # folder, as model.pretrained takes them; its vocabulary
                                    # and width need not be the student's
    c.distill.teacher_weight = 0.5  # the teacher's dense weight in its fusion with BM25
                                    # (score interpolation, as eval.hybrid_weight); 1: alone
    c.distill.negatives = 3         # k negatives per query, besides its positive (the
                                    # teacher's first): each step encodes 1 + k documents a pair
    c.distill.depth = 30            # ... drawn at random from the teacher's top `depth`
    c.distill.margin = 0.1          # a candidate the teacher scores within this of the
                                    # positive (scores in [0, 1]) is dropped: likely relevant
                                    # too (a false negative)
    c.distill.max_len = 0           # the teacher's tokens per text; 0: its own max length
    c.distill.queries_per_passage = 1  # pseudo-queries of each passage: that many distinct
                                    # sentences of it (all it has when fewer); max_epochs
                                    # counts passes over passages x this
    c.distill.loss = "kl"           # "kl": KL(teacher || student) over each query's 1 + k
                                    # candidates | "margin_mse": the squared error of the
                                    # positive-negative margins (losses/distillation.py)
    c.distill.weight = 1.0          # the distillation term's weight, added to ...
    c.distill.in_batch_weight = 1.0  # ... loss.name's over the global batch times this (0:
                                    # the teacher's scores alone)
    c.distill.temperature = 0.1     # the teacher's logits are its scores over this; the
                                    # student's, the model's own (model.temperature)

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adamw"      # "sgd" (with momentum) | "adam" | "adamw"
    c.optimizer.learning_rate = 3e-3  # peak learning rate
    c.optimizer.momentum = 0.9      # sgd: momentum
    c.optimizer.weight_decay = 0.0  # adamw: decoupled weight decay
    c.optimizer.warmup_steps = 100  # adam/adamw: linear warmup from 0 to the peak
    c.optimizer.decay = "linear"    # adam/adamw after warmup: "linear" (to 0 at the end)
                                    # | "constant"
    c.optimizer.grad_clip_norm = 0.0  # clip the global gradient norm to this (0: off)
    c.optimizer.table_updates = "dense"  # "lazy": a step updates only the token-table rows its
                                    # batch reads (their moments too): faster, but not Adam's
                                    # semantics for the other rows (docs/training.md,
                                    # dualjax/train/lazy_rows.py)

    c.eval = ml_collections.ConfigDict()
    c.eval.index = "scann"          # "scann": ScaNN index (also searched exactly, to report
                                    # its recall and MAP gap) | "exact": chunked matmul + top_k
                                    # | "hnsw": faiss HNSW graph (pip install faiss-cpu)
    c.eval.scann = ann.default_scann_config()  # ScaNN knobs; "auto" picks by corpus size
    c.eval.hnsw = ml_collections.ConfigDict()  # faiss HNSW knobs (eval.index = "hnsw")
    c.eval.hnsw.M = 32              # graph neighbours per node (memory ~ 2M ids per point)
    c.eval.hnsw.ef_construction = 200  # candidate list while building (build time grows with it)
    c.eval.hnsw.ef_search = 0       # candidate list per query (0: max(128, 2 * (top_k + 1));
                                    # at least k + 1; lower: faster, less recall)
    c.eval.top_k = 100              # results kept per query (>= every metric's cutoff)
    c.eval.dims = ""                # "64,128": the trained model also searched with its
                                    # vectors cut to each of these dimensions (rows
                                    # "dual_encoder@64"), as Encoder(dim=) and --dim read them
    c.eval.batch_size = 512         # texts per jitted encoding batch
    c.eval.query_chunk = 256        # queries scored at once against the corpus
    c.eval.corpus_chunk = 4096      # corpus rows scored at once (memory: query_chunk x
                                    # corpus_chunk)
    c.eval.untrained = True         # also evaluate the model at initialisation (system "untrained")
    c.eval.baselines = "bm25,tfidf,identity"  # lexical baselines on the same task ("": none)
    c.eval.bm25_k1 = 0.9            # BM25's term-frequency saturation (pyserini's BEIR "flat"
                                    # run: 0.9; Lucene's and bm25s's default: 1.2)
    c.eval.bm25_b = 0.4             # BM25's length normalisation (pyserini's BEIR: 0.4;
                                    # Lucene's default: 0.75)
    c.eval.bm25_stemmer = "snowball"  # BM25's terms, as Lucene's English analyzer makes them:
                                    # English stopwords dropped, words stemmed by "snowball"
                                    # (Snowball English) or "porter" (Lucene's and pyserini's
                                    # stemmer); "": plain lowercased words, no stopword list
                                    # (dualjax's BM25 before 2026-11). Every BM25 of the run
                                    # reads these three: the baseline, eval.hybrid and the
                                    # pseudo-labels (data.tasks "pseudo")
    c.eval.select_by = ""           # a metric ("map@100", "ndcg@10", ...): keep the params of
                                    # the step with the best val value (evaluations every
                                    # eval_every_steps, and the last step) and evaluate them
                                    # too, as "<model>_best" with its "selected_step" ("": off)
    c.eval.early_stopping = 0       # with select_by: stop training once the best val step is
                                    # this many evaluations behind (0: never)
    c.eval.hybrid = ""              # hybrid search: each trained model's ranking fused with
                                    # this lexical system's ("bm25", "tfidf") by reciprocal
                                    # rank fusion, evaluated as "<model>+bm25", and by score
                                    # interpolation, as "<model>+bm25_interp" ("": off)
    c.eval.hybrid_rrf_k = 60.0      # RRF constant: score = sum of 1 / (k + rank) (Cormack
                                    # et al. 2009 use 60)
    c.eval.hybrid_weight = 0.5      # interpolation's dense weight w (w * dense + (1 - w) *
                                    # lexical, each min-max scaled per query) where no val
                                    # split chooses it (zero-shot; 0.5: the best mean nDCG@10
                                    # ratio to stemmed BM25 of all-MiniLM-L6-v2 + BM25 over
                                    # the four shared collections, and what any three of them
                                    # choose for the fourth, BENCHMARKS.md); with one, the val
                                    # split's best of 0, 0.1, ..., 1 by eval.select_by (else
                                    # map@100) is used
    c.eval.typo_probs = ""          # typo robustness (Moscicki 2022, 4.4): after the final
                                    # evaluation, rerun the test queries with typos at each of
                                    # these probabilities, e.g. "0,0.25,0.5,0.75" (rows with
                                    # "typo_p"; typo_robustness.png) ("": off)
    c.eval.typo_seed = 0            # seeds the typos of that sweep
    c.eval.evaluators = ""          # registered evaluators run after each task's retrieval
                                    # evaluation, e.g. "mine" (options: a group
                                    # c.eval.mine); docs/design.md, "Extending dualjax"
    c.eval.rerun = False            # a finished workdir is not evaluated again unless True
    return c
