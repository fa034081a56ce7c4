"""The servers' figures from hand-written records: lanes per request, gauges over time."""

from __future__ import annotations

from engine.llamacpp.server import published_props
from engine.page.figures import server_lanes, style
from engine.peers.server_metrics import slots_kv_pct
from engine.trace import RequestRecord, ScheduledSeq, ServerSample, StepRecord, Trace


def _server_trace(name: str = "gpu") -> Trace:
    """R0 sent at 0.1 s, first token 0.4 s, last 1.0 s; R1 sent at 0.2 s, no token yet."""
    r0 = RequestRecord(0, "a", 8, 3, admit_s=0.1, first_token_s=0.4, finish_s=1.0)
    r0.token_times_s = [0.4, 0.7, 1.0]
    r1 = RequestRecord(1, "b", 8, 3, admit_s=0.2)
    samples = [
        ServerSample(0.25, {"num_requests_running": 2.0, "num_requests_waiting": 0.0}),
        ServerSample(0.5, {"num_requests_running": 1.0, "kv_cache_usage_pct": 12.5}),
    ]
    trace = Trace(name, 2, requests=[r0, r1], wall_s=1.0, server_samples=samples)
    trace.info = {"server": {"name": name}}
    return trace


def test_lanes_wait_then_decode_per_request():
    """Pale bar from sent to first token, solid from first to last; unsent-token R1 waits only."""
    fig = server_lanes.server_timeline_figure({"gpu": _server_trace()}, x_max=2.5)
    bars = {t.name: t for t in fig.data}
    waiting, decoding = bars["waiting for the first token"], bars["decoding"]
    assert list(waiting.y) == ["R0", "R1"] and list(decoding.y) == ["R0"]
    assert [round(b, 3) for b in waiting.base] == [0.1, 0.2]
    assert [round(w, 3) for w in waiting.x] == [0.3, 0.0], "R0 waited 0.3 s; R1 has no token yet"
    assert (decoding.base[0], round(decoding.x[0], 3)) == (0.4, 0.6)
    assert tuple(fig.layout.xaxis.range) == (0, 2.5), "not on the shared x scale"
    assert "gpu — 1/2 requests done · 1.00 s" in [a.text for a in fig.layout.annotations]


def test_lanes_on_our_longer_x_axis_say_it_is_shared_and_where_the_servers_end():
    """The servers' lanes keep our timelines' x axis (to 19 s, our static run) though the
    servers ended at 1 s, so lengths compare across engines: the subtitle says so, and where the
    servers' runs end (without it, the empty 18 s read as a wrong range)."""
    fig = server_lanes.server_timeline_figure({"gpu": _server_trace()}, x_max=19.0)
    assert tuple(fig.layout.xaxis.range) == (0, 19.0)
    subtitle = fig.layout.title.subtitle.text
    # in seconds whatever our timelines' axis: drawn by step index, theirs is not shared
    assert "x axis in seconds, on our timelines' time scale" in subtitle, subtitle
    assert "the servers end by 1.00 s" in subtitle, subtitle
    alone = server_lanes.server_timeline_figure({"gpu": _server_trace()})
    assert "shared" not in alone.layout.title.subtitle.text, "its own axis is said to be shared"


def test_one_panel_per_server():
    """Two servers: two panels sharing the x axis, each with its own lanes."""
    fig = server_lanes.server_timeline_figure({"a": _server_trace("a"), "b": _server_trace("b")})
    assert {t.yaxis for t in fig.data} == {"y", "y2"}
    assert fig.layout.xaxis2.matches == "x" or fig.layout.xaxis.matches == "x2"


def test_gauges_beside_our_engine():
    """The chart draws the gauges a server has (none invented) and ours per step."""
    ours = Trace("continuous", 2, wall_s=0.2)
    ours.requests = [RequestRecord(0, "a", 2, 3), RequestRecord(1, "b", 2, 3)]
    ours.steps = [
        StepRecord(0, 0.0, 0.1, [ScheduledSeq(0, 0, "prefill", 3, 0)], kv_blocks_used=1),
        StepRecord(1, 0.1, 0.2, [ScheduledSeq(0, 0, "decode", 1, 3)], kv_blocks_used=2),
    ]
    ours.info = {"kv_blocks": 4}
    fig = server_lanes.server_chart_figure({"gpu": _server_trace()}, ours)
    lines = {t.name: (list(t.x), list(t.y)) for t in fig.data}
    assert lines["gpu: running"] == ([0.25, 0.5], [2.0, 1.0])
    assert lines["gpu: waiting"] == ([0.25], [0.0]), "a missing gauge was filled in"
    assert lines["gpu: KV use %"] == ([0.5], [12.5])
    assert lines["continuous (ours): running"] == ([0.0, 0.1], [1, 1])
    assert lines["continuous (ours): waiting"] == ([0.0, 0.1], [1, 1]), "R1 waits both steps"
    assert lines["continuous (ours): KV blocks %"] == ([0.0, 0.1], [25.0, 50.0])


