"""Metrics and outputs tables: values from the traces; verdicts name the engine that differs."""

import pytest
from fake_traces import continuous_trace, static_trace

from engine.page.views import tables
from engine.trace import Trace

PROMPT_LENS = [5, 6, 8, 9, 10, 7]
CAPS = [6, 50, 300, 30, 180, 45]
MATCH = tables.METRICS_HEADERS.index("outputs match model.generate")


@pytest.fixture()
def static():
    return static_trace(PROMPT_LENS, CAPS, num_slots=3)


@pytest.fixture()
def continuous():
    return continuous_trace(PROMPT_LENS, CAPS, num_slots=3)


def test_metrics_rows_values(static, continuous):
    """Metrics rows carry trace.metrics() values, speedup vs static and the reference verdict."""
    rows = tables.metrics_rows(
        {"static": static, "continuous": continuous}, {"static": "✓", "continuous": "✗"}
    )
    assert all(len(r) == len(tables.METRICS_HEADERS) for r in rows), "row/header length differ"
    (s_row, c_row) = rows
    m = continuous.metrics()
    assert c_row[:5] == ["continuous", 30.0, 300, 611, round(m.tok_per_s, 1)], c_row
    assert s_row[5] == "1.00×" and c_row[5] == f"{48.0 / 30.0:.2f}×", (s_row[5], c_row[5])
    assert c_row[6] == 0.0 and s_row[6] == round(static.padding_waste_pct(), 1) > 0, "waste"
    assert c_row[7] == round(m.slot_utilisation_pct, 1) and c_row[8] == round(m.mean_ttft_s, 2)
    ttfts = sorted(r.ttft_s for r in continuous.requests)
    assert ttfts[-2] <= c_row[9] <= round(ttfts[-1], 2), "p99 TTFT lies between the top two"
    assert c_row[10] == 0, "no preemption in a slots-mode trace"
    assert (s_row[MATCH], c_row[MATCH]) == ("✓", "✗"), "reference verdicts wrong"
    unchecked = tables.metrics_rows({"continuous": continuous}, None)[0]
    assert unchecked[5] == "—" and unchecked[MATCH] == "—", "no static or reference: —"


def test_outputs_rows_verdicts(static, continuous):
    """Outputs rows give both texts and say which engine differs from the reference."""
    reference = {r.request_id: list(r.output_token_ids) for r in static.requests}
    rows = tables.outputs_rows({"static": static, "continuous": continuous}, reference)
    assert rows[0] == ["R0", "prompt 0", 6, "0 1 2 3 4 5", "0 1 2 3 4 5", "✓", "0 of 5"], rows[0]
    continuous.requests[2].output_token_ids = [7]
    assert (
        tables.outputs_rows({"static": static, "continuous": continuous}, reference)[2][-2]
        == "static ✓ · continuous ✗ differs"
    )
    assert tables.outputs_rows({"static": static, "continuous": continuous}, None)[0][-2] == "—", (
        "no reference → —"
    )


def test_engine_without_steps_shows_dashes(static, continuous):
    """transformers' manager records no steps: its step-based columns read "—"."""
    hf = Trace(engine="hf_continuous", num_slots=3, requests=continuous.requests, wall_s=20.0)
    rows = tables.metrics_rows({"static": static, "hf_continuous": hf}, None)
    assert rows[1][2] == rows[1][6] == rows[1][7] == "—", rows[1]
    assert rows[1][5] == f"{48.0 / 20.0:.2f}×"


def test_outputs_get_one_column_per_engine(static, continuous):
    """A third engine adds an output column, and the headers follow."""
    runs = {"static": static, "continuous": continuous, "hf_continuous": continuous}
    headers = tables.outputs_headers(list(runs))
    rows = tables.outputs_rows(runs, None)
    assert headers[3:6] == ["static output", "continuous output", "hf_continuous output"]
    assert all(len(r) == len(headers) for r in rows)


def test_long_prompts_are_clipped_in_the_outputs_table(static, continuous):
    """A 2,000-character prompt is shown clipped, saying how much was left out."""
    static.requests[0].prompt = continuous.requests[0].prompt = "x" * 2000
    shown = tables.outputs_rows({"static": static, "continuous": continuous}, None)[0][1]
    assert len(shown) < 260 and shown.endswith(f"(+{2000 - tables.PROMPT_SHOWN_CHARS} chars)")


def test_every_metrics_column_has_a_width_and_a_definition():
    """Each metrics column has a pixel width and a hover definition; padding waste and slot
    utilisation name their different denominators."""
    assert len(tables.METRICS_COLUMN_WIDTHS) == len(tables.METRICS_HEADERS)
    headers = set(tables.METRICS_HEADERS) | set(tables.metrics_headers(batch_invariant=True))
    assert set(tables.METRIC_HELP) == headers - {"engine"}
    assert "Denominator: computed tokens" in tables.METRIC_HELP["padding waste %"]
    assert "Denominator: slots × steps" in tables.METRIC_HELP["slot utilisation %"]


def test_server_ttft_from_both_views(static):
    """A server with its own record gets TTFT from outside (the client) and inside (its record),
    each labelled; a server without one keeps plain numbers."""
    from captured_vllm import captured_vllm_trace

    vllm = captured_vllm_trace()
    for rec in vllm.requests:  # the client saw every first token 0.25 s after vLLM's record
        rec.first_token_s += 0.25
    row = tables.metrics_rows({"static": static, "vllm": vllm}, None)[1]
    mean = tables.METRICS_HEADERS.index("mean TTFT s")
    outside, inside = vllm.metrics().mean_ttft_s, vllm.schedule.metrics().mean_ttft_s
    wanted = f"outside {outside:.2f} · inside {inside:.2f}"
    assert row[mean] == wanted, f"mean TTFT cell {row[mean]!r}, not both views ({wanted!r})"
    p99 = row[mean + 1]
    assert p99.startswith("outside ") and " · inside " in p99, f"p99 TTFT cell {p99!r}"
    vllm.schedule = None
    plain = tables.metrics_rows({"vllm": vllm}, None)[0]
    assert plain[mean] == round(outside, 2), f"no record, yet the cell is {plain[mean]!r}"
