"""The Transformer's building blocks, shared by the transformer tower (transformer.py) and the
bert tower (bert.py): multi-head self-attention over padded texts, the MLP with its GELU,
LayerNorm, and the logical axis names their weights carry (`_axes`)."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dualjax.models import lora as lora_lib
from dualjax.models.lora import NO_LORA, LoraSpec

_zeros = nn.initializers.zeros_init()
_ones = nn.initializers.ones_init()
# the logit of a padded key: jax.nn.dot_product_attention's own for `mask=` (float32 logits)
_MASKED_LOGIT = -0.7 * float(np.finfo(np.float32).max)


def _axes(init: Callable, *names: str | None) -> Callable:
    return nn.with_logical_partitioning(init, names)


class SelfAttention(nn.Module):
    """Multi-head self-attention over x [b, n, width]; keys where mask [b, n] is False are
    ignored; `bias` [heads, keys, queries] (MPNet's relative positions) is added to every
    text's logits. Softmax in float32 whatever the activation dtype. `lora`: adapters on
    the query, key, value and out projections it names (`models.lora`)."""
    num_heads: int
    init_std: float
    dtype: Any = jnp.float32
    lora: LoraSpec = LoraSpec()

    @nn.compact
    def __call__(self, x: jnp.ndarray, mask: jnp.ndarray,
                 bias: jnp.ndarray | None = None) -> jnp.ndarray:
        width = x.shape[-1]
        h, d = self.num_heads, width // self.num_heads
        init = nn.initializers.normal(stddev=self.init_std)

        def project(name: str) -> jnp.ndarray:  # [b, n, heads, kv]
            w = self.param(f"{name}_kernel", _axes(init, "embed", "heads", "kv"), (width, h, d))
            b = self.param(f"{name}_bias", _axes(_zeros, "heads", "kv"), (h, d))
            y = jnp.einsum("bne,ehd->bnhd", x, w.astype(self.dtype)) + b.astype(self.dtype)
            adapted = lora_lib.delta(self, self.lora, name, x, h * d, self.dtype)
            return y if adapted is None else y + adapted.reshape(y.shape)

        q, k, v = project("query"), project("key"), project("value")
        y = (fused_attention(q, k, v, mask) if bias is None and fused_attention_ok(q)
             else attention(q, k, v, mask, bias))
        w = self.param("out_kernel", _axes(init, "heads", "kv", "embed"), (h, d, width))
        b = self.param("out_bias", _axes(_zeros, "embed"), (width,))
        out = jnp.einsum("bqhd,hde->bqe", y, w.astype(self.dtype)) + b.astype(self.dtype)
        adapted = lora_lib.delta(self, self.lora, "out", y.reshape(*y.shape[:2], -1), width,
                                 self.dtype)
        return out if adapted is None else out + adapted


_PORTABLE = contextvars.ContextVar("portable_attention", default=False)


@contextlib.contextmanager
def portable_attention() -> Iterator[None]:
    """Towers traced inside take `attention` on any device: a program lowered for
    several platforms (a bundle: cpu, cuda, tpu) cannot hold cuDNN's kernel."""
    token = _PORTABLE.set(True)
    try:
        yield
    finally:
        _PORTABLE.reset(token)


def fused_attention_ok(q: jnp.ndarray) -> bool:
    """Whether `fused_attention` takes q [b, n, heads, d]: on a GPU (cuDNN's flash
    attention), in bfloat16 or float16, with a head width cuDNN takes (a multiple of 8,
    at most 128), outside `portable_attention`. Elsewhere `attention`, written for XLA."""
    return (not _PORTABLE.get() and jax.default_backend() == "gpu"
            and q.dtype in (jnp.bfloat16, jnp.float16)
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128)


def fused_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray,
                    implementation: Literal["xla", "cudnn"] = "cudnn") -> jnp.ndarray:
    """`attention` without a bias, through jax.nn.dot_product_attention's fused kernel
    (its own backward pass too). The padded keys are given as each text's length, since
    a text's tokens come before its padding (the towers' tokenizers pad on the right);
    at least one, so that a row of padding, whose output is never read, attends to its
    first key."""
    lengths = jnp.maximum(mask.sum(axis=1, dtype=jnp.int32), 1)
    return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                        implementation=implementation)


@jax.custom_vjp
def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray,
              bias: jnp.ndarray | None = None) -> jnp.ndarray:
    """softmax(q k / sqrt(d) + bias) v over the keys where mask [b, n] is True: q, k, v
    [b, n, heads, d] -> [b, n, heads, d], the logits and the softmax in float32 whatever
    the inputs' dtype: jax.nn.dot_product_attention(mask=, bias=)'s values, within 1e-6.
    bias: None, or float32 [heads, keys, queries] shared by the batch (keys-major, as the
    logits are laid out below), with a gradient of its own.

    Written for XLA on CPU. Padded keys are an additive bias (`mask=` is a select pass
    of its own over the [b, heads, n, n] logits; a logit plus the bias rounds to the
    bias, `mask=`'s own value for it, so a text whose keys are all padded averages its
    values as there), and the logits are laid out keys-major, [b, heads, keys, queries],
    with which XLA folds the softmax's exp into the second matmul's pass instead of
    writing the probabilities out (BENCHMARKS.md, "Encoding a corpus").

    The gradient (`_attention_fwd`, `_attention_bwd`) keeps no [b, heads, n, n] array
    from the forward pass to the backward one: only the output and each query's
    log-sum-exp, from which the backward pass computes the probabilities again (the
    recomputation of FlashAttention, Dao et al. 2022, without its tiling). Saving the
    probabilities of every layer instead held more memory than the rest of the step
    (BENCHMARKS.md, "Figures behind design choices")."""
    probs = jax.nn.softmax(_logits(q, k, mask, bias), axis=2).astype(v.dtype)
    return jnp.einsum("bnst,bsnh->btnh", probs, v)


