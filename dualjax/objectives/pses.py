"""The PSES objective (Li & Jia 2018): a pairwise matching loss on the retrieval vectors,
plus, each weighted by its `PsesLoss` weight (config.loss.pses),

- orthogonality: ||Z_sQ^T Z_Q||_F^2 + ||Z_sD^T Z_D||_F^2 over the global batch (each
  device's Gram contribution summed over the mesh, `orthogonality`);
- adversarial: the Wasserstein estimate W = E_q[f(z_s(q))] - E_d[f(z_s(d))] of a critic
  f reading only z_s; the critic maximises W (`loss.pses.critic_steps` RMSProp updates
  per step, each followed by clipping its weights to [-c, c], WGAN), the encoders
  minimise it, so queries and documents become indistinguishable in the shared space;
- reconstruction: ||x - NN_r([z_s; z_specific])||^2 per text, mean over the batch, of
  both sides; x is the trunk's output, a target here (no gradient flows into it through
  this term, else the trunk could shrink x to zero to make it vanish);
- regularisation: the sum of squared Frobenius norms of every projection weight of the
  model (`weight_penalty`: the trunk's layers, its attention included, the encoders and
  decoders; not tables, biases, norms or the critic).

The pairwise loss is the paper's hinge max(0, margin - (cos(q, d+) - cos(q, d-))) with d-
a random document of the global batch (`pairwise="hinge"`; a pair whose d- is its own
document or of its cluster does not count), or `loss.name`'s in-batch loss over the
global batch (`pairwise="in_batch"`).

The critic is a two-layer feed-forward network with a softmax over {query, document};
its Wasserstein value is the log-odds f(z) = logit_query - logit_document. Its accuracy
(logged) counts a text as a query when f(z) is above the midpoint of the two means (a
WGAN critic's values have no fixed zero): near 0.5, the shared space is purified.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from dualjax.models import dual_encoder
from dualjax.models.pses import Codes, Pses, retrieval_vector
from dualjax.objectives.core import Critic, Objective
from dualjax.objectives.in_batch import hit_extras
from dualjax.runtime.sharding import DATA_AXIS


@dataclasses.dataclass(frozen=True)
class PsesLoss:
    """The loss and critic settings (config.loss.pses; configs/default.py says each)."""
    pairwise: str = "hinge"            # "hinge" | "in_batch"
    margin: float = 0.5
    orthogonality_weight: float = 1e-5
    adversarial_weight: float = 10.0
    reconstruction_weight: float = 0.01
    regularization_weight: float = 1e-5
    critic_hidden_dim: int = 64
    critic_steps: int = 5
    critic_clip: float = 0.01
    critic_learning_rate: float = 5e-5
    trainable: str = "all"             # "all" | "shared"


class CriticNet(nn.Module):
    """NN_adv: z_s [batch, shared_dim] -> logits [batch, 2] over {query, document}."""
    hidden_dim: int

    @nn.compact
    def __call__(self, z: jnp.ndarray) -> jnp.ndarray:
        return nn.Dense(2, name="output")(nn.relu(nn.Dense(self.hidden_dim, name="hidden")(z)))


def critic_value(net: CriticNet, critic_params, z: jnp.ndarray) -> jnp.ndarray:
    """f(z) [batch]: the critic's log-odds of "query"."""
    logits = cast(jnp.ndarray, net.apply({"params": critic_params}, z))
    return logits[:, 0] - logits[:, 1]


def wasserstein(f_q: jnp.ndarray, f_d: jnp.ndarray) -> jnp.ndarray:
    """The Wasserstein estimate E[f(z_s(q))] - E[f(z_s(d))] over the global batch."""
    return f_q.mean() - f_d.mean()


def critic_accuracy(f_q: jnp.ndarray, f_d: jnp.ndarray) -> jnp.ndarray:
    """Share of texts on their side of the midpoint of the two means (queries above)."""
    t = (f_q.mean() + f_d.mean()) / 2
    return ((f_q > t).mean() + (f_d <= t).mean()) / 2


def orthogonality_reference(shared: jnp.ndarray, specific: jnp.ndarray) -> jnp.ndarray:
    """||Z_s^T Z||_F^2 of shared [B, ks] and specific [B, k] codes (one device)."""
    return jnp.sum((shared.T @ specific) ** 2)


def orthogonality(mesh: jax.sharding.Mesh):
    """`orthogonality_reference` with the batch split over the mesh's `data` axis: each
    device's Gram contribution [ks, k] is summed over the mesh, then squared."""

    def body(shared, specific):
        return jnp.sum(jax.lax.psum(shared.T @ specific, DATA_AXIS) ** 2)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(DATA_AXIS), P(DATA_AXIS)),
                         out_specs=P())


def reconstruction(c: Codes) -> jnp.ndarray:
    """Mean over the batch of ||x - x_reconstructed||^2, x held fixed."""
    return jnp.mean(jnp.sum((c.reconstruction - jax.lax.stop_gradient(c.x)) ** 2, axis=-1))


def is_projection_weight(name: str) -> bool:
    """Whether a param named `name` is a layer's projection weight: "kernel" (nn.Dense,
    nn.Conv) or "<what>_kernel" (the Transformer's attention, layers.SelfAttention:
    query_/key_/value_kernel [width, heads, kv] and out_kernel [heads, kv, width], each a
    [width, width] matrix with its output or input split by head)."""
    return name == "kernel" or name.endswith("_kernel")


