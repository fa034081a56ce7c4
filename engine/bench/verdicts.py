"""The bench's verdicts per request (✓ ≈ ✗, ``engine.fidelity.divergence``) and the
batch-invariant mode's cost; JSON fields: docs/bench.md."""

from __future__ import annotations

import sys

from engine.fidelity.divergence import MATCH, NEAR_TIE, count


def add_verdicts(runner, requests, median_traces: dict, reference, results: dict) -> None:
    """Verdict fields into each engine's ``results`` entry, one stderr line per split;
    ``median_traces``: engine name -> the trace its results come from."""

    decode = runner.tokenizer.decode
    for name, trace in median_traces.items():
        verdicts = reference.verdicts(requests, trace)
        entry = results[name]
        entry.update(count(list(verdicts.values())))
        equal = [v.logits_equal for v in verdicts.values() if v.verdict == MATCH]
        entry["num_logits_equal"] = None if None in equal else sum(equal)
        for req in entry["requests"]:  # no verdict: sampled with another generator
            found = verdicts.get(req["request_id"])
            req["verdict"] = None if found is None else found.to_dict(decode)
        found = [v.to_dict(decode) for v in verdicts.values() if v.verdict != MATCH]
        for item in found:
            print(f"  {name}: {_split_line(item)}", file=sys.stderr)
        if found:
            entry["mismatches"] = found


def _split_line(item: dict) -> str:
    ref = item["reference_run"] or {}
    top = ", ".join(f"{t['text']!r} {t['logit']:.4g}" for t in ref.get("top", [])[:3])
    return (
        f"R{item['request_id']} {item['label']}: reference {item['reference_token']} vs "
        f"engine {item['engine_token']}, margin {_num(item['logit_margin'])} (bound "
        f"{_num(item['rounding_bound'])}); reference's top: {top}; {item['reason']}"
    )


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def verdict_summary(entry: dict) -> str:
    """One line per engine: "6 ✓ (6 bitwise), 0 ≈, 0 ✗" plus the near-ties' tokens."""
    if "num_match" not in entry:
        return "-"
    equal = entry.get("num_logits_equal")
    bitwise = f" ({equal} bitwise)" if equal else ""
    line = f"{entry['num_match']} ✓{bitwise}, {entry['num_near_tie']} ≈, {entry['num_differs']} ✗"
    ties = [
        f"R{m['request_id']}@{m['token_index']}"
        for m in entry.get("mismatches", [])
        if m["verdict"] == NEAR_TIE
    ]
    return line + (f" (near-ties: {', '.join(ties)})" if ties else "")


def add_invariant_cost(results: dict, normal_results: dict) -> list[str]:
    """``normal_ms_per_step`` and ``invariant_cost_x`` into each entry; one line per engine."""
    lines = []
    for name, normal in normal_results.items():
        entry = results[name]
        ms, base = entry["ms_per_step"], normal["ms_per_step"]
        entry["normal_ms_per_step"] = base
        entry["invariant_cost_x"] = ms / base if base else None
        if base:
            lines.append(
                f"batch-invariant cost, {name}: {ms:.1f} ms/step against {base:.1f} in the "
                f"normal mode ({ms / base:.2f}x)"
            )
    return lines
