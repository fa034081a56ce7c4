"""The guided tour: every step points at a chart that exists on the page, and covers the ideas."""

import json

import pytest

from engine.page.panels import tour


def test_every_step_points_at_a_chart_on_the_page():
    """Each step's ``chart`` is the elem_id of a plot the page really has."""
    import app

    demo = app.build_demo("Model: test")
    plots = {b.elem_id for b in demo.blocks.values() if type(b).__name__ == "Plot"}
    steps = tour.load_tour()
    missing = [s.chart for s in steps if s.chart not in plots]
    assert not missing, f"tour points at charts the page lacks: {missing}"
    for s in steps:
        assert f"(#{s.chart})" in s.markdown(), "the step has no link to its chart"


def test_tour_explains_the_four_ideas():
    """Padding and the barrier, iteration-level scheduling, the packed mask, the paged cache."""
    text = " ".join(f"{s.title} {s.text}".lower() for s in tour.load_tour())
    for idea in ("padding", "barrier", "iteration-level", "block-diagonal", "paged", "preempt"):
        assert idea in text, f"the tour never explains {idea!r}"


def test_step_titles_leave_the_numbering_to_the_stepper():
    """No title starts with its own number: Gradio's stepper numbers the steps itself ("Step 1/5:
    Padding and the barrier", not "Step 1/5: 1 · Padding and the barrier")."""
    numbered = [s.title for s in tour.load_tour() if s.title[:1].isdigit()]
    assert not numbered, f"titles numbered twice: {numbered}"


def test_a_step_without_a_field_is_named(tmp_path):
    path = tmp_path / "tour.json"
    path.write_text(json.dumps([{"title": "t", "text": "x", "chart": "c"}]))
    with pytest.raises(ValueError, match="step 1 lacks 'chart_name'"):
        tour.load_tour(path)
