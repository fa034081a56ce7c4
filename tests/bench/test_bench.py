"""The bench CLI's contract: flags, table and JSON fields, on the tiny model."""

import dataclasses
import json

import pytest

from engine.bench import args as bench_args
from engine.bench import cli as bench
from engine.bench import report
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import Timings
from engine.kernels.linear_kernel import linear_modules
from engine.model.kernel_store import KernelChoice
from tests.bench.workload_files import corrupt_continuous_outputs, write_workload


def test_bench_writes_the_documented_json(tmp_path, tiny_loaded, capsys):
    """--json has every documented field per engine, and outputs match the reference."""
    out = tmp_path / "out.json"
    workload = write_workload(tmp_path, [("hello", 5), ("a longer prompt here", 12), ("z", 3)])
    argv = ["--workload", workload, "--slots", "2", "--json", str(out), "--floor"]
    argv += ["--out", str(tmp_path / "exports")]
    argv += ["--engines", "static,static_generate,continuous,continuous_concat,hf_continuous"]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    for key in ("model", "device", "dtype", "slots", "workload", "engines", "floor_s"):
        assert key in doc, f"missing top-level {key}"
    assert (doc["arrival"], doc["rate"], doc["seed"]) == ("file", None, None)
    assert doc["floor_engine_kernel_s"] > 0 and doc["weight_read_ms"] > 0
    params = tiny_loaded.model.parameters()
    assert doc["weight_bytes"] == sum(p.numel() * p.element_size() for p in params)
    linears = [m.weight for m in linear_modules(tiny_loaded.model)]
    packed = sum(w.numel() * w.element_size() for w in linears)
    choice = doc["kernel_choice"]  # the tiny model is built in memory: not measured
    kernels = [r["kernel"] for r in choice["plan"]]
    assert (choice["origin"], choice["file"], choice["times_ms"]) == ("default", None, None)
    assert doc["engine_kernel"] == "+".join(kernels), (doc["engine_kernel"], kernels)
    assert doc["lm_head_kernel"] == f"{kernels[0]} 1-16 rows", doc["lm_head_kernel"]
    assert doc["lm_head_choice"] == choice, "an untimed head runs the decoder's choice"
    copies = doc["engine_kernel_bytes"]  # without oneDNN: the fused layers' stacked copies only
    assert copies >= packed if "onednn" in kernels else copies < packed, (kernels, copies)
    names = {"static", "static_generate", "continuous", "continuous_concat", "hf_continuous"}
    assert set(doc["engines"]) == names
    for name, r in doc["engines"].items():
        assert set(r["latency_percentiles"]) == {"queue_s", "ttft_s", "tpot_s", "latency_s"}
        for key in ("wall_s", "num_steps", "num_generated_tokens", "tok_per_s"):
            assert key in r, f"{name} lacks {key}"
        assert r["reference_match"] is True and r["num_mismatched_requests"] == 0, name
        assert r["peak_rss_bytes"] >= r["peak_rss_added_bytes"] >= 0, f"{name}: peak RSS"
        assert r["peak_rss_bytes"] > doc["weight_bytes"], f"{name}: RSS holds the weights"
        # transformers sizes its own KV cache from free memory unless told (14 GB here once)
        assert r["peak_rss_added_bytes"] < 2**30, f"{name}: a tiny model's run added over 1 GiB"
        assert 0.0 <= r["others_cpu_share"] <= 1.0, f"{name}: other work's share (Linux /proc)"
        req = r["requests"][1]
        assert set(req) >= {"request_id", "prompt", "max_new_tokens", "output_token_ids"}
        assert set(req) >= {"output_text", "ttft_s", "latency_s"}
        generated = sum(len(q["output_token_ids"]) for q in r["requests"])
        assert r["num_generated_tokens"] == generated, "counts output tokens only"
    assert doc["engines"]["static"]["num_steps"] > doc["engines"]["continuous"]["num_steps"]
    exports = tmp_path / "exports"
    assert "request_id" in (exports / "requests.csv").read_text().splitlines()[0]
    perfetto = json.loads((exports / "trace.perfetto.json").read_text())
    assert any(e["ph"] == "X" for e in perfetto["traceEvents"])
    table = capsys.readouterr().out
    assert "continuous_concat" in table and "speedup" in table and "x read" in table
    assert "kernel choice: " in table, "no kernel choice line"
    hf = doc["engines"]["hf_continuous"]  # its steps: from transformers' scheduler's own record
    longest = max(len(q["output_token_ids"]) for q in hf["requests"])
    assert hf["num_steps"] >= longest > 0, (hf["num_steps"], longest)  # a step per token
    assert hf["ms_per_step"] == 1000 * hf["wall_s"] / hf["num_steps"]
    assert f"hf_continuous: {hf['num_steps']} steps in transformers' own record" in table


