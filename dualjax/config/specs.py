"""The builders `config.run.resolve` calls: each part of the config (upgraded first, so
every key is there: `config.run.upgrade`) as what a lower layer takes, plain values and
small frozen dataclasses. The data builders, the models, the losses, the
objectives, the indexes and the evaluation never read a ConfigDict (tests/project/test_layers.py
guards it); the ConfigDict stays the user's interface (config files, --config.KEY=VALUE,
WORKDIR/config.json).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from dualjax import losses
from dualjax.data.builders import DatasetSpec
from dualjax.data.pretraining import PRETRAIN
from dualjax.errors import ConfigError
from dualjax.eval.scoring import EvalSpec
from dualjax.models import cnn, lora, towers
from dualjax.models.lora import LoraSpec
from dualjax.models.spec import ModelSpec, PsesSpec, TransformerSpec
from dualjax.objectives import ObjectiveSpec, PsesLoss
from dualjax.objectives.optimizer import OptimizerSpec
from dualjax.retrieval import baselines
from dualjax.text import features
from dualjax.text.sides import InputsSpec


def tower_names(model: ml_collections.ConfigDict) -> tuple[str, str]:
    """(query tower, document tower): model.query_tower / model.doc_tower where set, else
    model.tower."""
    return model.query_tower or model.tower, model.doc_tower or model.tower


def model_spec(model: ml_collections.ConfigDict) -> ModelSpec:
    """`config.model` (upgraded: `config.run.upgrade`) as the models take it. The cnn
    and Transformer settings are read, and checked (ValueError naming the key), only
    when a side uses that tower."""
    used = tower_names(model)
    t = model.get("transformer")
    transformer = TransformerSpec()
    if "transformer" in used:
        transformer = TransformerSpec.make(t.get("preset", ""), **{
            f.name: t[f.name] for f in dataclasses.fields(TransformerSpec)})
    p = model.get("pses")
    return ModelSpec(
        name=model.name, query_tower=used[0], doc_tower=used[1],
        shared_towers=bool(model.shared_towers),
        shared_embedding=bool(model.shared_embedding),
        embed_dim=model.embed_dim, hidden_dim=model.hidden_dim, output_dim=model.output_dim,
        embed_init_std=model.embed_init_std,
        cnn_windows=cnn.parse_windows(model.cnn_windows) if "cnn" in used else (),
        # (read only for a cnn: a workdir saved before the cnn tower has no such key)
        cnn_filters=model.cnn_filters if "cnn" in used else ModelSpec.cnn_filters,
        dtype=model.dtype, remat=bool(model.remat),
        transformer=transformer, similarity=model.similarity, temperature=model.temperature,
        init_scale=model.init_scale, init_bias=model.init_bias,
        pses=PsesSpec() if p is None else PsesSpec(**{
            f.name: p[f.name] for f in dataclasses.fields(PsesSpec)}),
        lora=lora_spec(model, used),
        tower_options=tuple((kind, _frozen(model.get(kind)))
                            for kind in sorted(set(used))
                            if kind not in towers.BUILT_IN
                            and model.get(kind) is not None))


def lora_spec(model: ml_collections.ConfigDict, used: tuple[str, str]) -> LoraSpec:
    """model.lora_*: off at rank 0; else the targets as the (query) tower names them
    (ValueError naming the key for one it does not have)."""
    if not model.lora_rank:
        return LoraSpec()
    available = towers.TOWERS[used[0]].lora_targets if used[0] in towers.TOWERS else ()
    return LoraSpec(int(model.lora_rank), float(model.lora_alpha),
                    lora.parse_targets(model.lora_targets, available), model.lora_base_dtype)


def _frozen(group) -> tuple[tuple[str, object], ...]:
    """A registered tower's config group as (key, value) pairs, lists as tuples (a
    ModelSpec is hashed: Flax modules hold it)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in dict(_plain(group)).items()))


def _plain(group):
    """A config group as a plain dict (None stays None)."""
    return group.to_dict() if hasattr(group, "to_dict") else group


