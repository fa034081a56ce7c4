"""The bench on a folder of each decoder family, with its default settings: every engine's
outputs equal the reference, on the fused layers; a model that cannot run gets a clear error."""

import json

import pytest
from family_models import FAMILIES, save_family_folder

from engine.bench import cli as bench

ENGINES = "static,continuous,continuous_paged"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path / "cache"))  # kernel choices kept apart


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bench_runs_a_family_folder_with_its_defaults(tmp_path, family):
    """``--model FOLDER`` with the default workload and settings: outputs equal the reference
    in every engine, and the JSON names the fused layers path."""
    folder = save_family_folder(family, tmp_path / family)
    out = tmp_path / "out.json"
    assert bench.main(["--model", folder, "--engines", ENGINES, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["layers_path"] == "fused", f"{family}: {doc['layers_path']}"
    for name, result in doc["engines"].items():
        assert result["reference_match"] is True, f"{family} {name}: {result['verdicts']}"


def test_bench_refuses_an_encoder_decoder_in_one_line(tmp_path, capsys):
    """A T5 folder: exit 2 and one ``error:`` line that names the model type, no traceback."""
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert bench.main(["--model", str(folder), "--engines", ENGINES]) == 2
    err = capsys.readouterr().err
    assert "'t5' model, not a causal language model" in err and "Traceback" not in err, err
