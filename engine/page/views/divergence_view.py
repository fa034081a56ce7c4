"""Where outputs differ: a verdict per engine and request (``judge_runs``: ✓ same, ≈ explained,
✗ not, ≠ expected), and the divergence view of one. Model text never goes into Markdown.
"""

from __future__ import annotations

import gradio as gr

from engine.fidelity.divergence import MATCH, NEAR_TIE, NUM_SHOWN
from engine.fidelity.reference import NOT_COMPARED_TEXT

NOT_AVAILABLE = "—"
CHOSEN = " ← chosen by {}"  # marks, in the top 5, the token a run (or both) chose
NOT_COMPARED = "not compared"  # sampled with another generator (transformers' engine)
EXPECTED = "expected"  # a split on quantized weights: differences expected, not a failure
EXPECTED_SYMBOL = "≠"
EXPECTED_WHY = (
    "its weights are the 4-bit ones ours are dequantized from, and it multiplies them as they "
    "are, so a token may differ wherever their rounding decides it"
)
TIES_NOTE = (
    "Equal logits share a rank, the run's chosen token listed first among them; greedy "
    "decoding's argmax breaks such a tie by the lower token id."
)
TOP_HEADERS = [  # one token per row: its rank and logit in each run ("—": not in its top 5)
    "token",
    "reference rank",
    "reference logit",
    "engine rank",
    "engine logit",
]
# What ≈ means, in words a class can read, wherever a near-tie verdict is shown (docs/precision.md
# has the rounding bound behind it).
NEAR_TIE_NOTE = (
    "≈ near-tie: the engine and the reference picked different tokens whose logits were within "
    "the rounding margin of the run's dtype; the batch's shape changes the order of the float "
    "additions, and that alone can tip such a choice: not a bug."
)
NO_DIFFERENCE = "Every checked output equals its reference, token for token."
NO_DIFFERENCE_OURS = "Every output of our engines equals its reference, token for token."
NOT_CHECKED = "Outputs are compared with a reference after a run with the reference check on."


def counts(entries: dict[int, dict]) -> tuple[int, int, int, int]:
    """``(✓, ≈, ✗, ≠)`` among one engine's verdicts."""
    kinds = [e["verdict"] for e in entries.values()]
    num_match, num_tie, num_expected = (kinds.count(k) for k in (MATCH, NEAR_TIE, EXPECTED))
    return num_match, num_tie, len(kinds) - num_match - num_tie - num_expected, num_expected


def expected_differences(verdicts: dict[str, dict[int, dict]], traces: dict) -> dict:
    """``verdicts`` with each split of an engine whose trace expects differences marked
    ``EXPECTED`` ("≠ at token k (note)", no rounding bound)."""
    marked = {}
    for name, entries in verdicts.items():
        note = traces[name].info.get("differences_expected") if name in traces else None
        marked[name] = {
            request_id: entry
            if not note or entry["verdict"] == MATCH
            else entry
            | {
                "verdict": EXPECTED,
                "symbol": EXPECTED_SYMBOL,
                "label": f"{EXPECTED_SYMBOL} at token {entry['token_index']} ({note})",
                "reason": f"{note}: {EXPECTED_WHY}",
                "rounding_bound": None,
                "note": note,
            }
            for request_id, entry in entries.items()
        }
    return marked


def verdict_label(verdicts: dict[str, dict[int, dict]], engine: str, request_id: int) -> str:
    """One engine's label for a request: "✓", "≈ near-tie at token 17", ... or "not compared"."""
    entry = verdicts[engine].get(request_id)
    return NOT_COMPARED if entry is None else entry["label"]


def join_labels(labels: dict[str, str]) -> str:
    """The outputs table's verdict cell, e.g. "static ✓ · continuous ≈ near-tie at token 17"."""
    skipped = [name for name, label in labels.items() if label == NOT_COMPARED]
    shown = {name: label for name, label in labels.items() if label != NOT_COMPARED}
    text = " · ".join(f"{name} {label}" for name, label in shown.items())
    text = "✓" if all(label == "✓" for label in shown.values()) else text
    return text + (f" · {' and '.join(skipped)}: {NOT_COMPARED_TEXT}" if skipped else "")


