"""The bench's sampling: flags for requests without settings, per-request settings in the JSON."""

import json

import pytest

from engine.bench import args as bench_args
from engine.bench import cli as bench
from engine.sampling_params import MAX_SEED, SamplingParams
from tests.bench.workload_files import write_workload

ROWS = [
    {"prompt": "hello", "max_new_tokens": 8},
    {"prompt": "a longer prompt here", "max_new_tokens": 12, "temperature": 0.5, "seed": 77},
    {"prompt": "z", "max_new_tokens": 6},
]


def test_sampling_flags_apply_to_requests_without_their_own(tmp_path, tiny_loaded, capsys):
    """--temperature/--top-k/--top-p/--seed-base set the other requests' settings, request i
    seeded seed_base + i; every engine of ours matches seeded generate."""
    out = tmp_path / "s.json"
    argv = ["--workload", write_workload(tmp_path, ROWS), "--json", str(out), "--slots", "2"]
    argv += ["--engines", "static,continuous,continuous_paged,hf_continuous"]
    argv += ["--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed-base", "1000"]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    flags = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed_base": 1000}
    assert doc["sampling_flags"] == flags
    expected = [
        {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 1000},
        {"temperature": 0.5, "top_k": 0, "top_p": 1.0, "seed": 77},  # its own, defaults filled
        {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 1002},
    ]
    for name, result in doc["engines"].items():
        assert [q["sampling"] for q in result["requests"]] == expected, name
    for name in ("static", "continuous", "continuous_paged"):
        result = doc["engines"][name]
        assert result["reference_match"] is True and result["num_not_compared_requests"] == 0
        assert [q["comparison"] for q in result["requests"]] == ["match"] * 3, name
    hf = doc["engines"]["hf_continuous"]
    assert [q["comparison"] for q in hf["requests"]] == ["not_compared"] * 3
    assert hf["num_not_compared_requests"] == 3 and hf["num_mismatched_requests"] == 0
    assert "mismatches" not in hf, "a request that is not compared is no mismatch"
    table = capsys.readouterr().out
    assert "3 sampled with another generator: not compared" in table, table


def test_a_greedy_bench_has_no_sampling(tmp_path, tiny_loaded):
    """Without sampling flags or columns, requests are greedy and the JSON says so."""
    out = tmp_path / "g.json"
    argv = ["--workload", write_workload(tmp_path, [ROWS[0]]), "--engines", "continuous"]
    assert bench.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["sampling_flags"] is None
    (request,) = doc["engines"]["continuous"]["requests"]
    assert request["sampling"] is None and request["comparison"] == "match"


def test_seed_base_alone_samples_at_temperature_one():
    """--seed-base alone makes requests sample with the defaults (temperature 1, no limits)."""
    args = bench_args.parse_args(["--seed-base", "5"])
    specs = bench_args.load_specs(args)
    assert [s.sampling for s in specs[:2]] == [SamplingParams(seed=5), SamplingParams(seed=6)]
    assert all(s.sampling is None for s in bench_args.load_specs(bench_args.parse_args([])))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--temperature", "-1"], "--temperature: temperature -1.0 is below 0"),
        (["--top-p", "0"], "--top-p: top_p 0.0 is outside (0, 1]"),
        (["--top-k", "-5"], "--top-k: top_k -5 is below 0"),
        (["--seed-base", "-1"], "--seed-base: seed -1 is out of range"),
        (["--seed-base", str(MAX_SEED)], "--seed-base: request 1: seed"),
    ],
)
def test_bad_sampling_flags_exit_2_naming_the_flag(tiny_loaded, capsys, argv, message):
    """A bad sampling flag exits 2 before anything runs, with a message naming the flag."""
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err, err
