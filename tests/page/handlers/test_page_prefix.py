"""Prefix caching in the page: the toggle reaches the engine, and the block map, the packed mask,
the metrics and outputs tables, links and the "Shared system prompt" preset show what it shared."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import parse_qs

import gradio as gr
import pytest
from page_runs import run_and_render

from engine.page.handlers import playground
from engine.page.inputs import page_io, presets
from engine.page.run import run_options
from engine.page.views import tables
from engine.workloads.workload import load_jsonl, parse_table

BLOCK_SIZE = 4
SYSTEM = "You are a helpful assistant. Answer briefly and kindly. "  # 56 bytes: 14 full blocks
# One token per byte (the tiny model's tokenizer): the shared opening fills 14 blocks of 4, and
# the questions differ from their first letter on.
ROWS = [
    [SYSTEM + "Q: one?", 6],
    [SYSTEM + "Q: two?", 5],
    ["unrelated", 4],
    [SYSTEM + "Q: six?", 6],
    [SYSTEM + "Q: four?", 4],
]
HIT_RATE = tables.METRICS_HEADERS.index("prefix-cache hit rate %")


def _options(check_reference: bool, kv_mode: str, block_size: str) -> run_options.RunOptions:
    """The page's settings with the prefix-caching toggle on, as the page sends them, parsed."""
    settings = run_options.RunSettings(
        rows=ROWS,
        num_slots=3,
        chat_template=False,
        check_reference=check_reference,
        kv_mode=kv_mode,
        token_budget="0",
        policy="decode_first",
        compare_hf=False,
        arrival_rate="0",
        x_axis="time",
        kv_budget_mib="0",
        block_size=block_size,
        prefix_caching=True,
    )
    return run_options.options_from_page(settings)


@pytest.fixture(scope="module")
def result(shared) -> playground.RunResult:
    """Three slots: R0, R1 and R2 start together (R0 and R1 each compute the opening), then R3
    and R4 are admitted together and share the cached opening's blocks."""
    options = _options(check_reference=True, kv_mode="paged", block_size=str(BLOCK_SIZE))
    return run_and_render(ROWS, 3, options, shared)


def test_the_toggle_shares_prefix_blocks_and_outputs_still_match(result):
    """With the toggle on the continuous engine takes later prompts' shared opening from the
    cache (whole blocks), the static engine none, and every output equals model.generate."""
    continuous, static = result.state.continuous, result.state.static
    assert continuous.info["prefix_caching"] is True
    assert "✓ all match" in result.status, result.status
    cached = [r.num_cached_tokens for r in continuous.requests]
    assert cached[:3] == [0, 0, 0], f"R0 to R2 start together, with nothing cached: {cached}"
    assert cached[3] == cached[4] == len(SYSTEM) // BLOCK_SIZE * BLOCK_SIZE, cached
    assert all(r.num_cached_tokens == 0 for r in static.requests), "the static engine shared"
    rows = {row[0]: row for row in result.metrics}
    prompt_tokens = sum(r.num_prompt_tokens for r in continuous.requests)
    assert rows["continuous"][HIT_RATE] == round(100 * sum(cached) / prompt_tokens, 1) > 0
    assert rows["static"][HIT_RATE] == 0.0, rows["static"]
    shown = [row[-1] for row in result.outputs]
    want = [f"{r.num_cached_tokens} of {r.num_prompt_tokens}" for r in continuous.requests]
    assert shown == want, f"outputs table's cached tokens: {shown}"


