"""Benchmark CLI: the same requests through each engine on one loaded model, side by side.

    python -m engine.bench --workload seed --slots 3 --engines static,continuous --json out.json

Prints one row per engine (wall_s, steps, generated tokens, tok/s, speedup vs static, ms/step,
reference match) and writes the JSON described in the README. The model is loaded and warmed up
before timing; the reference (per-request ``model.generate``) is never counted in any engine's time.
With ``--repeat N`` the engines run interleaved (A B A B ...) and the median is reported.
Server engines (``vllm``, ``--endpoint NAME=URL``) run beside ours: ``engine.bench.servers``.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import statistics
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from engine.bench.args import (
    ENGINES,
    KV_MODE_OF,
    check_args,
    engine_options,
    ignored_flags,
    load_specs,
    parse_args,
)
from engine.bench.hardware_probe import PeakMemory, weight_bytes, weight_read_ms
from engine.bench.servers import (
    close_engines,
    failed_result,
    guarded_run,
    server_engines,
    server_fields,
    start_servers,
)
from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.reference import (
    NOT_COMPARED,
    ReferenceCache,
    comparison,
    divergence,
    mismatches,
    not_compared_ids,
)
from engine.sequence import Request
from engine.static import StaticEngine
from engine.trace import Trace
from engine.workload import tokenize_requests


def make_engine(name: str, runner, num_slots: int, prefix_caching: bool = False, **options):
    """An engine by its bench name; ``options`` go to the continuous engines' ``EngineConfig``.

    ``prefix_caching`` turns on ``continuous_paged``'s prefix cache and ``hf_continuous``'s
    block sharing; the other engines cannot share KV and ignore it.

    Raises:
        ValueError: unknown name or invalid options.
    """
    if name == "static":
        return StaticEngine(runner, EngineConfig(num_slots))
    if name == "static_generate":  # the same waves on plain model.generate matmuls
        engine = StaticEngine(runner, EngineConfig(num_slots), engine_kernels=False)
        engine.name = name
        return engine
    if name in KV_MODE_OF:
        sharing = {"prefix_caching": prefix_caching} if name == "continuous_paged" else {}
        config = EngineConfig(num_slots, kv_mode=KV_MODE_OF[name], **options, **sharing)
        engine = ContinuousEngine(runner, config)
        engine.name = name
        return engine
    if name == "hf_continuous":
        from engine.hf_continuous import HFContinuousEngine

        return HFContinuousEngine(runner, EngineConfig(num_slots), block_sharing=prefix_caching)
    raise ValueError(f"Unknown engine {name!r}; choose from {', '.join(ENGINES)}.")


def run_engines(
    engines: dict, requests, repeat: int, memory: PeakMemory, failures: dict | None = None
):
    """Each engine ``repeat`` times, interleaved, so machine noise hits all of them alike.

    Returns ``(traces, peaks)``: per engine its traces, and the highest of each run's
    ``PeakMemory.peak_bytes()`` fields (None where not measured). A server engine that fails
    (``EndpointError``) gets its message in ``failures`` and no traces; the others go on.
    """
    failures = {} if failures is None else failures
    traces: dict[str, list[Trace]] = {name: [] for name in engines}
    peaks: dict[str, dict] = {name: {} for name in engines}
    for _ in range(repeat):
        for name, engine in engines.items():
            memory.reset()
            trace = guarded_run(name, engine, requests, failures)
            if trace is None:
                continue
            traces[name].append(trace)
            for key, value in memory.peak_bytes().items():
                known = [v for v in (peaks[name].get(key), value) if v is not None]
                peaks[name][key] = max(known) if known else None
            print(f"  {name}: {traces[name][-1].wall_s:.2f} s", file=sys.stderr, flush=True)
    traces = {name: runs for name, runs in traces.items() if name not in failures}
    return traces, {name: peaks[name] for name in traces}


def median_trace(runs: list[Trace]) -> Trace:
    """The run with the median wall time (the upper one of an even count)."""
    return sorted(runs, key=lambda t: t.wall_s)[len(runs) // 2]


def write_exports(out_dir: str, traces: dict[str, list[Trace]]) -> None:
    """requests.csv, traces.json and trace.perfetto.json of each engine's median run."""
    from engine import export

    export.write_files(out_dir, {name: median_trace(runs) for name, runs in traces.items()})


