"""A knob declared once reaches every place a person meets it: a dummy knob appended to
``engine.knobs.KNOBS`` (in a fresh Python, before anything else reads the schema) shows on the
page, is one of the /run API's inputs and parses into ``RunOptions``, is read from a link and
written back by "Copy link", and is a bench flag, with no other edit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run in a fresh interpreter: the page's lists are built from the schema when first imported.
SCRIPT = r"""
import json
import engine.knobs as knobs

dummy = knobs.Knob("dummy_knob", "whole", 0, label="Dummy knob", url="dummy",
                   bench_flag="--dummy", bench_help="a test's knob")
knobs.KNOBS = (*knobs.KNOBS, dummy)
knobs.KNOB[dummy.name] = dummy

import app
from engine.bench.args import parse_args
from engine.page.inputs import page_io
from engine.page.run import run_options

demo = app.build_demo("Model: test")
found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "dummy_knob_number"]
run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
copy = next(fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "setup_query")
api = demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
settings, _, _ = run_options.settings_from_run([["hi", 2]], 3, False, True, "paged", 0,
                                               "decode_first", False, 0, "time", dummy_knob="3")
opened = page_io.from_query({"preset": "seed", "dummy": "3"})
bad = page_io.from_query({"preset": "seed", "dummy": "x"})
print(json.dumps({
    "page": [(type(b).__name__, b.label, b.value) for b in found],
    "run_wired": [c.elem_id for c in run.inputs if c.elem_id == "dummy_knob_number"],
    "api": [p["parameter_name"] for p in api][-2:],
    "option": run_options.options_from_page(settings).dummy_knob,
    "link_read": opened[page_io.LINK_OUTPUTS.index("dummy_knob")],
    "link_warning": bad[page_io.LINK_OUTPUTS.index("input_warning")],
    "copy_wired": [c.elem_id for c in copy.inputs if c.elem_id == "dummy_knob_number"],
    "link_written": page_io.setup_query("Article's six requests", 3, 0, None, dummy_knob=3),
    "bench": parse_args(["--dummy", "3"]).dummy,
    "bench_default": parse_args([]).dummy,
}))
"""


def test_a_knob_declared_once_reaches_the_page_the_api_links_and_the_bench():
    """Only the declaration is new, yet every consumer finds the dummy knob."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["page"] == [["Number", "Dummy knob", 0]], seen["page"]
    assert seen["run_wired"] == ["dummy_knob_number"], "Run does not read its component"
    assert seen["api"] == ["model", "dummy_knob"], "a new knob goes at the end of /run"
    assert seen["option"] == 3, "/run's value did not parse into RunOptions"
    assert seen["link_read"] == 3, "?dummy=3 did not set it"
    assert "dummy" in seen["link_warning"], "a bad ?dummy= was not named"
    assert seen["copy_wired"] == ["dummy_knob_number"], "Copy link does not read its component"
    assert "dummy=3" in seen["link_written"], seen["link_written"]
    assert (seen["bench"], seen["bench_default"]) == (3, 0), "the bench's --dummy"
