"""Config checks of the model group: the tokenizer, the towers and their sizes, a
pretrained start (found, or recorded by the run), categorical fields, PSES and the
similarity; each failure a ConfigError naming the key and what would work."""

from __future__ import annotations

import math
import os

import ml_collections

from dualjax import models
from dualjax.config import specs
from dualjax.config.checks import one_of, positive
from dualjax.errors import ConfigError, PretrainedError
from dualjax.models import dual_encoder, lora, pses, towers
from dualjax.runtime import sharding
from dualjax.runtime.files import has_checkpoint
from dualjax.text import sides, tokenizers


def check_model(config: ml_collections.ConfigDict, workdir: str = "") -> int | None:
    """config.model: tokenizer, model, towers, pretrained start, fields and similarity.

    Returns:
      The width of the model's vectors (`models.vector_dim`), which later checks need;
      None when only init_from's towers know it.
    """
    one_of("model.tokenizer", config.model.tokenizer, tokenizers.KINDS)
    one_of("model.name", config.model.name, models.MODELS)
    _check_towers(config.model)
    _check_lora(config.model)
    start = _check_pretrained(config, workdir)
    _check_features(config.model)
    one_of("model.similarity", config.model.similarity, dual_encoder.SIMILARITIES)
    low, high = (math.exp(x) for x in dual_encoder.LOG_TEMPERATURE_RANGE)
    if (config.model.similarity == "cosine_learned_temperature"
            and not low <= config.model.temperature <= high):
        raise ConfigError(f"config.model.temperature={config.model.temperature} must be in "
                          f"[{low:g}, {high:g}] for the learned temperature")
    _check_prompts(config, start, workdir)
    architecture = start.architecture if start else None
    if _pretrained_towers(config.model) and architecture is None:
        return None  # (init_from's towers: their width is checked when they are read)
    _check_model_axis(config, architecture)
    return models.vector_dim(specs.model_spec(config.model), architecture)


def _check_lora(model: ml_collections.ConfigDict) -> None:
    """model.remat on towers that have it; model.lora_*: a rank of 0 (off) or more, on
    towers that take adapters, targets they have, and a known dtype for the frozen
    weights."""
    if model.lora_rank < 0 or model.lora_rank != int(model.lora_rank):
        raise ConfigError(f"config.model.lora_rank={model.lora_rank} must be 0 (off) or a "
                          "positive rank")
    if model.remat:
        bad = [t for t in specs.tower_names(model) if not towers.TOWERS[t].remat]
        if bad:
            remat = [t for t in towers.TOWERS if towers.TOWERS[t].remat]
            raise ConfigError(f"config.model.remat: the {bad[0]} tower has no layers it "
                              f"recomputes (the {' and '.join(remat)} towers do); "
                              "set it to False")
    if not model.lora_rank:
        return
    positive_alpha = model.lora_alpha > 0
    if not positive_alpha:
        raise ConfigError(f"config.model.lora_alpha={model.lora_alpha} must be > 0")
    one_of("model.lora_base_dtype", model.lora_base_dtype, tuple(lora.BASE_DTYPES))
    used = specs.tower_names(model)
    takes = [t for t in towers.TOWERS if towers.TOWERS[t].lora_targets]
    for tower in dict.fromkeys(used):
        if tower not in takes:
            raise ConfigError(f"config.model.lora_rank={model.lora_rank}: the {tower} tower "
                              f"takes no adapters (towers that do: {', '.join(takes)}); "
                              "set model.lora_rank=0 to train every weight")
    try:
        specs.lora_spec(model, used)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None


def _pretrained_towers(model: ml_collections.ConfigDict) -> list[str]:
    """The towers of the run built from a pretrained start's architecture ("bert",
    "decoder")."""
    return [t for t in specs.tower_names(model) if t in towers.TOWERS
            and towers.TOWERS[t].from_pretrained]


