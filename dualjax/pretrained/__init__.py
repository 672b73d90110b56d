"""Pretrained starts (`model.pretrained`): outside checkpoints read into the towers.

Three kinds of folder, told apart by their files:
- a Hugging Face BERT or MPNet folder (config.json with model_type "bert" or "mpnet",
  model.safetensors,
  tokenizer.json; the sentence-transformers files modules.json, 1_Pooling/config.json and
  sentence_bert_config.json when present): the `bert` tower (`models/bert.py`), its
  pooling as sentence-transformers' Pooling module says (else `model.pretrained_pooling`);
- a Hugging Face decoder LLM folder (model_type "llama", "mistral", "qwen2" or "qwen3";
  its weights in model.safetensors or sharded, with model.safetensors.index.json): the
  `decoder` tower (`models/decoder.py`), pooled as its Pooling module says (else
  `model.pretrained_pooling`, else the last token's state), its tokenizer appending the
  end-of-text token (tokenizer_config.json's `eos_token`, else config.json's
  `eos_token_id`) for last-token pooling, as these embedders are trained;
- a ModernBERT folder (`model_type` "modernbert"): the `modernbert` tower
  (`models/modernbert.py`), [CLS] or mean pooling as for BERT;
- a static token table (model2vec's `embeddings`, or a fetched WordLlama table): the
  token table of a `bow` or `bow_mlp` tower.
Either way the tokenizer is the folder's tokenizer.json (`model.tokenizer="hf"`).

`model.pretrained` is a known name (`sources.SOURCES`, fetched once with `python -m
dualjax.pretrained fetch NAME`; its files' digests are checked on every use) or a folder.
`resolve` reads what the start is without its weights; `Pretrained.tower_params` reads
the weights in the towers' parameter layout. A run records the resolved start in
WORKDIR/pretrained.json (`save` / `load`), so resuming, `init_from` and export rebuild the
same towers without the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

from dualjax.errors import PretrainedError
from dualjax.models import decoder
from dualjax.models.bert import FAMILIES, POOLINGS, BertConfig
from dualjax.models.decoder import DecoderConfig
from dualjax.models.modernbert import ModernBertConfig
from dualjax.pretrained import weights_file
from dualjax.pretrained.bert_weights import bert_params
from dualjax.pretrained.decoder_weights import decoder_params
from dualjax.pretrained.modernbert_weights import modernbert_params
from dualjax.pretrained.sources import (
    MARKER,
    SOURCES,
    canonical,
    fetch,
    folder_of,
    sha256_file,
    verify,
)
from dualjax.runtime.files import atomic_json
from dualjax.text.hf import HFTokenizer

KINDS = ("bert", "decoder", "modernbert", "static")  # all but "static": that tower
RECORD = "pretrained.json"  # in a workdir: the resolved start its towers came from
WEIGHTS = "model.safetensors"
SHARDED = "model.safetensors.index.json"  # a weight_map of tensor names to shard files
Architecture = BertConfig | DecoderConfig | ModernBertConfig
ARCHITECTURES: dict[str, type[Architecture]] = {
    "bert": BertConfig, "decoder": DecoderConfig, "modernbert": ModernBertConfig}
__all__ = ["Pretrained", "PretrainedError", "resolve", "load", "fetch", "SOURCES", "KINDS"]


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pretrained start, resolved: where it is, what it is and how to read it.

    kind "bert" or "decoder": `architecture` holds the encoder's sizes and pooling (a
    `BertConfig`, a `DecoderConfig`) and the start is the weights of the tower of that
    name; max_seq_length is sentence-transformers' (else the encoder's positions). kind
    "static": `table` is the [rows, dim] token table's tensor name and `dim` its width.
    sha256: of the weights file (of its shards' digests, for sharded weights)."""

    source: str  # model.pretrained as given
    folder: str
    kind: str
    tokenizer_settings: dict[str, bool]
    sha256: str
    architecture: Architecture | None = None
    table: str = ""
    dim: int = 0
    max_seq_length: int = 0
    # sentence-transformers' prompts the start was trained with: {"query", "document"}
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)

    def tokenizer(self) -> HFTokenizer:
        return HFTokenizer.from_file(os.path.join(self.folder, "tokenizer.json"),
                                     **self.tokenizer_settings)

    @property
    def tower(self) -> str:
        """The tower its weights are ("bert", "decoder"); "" for a static table."""
        return "" if self.kind == "static" else self.kind

    @property
    def output_dim(self) -> int:
        """Width of the vectors the start's tower returns (bow) or its table's width."""
        return self.architecture.hidden_size if self.architecture else self.dim

    def weights(self) -> dict[str, np.ndarray]:
        """The weights' tensors (of every shard), after checking they are the files that
        were resolved."""
        folder, name = self.folder, canonical(self.source)
        if not _has_weights(folder) and name in SOURCES:  # fetched again, elsewhere
            folder = folder_of(name)
        if not _has_weights(folder):
            fetch = f"; run: python -m dualjax.pretrained fetch {name}" if name in SOURCES else ""
            raise PretrainedError(f"{os.path.join(folder, WEIGHTS)}: missing "
                                  f"(model.pretrained={self.source!r}){fetch}")
        paths = weight_files(folder)
        if _digest(paths) != self.sha256:
            raise PretrainedError(f"{paths[0] if len(paths) == 1 else folder}: changed since "
                                  f"this run started from it (sha256 {self.sha256[:12]}... "
                                  f"recorded in {RECORD})")
        tensors: dict[str, np.ndarray] = {}
        for path in paths:  # (mapped from the files: read as they are used)
            tensors.update(weights_file.read(path))
        return tensors

    def tower_params(self, dtype: Any = np.float32) -> dict[str, Any]:
        """numpy arrays in `dtype`, each converted once from the mapped file (a run that
        keeps its frozen weights in bfloat16 never holds them in float32): for "bert" and
        "decoder" that tower's whole parameter tree; for "static" {"embedding": the
        table} (a `TokenTable`'s)."""
        tensors = self.weights()
        if self.kind == "static":
            return {"embedding": np.asarray(tensors[self.table], dtype)}
        where = os.path.join(self.folder, WEIGHTS)
        if isinstance(self.architecture, DecoderConfig):
            return decoder_params(tensors, self.architecture, where, dtype)
        if isinstance(self.architecture, ModernBertConfig):
            return modernbert_params(tensors, self.architecture, where, dtype)
        assert isinstance(self.architecture, BertConfig)  # kind "bert"
        return bert_params(tensors, self.architecture, where, dtype)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["architecture"] = self.architecture.to_json() if self.architecture else None
        return out

    @classmethod
    def from_json(cls, data: dict) -> Pretrained:
        data = dict(data)
        if "bert" in data:  # written before the decoder tower: its architecture's name
            data["architecture"] = data.pop("bert")
        arch = data.get("architecture")
        data["architecture"] = ARCHITECTURES[data["kind"]].from_json(arch) if arch else None
        return cls(**data)


