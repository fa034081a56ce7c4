"""Engine settings in links: written only where they differ, read back the same, bad ones named."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import parse_qs

import gradio as gr
import pytest

from engine.page.inputs import link_query, page_io, presets

SKIP = gr.skip()
MISTRAL = "/models/tiny-Mistral"  # a folder on the host's allowlist: its case is kept
HOST = link_query.Precision("float32", ("float32", "bfloat16"), "embedded", ("embedded", MISTRAL))
# Every setting a link carries at a value other than the page's default, as the page hands it to
# setup_query (numbers as floats, as gr.Number sends them), and the parameter it is written as.
CHANGED = {
    "chat_template": (True, "chat", "1"),
    "prefix_caching": (True, "prefix_caching", "1"),
    "check_reference": (False, "check", "0"),
    "kv_mode": ("slots", "kv", "slots"),
    "token_budget": (64.0, "budget", "64"),
    "policy": ("vllm", "policy", "vllm"),
    "compare_hf": (True, "hf", "1"),
    "arrival_rate": (2.5, "rate", "2.5"),
    "x_axis": ("step", "x", "step"),
    "kv_budget_mib": (0.5, "kv_mib", "0.5"),
    "block_size": (32.0, "block", "32"),
    "dtype": ("bfloat16", "dtype", "bfloat16"),
    "batch_invariant": (True, "invariant", "1"),
    "model": (MISTRAL, "model", MISTRAL),
}


def _opened(query: str, precision=HOST) -> dict:
    """What from_link sets for ``query`` (``?a=b&...``), by LINK_OUTPUTS name."""
    params = {k: v[0] for k, v in parse_qs(query[1:], keep_blank_values=True).items()}
    updates = page_io.from_link(SimpleNamespace(query_params=params), precision)
    return dict(zip(page_io.LINK_OUTPUTS, updates, strict=True))


def test_every_setting_is_a_link_parameter():
    """Each setting the link carries is one LINK_OUTPUTS name, and the test covers every one."""
    assert set(CHANGED) == set(link_query.PARAMS), "a setting without a round-trip case"
    assert set(link_query.PARAMS) <= set(page_io.LINK_OUTPUTS) & set(page_io.LINK_INPUTS)
    names = [p.url for p in link_query.PARAMS.values()]
    assert len(names) == len(set(names)), f"two settings share a parameter name: {names}"


def test_changed_settings_round_trip_through_the_link(recwarn):
    """Every setting changed from its default is written under its short name and set again, to
    the same value, when the link opens; no warning."""
    values = {field: value for field, (value, _, _) in CHANGED.items()}
    seed = presets.by_slug("seed")
    query = page_io.setup_query(seed, 3, 0, None, precision=HOST, **values)
    written = {k: v[0] for k, v in parse_qs(query[1:]).items()}
    wanted = {name: text for _, name, text in CHANGED.values()}
    assert written == {"preset": "seed", "slots": "3", **wanted}, query
    opened = _opened(query)
    for field, (value, _, _) in CHANGED.items():
        assert opened[field] == value, f"{field}: the link set {opened[field]!r}, not {value!r}"
    assert opened["preset"] == seed and opened["num_slots"] == 3, opened
    assert not [str(w.message) for w in recwarn], "a good link warned"


def test_settings_at_their_defaults_stay_out_of_the_link():
    """A page whose settings are its defaults (numbers as gr.Number sends them, or blank) writes
    the link it wrote before settings travelled."""
    defaults = link_query.page_defaults(presets.DEFAULT_PRESET, HOST)
    as_sent = {k: float(v) if type(v) is int else v for k, v in defaults.items()}
    query = page_io.setup_query(presets.DEFAULT_PRESET, 3, 12, object(), precision=HOST, **as_sent)
    assert query == "?preset=seed&slots=3&step=12", query
    blanks = dict.fromkeys(("token_budget", "kv_budget_mib", "arrival_rate", "block_size"), "")
    assert page_io.setup_query(None, 2, 0, None, **blanks) == "?slots=2"


def test_the_page_opens_with_the_defaults_a_link_leaves_out():
    """Each linked setting's component shows, when the page opens, the default the link leaves
    out, so a link without it means that value."""
    import app

    host = link_query.Precision(dtypes=("float32", "bfloat16", "float16"))
    demo = app.build_demo("Model: test", precision=host)
    (load,) = [fn for fn in demo.fns.values() if fn.fn is page_io.from_link]
    (precision,) = load.inputs
    assert precision.value == link_query.Precision("float32", ("float32", "bfloat16", "float16"))
    defaults = link_query.page_defaults(presets.DEFAULT_PRESET, precision.value)
    for field in link_query.PARAMS:
        shown = load.outputs[page_io.LINK_OUTPUTS.index(field)].value
        wanted = defaults[field]
        assert shown == wanted, f"{field} opens at {shown!r}; a link assumes {wanted!r}"
    (copy,) = [fn for fn in demo.fns.values() if fn.fn is page_io.setup_query]
    assert len(copy.inputs) == len(page_io.LINK_INPUTS), "Copy link reads other inputs"
    assert copy.inputs[page_io.LINK_INPUTS.index("precision")] is precision


@pytest.mark.parametrize(
    ("param", "value", "said"),
    [
        ("chat", "maybe", "use 1 (on) or 0 (off); the page keeps it off"),
        ("check", "2", "use 1 (on) or 0 (off); the page keeps it on"),
        ("hf", "yes please", "use 1 (on) or 0 (off)"),
        ("invariant", "-1", "use 1 (on) or 0 (off)"),
        ("kv", "ring", "use one of slots, paged, concat; the page keeps paged"),
        ("policy", "fifo", "use one of decode_first, prefill_first, vllm; the page keeps decode"),
        ("budget", "-3", "not a whole number >= 0; the page keeps 0 (no limit)"),
        ("budget", "7.5", "not a whole number >= 0"),
        ("block", "0", "not a whole number from 1 to 256; the page keeps 16"),
        ("block", "1e9", "not a whole number from 1 to 256"),
        ("rate", "nan", "not a number >= 0; the page keeps 0 (the table's arrival_s)"),
        ("rate", "inf", "not a number >= 0"),
        ("kv_mib", "-1", "not a number >= 0; the page keeps 0 (room for every slot)"),
        ("x", "tokens", "use one of time, step; the page keeps time"),
        ("dtype", "float16", "use one of float32, bfloat16; the page keeps float32"),
        ("kv", "<b>x</b>", "kv='&lt;b&gt;x&lt;/b&gt;' is ignored"),
        ("model", "/models/tiny-mistral", f"this page offers embedded, {MISTRAL} (the host's"),
        ("model", "org/other", "CBP_MODEL_ALLOWLIST); the page keeps embedded"),
    ],
)
def test_a_bad_setting_is_named_and_keeps_its_default(param, value, said):
    """A bad value is named in a warning with what the page keeps; that setting stays as the page
    has it, and the link's other settings still apply."""
    good = {"x": "step"} if param != "x" else {"budget": "64"}
    query = "?" + "&".join(f"{k}={v}" for k, v in {param: value, **good, "slots": "4"}.items())
    with pytest.warns(UserWarning) as warned:
        opened = _opened(query)
    messages = [str(w.message) for w in warned]
    assert any(f"{param}=" in m and said in m for m in messages), f"{said!r} not in {messages}"
    (field,) = [f for f, p in link_query.PARAMS.items() if p.url == param]
    assert opened[field] == SKIP, f"a bad {param} still set {field}: {opened[field]!r}"
    good_field = "x_axis" if param != "x" else "token_budget"
    assert opened[good_field] in ("step", 64) and opened["num_slots"] == 4, opened


