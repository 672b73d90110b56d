"""The training stage: its loop, step, checkpoints, best-step selection, warm starts,
tasks, the workdir and its metrics log."""