def _header(paths: list[str]) -> dict[str, list[int]]:
    """{tensor name: shape} of safetensors files (mapped, no weights read);
    PretrainedError naming a file cut short or not safetensors (`weights_file.read`)."""
    return {name: list(x.shape) for path in paths
            for name, x in weights_file.read(path).items()}


def _has_weights(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in (WEIGHTS, SHARDED))


def weight_files(folder: str) -> list[str]:
    """The folder's safetensors files: model.safetensors, else the shards its
    model.safetensors.index.json names (each once, in order); PretrainedError naming the
    index for a shard that is not there or an index that is not one."""
    if os.path.isfile(os.path.join(folder, WEIGHTS)):
        return [os.path.join(folder, WEIGHTS)]
    index = os.path.join(folder, SHARDED)
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PretrainedError(f"{index}: no weight_map of tensor names to files")
    paths = [os.path.join(folder, f) for f in sorted(set(map(str, weight_map.values())))]
    for path in paths:
        if not os.path.isfile(path):
            raise PretrainedError(f"{index}: names {os.path.basename(path)}, which is not in "
                                  f"{folder}")
    return paths


def _digest(paths: list[str]) -> str:
    """The weights' sha256: the file's own, or for shards that of their names and
    digests, one line each."""
    if len(paths) == 1:
        return sha256_file(paths[0])
    lines = "".join(f"{os.path.basename(p)} {sha256_file(p)}\n" for p in paths)
    return hashlib.sha256(lines.encode()).hexdigest()


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise PretrainedError(f"{path}: not a JSON object")
    return data


def _folder(value: str) -> tuple[str, dict, str]:
    """(the folder, its MARKER settings, its weights' sha256) of model.pretrained = a
    known name (its files checked against their pinned digests) or a folder."""
    name = canonical(value)
    if name in SOURCES:
        folder = folder_of(name)
        if not os.path.isdir(folder):
            raise PretrainedError(f"model.pretrained={value!r} is not fetched yet; run: "
                                  f"python -m dualjax.pretrained fetch {name}")
        verify(SOURCES[name], folder)  # hashes the weights: their digest is the pinned one
        sha = SOURCES[name].sha256[WEIGHTS]
    else:
        folder = os.path.abspath(os.path.expanduser(value))
        if not os.path.isdir(folder):
            raise PretrainedError(f"model.pretrained={value!r} is neither a known model "
                                  f"({', '.join(SOURCES)}) nor a folder")
    missing = ("tokenizer.json" if not os.path.isfile(os.path.join(folder, "tokenizer.json"))
               else WEIGHTS if not _has_weights(folder) else "")
    if missing:
        raise PretrainedError(f"{folder}: no {missing} (model.pretrained={value!r} needs a "
                              "Hugging Face folder with model.safetensors, or its shards and "
                              f"{SHARDED}, and tokenizer.json)")
    marker = os.path.join(folder, MARKER)
    if name not in SOURCES:
        sha = _digest(weight_files(folder))
    return folder, (_read_json(marker) if os.path.isfile(marker) else {}), sha


