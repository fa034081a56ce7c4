"""A real vLLM run for page and export tests: the record ``tests/engine/peers/vllm_schedule.jsonl``
(captured from vLLM 0.32 by ``tests.engine.peers.vllm_schedule_capture``) read back as the ``vllm``
engine's trace, its own record in ``schedule``, without starting vLLM.

The run: 4 requests (prompts of 10, 70, 66 and 28 tokens; R1 and R2 share 64 of them), 3 sequences
at most, KV blocks of 32 tokens and 6 blocks (block 0 is vLLM's null block), so vLLM shares two
prefix blocks and preempts a request. The client's side is rebuilt from the capture line: each
request's outputs, and vLLM's own times (the capture holds no client times).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.peers.vllm_record import parse_records, schedule_trace
from engine.trace import RequestRecord, Trace

CAPTURED = Path(__file__).resolve().parent / "engine" / "peers" / "vllm_schedule.jsonl"
# a second run, whose prefix-cache hits depend on the eviction order (see the capture module)
CAPTURED_EVICTION = CAPTURED.with_name("vllm_eviction.jsonl")
NUM_SLOTS = 3
PROMPT_LENS = [10, 70, 66, 28]
CAPS = [6, 8, 8, 12]


def captured_records(path: Path = CAPTURED) -> tuple[dict, list[dict]]:
    """The capture line (run tag, start, the client's requests) and vLLM's record lines."""
    capture, *records = parse_records(path.read_text().splitlines())
    return capture, records


def client_requests(capture: dict) -> list[RequestRecord]:
    """The client's request records of the captured run, outputs included, times not."""
    return [
        RequestRecord(
            r["request_id"],
            f"R{r['request_id']}",
            r["max_new_tokens"],
            r["num_prompt_tokens"],
            arrival_s=r["arrival_s"],
            output_token_ids=r["output_token_ids"],
            output_text=" ".join(map(str, r["output_token_ids"])),
            finish_reason="length",
        )
        for r in capture["requests"]
    ]


def captured_vllm_trace(name: str = "vllm") -> Trace:
    """The captured run as the page's ``vllm`` engine would hold it: client records (here with
    vLLM's times, no streamed token times) and vLLM's own record as ``schedule``."""
    capture, records = captured_records()
    schedule = schedule_trace(
        records, client_requests(capture), capture["run_tag"], capture["t0_unix_s"], name
    )
    requests = [dataclasses.replace(r, slot=None) for r in schedule.requests]
    for r in requests:
        r.num_cached_tokens = 0  # the client does not know the prefix cache's share
    info = {"server": {"model": "captured", "same_model": True, "settings": {}}}
    trace = Trace(name, NUM_SLOTS, requests=requests, wall_s=schedule.wall_s, info=info)
    trace.schedule = schedule
    return trace
