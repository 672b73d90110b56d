"""Starting a run from another run (`config.init_from = WORKDIR`: pre-train, then
fine-tune) or from pretrained weights (`model.pretrained`, `dualjax.pretrained`).

The new run takes the other run's vocabularies (vocab.json, features.json: fine-tuning
must read the pre-training vocabulary) and its latest checkpoint's tower parameters; the
optimizer, step, rng and data position are its own, fresh. The similarity's own
parameters (alpha and beta, or log tau) are taken too when both runs have them with the
same shape, else they start at the new run's initial values; pre-training heads (MLM's)
are left behind. Towers that do not match are refused, naming the settings that differ.

A pretrained start is recorded in WORKDIR/pretrained.json (`resolve_start`; copied with
the vocabularies by init_from) and its weights replace the towers' initial parameters
(`pretrained_params`): a BERT's whole tower, a static table's token tables. Both kinds of
start go through `start_tree`, over the state's shapes: the run's first state takes its
weights (`given`) in place of their random initialisation (`step.make_init_state`), for
training and for its "start" evaluation row; `start_towers` the same for the
distillation teacher and an evaluation-only run's export.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import numpy as np
from absl import logging

from dualjax import pretrained
from dualjax.config.run import StartSpec, upgraded
from dualjax.errors import ConfigError
from dualjax.models import dual_encoder, lora
from dualjax.models.dual_encoder import SIMILARITY_PARAMS, token_tables
from dualjax.objectives import PRETRAINING_HEADS
from dualjax.runtime import sharding
from dualjax.train import checkpoints, step

VOCABULARIES = ("vocab.json", "features.json", pretrained.RECORD)
# Model settings that do not shape the towers' parameters.
_NOT_TOWER = {"dtype", "similarity", "temperature", "init_scale", "init_bias", "max_len",
              "query_max_len", "doc_max_len"}


# Model settings that decide the vocabularies: this run reads init_from's, so they must agree.
VOCABULARY_SETTINGS = ("tokenizer", "tokenizer_path", "vocab_size", "trigram_vocab_size",
                       "num_oov_buckets", "query_features", "doc_features", "feature_dim",
                       "feature_vocab_size", "feature_buckets")


def _saved_model(init_from: str) -> dict:
    """init_from's config.model, upgraded (`config.run.upgraded`: a key it lacks at the
    value dualjax had before the key existed); {} where it cannot be read."""
    try:
        with open(os.path.join(init_from, "config.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return {}
    return upgraded(saved).get("model", {}) if isinstance(saved, dict) else {}


def copy_vocabularies(init_from: str, workdir: str, model: dict | None = None) -> None:
    """Copies init_from's vocab.json (and features.json, pretrained.json) into `workdir`,
    unless `workdir` has its own already (a resumed run); ConfigError if `model` asks for
    another vocabulary than the one init_from's was built with (VOCABULARY_SETTINGS;
    `model`: this run's config.model as given, plain)."""
    if not os.path.isdir(init_from):
        raise ConfigError(f"config.init_from={init_from!r}: no such workdir")
    if not os.path.exists(os.path.join(init_from, "vocab.json")):
        raise ConfigError(f"config.init_from={init_from!r} has no vocab.json: is it a dualjax "
                          "workdir that has trained?")
    saved = _saved_model(init_from)
    for key in VOCABULARY_SETTINGS if model is not None else ():
        assert model is not None
        if key in saved and key in model and saved[key] != model[key]:
            raise ConfigError(f"config.init_from={init_from!r} built its vocabulary with "
                              f"model.{key}={saved[key]!r}, this run asks for {model[key]!r}: "
                              f"the run reads init_from's vocabulary, so set "
                              f"--config.model.{key}={saved[key]!r}")
    for name in VOCABULARIES:
        source, target = os.path.join(init_from, name), os.path.join(workdir, name)
        if os.path.exists(source) and not os.path.exists(target):
            tmp = f"{target}.tmp{os.getpid()}"
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
            logging.info("init_from: using %s", source)