def _check_prompts(config: ml_collections.ConfigDict, start, workdir: str) -> None:
    """Each side's prompt (model.query_prompt / document_prompt, else the start's) leaves
    room for the text in the side's max length (`sides.check_prompt`), counted with the
    run's tokenizer where it is known before the data is read: a pretrained start's or
    model.tokenizer_path, the workdir's or init_from's vocabulary; for a vocabulary built
    from the data, one of its kind built from the prompt. (A sentencepiece model is only
    known once trained: `train/inputs.py` checks it then.)"""
    m = config.model
    prompts = specs.prompts(m, start.prompts if start else None)
    if not any(prompts):
        return
    tokenizer = _known_tokenizer(config, start, workdir)
    for key, prompt, max_len in zip(("query_prompt", "document_prompt"), prompts,
                                    specs.max_lens(m), strict=True):
        if not prompt:
            continue
        tok = tokenizer or _tokenizer_of(m, prompt)
        if tok is None:
            continue
        where = (f"config.model.{key}" if m[key] else
                 f"the {key.split('_')[0]} prompt of model.pretrained={m.pretrained!r} (set "
                 f"config.model.{key} to replace it)")
        try:
            sides.check_prompt(tok, prompt, max_len, where)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _known_tokenizer(config: ml_collections.ConfigDict, start, workdir: str):
    """The run's tokenizer when it is known before the data is read, else None."""
    for folder in (workdir, config.init_from):
        if folder and os.path.exists(os.path.join(folder, "vocab.json")):
            return tokenizers.load_tokenizer(os.path.join(folder, "vocab.json"))
    if config.model.tokenizer != "hf":
        return None
    from dualjax import pretrained
    if start is not None:
        return start.tokenizer()
    path = config.model.tokenizer_path
    return pretrained.read_tokenizer(path) if path else None


def _tokenizer_of(model: ml_collections.ConfigDict, prompt: str):
    """A tokenizer of model.tokenizer's kind built from the prompt alone (every token of
    it known: it counts as the run's will), None for sentencepiece and "hf"."""
    if model.tokenizer in ("sentencepiece", "hf"):
        return None
    return tokenizers.build_tokenizer(model.tokenizer, [prompt], vocab_size=model.vocab_size,
                                      num_oov_buckets=model.num_oov_buckets,
                                      trigram_vocab_size=model.trigram_vocab_size)


def _check_model_axis(config: ml_collections.ConfigDict, architecture) -> None:
    """mesh.model_axis divides every transformer / pretrained tower's heads and MLP columns,
    checked on the towers' abstract shapes (nothing is computed): the sharded state
    found it after the data and the vocabulary were written."""
    m = config.mesh.model_axis
    used = specs.tower_names(config.model)
    if (m <= 1 or config.model.name != "dual_encoder"
            or not ("transformer" in used or _pretrained_towers(config.model))):
        return
    import jax
    model = models.make_model(specs.model_spec(config.model), 64, architecture=architecture)
    max_len = max(specs.max_lens(config.model))
    shapes = jax.eval_shape(lambda: dual_encoder.init_params(model, jax.random.key(0), 8))
    try:
        sharding.check_model_axis(shapes, dual_encoder.logical_axes(model, max_len), m)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None