def test_no_samples_or_no_server_says_why():
    """A server without /metrics, or no server at all: an empty chart that says why."""
    bare = _server_trace()
    bare.server_samples = []
    bare.info["server"]["metrics_note"] = "/metrics answered HTTP 404: no server samples"
    fig = server_lanes.server_chart_figure({"gpu": bare})
    text = fig.layout.annotations[0].text.replace("<br>", " ")  # in lines a phone shows whole
    assert text == "gpu: /metrics answered HTTP 404: no server samples", text
    assert "No server ran" in server_lanes.server_timeline_figure({}).layout.annotations[0].text


def test_kv_use_says_what_100_percent_is_for_each_engine():
    """A server's KV use and ours are shares of different pools: each KV line's hover says what
    its 100 % is (the pool, in blocks and MiB where known), and the subtitle gives every pool."""
    ours = Trace("continuous", 2, wall_s=0.1)
    ours.steps = [StepRecord(0, 0.0, 0.1, [ScheduledSeq(0, 0, "prefill", 3, 0)], kv_blocks_used=1)]
    ours.info = {"kv_blocks": 28, "block_size": 16, "kv_bytes": 28 * 16 * 9216}
    vllm = _server_trace("vllm")
    vllm.info["server"] |= {
        "kv_pool": {"whole": "every block of vLLM's KV block pool", "num_blocks": 1310},
        "settings": {"kv_cache_bytes": 80 * 2**20},
    }
    bare = _server_trace("remote")
    fig = server_lanes.server_chart_figure({"vllm": vllm, "remote": bare}, ours)
    hover = {t.name: t.hovertemplate for t in fig.data}
    assert (
        "100 % = every block of vLLM's KV block pool: 1,310 blocks, 80.0 MiB"
        in hover["vllm: KV use %"]
    ), hover["vllm: KV use %"]
    ours_whole = "100 % = every block of its paged KV pool: 28 blocks of 16 tokens, 3.94 MiB"
    assert ours_whole in hover["continuous (ours): KV blocks %"]
    assert "its size is not published" in hover["remote: KV use %"]
    assert "100 %" not in hover["vllm: running"], "a request count was given a pool"
    subtitle = fig.layout.title.subtitle.text
    for pool in ("vllm: 1,310 blocks, 80.0 MiB", "remote: size not published", "(ours): 28 blocks"):
        assert pool in subtitle, f"{pool!r} missing from the subtitle: {subtitle}"


# /props and /slots as llama-server answers them with --parallel 3 and --ctx-size 1536 (fields
# this project does not read left out)
LLAMA_PROPS = {
    "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8}, "n_ctx": 512},
    "total_slots": 3,
    "model_alias": "smollm2-135m-instruct",
    "build_info": "b1-a1b2c3d",
}
LLAMA_SLOTS = [
    {"id": i, "n_ctx": 512, "is_processing": i == 0, "n_prompt_tokens": 40,
     "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": 10,
                     "n_decoded": 6}]}
    for i in range(3)
]  # fmt: skip


def test_llamacpp_pool_is_its_slots_and_their_context():
    """llama.cpp publishes its slots and each one's context: from /props for a server this page
    started (known from the run's start), from /slots for any llama-server. The subtitle and the
    KV line's hover give them where they said "size not published"; vLLM's stay as they are."""
    local = _server_trace("llamacpp")
    _pct, pool = slots_kv_pct(LLAMA_SLOTS)
    local.info["server"] |= {"kv_pool": pool, "settings": {"props": published_props(LLAMA_PROPS)}}
    remote = _server_trace("llama_box")
    remote.info["server"] |= {"kv_pool": pool}
    vllm = _server_trace("vllm")
    vllm.info["server"] |= {
        "kv_pool": {"whole": "every block of vLLM's KV block pool", "num_blocks": 1310},
        "settings": {"kv_cache_bytes": 80 * 2**20},
    }
    servers = {"llamacpp": local, "llama_box": remote, "vllm": vllm}
    fig = server_lanes.server_chart_figure(servers)
    subtitle = fig.layout.title.subtitle.text
    for size in (
        "llamacpp: 3 slots × 512 tokens (llama.cpp /props)",
        "llama_box: 3 slots × 512 tokens (llama.cpp /slots)",
        "vllm: 1,310 blocks, 80.0 MiB",
    ):
        assert size in subtitle, f"{size!r} missing from the subtitle: {subtitle}"
    assert "not published" not in subtitle, subtitle
    hover = {t.name: t.hovertemplate for t in fig.data}
    whole = "100 % = every slot's context in llama.cpp's KV cache, from /slots: 3 slots × 512"
    assert f"{whole} tokens (llama.cpp /props)" in hover["llamacpp: KV use %"], hover
    assert "not published" not in hover["llama_box: KV use %"], hover
    assert published_props({"total_slots": 0, "default_generation_settings": {}}) == {}


def test_a_message_chart_breaks_its_text_into_lines_a_phone_shows_whole():
    """ "No server ran…" (and every other empty chart's message) comes in lines of at most
    MESSAGE_LINE_CHARS characters (Plotly never wraps: one long line was clipped on a phone),
    and the lines together say the whole message."""
    fig = server_lanes.server_timeline_figure({}, None)
    lines = fig.layout.annotations[0].text.split("<br>")
    assert len(lines) > 1 and max(map(len, lines)) <= style.MESSAGE_LINE_CHARS, lines
    assert " ".join(lines) == server_lanes.NO_SERVER, lines
