"""Config checks that need the registries: every name and number is checked before any
work starts, and the message names the key and what would work."""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from dualjax import losses
from dualjax.config import specs
from dualjax.config.checks import one_of, positive
from dualjax.config.model_checks import check_model, check_pses
from dualjax.data import pretraining, reqa, sources
from dualjax.errors import ConfigError, PretrainedError
from dualjax.eval import evaluators
from dualjax.objectives import optimizer
from dualjax.retrieval import baselines, metrics, searchers
from dualjax.runtime import sharding

OPTIMIZERS, TABLE_UPDATES, DECAYS = (optimizer.OPTIMIZERS, optimizer.TABLE_UPDATES,
                                     optimizer.DECAYS)


def _check_loss(loss: ml_collections.ConfigDict) -> None:
    """config.loss: a known loss with the data it needs, and no option it would ignore."""
    one_of("loss.name", loss.name, losses.LOSSES)
    if losses.LOSSES[loss.name].needs_labels:
        in_batch = [n for n, spec in losses.LOSSES.items() if not spec.needs_labels]
        raise ConfigError(f"config.loss.name={loss.name!r} needs a dataset with labelled "
                          "negative pairs (query, document, 0/1 label), which no config.data.name "
                          f"provides yet; use an in-batch loss: {', '.join(in_batch)}")
    try:  # the loss's own checks of its options (registry.Loss.resolve)
        losses.resolve_options(loss.name, specs.loss_options(loss))
    except ValueError as e:
        raise ConfigError(f"config.loss.{e}") from None
    if loss.log_q_buckets and not losses.LOSSES[loss.name].uses_log_q:
        users = ", ".join(n for n, spec in losses.LOSSES.items() if spec.uses_log_q)
        raise ConfigError(f"config.loss.log_q_buckets={loss.log_q_buckets}: the logQ correction "
                          f"applies to {users}, not loss.name={loss.name!r}")
    if loss.log_q_buckets < 0 or not 0 < loss.log_q_alpha <= 1:
        raise ConfigError("config.loss.log_q_buckets must be >= 0 and config.loss.log_q_alpha "
                          "in (0, 1]")
    if type(loss.column_block) is not int or loss.column_block < 0:
        raise ConfigError(f"config.loss.column_block={loss.column_block!r} must be an int >= 0 "
                          "(columns scored at a time; 0: all at once)")
    # Options that do nothing for this loss are mistakes: say which losses use them.
    users_of = lambda option: ", ".join(n for n, s in losses.LOSSES.items()
                                        if option in s.options)
    for option, ignored in (("symmetric", loss.symmetric), ("hard", loss.hard),
                            ("margin", loss.margin >= 0)):
        if ignored and option not in losses.LOSSES[loss.name].options:
            default = " (set it to -1 for the loss's default)" if option == "margin" else ""
            raise ConfigError(f"config.loss.{option}={loss[option]} only applies to "
                              f"{users_of(option)}, not loss.name={loss.name!r}{default}")




def validate(config: ml_collections.ConfigDict, num_devices: int, workdir: str = "") -> None:
    """Raises ConfigError for the first value that cannot work (`workdir`: the run's, whose
    recorded pretrained start lets a resumed run go on without the start's folder)."""
    task_list = specs.task_configs(config)
    _check_tasks(task_list)
    width = check_model(config, workdir)
    pretraining = _check_pretraining(config, task_list)
    _check_distill(config, task_list, workdir)
    _check_loss(config.loss)
    _check_dims(config, width)
    _check_pses_data(config, task_list, pretraining)
    _check_optimizer(config, task_list)
    _check_eval(config)
    _check_numbers(config)
    _check_batch(config, task_list, num_devices)


def _check_dims(config: ml_collections.ConfigDict, width: int | None) -> None:
    """loss.matryoshka_dims and eval.dims: prefixes of the model's vectors, each below
    their `width` (the jitted loss or the final evaluation found it, after the data,
    the vocabulary and all the steps)."""
    trained = specs.dims(config.loss.matryoshka_dims, "loss.matryoshka_dims")
    if trained and (config.model.name == "pses" or specs.is_mlm(config)):
        raise ConfigError("config.loss.matryoshka_dims: the Matryoshka loss is the dual "
                          "encoder's in-batch loss on prefixes; model.name='pses' and MLM "
                          "pre-training have none")
    evaluated = specs.dims(config.eval.dims, "eval.dims")
    for key, dims in (("loss.matryoshka_dims", trained), ("eval.dims", evaluated)):
        if width is not None and dims and dims[-1] >= width:
            raise ConfigError(f"config.{key}={config[key.split('.')[0]][key.split('.')[1]]!r}:"
                              f" {dims[-1]} is not below the model's {width} dimensions (each "
                              "is a prefix of its vectors, which are trained and searched "
                              "whole anyway)")


