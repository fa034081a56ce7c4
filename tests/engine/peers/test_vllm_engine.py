"""The ``vllm`` engine against a real vLLM server from ``.venv-vllm`` (skipped without it)."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest

from engine.fidelity.reference import ReferenceCache
from engine.model.model_runner import ModelRunner
from engine.peers.endpoints import EndpointError
from engine.peers.server_metrics import parse_prometheus
from engine.peers.vllm_server import VllmServer, VllmSettings
from engine.serving.run_control import RunCancelled
from engine.workloads.workload import RequestSpec, seed_specs, tokenize_requests
from tests.engine.peers.conftest import on_page_cpu
from tests.live_servers import needs_vllm

pytestmark = [needs_vllm, pytest.mark.real_model]
NUM_SLOTS = 3  # the slots of the ``vllm`` fixture (tests/engine/peers/conftest.py), one a session
# How long after vLLM's record has a first token the client may see it: the stream's way through
# vLLM's API process and our client. Usually tens of milliseconds; seconds for one request on a
# busy 2-core CPU, since the client's stream thread runs at the page's server nice
# (CBP_SERVER_NICE) and the first request opens the connection. The defect this guards against
# put every first token at the run's end: a mean lag of most of the run's wall time.
CLIENT_LAG_BOUND_S = 3.0  # the mean over the run's requests
CLIENT_LAG_SHARE = 0.5  # any one request's, as a share of the run's wall time


def _requests(loaded, specs, chat_template=False):
    context = loaded.max_context
    return tokenize_requests(
        specs, loaded.tokenizer, chat_template=chat_template, max_context=context
    )


@pytest.fixture(scope="module")
def seed_trace(vllm, embedded_model):
    """The seed on the session's vLLM, played from a thread on the page's CPU, as the page does."""
    return on_page_cpu(lambda: vllm.run(_requests(embedded_model, seed_specs())))


def test_float32_outputs_equal_generate(seed_trace, embedded_model):
    """vLLM's greedy float32 outputs on the seed equal per-request model.generate."""
    requests = _requests(embedded_model, seed_specs())
    reference = ReferenceCache(ModelRunner(embedded_model)).outputs(requests)
    for rec in seed_trace.requests:
        assert rec.output_token_ids == reference[rec.request_id], f"R{rec.request_id} differs"


def test_client_first_token_follows_vllms_record(seed_trace):
    """Per request, the client sees its first token after vLLM scheduled its first decode (the
    step after the one that computed that token); the lag's mean is within CLIENT_LAG_BOUND_S and
    each one within CLIENT_LAG_SHARE of the run's wall time."""
    inside = seed_trace.schedule
    assert inside is not None, f"no record of vLLM's own steps: {seed_trace.warnings}"
    lags_s = {}
    for outside in seed_trace.requests:
        rid = outside.request_id
        first_decode_s = next(
            (
                step.start_s
                for step in inside.steps
                for s in step.seqs
                if s.request_id == rid and s.kind == "decode"
            ),
            None,
        )
        assert first_decode_s is not None, f"R{rid}: vLLM's record has no decode step for it"
        lags_s[rid] = lag_s = outside.first_token_s - first_decode_s
        assert lag_s >= 0, (
            f"R{rid}: the client saw its first token {-lag_s:.3f} s before vLLM scheduled its "
            "first decode: the two clocks disagree"
        )
    said = ", ".join(f"R{rid} {lag_s:.2f} s" for rid, lag_s in lags_s.items())
    said += f" (the run took {seed_trace.wall_s:.2f} s): the stream reached the client late"
    assert sum(lags_s.values()) / len(lags_s) <= CLIENT_LAG_BOUND_S, f"mean lag over bound: {said}"
    assert max(lags_s.values()) <= CLIENT_LAG_SHARE * seed_trace.wall_s, f"a lag too long: {said}"


