"""The bench's verdicts, --batch-invariant and the GPU check, on the tiny model."""

import json

from engine.bench import args as bench_args
from engine.bench import cli as bench
from tests.bench.workload_files import corrupt_continuous_outputs, write_workload

ROWS = [("hello", 5), ("a longer prompt here", 12), ("z", 3), ("the quick brown fox", 9)]


def test_every_request_gets_a_verdict_and_each_engine_its_counts(tmp_path, tiny_loaded):
    """Normal mode: a verdict per request, counts that add up, mismatch count kept as it was."""
    out = tmp_path / "v.json"
    argv = ["--workload", write_workload(tmp_path, ROWS), "--slots", "2", "--json", str(out)]
    assert bench.main([*argv, "--engines", "static,continuous,hf_continuous"]) == 0
    doc = json.loads(out.read_text())
    assert (doc["batch_invariant"], doc["reference"]) == (False, "ReferenceCache")
    for name, r in doc["engines"].items():
        counts = (r["num_match"], r["num_near_tie"], r["num_differs"])
        assert sum(counts) == len(ROWS) and r["num_mismatched_requests"] == 0, (name, counts)
        verdicts = [q["verdict"] for q in r["requests"]]
        assert {v["symbol"] for v in verdicts} == {"✓"}, name
    assert doc["engines"]["hf_continuous"]["num_logits_equal"] is None, "it records no logits"


def test_batch_invariant_runs_are_bitwise_equal_to_solo_runs(tmp_path, tiny_loaded, capsys):
    """--batch-invariant: every request ✓ with bitwise-equal logits, and the mode's cost."""
    out = tmp_path / "i.json"
    argv = ["--workload", write_workload(tmp_path, ROWS), "--slots", "3", "--token-budget", "5"]
    argv += ["--engines", "static,continuous,continuous_paged,continuous_concat"]
    assert bench.main([*argv, "--batch-invariant", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["batch_invariant"], doc["reference"]) == (True, "SoloReference")
    for name, r in doc["engines"].items():
        assert r["num_match"] == r["num_logits_equal"] == len(ROWS), name
        assert r["info"]["batch_invariant"] is True, name
        assert r["normal_ms_per_step"] > 0 and r["invariant_cost_x"] > 0, name
    printed = capsys.readouterr().out
    assert "batch-invariant cost, continuous:" in printed
    assert f"continuous against the reference: {len(ROWS)} ✓ ({len(ROWS)} bitwise)" in printed


def test_batch_invariant_says_where_it_cannot_apply(tmp_path, tiny_loaded, capsys):
    """hf_continuous and static_generate under --batch-invariant: a warning each, on stderr."""
    workload = write_workload(tmp_path, [("hello", 2)])
    argv = ["--workload", workload, "--engines", "continuous,hf_continuous,static_generate"]
    bench.main([*argv, "--batch-invariant", "--no-reference"])
    err = capsys.readouterr().err
    assert "warning: --batch-invariant does not apply to hf_continuous: transformers'" in err
    assert "warning: --batch-invariant does not apply to static_generate:" in err


def test_a_corrupted_output_is_a_difference_with_the_reference_margin(
    tmp_path, tiny_loaded, monkeypatch
):
    """An engine output changed by hand: ✗, with the reference's own (non-negative) margin."""
    corrupt_continuous_outputs(monkeypatch)
    out = tmp_path / "m.json"
    workload = write_workload(tmp_path, [("the quick brown fox", 8), ("hello", 6)])
    assert bench.main(["--workload", workload, "--engines", "continuous", "--json", str(out)]) == 1
    entry = json.loads(out.read_text())["engines"]["continuous"]
    (found,) = entry["mismatches"]
    assert (found["verdict"], found["symbol"], found["token_index"]) == ("differs", "✗", 2)
    assert found["logit_margin"] >= 0 and len(found["reference_run"]["top"]) == 5
    assert entry["num_differs"] == 1 and entry["requests"][0]["verdict"]["verdict"] == "differs"


def test_the_flag_parses_and_defaults_off():
    """--batch-invariant is off by default and reaches the engines' options."""
    assert bench_args.engine_options(bench_args.parse_args([]))["batch_invariant"] is False
    args = bench_args.parse_args(["--batch-invariant"])
    assert bench_args.engine_options(args)["batch_invariant"] is True
