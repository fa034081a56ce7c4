"""The ``llamacpp`` and ``llamacpp_q4`` engines against a real ``llama-server`` (skipped without
``make llamacpp``'s build)."""

from __future__ import annotations

import os

import pytest

from engine.fidelity.divergence import MATCH, NEAR_TIE
from engine.fidelity.reference import ReferenceCache
from engine.llamacpp.engines import QUANTIZED_NOTE
from engine.llamacpp.gguf_file import weights_key
from engine.model.loader import cache_dir
from engine.model.model_runner import ModelRunner
from tests.engine.llamacpp.conftest import NUM_SLOTS, short_requests
from tests.live_servers import needs_llamacpp

pytestmark = [needs_llamacpp, pytest.mark.real_model]


@pytest.fixture(scope="module")
def f32_trace(llamacpp, embedded_model):
    return llamacpp.run(short_requests(embedded_model))


def test_f32_outputs_equal_the_reference_up_to_near_ties(f32_trace, embedded_model):
    """llama.cpp on the F32 GGUF gives the reference's greedy tokens, or a near-tie rounding
    explains where it leaves them."""
    requests = short_requests(embedded_model)
    verdicts = ReferenceCache(ModelRunner(embedded_model)).verdicts(requests, f32_trace)
    assert len(verdicts) == len(requests), f"verdicts for {sorted(verdicts)} only"
    for rid, verdict in verdicts.items():
        rec = f32_trace.request(rid)
        assert rec.output_token_ids, f"R{rid}: no output"
        assert verdict.verdict in (MATCH, NEAR_TIE), (
            f"R{rid}: {verdict.verdict} ({verdict.reason}); output {rec.output_text!r}"
        )
    assert "differences_expected" not in f32_trace.info, "the F32 engine is labelled quantized"


def test_f32_file_is_the_cached_weights(llamacpp, embedded_model):
    """The F32 GGUF sits in the model cache, named by the hash of the weights it came from."""
    path = llamacpp.server.settings.model_path
    assert os.path.dirname(path) == str(cache_dir()), f"{path} is not in the model cache"
    assert weights_key(embedded_model.source) in os.path.basename(path), path


def test_trace_reports_the_server_settings(f32_trace, embedded_model):
    """The trace names the weights, slots (--parallel), the context per slot (the longest
    request) and the threads (every CPU), and the prompts went as token ids."""
    server = f32_trace.info["server"]
    settings = server["settings"]
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in short_requests(embedded_model))
    assert (settings["weights"], settings["num_slots"]) == ("f32", NUM_SLOTS)
    assert settings["ctx_per_slot"] == longest, settings
    assert settings["cpus"] == f"0-{os.cpu_count() - 1}", settings
    assert (server["prompt_format"], server["output_token_ids"]) == ("token_ids", "server"), server
    assert server["same_model"] is True, server
    assert f32_trace.warnings == [], f32_trace.warnings


def test_metrics_are_sampled(f32_trace):
    """The server's /metrics (--metrics) is read during the run: running and waiting requests
    under this project's names, never more running than the slots."""
    samples = f32_trace.server_samples
    assert samples, f"no /metrics sample: {f32_trace.info['server'].get('metrics_note')}"
    for sample in samples:
        assert {"num_requests_running", "num_requests_waiting"} <= set(sample.values), sample
        assert 0 <= sample.values["num_requests_running"] <= NUM_SLOTS, sample


def test_q4_runs_and_is_labelled(llamacpp_q4, embedded_model):
    """The shipped Q4_1 file serves every request up to its cap, and its trace says that its
    differences are expected (quantized weights), whatever the verdicts."""
    requests = short_requests(embedded_model)
    trace = llamacpp_q4.run(requests)
    for request in requests:
        rec = trace.request(request.request_id)
        assert 0 < len(rec.output_token_ids) <= request.max_new_tokens, rec.output_token_ids
    assert trace.info["weights"] == "q4_1"
    assert trace.info["differences_expected"] == QUANTIZED_NOTE
