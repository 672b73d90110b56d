"""jax's persistent compilation cache, on by default for the commands: a resumed or
repeated run (a preempted TPU VM, the same config again) loads its compiled programs
instead of compiling them again (a BERT-base step: about a minute).

The cache lives in `$DUALJAX_COMPILATION_CACHE` (default ~/.cache/dualjax/xla; "off"
leaves it off). A cache jax was already given (JAX_COMPILATION_CACHE_DIR, or
jax.config) is left as it is. jax keys each entry by the program, the devices and the
jax and XLA versions, so a changed model, mesh or install compiles anew; only programs
that took at least a second to compile are kept (jax's default).
"""

from __future__ import annotations

import os

DEFAULT = os.path.join("~", ".cache", "dualjax", "xla")


def enable() -> str | None:
    """Points jax at the cache folder (made if need be); returns it, or None when off
    or when jax already has one."""
    import jax
    # (jax's Config makes its options attributes at run time, unknown to its type hints)
    configured = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if configured or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    where = os.environ.get("DUALJAX_COMPILATION_CACHE", DEFAULT)
    if where.lower() in ("off", "0", "false", ""):
        return None
    path = os.path.expanduser(where)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # a read-only home: no cache, nothing else changes
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path
