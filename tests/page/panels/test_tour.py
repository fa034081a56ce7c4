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


def test_tour_explains_the_articles_ideas():
    """Padding and the barrier, iteration-level scheduling, the packed mask, the paged cache, and
    (issue 51, item 10) chunked prefill under a token budget and prefix caching, each a step."""
    text = " ".join(f"{s.title} {s.text}".lower() for s in tour.load_tour())
    for idea in ("padding", "barrier", "iteration-level", "block-diagonal", "paged", "preempt"):
        assert idea in text, f"the tour never explains {idea!r}"
    titles = [s.title.lower() for s in tour.load_tour()]
    for idea in ("chunked prefill", "prefix caching"):
        assert any(idea in title for title in titles), f"no step on {idea!r}: {titles}"


def test_every_step_sets_its_setup_up_from_its_link():
    """Each step links to a setup (``?preset=...``) that the page's link handling applies whole:
    its preset, and no warning; the chunked-prefill step sets a token budget and the prefix
    caching step turns prefix caching on (issue 51, item 10)."""
    from types import SimpleNamespace
    from urllib.parse import parse_qsl

    import gradio as gr

    from engine.page.inputs import page_io

    applied = {}
    for step in tour.load_tour():
        assert step.setup.startswith("?preset="), f"{step.title}: no setup link: {step.setup!r}"
        assert f"]({step.setup})" in step.markdown(), f"{step.title}: its setup is not linked"
        request = SimpleNamespace(query_params=dict(parse_qsl(step.setup[1:])))
        link = dict(zip(page_io.LINK_OUTPUTS, page_io.from_link(request), strict=True))
        assert link["input_warning"] == gr.skip(), f"{step.title}: {link['input_warning']}"
        assert link["preset"] is not None and link["preset"] != gr.skip(), step.setup
        applied[step.title] = link
    assert applied["Chunked prefill: the token budget"]["token_budget"] == 64
    assert applied["Prefix caching"]["prefix_caching"] is True


def test_step_titles_leave_the_numbering_to_the_stepper():
    """No title starts with its own number: Gradio's stepper numbers the steps itself ("Step 1/5:
    Padding and the barrier", not "Step 1/5: 1 · Padding and the barrier")."""
    numbered = [s.title for s in tour.load_tour() if s.title[:1].isdigit()]
    assert not numbered, f"titles numbered twice: {numbered}"


def test_a_step_without_a_field_is_named(tmp_path):
    path = tmp_path / "tour.json"
    path.write_text(json.dumps([{"title": "t", "text": "x", "chart": "c", "setup": "?preset=s"}]))
    with pytest.raises(ValueError, match="step 1 lacks 'chart_name'"):
        tour.load_tour(path)
