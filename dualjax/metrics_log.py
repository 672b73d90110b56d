"""WORKDIR/metrics.jsonl: one JSON object per line with "step" and "split"."""

from __future__ import annotations

import json
import os
from typing import Any


class MetricsLog:
    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, step: int, split: str, values: dict[str, Any], **fields: Any) -> None:
        row = {"step": int(step), "split": split, **fields,
               **{k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in values.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drops rows logged after `step` (by a run killed after its last checkpoint), so a
        resumed run does not log those steps twice."""
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            rows = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(self.path, "w") as f:
            f.writelines(rows)

    def read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]