def _check_tasks(task_list) -> None:
    """Each task's data group, and its weight."""
    for name, data, weight in task_list:
        _check_data(data, f"tasks.{name}.data" if name else "data")
        if not weight > 0:
            raise ConfigError(f"config.tasks.{name}.weight={weight} must be > 0")


def _check_pretraining(config: ml_collections.ConfigDict, task_list) -> bool:
    """data.name="pretrain" tasks: what they can be mixed with; whether there are any."""
    pretrain = [name for name, data, _ in task_list if data.name == specs.PRETRAIN]
    if pretrain and len(pretrain) == len(task_list) and not config.num_train_steps:
        raise ConfigError("config.num_train_steps=0 evaluates only, but data.name='pretrain' "
                          "has nothing to evaluate on; evaluate with another data.name and "
                          "config.init_from=<the pre-training workdir>")
    if any(d.name == specs.PRETRAIN and "mlm" in d.tasks for _, d, _ in task_list):
        if len(task_list) > 1:
            raise ConfigError("config.data.tasks='mlm' trains a token-level objective; it "
                              "does not mix with config.tasks")
        if specs.tower_names(config.model)[1] != "transformer":
            raise ConfigError("config.data.tasks='mlm' needs a transformer document tower "
                              f"(model.tower={config.model.tower!r}); MLM predicts tokens "
                              "from its token states")
    if any(d.name == specs.PRETRAIN and "pseudo" in pretraining.parse_tasks(d.tasks)
           for _, d, _ in task_list) and not (config.model.pretrained
                                              or config.init_from):
        raise ConfigError("config.data.tasks 'pseudo' labels queries with the run's start: set "
                          "model.pretrained or config.init_from")
    if pretrain and config.loss.num_mixed_negatives:
        raise ConfigError("config.loss.num_mixed_negatives: mixed negatives are drawn from a "
                          "table of training pairs, which data.name='pretrain' does not have")
    return bool(pretrain)


def _check_pses_data(config: ml_collections.ConfigDict, task_list, pretraining: bool) -> None:
    """model.name="pses": its settings, and the negatives it draws (the batch's only)."""
    if config.model.name == "pses":
        check_pses(config, pretraining)
        if any(d.hard_negatives for _, d, _ in task_list):
            raise ConfigError("config.data.hard_negatives: model.name='pses' draws its "
                              "negatives from the batch; set data.hard_negatives=0")


def _check_optimizer(config: ml_collections.ConfigDict, task_list) -> None:
    """config.mesh's sharding and config.optimizer."""
    one_of("mesh.param_sharding", config.mesh.param_sharding,
            sharding.PARAM_SHARDINGS)
    one_of("mesh.memory_plan", config.mesh.memory_plan, sharding.MEMORY_PLANS)
    one_of("optimizer.name", config.optimizer.name, OPTIMIZERS)
    one_of("optimizer.decay", config.optimizer.decay, DECAYS)
    table_updates = config.optimizer.table_updates
    one_of("optimizer.table_updates", table_updates, TABLE_UPDATES)
    if table_updates == "lazy" and (config.model.name == "pses" or any(
            d.name == specs.PRETRAIN and "mlm" in d.tasks for _, d, _ in task_list)):
        raise ConfigError("config.optimizer.table_updates='lazy' updates the token-table rows "
                          "a batch looks up; model.name='pses' and data.tasks='mlm' also read "
                          "the tables otherwise: use 'dense'")


