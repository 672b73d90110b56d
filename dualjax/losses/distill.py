"""Distillation: the student learns a teacher's scores of each query's candidates.

A query's candidates are its positive and its k mined negatives: the columns
[d_i, n_i1, ..., n_ik] of row i, which the batch carries as `d` and
extras["hard_negatives"] [B, k, dim], with the teacher's scores of the same candidates
in extras["teacher_scores"] [B, 1 + k] (computed once, before training: `train.teacher`).
Both sides are compared as logits: the student's are the model's (scale x cosine +
bias), the teacher's its scores over `teacher_temperature`.

- "kl": listwise KL(teacher || student) over each row's candidates, each side a softmax
  over them (RocketQAv2, Tevatron's and sentence-transformers' distillation examples);
- "margin_mse": MarginMSE (Hofstätter et al. 2020): the squared difference between the
  student's margin s_pos - s_neg and the teacher's t_pos - t_neg, averaged over the
  (query, positive, negative) triples.

`distillation(fn, ...)` adds either to an in-batch loss `fn` (whose own columns are the
global batch's positives and every row's negatives, as before), so the student keeps
the contrastive signal and gains the teacher's graded one. Per-row terms on rows that
stay on their device: no collective is needed, the mean over the global batch is the
jit's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dualjax.losses.matrix import Extras, LossFn

KINDS = ("kl", "margin_mse")


def listwise_kl(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """[B] KL(softmax(teacher) || softmax(student)) of each row of logits [B, C]."""
    log_p = jax.nn.log_softmax(teacher.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(student.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def margin_mse(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """[B] mean over j >= 1 of ((s_0 - s_j) - (t_0 - t_j))^2 for logits [B, C] whose
    column 0 is the positive."""
    s = student[:, :1] - student[:, 1:]
    t = teacher[:, :1] - teacher[:, 1:]
    return jnp.mean(jnp.square(s.astype(jnp.float32) - t.astype(jnp.float32)), axis=-1)


def candidate_logits(q: jax.Array, d: jax.Array, negatives: jax.Array, scale: jax.Array,
                     bias: jax.Array) -> jax.Array:
    """[B, 1 + k]: row i's logits of its positive d_i and its negatives [B, k, dim]."""
    candidates = jnp.concatenate([d[:, None, :], negatives], axis=1)
    return scale * jnp.einsum("bd,bcd->bc", q, candidates) + bias


def distillation(fn: LossFn, kind: str, weight: float = 1.0, teacher_temperature: float = 1.0,
                 in_batch_weight: float = 1.0) -> LossFn:
    """in_batch_weight x `fn` + weight x the `kind` distillation term (module docstring),
    as one loss: it reads extras["teacher_scores"] [B, 1 + k] and extras["hard_negatives"]
    [B, k, dim], and passes the rest to `fn`. Metrics: fn's, plus "distill_loss" and
    "in_batch_loss"."""
    if kind not in KINDS:
        raise ValueError(f"distillation {kind!r} is not one of: {', '.join(KINDS)}")
    if teacher_temperature <= 0:
        raise ValueError(f"teacher_temperature={teacher_temperature} must be > 0")
    term = {"kl": listwise_kl, "margin_mse": margin_mse}[kind]

    def wrapped(q, d, scale, bias, extras: Extras | None = None):
        extras = dict(extras or {})
        teacher = extras.pop("teacher_scores", None)
        negatives = extras.get("hard_negatives")
        if teacher is None or negatives is None:
            raise ValueError("distillation needs extras['teacher_scores'] [B, 1 + k] and "
                             "extras['hard_negatives'] [B, k, dim]")
        if teacher.shape != (q.shape[0], 1 + negatives.shape[1]):
            raise ValueError(f"teacher_scores {teacher.shape} do not match {q.shape[0]} rows "
                             f"of 1 + {negatives.shape[1]} candidates")
        value, metrics = fn(q, d, scale, bias, extras)
        student = candidate_logits(q, d, negatives, scale, bias)
        distilled = jnp.mean(term(student, teacher / teacher_temperature))
        return (in_batch_weight * value + weight * distilled,
                {**metrics, "in_batch_loss": value, "distill_loss": distilled})

    return wrapped
