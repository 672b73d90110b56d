"""Datasets: TFDS builders, readers, retrieval tasks and grain pipelines."""
