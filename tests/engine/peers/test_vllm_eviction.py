"""Our ``vllm`` policy's steps on vLLM's own record of a run whose prefix-cache hits depend on
the order free blocks are evicted in (``vllm_eviction.jsonl``, captured from vLLM 0.32 by
``tests.engine.peers.vllm_schedule_capture eviction``): the scheduler is run without a model,
fed the outputs vLLM gave, and its plans, hits and block tables are set beside the record's."""

from __future__ import annotations

import pytest

from engine.peers.schedule_comparison import compare_schedules
from engine.peers.vllm_record import schedule_trace
from engine.sequence import Request
from engine.serving.block_manager import BlockManager
from engine.serving.scheduler import Scheduler
from engine.trace import DECODE, PREFILL, ScheduledSeq, StepRecord, Trace
from tests.captured_vllm import CAPTURED_EVICTION, captured_records, client_requests
from tests.engine.peers.vllm_schedule_capture import eviction_requests


def _vllm_schedule() -> tuple[Trace, dict]:
    """vLLM's steps of the captured run, and its start line."""
    capture, records = captured_records(CAPTURED_EVICTION)
    start = next(r for r in records if r["event"] == "start")
    requests = client_requests(capture)
    return schedule_trace(records, requests, capture["run_tag"], capture["t0_unix_s"]), start


def _our_schedule(requests: list[Request], outputs: dict, start: dict, vllm_order: bool) -> Trace:
    """Our scheduler with the ``vllm`` policy on the start line's settings, its block manager
    freeing in vLLM's order or the default one, fed ``outputs`` (request id -> tokens)."""
    scheduler = Scheduler(
        requests,
        start["max_num_seqs"],
        frozenset(),
        start["max_num_batched_tokens"],
        policy="vllm",
        num_kv_blocks=start["num_blocks"] - 1,  # less vLLM's null block
        block_size=start["block_size"],
        prefix_caching=start["prefix_caching"],
    )
    blocks = scheduler.block_manager
    scheduler.block_manager = BlockManager(
        blocks.num_blocks, blocks.block_size, blocks.prefix_caching, vllm_order=vllm_order
    )
    steps = []
    while scheduler.has_work():
        step = scheduler.schedule()  # admissions included
        seqs = [
            ScheduledSeq(
                seq.request_id,
                seq.slot,
                PREFILL if seq.is_prefill else DECODE,
                n,
                seq.num_cached_tokens,
                num_prefix_cached_tokens=seq.num_prefix_cached_tokens,
            )
            for seq, n in zip(step.seqs, step.num_new, strict=True)
        ]
        record = StepRecord(len(steps), len(steps), len(steps) + 1, seqs)
        record.block_tables = {r: list(t) for r, t in scheduler.block_manager.block_tables.items()}
        steps.append(record)
        tokens = [outputs[s.request_id][len(s.output_token_ids)] for s in step.seqs]
        scheduler.postprocess(step, tokens)
    scheduler.block_manager.check_no_leaks()
    return Trace(engine="ours", num_slots=start["max_num_seqs"], steps=steps)


@pytest.mark.parametrize("vllm_order", [True, False], ids=["vllm_order", "default_order"])
def test_the_vllm_policy_evicts_as_vllm_did(vllm_order):
    """With vLLM's free order every step equals vLLM's record: plans, prefix hits (the second
    A hits one block; the last request, D and 10 tokens, none: E evicted both of D's blocks) and
    block tables (vLLM's ids less its null block). The default order keeps D's first block, so
    the last request hits 32 tokens and computes 42 where vLLM computed 74."""
    vllm, start = _vllm_schedule()
    outputs = {r.request_id: r.output_token_ids for r in vllm.requests}
    ours = _our_schedule(eviction_requests(), outputs, start, vllm_order)
    hits = [[s.num_prefix_cached_tokens for s in step.seqs] for step in vllm.steps]
    assert hits == [[0], [0], [32], [0], [0]], f"the record is not the run described: {hits}"
    result = compare_schedules(ours, vllm)
    if not vllm_order:
        assert result["first_difference"] == {
            "step": 4,
            "reason": "R4: ours 42 tokens, vLLM 74",
        }, result
        return
    assert result["equal_step_fraction"] == 1.0, result
    assert result["ours"] == result["vllm"], "admissions or prefix hits differ"
    for a, b in zip(ours.steps, vllm.steps, strict=True):
        theirs = {rid: [block - 1 for block in t] for rid, t in b.block_tables.items()}
        assert a.block_tables == theirs, f"step {a.index}: ours {a.block_tables}, vLLM's {theirs}"
