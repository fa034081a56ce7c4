"""Iteration-level scheduling: slots refill on the step they free; static waves wait."""

from tiny_model import make_requests, tiny_runner

from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.scheduler import Scheduler
from engine.static import StaticEngine
from engine.trace import IDLE

SPECS = [("aa", 2), ("bbb", 6), ("c", 3), ("dddd", 4), ("ee", 1)]


def test_finished_slot_is_refilled_on_the_same_step():
    """The request that takes a freed slot prefills in the very next step."""
    requests = make_requests(SPECS)
    scheduler = Scheduler(requests, num_slots=2, eos_token_ids=frozenset())
    first = scheduler.admit()
    assert [s.slot for s in first] == [0, 1]
    seqs = scheduler.schedule()
    finished = scheduler.postprocess(seqs, [7, 7])
    assert finished == []
    finished = scheduler.postprocess(scheduler.schedule(), [7, 7])
    assert [s.request_id for s in finished] == [0], "request 0 (cap 2) finishes on step 2"
    admitted = scheduler.admit()
    assert [(s.request_id, s.slot) for s in admitted] == [(2, 0)]
    assert scheduler.schedule()[0].request_id == 2, "slot 0 runs request 2 on the next step"


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
