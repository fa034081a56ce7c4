"""The page's shared model: its pace, timed at start for the queue's first estimates, and what it
answers of its own (no method borrowed from another class)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.worker.worker_model import CALIBRATION_TABLE, WorkerModel
from tests.tiny_model import tiny_shared

ENGINE = Path(__file__).resolve().parents[3] / "engine"


def test_the_pace_timed_at_start_prices_that_same_work_at_its_measured_seconds():
    """``calibrate`` runs both engines and the reference on the calibration table (static:
    two waves on 3 slots, each to its longest cap) and the queue then prices that work at the
    seconds measured, plus rendering, before any run finished."""
    shared = tiny_shared()
    assert not shared.queue.measured, "a fresh page knows no pace"
    work, parts_s = shared.calibrate()
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


def test_no_method_is_borrowed_as_a_class_attribute():
    """No class in ``engine/`` takes another class's method or property as a class attribute
    (``label = WorkerModel.label``): each kind of model says what it answers itself."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                value = node.value if isinstance(node, ast.Assign) else None
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    if value.value.id[:1].isupper():  # a class's attribute
                        found.append(f"{path.relative_to(ENGINE)}:{node.lineno}")
    assert not found, f"borrowed: {found}"


def test_the_page_model_answers_as_the_worker_model_does():
    """The page's model on the engine thread says its dtype and line as the ``WorkerModel`` it
    views, holding no reference to its weights of its own: one class for both workers."""
    shared = tiny_shared()
    held = shared.worker.model
    assert isinstance(held, WorkerModel) and not isinstance(shared, WorkerModel)
    assert (
        (shared.dtype_name, shared.label)
        == (held.dtype_name, held.label)
        == ("float32", f"Model: {held.loaded.name} · runs on {held.loaded.device_label}")
    )
    assert shared.in_dtype(None) is shared and shared.in_dtype("float32") is shared
    assert shared.facts.card.kv_bytes_per_token == held.runner.kv_bytes_per_token()
