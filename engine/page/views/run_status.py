"""The status line under Run, in words: wall times, speedup, step counts and the reference verdict.

``state`` is a ``run_view.RunState`` (not imported: ``run_view`` imports this module).
"""

from __future__ import annotations

import math

from engine.fidelity.reference import NOT_COMPARED_TEXT, mismatches, not_compared_ids
from engine.page.figures.style import counted, request_ids
from engine.page.views import divergence_view, server_view, tables
from engine.page.views.markup import one_line, plain_markdown
from engine.trace import Trace

NOISE_NOTE = "Wall times on a shared machine vary from run to run; step counts do not."


def status_line(state) -> str:
    """Markdown: wall times, speedup, step counts, the reference verdict, then a line on noise."""
    s, c = state.static, state.continuous
    speedup = s.wall_s / c.wall_s if c.wall_s > 0 else math.nan
    line = (
        f"{counted(len(s.requests), 'request')} · {counted(s.num_slots, 'slot')} · "
        f"static {s.wall_s:.2f} s · "
        f"continuous {c.wall_s:.2f} s · **speedup {speedup:.2f}×** (static time / continuous) · "
        f"**{steps_comparison(len(s.steps), len(c.steps))}**"
    )
    if state.hf_continuous is not None:
        line += f" · transformers' continuous batching {state.hf_continuous.wall_s:.2f} s"
    parts, server_lines = server_view.status_parts(state.servers, state.server_failures)
    line += "".join(f" · {part}" for part in parts) + " · " + _verdict(state)
    precision = divergence_view.precision_text(state.dtype, state.batch_invariant)
    line = f"{precision} · {line}" if precision else line
    if state.batch_invariant and state.hf_continuous is not None:
        line += f" · {divergence_view.HF_OUTSIDE}"
    head = "" if state.recorded is None else state.recorded.label() + "  \n"
    lines = [*_our_warnings(state), *([server_lines] if server_lines else [])]
    tail = "".join(f"{line}  \n" for line in lines)
    return f"{head}{line}  \n{tail}{NOISE_NOTE}"


def shown_instead(state, line: str | None = None) -> str:
    """``state``'s status line (``line`` if already made), after a press that gave no run."""
    what = "the previous run" if state.recorded is None else "the recorded run"
    return f"Showing {what}: {status_line(state) if line is None else line}"


def _our_warnings(state) -> list[str]:
    ours = [t for t in (state.static, state.continuous, state.hf_continuous) if t is not None]
    return [f"⚠ {plain_markdown(one_line(w))}" for t in ours for w in t.warnings]


def steps_comparison(static_steps: int, continuous_steps: int) -> str:
    """E.g. "continuous 300 steps against static 480: 1.60× fewer"."""
    text = f"continuous {counted(continuous_steps, 'step')} against static {static_steps}"
    if continuous_steps == static_steps or not continuous_steps or not static_steps:
        return text + (": the same" if continuous_steps == static_steps else "")
    if continuous_steps < static_steps:
        return f"{text}: {static_steps / continuous_steps:.2f}× fewer"
    return f"{text}: {continuous_steps / static_steps:.2f}× more"


def _verdict(state) -> str:
    """The verdicts' counts per engine, then unjudged engines' differing and uncompared requests."""
    if state.reference is None:
        return "outputs not checked against `model.generate`"
    traces = _compared(state)  # a server serving another model is not checked
    skipped = "; ".join(
        f"{n}: {request_ids(ids)}" for n, t in traces.items() if (ids := not_compared_ids(t))
    )
    skipped_text = f" ({skipped}: {NOT_COMPARED_TEXT})" if skipped else ""
    judged = state.verdicts or {}
    wrong = "; ".join(
        f"{n}: {request_ids(ids)}"
        for n, t in traces.items()
        if n not in judged and (ids := _mismatched(t, state.reference))
    )
    name = divergence_view.reference_name(state.batch_invariant)
    if state.verdicts is None and wrong:
        return f"✗ differs from {name} ({wrong}){skipped_text}"
    text = divergence_view.verdict_summary(judged, name, bool(skipped_text))
    return text + (f" · servers: ✗ differs ({wrong})" if wrong else "") + skipped_text


def _mismatched(trace: Trace, reference: dict[int, list[int]]) -> list[int]:
    """Requests whose output differs from the reference (own-generator ones left out)."""
    outputs = {r.request_id: r.output_token_ids for r in trace.requests}
    return mismatches(outputs, reference, not_compared_ids(trace))


def reference_ok(state) -> dict[str, str] | None:
    """Per compared engine, the metrics table's ✓ / ≈ / ≠ / ✗; None when the run was not checked."""
    if state.reference is None:
        return None
    ok = {n: "✗" if _mismatched(t, state.reference) else "✓" for n, t in _compared(state).items()}
    judged = state.verdicts or {}
    return ok | {n: divergence_view.engine_symbol(v) for n, v in judged.items() if n in ok}


def _compared(state) -> dict[str, Trace]:
    return {name: t for name, t in state.traces().items() if tables.compared(t)}


def servers_note(state) -> str:
    """What "Where outputs differ" says of servers without verdicts ("" if none)."""
    if state.reference is None or not state.servers:
        return ""
    lines = []
    for name, trace in state.servers.items():
        why = tables.not_compared_why(trace)
        if name in (state.verdicts or {}):
            continue  # judged: its splits are among the view's picks
        if why is not None:
            lines.append(f"**{name}**: {why} (see the ⚠ line under the status line).")
        elif ids := _mismatched(trace, state.reference):
            lines.append(
                f"**{name}** differs from the reference at {request_ids(ids)}: a server hands "
                "back no logits, so whether rounding explains it cannot be judged here."
            )
    return "  \n".join(lines)
