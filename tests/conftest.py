"""Test setup: 8 fake CPU devices, set before jax is imported anywhere."""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pathlib
import runpy

import ml_collections
import pytest

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def load_config(name: str) -> ml_collections.ConfigDict:
    """`configs/<name>.py`'s get_config(), loaded by path as main.py does."""
    return runpy.run_path(str(CONFIGS / f"{name}.py"))["get_config"]()