def engine_result(runs: list[Trace], reference: dict | None, peaks: dict | None = None) -> dict:
    """The JSON entry of one engine, from its runs (the median-wall run's requests).

    ``peaks``: the engine's peak-memory fields from ``run_engines``, copied in as they are.
    """
    walls = [t.wall_s for t in runs]
    median_run = median_trace(runs)
    m = median_run.metrics()
    outputs = {r.request_id: r.output_token_ids for r in median_run.requests}
    skipped = not_compared_ids(median_run)
    bad = mismatches(outputs, reference, skipped) if reference is not None else []
    wall_s = statistics.median(walls)
    return {
        "wall_s": wall_s,
        "wall_s_min": min(walls),
        "wall_s_max": max(walls),
        "num_steps": m.num_steps,
        "num_generated_tokens": m.num_generated_tokens,
        "tok_per_s": m.num_generated_tokens / wall_s if wall_s else 0.0,
        "ms_per_step": 1000 * wall_s / m.num_steps if m.num_steps else 0.0,
        "padding_waste_pct": m.padding_waste_pct,
        "slot_utilisation_pct": m.slot_utilisation_pct,
        "requests_per_s": len(runs[0].requests) / wall_s if wall_s else 0.0,
        "latency_percentiles": median_run.latency_percentiles(),
        "num_preemptions": m.num_preemptions,
        "num_cached_tokens": m.num_cached_tokens,
        "prefix_cache_hit_rate": m.prefix_cache_hit_rate,
        **(peaks or {}),
        "reference_match": None if reference is None else not bad,
        "num_mismatched_requests": None if reference is None else len(bad),
        "num_not_compared_requests": len(skipped),
        "info": median_run.info,
        **server_fields(median_run),
        "requests": [
            {
                "request_id": r.request_id,
                "prompt": r.prompt,
                "max_new_tokens": r.max_new_tokens,
                "output_token_ids": r.output_token_ids,
                "output_text": r.output_text,
                "ttft_s": r.ttft_s,
                "latency_s": r.latency_s,
                "sampling": None if r.sampling is None else r.sampling.to_dict(),
                "comparison": comparison(r, reference),
                "num_prompt_tokens": r.num_prompt_tokens,
                "num_cached_tokens": r.num_cached_tokens,
            }
            for r in median_run.requests
        ],
    }


def format_table(results: dict[str, dict], weight_read_ms: float | None = None) -> str:
    """One row per engine; speedup is against static when static ran.

    ``x read``: ms/step over ``weight_read_ms``, the time to read every weight once (the limit
    of a decode step; prefill steps and attention over long contexts cost more).
    """
    base = results.get("static", {}).get("wall_s")
    head = f"{'engine':<18}{'wall_s':>16}{'steps':>7}{'tokens':>8}{'tok/s':>8}"
    head += f"{'speedup':>9}{'ms/step':>9}{'x read':>8}  match"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        spread = f"{r['wall_s']:.2f} ({r['wall_s_min']:.2f}-{r['wall_s_max']:.2f})"
        speedup = f"{base / r['wall_s']:.2f}x" if base else "-"
        match = {True: "yes", False: f"NO ({r['num_mismatched_requests']})", None: "-"}
        skipped = r.get("num_not_compared_requests")
        note = f", {skipped} sampled with another generator: not compared" if skipped else ""
        lines.append(
            f"{name:<18}{spread:>16}{r['num_steps'] or '-':>7}{r['num_generated_tokens']:>8}"
            f"{r['tok_per_s']:>8.1f}{speedup:>9}{_ms(r['ms_per_step']):>9}"
            f"{_ratio(r['ms_per_step'], weight_read_ms):>8}  {match[r['reference_match']]}{note}"
        )
    return "\n".join(lines)


