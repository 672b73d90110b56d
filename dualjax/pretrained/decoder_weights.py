"""A Hugging Face Llama, Mistral, Qwen2 or Qwen3 model's tensors as a `DecoderTower`'s
params, and back (`decoder_params`, `hf_tensors`).

Their names: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
.self_attn.{q,k,v,o}_proj.{weight,bias}, .self_attn.{q,k}_norm.weight (Qwen3),
.post_attention_layernorm.weight, .mlp.{gate,up,down}_proj.weight, model.norm.weight; a
causal-LM checkpoint has the "model." prefix (and an lm_head, which no embedding reads),
a bare model (an embedder saved as Qwen2Model) has none.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dualjax.models.decoder import DecoderConfig
from dualjax.pretrained.weights_file import by_name, without_prefix

_ATTENTION = (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"))
_MLP = (("mlp_gate", "gate_proj"), ("mlp_up", "up_proj"), ("mlp_down", "down_proj"))


def decoder_params(tensors: dict[str, np.ndarray], c: DecoderConfig, path: str,
                   dtype: Any = np.float32) -> dict:
    """The tensors as `DecoderTower` params in `dtype`; PretrainedError naming a missing
    tensor or one of another shape than config.json's sizes."""
    t = without_prefix(tensors, "model.")
    heads, kv, d, h = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    sizes = {"query": heads, "key": kv, "value": kv}
    with by_name(path, c.family, c.num_layers):
        out: dict = {"embed": {"embedding": t["embed_tokens.weight"]},
                     "ln_final": {"scale": t["norm.weight"]}}
        for i in range(c.num_layers):
            p = f"layers.{i}."
            attn: dict = {}
            for ours, theirs in _ATTENTION:
                attn[f"{ours}_kernel"] = t[f"{p}self_attn.{theirs}.weight"].T.reshape(
                    h, sizes[ours], d)
                if c.qkv_bias:
                    attn[f"{ours}_bias"] = t[f"{p}self_attn.{theirs}.bias"].reshape(
                        sizes[ours], d)
            attn["out_kernel"] = t[f"{p}self_attn.o_proj.weight"].T.reshape(heads, d, h)
            if c.out_bias:
                attn["out_bias"] = t[f"{p}self_attn.o_proj.bias"]
            if c.qk_norm:
                attn["query_norm"] = {"scale": t[f"{p}self_attn.q_norm.weight"]}
                attn["key_norm"] = {"scale": t[f"{p}self_attn.k_norm.weight"]}
            layer = {"attn": attn,
                     "ln_attn": {"scale": t[f"{p}input_layernorm.weight"]},
                     "ln_mlp": {"scale": t[f"{p}post_attention_layernorm.weight"]}}
            for ours, theirs in _MLP:
                dense = {"kernel": t[f"{p}mlp.{theirs}.weight"].T}
                if c.mlp_bias:
                    dense["bias"] = t[f"{p}mlp.{theirs}.bias"]
                layer[ours] = dense
            out[f"layer_{i}"] = layer
    return jax.tree.map(lambda x: np.ascontiguousarray(x, dtype), out)  # (one copy each)


def hf_tensors(params: dict, c: DecoderConfig) -> dict[str, np.ndarray]:
    """A `DecoderTower`'s params as the tensors of the family's bare model (no "model."
    prefix, as embedders save it; torch's Linear weight is [out, in]): the inverse of
    `decoder_params`."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    h = c.hidden_size
    out = {"embed_tokens.weight": p["embed"]["embedding"], "norm.weight": p["ln_final"]["scale"]}
    for i in range(c.num_layers):
        layer, prefix = p[f"layer_{i}"], f"layers.{i}."
        attn = layer["attn"]
        for ours, theirs in _ATTENTION:
            out[f"{prefix}self_attn.{theirs}.weight"] = attn[f"{ours}_kernel"].reshape(h, -1).T
            if c.qkv_bias:
                out[f"{prefix}self_attn.{theirs}.bias"] = attn[f"{ours}_bias"].reshape(-1)
        out[f"{prefix}self_attn.o_proj.weight"] = attn["out_kernel"].reshape(-1, h).T
        if c.out_bias:
            out[f"{prefix}self_attn.o_proj.bias"] = attn["out_bias"]
        if c.qk_norm:
            out[f"{prefix}self_attn.q_norm.weight"] = attn["query_norm"]["scale"]
            out[f"{prefix}self_attn.k_norm.weight"] = attn["key_norm"]["scale"]
        out[f"{prefix}input_layernorm.weight"] = layer["ln_attn"]["scale"]
        out[f"{prefix}post_attention_layernorm.weight"] = layer["ln_mlp"]["scale"]
        for ours, theirs in _MLP:
            out[f"{prefix}mlp.{theirs}.weight"] = layer[ours]["kernel"].T
            if c.mlp_bias:
                out[f"{prefix}mlp.{theirs}.bias"] = layer[ours]["bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


_ARCHITECTURES = {"llama": "LlamaModel", "mistral": "MistralModel", "qwen2": "Qwen2Model",
                  "qwen3": "Qwen3Model"}


def hf_config(c: DecoderConfig) -> dict:
    """A Hugging Face config.json of the family's bare model for `c`: the fields
    `DecoderConfig.from_hf` reads back to `c` (and transformers builds the model from)."""
    rope: dict = {"rope_type": c.rope_type, "rope_theta": c.rope_theta}
    if c.rope_type != "default":
        rope["factor"] = c.rope_factor
    if c.rope_type == "llama3":
        rope.update(low_freq_factor=c.rope_low_freq_factor,
                    high_freq_factor=c.rope_high_freq_factor,
                    original_max_position_embeddings=c.rope_original_max_positions)
    out = {"architectures": [_ARCHITECTURES[c.family]], "model_type": c.family,
           "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
           "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
           "intermediate_size": c.intermediate_size, "hidden_act": "silu",
           "max_position_embeddings": c.max_positions, "rms_norm_eps": c.rms_norm_eps,
           "rope_parameters": rope, "initializer_range": c.init_std,
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    if c.eos_token_id >= 0:
        out["eos_token_id"] = c.eos_token_id
    if c.family == "llama":
        out.update(attention_bias=c.out_bias, mlp_bias=c.mlp_bias)
    windows = set(c.windows) - {0}
    if c.family == "mistral":
        out["sliding_window"] = max(c.windows) if windows else None
    elif windows:  # Qwen: the window, on the layers that have it
        out.update(use_sliding_window=True, sliding_window=max(windows),
                   layer_types=["sliding_attention" if w else "full_attention"
                                for w in c.windows])
    return out