def _check_eval(config: ml_collections.ConfigDict) -> None:
    """config.eval: the index, baselines, best-step selection, hybrid search, typos."""
    one_of("eval.index", config.eval.index, searchers.SEARCHERS)
    for name in specs.evaluator_names(config.eval.evaluators):
        one_of("eval.evaluators", name, evaluators.EVALUATORS)
    for kind in searchers.SEARCHERS.values():  # each searcher's own settings
        try:
            kind.check(config.eval)
        except ValueError as e:
            raise ConfigError(f"config.eval.{e}") from None
    missing = searchers.SEARCHERS[config.eval.index].missing()
    if missing:
        others = " or ".join(n for n, k in searchers.SEARCHERS.items()
                             if n != config.eval.index and k.missing() is None)
        raise ConfigError(f"config.eval.index={config.eval.index!r}: {missing} "
                          f"(--config.eval.index={others})")
    for name in specs.baseline_names(config):
        one_of("eval.baselines", name, baselines.BASELINES)
    if config.eval.select_by:
        names = [k for k in metrics.retrieval_metrics(np.zeros((1, 1), int), [{0}])
                 if k != "num_queries"]
        one_of("eval.select_by", config.eval.select_by, names)
        if not config.eval_every_steps:
            raise ConfigError(f"config.eval.select_by={config.eval.select_by!r} chooses among "
                              "the validation evaluations: set config.eval_every_steps > 0")
    if config.eval.early_stopping < 0 or (config.eval.early_stopping and not config.eval.select_by):
        raise ConfigError(f"config.eval.early_stopping={config.eval.early_stopping} counts "
                          "evaluations without a better config.eval.select_by: set that metric "
                          "and a count >= 0")
    deepest = max(metrics.cutoffs())
    if 0 < config.eval.top_k < deepest:  # recall@100 from 5 results would equal recall@5
        raise ConfigError(f"config.eval.top_k={config.eval.top_k} is below the metrics' "
                          f"deepest cutoff ({deepest}: map@100, recall@100): retrieve at least "
                          f"--config.eval.top_k={deepest}")
    one_of("eval.bm25_stemmer", specs.bm25_options(config.eval)["stemmer"], baselines.STEMMERS)
    for key in ("bm25_k1", "bm25_b"):
        if key in config.eval:
            positive(config, f"eval.{key}", allow_zero=True)
    if config.eval.bm25_b > 1:
        raise ConfigError(f"config.eval.bm25_b={config.eval.bm25_b} must be between 0 and 1")
    if config.eval.hybrid:
        one_of("eval.hybrid", config.eval.hybrid,
                [n for n in baselines.BASELINES if n != "identity"])
        positive(config, "eval.hybrid_rrf_k", allow_zero=True)
        if not 0 <= config.eval.hybrid_weight <= 1:
            raise ConfigError(f"config.eval.hybrid_weight={config.eval.hybrid_weight} must be "
                              "in [0, 1]")
    specs.typo_probs(config)


def _check_numbers(config: ml_collections.ConfigDict) -> None:
    """Sizes, rates and counts: positive (or zero where zero means off)."""
    positive(config, "global_batch_size", "model.vocab_size", "model.max_len",
              "model.embed_dim", "model.hidden_dim", "model.output_dim", "model.temperature",
              "optimizer.learning_rate", "eval.top_k", "eval.batch_size", "eval.query_chunk",
              "eval.corpus_chunk", "data.prefetch_batches")
    positive(config, "max_epochs", allow_zero=True)
    positive(config, "num_train_steps", "checkpoint_every_steps", "eval_every_steps",
              "log_every_steps",
              "keep_checkpoints", "model.num_oov_buckets", "optimizer.warmup_steps",
              "optimizer.grad_clip_norm", "optimizer.weight_decay",
              "mesh.num_devices", "model.query_max_len", "model.doc_max_len",
              "model.feature_vocab_size", "model.feature_buckets", allow_zero=True)
    for name, data, _ in specs.task_configs(config):
        if data.worker_count < -1:
            key = f"tasks.{name}.data" if name else "data"
            raise ConfigError(f"config.{key}.worker_count={data.worker_count} must be >= 0, "
                              "or -1 to choose from the host's cores")
    if not 0 <= config.seed < 2 ** 31:  # the data order takes seed + task, mod 2**32
        raise ConfigError(f"config.seed={config.seed} must be in [0, 2**31)")


