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
    assert doc["decoder_layer_steps"] == {path: steps, other: 0}
    assert doc["engines"]["continuous"]["reference_match"] is True
    assert f"decoder layers: {path} (steps: {path} {steps})" in table
    if path == "fused":  # where its decode steps' layers ran, and why not in C++
        assert doc["layers_step"] == "C++" or doc["layers_step"].startswith("Python: ")
        assert f"decode step's layers: {doc['layers_step']}" in table
    else:
        assert doc["layers_step"] is None


def test_bench_without_our_packed_steps_reports_no_decoder_layers(tmp_path, tiny_loaded, capsys):
    """With only ``static_generate`` (plain ``generate``), decoder_layers is null and the table
    says nothing; the static engine alone reports its waves' layers."""
    doc, table = _bench(tmp_path, "static_generate", capsys)
    assert doc["decoder_layers"] is None
    assert doc["decoder_layer_steps"] == {"fused": 0, "transformers": 0}
    assert "decoder layers" not in table
    doc, table = _bench(tmp_path, "static", capsys)
    steps = doc["engines"]["static"]["num_steps"]
    assert (doc["decoder_layers"], doc["decoder_layer_steps"]["fused"]) == ("fused", steps)
