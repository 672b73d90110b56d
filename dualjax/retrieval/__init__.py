"""Search and its scores: exact and approximate indexes, lexical baselines, hybrid
fusion, retrieval metrics."""