def explain_mismatches(runner, requests, traces, reference, results) -> None:
    """For every engine whose outputs differ from the reference, add ``mismatches`` to its JSON
    entry (request, first differing token and logit margin: ``engine.reference.Divergence``) and
    print them, so a float32 near-tie is told apart from a bug and never goes unexplained.
    """
    by_id = {r.request_id: r for r in requests}
    for name, runs in traces.items():
        median_run = median_trace(runs)
        found = []
        for record in median_run.requests:
            if comparison(record, reference) == NOT_COMPARED:
                continue
            request = by_id[record.request_id]
            diff = divergence(
                runner, request, record.output_token_ids, reference[request.request_id]
            )
            if diff is not None:
                found.append(dataclasses.asdict(diff))
                print(f"  {name}: output differs from the reference: {found[-1]}", file=sys.stderr)
        if found:
            results[name]["mismatches"] = found


def _sampling_flags(args) -> dict | None:
    """The sampling flags as given (None: none given; each request's settings are in its entry)."""
    names = ("temperature", "top_k", "top_p", "seed_base")
    given = {name: getattr(args, name) for name in names}
    return given if any(v is not None for v in given.values()) else None


def prefix_cache_line(results: dict[str, dict]) -> str:
    """The prefix-cache hit rate of every engine that shares KV (``not reported`` where the
    engine does not count its hits), e.g. ``prefix cache hit rate: continuous_paged 61.2%``."""
    parts = []
    for name, r in results.items():
        if name in ("continuous_paged", "hf_continuous"):
            rate = r["prefix_cache_hit_rate"]
            parts.append(f"{name} {'not reported' if rate is None else f'{100 * rate:.1f}%'}")
    return "prefix cache hit rate (cached / prompt tokens): " + (", ".join(parts) or "-")


def _ms(ms_per_step: float) -> str:
    return f"{ms_per_step:.1f}" if ms_per_step else "-"  # "-": an engine with no step trace


def _ratio(ms_per_step: float, weight_read_ms: float | None) -> str:
    return f"{ms_per_step / weight_read_ms:.2f}x" if weight_read_ms and ms_per_step else "-"


def measure_floor(runner, requests, repeat: int) -> dict[str, float]:
    """Median wall times of ``model.generate`` on the longest-cap request alone (batch 1).

    No schedule can finish the workload before its longest request, so ``floor_s`` (plain
    ``model.generate``) is its floor here. ``floor_engine_kernel_s`` is the same call inside
    ``runner.engine_kernels()``, the matmul kernel the engines use (``engine.linear_kernel``):
    the floor for an engine with that kernel. The two alternate, ``repeat`` times each.
    """
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
    """Share of continuous step time spent outside the model forward, at two context sizes.

    Runs ``num_slots`` requests with 10-token prompts to their cap with ``ignore_eos`` until the
    step context (cached tokens of all sequences) passes ``max(contexts)``; then, for each target,
    averages steps whose context is within 10 % of it.
    """
    prompt = tuple(range(1000, 1010))
    cap = max(contexts) // num_slots - len(prompt) + 50
    requests = [Request(i, "profile", cap, prompt) for i in range(num_slots)]
    engine = ContinuousEngine(runner, EngineConfig(num_slots, ignore_eos=True))
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


def warm_up(engines: dict, requests, failures: dict | None = None) -> None:
    """One short run per engine, so one-time costs (allocations, kernels) are not timed.

    Local servers start first; a server engine that fails gets its message in ``failures``.
    """
    failures = {} if failures is None else failures
    start_servers(engines, failures)
    short = [
        dataclasses.replace(r, max_new_tokens=min(4, r.max_new_tokens), arrival_s=0.0)
        for r in requests[:2]
    ]
    for name, engine in engines.items():
        guarded_run(name, engine, short, failures)


