"""Benchmark CLI: the same requests through each engine on one loaded model, side by side.

    python -m engine.bench --workload seed --slots 3 --engines static,continuous --json out.json

Flags in ``engine.bench.args``, the table and the JSON (docs/bench.md) in ``engine.bench.report``,
server engines in ``engine.bench.servers``. The model is loaded and warmed up before timing; the
reference (``engine.fidelity.reference``) is never counted in any engine's time. The exit code is
2 on a bad flag, 1 when an engine failed or an output differs from the reference (except where
the engine's trace says differences are expected: ``llamacpp_q4``'s quantized weights), else 0.
"""

from __future__ import annotations

import dataclasses
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable

from engine.bench.args import (
    ENGINES,
    KV_MODE_OF,
    SERVERS,
    check_args,
    engine_options,
    ignored_flags,
    load_specs,
    parse_args,
)
from engine.bench.deployment import follow_deployment
from engine.bench.probes.hardware import PeakMemory, memory_object, weight_bytes, weight_read_ms
from engine.bench.report import optional_measures, print_report, write_json
from engine.bench.servers import (
    add_schedule_comparison,
    close_engines,
    guarded_run,
    match_block_size,
    server_engines,
    server_fields,
    start_servers,
)
from engine.bench.verdicts import add_verdicts
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.reference import comparison, mismatches, not_compared_ids, reference_for
from engine.kernels import cpu_share
from engine.peers.openai_engine import OpenAIEngine
from engine.trace import Trace
from engine.worker.engines import make_engine
from engine.workloads.workload import tokenize_requests

# ``RunMetrics`` fields of an engine's JSON entry, ``RequestRecord`` fields of a request's
METRIC_FIELDS = ("num_generated_tokens", "padding_waste_pct", "slot_utilisation_pct",
                 "num_preemptions", "num_cached_tokens", "prefix_cache_hit_rate")  # fmt: skip
REQUEST_FIELDS = ("request_id", "prompt", "max_new_tokens", "output_token_ids", "output_text",
                  "ttft_s", "latency_s", "num_prompt_tokens", "num_cached_tokens")  # fmt: skip


def run_engines(
    engines: dict,
    requests,
    repeat: int,
    memory: PeakMemory,
    failures: dict[str, str],
    before_run: Callable[[], None],
):
    """Each engine ``repeat`` times, interleaved, so machine noise hits all of them alike; each
    run after ``cpu_share.wait_quiet()`` and ``before_run()``. Returns ``(traces, peaks)``: per
    engine its traces and the highest ``PeakMemory.peak_bytes()`` fields and ``others_cpu_share``.
    """
    traces: dict[str, list[Trace]] = {name: [] for name in engines}
    peaks: dict[str, dict] = {name: {} for name in engines}
    for _ in range(repeat):
        for name, engine in engines.items():
            memory.reset()
            cpu_share.wait_quiet()  # not on the heels of the previous run's leftover work
            before_run()
            with cpu_share.OtherWork() as others:
                trace = guarded_run(name, engine, requests, failures)
            if trace is None:
                continue
            traces[name].append(trace)
            # a server's own process is other work to this one: its share says nothing
            share = None if isinstance(engine, OpenAIEngine) else others.share
            fields = memory.peak_bytes() | {"others_cpu_share": share}
            for key, value in fields.items():
                known = [v for v in (peaks[name].get(key), value) if v is not None]
                peaks[name][key] = max(known) if known else None
            print(f"  {name}: {traces[name][-1].wall_s:.2f} s", file=sys.stderr, flush=True)
    traces = {name: runs for name, runs in traces.items() if name not in failures}
    return traces, {name: peaks[name] for name in traces}


