"""The guided tour: every step points at a chart that exists on the page, covers the article's
ideas in its order, and sets the page up for itself in one click, as its link does."""

import dataclasses
import json
from itertools import permutations

import gradio as gr
import pytest

from engine.page.inputs import page_io, presets
from engine.page.inputs.link_query import Precision
from engine.page.panels import tour
from engine.page.run.run_options import RUN_INPUTS, RunSettings, options_from_page, prepare
from engine.page.run.shared_model import local_model
from engine.worker.worker_model import WorkerModel

# The article's ideas, in its order, each a step's title: the barrier, iteration-level scheduling,
# the packed row (prefill riding with decode), then the paged KV cache it points to; chunked
# prefill follows the packed row it splits, prefix caching the paged cache whose blocks it shares,
# and the latencies users feel close the tour.
ARTICLE_ORDER = (
    "Padding and the barrier",
    "Iteration-level scheduling",
    "The packed row and its mask",
    "Chunked prefill: the token budget",
    "The paged KV cache",
    "Prefix caching",
    "What users feel: TTFT and TPOT",
)
# What each step's setup sets beyond its preset's own settings (by hand, from assets/tour.json's
# intent: the preset's paragraph asks for these).
EXTRA = {
    "Chunked prefill: the token budget": {"token_budget": 64},
    "The paged KV cache": {"kv_budget_mib": 16},
    "Prefix caching": {"prefix_caching": True},
}
SET_UP_OUTPUTS = (*page_io.LINK_OUTPUTS, "step", "note")


@pytest.fixture(scope="module")
def demo() -> gr.Blocks:
    import app

    return app.build_demo("Model: test")


def _set_up(step: tour.TourStep) -> dict:
    """``tour.set_up(step)`` by output name."""
    return dict(zip(SET_UP_OUTPUTS, tour.set_up(step, Precision()), strict=True))


def _applied(page: dict, updates: dict) -> dict:
    """``page`` with ``updates`` applied as Gradio applies them (``gr.skip()``: unchanged)."""
    return page | {name: v for name, v in updates.items() if v != gr.skip()}


def test_every_step_points_at_a_chart_on_the_page(demo):
    """Each step's ``chart`` is the elem_id of a plot the page really has."""
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


def test_the_steps_follow_the_articles_order():
    """The seven steps, chunked prefill right after the packed row it splits and prefix caching
    right after the paged cache whose blocks it shares (issue 51, item 10)."""
    titles = tuple(s.title for s in tour.load_tour())
    assert titles == ARTICLE_ORDER, f"the tour's steps, in order: {titles}"


def test_each_steps_setup_is_the_preset_and_link_it_names():
    """One click on "Set this up" sets what choosing the link's preset sets (table, chat
    template, slots, every engine setting), then the link's own settings on top; whatever the
    page's own link handling sets for that link, it sets alike; nothing is warned."""
    for step in tour.load_tour():
        params = step.params
        name = presets.by_slug(params["preset"])
        assert name is not None, f"{step.title}: no preset {params['preset']!r}"
        rows, chat_template, text, slots, *knobs = presets.choose_preset(name)
        chosen = dict(zip(presets.CHOSEN, presets.choose_preset(name), strict=True))
        chosen |= {"num_slots": int(params.get("slots", slots))} | EXTRA.get(step.title, {})
        shown = _set_up(step)
        for field, value in chosen.items():
            if field != "preset_text":
                assert shown[field] == value, f"{step.title}: {field} is {shown[field]!r}"
        assert shown["preset_text"].startswith(text), f"{step.title}: not its preset's text"
        assert shown["preset"] == name and shown["input_warning"] == "", step.title
        link = dict(zip(page_io.LINK_OUTPUTS, page_io.from_query(params), strict=True))
        differ = [f for f, v in link.items() if v != gr.skip() and shown[f] != v]
        assert not differ, f"{step.title}: its link sets {differ} otherwise"


def test_a_step_leaves_nothing_of_the_step_before():
    """After any step, the page reads as after that step alone on a fresh page: the paged-cache
    step after the chunked-prefill step has no token budget left (its link alone would leave 64),
    and the prefix-caching step's toggle goes off again at the next step."""
    fresh = {name: "as the page opened" for name in SET_UP_OUTPUTS}
    for before, after in permutations(tour.load_tour(), 2):
        alone = _applied(fresh, _set_up(after))
        page = _applied(_applied(fresh, _set_up(before)), _set_up(after))
        left = {f: page[f] for f in page if page[f] != alone[f] and f != "note"}
        assert not left, f"{after.title} after {before.title} keeps {left}"


def test_set_this_up_says_press_run_and_keeps_the_links_step():
    """The note under the button names the setup and says that Run measures it (nothing runs);
    the packed-mask step keeps its ``step=6`` for the next Run's slider, the others clear it."""
    for step in tour.load_tour():
        shown = _set_up(step)
        assert "Press **Run**" in shown["note"], f"{step.title}: {shown['note']}"
        assert f"“{shown['preset']}” at {shown['num_slots']} slot" in shown["note"], shown["note"]
        assert shown["step"] == (6 if step.title == "The packed row and its mask" else None)
    shown = _set_up(tour.load_tour()[3])
    assert "Token budget 64" in shown["note"], shown["note"]


def test_each_setup_button_writes_what_a_link_sets(demo):
    """Each step's "Set this up" button (``tour_setup_N``) is wired to the components a link
    sets, in ``LINK_OUTPUTS`` order, then the link's kept step and its own note; it has no
    inputs but the host's precisions, and starts no run."""
    (load,) = [fn for fn in demo.fns.values() if fn.fn is page_io.from_link]
    link_ids = [c.elem_id for c in load.outputs]
    for number, step in enumerate(tour.load_tour(), start=1):
        (button,) = [b for b in demo.blocks.values() if b.elem_id == f"tour_setup_{number}"]
        clicks = [fn for fn in demo.fns.values() if (button._id, "click") in fn.targets]
        assert len(clicks) == 1, f"step {number}: {len(clicks)} click events"
        (click,) = clicks
        ids = [c.elem_id for c in click.outputs]
        assert ids[: len(link_ids)] == link_ids, f"step {number} writes {ids}"
        assert ids[-1] == f"tour_note_{number}" and isinstance(click.outputs[-2], gr.State)
        assert click.fn(Precision()) == tour.set_up(step, Precision()), step.title


@pytest.mark.real_model
def test_each_setup_is_valid_input_for_a_run(demo, embedded_model):
    """The page as each step's setup leaves it (the rest as the page opens) is what Run takes:
    its settings parse and the table tokenizes within the KV budget on the embedded model."""
    model = local_model(WorkerModel.from_loaded(embedded_model))
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    opened = {n: c.value for n, c in zip(RUN_INPUTS, run.inputs, strict=True)}
    for step in tour.load_tour():
        page = _applied(opened, _set_up(step))
        fields = {f.name: page[f.name] for f in dataclasses.fields(RunSettings)}
        settings = RunSettings(**fields | {"dtype": None, "model": None})
        options = options_from_page(settings)
        requests, config = prepare(model, settings.rows, settings.num_slots, options)
        assert len(requests) == len(settings.rows) and config.num_slots == page["num_slots"]


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