def test_the_report_shows_the_measured_times_and_stars_the_chosen():
    """kernel_choice_lines: the ranges, the origin and file, then a row of ms per kernel with a
    star on the kernel each row count runs; a timing that timed nothing says it fell back."""
    times = {"linear": (1.0, 5.0, 9.0), "onednn": (2.0, 3.0, None)}
    plan = RowPlan((1, 2), ("linear", "onednn"))
    timings = Timings((1, 2, 4), times, 35, 210, 70_000_000, 2.5, 0)
    doc = KernelChoice(plan, "cached", timings, "/c/kc.json").as_dict()
    lines = report.kernel_choice_lines(doc)
    assert lines[0] == (
        "kernel choice: linear 1-1 rows, onednn 2+ rows "
        "(measured at an earlier start on this host; kept in /c/kc.json)"
    ), lines[0]
    assert "35 of 210 linears (70 MB), cut short by the time budget" in lines[1], lines[1]
    assert lines[2].split() == ["rows", "1", "2", "4"]
    assert lines[3].split() == ["linear", "1.0*", "5.0", "9.0"], lines[3]
    assert lines[4].split() == ["onednn", "2.0", "3.0*", "-"], lines[4]
    busy = dataclasses.replace(timings, rounds=3, others_cpu_share=0.45)
    busy_lines = report.kernel_choice_lines(KernelChoice(plan, "measured", busy).as_dict())
    assert "best of 3, 2.5 s, other work 45 % of the CPU (not kept" in busy_lines[1], busy_lines[1]
    nothing = dataclasses.replace(timings, times_ms={"linear": (None,) * 3})
    fallback = KernelChoice(RowPlan.single("linear"), "fallback", nothing).as_dict()
    assert fallback["origin"] == "fallback" and fallback["rounds"] == 0, fallback
    fallback_lines = report.kernel_choice_lines(fallback)
    assert fallback_lines[0] == (
        "kernel choice: linear at every row count "
        "(timing finished no pass within its budget: the device's own matmul)"
    ), fallback_lines[0]
    assert "cut short by the time budget" in fallback_lines[1], fallback_lines[1]
    forced = KernelChoice(RowPlan.single("skinny"), "forced").as_dict()
    assert report.kernel_choice_lines(forced) == [
        "kernel choice: skinny at every row count (named by CBP_ENGINE_KERNEL)"
    ]


