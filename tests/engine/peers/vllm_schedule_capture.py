"""Captures ``vllm_schedule.jsonl``, vLLM's own record of one small run, for the converter tests,
and ``vllm_eviction.jsonl``, one of a run whose prefix-cache hits depend on the eviction order.

Run once, from the repository root (a few minutes: it starts vLLM from ``.venv-vllm``, eager),
and commit the file; the argument ``eviction`` captures the second run::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        .venv/bin/python -m tests.engine.peers.vllm_schedule_capture [eviction]

The run: the embedded model in float32, 3 slots, KV blocks of 32 tokens and a KV cache of 6 blocks
(vLLM keeps one as its null block), so a request is preempted; four requests arriving in reverse
order (R3 first, R0 last), R1 and R2 sharing their first 64 prompt tokens (two full blocks, so R1
starts from R2's cached blocks). The file's first line is a ``capture`` line (the run's tag, its
start on the wall clock, and the client's requests with their outputs), then the server's record
as it wrote it: its ``start`` line and every ``step`` line.

The eviction run: the same KV cache, one slot, five requests of one output token each, all
arriving at 0 (vLLM's first step is held until all wait, then run in id order): prompts D, A, A,
E (64 tokens each: two full blocks) and D plus 10 tokens. The second A recomputes its last block
(a hit leaves the last token to compute), a copy that vLLM registers under A's second hash; E then
needs two blocks from a pool whose only free blocks are cached, and which prefix the fifth request
still finds depends on whether the copy was kept (``engine.serving.block_manager``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from engine.model.loader import load_model
from engine.peers.vllm_engine import VllmEngine
from engine.peers.vllm_record import ScheduleLog
from engine.peers.vllm_server import kv_bytes_per_token, settings_for
from engine.sequence import Request

OUT = Path(__file__).with_name("vllm_schedule.jsonl")
EVICTION_OUT = Path(__file__).with_name("vllm_eviction.jsonl")
BLOCK_SIZE = 32  # the smallest vLLM's CPU attention takes (a multiple of 32)
NUM_BLOCKS = 6  # block 0 is vLLM's null block: 5 for the requests
SHARED = list(range(1000, 1064))  # 64 tokens: two full blocks


def capture_requests() -> list[Request]:
    """Four requests arriving in reverse order: R1 and R2 share a two-block prefix, and R3's
    growth past its first block finds the cache full (R2 holds 3 blocks, R1 one beside the two
    it shares), so vLLM preempts the request it admitted last."""
    prompts = [
        list(range(2000, 2010)),
        [*SHARED, *range(3000, 3006)],
        [*SHARED, 4000, 4001],
        list(range(5000, 5028)),
    ]
    caps = [6, 8, 8, 12]
    return [
        Request(i, f"capture R{i}", caps[i], tuple(p), arrival_s=0.3 * (3 - i))
        for i, p in enumerate(prompts)
    ]


def eviction_requests() -> list[Request]:
    """Five one-token requests, all at 0: D, A, A, E (two blocks each), then D and 10 more."""
    d, a, e = range(6000, 6064), range(7000, 7064), range(8000, 8064)
    prompts = [d, a, a, e, [*d, *range(9000, 9010)]]
    return [Request(i, f"eviction R{i}", 1, tuple(p)) for i, p in enumerate(prompts)]


def main(which: str = "schedule") -> None:
    requests, num_slots, out = capture_requests(), 3, OUT
    if which == "eviction":
        requests, num_slots, out = eviction_requests(), 1, EVICTION_OUT
    loaded = load_model(device="cpu")
    per_block = kv_bytes_per_token(loaded.model.config, loaded.dtype.itemsize) * BLOCK_SIZE
    max_model_len = (NUM_BLOCKS - 2) * BLOCK_SIZE
    settings = dataclasses.replace(
        settings_for(loaded, num_slots, enforce_eager=True, max_model_len=max_model_len),
        kv_cache_bytes=int(per_block * (NUM_BLOCKS + 0.5)),
        block_size=BLOCK_SIZE,
    )
    engine = VllmEngine(loaded, num_slots, settings=settings)
    try:
        engine.start()
        trace = engine.run(requests)
        records = ScheduleLog(engine.server.schedule_path).read(0)
    finally:
        engine.close()
    where = trace.info["schedule_record"]
    capture = {
        "event": "capture",
        "run_tag": where["run_tag"],
        "t0_unix_s": where["t0_unix_s"],
        "requests": [
            {
                "request_id": r.request_id,
                "num_prompt_tokens": r.num_prompt_tokens,
                "max_new_tokens": r.max_new_tokens,
                "arrival_s": r.arrival_s,
                "output_token_ids": r.output_token_ids,
            }
            for r in trace.requests
        ],
    }
    lines = [capture, *records]
    out.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines))
    steps = trace.schedule.steps if trace.schedule else []
    print(f"{out}: {len(lines)} lines, {out.stat().st_size} bytes, {len(steps)} steps")
    print("preempted:", [s.preempted for s in steps if s.preempted])


if __name__ == "__main__":
    main(*sys.argv[1:2])
