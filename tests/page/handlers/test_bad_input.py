"""Engine-level bad input from issue 5, on the tiny model: tiny caps, 1,000 rows, long prompts."""

from __future__ import annotations

import gradio as gr
import pytest
from page_runs import run_and_render
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel, local_model
from engine.trace import PREFILL
from engine.worker.worker_model import WorkerModel
from engine.workloads.workload import MAX_PROMPT_CHARS, MAX_ROWS

SPECS = [("cap one", 1), ("a long one", 40), ("cap two", 2), ("another one", 1), ("mid", 9)]


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=3)


@pytest.fixture(scope="module")
def shared(runner) -> PageModel:
    return local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))


def _steps_of(trace, request_id: int) -> list:
    return [(step, s) for step in trace.steps for s in step.seqs if s.request_id == request_id]


def test_cap_one_finishes_right_after_its_prefill(runner):
    """A cap-1 request's only step is its prefill, its slot is refilled the next step."""
    requests = make_requests(SPECS)
    reference = ReferenceCache(runner).outputs(requests)
    trace = ContinuousEngine(runner, EngineConfig(num_slots=2)).run(requests)
    for rid in (0, 3):
        rec = trace.request(rid)
        steps = _steps_of(trace, rid)
        assert [s.kind for _, s in steps] == [PREFILL], f"R{rid} ran {len(steps)} steps"
        assert rec.output_token_ids == reference[rid] and len(rec.output_token_ids) == 1
        assert rec.first_token_s == rec.finish_s == steps[0][0].end_s, f"R{rid} finished late"
    prefill_step = _steps_of(trace, 0)[0][0]
    after = trace.steps[prefill_step.index + 1]
    assert any(s.slot == trace.request(0).slot for s in after.seqs), "R0's slot left idle"


def test_tiny_caps_mixed_with_long_ones_match_generate(runner):
    """Caps of 1 and 2 beside long caps: both engines equal model.generate, lengths at most cap."""
    requests = make_requests(SPECS)
    reference = ReferenceCache(runner).outputs(requests)
    for engine in (
        StaticEngine(runner, EngineConfig(2)),
        ContinuousEngine(runner, EngineConfig(3)),
    ):
        trace = engine.run(requests)
        for rec, request in zip(trace.requests, requests, strict=True):
            assert rec.output_token_ids == reference[rec.request_id], (
                f"{engine.name} R{rec.request_id}"
            )
            assert 1 <= len(rec.output_token_ids) <= request.max_new_tokens


def _run(shared, rows):
    options = RunOptions(check_reference=False)
    return run_and_render(rows, 2, options, shared)


def test_a_thousand_rows_are_refused_at_once(shared):
    """1,000 rows are refused with the stated limit, before any model call."""
    with pytest.raises(gr.Error, match=f"1000 requests is over the limit of {MAX_ROWS} per run"):
        _run(shared, [["hello", 2]] * 1000)


def test_twenty_thousand_character_prompt_follows_the_context_policy(shared):
    """20,000 characters pass the character limit and are refused by the context check."""
    prompt = "y" * MAX_PROMPT_CHARS  # the byte tokenizer gives 20,000 tokens, context is 512
    with pytest.raises(gr.Error, match="prompt .20000 tokens. \\+ max_new_tokens .3. exceeds"):
        _run(shared, [[prompt, 3]])
    with pytest.raises(gr.Error, match="20001 characters, over the limit of 20000"):
        _run(shared, [[prompt + "y", 3]])
    assert _run(shared, [["y" * 500, 3]]).state.continuous.requests[0].num_prompt_tokens == 500


@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
def test_more_slots_than_requests_runs_and_matches(runner, kv_mode):
    """Six slots for two requests: both engines run them at once, outputs equal generate."""
    requests = make_requests(SPECS[:2])
    reference = ReferenceCache(runner).outputs(requests)
    for engine in (
        StaticEngine(runner, EngineConfig(6)),
        ContinuousEngine(runner, EngineConfig(6, kv_mode=kv_mode)),
    ):
        trace = engine.run(requests)
        assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
        assert {s.request_id for s in trace.steps[0].seqs} == {0, 1}, "not run together"


def test_slot_count_zero_is_refused_with_the_same_message_everywhere(shared):
    """0 slots: the page (a gr.Error) and the engine config (a ValueError) say the same."""
    with pytest.raises(ValueError) as engine_error:
        EngineConfig(0)
    with pytest.raises(gr.Error) as page_error:
        run_and_render([["hi", 3]], 0, RunOptions(), shared)
    assert page_error.value.message == str(engine_error.value)