def verdict_summary(
    verdicts: dict[str, dict[int, dict]], reference_name: str, some_not_compared: bool = False
) -> str:
    """The status line's verdicts, e.g. "against `model.generate`: static 6 ✓ 0 ≈ 0 ✗ · ..."."""
    if all(counts(e)[0] == len(e) for e in verdicts.values()):
        equal = [e["logits_equal"] for v in verdicts.values() for e in v.values()]
        bitwise = ", logits bitwise equal" if equal and all(equal) else ""
        every = "all compared outputs match" if some_not_compared else "all match"
        return f"✓ {every} {reference_name} token for token{bitwise}"
    parts = []
    for name, entries in verdicts.items():
        num_match, num_tie, num_differs, num_expected = counts(entries)
        parts.append(f"{name} {num_match} ✓ {num_tie} ≈ {num_differs} ✗")
        if num_expected:
            note = next(e["note"] for e in entries.values() if e["verdict"] == EXPECTED)
            parts[-1] += f" {num_expected} {EXPECTED_SYMBOL} ({note})"
    line = f"against {reference_name}: " + " · ".join(parts)
    if any(counts(e)[1] for e in verdicts.values()):
        line += f" ({NEAR_TIE_NOTE} See “Where outputs differ”.)"
    return line


def choices(verdicts: dict[str, dict[int, dict]] | None) -> list[tuple[str, str]]:
    """Every differing (engine, request) as ``(label, "engine:request_id")``, by request."""
    found = [
        (request_id, name, entry["label"])
        for name, entries in (verdicts or {}).items()
        for request_id, entry in entries.items()
        if entry["verdict"] != MATCH
    ]
    return [(f"R{rid} · {name} · {label}", f"{name}:{rid}") for rid, name, label in sorted(found)]


def view(verdicts: dict[str, dict[int, dict]] | None, choice: str | None, dtype: str | None):
    """``(markdown, text, top_rows)`` for ``choice`` ("engine:id"); model text only in ``text``."""
    if not verdicts:
        return NOT_CHECKED, "", []
    name, entry = _entry(verdicts, choice)
    if entry is None:
        return NO_DIFFERENCE, "", []
    k = entry["token_index"]
    ref, eng = entry["reference_run"], entry["engine_run"]
    lines = [
        f"**R{entry['request_id']}, {name}: {entry['label']}.** The two outputs "
        f"share their first {k} tokens and split at token {k}. Why: {entry['reason']}."
    ]
    if ref is not None:
        lines.append(f"Reference run: {_logits_line(ref)}.")
    if eng is not None:
        lines.append(f"Engine run: {_logits_line(eng)}.")
    if entry["rounding_bound"] is not None:
        lines.append(f"Rounding bound in {dtype or 'this dtype'}: {entry['rounding_bound']:.4g}.")
    if entry["verdict"] == NEAR_TIE:
        lines.append(NEAR_TIE_NOTE)
    sides = _ranked_sides(entry)
    if any(_has_tie(side) for side in sides):
        lines.append(TIES_NOTE)
    text = (
        f"Common prefix ({k} tokens):\n{_visible(entry['prefix_text'])}\n\n"
        f"Reference's next token: {entry['reference_token_text']}\n"
        f"Engine's next token: {entry['engine_token_text']}"
    )
    return "  \n".join(lines), text, _top_rows(sides)


def _visible(text: str) -> str:
    """``text``, or its ``repr`` when it is only whitespace, which a textbox shows as nothing."""
    return repr(text) if text and not text.strip() else text


def first_view(
    state, servers_note: str = ""
) -> tuple[list[tuple[str, str]], str | None, str, str, list[list[str]]]:
    """``(picks, first pick, markdown, text, top_rows)`` for a ``RunState`` (or None).
    ``servers_note`` follows the Markdown, so the view never contradicts the status line."""
    verdicts = getattr(state, "verdicts", None)
    picks = choices(verdicts)
    markdown, text, rows = view(verdicts, None, getattr(state, "dtype", None))
    if servers_note and verdicts:
        if not picks:
            markdown = NO_DIFFERENCE_OURS
        markdown = f"{markdown}  \n{servers_note}"
    return picks, picks[0][1] if picks else None, markdown, text, rows


def run_outputs(state, servers_note: str = "") -> dict:
    """The Run event's divergence outputs by name: the picks and the first view (handlers only)."""
    picks, value, markdown, text, rows = first_view(state, servers_note)
    return {
        "divergence_dropdown": gr.Dropdown(choices=picks, value=value),
        "divergence_markdown": markdown,
        "divergence_textbox": text,
        "divergence_table": rows,
    }