def _st_pooling(folder: str) -> str | None:
    """sentence-transformers' Pooling module's mode ("mean" / "cls"), None without one."""
    modules = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules):
        return None
    with open(modules, encoding="utf-8") as f:
        entries = json.load(f)
    for m in entries:
        if m.get("type", "").endswith("models.Pooling"):
            path = os.path.join(folder, m.get("path", ""), "config.json")
            cfg = _read_json(path)
            if isinstance(cfg.get("pooling_mode"), str):  # sentence-transformers 6's form
                modes = [f"pooling_mode_{cfg['pooling_mode']}"]
            else:
                modes = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
            mapping = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                       "pooling_mode_mean": "mean", "pooling_mode_cls": "cls",
                       "pooling_mode_lasttoken": "last_token"}
            if len(modes) != 1 or modes[0] not in mapping:
                raise PretrainedError(f"{path}: pooling {modes} is not one of "
                                      "mean_tokens, cls_token, lasttoken")
            return mapping[modes[0]]
    return None


def _st_max_length(folder: str, positions: int) -> int:
    """sentence-transformers' max_seq_length: sentence_bert_config.json's (v2 to v5), else
    the tokenizer's model_max_length (v6 keeps it there), else the encoder's positions."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        if name == "tokenizer_config.json" and not os.path.isfile(
                os.path.join(folder, "modules.json")):
            break  # a plain Hugging Face folder: its tokenizer's limit is not one it chose
        path = os.path.join(folder, name)
        value = _read_json(path).get(key) if os.path.isfile(path) else None
        if isinstance(value, int) and 0 < value <= positions:
            return value
    return positions


# The names sentence-transformers models give their document prompt.
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")


def _st_prompts(folder: str) -> dict[str, str]:
    """The query and document prompts of a sentence-transformers folder's
    config_sentence_transformers.json ({} without one; empty ones left out)."""
    path = os.path.join(folder, "config_sentence_transformers.json")
    prompts = _read_json(path).get("prompts") if os.path.isfile(path) else None
    if not isinstance(prompts, dict):
        return {}
    found = {"query": prompts.get("query"),
             "document": next((prompts[k] for k in _DOCUMENT_PROMPTS if prompts.get(k)), "")}
    return {side: p for side, p in found.items() if isinstance(p, str) and p}


def resolve(value: str, pooling: str = "") -> Pretrained:
    """What model.pretrained=`value` is (weights not read). pooling: a BERT folder's
    pooling when it has no sentence-transformers Pooling module ("" there: "cls"); given
    with one, it must agree."""
    folder, marker, sha = _folder(value)
    header = _header(weight_files(folder))  # a file cut short is refused here
    config_path = os.path.join(folder, "config.json")
    hf = _read_json(config_path) if os.path.isfile(config_path) else {}
    if marker.get("kind") == "static" or hf.get("model_type") == "model2vec":
        return _static(value, folder, marker, sha, header)
    if hf.get("model_type") in decoder.FAMILIES:
        return _decoder(value, folder, sha, hf, pooling)
    if hf.get("model_type") not in (*FAMILIES, "modernbert"):
        raise PretrainedError(
            f"{config_path}: model_type {hf.get('model_type')!r} is not one model.pretrained "
            f"reads: {', '.join(FAMILIES + decoder.FAMILIES)}, modernbert, and static token "
            "tables (model2vec, WordLlama)")
    st = _st_pooling(folder)
    if pooling and pooling not in POOLINGS:
        raise PretrainedError(f"model.pretrained_pooling={pooling!r} is not one of "
                              f"{', '.join(POOLINGS)}")
    if st and pooling and pooling != st:
        raise PretrainedError(f"model.pretrained_pooling={pooling!r}, but {folder} was trained "
                              f"with {st} pooling (1_Pooling/config.json); leave it empty")
    modern = hf["model_type"] == "modernbert"
    try:
        arch: Architecture = (ModernBertConfig if modern else BertConfig).from_hf(
            hf, st or pooling or "cls")
    except (KeyError, ValueError) as e:
        raise PretrainedError(f"{config_path}: {e}") from None
    max_len = _st_max_length(folder, arch.max_length)
    return Pretrained(value, folder, "modernbert" if modern else "bert",
                      {"lowercase": False, "add_special_tokens": True}, sha,
                      architecture=arch, max_seq_length=int(max_len), prompts=_st_prompts(folder))


def _decoder(value: str, folder: str, sha: str, hf: dict, pooling: str) -> Pretrained:
    """A decoder LLM folder (`resolve`): its sizes, its pooling, and the end-of-text
    token its tokenizer appends for last-token pooling."""
    config_path = os.path.join(folder, "config.json")
    st = _st_pooling(folder)
    if pooling and pooling not in decoder.POOLINGS:
        raise PretrainedError(f"model.pretrained_pooling={pooling!r} is not one of "
                              f"{', '.join(decoder.POOLINGS)} for a {hf['model_type']} folder")
    if st and pooling and pooling != st:
        raise PretrainedError(f"model.pretrained_pooling={pooling!r}, but {folder} was trained "
                              f"with {st} pooling (1_Pooling/config.json); leave it empty")
    pooling = st or pooling or "last_token"
    eos = _end_of_text(folder, hf) if pooling == "last_token" else -1
    try:
        arch = DecoderConfig.from_hf(hf, pooling, eos)
    except (KeyError, ValueError) as e:
        raise PretrainedError(f"{config_path}: {e}") from None
    settings: dict[str, Any] = {"lowercase": False, "add_special_tokens": True}
    if eos >= 0:
        settings["end_token"] = eos
    return Pretrained(value, folder, "decoder", settings, sha, architecture=arch,
                      max_seq_length=int(_st_max_length(folder, arch.max_length)),
                      prompts=_st_prompts(folder))


def _end_of_text(folder: str, hf: dict) -> int:
    """The id of the token a last-token embedder reads: tokenizer_config.json's
    eos_token, else config.json's eos_token_id (the first of a list); PretrainedError
    naming both files when neither names one the tokenizer knows."""
    tokenizer_path = os.path.join(folder, "tokenizer.json")
    config_path = os.path.join(folder, "tokenizer_config.json")
    token = _read_json(config_path).get("eos_token") if os.path.isfile(config_path) else None
    if isinstance(token, dict):  # {"content": ...} in older files
        token = token.get("content")
    if isinstance(token, str) and token:
        found = HFTokenizer.from_file(tokenizer_path).token_id(token)
        if found is not None:
            return found
    ids = hf.get("eos_token_id")
    ids = ids[0] if isinstance(ids, list) and ids else ids
    if isinstance(ids, int) and ids >= 0:
        return ids
    raise PretrainedError(f"{folder}: no end-of-text token for last-token pooling (neither "
                          "tokenizer_config.json's eos_token nor config.json's eos_token_id); "
                          "set --config.model.pretrained_pooling=mean, or add one")


def _static(value: str, folder: str, marker: dict, sha: str,
            header: dict[str, list[int]]) -> Pretrained:
    path = os.path.join(folder, WEIGHTS)
    table = marker.get("tensor") or ("embeddings" if "embeddings" in header else "")
    if table not in header:
        raise PretrainedError(f"{path}: no token table (tensor 'embeddings'); has "
                              f"{', '.join(list(header)[:5])}")
    shape = header[table]
    if len(shape) != 2:
        raise PretrainedError(f"{path}: {table} has shape {shape}, not [rows, dim]")
    # model2vec: the tokenizer's own normaliser; pieces alone, the unknown one dropped.
    settings = {"lowercase": bool(marker.get("lowercase", False)),
                "add_special_tokens": bool(marker.get("add_special_tokens", False)),
                "drop_unknown": "kind" not in marker}
    return Pretrained(value, folder, "static", settings, sha, table=table, dim=int(shape[1]),
                      prompts=_st_prompts(folder))


def read_tokenizer(path: str) -> HFTokenizer:
    """model.tokenizer_path: a tokenizer.json, or a folder holding one."""
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        full = os.path.join(full, "tokenizer.json")
    if not os.path.isfile(full):
        raise PretrainedError(f"model.tokenizer_path={path!r}: no such tokenizer.json")
    return HFTokenizer.from_file(full)


def save(workdir: str, start: Pretrained) -> None:
    atomic_json(os.path.join(workdir, RECORD), start.to_json(), indent=1)


def load(workdir: str) -> Pretrained | None:
    """The start recorded in WORKDIR/pretrained.json (None: the run has none)."""
    path = os.path.join(workdir, RECORD)
    if not os.path.exists(path):
        return None
    try:
        return Pretrained.from_json(_read_json(path))
    except (TypeError, KeyError) as e:
        raise PretrainedError(f"{path}: corrupt: {e}") from None
