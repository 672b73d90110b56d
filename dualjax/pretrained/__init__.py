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

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from dualjax.errors import PretrainedError
from dualjax.models import decoder
from dualjax.models.bert import FAMILIES, POOLINGS, BertConfig
from dualjax.models.decoder import DecoderConfig
from dualjax.models.modernbert import ModernBertConfig
from dualjax.pretrained import weights_file
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

    def tower_params(self) -> dict[str, Any]:
        """float32 numpy arrays: for "bert" and "decoder" that tower's whole parameter
        tree; for "static" {"embedding": the table} (a `TokenTable`'s)."""
        tensors = self.weights()
        if self.kind == "static":
            return {"embedding": np.asarray(tensors[self.table], np.float32)}
        where = os.path.join(self.folder, WEIGHTS)
        if isinstance(self.architecture, DecoderConfig):
            return decoder_params(tensors, self.architecture, where)
        if isinstance(self.architecture, ModernBertConfig):
            return modernbert_params(tensors, self.architecture, where)
        assert isinstance(self.architecture, BertConfig)  # kind "bert"
        return bert_params(tensors, self.architecture, where)

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


@contextlib.contextmanager
def _readable(path: str) -> Iterator[None]:
    """A weights file safetensors cannot read (cut short by an interrupted copy or
    download, or not safetensors at all) as one PretrainedError naming it."""
    from safetensors import SafetensorError
    try:
        yield
    except SafetensorError as e:
        raise PretrainedError(f"{path}: not a whole safetensors file ({e}); copy or download "
                              "it again") from None


def _header(paths: list[str]) -> dict[str, list[int]]:
    """{tensor name: shape} of safetensors files, from their headers (no weights read);
    PretrainedError if safetensors cannot read one (`_readable`)."""
    from safetensors import safe_open
    out: dict[str, list[int]] = {}
    for path in paths:
        with _readable(path), safe_open(path, "numpy") as f:
            out.update({name: f.get_slice(name).get_shape() for name in f.keys()})
    return out


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


