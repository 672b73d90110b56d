"""dualjax: two-tower retrieval models in JAX/Flax.

The package's folders follow the flow: config/ (validation, typed specs) -> text/
(normalisation, tokenizers, per-side inputs) -> data/ (tables) -> models/, losses/,
objectives/ (towers and what they learn) -> train/ (the loop and its workdir) ->
retrieval/ (indexes, lexical baselines, metrics) -> eval/ -> serve/ (the bundle), with
runtime/ (meshes, the allocator, progress) below them all. The commands are main, export,
index and search; errors lives in errors.
"""


def __getattr__(name: str):
    # jax, flax and the training stack are imported on demand, not by `import dualjax`.
    if name == "Encoder":  # a trained model's serving bundle (dualjax.export)
        from dualjax.serve.bundle import Encoder
        return Encoder
    if name == "train_and_evaluate":  # python -m dualjax.main's work, from Python
        from dualjax.train.loop import train_and_evaluate
        return train_and_evaluate
    raise AttributeError(f"module 'dualjax' has no attribute {name!r}")