def main(argv=None) -> int:
    args = parse_args(argv)
    from engine.loader import load_model
    from engine.model_runner import ModelRunner

    try:
        names = [n.strip() for n in args.engines.split(",") if n.strip()]
        check_args(args, names)
        for line in ignored_flags(args, names):
            print(f"warning: {line}", file=sys.stderr)
        specs = load_specs(args)
        loaded = load_model(args.model, args.device, args.dtype)
        runner = ModelRunner(loaded)
        requests = tokenize_requests(
            specs,
            loaded.tokenizer,
            chat_template=args.chat_template,
            max_context=loaded.max_context,
        )
        options = engine_options(args)
        servers = server_engines(args, names, loaded)  # vllm and the --endpoint engines
        engines = {
            n: servers.get(n) or make_engine(n, runner, args.slots, args.prefix_caching, **options)
            for n in names
        }
        engines.update(servers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:  # a SIGTERM (timeout, kill) ends up here too, so the servers are stopped
        return _bench(args, loaded, runner, requests, engines)
    finally:
        close_engines(engines)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _bench(args, loaded, runner, requests, engines: dict) -> int:
    """Warm up, time, check and report ``engines``; the exit code of ``main``."""
    num_sampled = sum(r.is_sampled for r in requests)
    print(
        f"{loaded.name} on {loaded.device_label}; {len(requests)} requests, {args.slots} slots"
        + (f", {num_sampled} sampled" if num_sampled else ""),
        file=sys.stderr,
    )
    failures: dict[str, str] = {}
    warm_up(engines, requests, failures)
    reference = None
    if not args.no_reference:
        t0 = time.perf_counter()
        reference = ReferenceCache(runner).outputs(requests)
        print(f"  reference: {time.perf_counter() - t0:.2f} s (not counted)", file=sys.stderr)
    memory = PeakMemory(loaded.device)
    runner.decoder_layer_steps = dict.fromkeys(runner.decoder_layer_steps, 0)  # timed runs only
    traces, peaks = run_engines(engines, requests, args.repeat, memory, failures)
    results = {n: engine_result(runs, reference, peaks[n]) for n, runs in traces.items()}
    if reference is not None:
        explain_mismatches(runner, requests, traces, reference, results)
    extra = kernel_extra(loaded, runner)
    print(format_table(results, extra["weight_read_ms"]))
    if args.prefix_caching:
        print(prefix_cache_line(results))
    for name, trace in ((n, median_trace(runs)) for n, runs in traces.items()):
        for warning in trace.warnings:
            print(f"warning: {name}: {warning}", file=sys.stderr)
    for name, message in failures.items():
        print(f"{name} failed: {message}")
        results[name] = failed_result(name, message, engines)
    print_kernel_lines(extra)
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
    if args.out:
        write_exports(args.out, traces)
    if args.json_path:
        write_json(args, loaded, results, extra)
    ok = not failures and all(r["reference_match"] is not False for r in results.values())
    return 0 if ok else 1


def kernel_extra(loaded, runner) -> dict:
    """The JSON's kernel fields: weight size and read time, the engines' matmul kernel and its
    memory, and which decoder layers our continuous engines' timed steps ran (``decoder_layers``:
    ``"fused"``, ``"transformers"``, ``"mixed"`` or None when none ran; ``engine.fused_layers``)."""
    return {
        "weight_bytes": weight_bytes(loaded.model),
        "weight_read_ms": weight_read_ms(loaded.model, runner.synchronize),
        "engine_kernel": runner.engine_kernel_name,
        "engine_kernel_bytes": runner.engine_kernel_bytes,
        "decoder_layers": runner.decoder_layers,
        "decoder_layer_steps": dict(runner.decoder_layer_steps),
    }


def print_kernel_lines(extra: dict) -> None:
    """The kernel fields for people: the matmul kernel, the decoder layers, the weight read."""
    print(
        f"engines' matmul kernel: {extra['engine_kernel']} "
        f"(+{extra['engine_kernel_bytes'] / 1e6:.0f} MB of packed weights)"
    )
    if extra["decoder_layers"] is not None:
        steps = ", ".join(f"{n} {k}" for n, k in extra["decoder_layer_steps"].items() if k)
        print(f"continuous engines' decoder layers: {extra['decoder_layers']} (steps: {steps})")
    print(
        f"weight read (the decode-step limit): {extra['weight_bytes'] / 1e6:.0f} MB in "
        f"{extra['weight_read_ms']:.1f} ms"
    )


def write_json(args, loaded, results: dict, extra: dict) -> None:
    """The bench's JSON document (fields in the README's "Benchmark" section) at ``--json``."""
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
        "sampling_flags": _sampling_flags(args),
        "engines": results,
        **extra,
    }
    Path(args.json_path).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    sys.exit(main())
