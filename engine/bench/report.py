"""The bench's report: the table, its summary lines, and the JSON document (docs/bench.md)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from engine.bench.args import sampling_flags
from engine.bench.probes.step_profile import decode_op_profile, profile_line
from engine.bench.servers import comparison_lines, failed_result, schedule_line
from engine.bench.verdicts import add_invariant_cost, verdict_summary
from engine.config import EngineConfig
from engine.kernels import cpu_share
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import QUIET_SHARE
from engine.model.kernel_store import ORIGINS
from engine.sequence import Request
from engine.worker.engines import make_engine


def format_table(results: dict[str, dict], weight_read_ms: float | None = None) -> str:
    """One row per engine; speedup is against static when static ran. ``x read``: ms/step over
    ``weight_read_ms``, the time to read every weight once (a decode step's floor)."""
    base = results.get("static", {}).get("wall_s")
    head = f"{'engine':<18}{'wall_s':>16}{'steps':>7}{'tokens':>8}{'tok/s':>8}"
    head += f"{'speedup':>9} {'ms/step':>8} {'x read':>7}  match"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        spread = f"{r['wall_s']:.2f} ({r['wall_s_min']:.2f}-{r['wall_s_max']:.2f})"
        speedup = f"{base / r['wall_s']:.2f}x" if base else "-"
        match = {True: "yes", False: f"NO ({r['num_mismatched_requests']})", None: "-"}
        skipped = r.get("num_not_compared_requests")
        note = f", {skipped} sampled with another generator: not compared" if skipped else ""
        expected = r.get("info", {}).get("differences_expected")  # llamacpp_q4
        note += f" ({expected})" if expected and r["reference_match"] is not None else ""
        lines.append(
            f"{name:<18}{spread:>16}{r['num_steps'] or '-':>7}{r['num_generated_tokens']:>8}"
            f"{r['tok_per_s']:>8.1f}{speedup:>9} {_ms(r['ms_per_step']):>8}"
            f" {_ratio(r['ms_per_step'], weight_read_ms):>7}  {match[r['reference_match']]}{note}"
        )
    return "\n".join(lines)


def prefix_cache_line(results: dict[str, dict]) -> str:
    """E.g. ``prefix cache hit rate: continuous_paged 61.2%`` (or ``not reported``)."""
    parts = []
    for name, r in results.items():
        if name in ("continuous_paged", "hf_continuous"):
            rate = r["prefix_cache_hit_rate"]
            parts.append(f"{name} {'not reported' if rate is None else f'{100 * rate:.1f}%'}")
    return "prefix cache hit rate (cached / prompt tokens): " + (", ".join(parts) or "-")


def load_lines(results: dict[str, dict]) -> list[str]:
    """A warning per engine whose runs shared their CPUs with other work over
    ``cpu_share.LOADED_SHARE`` (its ``others_cpu_share``): its times, and the speedups built on
    them, are the contention's as much as the engine's."""
    return [
        f"warning: {line}"
        for name, entry in results.items()
        for line in cpu_share.load_warning(name, entry.get("others_cpu_share"))
    ]


def _ms(ms_per_step: float) -> str:
    return f"{ms_per_step:.1f}" if ms_per_step else "-"  # "-": an engine with no step trace


def _ratio(ms_per_step: float, weight_read_ms: float | None) -> str:
    return f"{ms_per_step / weight_read_ms:.2f}x" if weight_read_ms and ms_per_step else "-"


def print_report(args, results, normal_results, extra, run) -> None:
    """The table and the lines under it; a failed server engine's entry goes into ``results``.
    ``run``: ``(median traces by engine, failures by engine, engines)``."""
    medians, failures, engines = run
    print(format_table(results, extra["weight_read_ms"]))
    if not args.no_reference:
        for name, entry in results.items():
            expected = entry.get("info", {}).get("differences_expected")
            label = f" ({expected})" if expected else ""
            print(f"{name} against the reference: {verdict_summary(entry)}{label}")
    for line in add_invariant_cost(results, normal_results):
        print(line)
    for line in load_lines(results):
        print(line)
    if args.prefix_caching:
        print(prefix_cache_line(results))
    for name, trace in medians.items():
        if trace.schedule is not None:  # a server's own record of its steps
            print(schedule_line(name, trace.schedule))
            comparison = results[name].get("schedule_comparison")
            for line in comparison_lines(comparison, name) if comparison else []:
                print(line)
        for warning in trace.warnings:
            print(f"warning: {name}: {warning}", file=sys.stderr)
    for name, message in failures.items():
        print(f"{name} failed: {message}")
        results[name] = failed_result(name, message, engines)
    print(
        f"engines' matmul kernel: {extra['engine_kernel']} "
        f"(+{extra['engine_kernel_bytes'] / 1e6:.0f} MB of packed weights)"
    )
    for line in kernel_choice_lines(extra["kernel_choice"]):
        print(line)
    if extra["decoder_layers"] is not None:  # engine.kernels.fused_layers, or transformers'
        steps = ", ".join(f"{n} {k}" for n, k in extra["decoder_layer_steps"].items() if k)
        print(f"our engines' decoder layers: {extra['decoder_layers']} (steps: {steps})")
    print(f"layers path: {extra['layers_path']}")
    if extra.get("layers_step") is not None:
        print(f"decode step's layers: {extra['layers_step']}")
    if extra["weight_read_ms"] is not None:
        low, high = extra["weight_read_ms_range"]
        print(
            f"weight read (the decode-step limit): {extra['weight_bytes'] / 1e6:.0f} MB in "
            f"{extra['weight_read_ms']:.1f} ms (median of the reads before each timed run; "
            f"{low:.1f} to {high:.1f} ms)"
        )


def _others_note(share: float | None) -> str:
    """E.g. ``", other work 45 % of the CPU (not kept)"`` while timing kernels; "" unmeasured."""
    if share is None:
        return ""
    kept = "" if share <= QUIET_SHARE else " (not kept: timed again at the next start)"
    return f", other work {100 * share:.0f} % of the CPU{kept}"


def kernel_choice_lines(choice: dict) -> list[str]:
    """How the engines' matmul was chosen (``KernelChoice.as_dict``): its ranges and origin, then
    where timed, ms per pass per candidate and row count, the chosen one starred::

        kernel choice: linear 1-4 rows, onednn 5+ rows (measured at this start)
          ms per pass over 35 of 210 linears (71 MB), best of 3; * chosen
                rows       1       2 ...
              linear    3.1*    3.3* ...
    """
    ranges = choice["plan"]
    plan = RowPlan(tuple(r["from_rows"] for r in ranges), tuple(r["kernel"] for r in ranges))
    where = f"; kept in {choice['file']}" if choice.get("file") else ""
    lines = [f"kernel choice: {plan.describe()} ({ORIGINS[choice['origin']]}{where})"]
    if choice.get("rows") is None:
        return lines
    rounds = choice["rounds"]
    lines.append(
        f"  ms per pass over {choice['timed_linears']} of {choice['total_linears']} linears "
        f"({choice['timed_bytes'] / 1e6:.0f} MB), "
        + (f"best of {rounds}" if rounds else "cut short by the time budget")
        + f", {choice['measured_s']:.1f} s"
        + _others_note(choice.get("others_cpu_share"))
        + "; * chosen"
    )
    lines.append(f"  {'rows':>10}" + "".join(f"{m:>8}" for m in choice["rows"]))
    for name, times in choice["times_ms"].items():
        cells = [
            "-" if t is None else f"{t:.1f}" + ("*" if plan.name_at(m) == name else " ")
            for t, m in zip(times, choice["rows"], strict=True)
        ]
        lines.append(f"  {name:>10}" + "".join(f"{cell:>8}" for cell in cells))
    return lines


def optional_measures(args, runner, requests, extra) -> None:
    if args.floor:
        extra.update(measure_floor(runner, requests, args.repeat))
        print(
            f"floor_s (longest request alone, generate): {extra['floor_s']:.2f}; "
            f"with the engines' matmul kernel: {extra['floor_engine_kernel_s']:.2f}"
        )
    if args.profile:
        extra["profile"] = profile_host_overhead(runner, args.slots)
        for ctx, p in extra["profile"].items():
            print(f"profile @ ~{ctx} cached tokens: {p}")
        extra["decode_ops"] = decode_op_profile(runner, args.slots)
        print(profile_line(extra["decode_ops"]))


def measure_floor(runner, requests, repeat: int) -> dict[str, float]:
    """Median wall times of ``model.generate`` on the longest-cap request alone: the workload's
    floor (``floor_s``), and inside ``runner.engine_kernels()`` (``floor_engine_kernel_s``),
    alternating."""
    longest = max(requests, key=lambda r: r.max_new_tokens)
    ids, mask = runner.left_pad([list(longest.prompt_token_ids)])
    kernel = runner.engine_kernels
    times: dict[str, list[float]] = {"floor_s": [], "floor_engine_kernel_s": []}
    for _ in range(repeat):
        for key, kernels in (("floor_s", nullcontext), ("floor_engine_kernel_s", kernel)):
            with kernels():
                runner.synchronize()
                t0 = time.perf_counter()
                runner.generate(ids, mask, longest.max_new_tokens)
                runner.synchronize()
            times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(values) for key, values in times.items()}


