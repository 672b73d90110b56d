"""The run resolved once: `resolve(config, workdir) -> RunSpec`, a frozen tree of what
each stage takes (the model, its inputs, the objective, the optimizer, the evaluation,
the tasks' data, the teacher, the mesh and the schedule). The training loop and every
stage below it take the spec and never read the ConfigDict (tests/project/test_layers.py).

`upgrade` brings a config, a user's or a workdir's saved config.json from an older
dualjax, to today's keys: a key it lacks gets the value that meant "as before the key
existed" (`ABSENT`), so one table replaces the `.get(key, default)` calls that were
spread over the stages.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import ml_collections

from dualjax.config import specs, validation
from dualjax.errors import ConfigError
from dualjax.eval.scoring import EvalSpec
from dualjax.models.spec import ModelSpec
from dualjax.objectives import ObjectiveSpec
from dualjax.objectives.optimizer import OptimizerSpec
from dualjax.retrieval import baselines
from dualjax.runtime import sharding
from dualjax.runtime.files import folder_kind
from dualjax.text.sides import InputsSpec

# The value of each key when a config lacks it: what dualjax did before the key existed.
# Groups that may be absent as a whole (model.transformer, model.pses, loss.pses,
# eval.scann, eval.hnsw, distill) are left absent: their specs know that case.
ABSENT: dict[str, Any] = {
    "init_from": "",
    "max_epochs": 0.0,
    "tasks": {},
    "train.encode_chunks": 0,
    "mesh.model_axis": 1,
    "mesh.param_sharding": "replicated",
    "mesh.memory_plan": "auto",
    "model.name": "dual_encoder",
    "model.query_tower": "",
    "model.doc_tower": "",
    "model.shared_embedding": False,
    "model.dtype": "float32",
    "model.remat": False,
    "model.query_max_len": 0,
    "model.doc_max_len": 0,
    "model.query_prompt": "",
    "model.document_prompt": "",
    "model.query_features": "",
    "model.doc_features": "",
    "model.feature_dim": 32,
    "model.pretrained": "",
    "model.pretrained_pooling": "",
    "model.lora_rank": 0,
    "model.lora_alpha": 16.0,
    "model.lora_targets": "",
    "model.lora_base_dtype": "bfloat16",
    "model.trigram_vocab_size": InputsSpec.trigram_vocab_size,
    "model.feature_vocab_size": InputsSpec.feature_vocab_size,
    "model.feature_buckets": InputsSpec.feature_buckets,
    "loss.matryoshka_dims": "",
    "loss.column_block": 0,
    "loss.remove_query_hits": False,
    "loss.remove_cluster_hits": False,
    "loss.num_mixed_negatives": 0,
    "loss.log_q_buckets": 0,
    "loss.log_q_alpha": 0.01,
    "eval.early_stopping": 0,
    "eval.rerun": False,
    "eval.hybrid": "",
    "eval.hybrid_rrf_k": EvalSpec.hybrid_rrf_k,
    "eval.hybrid_weight": EvalSpec.hybrid_weight,
    "eval.select_by": "",
    "eval.typo_seed": 0,
    "eval.dims": "",
    "eval.evaluators": "",
    **{f"eval.bm25_{k}": v for k, v in baselines.bm25_defaults().items()},
    **{f"model.{k}": getattr(InputsSpec, k) for k in (
        "tokenizer", "tokenizer_path", "vocab_size", "num_oov_buckets")},
    **{f"optimizer.{f.name}": f.default for f in dataclasses.fields(OptimizerSpec)},
}
# The same for every data group (config.data, config.tasks.<name>.data).
ABSENT_DATA: dict[str, Any] = {
    "path": "",
    "tfds_dir": "",
    "rebuild": False,
    "hard_negatives": 0,
    "pseudo_labels": 0,
    "pseudo_label_queries": "",
    "max_query_words": 0,
    "pseudo_weight": 0.5,
    "candidate_unit": "sentence",
    "skip_bad_lines": False,
}


def _fill(group: dict, absent: Mapping[str, Any]) -> None:
    """Sets each dotted key of `absent` that `group` lacks (its parents made as needed)."""
    for key, value in absent.items():
        *parents, last = key.split(".")
        node = group
        for p in parents:
            node = node.setdefault(p, {})
        node.setdefault(last, copy.deepcopy(value))


def upgrade(config: ml_collections.ConfigDict | Mapping) -> ml_collections.ConfigDict:
    """A copy of `config` (a ConfigDict or a saved config.json's dict) with today's keys:
    each key it lacks set as `ABSENT` says (its data groups' as `ABSENT_DATA`)."""
    return ml_collections.ConfigDict(upgraded(
        config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config))


def upgraded(saved: Mapping) -> dict:
    """`upgrade` of a plain dict (a saved config.json's), as a plain dict: what a workdir's
    saved config is compared with a run's in (`train.workdir.config_changes`)."""
    plain = copy.deepcopy(dict(saved))
    _fill(plain, ABSENT)
    groups = [plain.get("data")] + [t.get("data") for t in (plain["tasks"] or {}).values()]
    for group in groups:
        if isinstance(group, dict):
            _fill(group, ABSENT_DATA)
    for t in (plain["tasks"] or {}).values():
        t.setdefault("weight", 1.0)
    return plain


# ----------------------------------------------------------------------------- the spec
@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """config.mesh: devices (0: all), devices on the model axis, the state's layout and
    how the step's memory is planned (`train/memory_plan.py`)."""
    num_devices: int = 0
    model_axis: int = 1
    param_sharding: str = "replicated"
    memory_plan: str = "auto"


@dataclasses.dataclass(frozen=True)
class StartSpec:
    """Where the towers start: model.pretrained (and its pooling) and init_from."""
    pretrained: str = ""
    pretrained_pooling: str = ""
    init_from: str = ""


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One dataset of the run: its name ("" for the single task of config.data), its data
    group (read-only, today's keys: a source plugin reads its own keys from it), its
    sampling weight, where its TFDS tables live and whether a changed input file is
    accepted (its own data.rebuild or the run's)."""
    name: str
    data: Mapping[str, Any]
    weight: float
    tfds_dir: str
    rebuild: bool = False

    @property
    def key(self) -> str:
        """Its data group's config key: "data" or "tasks.<name>.data"."""
        return f"tasks.{self.name}.data" if self.name else "data"


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
    """config.distill's mining settings (see configs/default.py); `default_max_len`:
    model.max_len, the teacher's length when neither distill.max_len nor the teacher
    sets one."""
    teacher: str
    weight: float = 0.5
    negatives: int = 3
    depth: int = 30
    margin: float = 0.1
    max_len: int = 0
    queries_per_passage: int = 1
    default_max_len: int = 128


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long the run trains and how often it logs, evaluates and saves."""
    num_train_steps: int
    global_batch_size: int
    seed: int = 0
    max_epochs: float = 0.0
    eval_every_steps: int = 0
    checkpoint_every_steps: int = 0
    log_every_steps: int = 1
    keep_checkpoints: int = 2
    early_stopping: int = 0    # eval.early_stopping: evaluations the best may be behind
    rerun: bool = False        # eval.rerun: evaluate a finished workdir again
    untrained: bool = False    # eval.untrained: also evaluate the start


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything a run's stages take, resolved once from its config.

    Attributes:
      config: the config as given, as plain JSON values (WORKDIR/config.json records it;
        the workdir compares it with a saved one; the events log show it).
      schedule, mesh, start, tasks: as their classes say.
      model, inputs, objective, optimizer, eval: the specs of the layers below.
      teacher: data.tasks "distill"'s teacher (None without one).
      num_mixed_negatives, log_q_buckets, log_q_alpha: loss.* keys the data and the step
        take.
    """
    config: Mapping[str, Any]
    schedule: Schedule
    mesh: MeshSpec
    start: StartSpec
    tasks: tuple[TaskSpec, ...]
    model: ModelSpec
    inputs: InputsSpec
    objective: ObjectiveSpec
    optimizer: OptimizerSpec
    eval: EvalSpec
    teacher: TeacherSpec | None = None
    num_mixed_negatives: int = 0
    log_q_buckets: int = 0
    log_q_alpha: float = 0.01

    @property
    def system(self) -> str:
        """The trained model's rows: "dual_encoder" or "pses"."""
        return self.model.name

    @property
    def tower(self) -> str:
        """model.tower (the towers of both sides unless one is named apart)."""
        return str(self.config["model"]["tower"])

    def as_dict(self, group: str = "") -> dict:
        """The config as given, or its `group` ("model"), as a fresh plain dict."""
        return plain(self.config[group] if group else self.config)

    def with_steps(self, num_train_steps: int) -> RunSpec:
        """The spec with another num_train_steps (max_epochs' cap)."""
        return dataclasses.replace(self, schedule=dataclasses.replace(
            self.schedule, num_train_steps=num_train_steps))


def plain(value):
    """A frozen config value as plain JSON values again (mappings as dicts, tuples as
    lists): what config.json and the events log hold."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def _frozen(value):
    """A plain JSON value made read-only (dicts as mappings, lists as tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def resolve(config: ml_collections.ConfigDict, workdir: str = "", *,
            checked: bool = True) -> RunSpec:
    """`config` (configs/default.py's keys; an older config is upgraded first) as a
    RunSpec.

    Args:
      config: the run's config.
      workdir: the run's; its TFDS tables go to WORKDIR/tfds unless data.tfds_dir says,
        and its recorded pretrained start lets a resumed run go on without the start's
        folder.
      checked: validate first (a ConfigError, one line naming the key, for the first
        value that cannot work). A saved config that trained is resolved unchecked.

    Returns:
      The frozen spec the training loop and the commands take.
    """
    given = config.to_dict()
    c = upgrade(config)
    if checked:
        try:
            mesh = sharding.make_mesh(c.mesh.num_devices, c.mesh.model_axis)
        except ValueError as e:
            raise ConfigError(f"config.{e}") from None
        validation.validate(c, sharding.data_size(mesh), workdir)
    tasks = tuple(
        TaskSpec(name, _frozen(data.to_dict()), weight,
                 data.tfds_dir or os.path.join(workdir, "tfds"),
                 bool(data.rebuild or c.data.rebuild))
        for name, data, weight in specs.task_configs(c))
    d = c.get("distill")
    teacher = None
    if d is not None and specs.is_distill(c):
        teacher = TeacherSpec(d.teacher, d.teacher_weight, d.negatives, d.depth, d.margin,
                              d.max_len, d.queries_per_passage, c.model.max_len)
    return RunSpec(
        config=_frozen(given),
        schedule=Schedule(
            num_train_steps=c.num_train_steps, global_batch_size=c.global_batch_size,
            seed=c.seed, max_epochs=c.max_epochs, eval_every_steps=c.eval_every_steps,
            checkpoint_every_steps=c.checkpoint_every_steps,
            log_every_steps=c.log_every_steps, keep_checkpoints=c.keep_checkpoints,
            early_stopping=c.eval.early_stopping, rerun=bool(c.eval.rerun),
            untrained=bool(c.eval.untrained)),
        mesh=MeshSpec(c.mesh.num_devices, c.mesh.model_axis, c.mesh.param_sharding,
                      c.mesh.memory_plan),
        start=StartSpec(c.model.pretrained, c.model.pretrained_pooling, c.init_from),
        tasks=tasks,
        model=specs.model_spec(c.model),
        inputs=specs.inputs_spec(c.model),
        objective=specs.objective_spec(c),
        optimizer=specs.optimizer_spec(c.optimizer),
        eval=specs.eval_spec(c),
        teacher=teacher,
        num_mixed_negatives=c.loss.num_mixed_negatives,
        log_q_buckets=c.loss.log_q_buckets,
        log_q_alpha=c.loss.log_q_alpha)


def saved(workdir: str) -> RunSpec:
    """The RunSpec of a workdir's saved config (WORKDIR/config.json, upgraded, not
    checked again: it trained); FileNotFoundError naming what the folder is instead."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"{workdir}: no such folder")
    if not os.path.isfile(path):
        kind = folder_kind(workdir)
        raise FileNotFoundError(
            f"{workdir}: {'is a ' + kind + ', not' if kind else 'not'} a training "
            f"workdir (no config.json){': give the run it came from' if kind else ''}")
    with open(path) as f:
        return resolve(ml_collections.ConfigDict(json.load(f)), workdir, checked=False)