def _logits(q: jnp.ndarray, k: jnp.ndarray, mask: jnp.ndarray,
            bias: jnp.ndarray | None) -> jnp.ndarray:
    """float32 [b, heads, keys, queries]: q k / sqrt(d) plus the padded keys' bias and
    the shared `bias`, if any."""
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    logits = jnp.einsum("bsnh,btnh->bnst", k, q, preferred_element_type=jnp.float32) * scale
    logits = logits + _key_bias(mask)[:, None, :, None]
    return logits if bias is None else logits + bias.astype(jnp.float32)[None]


def _key_bias(mask: jnp.ndarray) -> jnp.ndarray:
    """[b, n] float32: 0 where mask is True, else dot_product_attention's masked logit."""
    return jnp.where(mask, 0.0, _MASKED_LOGIT).astype(jnp.float32)


def _attention_fwd(q, k, v, mask, bias=None):
    logits = _logits(q, k, mask, bias)
    lse = jax.nn.logsumexp(logits, axis=2, keepdims=True)  # [b, heads, 1, queries]
    out = jnp.einsum("bnst,bsnh->btnh", jnp.exp(logits - lse).astype(v.dtype), v)
    return out, (q, k, v, mask, bias, out, lse)


def _attention_bwd(residuals, g):
    """The probabilities p again from the logits and lse; then dv = p^T g, and the
    softmax's backward dlogits = p * (g v^T - rowsum(g * out)) for dq and dk, and their
    sum over the batch for the shared bias."""
    # The barrier ties the recomputation to g: without it XLA merges it with the forward
    # pass's (common subexpressions) or runs it early, before g is there, and every
    # layer's probabilities are alive at once again.
    (q, k, v, mask, bias, out, lse), g = jax.lax.optimization_barrier((residuals, g))
    f32 = jnp.float32
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    probs = jnp.exp(_logits(q, k, mask, bias) - lse)  # [b, heads, keys, queries]
    dv = jnp.einsum("bnst,btnh->bsnh", probs.astype(g.dtype), g)
    dprobs = jnp.einsum("btnh,bsnh->bnst", g, v, preferred_element_type=f32)
    rowsum = jnp.einsum("btnh,btnh->bnt", g.astype(f32), out.astype(f32))[:, :, None, :]
    dlogits = probs * (dprobs - rowsum)  # d loss / d logits
    dbias = None if bias is None else dlogits.sum(0).astype(bias.dtype)
    dlogits = dlogits * scale  # through q k / sqrt(d)
    dq = jnp.einsum("bnst,bsnh->btnh", dlogits, k.astype(f32))
    dk = jnp.einsum("bnst,btnh->bsnh", dlogits, q.astype(f32))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, dbias


attention.defvjp(_attention_fwd, _attention_bwd)


def _layer_norm(dtype: Any, name: str, epsilon: float = 1e-6) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, name=name,
                        scale_init=_axes(_ones, "embed"), bias_init=_axes(_zeros, "embed"))


def feed_forward(x: jnp.ndarray, hidden: int, init_std: float, dtype: Any,
                 approximate: bool = True, module: nn.Module | None = None,
                 lora: LoraSpec = NO_LORA) -> jnp.ndarray:
    """A Transformer layer's MLP, x [.., width] -> mlp_out(gelu(mlp_in(x))) [.., width]
    (call inside nn.compact: the Dense layers are the caller's "mlp_in", "mlp_out"; with
    `lora`, `module` (the caller) holds their adapters)."""
    init = nn.initializers.normal(stddev=init_std)

    def dense(name: str, size: int, axes: tuple[str, str], inputs: jnp.ndarray) -> jnp.ndarray:
        out = nn.Dense(size, dtype=dtype, name=name, kernel_init=_axes(init, *axes),
                       bias_init=_axes(_zeros, axes[1]))(inputs)
        adapted = (None if module is None else
                   lora_lib.delta(module, lora, name, inputs, size, dtype))
        return out if adapted is None else out + adapted

    y = dense("mlp_in", hidden, ("embed", "mlp"), x)
    return dense("mlp_out", x.shape[-1], ("mlp", "embed"),
                 nn.gelu(y, approximate=True) if approximate else gelu(y))


def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """The exact GELU, x (1 + erf(x / sqrt 2)) / 2, as PyTorch and BERT write it: on CPU
    XLA vectorises erf, where jax.nn.gelu's erfc form is a select pass of its own (78 vs 84
    ms for a MiniLM MLP at 8,192 tokens; within 8e-6 of it)."""
    return 0.5 * x * (1 + jax.lax.erf(x * np.float32(1 / np.sqrt(2))).astype(x.dtype))
