"""A trained dual encoder as a sentence-transformers folder, for the tools outside dualjax
(`python -m dualjax.export --format=sentence-transformers`).

The folder is what sentence-transformers (v3 and later) saves, in its long-standing file
format, so `SentenceTransformer(DIR)` loads it and `encode_query` / `encode_document`
give the dual encoder's vectors:
- one BERT-family or decoder tower for both sides (shared towers, one max length): the
  Hugging Face model files at the top (config.json, model.safetensors with BertModel's,
  MPNetModel's or the decoder family's tensor names, tokenizer.json and its config;
  `transformers.AutoModel.from_pretrained(DIR)` reads them too), then 1_Pooling (the
  tower's mean, [CLS] or last-token pooling) and 2_Normalize; a decoder's tokenizer.json
  appends the end-of-text token itself, as dualjax's does (LoRA adapters are folded into
  the weights before: `exporting.merged`);
- a `bow` tower over a Hugging Face tokenizer (a static table: WordLlama, model2vec):
  sentence-transformers' StaticEmbedding (the table as "embedding.weight", the tokenizer
  with the tower's lowercasing and max length written into it), then Normalize;
- a tower per side, or one tower read at two max lengths: sentence-transformers' Router
  module, one route per side (query_0_Transformer, ..., document_2_Normalize), so each
  side takes its own tower.
Towers it has no module for (cnn, transformer, bow_mlp, PSES, categorical fields) are
refused by `refusal`, before anything is written.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from dualjax import pretrained
from dualjax.models.bert import BertConfig
from dualjax.models.decoder import DecoderConfig
from dualjax.models.modernbert import ModernBertConfig
from dualjax.models.spec import ModelSpec
from dualjax.pretrained import bert_weights, decoder_weights, modernbert_weights
from dualjax.text.hf import HFTokenizer
from dualjax.text.sides import Inputs

SIDES = ("query", "document")
MARKER = "modules.json"  # the file that makes a folder a sentence-transformers model
_TYPES = {kind: f"sentence_transformers.models.{kind}"
          for kind in ("Transformer", "Pooling", "Normalize", "Router", "StaticEmbedding")}
# A tower kind -> the modules of its route, in order.
_MODULES = {"bert": ("Transformer", "Pooling", "Normalize"),
            "decoder": ("Transformer", "Pooling", "Normalize"),
            "modernbert": ("Transformer", "Pooling", "Normalize"),
            "bow": ("StaticEmbedding", "Normalize")}
_ARCHITECTURES = {"bert": BertConfig, "decoder": DecoderConfig, "modernbert": ModernBertConfig}
_POOLING = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
            "last_token": "pooling_mode_lasttoken"}
# Special tokens a tokenizer config names, where the vocabulary has them: BERT's, else
# MPNet's (whose padding must be <pad>: its positions count the tokens that are not).
_SPECIAL = {"pad_token": ("[PAD]", "<pad>"), "unk_token": ("[UNK]", "<unk>"),
            "cls_token": ("[CLS]", "<s>"), "sep_token": ("[SEP]", "</s>"),
            "mask_token": ("[MASK]", "<mask>"), "bos_token": ("<s>",), "eos_token": ("</s>",)}


def refusal(spec: ModelSpec, inputs: Inputs, architecture: Any) -> str | None:
    """Why a model cannot be written as a sentence-transformers folder (None: it can):
    the part it has that no sentence-transformers module computes."""
    if spec.name == "pses":
        return ("model.name='pses': its vectors are built from shared and specific codes "
                "(Li & Jia 2018), which no sentence-transformers module computes")
    for side, names in (("query", "model.query_features"), ("document", "model.doc_features")):
        if getattr(inputs, side).features:
            return (f"{names}: the {side} tower reads categorical fields, and "
                    "sentence-transformers modules read text alone")
    for side, kind in zip(SIDES, (spec.query_tower, spec.doc_tower), strict=True):
        tok = getattr(inputs, side).tokenizer
        if kind not in _MODULES:
            return (f"the {side} tower is model.tower={kind!r}: only BERT-family and decoder "
                    "towers (model.pretrained) and bow towers over a Hugging Face tokenizer are "
                    "written as sentence-transformers folders; export the bundle "
                    "(--format=bundle)")
        if not isinstance(tok, HFTokenizer):
            return (f"the {side} tower reads dualjax's own {type(tok).__name__}: "
                    "sentence-transformers reads Hugging Face tokenizers (model.tokenizer="
                    "'hf') only")
        if kind in _ARCHITECTURES and (not isinstance(architecture, _ARCHITECTURES[kind])
                                       or not tok.add_special_tokens):
            return (f"the run records no {kind} sizes or special tokens "
                    "(WORKDIR/pretrained.json)")
        if kind == "bow" and (tok.drop_unknown or tok.add_special_tokens):
            what = "drops unknown pieces" if tok.drop_unknown else "adds special tokens"
            return (f"the {side} side's tokenizer {what}, and sentence-transformers' "
                    "StaticEmbedding averages every piece of the text alone")
    return None


def write(directory: str, spec: ModelSpec, inputs: Inputs, params: dict[str, Any],
          architecture: Any) -> list[str]:
    """Writes the folder's files into `directory` (an empty folder; the caller renames it
    into place) and returns their paths, relative to it. `refusal` must be None."""
    towers = _towers(spec, params)
    kinds = dict(zip(SIDES, (spec.query_tower, spec.doc_tower), strict=True))
    lengths = {side: getattr(inputs, side).max_len for side in SIDES}
    tokenizers = {side: getattr(inputs, side).tokenizer for side in SIDES}
    written: list[str] = []

    def put(rel: str, data: bytes | str) -> None:  # into a staged folder: no reader yet
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        written.append(rel)

    single = spec.shared_towers and lengths["query"] == lengths["document"]
    routes = {"": "query"} if single else {f"{side}_": side for side in SIDES}
    structure = {}
    for prefix, side in routes.items():
        # The input module at the route's top (a plain folder: the folder's own top).
        names = [f"{prefix}{i}_{kind}" for i, kind in enumerate(_MODULES[kinds[side]])]
        folder = names[0] if prefix else ""
        tok, length = tokenizers[side], lengths[side]
        if kinds[side] in _ARCHITECTURES:  # `refusal` refuses one without its sizes
            _transformer(put, folder, towers[side], architecture, tok, length)
            put(f"{names[1]}/config.json", _json(_pooling_config(architecture)))
        else:
            _static(put, folder, towers[side], tok, length)
        os.makedirs(os.path.join(directory, names[-1]), exist_ok=True)  # Normalize
        structure[side] = names
    if single:
        modules = [_module(i, name if i else "", kind)
                   for i, (name, kind) in enumerate(zip(structure["query"],
                                                        _MODULES[kinds["query"]], strict=True))]
    else:
        modules = [_module(0, "", "Router")]
        put("router_config.json", _json(_router_config(structure, kinds)))
    put("modules.json", _json(modules))
    put("config_sentence_transformers.json", _json({
        "__version__": {"dualjax": _version()}, "model_type": "SentenceTransformer",
        "prompts": {side: getattr(inputs, side).prompt for side in SIDES},
        "default_prompt_name": None,
        "similarity_fn_name": "cosine"}))
    return written


def _towers(spec: ModelSpec, params: dict[str, Any]) -> dict[str, dict]:
    """side -> its tower's params (a shared token table put back into each)."""
    shared = {"embed": params["embed"]} if "embed" in params else {}
    if spec.shared_towers:
        return {side: params["tower"] for side in SIDES}
    return {side: {**params[name], **shared}
            for side, name in zip(SIDES, ("query_tower", "doc_tower"), strict=True)}


