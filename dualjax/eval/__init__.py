"""Evaluation: encode a task's queries and corpus, search, score, report."""