def test_trace_reports_the_server(seed_trace):
    """Token ids both ways, the version and the settings that ran are in the trace."""
    server = seed_trace.info["server"]
    assert (server["prompt_format"], server["output_token_ids"]) == ("token_ids", "server")
    assert server["version"] and server["version"][0].isdigit(), server["version"]
    settings = server["settings"]
    assert (settings["max_num_seqs"], settings["dtype"], settings["mode"]) == (
        3,
        "float32",
        "eager",
    )
    assert settings["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    # a client on a busy host may send or read late, and says so: no other line
    late = ("client sent", "client read")  # openai_engine.late_sends, vllm_engine.late_reads
    warnings = [w for w in seed_trace.warnings if not any(word in w for word in late)]
    assert warnings == [], seed_trace.warnings


def test_server_samples_show_the_batch(seed_trace):
    """/metrics samples: running requests reach 1..slots, KV use is a percentage."""
    samples = seed_trace.server_samples
    assert len(samples) >= 3, "fewer than three /metrics samples in a multi-second run"
    running = [s.values["num_requests_running"] for s in samples]
    assert 1 <= max(running) <= NUM_SLOTS, f"running requests {max(running)} outside 1..3"
    assert all(0 <= s.values["kv_cache_usage_pct"] <= 100 for s in samples)
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples)


def test_too_long_request_is_refused(vllm, embedded_model):
    """A prompt past --max-model-len is refused (HTTP 400) with the server's reason."""
    long_prompt = "word " * 2100
    requests = _requests(embedded_model, [RequestSpec("Hi", 4), RequestSpec(long_prompt, 4)])
    with pytest.raises(EndpointError, match=r"vllm refused Request R1 .*HTTP 400") as info:
        vllm.run(requests)
    assert info.value.trace is not None and info.value.trace.engine == "vllm"


def test_stop_frees_the_server(vllm, embedded_model):
    """Cancelled streams are dropped by vLLM: no request is left running on it."""
    requests = _requests(embedded_model, [RequestSpec("Tell me a long story.", 1500)] * 2, True)

    def stop_after_first_token(trace):
        if any(r.first_token_s is not None for r in trace.requests):
            raise RunCancelled("stopped by the test")

    with pytest.raises(RunCancelled):
        vllm.run(requests, on_wait=stop_after_first_token)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = parse_prometheus(httpx.get(f"{vllm.server.url}/metrics").text)
        if metrics["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.2)
    assert metrics["vllm:num_requests_running"] == 0, "vLLM still runs the cancelled requests"
    short = [dataclasses.replace(requests[0], max_new_tokens=3)]
    assert len(vllm.run(short).requests[0].output_token_ids) == 3


def test_another_model_gets_text_both_ways(vllm, embedded_model):
    """Serving another model than the loaded one: a warning, and prompts and outputs as text
    (token ids of our tokenizer would be other words to the server's)."""
    from engine.peers.openai_engine import OpenAIEngine

    other = dataclasses.replace(embedded_model, name="Other-1B", source="/models/other-1b")
    engine = OpenAIEngine(vllm.server.endpoint("other"), other, NUM_SLOTS)
    trace = engine.run(_requests(embedded_model, [RequestSpec("The capital of France is", 4)]))
    server = trace.info["server"]
    assert (server["prompt_format"], server["output_token_ids"]) == ("text", "retokenized")
    assert server["same_model"] is False and "cannot be compared" in trace.warnings[0]
    assert trace.requests[0].output_text.strip(), "no output text from the server"


def test_failed_start_shows_the_log():
    """A server that cannot start raises EndpointError with vLLM's own words."""
    settings = VllmSettings("/nonexistent/model-folder", "float32", 1, enforce_eager=True)
    server = VllmServer(settings)
    with pytest.raises(EndpointError, match="vLLM exited with code") as info:
        server.start(timeout_s=600)
    assert "nonexistent" in str(info.value), "the log tail does not name the bad folder"
    assert not server.running