def _check_batch(config: ml_collections.ConfigDict, task_list, num_devices: int) -> None:
    """What the global batch holds, and how it splits over the devices."""
    mixed = config.loss.num_mixed_negatives
    if mixed < 0 or mixed % num_devices:
        raise ConfigError(f"config.loss.num_mixed_negatives={mixed} must be a multiple of the "
                          f"{num_devices} devices of the mesh (0: off)")
    if (any(d.pseudo_labels for _, d, _ in task_list)
            and any(specs.feature_specs(config.model))):
        raise ConfigError("config.data.pseudo_labels: pseudo-labelled pairs carry no categorical "
                          "fields; unset model.query_features / model.doc_features")
    if any(d.hard_negatives for _, d, _ in task_list):
        if config.loss.log_q_buckets:
            raise ConfigError("config.data.hard_negatives does not combine with "
                              "loss.log_q_buckets (the logQ correction of in-batch sampling); "
                              "set one of them to 0")
        if specs.feature_specs(config.model)[1]:
            raise ConfigError("config.data.hard_negatives: mined negatives are texts without "
                              "categorical fields; unset model.doc_features or set "
                              "data.hard_negatives=0")
    if mixed and config.loss.log_q_buckets:
        raise ConfigError("config.loss.log_q_buckets (logQ correction) does not combine with "
                          "loss.num_mixed_negatives: the uniform draws have another sampling "
                          "probability; set one of them to 0")
    chunks = config.train.encode_chunks
    if type(chunks) is not int or chunks < -1 or chunks > 1 and any(
            n % (chunks * num_devices) for n in (config.global_batch_size, mixed)):
        raise ConfigError(f"config.train.encode_chunks={chunks!r} must split "
                          "config.global_batch_size "
                          f"(and loss.num_mixed_negatives) into chunks of a multiple of the "
                          f"{num_devices} devices of the mesh (0, 1: off; -1: the fewest "
                          "that fit the device)")
    if chunks > 1 and (config.model.name == "pses" or any(
            d.name == specs.PRETRAIN and d.tasks.strip() == "mlm" for _, d, _ in task_list)):
        raise ConfigError(f"config.train.encode_chunks={chunks} chunks the dual encoder's in-batch "
                          "objective; model.name='pses' and data.tasks='mlm' do not use it")
    if config.global_batch_size % num_devices:
        raise ConfigError(f"config.global_batch_size={config.global_batch_size} must be divisible "
                          f"by the {num_devices} devices of the mesh (config.mesh.num_devices)")


def _check_distill(config: ml_collections.ConfigDict, task_list: list,
                   workdir: str = "") -> None:
    """data.tasks="distill" and config.distill: a teacher that is there (unless the run's
    workdir holds its scores already: a resumed run never loads it), a loss that takes
    the candidates as columns, settings in range; distill.teacher without the task is
    refused (it would be ignored)."""
    from dualjax import pretrained
    from dualjax.losses import DISTILL_KINDS
    d = config.get("distill")
    if not specs.is_distill(config):
        if d is not None and d.get("teacher", ""):
            raise ConfigError("config.distill.teacher is read only with "
                              "--config.data.name=pretrain --config.data.tasks=distill")
        return
    if len(task_list) > 1:
        raise ConfigError("config.data.tasks='distill' learns one teacher's scores; it does "
                          "not mix with config.tasks")
    if config.model.name != "dual_encoder":
        raise ConfigError(f"config.data.tasks='distill': model.name={config.model.name!r}; "
                          "distillation trains a dual encoder")
    if config.loss.name == "pointwise_logistic":
        raise ConfigError("config.data.tasks='distill' adds the teacher's candidates as "
                          "columns of an in-batch loss; loss.name='pointwise_logistic' has "
                          "none")
    if not d.teacher:
        raise ConfigError("config.distill.teacher must name the teacher (e.g. "
                          "all-mpnet-base-v2, fetched with python -m dualjax.pretrained "
                          "fetch all-mpnet-base-v2, or a folder)")
    one_of("distill.loss", d.loss, DISTILL_KINDS)
    for key, ok, rule in (("teacher_weight", 0 <= d.teacher_weight <= 1, "between 0 and 1"),
                          ("negatives", d.negatives >= 1, ">= 1"),
                          ("depth", d.depth > d.negatives, "above distill.negatives"),
                          ("margin", d.margin >= 0, ">= 0"),
                          ("max_len", d.max_len >= 0, ">= 0"),
                          ("queries_per_passage", d.queries_per_passage >= 1, ">= 1"),
                          ("temperature", d.temperature > 0, "> 0"),
                          ("weight", d.weight >= 0, ">= 0"),
                          ("in_batch_weight", d.in_batch_weight >= 0, ">= 0")):
        if not ok:
            raise ConfigError(f"config.distill.{key}={d[key]} must be {rule}")
    if workdir and os.path.exists(os.path.join(workdir, "teacher_scores.jsonl")):
        return  # (train.teacher.FILE: train/ sits above config/)
    try:
        pretrained.resolve(d.teacher)
    except PretrainedError as e:
        raise ConfigError(f"config.distill.teacher: {e}") from None


