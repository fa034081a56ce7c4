"""The page's shared model at start: its pace, timed for the queue's first estimates."""

from __future__ import annotations

import pytest

from engine.worker.worker_model import CALIBRATION_TABLE
from tests.tiny_model import tiny_shared


def test_the_pace_timed_at_start_prices_that_same_work_at_its_measured_seconds():
    """``calibrate_pace`` runs both engines and the reference on the calibration table (static:
    two waves on 3 slots, each to its longest cap) and the queue then prices that work at the
    seconds measured, plus rendering, before any run finished."""
    shared = tiny_shared()
    assert not shared.queue.measured, "a fresh page knows no pace"
    work, parts_s = shared.calibrate_pace()
    caps = [cap for _prompt, cap in CALIBRATION_TABLE]
    assert work.static_steps == max(caps[:3]) + max(caps[3:]), "static: two waves on 3 slots"
    assert 0 < work.continuous_steps < work.static_steps, "continuous packs the caps"
    assert shared.queue.measured
    assert (
        set(parts_s) == {"static", "continuous", "prefill", "reference"}
        and work.units()["reference"] > 0
    )
    expected_s = sum(parts_s.values()) + shared.queue.pace.run_s
    assert shared.queue.pace.cost_s(work) == pytest.approx(expected_s)
