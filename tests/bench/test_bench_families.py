"""The bench on a folder of each decoder family, with its default settings: every engine's
outputs equal the reference, on the fused layers; a model that cannot run gets a clear error."""

import json

import pytest
from family_models import FAMILIES, save_family_folder

from engine.bench import cli as bench
from tests.bench.workload_files import write_workload
from tests.live_servers import needs_vllm

ENGINES = "static,continuous,continuous_paged"
# The seed's first four requests, shorter: past the families' 8-key windows in seconds.
SPECS = [
    ("The capital of France is", 6),
    ("Today's weather is so", 30),
    ("In machine learning, a transformer is", 40),
    ("Once upon a time in a land far away,", 20),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path / "cache"))  # kernel choices kept apart


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bench_runs_a_family_folder_with_its_defaults(tmp_path, family):
    """``--model FOLDER`` with the default settings (the kernels timed here, the default
    slots): no output differs from the reference in any engine, and the JSON names the fused
    layers path. A near-tie (``≈``) is allowed: the timed kernel may round otherwise than
    ``generate``'s matmul."""
    folder = save_family_folder(family, tmp_path / family)
    out = tmp_path / "out.json"
    workload = write_workload(tmp_path, SPECS)
    argv = ["--model", folder, "--engines", ENGINES, "--workload", workload, "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["layers_path"] == "fused", f"{family}: {doc['layers_path']}"
    for name, r in doc["engines"].items():
        counts = {k: r[k] for k in ("num_match", "num_near_tie", "num_differs")}
        assert r["num_differs"] == 0 and r["num_not_compared_requests"] == 0, (family, name)
        assert r["num_match"] + r["num_near_tie"] == len(SPECS), f"{family} {name}: {counts}"


def test_bench_refuses_an_encoder_decoder_in_one_line(tmp_path, capsys):
    """A T5 folder: exit 2 and one ``error:`` line that names the model type, no traceback."""
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert bench.main(["--model", str(folder), "--engines", ENGINES]) == 2
    err = capsys.readouterr().err
    assert "'t5' model, not a causal language model" in err and "Traceback" not in err, err


@needs_vllm
def test_vllm_serves_a_sliding_window_familys_folder_token_equal_and_alike(tmp_path):
    """A tiny Gemma 3 (two 8-key windowed layers to one global, QK-norm, four norms a layer; heads
    of 32, the narrowest vLLM's CPU attention takes), saved as a folder: vLLM serves the same
    folder, every output equals the reference past the window, and its own record of its steps
    plans as our continuous engine's."""
    folder = save_family_folder(
        "gemma3", tmp_path / "gemma3", head_dim=32, query_pre_attn_scalar=32
    )
    out = tmp_path / "out.json"
    workload = write_workload(tmp_path, SPECS)
    argv = ["--model", folder, "--engines", "static,continuous,vllm", "--vllm-eager"]
    assert bench.main([*argv, "--workload", workload, "--json", str(out)]) == 0
    vllm = json.loads(out.read_text())["engines"]["vllm"]
    assert vllm["num_match"] == len(SPECS) and vllm["num_differs"] == 0, vllm
    comparison = vllm["schedule_comparison"]
    assert comparison["equal_step_fraction"] == 1.0, comparison