def _check_towers(model: ml_collections.ConfigDict) -> None:
    """config.model: known towers and compute dtype, per-side towers and a shared token
    table only with two towers, and the settings of the towers in use (each tower's own
    checks, `towers.Tower.check`; a plugin's group holding only keys it takes)."""
    for key in ("tower", "query_tower", "doc_tower"):
        if key == "tower" or model[key]:
            one_of(f"model.{key}", model[key], dual_encoder.tower_kinds())
    one_of("model.dtype", model.dtype, towers.DTYPES)
    for key in ("query_tower", "doc_tower", "shared_embedding"):
        if model[key] and model.shared_towers:
            raise ConfigError(f"config.model.{key}={model[key]!r} needs two towers: set "
                              "config.model.shared_towers=False")
    used = specs.tower_names(model)
    for kind in dict.fromkeys(used):
        unknown = towers.unknown_options(kind, model.get(kind) or {}) if (
            kind not in towers.BUILT_IN) else []
        if unknown:
            raise ConfigError(f"config.model.{kind}.{unknown[0]}: the {kind} tower takes no "
                              f"such setting (it takes: {', '.join(towers.takes(kind)[0])})")
    max_lens = {key if model[key] else "max_len": length for key, length in
                zip(("query_max_len", "doc_max_len"), specs.max_lens(model), strict=True)}
    try:  # a tower's settings are checked making the spec, then by the tower's own check
        spec = specs.model_spec(model)
        for kind in dict.fromkeys(used):
            check = towers.TOWERS[kind].check
            if check is not None:
                check(towers.tower_settings(spec, kind), max_lens)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    if any(towers.TOWERS[kind].from_pretrained for kind in used):
        return  # (the start's width: checked with the start)
    if towers.output_dim(spec, used[0]) != towers.output_dim(spec, used[1]):
        raise ConfigError(f"config.model.query_tower={used[0]!r} and model.doc_tower={used[1]!r} "
                          "must output vectors of one size: set model.output_dim to "
                          "model.embed_dim (a bow tower outputs embed_dim)")
    if model.shared_embedding and len({towers.embedding_dim(spec, n) for n in used}) > 1:
        raise ConfigError("config.model.shared_embedding=True needs token tables of one width "
                          f"on both sides: {used[0]} has {towers.embedding_dim(spec, used[0])}, "
                          f"{used[1]} {towers.embedding_dim(spec, used[1])} (model.embed_dim; "
                          "model.transformer.width for a transformer)")


def _check_pretrained(config: ml_collections.ConfigDict, workdir: str = ""):
    """model.pretrained / tokenizer="hf" / tower="bert" or "decoder": the start exists (fetched, its
    digests right) and the towers and tokenizer are the ones it fits. A run resumed from
    a checkpoint needs no folder: its towers are the checkpoint's, its tokenizer is
    WORKDIR/vocab.json, and WORKDIR/pretrained.json stands in for the start. Returns the
    start (None without one)."""
    from dualjax import pretrained  # reads the folder; needs safetensors for a table
    m = config.model
    name, tok = m.pretrained, m.tokenizer
    used = specs.tower_names(m)
    if not name:
        needs = _pretrained_towers(m)
        if needs and not config.init_from:
            raise ConfigError(f"config.model.tower={needs[0]!r} takes its sizes and weights "
                              "from model.pretrained (e.g. all-MiniLM-L6-v2, all-mpnet-base-v2, "
                              "or a Hugging Face BERT, MPNet, Llama, Mistral or Qwen folder)")
        if tok == "hf" and not m.tokenizer_path and not config.init_from:
            raise ConfigError("config.model.tokenizer='hf' reads model.tokenizer_path (a "
                              "tokenizer.json) or model.pretrained's tokenizer: set one")
        return pretrained.load(config.init_from) if config.init_from else None
    try:
        start = pretrained.resolve(name, m.pretrained_pooling)
    except (PretrainedError, ImportError) as e:
        start = _recorded_start(workdir, name)
        if start is None:
            raise ConfigError(f"config.{e}" if str(e).startswith("model.") else str(e)
                              ) from None
    if tok != "hf" or m.tokenizer_path:
        raise ConfigError(f"config.model.pretrained={name!r} reads its own tokenizer: set "
                          "--config.model.tokenizer=hf and leave model.tokenizer_path empty")
    if m.name != "dual_encoder":
        raise ConfigError(f"config.model.pretrained: model.name={m.name!r}; pretrained starts "
                          "are for model.name='dual_encoder'")
    if start.tower:
        arch = start.architecture
        assert arch is not None, "a start of a tower has its architecture"
        if set(used) != {start.tower}:
            what = {"bert": "BERT-family encoder", "decoder": "decoder LLM",
                    "modernbert": "ModernBERT encoder"}[start.tower]
            raise ConfigError(f"config.model.pretrained={name!r} is a {what} ({arch.family}): "
                              f"set --config.model.tower={start.tower} (both sides)")
        if m.shared_embedding:
            raise ConfigError(f"config.model.shared_embedding: two {start.tower} towers start "
                              "from one table already; set it to False")
        for key, length in zip(("query_max_len", "doc_max_len"), specs.max_lens(m), strict=True):
            if length > arch.max_length:
                key = key if m[key] else "max_len"
                raise ConfigError(f"config.model.{key}={length} is longer than {name}'s "
                                  f"{arch.max_length} positions")
    else:
        bad = [t for t in used if t not in ("bow", "bow_mlp", "cnn")]
        if bad:
            raise ConfigError(f"config.model.pretrained={name!r} is a static token table: "
                              f"set --config.model.tower=bow (or bow_mlp, cnn), not {bad[0]!r}")
        if m.embed_dim != start.dim:
            raise ConfigError(f"config.model.embed_dim={m.embed_dim}, but {name}'s token "
                              f"table is {start.dim} wide: set --config.model.embed_dim="
                              f"{start.dim}")
    return start


