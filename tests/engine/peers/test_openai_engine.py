"""The OpenAI-compatible engine against a real ``transformers serve`` with the embedded model."""

from __future__ import annotations

import dataclasses
import time

import pytest

from engine.fidelity.reference import ReferenceCache, not_compared_ids
from engine.model.model_runner import ModelRunner
from engine.peers.endpoints import Endpoint, EndpointError
from engine.peers.openai_engine import OpenAIEngine
from engine.sampling_params import SamplingParams
from engine.serving.run_control import RunCancelled
from engine.workloads.workload import RequestSpec, tokenize_requests
from tests.live_servers import TransformersServe, free_port
from tests.tiny_model import tiny_runner

# Chat prompts: short answers end at EOS (the text-only path must add it back), long ones at the cap
SPECS = [
    RequestSpec("What is 2+2? Answer with one number.", 24),
    RequestSpec("Write a long poem about the sea.", 12, arrival_s=0.3),
    RequestSpec("Name one colour.", 16, arrival_s=0.6),
]


@pytest.fixture(scope="module")
def requests(embedded_model):
    tokenizer, context = embedded_model.tokenizer, embedded_model.max_context
    return tokenize_requests(SPECS, tokenizer, chat_template=True, max_context=context)


@pytest.fixture(scope="module")
def reference(embedded_model, requests):
    return ReferenceCache(ModelRunner(embedded_model)).outputs(requests)


@pytest.fixture(scope="module")
def trace(serve, embedded_model, requests):
    return OpenAIEngine(Endpoint("hf_serve", serve.url), embedded_model, 3).run(requests)


@pytest.mark.real_model
def test_outputs_equal_generate_token_for_token(trace, reference):
    """Greedy outputs through transformers serve equal per-request model.generate."""
    for rec in trace.requests:
        assert rec.output_token_ids == reference[rec.request_id], f"R{rec.request_id} differs"
    assert any(r.finish_reason == "eos" for r in trace.requests), "no request ended at EOS"
    assert any(r.finish_reason == "length" for r in trace.requests), "no request hit its cap"


@pytest.mark.real_model
def test_probe_found_a_text_only_server(trace):
    """transformers serve takes text and returns text: the trace says so; the model is ours."""
    server = trace.info["server"]
    assert (server["prompt_format"], server["output_token_ids"]) == ("text", "retokenized")
    assert trace.warnings == [], f"unexpected warnings: {trace.warnings}"
    assert trace.steps == [], "a server engine sees no steps"


@pytest.mark.real_model
def test_times_are_on_the_client_clock(trace, requests):
    """Each request is sent at its arrival; sent <= first token <= each token <= finish."""
    for request, rec in zip(requests, trace.requests, strict=True):
        assert request.arrival_s <= rec.admit_s < request.arrival_s + 1.0, "sent late or early"
        assert rec.admit_s <= rec.first_token_s <= rec.finish_s
        assert rec.token_times_s == sorted(rec.token_times_s), "token times go back"
        assert rec.token_times_s[0] == rec.first_token_s and rec.token_times_s[-1] == rec.finish_s
    assert trace.wall_s == max(r.finish_s for r in trace.requests)
    assert trace.metrics().mean_ttft_s > 0


@pytest.mark.real_model
def test_sampled_requests_reach_the_server_and_are_not_compared(serve, embedded_model, requests):
    """A sampled request is sent with its settings and runs; its record is not comparable (the
    server's random stream is its own), a greedy one beside it still is; the trace warns that
    transformers serve takes no top_k."""
    sampled = dataclasses.replace(requests[0], sampling=SamplingParams(0.8, 20, 0.9, seed=7))
    greedy = dataclasses.replace(requests[2], request_id=1, arrival_s=0.0)
    engine = OpenAIEngine(Endpoint("hf_serve", serve.url), embedded_model, 3)
    trace = engine.run([dataclasses.replace(sampled, arrival_s=0.0), greedy])
    assert [r.comparable for r in trace.requests] == [False, True], "comparable flags"
    assert 1 <= len(trace.requests[0].output_token_ids) <= sampled.max_new_tokens
    assert not_compared_ids(trace) == [0], not_compared_ids(trace)
    assert any("does not take top_k" in w for w in trace.warnings), trace.warnings


@pytest.mark.real_model
def test_another_model_is_warned_about(serve, embedded_model, requests):
    """When the served model is not the loaded one, the trace warns the comparison is void."""
    other = dataclasses.replace(embedded_model, name="Other-1B", source="/models/other-1b")
    trace = OpenAIEngine(Endpoint("hf_serve", serve.url), other, 3).run(requests[:1])
    assert len(trace.warnings) == 1 and "cannot be compared" in trace.warnings[0], trace.warnings


@pytest.mark.real_model
def test_stop_cancels_the_streams(serve, embedded_model):
    """on_wait raising ends the run at once; the server is left free to serve the next run."""
    specs = [RequestSpec("Tell me a very long story about a dragon.", 2000)]
    context = embedded_model.max_context
    long = tokenize_requests(
        specs, embedded_model.tokenizer, chat_template=True, max_context=context
    )
    engine = OpenAIEngine(Endpoint("hf_serve", serve.url), embedded_model, 3)
    seen = {}

    def stop_after_first_token(trace):
        if trace.requests[0].first_token_s is not None:
            seen.setdefault("t", time.perf_counter())
            raise RunCancelled("stopped by the test")

    with pytest.raises(RunCancelled):
        engine.run(long, on_wait=stop_after_first_token)
    assert time.perf_counter() - seen["t"] < 5.0, "cancelling the streams took too long"
    after = engine.run([dataclasses.replace(long[0], max_new_tokens=3)])
    assert len(after.requests[0].output_token_ids) == 3, "the server did not serve the next run"


@pytest.mark.real_model
def test_server_killed_mid_run(embedded_model):
    """A server that dies mid-run raises EndpointError saying so, with the partial trace."""
    specs = [RequestSpec("Tell me a very long story about a dragon.", 2000)] * 2
    context = embedded_model.max_context
    long = tokenize_requests(
        specs, embedded_model.tokenizer, chat_template=True, max_context=context
    )
    server = TransformersServe(embedded_model.source).start()
    engine = OpenAIEngine(Endpoint("doomed", server.url), embedded_model, 3)

    def kill_after_first_token(trace):
        if any(r.first_token_s is not None for r in trace.requests):
            server.kill()

    try:
        with pytest.raises(EndpointError, match="doomed") as info:
            engine.run(long, on_wait=kill_after_first_token)
    finally:
        server.stop()
    message = str(info.value)
    assert "died" in message or "Cannot reach" in message, message
    assert info.value.trace is not None and info.value.trace.engine == "doomed"
    assert any(r.first_token_s is not None for r in info.value.trace.requests)


def test_unreachable_server_is_named():
    """Nothing listening: EndpointError naming the endpoint and its URL, before any run."""
    url = f"http://127.0.0.1:{free_port()}"
    engine = OpenAIEngine(Endpoint("gone", url), tiny_runner().loaded, 2)
    with pytest.raises(EndpointError, match="Cannot reach gone at " + url) as info:
        engine.run([])
    assert info.value.trace is None
