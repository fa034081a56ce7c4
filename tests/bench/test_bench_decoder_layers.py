"""The bench says which decoder layers our engines ran (JSON and table): the continuous engines'
steps and the static engine's packed waves; ``static_generate`` runs ``generate``'s own."""

import json

import pytest

from engine.bench import cli as bench


def _bench(tmp_path, engines: str, capsys) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    assert bench.main(["--engines", engines, "--slots", "2", "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.parametrize(("setting", "path"), [("auto", "fused"), ("off", "transformers")])
def test_bench_reports_the_decoder_layers_of_the_timed_steps(
    setting, path, tmp_path, tiny_loaded, capsys, monkeypatch
):
    """decoder_layers names the path; decoder_layer_steps counts the timed runs' steps only,
    the static engine's waves with the continuous engine's steps."""
    monkeypatch.setenv("CBP_FUSED_LAYERS", setting)
    doc, table = _bench(tmp_path, "static,continuous", capsys)
    steps = sum(doc["engines"][name]["num_steps"] for name in ("static", "continuous"))
    other = "transformers" if path == "fused" else "fused"
    assert doc["decoder_layers"] == path
    assert doc["decoder_layer_steps"] == {"compiled": 0, path: steps, other: 0}
    assert doc["engines"]["continuous"]["reference_match"] is True
    assert f"decoder layers: {path} (steps: {path} {steps})" in table


def test_bench_without_our_packed_steps_reports_no_decoder_layers(tmp_path, tiny_loaded, capsys):
    """With only ``static_generate`` (plain ``generate``), decoder_layers is null and the table
    says nothing; the static engine alone reports its waves' layers."""
    doc, table = _bench(tmp_path, "static_generate", capsys)
    assert doc["decoder_layers"] is None
    assert doc["decoder_layer_steps"] == {"compiled": 0, "fused": 0, "transformers": 0}
    assert "decoder layers" not in table
    doc, table = _bench(tmp_path, "static", capsys)
    steps = doc["engines"]["static"]["num_steps"]
    assert (doc["decoder_layers"], doc["decoder_layer_steps"]["fused"]) == ("fused", steps)


def test_bench_reports_the_compiled_step(
    tmp_path, tiny_loaded, capsys, monkeypatch, compile_cache_dir
):
    """With the compiled step on: compile_s at warm-up, step_mode "compiled" and no recompile for
    the continuous engine and the static engine's waves, every timed step of theirs compiled."""
    monkeypatch.setenv("CBP_COMPILED_STEP", "auto")
    monkeypatch.setenv("CBP_CACHE_DIR", compile_cache_dir)
    doc, table = _bench(tmp_path, "static,continuous", capsys)
    continuous, static = doc["engines"]["continuous"], doc["engines"]["static"]
    assert (continuous["step_mode"], continuous["recompiles"]) == ("compiled", 0), continuous
    assert (static["step_mode"], static["recompiles"]) == ("compiled", 0), static
    assert doc["compile_s"] > 0 and doc["eager_reason"] is None
    num_steps = continuous["num_steps"] + static["num_steps"]
    assert doc["decoder_layer_steps"]["compiled"] == num_steps
    assert continuous["reference_match"] is True
    assert "compiled step: first call" in table


def test_bench_says_why_the_step_is_eager(tmp_path, tiny_loaded, capsys):
    """With the step switched off (the suite's default), the JSON and the table name the reason."""
    doc, table = _bench(tmp_path, "continuous", capsys)
    assert doc["engines"]["continuous"]["step_mode"] == "eager"
    assert doc["compile_s"] is None and doc["eager_reason"] == "CBP_COMPILED_STEP=off"
    assert "step: eager (CBP_COMPILED_STEP=off)" in table
