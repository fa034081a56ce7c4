"""The bench's llama.cpp engines: ``--engines ...,llamacpp,llamacpp_q4`` against a real
``llama-server`` (skipped without ``make llamacpp``'s build), and its absence."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.bench import cli as bench
from tests.bench.workload_files import write_workload
from tests.live_servers import needs_llamacpp

LABEL = "quantized weights: differences expected"


def test_llamacpp_without_its_build_says_make_llamacpp(tiny_loaded, monkeypatch, capsys):
    """--engines llamacpp with no llama-server is refused at once, naming `make llamacpp`."""
    monkeypatch.setenv("CBP_LLAMACPP_DIR", "/nonexistent/llamacpp")
    assert bench.main(["--engines", "llamacpp"]) == 2
    assert "make llamacpp" in capsys.readouterr().err


@needs_llamacpp
@pytest.mark.real_model
def test_bench_runs_llamacpp_beside_ours(tmp_path, embedded_model, monkeypatch, capsys):
    """`--engines continuous,llamacpp,llamacpp_q4`: every engine gets verdicts, the F32 one
    has no ✗, the Q4_1 one is labelled and never fails the run, and the servers are stopped."""
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: embedded_model)
    out = tmp_path / "out.json"
    rows = [("The capital of France is", 8), ("Water boils at", 8)]
    argv = ["--workload", write_workload(tmp_path, rows), "--slots", "2"]
    argv += ["--engines", "continuous,llamacpp,llamacpp_q4", "--json", str(out)]
    assert bench.main(argv) == 0, capsys.readouterr().err[-3000:]
    report = capsys.readouterr().out
    assert "llamacpp_q4 against the reference: " in report and LABEL in report, report
    engines = json.loads(out.read_text())["engines"]
    for name in ("continuous", "llamacpp", "llamacpp_q4"):
        entry = engines[name]
        assert entry["num_match"] + entry["num_near_tie"] + entry["num_differs"] == 2, name
        assert all(r["verdict"] is not None for r in entry["requests"]), f"{name}: no verdicts"
    assert engines["llamacpp"]["num_differs"] == 0, engines["llamacpp"].get("mismatches")
    assert engines["llamacpp_q4"]["info"]["differences_expected"] == LABEL
    for name in ("llamacpp", "llamacpp_q4"):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{engines[name]['server']['url']}/health", timeout=2)
