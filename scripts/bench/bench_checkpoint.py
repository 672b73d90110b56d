"""The first checkpoint's cost: a run's train state (a random-weight BERT tower of
all-MiniLM-L6-v2's shape, or BERT-base's, AdamW, on 8 CPU devices, replicated) saved
by `train.checkpoints.Checkpointer` twice, with Orbax's replica-parallel array writing
and without (`checkpoints.state_handler`). Each variant runs in a process of its own
without the compilation cache, as a run's first save does.

    python scripts/bench/bench_checkpoint.py            # prints a markdown table
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

SHAPES = {  # (hidden, layers, heads, intermediate): their config.json files
    "MiniLM-L6 shape": (384, 6, 12, 1536),
    "BERT-base shape": (768, 12, 12, 3072),
}


def one(shape: str, replica_parallel: bool) -> dict:
    """Times the two saves of one shape in this process."""
    import dataclasses

    import jax
    import optax

    from dualjax import objectives
    from dualjax.models import dual_encoder
    from dualjax.models.bert import BertConfig
    from dualjax.models.spec import ModelSpec
    from dualjax.runtime import sharding
    from dualjax.train import checkpoints
    from dualjax.train import step as step_lib

    hidden, layers, heads, inner = SHAPES[shape]
    arch = BertConfig(30522, hidden, layers, heads, inner, 512)
    model = dual_encoder.make_model(ModelSpec(query_tower="bert", doc_tower="bert"), 30522,
                                    architecture=arch)
    mesh = sharding.make_mesh(8)
    objective = objectives.make(dataclasses.replace(objectives.ObjectiveSpec(), max_len=128),
                                model, mesh)
    init = step_lib.make_init_state(objective, objectives.restrict(optax.adamw(1e-4), objective))
    placed = sharding.state_shardings(jax.eval_shape(init, 0), mesh, "replicated",
                                      dual_encoder.logical_axes(model, 128))
    state = jax.block_until_ready(jax.jit(init, static_argnums=0, out_shardings=placed)(0))
    out = {"arrays": len(jax.tree.leaves(state)),
           "shapes": len({(x.shape, x.dtype) for x in jax.tree.leaves(state)}),
           "mb": sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20}
    ckpt = checkpoints.Checkpointer(tempfile.mkdtemp(), 2, replica_parallel=replica_parallel)
    for step in (1, 2):
        t = time.perf_counter()
        ckpt.save(step, state, {})
        ckpt.wait()
        out[f"save_{step}"] = time.perf_counter() - t
    ckpt.close()
    return out


def main() -> None:
    if len(sys.argv) == 3:  # a variant, in its own process
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        print(json.dumps(one(sys.argv[1], sys.argv[2] == "True")))
        return
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PLATFORMS"] = "cpu"
    print("| tower | arrays (distinct shapes) | MB | replica-parallel | first save s "
          "| second save s |")
    print("|---|---:|---:|---|---:|---:|")
    for shape in SHAPES:
        for rp in (True, False):
            r = common.run_worker([sys.executable, os.path.abspath(__file__), shape,
                                   str(rp)], env=env)
            print(f"| {shape} | {r['arrays']} ({r['shapes']}) | {r['mb']:.0f} | "
                  f"{'yes' if rp else 'no'} | {r['save_1']:.2f} | {r['save_2']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
