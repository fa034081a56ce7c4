"""Iteration-level scheduling: slots refill on the step they free; static waves wait."""

import pytest
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import POLICIES, EngineConfig
from engine.serving.planners import Planner
from engine.serving.scheduler import Scheduler
from engine.trace import IDLE

SPECS = [("aa", 2), ("bbb", 6), ("c", 3), ("dddd", 4), ("ee", 1)]


def test_finished_slot_is_refilled_on_the_same_step():
    """The request that takes a freed slot prefills in the very next step."""
    requests = make_requests(SPECS)
    scheduler = Scheduler(requests, num_slots=2, eos_token_ids=frozenset())
    first = scheduler.schedule()
    assert [s.slot for s in first.admitted] == [0, 1]
    finished = scheduler.postprocess(first, [7, 7])
    assert finished == []
    finished = scheduler.postprocess(scheduler.schedule(), [7, 7])
    assert [s.request_id for s in finished] == [0], "request 0 (cap 2) finishes on step 2"
    step = scheduler.schedule()
    assert [(s.request_id, s.slot) for s in step.admitted] == [(2, 0)]
    assert step.seqs[0].request_id == 2, "slot 0 runs request 2 on the next step"
    assert step.num_new[0] == len("c"), "its whole prompt is prefilled in that step"


def test_continuous_trace_has_no_gap_in_a_slot():
    """In the continuous trace, a slot's next request prefills right after the previous ended."""
    trace = ContinuousEngine(tiny_runner(), EngineConfig(2)).run(make_requests(SPECS))
    last_step_of = {}
    for step in trace.steps:
        for s in step.seqs:
            if s.kind == "prefill":
                prev = last_step_of.get(s.slot)
                assert prev is None or prev == step.index - 1, (
                    f"slot {s.slot} idled before R{s.request_id}"
                )
            last_step_of[s.slot] = step.index


def test_static_wave_waits_for_its_longest_member():
    """A static wave lasts as long as its longest output; shorter rows idle until the barrier."""
    runner = tiny_runner()
    trace = StaticEngine(runner, EngineConfig(2)).run(make_requests(SPECS))
    for wave in {s.wave for s in trace.steps}:
        steps = [s for s in trace.steps if s.wave == wave]
        ids = {q.request_id for q in steps[0].seqs}
        longest = max(len(trace.request(i).output_token_ids) for i in ids)
        assert len(steps) == longest, f"wave {wave} ran {len(steps)} steps, longest is {longest}"
        for q in steps[-1].seqs:
            done_early = len(trace.request(q.request_id).output_token_ids) < longest
            assert (q.kind == IDLE) == done_early


def test_budget_serves_decodes_first_then_chunks_prefill():
    """decode_first: decodes take one token each, the prefill gets the rest as a chunk."""
    requests = make_requests([("ab", 5), ("c" * 10, 5)])
    scheduler = Scheduler(requests, 2, frozenset(), max_num_batched_tokens=4)
    step = scheduler.schedule()
    assert step.num_new == [2, 2], "first step: R0's 2-token prompt, then 2 of R1's 10"
    scheduler.postprocess(step, [9, 9])
    r0, r1 = step.seqs
    assert r0.output_token_ids == [9], "R0 finished its prefill and sampled"
    assert r1.output_token_ids == [] and r1.num_cached_tokens == 2, "R1 chunk only"
    assert scheduler.schedule().num_new == [1, 3], "R0 decodes first; R1's next chunk: 3"


def test_prefill_first_policy_serves_prefills_first():
    """prefill_first: a prefill chunk takes the budget before the decodes."""
    requests = make_requests([("ab", 5), ("c" * 10, 5)])
    scheduler = Scheduler(requests, 2, frozenset(), 4, policy="prefill_first")
    scheduler.postprocess(scheduler.schedule(), [9, 9])
    step = scheduler.schedule()
    assert dict(zip([s.request_id for s in step.seqs], step.num_new, strict=True)) == {1: 4}


@pytest.mark.parametrize("budget", [3, 5, 16])
@pytest.mark.parametrize("policy", ["decode_first", "prefill_first", "vllm"])
def test_budget_is_never_exceeded_and_chunked_equals_unchunked(budget, policy):
    """Every step stays within the budget, and chunked prefill gives the unchunked outputs."""
    runner = tiny_runner()
    requests = make_requests([("x" * 23, 6), ("hello world", 9), ("y" * 40, 4), ("z", 7)])
    plain = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    config = EngineConfig(3, max_num_batched_tokens=budget, scheduling_policy=policy)
    chunked = ContinuousEngine(runner, config).run(requests)
    for step in chunked.steps:
        assert sum(s.num_new_tokens for s in step.seqs) <= budget, f"step {step.index}"
    assert (
        any(
            s.kind == "prefill" and s.num_cached_tokens > 0 for st in chunked.steps for s in st.seqs
        )
        or budget >= 40
    ), "a prompt longer than the budget is prefilled in chunks"
    for a, b in zip(plain.requests, chunked.requests, strict=True):
        assert a.output_token_ids == b.output_token_ids, f"R{a.request_id} differs when chunked"


