"""transformers' own schedule, recorded by the scheduler it builds by name, read back as a Trace.

Real transformers on a tiny random Llama (no mock): its manager runs the recording scheduler and
the trace's ``schedule`` must agree with what transformers did (forward passes, outputs).
"""

import pytest
from tiny_model import make_requests, tiny_runner

from engine.config import EngineConfig
from engine.peers import transformers_scheduler
from engine.peers.transformers_engine import HFContinuousEngine
from engine.sequence import Request
from engine.trace import DECODE, PREFILL, new_request_records

SPECS = [
    ("hello world", 5),
    ("a", 20),
    ("the quick brown fox jumps", 40),
    ("xyz", 3),
    ("Once upon a time", 33),
    ("z" * 50, 12),
    ("q", 1),
]
NUM_SLOTS = 3


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture(scope="module")
def run(runner):
    """The hf_continuous trace of SPECS, and how many forward passes the model made."""
    calls = []
    hook = runner.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        trace = HFContinuousEngine(runner, EngineConfig(NUM_SLOTS)).run(make_requests(SPECS))
    finally:
        hook.remove()
    return trace, len(calls)


def test_one_recorded_step_per_forward_pass(run):
    """The record has exactly one step per forward pass of the model, in time order."""
    trace, num_forwards = run
    schedule = trace.schedule
    assert schedule is not None, trace.warnings
    assert len(schedule.steps) == num_forwards, (len(schedule.steps), num_forwards)
    assert [s.index for s in schedule.steps] == list(range(num_forwards))
    steps = schedule.steps
    pairs = zip(steps, steps[1:], strict=False)
    assert all(a.start_s <= a.end_s <= b.start_s for a, b in pairs), "steps overlap"
    assert steps[-1].end_s == schedule.wall_s


def test_each_request_is_fed_its_prompt_and_all_outputs_but_the_last(run):
    """Without preemption or sharing, a request's scheduled tokens are its prompt plus every
    output token but the last (each output is fed back to get the next; the last never is)."""
    trace, _ = run
    for rec in trace.requests:
        fed = sum(
            s.num_new_tokens
            for step in trace.schedule.steps
            for s in step.seqs
            if s.request_id == rec.request_id
        )
        expected = rec.num_prompt_tokens + len(rec.output_token_ids) - 1
        assert fed == expected, f"request {rec.request_id}: fed {fed}, expected {expected}"


def test_kinds_cache_and_lanes_follow_each_request(run):
    """A request prefills first, then decodes one token a step on top of all it computed; it
    keeps one lane, no two share a lane in a step, and every scheduled request holds blocks."""
    trace, _ = run
    schedule = trace.schedule
    seen: dict[int, tuple[int, int]] = {}  # request id -> (lane, tokens computed after its step)
    for step in schedule.steps:
        lanes = [s.slot for s in step.seqs]
        assert len(set(lanes)) == len(lanes) and max(lanes) < schedule.num_slots, step
        for s in step.seqs:
            assert step.block_tables[s.request_id], f"step {step.index}: R{s.request_id} holds none"
            if s.request_id not in seen:
                assert (s.kind, s.num_cached_tokens) == (PREFILL, 0), f"R{s.request_id}: {s}"
            else:
                lane, computed = seen[s.request_id]
                assert s.slot == lane and s.num_cached_tokens == computed, f"R{s.request_id}: {s}"
                assert (s.kind, s.num_new_tokens) == (DECODE, 1), f"R{s.request_id}: {s}"
            seen[s.request_id] = (s.slot, s.num_cached_tokens + s.num_new_tokens)
    assert schedule.num_slots == NUM_SLOTS
    assert schedule.info["kv_blocks"] > max(
        b for step in schedule.steps for t in step.block_tables.values() for b in t
    ), "the block map covers every block id"


def test_record_times_agree_with_transformers_timestamps(run):
    """The record's first-token and finish times are its steps' ends, within 5 ms of the
    per-token timestamps transformers took when it applied each step's outputs."""
    trace, _ = run
    for inside, outside in zip(trace.schedule.requests, trace.requests, strict=True):
        assert inside.admit_s <= inside.first_token_s <= inside.finish_s
        assert abs(inside.first_token_s - outside.first_token_s) < 0.005, (inside, outside)
        assert abs(inside.finish_s - outside.finish_s) < 0.005, (inside, outside)
        assert inside.output_token_ids == outside.output_token_ids