# ----------------------------------------------------------------------------- BERT weights
def _linear(tensors: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A torch Linear's (kernel [in, out], bias [out]) (torch stores weight [out, in])."""
    return tensors[f"{name}.weight"].T, tensors[f"{name}.bias"]


def _norm(tensors: dict, name: str) -> dict[str, np.ndarray]:
    scale = tensors.get(f"{name}.weight", tensors.get(f"{name}.gamma"))
    bias = tensors.get(f"{name}.bias", tensors.get(f"{name}.beta"))
    if scale is None or bias is None:
        raise KeyError(f"{name}.weight")
    return {"scale": scale, "bias": bias}


# Where a layer's tensors sit in each family's Hugging Face model (the rest is shared):
# (the attention's q, k, v, output projections; the LayerNorm after the attention).
_ATTENTION_NAMES = {
    "bert": (("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense"), "attention.output.LayerNorm"),
    "mpnet": (("attention.attn.q", "attention.attn.k", "attention.attn.v",
               "attention.attn.o"), "attention.LayerNorm"),
}


def bert_params(tensors: dict[str, np.ndarray], c: BertConfig, path: str) -> dict:
    """A Hugging Face BertModel's or MPNetModel's tensors (with or without the "bert." /
    "mpnet." prefix) as a `BertTower`'s params; PretrainedError naming a missing tensor
    or a wrong shape."""
    t = {k.removeprefix(f"{c.family}."): v for k, v in tensors.items()}
    h, heads = c.hidden_size, c.num_heads
    d = h // heads
    projections, attention_norm = _ATTENTION_NAMES[c.family]
    try:
        out = {"embed": {"embedding": t["embeddings.word_embeddings.weight"]},
               "pos_embed": t["embeddings.position_embeddings.weight"],
               "ln_embed": _norm(t, "embeddings.LayerNorm")}
        if c.family == "bert":
            out["type_embed"] = t["embeddings.token_type_embeddings.weight"][0]
        if c.relative_buckets:
            out["rel_bias"] = t["encoder.relative_attention_bias.weight"]
        for i in range(c.num_layers):
            p = f"encoder.layer.{i}."
            attn: dict[str, np.ndarray] = {}
            for ours, theirs in zip(("query", "key", "value"), projections[:3], strict=True):
                w, b = _linear(t, p + theirs)
                attn[f"{ours}_kernel"] = w.reshape(h, heads, d)
                attn[f"{ours}_bias"] = b.reshape(heads, d)
            w, b = _linear(t, p + projections[3])
            attn["out_kernel"], attn["out_bias"] = w.reshape(heads, d, h), b
            w_in, b_in = _linear(t, p + "intermediate.dense")
            w_out, b_out = _linear(t, p + "output.dense")
            out[f"layer_{i}"] = {"attn": attn,
                                 "ln_attn": _norm(t, p + attention_norm),
                                 "mlp_in": {"kernel": w_in, "bias": b_in},
                                 "mlp_out": {"kernel": w_out, "bias": b_out},
                                 "ln_mlp": _norm(t, p + "output.LayerNorm")}
    except KeyError as e:
        raise PretrainedError(f"{path}: no tensor {e.args[0]} (a {c.family} of "
                              f"{c.num_layers} layers?)") from None
    except ValueError as e:
        raise PretrainedError(f"{path}: a tensor does not fit the sizes in config.json: "
                              f"{e}") from None
    return jax.tree.map(lambda x: np.ascontiguousarray(x, np.float32), out)


def hf_tensors(params: dict, c: BertConfig) -> dict[str, np.ndarray]:
    """A `BertTower`'s params as a Hugging Face BertModel's or MPNetModel's tensors (the
    names `bert_params` reads; torch's Linear weight is [out, in]): the inverse of
    `bert_params`. BERT's token-type table gets two rows, both the tower's one row (a
    single text is type 0; the tower never had a second type); the pooler, which no
    sentence vector reads and the tower does not have, is the identity (so
    `transformers` finds every tensor it builds)."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    h = c.hidden_size
    projections, attention_norm = _ATTENTION_NAMES[c.family]
    out = {"embeddings.word_embeddings.weight": p["embed"]["embedding"],
           "embeddings.position_embeddings.weight": p["pos_embed"],
           "embeddings.LayerNorm.weight": p["ln_embed"]["scale"],
           "embeddings.LayerNorm.bias": p["ln_embed"]["bias"]}
    if c.family == "bert":
        out["embeddings.token_type_embeddings.weight"] = np.stack([p["type_embed"]] * 2)
    if c.relative_buckets:
        out["encoder.relative_attention_bias.weight"] = p["rel_bias"]

    def linear(name: str, kernel: np.ndarray, bias: np.ndarray, rows: int) -> None:
        out[f"{name}.weight"] = kernel.reshape(-1, rows).T
        out[f"{name}.bias"] = bias.reshape(rows)

    for i in range(c.num_layers):
        layer, prefix = p[f"layer_{i}"], f"encoder.layer.{i}."
        attn = layer["attn"]
        for side, name in zip(("query", "key", "value"), projections[:3], strict=True):
            linear(prefix + name, attn[f"{side}_kernel"], attn[f"{side}_bias"], h)
        linear(prefix + projections[3], attn["out_kernel"], attn["out_bias"], h)
        linear(prefix + "intermediate.dense", layer["mlp_in"]["kernel"],
               layer["mlp_in"]["bias"], c.intermediate_size)
        linear(prefix + "output.dense", layer["mlp_out"]["kernel"], layer["mlp_out"]["bias"], h)
        for ours, theirs in (("ln_attn", attention_norm), ("ln_mlp", "output.LayerNorm")):
            out[f"{prefix}{theirs}.weight"] = layer[ours]["scale"]
            out[f"{prefix}{theirs}.bias"] = layer[ours]["bias"]
    out["pooler.dense.weight"] = np.eye(h, dtype=np.float32)
    out["pooler.dense.bias"] = np.zeros(h, np.float32)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config(c: BertConfig) -> dict:
    """A Hugging Face BertModel or MPNetModel config.json for `c` (the fields
    `BertConfig.from_hf` reads, and the ones `transformers` needs to build the model)."""
    if c.family == "mpnet":
        return {"architectures": ["MPNetModel"], "model_type": "mpnet",
                "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
                "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
                "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
                "max_position_embeddings": c.max_positions,
                "relative_attention_num_buckets": c.relative_buckets,
                "layer_norm_eps": c.layer_norm_eps, "initializer_range": c.init_std,
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                "pad_token_id": c.position_offset - 1, "bos_token_id": 0, "eos_token_id": 2,
                "torch_dtype": "float32"}
    return {"architectures": ["BertModel"], "model_type": "bert",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
            "max_position_embeddings": c.max_positions, "type_vocab_size": 2,
            "layer_norm_eps": c.layer_norm_eps, "initializer_range": c.init_std,
            "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "pad_token_id": 0,
            "torch_dtype": "float32"}
