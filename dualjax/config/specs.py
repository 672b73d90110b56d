"""The config resolved into what the lower layers take: plain values and small frozen
dataclasses, computed here once. The data builders, the models, the losses and the
indexes never read a ConfigDict (tests/test_layers.py guards it); the ConfigDict stays
the user's interface (config files, --config.KEY=VALUE, WORKDIR/config.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import ml_collections

from dualjax.data.builders import CANDIDATES, DatasetSpec, file_settings
from dualjax.data.pairs_file import DataError
from dualjax.models import towers
from dualjax.models.spec import ModelSpec, PsesSpec, TransformerSpec

QUORA_PATH = os.path.join("..", "shared", "data", "quora", "pairs.tsv")
SQUAD_PATH = os.path.join("..", "shared", "data", "squad", "dev-v1.1.json")


def tower_names(model: ml_collections.ConfigDict) -> tuple[str, str]:
    """(query tower, document tower): model.query_tower / model.doc_tower where set, else
    model.tower."""
    return model.get("query_tower", "") or model.tower, model.get("doc_tower", "") or model.tower


def model_spec(model: ml_collections.ConfigDict) -> ModelSpec:
    """`config.model` (or a workdir's saved one: keys added since default) as the models
    take it. The cnn and Transformer settings are read, and checked (ValueError naming
    the key), only when a side uses that tower."""
    used = tower_names(model)
    t = model.get("transformer")
    transformer = TransformerSpec()
    if "transformer" in used:
        transformer = TransformerSpec.make(t.get("preset", ""), **{
            f.name: t[f.name] for f in dataclasses.fields(TransformerSpec)})
    p = model.get("pses")
    return ModelSpec(
        name=model.get("name", "dual_encoder"), query_tower=used[0], doc_tower=used[1],
        shared_towers=bool(model.shared_towers),
        shared_embedding=bool(model.get("shared_embedding", False)),
        embed_dim=model.embed_dim, hidden_dim=model.hidden_dim, output_dim=model.output_dim,
        embed_init_std=model.embed_init_std,
        cnn_windows=towers.parse_windows(model.cnn_windows) if "cnn" in used else (),
        # (read only for a cnn: a workdir saved before the cnn tower has no such key)
        cnn_filters=model.cnn_filters if "cnn" in used else ModelSpec.cnn_filters,
        dtype=model.get("dtype", "float32"),
        transformer=transformer, similarity=model.similarity, temperature=model.temperature,
        init_scale=model.init_scale, init_bias=model.init_bias,
        pses=PsesSpec() if p is None else PsesSpec(**{
            f.name: p[f.name] for f in dataclasses.fields(PsesSpec)}))


def dataset_spec(data: ml_collections.ConfigDict, seed: int) -> DatasetSpec:
    """`config.data` (or a task's) as the builders take it; DataError naming the key or
    file that cannot work."""
    if data.name not in DATA_SETTINGS:
        raise DataError(f"unknown dataset data.name={data.name!r}; known: "
                        f"{', '.join(DATA_SETTINGS)}")
    return DatasetSpec(data.name, json.dumps(DATA_SETTINGS[data.name](data, seed),
                                             sort_keys=True))


def _common(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    if cfg.candidates not in CANDIDATES:
        raise DataError(f"data.candidates={cfg.candidates!r} is not one of: "
                        f"{', '.join(CANDIDATES)}")
    return {"seed": seed, "candidates": cfg.candidates,
            "min_cluster_coherence": cfg.min_cluster_coherence,
            **_negatives(cfg)}


def _negatives(cfg: ml_collections.ConfigDict) -> dict:
    """The mining and pseudo-label settings, only when on (so the data of runs without
    them keeps its hash)."""
    out = {}
    if cfg.get("hard_negatives", 0):
        out["hard_negatives"] = cfg.hard_negatives
    if cfg.get("pseudo_labels", 0):
        out["pseudo_labels"] = cfg.pseudo_labels
        if cfg.get("pseudo_label_queries", ""):
            out.update(pseudo_label_queries=file_settings(cfg.pseudo_label_queries,
                                                          "a file of queries, one per line"))
    return out


def _synthetic_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    return {**_common(cfg, seed), "num_train_clusters": cfg.num_train_clusters,
            "num_val_clusters": cfg.num_val_clusters, "num_test_clusters": cfg.num_test_clusters}


def _pairs_settings(cfg: ml_collections.ConfigDict, seed: int, default_path: str = "") -> dict:
    return {**_common(cfg, seed),
            **file_settings(cfg.path or default_path, "a TSV or JSONL file of positive pairs"),
            "skip_bad_lines": cfg.skip_bad_lines, "val_fraction": cfg.val_fraction,
            "test_fraction": cfg.test_fraction}


def _quora_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    return _pairs_settings(cfg, seed, default_path=QUORA_PATH)


def _beir_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    if not cfg.path or not os.path.isdir(cfg.path):
        raise DataError(f"{cfg.path or '(empty)'}: data.path must be a BEIR folder "
                        "(corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    folder = os.path.abspath(os.path.expanduser(cfg.path))
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if name.endswith((".jsonl", ".tsv")):
                with open(os.path.join(root, name), "rb") as f:
                    digest.update(name.encode() + hashlib.file_digest(f, "sha256").digest())
    return {"seed": seed, "path": folder, "sha256": digest.hexdigest(),
            "skip_bad_lines": cfg.skip_bad_lines, **_negatives(cfg),
            **({} if cfg.get("ignore_identical_ids", True) else {"ignore_identical_ids": False})}


def _reqa_settings(cfg: ml_collections.ConfigDict, seed: int) -> dict:
    return {**_common(cfg, seed),
            **file_settings(cfg.path or SQUAD_PATH, "a SQuAD v1.1 JSON file"),
            "val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction,
            "context": cfg.candidate_context,
            **({"split_by": "question", "train_fraction": cfg.train_fraction}
               if cfg.get("split_by", "article") == "question" else {}),
            **({"unit": "paragraph"} if cfg.get("candidate_unit", "sentence") == "paragraph"
               else {})}


# data.name -> its settings from the data config and the run's seed (the data of runs
# whose settings are equal is shared: the tables' names carry their digest).
DATA_SETTINGS = {
    "synthetic_paraphrase": _synthetic_settings,
    "pairs": _pairs_settings,
    "quora": _quora_settings,
    "beir": _beir_settings,
    "reqa_squad": _reqa_settings,
}


PRETRAIN = "pretrain"  # data.name of an unlabelled collection (pre-training pairs, no evaluation)


def task_configs(config: ml_collections.ConfigDict
                 ) -> list[tuple[str, ml_collections.ConfigDict, float]]:
    """(name, data group, weight) per task: `config.tasks` in name order (ConfigDict keeps
    its keys sorted), else ("", config.data, 1.0)."""
    tasks = config.get("tasks") or {}
    if not tasks:
        return [("", config.data, 1.0)]
    return [(name, t.data, float(t.get("weight", 1.0))) for name, t in tasks.items()]
