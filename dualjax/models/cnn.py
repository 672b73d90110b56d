"""The "cnn" tower (Bonadiman et al. 2019 §2.1.1). Its settings: model.embed_dim,
model.embed_init_std, model.cnn_windows ("3,4,5": one convolution per window size),
model.cnn_filters and model.output_dim."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from dualjax.models import towers


class CnnTower(nn.Module):
    """Bonadiman et al. 2019 §2.1.1: word embeddings -> 1-D convolutions ('SAME') of each
    window size with `filters` filters -> tanh -> max over the text's positions ->
    concatenated [batch, len(windows) * filters] -> linear [batch, output_dim].

    Pad embeddings are zeroed before the convolutions, so a window running past the text's
    end sees the same zeros as the 'SAME' padding of a text without pads.
    """
    vocab_size: int
    embed_dim: int
    windows: tuple[int, ...]
    filters: int
    output_dim: int
    init_std: float = 1.0
    embed: nn.Module | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
                 extra: jnp.ndarray | None = None) -> jnp.ndarray:
        table = towers.own_or_shared(self.embed, self.vocab_size, self.embed_dim, self.init_std)
        x = jnp.where(mask[..., None], table(ids).astype(self.dtype), 0)  # [b, len, embed]
        pooled = [towers.masked_max(jnp.tanh(nn.Conv(self.filters, (w,), padding="SAME",
                                                     dtype=self.dtype, name=f"conv_{w}")(x)),
                                    mask)
                  for w in self.windows]  # each [b, filters]
        return nn.Dense(self.output_dim, dtype=self.dtype, name="output")(
            towers.concat(jnp.concatenate(pooled, axis=-1), extra)).astype(jnp.float32)


def parse_windows(windows: str) -> tuple[int, ...]:
    """model.cnn_windows ("3,4,5") as a tuple of distinct positive ints; ValueError if not."""
    try:
        out = tuple(int(w) for w in windows.split(",") if w.strip())
    except ValueError:
        out = ()
    if not out or min(out) <= 0 or len(set(out)) != len(out):
        raise ValueError(f"model.cnn_windows={windows!r} must be distinct positive window sizes "
                         "separated by commas, like '5' or '3,4,5'")
    return out


def make_cnn(vocab_size: int, name: str, embed: nn.Module | None = None, *, embed_dim: int,
             cnn_windows: tuple[int, ...], cnn_filters: int, output_dim: int,
             embed_init_std: float, dtype: Any) -> nn.Module:
    return CnnTower(vocab_size, embed_dim, cnn_windows, cnn_filters, output_dim,
                    embed_init_std, embed, dtype, name=name)


def _check(settings: towers.Settings, max_lens: Mapping[str, int]) -> None:
    del max_lens  # a convolution reads any length
    if settings["cnn_filters"] <= 0:
        raise ValueError(f"model.cnn_filters={settings['cnn_filters']} must be > 0")


towers.register("cnn", make_cnn, check=_check)