def profile_host_overhead(runner, num_slots: int, contexts=(100, 2000)) -> dict:
    """Share of continuous step time outside the model forward, at two context sizes (cached
    tokens of all sequences), from steps within 10 % of each."""
    prompt = tuple(range(1000, 1010))
    cap = max(contexts) // num_slots - len(prompt) + 50
    requests = [Request(i, "profile", cap, prompt) for i in range(num_slots)]
    engine = make_engine("continuous", runner, EngineConfig(num_slots, ignore_eos=True))
    trace = engine.run(requests)
    result = {}
    for target in contexts:
        steps = [s for s in trace.steps[1:] if abs(s.num_cached_tokens - target) <= 0.1 * target]
        step_s = sum(s.duration_s for s in steps)
        forward_s = sum(s.forward_s for s in steps)
        result[str(target)] = {
            "num_steps": len(steps),
            "ms_per_step": 1000 * step_s / len(steps) if steps else None,
            "host_overhead_pct": 100 * (step_s - forward_s) / step_s if step_s else None,
        }
    return result


def write_json(args, loaded, results: dict, extra: dict, reference_kind: str | None) -> None:
    """The bench's JSON document at ``--json``; ``reference_kind``: the reference's class name."""
    doc = {
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "slots": args.slots,
        "workload": args.workload,
        "repeat": args.repeat,
        "arrival": args.arrival,
        "rate": args.rate if args.arrival == "poisson" else None,
        "seed": args.seed if args.arrival == "poisson" else None,
        "sampling_flags": sampling_flags(args),  # as given
        "batch_invariant": args.batch_invariant,
        "engines": results,
        **extra,
        "reference": reference_kind,
    }
    Path(args.json_path).write_text(json.dumps(doc, indent=2))