def test_budget_below_slot_count_is_refused():
    """A budget that cannot fit one decode per slot is a clear ValueError."""
    with pytest.raises(ValueError, match="at least the slot count"):
        EngineConfig(4, max_num_batched_tokens=3)


def _plan(step) -> dict[int, int]:
    return {s.request_id: n for s, n in zip(step.seqs, step.num_new, strict=True)}


def test_vllm_policy_serves_running_in_admission_order_then_admits_while_budget_is_left():
    """vllm: the running requests take the budget first, in admission order; a waiting request
    is admitted only while budget is left (decode_first would seat it with no tokens)."""
    requests = make_requests([("ab", 5), ("c" * 10, 5), ("d", 5)])
    scheduler = Scheduler(requests, 3, frozenset(), 4, policy="vllm")
    step = scheduler.schedule()
    assert [s.request_id for s in step.admitted] == [0, 1], "R2 waits: R0 and R1 used the budget"
    assert _plan(step) == {0: 2, 1: 2}
    scheduler.postprocess(step, [9, 9])
    step = scheduler.schedule()
    assert step.admitted == [], "R0 decodes (1), R1 chunks (3): no budget left for R2"
    assert _plan(step) == {0: 1, 1: 3}


def test_vllm_policy_preempts_the_last_running_and_admits_nobody_in_that_step():
    """vllm: when blocks run out, the last request of vLLM's running order is preempted and
    leaves it; no waiting request is admitted in that step."""
    requests = make_requests([("aaa", 9), ("bbb", 9)])
    scheduler = Scheduler(requests, 2, frozenset(), policy="vllm", num_kv_blocks=4, block_size=2)
    scheduler.postprocess(scheduler.schedule(), [7, 7])  # R0, R1: 2 blocks each for 3 tokens
    scheduler.postprocess(scheduler.schedule(), [7, 7])  # 4th tokens: still 2 blocks each
    step = scheduler.schedule()  # 5th tokens need a 3rd block each: R1, the last, goes
    assert step.admitted == [], "a step that preempts admits nobody"
    assert [s.request_id for s in step.preempted] == [1] and _plan(step) == {0: 1}
    assert [s.request_id for s in scheduler.planner.order] == [0], "R1 left vLLM's running order"
    assert scheduler.waiting[0].request_id == 1, "R1 waits first in line"


def test_vllm_policy_admits_only_when_the_whole_prompt_fits():
    """vllm: a waiting request needs blocks for its whole prompt, not only its first chunk
    (decode_first admits R1 here: its first chunk fits)."""
    requests = make_requests([("a" * 6, 2), ("b" * 9, 2)])
    options = {"num_kv_blocks": 7, "block_size": 2}
    vllm = Scheduler(requests, 2, frozenset(), 8, policy="vllm", **options)
    assert [s.request_id for s in vllm.schedule().admitted] == [0], "R1 needs 5 blocks, 4 free"
    ours = Scheduler(requests, 2, frozenset(), 8, **options)
    admitted = ours.schedule().admitted
    assert [s.request_id for s in admitted] == [0, 1], "decode_first checks the first chunk"


def test_vllm_policy_shares_prompt_blocks_within_one_step():
    """vllm: blocks are cached when allocated, so a request admitted after another in the same
    step starts from its prompt blocks (vLLM's allocate_slots -> cache_blocks)."""
    requests = make_requests([("abcdefgh1", 3), ("abcdefgh2", 3)])
    scheduler = Scheduler(
        requests, 2, frozenset(), policy="vllm", num_kv_blocks=8, block_size=4, prefix_caching=True
    )
    step = scheduler.schedule()
    n = requests[0].num_prompt_tokens
    assert _plan(step) == {0: n, 1: n - 8}, "R1 shares R0's two full blocks, computes the rest"
    tables = scheduler.block_manager.block_tables
    assert tables[0][:2] == tables[1][:2], "the first two blocks are shared"


def test_every_policy_has_a_planner_behind_one_interface():
    """Each policy the config accepts is planned by a ``Planner``, a class of its own."""
    planners = {
        policy: type(Scheduler([], 1, frozenset(), policy=policy).planner) for policy in POLICIES
    }
    not_planners = [p for p, cls in planners.items() if not issubclass(cls, Planner)]
    assert not not_planners, f"policies without a Planner: {not_planners}"
    assert len(set(planners.values())) == len(POLICIES), f"policies share a class: {planners}"