def divergence_event(state, choice: str | None) -> tuple:
    return view(getattr(state, "verdicts", None), choice, getattr(state, "dtype", None))


def _entry(verdicts, choice: str | None) -> tuple[str | None, dict | None]:
    """The picked ``(engine, entry)``; the first difference when ``choice`` is not one."""
    picks = [value for _, value in choices(verdicts)]
    if choice not in picks:
        choice = picks[0] if picks else None
    if choice is None:
        return None, None
    name, request_id = choice.rsplit(":", 1)
    return name, verdicts[name][int(request_id)]


def _logits_line(side: dict) -> str:
    """One run's logits of both tokens ("—": outside that run's recorded top 8)."""
    ref, eng = side["reference_token_logit"], side["engine_token_logit"]
    return f"logit of the reference's token {_num(ref)}, of the engine's token {_num(eng)}"


Ranked = list[tuple[int, dict, bool]]  # one run's shown top: (rank, token entry, chosen?)


def _ranked_sides(entry: dict) -> list[Ranked]:
    """Both runs' shown top as ``(rank, token, chosen?)`` by logit; ties share a rank (1, 1, 3),
    the chosen first, then by token id as argmax picks (``topk`` orders ties arbitrarily)."""
    ranked = []
    for side, chosen in (
        (entry["reference_run"], entry["reference_token"]),
        (entry["engine_run"], entry["engine_token"]),
    ):
        top = side["top"] if side is not None else []
        top = sorted(top, key=lambda t: (-t["logit"], t["token_id"] != chosen, t["token_id"]))
        ranks = [1 + sum(other["logit"] > t["logit"] for other in top) for t in top]
        ranked.append([(r, t, t["token_id"] == chosen) for r, t in zip(ranks, top, strict=True)])
    return ranked


def _has_tie(side: Ranked) -> bool:
    ranks = [rank for rank, _, _ in side]
    return len(set(ranks)) < len(ranks)


def _top_rows(sides: list[Ranked]) -> list[list[str]]:
    """``TOP_HEADERS`` rows: each token of either run's top, with its rank and logit in each run."""
    found = [{t["token_id"]: (rank, t, chosen) for rank, t, chosen in side} for side in sides]
    order = list(dict.fromkeys(t["token_id"] for side in sides for _, t, _ in side))
    rows = []
    for token_id in order[: 2 * NUM_SHOWN]:
        shown = [side.get(token_id) for side in found]
        text = next(entry[1]["text"] for entry in shown if entry is not None)
        chose = [run for run, entry in zip(RUNS, shown, strict=False) if entry and entry[2]]
        mark = CHOSEN.format(" and ".join(chose)) if chose else ""
        cells = [repr(text) + mark]
        for entry in shown:  # (rank, token, chosen?), or None where that run's top lacks it
            cells += [str(entry[0]), _num(entry[1]["logit"])] if entry else [NOT_AVAILABLE] * 2
        rows.append(cells)
    return rows


RUNS = ("reference", "engine")  # the two runs, in ``_ranked_sides``' order


def _num(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:.4g}"


def reference_name(batch_invariant: bool) -> str:
    return "each request run alone (batch-invariant)" if batch_invariant else "`model.generate`"


def engine_symbol(entries: dict[int, dict]) -> str:
    """The metrics cell: ✓ all match, ≈ near-ties only, ≠ expected differences only, else ✗."""
    _, num_tie, num_differs, num_expected = counts(entries)
    if num_differs:
        return "✗"
    return EXPECTED_SYMBOL if num_expected else "≈" if num_tie else "✓"


def precision_text(dtype: str | None, batch_invariant: bool) -> str:
    """E.g. "**bfloat16** · batch-invariant mode" ("" when neither is known)."""
    parts = [f"**{dtype}**"] if dtype else []
    return " · ".join([*parts, *(["batch-invariant mode"] if batch_invariant else [])])


HF_OUTSIDE = (
    "transformers' engine is outside our control: batch-invariant mode does not reach its "
    "kernels, so its outputs still depend on the batch"
)


def settings_note(compare_hf: bool, batch_invariant: bool) -> str:
    """The note under the precision settings on batch-invariant mode."""
    if not batch_invariant:
        return ""
    note = (
        "Batch-invariant mode: every linear, norm and attention computes a sequence's rows the "
        "same way alone or packed, and each request is compared with its run alone, bitwise "
        "(slower)."
    )
    return note + (f" **Note:** {HF_OUTSIDE}." if compare_hf else "")