def test_block_map_shows_shared_blocks_with_refcount_and_sharers(result):
    """At a step where blocks are shared, each shared block is labelled with its first holder
    and reference count, and its hover names every request holding it."""
    trace = result.state.continuous
    step = next(s for s in trace.steps if any(len(h) > 1 for h in s.block_holders().values()))
    block_map = playground.update_step(result.state, step.index, "step")[4]
    heatmap = block_map.data[0]
    cols = len(heatmap.z[0])
    for block, holders in step.block_holders().items():
        label = heatmap.text[block // cols][block % cols]
        hover = heatmap.customdata[block // cols][block % cols]
        if len(holders) == 1:
            assert label == f"R{holders[0]}", label
            continue
        assert label == f"R{holders[0]} ×{len(holders)}", label
        sharers = ", ".join(f"R{r}" for r in holders)
        assert f"shared by {sharers} (refcount {len(holders)})" in hover, hover
    assert "prefix cache:" in block_map.layout.title.subtitle.text


def test_packed_mask_marks_the_keys_from_the_prefix_cache(result):
    """At a step whose sequences hold keys from the prefix cache, exactly those key columns are
    labelled "pos N*" and drawn in the paler codes; the subtitle counts them."""
    trace = result.state.continuous
    step = next(s for s in trace.steps if any(q.num_prefix_cached_tokens for q in s.seqs))
    mask = playground.update_step(result.state, step.index, "step")[2]
    heatmap = mask.data[0]
    from_cache = [label.endswith("*") for label in heatmap.x]
    want = sum(q.num_prefix_cached_tokens for q in step.seqs)
    assert sum(from_cache) == want > 0, f"{sum(from_cache)} columns marked, want {want}"
    num_seqs = len(step.seqs)
    for col, cached in enumerate(from_cache):
        codes = {int(row[col]) for row in heatmap.z if row[col] == row[col]}  # not NaN
        assert codes, f"key column {col} is attended by nobody"
        assert all((code >= num_seqs) == cached for code in codes), f"column {col}: {codes}"
    assert f"{want} keys from the prefix cache" in mask.layout.title.subtitle.text


def test_prefix_caching_without_paged_kv_is_refused_naming_why(shared):
    """The toggle with the in-place KV mode is refused before any engine runs, saying why."""
    options = _options(check_reference=False, kv_mode="slots", block_size="16")
    with pytest.raises(gr.Error, match="Prefix caching needs the paged KV cache"):
        run_and_render(ROWS, 2, options, shared)


def test_links_carry_the_toggle_and_old_links_leave_it_off(recwarn):
    """The setup link adds prefix_caching=1 only when the toggle is on; such a link turns it on,
    a link without it leaves it as it is, and a bad value is named in a warning."""
    name = presets.by_slug("shared-system-prompt")
    query = parse_qs(page_io.setup_query(name, 4, 0, None, True)[1:])
    assert query == {"preset": ["shared-system-prompt"], "slots": ["4"], "prefix_caching": ["1"]}
    assert "prefix_caching" not in page_io.setup_query(name, 4, 0, None, False)

    def link(**params):
        return page_io.from_link(SimpleNamespace(query_params=params))

    assert link(preset="shared-system-prompt", prefix_caching="1")[5] is True
    assert link(prefix_caching="0")[5] is False
    assert link(preset="seed")[5] == gr.skip(), "an old link changed the toggle"
    assert not recwarn.list, [str(w.message) for w in recwarn]
    with pytest.warns(UserWarning, match="prefix_caching='maybe' is ignored"):
        assert link(prefix_caching="maybe")[5] == gr.skip()


def test_shared_system_prompt_preset_is_the_shipped_workload():
    """The preset fills the table with assets/workloads/shared_prefix.jsonl at 4 slots, and its
    text says how to see prefix caching and that the static engine cannot share."""
    name = presets.by_slug("shared-system-prompt")
    rows, chat_template, text, slots, *_ = presets.choose_preset(name)
    assert parse_table(rows) == load_jsonl(presets.ASSETS / "workloads" / "shared_prefix.jsonl")
    assert (chat_template, slots) == (False, 4)
    assert "prefix caching" in text and "static engine cannot share" in text, text


def test_the_toggle_is_wired_after_the_runs_earlier_inputs():
    """app.py sends the toggle to Run right after the block size (the /run API's earlier inputs
    keep their places), and the link both writes and sets it."""
    import app

    demo = app.build_demo("Model: test")
    by_fn = {fn.fn: fn for fn in demo.fns.values()}
    ids = [getattr(c, "elem_id", None) for c in by_fn[playground.run_event].inputs]
    at = ids.index("block_size_number")
    assert ids[at + 1] == "prefix_caching_checkbox", ids
    assert ids[at + 3] == "servers_checkbox", "after the handle, the servers' choice comes first"
    assert ids.index("kv_budget_number") == at - 1, ids
    links = ((page_io.setup_query, "inputs", page_io.LINK_INPUTS),)
    links += ((page_io.from_link, "outputs", page_io.LINK_OUTPUTS),)
    for handler, wired, order in links:
        names = [getattr(c, "elem_id", None) for c in getattr(by_fn[handler], wired)]
        at = order.index("prefix_caching")
        assert names[at] == "prefix_caching_checkbox", f"{handler.__name__}: {names}"