def test_bench_reports_bad_input_clearly(tmp_path, tiny_loaded, capsys):
    """A malformed workload line or an unknown engine exits 2 with a one-line message."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "max_new_tokens": 3}\nnot json\n')
    assert bench.main(["--workload", str(bad)]) == 2
    assert "bad.jsonl line 2" in capsys.readouterr().err
    assert bench.main(["--engines", "static,warp_drive"]) == 2
    assert "Unknown engine 'warp_drive'" in capsys.readouterr().err


def test_token_budget_and_repeat_flags(tmp_path, tiny_loaded):
    """--token-budget caps every continuous step's tokens; --repeat reports a spread."""
    out = tmp_path / "o.json"
    workload = write_workload(tmp_path, [("x" * 30, 4), ("y" * 25, 4)])
    argv = ["--workload", workload, "--engines", "continuous", "--token-budget", "8"]
    assert bench.main([*argv, "--repeat", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["engines"]["continuous"]["num_steps"] >= (30 + 25) // 8
    r = doc["engines"]["continuous"]
    assert r["wall_s_min"] <= r["wall_s"] <= r["wall_s_max"], "median inside the spread"


def test_small_kv_budget_preempts_and_still_matches(tmp_path, tiny_loaded):
    """--kv-budget-mib and --block-size size the paged pool; preemptions land in the JSON."""
    out = tmp_path / "p.json"
    rows = [("the quick brown fox", 30), ("hello world", 30), ("abc", 30)]
    workload = write_workload(tmp_path, rows)
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, head size 16, fp32
    budget_mib = 14 * 4 * bytes_per_token / 2**20  # 14 blocks of 4 tokens: not 3 × 12 blocks
    argv = ["--workload", workload, "--engines", "continuous,continuous_paged", "--slots", "3"]
    argv += ["--kv-budget-mib", str(budget_mib), "--block-size", "4", "--json", str(out)]
    assert bench.main(argv) == 0, "outputs equal the reference despite preemption"
    doc = json.loads(out.read_text())
    paged = doc["engines"]["continuous_paged"]
    assert paged["info"]["kv_blocks"] == 14 and paged["info"]["block_size"] == 4
    assert paged["num_preemptions"] > 0
    assert doc["engines"]["continuous"]["num_preemptions"] == 0, "slots mode never preempts"


def test_a_mismatch_is_reported_with_its_token_and_margin(tmp_path, tiny_loaded, monkeypatch):
    """An engine output that differs from the reference fails the bench and is explained."""
    corrupt_continuous_outputs(monkeypatch)
    out = tmp_path / "m.json"
    workload = write_workload(tmp_path, [("the quick brown fox", 8), ("hello", 6)])
    argv = ["--workload", workload, "--engines", "static,continuous", "--json", str(out)]
    assert bench.main(argv) == 1, "a mismatch fails the bench"
    doc = json.loads(out.read_text())
    assert "mismatches" not in doc["engines"]["static"]
    (found,) = doc["engines"]["continuous"]["mismatches"]
    assert found["request_id"] == 0 and found["token_index"] == 2 and found["engine_token"] == 3
    assert found["logit_margin"] is not None


@pytest.mark.parametrize(
    ("argv", "ignored"),
    [
        (["--kv-budget-mib", "8", "--block-size", "4"], ["--kv-budget-mib", "--block-size"]),
        (["--engines", "static", "--token-budget", "8"], ["--token-budget"]),
        (["--engines", "hf_continuous", "--policy", "prefill_first"], ["--policy"]),
        (["--rate", "5", "--seed", "2"], ["--rate", "--seed"]),
        (["--arrival", "all", "--rate", "5"], ["--rate"]),
    ],
)
def test_flags_no_selected_engine_uses_are_named(argv, ignored):
    """A paged-KV, token-budget, policy or Poisson flag that nothing selected uses is named."""
    args = bench_args.parse_args(argv)
    names = args.engines.split(",")
    lines = bench_args.ignored_flags(args, names)
    assert [line.split()[0] for line in lines] == ignored, lines
    assert all("is ignored: only" in line for line in lines), lines


@pytest.mark.parametrize(
    "argv",
    [
        ["--engines", "continuous_paged", "--kv-budget-mib", "8", "--block-size", "4"],
        ["--engines", "static,continuous", "--token-budget", "8", "--policy", "prefill_first"],
        ["--arrival", "poisson", "--rate", "5", "--seed", "2"],
        [],
    ],
)
def test_flags_a_selected_engine_uses_are_not_named(argv):
    """No warning for flags that a selected engine or the arrival mode uses, nor for none."""
    args = bench_args.parse_args(argv)
    assert bench_args.ignored_flags(args, args.engines.split(",")) == []


def test_scoped_flags_get_their_defaults_when_not_given():
    """Flags parsed as None to see whether they were given still get their documented defaults."""
    args = bench_args.parse_args([])
    assert (args.rate, args.seed, args.policy, args.block_size) == (1.0, 0, "decode_first", 16)
    assert args.given == set(), f"defaults counted as given: {args.given}"
    args = bench_args.parse_args(["--rate", "5", "--block-size", "4"])
    assert (args.rate, args.block_size, args.given) == (5.0, 4, {"rate", "block_size"})


def test_bench_warns_on_stderr_about_an_ignored_kv_budget(tmp_path, tiny_loaded, capsys):
    """--kv-budget-mib without continuous_paged runs, and says on stderr that it was ignored."""
    workload = write_workload(tmp_path, [("hello", 2)])
    argv = ["--workload", workload, "--engines", "continuous", "--kv-budget-mib", "8"]
    assert bench.main([*argv, "--no-reference"]) == 0
    err = capsys.readouterr().err
    assert "warning: --kv-budget-mib is ignored: only continuous_paged uses it." in err, err


def test_without_a_reference_nothing_claims_a_comparison(tmp_path, tiny_loaded, capsys):
    """--no-reference: no reference timing printed, and match and mismatch count are both null."""
    out = tmp_path / "out.json"
    workload = write_workload(tmp_path, [("hello", 2), ("there", 3)])
    argv = ["--workload", workload, "--engines", "continuous", "--json", str(out)]
    assert bench.main([*argv, "--no-reference"]) == 0
    assert "reference:" not in capsys.readouterr().err
    result = json.loads(out.read_text())["engines"]["continuous"]
    assert (result["reference_match"], result["num_mismatched_requests"]) == (None, None)


def test_help_shows_the_defaults_and_the_ignored_flag_rule(capsys):
    """--help gives the flags' defaults and says unused flags are ignored with a warning."""
    with pytest.raises(SystemExit):
        bench_args.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    parts = ["arrivals per second (default 1.0)", "tokens per block (default 16)"]
    parts += ["path (default seed)", "(default static,continuous)", "interleaved (default 1)"]
    parts += ["--rate (default file)", "mps (default auto)", "bfloat16 (default auto)"]
    for part in parts:
        assert part in text, f"{part!r} not in --help"
    assert "ignored with a warning on stderr" in text, "--help does not say what is ignored"


def test_bench_json_counts_the_memory_by_part(tmp_path, tiny_loaded):
    """--json's ``memory``: the weights' bytes, each kernel's copies, the KV pool, the peak RSS."""
    out = tmp_path / "mem.json"
    workload = write_workload(tmp_path, [("hello world", 6), ("abc", 4)])
    argv = ["--workload", workload, "--engines", "continuous_paged", "--block-size", "4"]
    assert bench.main([*argv, "--json", str(out)]) == 0
    memory = json.loads(out.read_text())["memory"]
    params = sum(p.numel() * p.element_size() for p in tiny_loaded.model.parameters())
    assert memory["weights_bytes"] == params
    assert memory["packed_total_bytes"] == sum(memory["packed_bytes"].values())
    assert set(memory["packed_by_part"]) == {"modules", "fused"}
    assert memory["variants"] == {}
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, head size 16, fp32
    assert memory["kv_pool_bytes"] > 0 and memory["kv_pool_bytes"] % (4 * bytes_per_token) == 0
    assert memory["peak_rss_bytes"] > params


def test_an_engine_timed_under_load_is_marked_in_the_report():
    """Other work over a fifth of the CPUs during an engine's runs: one warning naming it (its
    speedup is the contention's too); a quiet or unmeasured engine gets none."""
    from engine.bench.report import load_lines

    results = {
        "static": {"others_cpu_share": 0.497},
        "continuous": {"others_cpu_share": 0.05},
        "vllm": {"others_cpu_share": None},
    }
    assert load_lines(results) == [
        "warning: static ran while other work took 50% of its CPUs: its times are slower than "
        "on a quiet host (taken under load)."
    ]
