"""Our schedule beside vLLM's: plans step by step, the first difference and why, and the tallies,
on hand-built traces; and ours on a deployment's settings, from its start line."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.peers.schedule_comparison import (
    DeploymentSettings,
    compare_schedules,
    followed_config,
    step_plans,
    tally,
)
from engine.trace import DECODE, PREFILL, ScheduledSeq, StepRecord, Trace


def _trace(plans, preempted=None, hits=None, name="x") -> Trace:
    """A trace whose step i runs ``plans[i]`` ({request id: tokens}); ``preempted``: step index ->
    request ids preempted for it; ``hits``: request id -> prefix-cached tokens."""
    preempted, hits = preempted or {}, hits or {}
    steps = []
    for i, plan in enumerate(plans):
        seqs = [
            ScheduledSeq(rid, slot, PREFILL if n > 1 else DECODE, n, 0, 0, hits.get(rid, 0))
            for slot, (rid, n) in enumerate(plan.items())
        ]
        steps.append(StepRecord(i, i, i + 1, seqs, preempted=list(preempted.get(i, []))))
    return Trace(engine=name, num_slots=3, steps=steps)


SEED = [{0: 9, 1: 7}, {0: 1, 1: 1}, {0: 1, 1: 1, 2: 12}, {1: 1, 2: 1}]


def test_equal_schedules_have_no_difference():
    """The same plans at every step: fraction 1, no first difference, equal counts."""
    result = compare_schedules(_trace(SEED), _trace(SEED))
    assert result["equal_step_fraction"] == 1.0, result
    assert result["first_difference"] is None, result
    assert (result["num_steps_ours"], result["num_steps_vllm"]) == (4, 4)
    assert result["ours"] == result["vllm"], "equal schedules tallied differently"


def test_a_late_admission_is_the_first_difference():
    """vLLM admits R2 one step later: step 2 differs first, and the reason names R2 and both
    token counts; plans at equal indices after it still count."""
    theirs = [{0: 9, 1: 7}, {0: 1, 1: 1}, {0: 1, 1: 1}, {1: 1, 2: 1}]
    result = compare_schedules(_trace(SEED), _trace(theirs))
    assert result["first_difference"]["step"] == 2, result
    assert result["first_difference"]["reason"] == "vLLM does not run R2 (ours: 12 tokens)"
    assert result["equal_step_fraction"] == 3 / 4, result


def test_unequal_token_counts_and_extra_requests_are_named():
    """A chunk of another size and a request only vLLM runs both appear in the reason."""
    ours, theirs = [{0: 5}], [{0: 8, 3: 2}]
    reason = compare_schedules(_trace(ours), _trace(theirs))["first_difference"]["reason"]
    assert reason == "R0: ours 5 tokens, vLLM 8; vLLM runs R3 (2 tokens), ours does not", reason


def test_a_longer_schedule_differs_where_the_shorter_ends():
    """vLLM takes two more steps: the first difference is where ours ended, and the fraction is
    out of the longer schedule."""
    theirs = [*SEED, {2: 1}, {2: 1}]
    result = compare_schedules(_trace(SEED), _trace(theirs))
    assert result["first_difference"] == {
        "step": 4,
        "reason": "vLLM takes 2 more steps (the other ends here)",
    }, result
    assert result["equal_step_fraction"] == 4 / 6, result


def test_a_preemption_is_said_where_plans_differ():
    """A step where vLLM preempts: the reason says so beside the plan's difference."""
    ours, theirs = [{0: 1, 1: 1}], [{0: 1}]
    result = compare_schedules(_trace(ours), _trace(theirs, preempted={0: [1]}))
    assert result["first_difference"]["reason"] == (
        "vLLM does not run R1 (ours: 1 token); vLLM preempts R1 here"
    ), result


def test_empty_schedules_are_equal():
    """Two schedules without steps: fraction 1, nothing differs (no division by zero)."""
    result = compare_schedules(_trace([]), _trace([]))
    assert (result["equal_step_fraction"], result["first_difference"]) == (1.0, None)


def test_tally_counts_readmissions_and_prefix_hits():
    """A request preempted and run again is admitted twice; one skipped for a step is not;
    prefix-cache hits count per admission."""
    plans = [{0: 32, 1: 32}, {0: 1}, {0: 1, 1: 1}, {0: 1}, {1: 20}]
    trace = _trace(plans, preempted={3: [1]}, hits={1: 16})
    counts = tally(trace)
    assert (counts.num_admissions, counts.num_preemptions) == (3, 1), counts
    assert (counts.num_prefix_hits, counts.num_prefix_cached_tokens) == (2, 32), counts
    assert step_plans(trace)[2] == {0: 1, 1: 1}


# A recording vLLM's start line, as tests/engine/peers/vllm_schedule.jsonl has it.
START = {
    "event": "start",
    "max_num_seqs": 3,
    "max_num_batched_tokens": 384,
    "chunked_prefill": True,
    "async_scheduling": False,
    "prefix_caching": True,
    "block_size": 32,
    "num_blocks": 6,
}


def test_ours_takes_the_deployments_settings():
    """Slots, token budget, block size and prefix caching come from the start line, and the KV
    budget holds exactly its blocks less vLLM's null block, whatever a token's KV size."""
    ours = EngineConfig(8, kv_mode="paged", block_size=16, scheduling_policy="vllm")
    for per_token in (46080, 23040, 12345, 7):
        config, notes = followed_config(DeploymentSettings.from_start(START), ours, per_token)
        assert notes == [], notes
        fields = (config.num_slots, config.max_num_batched_tokens, config.block_size)
        assert fields == (3, 384, 32), fields
        assert config.prefix_caching is True and config.scheduling_policy == "vllm", config
        blocks = int(config.kv_budget_mib * 2**20 // (per_token * 32))
        assert blocks == 5, f"{per_token} B/token: the budget holds {blocks} blocks, not 5"


def test_settings_ours_cannot_follow_are_named():
    """Chunked prefill off, async scheduling and a per-slot KV cache are each named in a line;
    a start line without the scheduler's settings is refused."""
    start = {**START, "chunked_prefill": False, "async_scheduling": True}
    config, notes = followed_config(DeploymentSettings.from_start(start), EngineConfig(2), 4)
    assert (config.num_slots, config.kv_mode, config.prefix_caching) == (3, "slots", False)
    text = " | ".join(notes)
    for words in ("chunked prefill", "async scheduling", "5 blocks of 32", "prefix caching"):
        assert words in text, f"no line on {words!r}: {text}"
    with pytest.raises(ValueError, match="lacks the scheduler's settings"):
        DeploymentSettings.from_start({"event": "start", "max_num_seqs": 3})


def test_the_start_lines_dtype_is_read_where_a_record_has_it():
    """A record's start line names the model's dtype as the server runs it; an older record
    without it reads as unknown, and the description says the dtype only where known."""
    settings = DeploymentSettings.from_start({**START, "dtype": "bfloat16"})
    assert settings.dtype == "bfloat16"
    assert settings.describe().endswith("prefix caching on, bfloat16"), settings.describe()
    older = DeploymentSettings.from_start(START)
    assert older.dtype is None and older.describe().endswith("prefix caching on")