def test_a_dtype_is_chosen_only_among_the_hosts():
    """dtype=float16 applies on a host that offers it; a link naming the host's own dtype sets it
    without a warning; letter case does not matter."""
    cuda = link_query.Precision("bfloat16", ("float32", "bfloat16", "float16"))
    assert _opened("?dtype=FLOAT16", cuda)["dtype"] == "float16"
    query = page_io.setup_query(None, 3, 0, None, dtype="bfloat16", precision=cuda)
    assert "dtype" not in query, f"the host's own dtype was written: {query}"
    assert "dtype=float32" in page_io.setup_query(None, 3, 0, None, dtype="float32", precision=cuda)


def test_a_model_is_chosen_only_among_the_hosts():
    """model= applies only on a host whose picker offers it; a page with one model takes a link
    naming that one, and names any other in a warning."""
    assert _opened(f"?model={MISTRAL}")["model"] == MISTRAL
    alone = link_query.Precision()  # one model: no picker
    assert _opened("?model=embedded", alone)["model"] == "embedded"
    with pytest.warns(UserWarning, match="this page offers embedded"):
        assert _opened(f"?model={MISTRAL}", alone)["model"] == SKIP
    query = page_io.setup_query(None, 3, 0, None, model="embedded", precision=HOST)
    assert "model" not in query, f"the model the page opens with was written: {query}"
