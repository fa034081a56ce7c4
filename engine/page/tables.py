"""Table builders: the metrics and outputs tables, as rows of plain values (no plotly, no HTML).

Both take the runs as ``{engine name: Trace}`` in display order, so a third engine (transformers'
own continuous batching) adds a row to the metrics and a column to the outputs. Output texts stay
plain strings: the page shows them as text, never as markup.
"""

from __future__ import annotations

from engine.trace import Trace

METRICS_HEADERS = [
    "engine",
    "wall s",
    "steps",
    "generated tokens",
    "tok/s",
    "speedup vs static",
    "padding waste %",
    "slot utilisation %",
    "mean TTFT s",
    "p99 TTFT s",
    "preemptions",
    "outputs match model.generate",
]
# Column widths in pixels: wide enough for each name on any screen (a narrow one scrolls).
METRICS_COLUMN_WIDTHS = [110, 84, 72, 100, 72, 100, 100, 110, 90, 90, 110, 150]
# Hover definitions of the metrics columns (the page sets them as the column names' titles).
# Padding waste and slot utilisation have different denominators, so they need not add to 100.
METRIC_HELP = {
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
    "mean TTFT s": "Mean time to first token, from each request's arrival.",
    "p99 TTFT s": "99th percentile of the time to first token.",
    "preemptions": "Times the paged KV cache ran dry and a sequence gave up its blocks.",
    "outputs match model.generate": "✓ when every output equals plain model.generate, token "
    "for token.",
}
METRICS_NOTE = (
    "**padding waste %** counts wasted token positions among those computed; **slot "
    "utilisation %** counts busy slot-steps among slots × steps. Different denominators: the two "
    "need not add to 100. Hover a column's name for its definition."
)
NOT_AVAILABLE = "—"
PROMPT_SHOWN_CHARS = 200  # longer prompts are clipped in the outputs table


def metrics_rows(traces: dict[str, Trace], reference_ok: dict[str, bool] | None) -> list[list]:
    """One ``METRICS_HEADERS`` row per engine; speedup is static wall time over this engine's.

    An engine that records no steps (transformers' manager exposes none) shows "—" for the
    step-based columns.
    """
    static_wall_s = traces["static"].wall_s if "static" in traces else None
    rows = []
    for name, trace in traces.items():
        m = trace.metrics()
        has_steps = bool(trace.steps)
        speedup = f"{static_wall_s / m.wall_s:.2f}×" if static_wall_s and m.wall_s > 0 else "—"
        ok = NOT_AVAILABLE
        if reference_ok and name in reference_ok:
            ok = "✓" if reference_ok[name] else "✗"
        rows.append(
            [
                name,
                round(m.wall_s, 2),
                m.num_steps if has_steps else NOT_AVAILABLE,
                m.num_generated_tokens,
                round(m.tok_per_s, 1),
                speedup,
                round(m.padding_waste_pct, 1) if has_steps else NOT_AVAILABLE,
                round(m.slot_utilisation_pct, 1) if has_steps else NOT_AVAILABLE,
                round(m.mean_ttft_s, 2),
                _rounded(trace.latency_percentiles()["ttft_s"]["p99"]),
                m.num_preemptions if has_steps else NOT_AVAILABLE,
                ok,
            ]
        )
    return rows


def _rounded(value: float | None) -> float | str:
    return NOT_AVAILABLE if value is None else round(value, 2)


def outputs_headers(engine_names: list[str]) -> list[str]:
    """request, prompt, cap, one output column per engine, then the reference verdict."""
    return [
        "request",
        "prompt",
        "cap",
        *(f"{n} output" for n in engine_names),
        "matches model.generate",
    ]


def outputs_rows(traces: dict[str, Trace], reference: dict[int, list[int]] | None) -> list[list]:
    """One row per request (``outputs_headers`` order); the verdict names engines that differ."""
    runs = list(traces.items())
    first = runs[0][1]
    rows = []
    for i, req in enumerate(first.requests):
        records = [(name, trace.requests[i]) for name, trace in runs]
        verdict = NOT_AVAILABLE
        if reference is not None:
            bad = [n for n, r in records if r.output_token_ids != reference.get(r.request_id)]
            verdict = "✓" if not bad else "✗ " + " and ".join(bad)
        texts = [r.output_text for _, r in records]
        prompt = _clip(req.prompt, PROMPT_SHOWN_CHARS)
        rows.append([f"R{req.request_id}", prompt, req.max_new_tokens, *texts, verdict])
    return rows


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} chars)"
