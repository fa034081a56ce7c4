"""vLLM's record under data parallelism: each engine core (rank) schedules its own requests from
its own KV pool and names its rank in each line; read back, each rank has its own lanes and a
step's block tables are its rank's alone. A record without ranks reads as rank 0's."""

from __future__ import annotations

from engine.page.views import inside_view
from engine.peers.vllm_record import external_request_id, schedule_trace
from engine.sequence import Request
from engine.trace import new_request_records

TAG = "5eed0001"
START = {
    "event": "start",
    "max_num_seqs": 2,
    "max_num_batched_tokens": 64,
    "chunked_prefill": True,
    "async_scheduling": False,
    "prefix_caching": False,
    "block_size": 16,
    "num_blocks": 5,
    "dp_size": 2,
}


def _id(rid: int) -> str:
    return f"cmpl-{external_request_id(TAG, rid)}-0-1b2c3d4e"


def _step(rank: int, t: float, entries: list[dict], finished=()) -> dict:
    return {
        "event": "step",
        "start_unix_s": t,
        "end_unix_s": t + 0.1,
        "record_s": 1e-5,
        "num_tokens": sum(e["num_tokens"] for e in entries),
        "scheduled": entries,
        "resumed": [],
        "preempted": [],
        "finished": [_id(r) for r in finished],
        "dp_rank": rank,
    }


def _new(rid: int, block: int) -> dict:
    return {"req_id": _id(rid), "new": True, "num_prompt": 10, "num_tokens": 10,
            "num_computed": 0, "block_ids": [block]}  # fmt: skip


def _decode(rid: int) -> dict:
    return {"req_id": _id(rid), "num_tokens": 1, "num_computed": 10, "num_output": 1,
            "new_block_ids": []}  # fmt: skip


def _records() -> list[dict]:
    """Rank 0 runs R0 and R2, rank 1 R1 and R3, both in their blocks 1 and 2, steps interleaved."""
    return [
        {**START, "dp_rank": 0},
        {**START, "dp_rank": 1},
        _step(0, 100.0, [_new(0, 1), _new(2, 2)]),
        _step(1, 100.05, [_new(1, 1), _new(3, 2)]),
        _step(0, 100.2, [_decode(0), _decode(2)]),
        _step(1, 100.25, [_decode(1), _decode(3)]),
    ]


def _trace(records: list[dict]):
    requests = [Request(i, f"R{i}", 2, tuple(range(10)), arrival_s=0.0) for i in range(4)]
    return schedule_trace(records, new_request_records(requests), TAG, 100.0)


def test_each_rank_has_its_own_lanes_and_block_tables():
    """Rank 1's requests take lanes from max_num_seqs on; each step's tables and held blocks are
    its own rank's, so rank 0's block 1 (R0) and rank 1's block 1 (R1) are never one block."""
    trace = _trace(_records())
    assert trace.info["dp_size"] == 2 and trace.num_slots == 4, trace.info
    lanes = {s.request_id: s.slot for step in trace.steps for s in step.seqs}
    assert lanes == {0: 0, 2: 1, 1: 2, 3: 3}, lanes
    tables = [step.block_tables for step in trace.steps]
    assert tables == [{0: [1], 2: [2]}, {1: [1], 3: [2]}] * 2, tables
    assert all(len(h) == 1 for step in trace.steps for h in step.block_holders().values())
    labels = [inside_view.lane_label(f"slot {k}", trace) for k in range(4)]
    assert labels == ["rank 0 · lane 0", "rank 0 · lane 1", "rank 1 · lane 0", "rank 1 · lane 1"]


def test_a_record_without_ranks_reads_as_one_engine_core():
    """Lines without ``dp_rank`` (an older record, or no data parallelism) are rank 0's: one set
    of lanes, every table in every step, lanes labelled plainly."""
    records = [
        {k: v for k, v in r.items() if k not in ("dp_rank", "dp_size")}
        for r in _records()
        if r.get("dp_rank") == 0
    ]
    trace = _trace(records)
    assert trace.info["dp_size"] == 1 and trace.num_slots == 2, trace.info
    assert {s.request_id: s.slot for step in trace.steps for s in step.seqs} == {0: 0, 2: 1}
    assert inside_view.lane_label("slot 1", trace) == "lane 1"