def _transformer(put, folder: str, params: dict, arch: pretrained.Architecture,
                 tok: HFTokenizer, max_len: int) -> None:
    """The Hugging Face model and tokenizer files of one tower, and its max length."""
    from safetensors.numpy import save

    join = lambda name: os.path.join(folder, name) if folder else name
    if isinstance(arch, DecoderConfig):
        config, tensors = decoder_weights.hf_config(arch), decoder_weights.hf_tensors(params, arch)
    elif isinstance(arch, ModernBertConfig):
        config = modernbert_weights.hf_config(arch)
        tensors = modernbert_weights.hf_tensors(params, arch)
    else:
        config, tensors = bert_weights.hf_config(arch), bert_weights.hf_tensors(params, arch)
    put(join("config.json"), _json(config))
    put(join("model.safetensors"), save(tensors, metadata={"format": "pt"}))
    put(join("tokenizer.json"), json.dumps(_tokenizer_spec(tok), ensure_ascii=False))
    specials = _special_tokens(tok)
    put(join("special_tokens_map.json"), _json(specials))
    put(join("tokenizer_config.json"), _json({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
        "padding_side": "right", "truncation_side": "right", "clean_up_tokenization_spaces":
        False, **specials}))
    put(join("sentence_bert_config.json"), _json({"max_seq_length": max_len,
                                                  "do_lower_case": False}))


