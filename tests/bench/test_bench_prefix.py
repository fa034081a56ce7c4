"""The bench's --prefix-caching: paged prefix cache and transformers' block sharing, in the JSON."""

import json

from engine.bench import args as bench_args
from engine.bench import cli as bench
from tests.bench.workload_files import write_workload

OPENING = "a long shared opening, " * 13  # 299 byte tokens: more than one 256-token hf page


def test_prefix_caching_flag_reports_hits_per_request_and_engine(tmp_path, tiny_loaded, capsys):
    """--prefix-caching: continuous_paged reports cached tokens and its hit rate, transformers'
    manager runs with block sharing (hits not reported: null); outputs match the reference."""
    out = tmp_path / "out.json"
    rows = [(OPENING + "one", 4), (OPENING + "two", 4), (OPENING + "three", 4), ("other", 3)]
    argv = ["--workload", write_workload(tmp_path, rows), "--slots", "1", "--json", str(out)]
    argv += ["--engines", "static,continuous_paged,hf_continuous", "--prefix-caching"]
    assert bench.main(argv) == 0
    engines = json.loads(out.read_text())["engines"]
    paged = engines["continuous_paged"]
    cached = [r["num_cached_tokens"] for r in paged["requests"]]
    assert cached == [0, 288, 288, 0], cached  # 299 shared tokens: 18 blocks of 16
    prompts = [r["num_prompt_tokens"] for r in paged["requests"]]
    assert paged["prefix_cache_hit_rate"] == sum(cached) / sum(prompts)
    assert paged["num_cached_tokens"] == 576 and paged["info"]["prefix_caching"] is True
    hf = engines["hf_continuous"]
    assert hf["info"] == {"block_sharing": True} and hf["prefix_cache_hit_rate"] is None
    assert [r["num_cached_tokens"] for r in hf["requests"]] == [None] * 4
    assert engines["static"]["prefix_cache_hit_rate"] == 0.0
    assert all(e["reference_match"] for e in engines.values())
    line = "prefix cache hit rate (cached / prompt tokens): continuous_paged "
    assert line in capsys.readouterr().out


def test_without_the_flag_nothing_is_shared(tmp_path, tiny_loaded):
    """By default neither the paged engine nor transformers' manager shares blocks."""
    out = tmp_path / "out.json"
    rows = [(OPENING + "one", 3), (OPENING + "two", 3)]
    argv = ["--workload", write_workload(tmp_path, rows), "--slots", "1", "--json", str(out)]
    assert bench.main([*argv, "--engines", "continuous_paged,hf_continuous"]) == 0
    engines = json.loads(out.read_text())["engines"]
    assert engines["continuous_paged"]["num_cached_tokens"] == 0
    assert engines["continuous_paged"]["info"]["prefix_caching"] is False
    assert engines["hf_continuous"]["info"] == {"block_sharing": False}
    assert engines["hf_continuous"]["prefix_cache_hit_rate"] == 0.0


def test_prefix_caching_without_a_sharing_engine_is_named_ignored():
    """--prefix-caching with only engines that cannot share KV is ignored with a warning."""
    args = bench_args.parse_args(["--engines", "static,continuous", "--prefix-caching"])
    lines = bench_args.ignored_flags(args, args.engines.split(","))
    expected = "--prefix-caching is ignored: only continuous_paged and hf_continuous use it."
    assert lines == [expected]
    args = bench_args.parse_args(["--engines", "continuous_paged", "--prefix-caching"])
    assert bench_args.ignored_flags(args, ["continuous_paged"]) == []
