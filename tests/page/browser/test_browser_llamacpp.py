"""llama.cpp on the page, in the browser: ``app.py --llamacpp`` starts a real ``llama-server``.

The servers line names both engines ready; a run of the seed preset (the page's opening setup)
with both ticked gives each an outputs column with its verdicts (F32: ✓ or ≈; the Q4_1 file's
splits labelled "quantized weights: differences expected", never ✗), a metrics row, one lane per
request on the servers' timeline and its curves on the ``/metrics`` chart. One run, one page of
its own (started before the shared server, as vLLM's). Skipped without ``make llamacpp``'s build.
"""

from __future__ import annotations

import re

import pytest
from browser_kit import (
    PYTESTMARK,
    RUN_TIMEOUT_MS,
    SCREENSHOTS,
    Page,
    expect,
    plot_summary,
    run_and_wait,
    status_text,
    table,
    tick_servers,
)
from server_kit import start_app_server

from tests.live_servers import needs_llamacpp

pytestmark = [*PYTESTMARK, needs_llamacpp, pytest.mark.real_model]
NAMES = ("llamacpp", "llamacpp_q4")
START_TIMEOUT_MS = 300_000  # the F32 GGUF is converted before the page serves; a start is seconds
LABEL = "quantized weights: differences expected"


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory) -> str:
    """``app.py --llamacpp``, for this module."""
    return start_app_server(request, tmp_path_factory, ("--llamacpp",))


def test_seed_run_with_llamacpp_shows_columns_verdicts_lanes_and_metrics(page: Page):
    """The seed preset with both llama.cpp engines ticked: their columns, verdicts, metrics rows,
    lanes and /metrics curves; no ✗ on either, the Q4_1 splits labelled."""
    line = page.locator("#servers_markdown")
    for name in NAMES:
        expect(line).to_contain_text(f"{name}: ready · llama.cpp", timeout=START_TIMEOUT_MS)
    boxes = page.locator("#servers_checkbox input[type=checkbox]")
    expect(boxes).to_have_count(2)
    tick_servers(page, list(NAMES))
    run_and_wait(page, 5 * RUN_TIMEOUT_MS)  # the seed run: minutes on a busy 2-core CPU
    status = status_text(page)
    assert "**✗" not in status and not re.search(r"[1-9]\d* ✗", status), status
    for name in NAMES:
        assert f" · {name} " in status, f"{name} missing from the status line: {status}"
    headers, rows = table(page, "outputs_table")
    verdict = headers.index("matches model.generate")
    for name in NAMES:
        column = headers.index(f"{name} output")
        assert all(row[column] for row in rows), f"{name}: an output is empty: {rows}"
    for row in rows:
        assert "✗" not in row[verdict], f"{row[0]}: a failure shown: {row[verdict]}"
        labels = re.findall(r"llamacpp_q4 (≠[^·]*)", row[verdict])
        assert all(LABEL in label for label in labels), row[verdict]
    _, metrics = table(page, "metrics_table")
    assert set(NAMES) <= {row[0] for row in metrics}, metrics
    lanes = plot_summary(page, "server_timeline_plot")
    assert lanes["title"].startswith("Servers: one lane per request"), lanes
    assert lanes["num_drawn"] >= 2, lanes
    chart = page.locator("#server_chart_plot .js-plotly-plot")
    curves = chart.evaluate("el => el.data.map(d => d.name)")
    for name in NAMES:
        assert f"{name}: running" in curves, f"no /metrics curve of {name}: {curves}"
    page.locator("#server_timeline_plot").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "llamacpp-run.png"), full_page=True)