def _model_differences(init_from: str, model: dict) -> list[str]:
    """"model.KEY: OLD (init_from) vs NEW (this run)" for each tower setting that differs."""
    saved = _saved_model(init_from)

    def flat(d: dict, prefix: str = "model.") -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            elif k not in _NOT_TOWER:
                out[prefix + k] = v
        return out

    old, new = flat(saved), flat(model)
    return [f"{k}: {old.get(k)!r} (init_from) vs {new.get(k)!r} (this run)"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _shapes(tree: Any) -> dict[str, tuple]:
    return {jax.tree_util.keystr(path): tuple(x.shape)
            for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def tower_params(init_from: str, params: dict, model: dict) -> dict:
    """`params` (this run's initial parameters, or their shapes) with the towers of
    init_from's latest checkpoint (host arrays); ConfigError if the towers differ (naming
    the settings of `model`, this run's config.model, that differ from init_from's)."""
    try:
        step, saved = checkpoints.latest_params(init_from)
    except FileNotFoundError as e:
        raise ConfigError(f"config.init_from: {e}") from None
    towers = lambda tree: {k: v for k, v in tree.items()
                           if k not in SIMILARITY_PARAMS and k not in PRETRAINING_HEADS}
    ours, theirs = _shapes(towers(params)), _shapes(towers(saved))
    if ours != theirs:
        first = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
        differences = _model_differences(init_from, model)
        raise ConfigError(
            f"config.init_from={init_from!r}: its towers do not match this run's (param {first}: "
            f"{theirs.get(first, 'absent')} there, {ours.get(first, 'absent')} here)"
            + ("; settings that differ: " + "; ".join(differences) if differences else ""))
    out = dict(params)
    for key, value in saved.items():
        if key in PRETRAINING_HEADS:  # e.g. the MLM head: pre-training only
            continue
        if key in SIMILARITY_PARAMS and _shapes(value) != _shapes(params.get(key, {})):
            logging.info("init_from: %s is not carried over (another similarity)", key)
            continue
        out[key] = value
    logging.info("init_from: towers of %s at step %d", init_from, step)
    return out


def resolve_start(spec: StartSpec, workdir: str) -> pretrained.Pretrained | None:
    """The pretrained start the towers are built from: WORKDIR/pretrained.json when the
    run has one (resumed, or copied from init_from by `copy_vocabularies`, which runs
    first), else model.pretrained resolved and recorded there; None without one."""
    start = pretrained.load(workdir)
    name = spec.pretrained
    if start is None and name:
        start = pretrained.resolve(name, spec.pretrained_pooling)
        pretrained.save(workdir, start)
    elif start is not None and name and (pretrained.sources.canonical(start.source)
                                         != pretrained.sources.canonical(name)):
        where = "config.init_from's run" if spec.init_from else "this workdir"
        raise ConfigError(f"config.model.pretrained={name!r}, but {where} started from "
                          f"{start.source!r} ({pretrained.RECORD})")
    return start


def _overlay(params: dict, path: tuple[str, ...], value: Any, what: str) -> None:
    """params[path] = value (in place), refusing a missing param or another shape; our
    LoRA adapters stay (the start has none) and each weight keeps our dtype (LoRA's
    frozen bfloat16)."""
    node = params
    for key in path[:-1]:
        node = node[key]
    value = _fit(node.get(path[-1], {}), value)
    ours, theirs = _shapes(node.get(path[-1], {})), _shapes(value)
    if ours != theirs:
        first = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
        raise ConfigError(f"config.model.pretrained: {what} does not fit this run's towers "
                          f"(param {'/'.join(path)}{first}: {theirs.get(first, 'absent')} there, "
                          f"{ours.get(first, 'absent')} here)")
    node[path[-1]] = value


def _fit(ours: Any, theirs: Any) -> Any:
    """`theirs` in `ours`' dtypes, with `ours`' LoRA adapters added where it has none."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        fitted = {k: _fit(ours.get(k), v) for k, v in theirs.items()}
        return {**fitted, **{k: v for k, v in ours.items()
                             if k.endswith(lora.SUFFIXES) and k not in theirs}}
    if ours is not None and hasattr(ours, "dtype") and hasattr(theirs, "astype"):
        return theirs.astype(ours.dtype, copy=False)  # (read in it: no copy)
    return theirs


def _start_dtype(params: dict) -> Any:
    """The dtype to read a start's weights in: that of every frozen weight (`lora.
    trainable`'s False: the towers' own, LoRA's frozen bfloat16 read as such, never
    widened to float32 first) when all share one, else float32 (`_fit` casts each)."""
    dtypes = {np.dtype(x.dtype) for t, x in zip(jax.tree.leaves(lora.trainable(params)),
                                               jax.tree.leaves(params), strict=True) if not t}
    return dtypes.pop() if len(dtypes) == 1 else np.float32


def pretrained_params(start: pretrained.Pretrained, params: dict) -> dict:
    """`params` with the start's weights: every bert or decoder tower whole, or every
    token table (a static start; the layers above it keep their initialisation)."""
    tree = start.tower_params(_start_dtype(params))
    out = jax.tree.map(lambda x: x, params)  # a copy of the containers
    if start.tower:
        for key in ("tower", "query_tower", "doc_tower"):
            if key in out:
                _overlay(out, (key,), tree, f"{start.source}'s encoder")
    else:
        for path in token_tables(out):
            _overlay(out, (*path, "embedding"), tree["embedding"],
                     f"{start.source}'s token table")
    return out


def start_tree(init_from: str, model: dict, start: pretrained.Pretrained | None,
               params: dict) -> dict:
    """`params` (the run's initialisation, or only its shapes: `jax.ShapeDtypeStruct`s)
    with the start's weights in it as host arrays: `init_from`'s towers (`model`: this
    run's config.model, plain, to name what differs), else the pretrained start's
    weights, else `params` as they are."""
    if init_from:
        return tower_params(init_from, params, model)
    if start is not None:
        return pretrained_params(start, params)
    return params


def given(tree: dict, shardings: dict) -> dict[str, jax.Array]:
    """The weights of a `start_tree` over shapes (its leaves that are arrays), by key
    path, each placed with its param's sharding (`shardings`: the params' tree): what
    `step.make_init_state`'s init puts in place of their random initialisation."""
    key, leaves = jax.tree_util.keystr, jax.tree_util.tree_leaves_with_path
    where = {key(p): s for p, s in leaves(shardings)}
    return {key(p): jax.device_put(x, where[key(p)]) for p, x in leaves(tree)
            if not isinstance(x, jax.ShapeDtypeStruct)}


def start_towers(model: Any, seed: int, max_len: int, mesh: jax.sharding.Mesh,
                 init_from: str = "", model_config: dict | None = None,
                 start: pretrained.Pretrained | None = None) -> dict:
    """A dual encoder's params, replicated over `mesh`: the start's weights (`start_tree`:
    init_from's towers, `model_config` naming what differs, else the pretrained start's)
    and the initialisation of `seed` for only what they lack, in one jitted program
    (`step.with_given`): what the start gives is never initialised at random. The
    distillation teacher's towers and an evaluation-only run's export."""
    replicated = sharding.replicated(mesh)

    def init(weights):
        params = dual_encoder.init_params(model, jax.random.PRNGKey(seed), max_len)
        return step.with_given(params, weights)

    shapes = jax.eval_shape(init, None)
    tree = start_tree(init_from, model_config or {}, start, shapes)
    return jax.jit(init, out_shardings=replicated, donate_argnums=0)(
        given(tree, jax.tree.map(lambda _: replicated, shapes)))