def _recorded_start(workdir: str, name: str):
    """The start WORKDIR/pretrained.json records for model.pretrained=`name`, when the
    workdir also holds a checkpoint to resume from (else None: the weights are needed)."""
    from dualjax import pretrained
    if not workdir or not has_checkpoint(workdir):
        return None
    start = pretrained.load(workdir)
    canonical = pretrained.sources.canonical
    return start if start and canonical(start.source) == canonical(name) else None


def check_pses(config: ml_collections.ConfigDict, pretraining: bool) -> None:
    """model.name="pses": its sizes and loss settings, and no input it does not read."""
    m, p = config.model.pses, config.loss.pses
    one_of("model.pses.score", m.score, pses.SCORES)
    one_of("loss.pses.pairwise", p.pairwise, pses.PAIRWISE)
    one_of("loss.pses.trainable", p.trainable, pses.TRAINABLE)
    positive(config, "model.pses.hidden_dim", "model.pses.shared_dim", "model.pses.specific_dim",
              "loss.pses.critic_hidden_dim", "loss.pses.critic_steps",
              "loss.pses.critic_learning_rate")
    if m.hidden_layers not in (1, 2, 3):  # the paper's encoders: 1-3 tanh hidden layers
        raise ConfigError(f"config.model.pses.hidden_layers={m.hidden_layers} must be 1, 2 or 3")
    positive(config, "loss.pses.margin", "loss.pses.critic_clip",
              *(f"loss.pses.{k}_weight" for k in ("orthogonality", "adversarial",
                                                  "reconstruction", "regularization")),
              allow_zero=True)
    if pretraining:
        raise ConfigError("config.model.name='pses' trains on (query, document) pairs with "
                          "labels or pseudo-labels; pre-train a dual encoder instead")
    for key in ("query_features", "doc_features"):
        if config.model[key]:
            raise ConfigError(f"config.model.{key}: model.name='pses' reads text only")
    if config.loss.num_mixed_negatives or config.loss.log_q_buckets:
        raise ConfigError("config.loss.num_mixed_negatives and loss.log_q_buckets are in-batch "
                          "sampling options of the dual encoder; model.name='pses' uses neither")






def _check_features(model: ml_collections.ConfigDict) -> None:
    """Categorical fields: parseable, fed to a tower with layers above the text vector,
    one set for a shared tower."""
    sides = specs.feature_specs(model)
    for key, spec, tower in zip(("query_features", "doc_features"), sides,
                                specs.tower_names(model), strict=True):
        if spec and not towers.TOWERS[tower].features:
            takers = [t for t in towers.TOWERS if towers.TOWERS[t].features]
            raise ConfigError(f"config.model.{key}={model[key]!r}: the {tower} tower has no "
                              "layer above its pooled vector to feed categorical features "
                              "to; use model.tower (or query_tower / doc_tower) "
                              f"{', '.join(takers[:-1])} or {takers[-1]}")
    if model.shared_towers and sides[0] != sides[1]:
        raise ConfigError(f"config.model.query_features={model.query_features!r} and "
                          f"model.doc_features={model.doc_features!r} differ, but one shared "
                          "tower reads both sides: make them equal or set "
                          "model.shared_towers=False")
