"""The bench's server engines: ``--endpoint NAME=URL``, ``--engines ...,vllm``, and failures."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.bench import cli as bench
from tests.bench.workload_files import write_workload
from tests.live_servers import TransformersServe, free_port, needs_vllm

PER_ENGINE_KEYS = {"wall_s", "num_generated_tokens", "latency_percentiles", "reference_match"}


def test_unreachable_endpoint_keeps_the_other_engines(tmp_path, tiny_loaded, capsys):
    """A server that is not there fails alone: our engine's results stay, the exit code is 1."""
    out = tmp_path / "out.json"
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--workload", write_workload(tmp_path, [("hello", 4)]), "--engines", "continuous"]
    argv += ["--endpoint", f"gone={url}", "--json", str(out)]
    assert bench.main(argv) == 1
    engines = json.loads(out.read_text())["engines"]
    assert engines["continuous"]["reference_match"] is True
    assert "Cannot reach gone at" in engines["gone"]["error"], engines["gone"]
    assert "gone failed: Cannot reach" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--endpoint", "nourl"], "NAME=URL"),
        (["--endpoint", "continuous=http://h:1"], "built-in engine"),
        (["--engines", "continuous,typo"], "Unknown engine 'typo'"),
        (["--endpoint", "a=http://h:1", "--endpoint-record", "b=http://h:2"], "no endpoint is"),
        (["--endpoint", "a=http://h:1", "--endpoint-record", "a=h:2"], "http:// or https://"),
    ],
)
def test_bad_server_flags_are_refused(argv, words, tiny_loaded, capsys):
    """A bad --endpoint or --endpoint-record, or engine name, stops the bench before any run,
    saying why."""
    assert bench.main(argv) == 2
    assert words in capsys.readouterr().err


def test_vllm_without_its_environment_says_make_vllm(tiny_loaded, monkeypatch, capsys):
    """--engines vllm with no .venv-vllm is refused at once, naming `make vllm`."""
    monkeypatch.setenv("CBP_VLLM_VENV", "/nonexistent/venv")
    assert bench.main(["--engines", "vllm"]) == 2
    assert "make vllm" in capsys.readouterr().err


def test_vllm_eager_alone_is_warned_about(tmp_path, tiny_loaded, capsys):
    """--vllm-eager without the vllm engine is ignored with a warning."""
    argv = ["--workload", write_workload(tmp_path, [("hi", 2)]), "--engines", "continuous"]
    assert bench.main([*argv, "--vllm-eager"]) == 0
    assert "--vllm-eager is ignored" in capsys.readouterr().err


@pytest.mark.real_model
def test_endpoint_has_every_engine_field_plus_server(tmp_path, embedded_model, monkeypatch):
    """An endpoint's JSON entry has the fields of ours plus `server`, and matches the reference."""
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: embedded_model)
    server = TransformersServe(embedded_model.source).start()
    out = tmp_path / "out.json"
    rows = [("The capital of France is", 8), ("1, 2, 3,", 6)]
    argv = ["--workload", write_workload(tmp_path, rows)]
    argv += ["--engines", "continuous", "--endpoint", f"hf_serve={server.url}", "--json", str(out)]
    try:
        assert bench.main(argv) == 0
    finally:
        server.stop()
    engines = json.loads(out.read_text())["engines"]
    ours, theirs = engines["continuous"], engines["hf_serve"]
    assert set(theirs) == set(ours) | {"server"}, set(theirs) ^ set(ours)
    assert theirs["reference_match"] is True and theirs["num_steps"] == 0
    assert theirs["server"]["url"] == server.url and theirs["server"]["warnings"] == []


@needs_vllm
@pytest.mark.real_model
def test_bench_runs_vllm_beside_ours(tmp_path, embedded_model, monkeypatch, capsys):
    """`--engines continuous,vllm` on the seed: both match the reference, vLLM's steps are counted
    from its own record, vLLM ran with our settings and its first step held until all six
    requests arrived, so every step plans as ours; the server is stopped."""
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: embedded_model)
    out = tmp_path / "out.json"
    argv = ["--workload", "seed", "--slots", "3", "--engines", "continuous,vllm", "--vllm-eager"]
    assert bench.main([*argv, "--json", str(out)]) == 0, capsys.readouterr().err[-3000:]
    report = capsys.readouterr().out
    assert "steps in vLLM's own record" in report, "no line on vLLM's steps"
    assert "schedule: continuous 300 steps, vllm 300; 100.0 % of steps plan alike" in report, report
    engines = json.loads(out.read_text())["engines"]
    comparison = engines["vllm"]["schedule_comparison"]
    assert comparison["equal_step_fraction"] == 1.0, comparison["first_difference"]
    assert comparison["ours"] == comparison["vllm"], "admissions or preemptions differ"
    schedule = engines["vllm"]["server"]["schedule"]
    assert engines["vllm"]["num_steps"] == schedule["num_steps"] > 0, schedule
    assert schedule["record_cost_pct"] <= 2, schedule
    assert PER_ENGINE_KEYS <= set(engines["vllm"])
    assert engines["vllm"]["reference_match"] is True, engines["vllm"].get("mismatches")
    server = engines["vllm"]["server"]
    settings = server["settings"]
    assert (settings["max_num_seqs"], settings["mode"], settings["prefix_caching"]) == (
        3,
        "eager",
        False,
    ), settings
    assert server["version"] and server["samples"], "no version or no /metrics samples"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server['url']}/health", timeout=2)  # the bench stopped its server