def _static(put, folder: str, params: dict, tok: HFTokenizer, max_len: int) -> None:
    """A bow tower as StaticEmbedding: the mean of its table's rows over the text's first
    max_len pieces (the truncation is written into the tokenizer, which StaticEmbedding
    applies as is)."""
    from safetensors.numpy import save

    join = lambda name: os.path.join(folder, name) if folder else name
    table = np.ascontiguousarray(params["embed"]["embedding"], np.float32)
    put(join("model.safetensors"), save({"embedding.weight": table},
                                        metadata={"format": "pt"}))
    put(join("tokenizer.json"), json.dumps(_tokenizer_spec(tok, max_len), ensure_ascii=False))


def _tokenizer_spec(tok: HFTokenizer, max_len: int | None = None) -> dict:
    """The tokenizers JSON as dualjax reads it: a lowercasing tokenizer gets a Lowercase
    normaliser in front; no padding; truncation at `max_len` pieces when given (None:
    left to the caller, as sentence-transformers' Transformer truncates at max_seq_length,
    special tokens counted)."""
    truncation = None if max_len is None else {
        "direction": "Right", "max_length": max_len, "strategy": "LongestFirst", "stride": 0}
    out = dict(tok.with_end_token(), padding=None, truncation=truncation)
    if tok.lowercase:
        first = [out["normalizer"]] if out.get("normalizer") else []
        out["normalizer"] = {"type": "Sequence",
                             "normalizers": [{"type": "Lowercase"}, *first]}
    return out


def _special_tokens(tok: HFTokenizer) -> dict[str, str]:
    vocab = tok.spec.get("model", {}).get("vocab", {})
    known = set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab}
    known |= {t["content"] for t in tok.spec.get("added_tokens", [])}
    found = {key: next((t for t in tokens if t in known), None)
             for key, tokens in _SPECIAL.items()}
    end = tok.token_of(tok.end_token) if tok.end_token >= 0 else None
    if end:  # a decoder's end-of-text token, its padding too (it has no other)
        found.update(eos_token=end, pad_token=found.get("pad_token") or end)
    return {key: token for key, token in found.items() if token}


def _pooling_config(arch: pretrained.Architecture) -> dict:
    out = {"word_embedding_dimension": arch.hidden_size}
    out.update({mode: False for mode in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                         "pooling_mode_max_tokens",
                                         "pooling_mode_mean_sqrt_len_tokens",
                                         "pooling_mode_lasttoken")})
    out[_POOLING[arch.pooling]] = True
    return out


def _router_config(structure: dict[str, list[str]], kinds: dict[str, str]) -> dict:
    return {"types": {name: _TYPES[kind] for side in SIDES
                      for name, kind in zip(structure[side], _MODULES[kinds[side]], strict=True)},
            "structure": structure,
            "parameters": {"default_route": "document", "allow_empty_key": True}}


def _module(idx: int, path: str, kind: str) -> dict:
    return {"idx": idx, "name": str(idx), "path": path, "type": _TYPES[kind]}


def _json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("dualjax")
    except metadata.PackageNotFoundError:
        return "unknown"

