"""The registry of in-batch losses: `LOSSES`, name -> `Loss`.

A loss is one module that defines its three functions and registers them (the six of
dualjax are `in_batch_softmax.py`, `in_batch_sigmoid.py`, `in_batch_triplet_hardest.py`,
`triplet_margin.py`, `sdml.py` and `pointwise_logistic.py`):

    def reference(q, d, scale, bias, extras=None, *, my_option=1.0,
                  remove_accidental_hits=True):
        ...  # the plain form on the whole matrix M [B, C] (`reference.matrix`)
        return loss, {"in_batch_p@1": ...}

    def stats(blk: streaming.Block, pos: streaming.Positives, scale, bias, opts) -> dict:
        ...  # a block of columns -> per-row statistics (streaming.Sum, Max, LogSumExp)

    def finish(st: dict, pos, scale, bias, opts, labels) -> streaming.Sums:
        ...  # the merged statistics -> this device's sums

    LOSS = register(Loss("my_loss", reference, stats, finish,
                         options={"my_option": 1.0, "remove_accidental_hits": True}))

The config then names it (`config.loss.name = "my_loss"`), and each option is read
from `config.loss.<option>` when the config has that key, else its default here.
docs/design.md walks through one; tests/project/test_plugins.py registers one from a test file.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from dualjax.losses.matrix import LossFn
from dualjax.runtime.registry import Registry


@dataclasses.dataclass(frozen=True)
class Loss:
    """One in-batch loss.

    Attributes:
        name: what `config.loss.name` calls it.
        reference: the plain single-device form, fn(q, d, scale, bias, extras, **options).
        stats: a `streaming.Block`'s per-row statistics (merged across column blocks).
        finish: the merged statistics' per-device `streaming.Sums`.
        options: option -> default (None: resolved from the others by `resolve`).
        uses_log_q: whether the logQ correction (extras log_q_*) applies.
        needs_labels: whether it reads extras["labels"] (0/1 per pair) instead of
            treating every other column as a negative.
        resolve: the full options -> the options it runs with: fills what depends on
            other options, raises ValueError naming the option that cannot work.
    """
    name: str
    reference: LossFn
    stats: Callable[..., dict]
    finish: Callable[..., Any]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    uses_log_q: bool = False
    needs_labels: bool = False
    resolve: Callable[[dict], dict] = dict


LOSSES: Registry[Loss] = Registry(
    "loss", lambda name, known: ValueError(f"unknown loss {name!r}; one of: {known}"))


def register(loss: Loss) -> Loss:
    """Adds `loss` to LOSSES (ValueError if another loss has its name); returns it."""
    return LOSSES.add(loss.name, loss)


def resolve_options(name: str, options: dict) -> dict:
    """The loss's full options: its defaults filled in, then its own `resolve`."""
    defaults = LOSSES.named(name).options
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"loss {name!r} has no option {', '.join(unknown)}; its options: "
                         f"{', '.join(defaults) or 'none'}")
    return LOSSES[name].resolve({**defaults, **options})