def _tight_run(runner, prompts: list[list[int]], max_new_tokens: int):
    """transformers' manager with the recording scheduler and a KV cache too small for all its
    requests at once (10 blocks of 8 tokens): it must preempt. Returns (record, forward passes
    by transformers' own count, outputs by request id)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(eos_token_id=-1, pad_token_id=0, do_sample=False)
    cb = ContinuousBatchingConfig(
        scheduler_type=transformers_scheduler.register(),
        page_size=8,
        num_blocks=10,
        max_batch_tokens=64,
        max_requests_per_batch=len(prompts),
        auto_switch_to_flash=False,
        allow_block_sharing=False,
    )
    previous = runner.model.config._attn_implementation
    try:
        with runner.model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
        ) as manager:
            for i, prompt in enumerate(prompts):
                manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=max_new_tokens)
            outputs = {}
            while len(outputs) < len(prompts):
                out = manager.get_result(timeout=30)
                assert out is not None, "transformers' manager stopped"
                if out.is_finished():
                    outputs[out.request_id] = out
            scheduler = manager.batch_processor.scheduler
    finally:
        runner.model.set_attn_implementation(previous)
    return scheduler.record, manager.current_batch, outputs


def test_preemptions_are_recorded_and_the_cache_restarts(runner):
    """With too few KV blocks transformers preempts (frees and requeues) requests: the record
    still has one step per forward pass, names each preemption, and a preempted request's cached
    tokens restart from 0; its last step leaves every token but the last in the cache."""
    prompts = [[5 + (i * 7 + j) % 50 for j in range(10 + i)] for i in range(4)]
    record, num_forwards, outputs = _tight_run(runner, prompts, max_new_tokens=30)
    assert len(record.steps) == num_forwards
    requests = [Request(i, f"p{i}", 30, tuple(p)) for i, p in enumerate(prompts)]
    ids = {f"r{i}": i for i in range(len(prompts))}
    schedule = transformers_scheduler.schedule_trace(
        record, new_request_records(requests), ids, record.steps[0].start_s
    )
    assert len(schedule.steps) == num_forwards
    preempted = [rid for step in schedule.steps for rid in step.preempted]
    assert preempted, "the tight cache should have forced a preemption"
    computed = dict.fromkeys(range(len(prompts)), 0)  # request id -> tokens in its KV cache
    for step in schedule.steps:
        for rid in step.preempted:
            computed[rid] = 0  # a soft reset: it is recomputed from scratch
        for s in step.seqs:
            assert s.num_cached_tokens == computed[s.request_id], (step.index, s)
            computed[s.request_id] += s.num_new_tokens
        lanes = [s.slot for s in step.seqs]
        assert len(set(lanes)) == len(lanes), f"step {step.index}: two requests in one lane"
    for rid, prompt in enumerate(prompts):
        assert schedule.request(rid).num_preemptions == preempted.count(rid)
        num_generated = len(outputs[f"r{rid}"].generated_tokens)
        assert computed[rid] == len(prompt) + num_generated - 1, (rid, computed, num_generated)


def test_block_sharing_hits_are_recorded_at_admission(runner):
    """With block sharing, a request whose prompt opens with a full page (256 tokens) another
    request computed starts with those tokens cached: its first step feeds only the rest."""
    opening = "a long shared opening, " * 13  # 299 byte tokens: one full 256-token page
    requests = make_requests([(opening + "one", 4), (opening + "two", 4)])
    trace = HFContinuousEngine(runner, EngineConfig(1), block_sharing=True).run(requests)
    schedule = trace.schedule
    assert schedule.info["prefix_caching"] is True
    assert [r.num_cached_tokens for r in schedule.requests] == [0, 256]
    first = next(s for step in schedule.steps for s in step.seqs if s.request_id == 1)
    assert (first.num_cached_tokens, first.num_prefix_cached_tokens) == (256, 256), first
    assert first.num_new_tokens == requests[1].num_prompt_tokens - 256, first
