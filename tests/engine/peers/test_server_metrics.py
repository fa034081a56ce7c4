"""Prometheus parsing for the server samples: known gauges by this project's names and units."""

from __future__ import annotations

from engine.peers.server_metrics import parse_prometheus, project_values

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