def median_trace(runs: list[Trace]) -> Trace:
    """The run with the median wall time (the upper one of an even count)."""
    return sorted(runs, key=lambda t: t.wall_s)[len(runs) // 2]


def engine_result(runs: list[Trace], reference: dict | None, peaks: dict | None = None) -> dict:
    """The JSON entry of one engine, from its runs (the median-wall run's requests)."""
    walls = [t.wall_s for t in runs]
    median_run = median_trace(runs)
    m = median_run.metrics()
    outputs = {r.request_id: r.output_token_ids for r in median_run.requests}
    skipped = not_compared_ids(median_run)
    bad = mismatches(outputs, reference, skipped) if reference is not None else []
    wall_s = statistics.median(walls)
    num_steps = m.num_steps  # hf_continuous: none of its own; its scheduler's record has them
    if median_run.schedule is not None and not median_run.steps:
        num_steps = len(median_run.schedule.steps)
    return {
        "wall_s": wall_s,
        "wall_s_min": min(walls),
        "wall_s_max": max(walls),
        "num_steps": num_steps,
        "tok_per_s": m.num_generated_tokens / wall_s if wall_s else 0.0,
        "ms_per_step": 1000 * wall_s / num_steps if num_steps else 0.0,
        "requests_per_s": len(runs[0].requests) / wall_s if wall_s else 0.0,
        **{field: getattr(m, field) for field in METRIC_FIELDS},
        "latency_percentiles": median_run.latency_percentiles(),
        **(peaks or {}),
        "reference_match": None if reference is None else not bad,
        "num_mismatched_requests": None if reference is None else len(bad),
        "num_not_compared_requests": len(skipped),
        "info": median_run.info,
        **server_fields(median_run),
        "requests": [
            {field: getattr(r, field) for field in REQUEST_FIELDS}
            | {
                "sampling": None if r.sampling is None else r.sampling.to_dict(),
                "comparison": comparison(r, reference),
            }
            for r in median_run.requests
        ],
    }


def warm_up(engines: dict, requests, failures: dict[str, str]) -> None:
    """Start local servers, then one short run per engine, so one-time costs are not timed."""
    start_servers(engines, failures)
    short = [
        dataclasses.replace(r, max_new_tokens=min(4, r.max_new_tokens), arrival_s=0.0)
        for r in requests[:2]
    ]
    for name, engine in engines.items():
        guarded_run(name, engine, short, failures)


NORMAL = " (normal mode)"  # key suffix of the normal-mode runs that time the invariant mode


def _normal_engines(runner, num_slots: int, names: list[str], options: dict) -> dict:
    """With ``batch_invariant``: the same engines in the normal mode, to time the mode's cost."""
    if not options.get("batch_invariant"):
        return {}
    plain = {**options, "batch_invariant": False}
    return {
        name + NORMAL: make_engine(name, runner, EngineConfig(num_slots, **plain))
        for name in names
        if name == "static" or name in KV_MODE_OF
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        loaded, runner, requests, engines, normal = _setup(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:  # a SIGTERM (timeout, kill) ends up here too, so the servers are stopped
        return _bench(args, loaded, runner, requests, engines, normal)
    finally:
        close_engines(engines)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _setup(args):
    """Model, runner, requests, engines (and their normal-mode twins). Raises ValueError."""
    from engine.model.loader import load_model
    from engine.model.model_runner import ModelRunner

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
    match_block_size(args, names, loaded)
    options = engine_options(args)
    config = EngineConfig(args.slots, **options)
    ours = {
        n: make_engine(n, runner, config, args.prefix_caching)
        for n in names
        if n in ENGINES and n not in SERVERS
    }
    followed = follow_deployment(args, ours)  # --endpoint-record: ours on its settings
    servers = server_engines(args, names, loaded, ours, requests, followed)  # SERVERS, --endpoint
    engines = {n: ours.get(n) or servers[n] for n in names}
    engines.update(servers)
    return loaded, runner, requests, engines, _normal_engines(runner, args.slots, names, options)


def _config(args) -> EngineConfig:
    return EngineConfig(args.slots, **engine_options(args))


def _reference(args, runner, requests):
    """``(source, outputs)``: the reference (``engine.fidelity.reference.reference_for``) and its
    outputs, or ``(None, None)`` with ``--no-reference``."""
    if args.no_reference:
        return None, None
    t0 = time.perf_counter()
    config = _config(args)
    source = reference_for(runner, config, reference_store.open_store())  # CBP_REFERENCE_CACHE
    reference = source.outputs(requests)
    kind = "solo, batch-invariant" if args.batch_invariant else "generate"
    print(f"  reference ({kind}): {time.perf_counter() - t0:.2f} s (not counted)", file=sys.stderr)
    return source, reference


def _bench(args, loaded, runner, requests, engines: dict, normal: dict) -> int:
    """Warm up, time, check and report ``engines``; the exit code of ``main``."""
    num_sampled = sum(r.is_sampled for r in requests)
    print(
        f"{loaded.name} on {loaded.device_label}; {len(requests)} requests, {args.slots} slots"
        + (f", {num_sampled} sampled" if num_sampled else ""),
        file=sys.stderr,
    )
    failures: dict[str, str] = {}
    warm_up(engines | normal, requests, failures)
    source, reference = _reference(args, runner, requests)
    memory = PeakMemory(loaded.device)
    runner.decoder_layer_steps = dict.fromkeys(runner.decoder_layer_steps, 0)  # timed runs only
    reads_ms: list[float] = []  # one read of the weights before each timed run
    traces, peaks = run_engines(
        engines | normal,
        requests,
        args.repeat,
        memory,
        failures,
        lambda: reads_ms.append(weight_read_ms(loaded.model, runner.synchronize)),
    )
    normal_results = {n.removesuffix(NORMAL): engine_result(traces.pop(n), None) for n in normal}
    results = {n: engine_result(runs, reference, peaks[n]) for n, runs in traces.items()}
    medians = {n: median_trace(runs) for n, runs in traces.items()}
    add_schedule_comparison(results, medians, engines)
    if source is not None:
        add_verdicts(runner, requests, medians, source, results)
    extra = {
        "weight_bytes": weight_bytes(loaded.model),
        "weight_read_ms": statistics.median(reads_ms) if reads_ms else None,
        "weight_read_ms_range": [min(reads_ms), max(reads_ms)] if reads_ms else None,
        "engine_kernel": runner.engine_kernel_name,
        "engine_kernel_bytes": runner.engine_kernel_bytes,
        "kernel_choice": runner.kernel_choice.as_dict(),  # engine.kernels.kernel_timing
        "lm_head_kernel": runner.head_kernel,  # e.g. "gemv 1-16 rows"; None: no CPU matmul
        "lm_head_choice": None if runner.head_choice is None else runner.head_choice.as_dict(),
        "layers_path": runner.layers_path,  # "fused", or "transformers: <why>"
        "decoder_layers": runner.decoder_layers,  # which layers the timed steps ran
        "decoder_layer_steps": dict(runner.decoder_layer_steps),
        "layers_step": runner.layers_step,  # "C++", or "Python: <why>"; None: not fused
        "memory": memory_object(runner, _config(args), requests, peaks),
    }
    print_report(args, results, normal_results, extra, (medians, failures, engines))
    optional_measures(args, runner, requests, extra)
    if args.out:
        from engine.workloads import export

        export.write_files(args.out, medians)  # requests.csv, traces.json, trace.perfetto.json
    if args.json_path:
        write_json(args, loaded, results, extra, None if source is None else type(source).__name__)
    ok = not failures and all(
        r["reference_match"] is not False or r["info"].get("differences_expected")
        for r in results.values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
