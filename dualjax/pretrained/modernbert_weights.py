"""A Hugging Face ModernBertModel's tensors as a `ModernBertTower`'s params, and back.

Their names: embeddings.tok_embeddings.weight, embeddings.norm.weight,
layers.{i}.attn_norm.weight (not on layer 0), layers.{i}.attn.Wqkv.weight [3 x heads x
head_dim, hidden], layers.{i}.attn.Wo.weight, layers.{i}.mlp_norm.weight,
layers.{i}.mlp.Wi.weight [2 x intermediate, hidden] (the GELU's input, then its gate),
layers.{i}.mlp.Wo.weight, final_norm.weight; "model." before each in a masked-LM
checkpoint; ".bias" beside each where the config has biases.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dualjax.models.modernbert import ModernBertConfig
from dualjax.pretrained.weights_file import by_name, without_prefix


def modernbert_params(tensors: dict[str, np.ndarray], c: ModernBertConfig, path: str,
                      dtype: Any = np.float32) -> dict:
    """The tensors as `ModernBertTower` params in `dtype`; PretrainedError naming a missing
    tensor or one of another shape than config.json's sizes."""
    t = without_prefix(tensors, "model.")
    h, heads, d = c.hidden_size, c.num_heads, c.head_dim

    def norm(name: str) -> dict:
        out = {"scale": t[f"{name}.weight"]}
        if c.norm_bias:
            out["bias"] = t[f"{name}.bias"]
        return out

    def dense(name: str, bias: bool) -> dict:
        out = {"kernel": t[f"{name}.weight"].T}
        if bias:
            out["bias"] = t[f"{name}.bias"]
        return out

    with by_name(path, "modernbert", c.num_layers):
        out: dict = {"embed": {"embedding": t["embeddings.tok_embeddings.weight"]},
                     "ln_embed": norm("embeddings.norm"), "ln_final": norm("final_norm")}
        for i in range(c.num_layers):
            p = f"layers.{i}."
            layer: dict = {"qkv_kernel": t[p + "attn.Wqkv.weight"].T.reshape(h, 3, heads, d),
                           "out_kernel": t[p + "attn.Wo.weight"].T.reshape(heads, d, h),
                           "ln_mlp": norm(p + "mlp_norm"),
                           "mlp_in": dense(p + "mlp.Wi", c.mlp_bias),
                           "mlp_out": dense(p + "mlp.Wo", c.mlp_bias)}
            if c.attention_bias:
                layer["qkv_bias"] = t[p + "attn.Wqkv.bias"].reshape(3, heads, d)
                layer["out_bias"] = t[p + "attn.Wo.bias"]
            if i:
                layer["ln_attn"] = norm(p + "attn_norm")
            out[f"layer_{i}"] = layer
    return jax.tree.map(lambda x: np.ascontiguousarray(x, dtype), out)  # (one copy each)


def hf_tensors(params: dict, c: ModernBertConfig) -> dict[str, np.ndarray]:
    """The inverse of `modernbert_params` (the bare model's names)."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    h = c.hidden_size
    out: dict[str, np.ndarray] = {"embeddings.tok_embeddings.weight": p["embed"]["embedding"]}

    def norm(name: str, value: dict) -> None:
        out[f"{name}.weight"] = value["scale"]
        if c.norm_bias:
            out[f"{name}.bias"] = value["bias"]

    def dense(name: str, value: dict) -> None:
        out[f"{name}.weight"] = value["kernel"].T
        if "bias" in value:
            out[f"{name}.bias"] = value["bias"]

    norm("embeddings.norm", p["ln_embed"])
    norm("final_norm", p["ln_final"])
    for i in range(c.num_layers):
        layer, prefix = p[f"layer_{i}"], f"layers.{i}."
        out[prefix + "attn.Wqkv.weight"] = layer["qkv_kernel"].reshape(h, -1).T
        out[prefix + "attn.Wo.weight"] = layer["out_kernel"].reshape(-1, h).T
        if c.attention_bias:
            out[prefix + "attn.Wqkv.bias"] = layer["qkv_bias"].reshape(-1)
            out[prefix + "attn.Wo.bias"] = layer["out_bias"]
        if i:
            norm(prefix + "attn_norm", layer["ln_attn"])
        norm(prefix + "mlp_norm", layer["ln_mlp"])
        dense(prefix + "mlp.Wi", layer["mlp_in"])
        dense(prefix + "mlp.Wo", layer["mlp_out"])
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config(c: ModernBertConfig) -> dict:
    """A Hugging Face ModernBertModel config.json for `c` (read back by `from_hf`)."""
    return {"architectures": ["ModernBertModel"], "model_type": "modernbert",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "hidden_activation": "gelu",
            "max_position_embeddings": c.max_positions,
            "layer_types": ["sliding_attention" if x else "full_attention" for x in c.local],
            "local_attention": c.local_attention,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": c.global_rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": c.local_rope_theta}},
            "norm_eps": c.norm_eps, "norm_bias": c.norm_bias,
            "attention_bias": c.attention_bias, "mlp_bias": c.mlp_bias,
            "initializer_range": c.init_std, "pad_token_id": c.pad_token_id,
            "torch_dtype": "float32"}
