"""The generic rules the config checks share: a value among the allowed, a number
above zero; a ConfigError naming the key."""

from __future__ import annotations

import ml_collections

from dualjax.errors import ConfigError


def one_of(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"config.{key}={value!r} is not one of: {', '.join(map(str, allowed))}")


def positive(config: ml_collections.ConfigDict, *keys: str, allow_zero: bool = False) -> None:
    for key in keys:
        value = config
        for part in key.split("."):
            value = value[part]
        if value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"config.{key}={value} must be {'>= 0' if allow_zero else '> 0'}")
