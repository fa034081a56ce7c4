"""Sampling in the page: the table's optional sampling columns, in runs, uploads, downloads, presets
and links, and the verdict for engines that sample with a random stream of their own."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from fake_traces import continuous_trace, static_trace
from page_runs import run_and_render

from engine.fidelity.reference import NOT_COMPARED_TEXT, ReferenceCache
from engine.page.inputs import page_io, presets
from engine.page.run.run_options import RunOptions
from engine.page.views import run_status, run_view, tables
from engine.sampling_params import SamplingParams
from engine.sequence import Request
from engine.workloads.workload import TABLE_COLUMNS, parse_table

MATCH = tables.METRICS_HEADERS.index("outputs match model.generate")
SAMPLED = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=1234)
# A greedy row, a sampled row with every setting, a sampled row with only a seed (temperature 1).
ROWS = [
    ["hello world", 6, 0, None, None, None, None],
    ["abc", 8, 0, 0.9, 20, 0.95, "1234"],
    ["the quick brown fox", 5, 0, "", "", "", "77"],
]


def _run(shared, rows=ROWS, compare_hf=False):
    options = RunOptions(check_reference=True, compare_hf=compare_hf)
    return run_and_render(rows, 2, options, shared)


def test_sampled_rows_match_seeded_generate_in_both_engines(shared):
    """Rows with sampling settings sample (not greedy) and equal seeded generate token for token
    in both engines; the greedy row stays greedy."""
    result = _run(shared)
    assert "✓ all match" in result.status, result.status
    assert all(row[-2] == "✓" for row in result.outputs), result.outputs
    runner = shared.worker.model.runner
    ids = runner.loaded.tokenizer("abc")["input_ids"]
    sampled = Request(1, "abc", 8, tuple(ids), sampling=SAMPLED)
    greedy = Request(1, "abc", 8, tuple(ids))
    fresh = ReferenceCache(runner)  # not the page's cache: computed here, for this test
    expected = fresh.output(sampled)
    assert expected != fresh.output(greedy), "the tiny model sampled what greedy picks"
    for trace in (result.state.static, result.state.continuous):
        assert trace.requests[1].sampling == SAMPLED, f"{trace.engine} lost the settings"
        assert trace.requests[1].output_token_ids == expected, f"{trace.engine} R1 differs"
        assert trace.requests[0].sampling is None, f"{trace.engine}: a greedy row sampled"
        assert trace.requests[2].sampling == SamplingParams(seed=77), trace.requests[2].sampling


def test_transformers_engine_says_not_compared_for_sampled_rows(shared):
    """With transformers' manager compared, its sampled requests read "sampled with another
    generator: not compared" in the outputs, the metrics and the status line, never ✗."""
    result = _run(shared, compare_hf=True)
    hf = result.state.hf_continuous
    assert [r.comparable for r in hf.requests] == [True, False, False], "comparable flags"
    verdicts = [row[-2] for row in result.outputs]
    assert verdicts[0] == "✓", verdicts
    for verdict in verdicts[1:]:
        assert verdict == f"✓ · hf_continuous: {NOT_COMPARED_TEXT}", verdicts
    hf_row = next(row for row in result.metrics if row[0] == "hf_continuous")
    assert hf_row[MATCH] == f"✓ (2 {NOT_COMPARED_TEXT})", hf_row
    assert "✓ all compared outputs match" in result.status, result.status
    assert f"hf_continuous: R1, R2: {NOT_COMPARED_TEXT}" in result.status, result.status
    assert "✗" not in result.status, result.status


def test_a_real_mismatch_still_shows_beside_not_compared():
    """An engine that differs on a compared request is ✗, and its not-compared requests are
    still named as such (hand-built traces)."""
    static = static_trace([3, 4], [2, 3], num_slots=2)
    continuous = continuous_trace([3, 4], [2, 3], num_slots=2)
    hf = continuous_trace([3, 4], [2, 3], num_slots=2)
    hf.engine, hf.requests[1].comparable = "hf_continuous", False
    reference = {r.request_id: list(r.output_token_ids) for r in static.requests}
    continuous.requests[0].output_token_ids = [9]
    state = run_view.RunState(static, continuous, reference, hf)
    status = run_status.status_line(state)
    assert "✗ differs from `model.generate` (continuous: R0)" in status, status
    assert f"(hf_continuous: R1: {NOT_COMPARED_TEXT})" in status, status
    rows = tables.outputs_rows(state.traces(), reference)
    assert rows[0][-2] == "static ✓ · continuous ✗ differs · hf_continuous ✓", rows[0]
    assert rows[1][-2] == f"✓ · hf_continuous: {NOT_COMPARED_TEXT}", rows[1]


def test_upload_and_download_carry_the_sampling_columns(tmp_path):
    """A CSV with sampling columns fills all seven table columns; the table's downloads load back
    to the same workload, settings included; the run's requests.csv names them per request."""
    path = tmp_path / "w.csv"
    path.write_text(
        "prompt,max_new_tokens,temperature,seed\nGreedy,4,,\nSampled,3,0.7,9223372036854775807\n",
        encoding="utf-8",
    )
    rows, preset, text, _ = page_io.upload_workload(str(path))
    assert rows == [
        ["Greedy", 4, 0.0, None, None, None, None],
        ["Sampled", 3, 0.0, 0.7, 0, 1.0, 2**63 - 1],
    ], rows
    assert preset is None and "1 sampled" in text, text
    specs = parse_table(rows)
    for download in page_io.table_files(rows):
        assert page_io.workload_files.load_workload_file(download) == specs, download


def test_run_downloads_name_each_requests_sampling_settings(shared):
    """The run's requests.csv has temperature, top_k, top_p and seed per request (blank: greedy)."""
    result = _run(shared, rows=ROWS[:2])
    csv_path = next(Path(p) for p in result.downloads if p.endswith("requests.csv"))
    rows = list(csv.DictReader(csv_path.open(encoding="utf-8")))
    by_id = {(r["engine"], r["request_id"]): r for r in rows}
    sampled = by_id[("continuous", "1")]
    assert [sampled[name] for name in ("temperature", "top_k", "top_p", "seed")] == [
        "0.9",
        "20",
        "0.95",
        "1234",
    ], sampled
    assert by_id[("static", "0")]["seed"] == "", "a greedy request has a seed in requests.csv"


def test_presets_and_old_links_fill_every_column_greedy():
    """Presets (and links naming them, which carry no sampling columns) give full-width greedy
    rows, which parse to the preset's own requests."""
    name = presets.by_slug("arrivals")
    rows = presets.apply_preset(name)[0]
    assert all(len(row) == len(TABLE_COLUMNS) for row in rows), rows[0]
    assert all(spec.sampling is None for spec in parse_table(rows)), "a preset row samples"
    raw = presets.load_presets()[name]["requests"]
    assert [(s.prompt, s.max_new_tokens) for s in parse_table(rows)] == [(r[0], r[1]) for r in raw]
    link = SimpleNamespace(query_params={"preset": "arrivals", "slots": "3"})
    assert page_io.from_link(link)[1] == rows, "a link's preset gives other rows"
    assert presets.table_row(["p", 3]) == ["p", 3, 0, None, None, None, None]
    assert presets.table_row(["p", 3, 1.5, 0.5]) == ["p", 3, 1.5, 0.5, None, None, None]
