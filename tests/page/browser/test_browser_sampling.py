"""Sampling in the browser: a row with a temperature and a seed, typed into the request table's
sampling columns, runs and matches seeded ``model.generate`` in both engines."""

from __future__ import annotations

import csv
from pathlib import Path

from browser_kit import (
    PYTESTMARK,
    Page,
    _cell,
    _download,
    _edit_cell,
    assert_results,
    run_and_wait,
    set_requests,
    set_slots,
)

pytestmark = PYTESTMARK
TEMPERATURE_COL, SEED_COL = 3, 6


def test_a_sampled_row_with_a_seed_matches_the_reference(page: Page, tmp_path: Path):
    """Row 2 sampled at temperature 0.8 with seed 4242: both engines ✓ against the reference, the
    greedy row's sampling cells stay empty, and requests.csv carries the row's settings."""
    rows = [("The capital of France is", 4), ("Once upon a time", 6)]
    set_requests(page, rows)
    _edit_cell(page, 1, TEMPERATURE_COL, "0.8")
    _edit_cell(page, 1, SEED_COL, "4242")
    greedy_cells = [
        _cell(page, "requests_table", 0, col).inner_text().replace("⋮", "").strip()
        for col in range(TEMPERATURE_COL, SEED_COL + 1)
    ]
    assert greedy_cells == ["", "", "", ""], f"a greedy row shows {greedy_cells}"
    set_slots(page, 2)
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    table = list(csv.DictReader(_download(page, "downloads_file", "requests.csv", tmp_path).open()))
    sampled = {(r["engine"], r["seed"], r["temperature"]) for r in table if r["request_id"] == "1"}
    assert sampled == {("static", "4242", "0.8"), ("continuous", "4242", "0.8")}, table
    assert {r["seed"] for r in table if r["request_id"] == "0"} == {""}, "a greedy row has a seed"