def _check_data(data: ml_collections.ConfigDict, key: str) -> None:
    """One data group (config.data, or config.tasks.<name>.data): known dataset and
    candidates, a pairs file named, split fractions that leave every split non-empty."""
    one_of(f"{key}.name", data.name, (*sources.SOURCES, specs.PRETRAIN))
    one_of(f"{key}.candidates", data.candidates, sources.CANDIDATES)
    one_of(f"{key}.split_by", data.split_by, reqa.SPLIT_BY)
    if data.name == specs.PRETRAIN:
        if not data.path:
            raise ConfigError(f"config.{key}.path must name the collection to pre-train on (a "
                              "SQuAD .json file, a BEIR folder or a documents .jsonl file)")
        try:
            pretraining.parse_tasks(data.tasks)
        except ValueError as e:
            raise ConfigError(f"config.{key.removesuffix('data')}{e}") from None
        if not 0 <= data.ict_mask_rate <= 1:
            raise ConfigError(f"config.{key}.ict_mask_rate={data.ict_mask_rate} must be "
                              "between 0 and 1")
        cut = data.max_query_words
        if cut and not (cut > 0 and cut >= data.min_query_words):
            raise ConfigError(f"config.{key}.max_query_words={cut} must be 0 (queries whole) "
                              f"or at least {key}.min_query_words ({data.min_query_words})")
        if not 0 <= data.pseudo_weight <= 1:
            raise ConfigError(f"config.{key}.pseudo_weight={data.pseudo_weight} must be "
                              "between 0 and 1")
        for option in ("hard_negatives", "pseudo_labels"):
            if data[option]:
                raise ConfigError(f"config.{key}.{option}: pre-training pairs are generated, "
                                  "there are no training queries to mine for; set it to 0")
        return
    if data.name == "pairs" and not data.path:
        raise ConfigError(f"config.{key}.path must name a TSV or JSONL pairs file when "
                          f"config.{key}.name='pairs'")
    one_of(f"{key}.candidate_unit", data.candidate_unit, reqa.UNITS)
    if data.pseudo_labels < 0:
        raise ConfigError(f"config.{key}.pseudo_labels={data.pseudo_labels} must be >= 0")
    if data.pseudo_label_queries and not data.pseudo_labels:
        raise ConfigError(f"config.{key}.pseudo_label_queries is read only with "
                          f"config.{key}.pseudo_labels > 0 (the top k documents to label)")
    if data.pseudo_labels and data.hard_negatives:
        raise ConfigError(f"config.{key}.pseudo_labels and config.{key}.hard_negatives: BM25's "
                          "top documents are the pseudo-positives, so they cannot also be "
                          "mined as negatives; set one of them to 0")
    if data.hard_negatives < 0:
        raise ConfigError(f"config.{key}.hard_negatives={data.hard_negatives} must be >= 0")
    if data.name == "reqa_squad" and data.split_by == "question":
        train, val = data.train_fraction, data.val_fraction
        if not (train >= 0 and val >= 0 and train + val < 1):
            raise ConfigError(f"config.{key}.train_fraction={train} and config.{key}.val_fraction="
                              f"{val} must be >= 0 and leave questions to test on (sum below 1)")
    elif data.name in ("pairs", "quora", "reqa_squad"):
        val, test = data.val_fraction, data.test_fraction
        if not (val > 0 and test > 0 and val + test < 1):
            raise ConfigError(f"config.{key}.val_fraction={val} and config.{key}.test_fraction="
                              f"{test} must be > 0 with a sum below 1 (both splits are evaluated)")
