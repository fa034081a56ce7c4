"""Table builders: the metrics and outputs tables, as rows of plain values (no plotly, no HTML).
Runs come as ``{engine name: Trace}`` in display order.
"""

from __future__ import annotations

from engine.fidelity.reference import (
    MATCH,
    MISMATCH,
    NOT_COMPARED,
    NOT_COMPARED_TEXT,
    comparison,
    not_compared_ids,
)
from engine.page.views.divergence_view import NOT_AVAILABLE, join_labels, verdict_label
from engine.page.views.divergence_view import NOT_COMPARED as NOT_COMPARED_LABEL
from engine.trace import RequestRecord, Trace

# Column widths in pixels: each name's longest word whole (14 px monospace, 8.4 px a character,
# and the cell's 16 px of padding), 1,204 in all, so the table fits a 1,400 px window whole (its
# 1,214 px); a narrower one scrolls.
METRICS_COLUMN_WIDTHS = [110, 72, 64, 92, 72, 80, 80, 110, 80, 80, 110, 136, 118]
# The metrics table's columns in order, with their hover definitions (the page sets them as the
# column names' titles); the prefix-cache column came last, so the /run API's metrics columns keep
# their places. Padding waste and slot utilisation have different denominators, so they need not
# add to 100.
METRICS_COLUMNS = {
    "engine": "",
    "wall s": "Seconds from the engine's start to its last token (arrival waits included).",
    "steps": "Forward passes of the model. Unlike wall time, the same on every machine.",
    "generated tokens": "Output tokens, up to each request's end-of-sequence or cap; no padding.",
    "tok/s": "Generated tokens per wall-clock second.",
    "speedup vs static": "Static batching's wall time over this engine's.",
    "padding waste %": (
        "Of all token positions the model computed: the share that was left padding or a row "
        "whose request had already finished (static batching). Denominator: computed tokens."
    ),
    "slot utilisation %": (
        "Of all slot-steps (slots × steps): the share in which a slot worked on a live request. "
        "Denominator: slots × steps, so it need not add to 100 with padding waste."
    ),
    "mean TTFT s": "Mean time to first token, from each request's arrival. A server with its "
    "own record of its steps (the page's vLLM) shows two: outside, when our client saw the "
    "token; inside, when its record says the step that computed it ended.",
    "p99 TTFT s": "99th percentile of the time to first token (a server with its own record: "
    "outside and inside, as for the mean).",
    "preemptions": "Times the paged KV cache ran dry and a sequence gave up its blocks.",
    "outputs match model.generate": "✓ when every output equals plain model.generate, token "
    "for token. A request transformers' manager or a server sampled with its own random stream "
    "cannot be compared: it is counted as not compared, never as a mismatch.",
    "prefix-cache hit rate %": (
        "Of all prompt tokens: the share taken from the prefix cache instead of being prefilled "
        "(paged KV with prefix caching; the static engine never shares). — where an engine does "
        "not say (transformers' manager)."
    ),
}
METRICS_HEADERS = list(METRICS_COLUMNS)
GENERATE_MATCH_HEADER = "outputs match model.generate"
SOLO_MATCH_HEADER = "outputs match their runs alone"  # a batch-invariant run's reference
METRIC_HELP = {name: text for name, text in METRICS_COLUMNS.items() if text} | {
    SOLO_MATCH_HEADER: "Batch-invariant mode: ✓ when every output equals its request run alone "
    "in that mode, token for token and logits bitwise (not model.generate, whose kernels differ)."
}
METRICS_NOTE = (
    "**padding waste %** counts wasted token positions among those computed; **slot "
    "utilisation %** counts busy slot-steps among slots × steps. Different denominators: the two "
    "need not add to 100. A server's steps, slot use, preemptions and prefix-cache hits come "
    "from its own record of its steps where it keeps one (the page's own vLLM); its TTFT "
    "columns then give both views: **outside** (our client) and **inside** (its record). "
    "Hover a column's name for its definition."
)
OUTSIDE, INSIDE = "outside", "inside"  # a server's TTFT seen by the client, and by its own record
ANOTHER_MODEL_TEXT = "another model, not compared"
_COMPARISON_LABELS = {MATCH: "✓", MISMATCH: "✗ differs", NOT_COMPARED: NOT_COMPARED_LABEL}
PROMPT_SHOWN_CHARS = 200  # longer prompts are clipped in the outputs table


def metrics_rows(traces: dict[str, Trace], reference_ok: dict[str, str] | None) -> list[list]:
    """One ``METRICS_HEADERS`` row per engine; speedup is static wall time over this engine's.
    Engines without steps show "—" for the step columns; ``reference_ok[name]``: ✓ ≈ ≠ or ✗."""
    static_wall_s = traces["static"].wall_s if "static" in traces else None
    rows = []
    for name, trace in traces.items():
        m = trace.metrics()
        inside = trace.schedule if trace.schedule is not None else trace  # the steps' record
        s = inside.metrics() if inside is not trace else m
        has_steps = bool(inside.steps)
        speedup = f"{static_wall_s / m.wall_s:.2f}×" if static_wall_s and m.wall_s > 0 else "—"
        ok = NOT_AVAILABLE
        if reference_ok and name in reference_ok:
            ok = _match_cell(reference_ok[name], len(not_compared_ids(trace)))
        rows.append(
            [
                name,
                round(m.wall_s, 2),
                s.num_steps if has_steps else NOT_AVAILABLE,
                m.num_generated_tokens,
                round(m.tok_per_s, 1),
                speedup,
                round(s.padding_waste_pct, 1) if has_steps else NOT_AVAILABLE,
                round(s.slot_utilisation_pct, 1) if has_steps else NOT_AVAILABLE,
                *_ttft_cells(trace),
                s.num_preemptions if has_steps else NOT_AVAILABLE,
                ok,
                _percent(s.prefix_cache_hit_rate),
            ]
        )
    return rows