def optimizer_spec(optimizer: ml_collections.ConfigDict) -> OptimizerSpec:
    """`config.optimizer` as the train step takes it."""
    return OptimizerSpec(**{f.name: optimizer[f.name] for f in dataclasses.fields(OptimizerSpec)})


def inputs_spec(model: ml_collections.ConfigDict) -> InputsSpec:
    """`config.model`'s inputs part."""
    keys = ("tokenizer", "tokenizer_path", "vocab_size", "num_oov_buckets",
            "trigram_vocab_size", "feature_vocab_size", "feature_buckets")
    return InputsSpec(**{k: model[k] for k in keys},
                      features=feature_specs(model), max_lens=max_lens(model),
                      prompts=prompts(model))


def prompts(model: ml_collections.ConfigDict, start_prompts: dict[str, str] | None = None
            ) -> tuple[str, str]:
    """(query prompt, document prompt): model.query_prompt / document_prompt where set,
    else the pretrained start's (`Pretrained.prompts`), else ""."""
    start_prompts = start_prompts or {}
    return (model.query_prompt or start_prompts.get("query", ""),
            model.document_prompt or start_prompts.get("document", ""))


def feature_specs(model: ml_collections.ConfigDict
                  ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """(query, document) categorical fields as ((name, embedding size), ...); ConfigError
    for a spec that does not parse."""
    try:
        query, doc = (features.parse_spec(model[key], model.feature_dim,
                                          f"config.model.{key}")
                      for key in ("query_features", "doc_features"))
        return query, doc
    except ValueError as e:
        raise ConfigError(str(e)) from None


def dataset_spec(data: ml_collections.ConfigDict, seed: int) -> DatasetSpec:
    """`config.data` (or a task's) as the builders take it; DataError naming the key or
    file that cannot work."""
    return DatasetSpec.of(data, seed)


def task_configs(config: ml_collections.ConfigDict
                 ) -> list[tuple[str, ml_collections.ConfigDict, float]]:
    """(name, data group, weight) per task: `config.tasks` in name order (ConfigDict keeps
    its keys sorted), else ("", config.data, 1.0)."""
    if not config.tasks:
        return [("", config.data, 1.0)]
    return [(name, t.data, float(t.weight)) for name, t in config.tasks.items()]


def loss_options(loss: ml_collections.ConfigDict) -> dict:
    """The options of loss `loss.name` from `config.loss` (fields = option names; an
    option the config lacks, as a plugin's own, keeps the loss's default), for
    `losses.sharded` / `losses.reference`."""
    known = losses.LOSSES.get(loss.name)  # (unknown: a saved run's plugin not imported
    # here, read by export or search, which never train; validation refuses it for a run)
    return {k: loss.get(k, default) for k, default in (known.options if known else {}).items()}


def max_lens(model: ml_collections.ConfigDict) -> tuple[int, int]:
    """(query, document) max lengths in tokens: model.query_max_len / doc_max_len where
    set (> 0), else model.max_len (Chang et al. 2020: 64 and 288)."""
    return model.query_max_len or model.max_len, model.doc_max_len or model.max_len


def bm25_options(eval_cfg: ml_collections.ConfigDict) -> dict:
    """The run's BM25 settings as `baselines.rank`'s options (eval.bm25_k1, bm25_b,
    bm25_stemmer)."""
    return {key: eval_cfg[f"bm25_{key}"] for key in baselines.bm25_defaults()}


def baseline_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """config.eval.baselines ("bm25,tfidf,identity" or "") as a tuple of names."""
    return tuple(n.strip() for n in config.eval.baselines.split(",") if n.strip())


def typo_probs(config: ml_collections.ConfigDict) -> tuple[float, ...]:
    """config.eval.typo_probs ("0,0.25,0.5,0.75" or "": no typo sweep) as a tuple of
    floats; ConfigError unless each is a number in [0, 1]."""
    probs = []
    for item in (s.strip() for s in config.eval.typo_probs.split(",")):
        if not item:
            continue
        try:
            p = float(item)
        except ValueError:
            p = None
        if p is None or not 0.0 <= p <= 1.0:
            raise ConfigError(f"config.eval.typo_probs={config.eval.typo_probs!r}: {item!r} is "
                              "not a probability in [0, 1]; give comma-separated numbers such "
                              "as '0,0.25,0.5,0.75' ('': off)")
        probs.append(p)
    return tuple(probs)


def dims(value: str, key: str) -> tuple[int, ...]:
    """A comma-separated list of embedding dimensions ("64,128") as increasing ints;
    ConfigError naming `key` for anything else."""
    out = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise ConfigError(f"config.{key}={value!r}: {item!r} is not a dimension (an int "
                              ">= 1); give them as '64,128,256' ('': none)")
        out.append(int(item))
    if out != sorted(set(out)):
        raise ConfigError(f"config.{key}={value!r}: give each dimension once, smallest first")
    return tuple(out)


def is_mlm(config: ml_collections.ConfigDict) -> bool:
    """Whether the run pre-trains with MLM (data.name="pretrain", data.tasks="mlm")."""
    return any(d.name == PRETRAIN and d.tasks.strip() == "mlm" for _, d, _ in task_configs(config))


def objective_spec(config: ml_collections.ConfigDict) -> ObjectiveSpec:
    """What the run's step learns: MLM when data.tasks="mlm", PSES when model.name="pses",
    else the dual encoder with `config.loss` (max_len: MLM's documents', else the longer
    side's)."""
    q_len, d_len = max_lens(config.model)
    kind = ("mlm" if is_mlm(config) else "pses" if config.model.name == "pses"
            else "in_batch")
    loss, pses = config.loss, config.loss.get("pses")
    return ObjectiveSpec(
        kind=kind, loss=loss.name, loss_options=loss_options(loss),
        column_block=loss.column_block, remove_query_hits=loss.remove_query_hits,
        remove_cluster_hits=loss.remove_cluster_hits,
        max_len=d_len if kind == "mlm" else max(q_len, d_len),
        encode_chunks=config.train.encode_chunks,
        matryoshka_dims=dims(loss.matryoshka_dims, "loss.matryoshka_dims"),
        **distill_options(config),
        pses=PsesLoss() if pses is None else PsesLoss(**{
            f.name: pses[f.name] for f in dataclasses.fields(PsesLoss)}))


def is_distill(config: ml_collections.ConfigDict) -> bool:
    """Whether a task of the run learns a teacher's scores (data.tasks "distill")."""
    return any(d.name == PRETRAIN and "distill" in (t.strip() for t in d.tasks.split(","))
               for _, d, _ in task_configs(config))


def distill_options(config: ml_collections.ConfigDict) -> dict:
    """The `ObjectiveSpec` fields of config.distill, when the run distills ({} else)."""
    if not is_distill(config):
        return {}
    d = config.distill
    return {"distill": d.loss, "distill_weight": d.weight, "in_batch_weight": d.in_batch_weight,
            "teacher_temperature": d.temperature}


def eval_spec(config: ml_collections.ConfigDict) -> EvalSpec:
    """`config.eval` (and model.name) as the evaluation takes it. ConfigError for
    eval.typo_probs that do not parse."""
    e = config.eval
    return EvalSpec(
        batch_size=e.batch_size, top_k=e.top_k, index=e.index,
        index_settings={"query_chunk": e.query_chunk, "corpus_chunk": e.corpus_chunk,
                        "scann": _plain(e.get("scann")), "hnsw": _plain(e.get("hnsw"))},
        bm25=bm25_options(e), baselines=baseline_names(config), hybrid=e.hybrid,
        hybrid_rrf_k=e.hybrid_rrf_k, hybrid_weight=e.hybrid_weight, select_by=e.select_by,
        typo_probs=typo_probs(config), typo_seed=e.typo_seed, system=config.model.name,
        dims=dims(e.dims, "eval.dims"),
        evaluators=tuple((name, _plain(e.get(name)) or {})  # (a plugin's group, if any)
                         for name in evaluator_names(e.evaluators)))


def evaluator_names(text: str) -> list[str]:
    """eval.evaluators ("a,b") as names."""
    return [n.strip() for n in text.split(",") if n.strip()]
