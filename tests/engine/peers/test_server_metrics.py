"""Prometheus parsing for the server samples: known gauges by this project's names and units."""

from __future__ import annotations

import http.server
import threading
import time

from engine.peers.server_metrics import (
    MetricsSampler,
    kv_pool,
    parse_prometheus,
    project_values,
    slots_kv_pct,
)
from engine.trace import Trace

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 4.0
python_gc_objects_collected_total{generation="0"} 123.0
broken line without a value
weird{label="a } b"} 7 1712345678
nan_metric NaN
"""


def test_labelled_series_are_summed():
    """Series of one metric with different labels add up; junk lines and NaN are skipped."""
    metrics = parse_prometheus(VLLM_TEXT)
    assert metrics["vllm:num_requests_running"] == 3.0
    assert metrics["weird"] == 7.0, "a '}' inside a label value or a timestamp broke parsing"
    assert "nan_metric" not in metrics
    assert "broken" not in metrics


def test_vllm_gauges_in_project_units():
    """vLLM's KV usage is a fraction; the sample holds it as a percentage."""
    values = project_values(parse_prometheus(VLLM_TEXT))
    assert values == {
        "num_requests_running": 3.0,
        "num_requests_waiting": 4.0,
        "kv_cache_usage_pct": 25.0,
    }


def test_other_servers_and_absent_gauges():
    """SGLang's names map too; a server without a gauge lacks that value (never a zero)."""
    text = "sglang:num_running_reqs 5\nsglang:num_queue_reqs 0\n"
    assert project_values(parse_prometheus(text)) == {
        "num_requests_running": 5.0,
        "num_requests_waiting": 0.0,
    }
    assert project_values(parse_prometheus("process_cpu_seconds_total 1.5\n")) == {}


def test_kv_pool_says_what_the_kv_gauge_is_a_share_of():
    """vLLM's KV use is of its block pool, whose size its cache_config_info labels give; SGLang's
    of its token pool, size unknown; a server without a KV gauge has no pool to tell."""
    info = 'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="1310"} 1.0\n'
    pool = kv_pool(VLLM_TEXT + info)
    assert pool == {
        "gauge": "vllm:kv_cache_usage_perc",
        "whole": "every block of vLLM's KV block pool",
        "num_blocks": 1310,
        "block_size": 16,
    }
    assert "num_blocks" not in kv_pool(VLLM_TEXT), "a pool size was invented"
    assert kv_pool("sglang:token_usage 0.5\n")["whole"] == "every token of SGLang's KV token pool"
    assert kv_pool("sglang:num_running_reqs 5\n") == {}


def test_llamacpp_kv_use_from_its_slots():
    """llama.cpp's /slots: the processing slots' prompt and decoded tokens over every slot's
    context; an idle slot's leftover prompt is not in use; the pool is the slots and each one's
    context; no slots, no value."""

    def slot(processing: bool, prompt: int, decoded: int) -> dict:
        next_token = [{"n_decoded": decoded, "n_remain": 3}]
        return {"n_ctx": 100, "is_processing": processing, "n_prompt_tokens": prompt,
                "next_token": next_token}  # fmt: skip

    pct, pool = slots_kv_pct(
        [slot(True, 20, 5), slot(False, 40, 9), slot(True, 10, 0), {"n_ctx": 100}]
    )
    assert pct == 100.0 * 35 / 400, pct
    assert pool == {
        "gauge": "llamacpp /slots",
        "whole": "every slot's context in llama.cpp's KV cache, from /slots",
        "num_slots": 4,
        "slot_tokens": 100,
    }, pool
    assert slots_kv_pct([]) is None


def test_the_sampler_keeps_the_pool_from_its_first_reading():
    """A sampler on a server's /metrics keeps what its KV use is a share of, with the samples."""
    text = VLLM_TEXT + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="8"} 1.0\n'

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        trace = Trace(engine="server", num_slots=1)
        with MetricsSampler(url, time.perf_counter(), trace, period_s=0.01) as sampler:
            deadline = time.monotonic() + 10
            while not trace.server_samples and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        server.shutdown()
    assert trace.server_samples and sampler.kv_pool["num_blocks"] == 8, sampler.kv_pool
