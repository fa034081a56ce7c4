"""Helpers the bench tests share: a workload file, and an engine run corrupted by hand."""

from __future__ import annotations

import json


def write_workload(tmp_path, rows) -> str:
    """A JSONL workload in ``tmp_path``: ``rows`` are (prompt, max_new_tokens) pairs or whole
    row dicts (for sampling settings or arrivals). Returns its path as the bench takes it."""
    pair = lambda row: {"prompt": row[0], "max_new_tokens": row[1]}  # noqa: E731
    lines = [row if isinstance(row, dict) else pair(row) for row in rows]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    return str(path)


def corrupt_continuous_outputs(monkeypatch) -> None:
    """Make the continuous engine's first request emit token id 3 at output index 2: a
    difference no numerics explain, for the bench's mismatch report."""
    from engine.batching.continuous import ContinuousEngine

    real_run = ContinuousEngine.run

    def corrupted_run(self, requests, on_step=None):
        trace = real_run(self, requests, on_step)
        record = trace.requests[0]
        record.output_token_ids = [*record.output_token_ids[:2], 3, *record.output_token_ids[3:]]
        return trace

    monkeypatch.setattr(ContinuousEngine, "run", corrupted_run)
