"""dualjax: two-tower retrieval models in JAX/Flax."""


def __getattr__(name: str):
    if name == "Encoder":  # a trained model's serving bundle (dualjax.export); jax on demand
        from dualjax.encoder import Encoder
        return Encoder
    raise AttributeError(f"module 'dualjax' has no attribute {name!r}")