def _ttft_cells(trace: Trace) -> list[float | str]:
    """Mean and p99 TTFT; with a server's own record both views: "outside 0.52 · inside 0.50"."""
    mean_s, p99_s = trace.metrics().mean_ttft_s, trace.latency_percentiles()["ttft_s"]["p99"]
    if trace.schedule is None or not trace.schedule.steps:
        return [round(mean_s, 2), _rounded(p99_s)]
    inside = trace.schedule
    inside_mean_s, inside_p99_s = (
        inside.metrics().mean_ttft_s,
        inside.latency_percentiles()["ttft_s"]["p99"],
    )
    return [
        f"{OUTSIDE} {mean_s:.2f} · {INSIDE} {inside_mean_s:.2f}",
        f"{OUTSIDE} {_rounded(p99_s)} · {INSIDE} {_rounded(inside_p99_s)}",
    ]


def _match_cell(mark: str, num_not_compared: int) -> str:
    if not num_not_compared:
        return mark
    return f"{mark} ({num_not_compared} {NOT_COMPARED_TEXT})"


def _percent(share: float | None) -> float | str:
    return NOT_AVAILABLE if share is None else round(100 * share, 1)


def _rounded(value: float | None) -> float | str:
    return NOT_AVAILABLE if value is None else round(value, 2)


CACHED_TOKENS_HEADER = "prompt tokens from the prefix cache"


def metrics_headers(batch_invariant: bool = False) -> list[str]:
    """``METRICS_HEADERS``, the match column named after the run's reference."""
    if not batch_invariant:
        return METRICS_HEADERS
    return [SOLO_MATCH_HEADER if h == GENERATE_MATCH_HEADER else h for h in METRICS_HEADERS]


def outputs_headers(engine_names: list[str], reference: str = "model.generate") -> list[str]:
    """request, prompt, cap, one column per engine, the verdict, then prefix-cache prompt tokens."""
    return [
        "request",
        "prompt",
        "cap",
        *(f"{n} output" for n in engine_names),
        f"matches {reference}",
        CACHED_TOKENS_HEADER,
    ]


def compared(trace: Trace) -> bool:
    """False for a server whose outputs the reference cannot judge (``not_compared_why``)."""
    return not_compared_why(trace) is None


def not_compared_why(trace: Trace) -> str | None:
    """Why a server's outputs are left out of the check (another model or precision), or None."""
    server = trace.info.get("server") or {}
    if server.get("same_model") is False:
        return ANOTHER_MODEL_TEXT
    if server.get("run_dtype") and server.get("dtype") and server["dtype"] != server["run_dtype"]:
        return f"{server['dtype']}, not {server['run_dtype']}: not compared"
    return None


def outputs_rows(
    traces: dict[str, Trace],
    reference: dict[int, list[int]] | None,
    verdicts: dict[str, dict[int, dict]] | None = None,
) -> list[list]:
    runs = list(traces.items())
    first = runs[0][1]
    unchecked = {name: why for name, trace in runs if (why := not_compared_why(trace))}
    rows = []
    for i, req in enumerate(first.requests):
        records = [(name, trace.requests[i]) for name, trace in runs]
        verdict = NOT_AVAILABLE
        if reference is not None:
            checked = [(n, r) for n, r in records if n not in unchecked]
            verdict = _verdict(checked, reference, verdicts)
            verdict += "".join(f" · {name}: {why}" for name, why in unchecked.items())
        texts = [r.output_text for _, r in records]
        prompt = _clip(req.prompt, PROMPT_SHOWN_CHARS)
        cached = _cached_tokens(traces, i)
        rows.append([f"R{req.request_id}", prompt, req.max_new_tokens, *texts, verdict, cached])
    return rows


def _cached_tokens(traces: dict[str, Trace], index: int) -> int | str:
    """Prefix-cache tokens for one request ("of 575"): ours, then each server's ("· vllm 512")."""
    trace = traces.get("continuous")
    record = trace.requests[index] if trace is not None else None
    ours = NOT_AVAILABLE
    if record is not None and record.num_cached_tokens is not None:
        ours = f"{record.num_cached_tokens} of {record.num_prompt_tokens}"
    servers = [
        f"{name} {t.schedule.requests[index].num_cached_tokens}"
        for name, t in traces.items()
        if t.schedule is not None and t.schedule.steps
    ]
    return " · ".join([ours, *servers]) if servers else ours


def _verdict(
    records: list[tuple[str, RequestRecord]], reference: dict[int, list[int]], judged=None
) -> str:
    """The verdict cell: "✓", or each engine's label (own-generator engines not compared)."""
    judged = judged or {}
    return join_labels(
        {
            n: verdict_label(judged, n, r.request_id)
            if n in judged
            else _COMPARISON_LABELS[comparison(r, reference) or MISMATCH]
            for n, r in records
        }
    )


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} chars)"
