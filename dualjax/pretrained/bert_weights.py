"""A Hugging Face BertModel's or MPNetModel's tensors as a `BertTower`'s params, and
back (`bert_params`, `hf_tensors`, `hf_config`): the names of each family's layers
(`_ATTENTION_NAMES`), torch's Linear weight [out, in] as a kernel [in, out]."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dualjax.models.bert import BertConfig
from dualjax.pretrained.weights_file import by_name


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


def bert_params(tensors: dict[str, np.ndarray], c: BertConfig, path: str,
                dtype: Any = np.float32) -> dict:
    """A Hugging Face BertModel's or MPNetModel's tensors (with or without the "bert." /
    "mpnet." prefix) as a `BertTower`'s params in `dtype`; PretrainedError naming a
    missing tensor or a wrong shape."""
    t = {k.removeprefix(f"{c.family}."): v for k, v in tensors.items()}
    h, heads = c.hidden_size, c.num_heads
    d = h // heads
    projections, attention_norm = _ATTENTION_NAMES[c.family]
    with by_name(path, c.family, c.num_layers):
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
    return jax.tree.map(lambda x: np.ascontiguousarray(x, dtype), out)  # (one copy each)


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
