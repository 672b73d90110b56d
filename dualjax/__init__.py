"""dualjax: two-tower retrieval models in JAX/Flax."""