def weight_penalty(params) -> jnp.ndarray:
    """Sum of squared Frobenius norms of every projection weight in `params`
    (`is_projection_weight`): the dense, convolution and attention weights that the paper's
    regularisation of the networks' weights covers. Tables (tokens, positions, features:
    rows looked up, not a projection), the [CLS] vector, biases, LayerNorm scales and the
    similarity's scale and bias are not weights of a projection, and stay out, as the
    critic does (its own player)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return jnp.asarray(sum(jnp.sum(w ** 2) for path, w in leaves
                           if is_projection_weight(str(getattr(path[-1], "key", "")))))


def pairwise_hinge(q: jnp.ndarray, d: jnp.ndarray, shift: jnp.ndarray, margin: float,
                   same: jnp.ndarray | None = None) -> jnp.ndarray:
    """Mean over rows of max(0, margin - (q_i . d_i - q_i . d_{i-shift})) for unit
    vectors q, d [B, dim]; row i's negative is row (i - shift) mod B's document. `same`
    [B] bool (True: that negative is a positive of row i) drops those rows."""
    neg = jnp.roll(d, shift, axis=0)
    loss = jnp.maximum(0.0, margin - (jnp.sum(q * d, -1) - jnp.sum(q * neg, -1)))
    keep = jnp.ones_like(loss) if same is None else (~same).astype(loss.dtype)
    return jnp.sum(loss * keep) / jnp.maximum(keep.sum(), 1.0)


def same_as_rolled(batch: dict, shift: jnp.ndarray) -> jnp.ndarray | None:
    """[B] bool: row i's rolled negative is the same document or of the same cluster."""
    same = None
    for key in ("doc_ids", "cluster_ids"):
        if key in batch:
            hit = batch[key] == jnp.roll(batch[key], shift, axis=0)
            same = hit if same is None else same | hit
    return same


def objective(model: Pses, cfg: PsesLoss, mesh: jax.sharding.Mesh,
              max_len: int, in_batch_loss=None, remove_query_hits: bool = True,
              remove_cluster_hits: bool = True) -> Objective:
    """PSES with the weights and critic settings of `cfg`; in_batch_loss:
    `losses.sharded(...)`, used when cfg.pairwise="in_batch"."""
    net = CriticNet(cfg.critic_hidden_dim)
    ortho = orthogonality(mesh)
    shared_dim = model.spec.pses.shared_dim
    score = model.spec.pses.score

    def codes(params, batch):
        task = batch["task"][0] if "task" in batch else None
        return model.apply({"params": params}, batch["q_ids"], batch["q_mask"], batch["d_ids"],
                           batch["d_mask"], task=task)

    def critic_inputs(params, batch, rng):
        del rng
        q, d, _, _ = codes(params, batch)
        return q.shared, d.shared

    def critic_loss(critic_params, inputs):
        z_q, z_d = inputs
        f_q, f_d = critic_value(net, critic_params, z_q), critic_value(net, critic_params, z_d)
        w = wasserstein(f_q, f_d)
        return -w, {"wasserstein": w, "critic_accuracy": critic_accuracy(f_q, f_d)}

    def loss(params, batch, rng, extras):
        extras = dict(extras)
        critic = extras.pop("critic")  # the critic's params after this step's updates
        q, d, scale, bias = codes(params, batch)
        qv, dv = retrieval_vector(q, score), retrieval_vector(d, score)
        if cfg.pairwise == "hinge":
            shift = jax.random.randint(rng, (), 1, max(qv.shape[0], 2))
            pairwise = pairwise_hinge(qv, dv, shift, cfg.margin, same_as_rolled(batch, shift))
            metrics = {}
        else:
            more = hit_extras(batch, extras, remove_query_hits, remove_cluster_hits)
            pairwise, metrics = in_batch_loss(qv, dv, scale, bias, {**extras, **more} or None)
        terms = {
            "pairwise": pairwise,
            "orthogonality": ortho(q.shared, q.specific) + ortho(d.shared, d.specific),
            "adversarial": wasserstein(critic_value(net, critic, q.shared),
                                       critic_value(net, critic, d.shared)),
            "reconstruction": reconstruction(q) + reconstruction(d),
            "regularization": weight_penalty(params),
        }
        total = pairwise + sum(getattr(cfg, f"{k}_weight") * v
                               for k, v in terms.items() if k != "pairwise")
        return total, {**metrics, **terms, "scale": scale}

    critic = Critic(
        init=lambda rng: net.init(rng, jnp.zeros((1, shared_dim)))["params"],
        inputs=critic_inputs, loss=critic_loss,
        tx=optax.rmsprop(cfg.critic_learning_rate), steps=cfg.critic_steps,
        clip=cfg.critic_clip)

    def shared_only(params):  # NN_s and the similarity train; every other param is kept
        keep = ("shared",) + dual_encoder.SIMILARITY_PARAMS
        return {k: jax.tree.map(lambda _, t=k in keep: t, v) for k, v in params.items()}

    return Objective(lambda rng: dual_encoder.init_params(model, rng, max_len), loss,
                     trainable=shared_only if cfg.trainable == "shared" else None, critic=critic)

