"""The bench's server engines: ``vllm``, ``llamacpp``, ``llamacpp_q4`` and ``--endpoint NAME=URL``.

Local servers start once before the warm-up and stop when the bench ends. A server that fails
raises ``EndpointError``: that engine is dropped with its message (``failed_result``), the others
go on. The JSON fields: docs/bench.md.
"""

from __future__ import annotations

import dataclasses
import sys

from engine.bench.args import endpoints
from engine.peers.endpoints import EndpointError
from engine.peers.openai_engine import ServerRegistry
from engine.trace import Trace

MATCHED = ("continuous_paged", "continuous")  # our engines vLLM's settings follow, first first


def server_engines(args, names: list[str], loaded, ours: dict, requests, followed) -> dict:
    """The ``vllm`` and llama.cpp engines (those named) and one engine per ``--endpoint``, by name;
    vLLM and each recorded endpoint note the engine of ours they match (``matched_engine``).

    Raises:
        ValueError: no ``.venv-vllm``, no llama-server or GGUF for it, or a bad ``--endpoint`` or
            ``--endpoint-record``.
    """
    from engine.peers.vllm_engine import endpoint_engine

    engines = {}
    matched = matched_engine(ours)
    if "vllm" in names:
        engines["vllm"] = _vllm_engine(args, loaded, ours, matched, requests)
    for name in ("llamacpp", "llamacpp_q4"):
        if name in names:
            from engine.llamacpp.engines import LlamaCppEngine

            engines[name] = LlamaCppEngine(loaded, args.slots, name=name, requests=requests)
    for endpoint in endpoints(args):
        engines[endpoint.name] = engine = endpoint_engine(endpoint, loaded, args.slots)
        if endpoint.record_url is None:
            continue
        mine = followed if followed is not None and followed.endpoint == endpoint.name else None
        engine.matched_to, engine.followed = matched, mine
        engine.unmatched = mine.unmatched if mine else ["ours ran on the flags' settings"]
    return engines


def matched_engine(ours: dict) -> str | None:
    """The first of ``MATCHED`` among ``ours``, whose schedule a server's is compared with."""
    return next((name for name in MATCHED if name in ours), None)


def match_block_size(args, names: list[str], loaded) -> None:
    """With ``vllm`` beside ``continuous_paged`` on a CPU and no ``--block-size``, our blocks
    take vLLM's smallest CPU block size, so the two schedules compare; said on stderr."""
    from engine.peers.vllm_server import CPU_BLOCK_MULTIPLE

    paged_beside_vllm = "vllm" in names and "continuous_paged" in names
    if not paged_beside_vllm or "block_size" in args.given or loaded.device.type != "cpu":
        return
    args.block_size = CPU_BLOCK_MULTIPLE
    print(
        f"  continuous_paged: blocks of {CPU_BLOCK_MULTIPLE} tokens, as vLLM's on a CPU "
        "(its attention takes multiples of 32 only), so their schedules compare",
        file=sys.stderr,
    )


def _vllm_engine(args, loaded, ours: dict, name: str | None, requests):
    """The ``vllm`` engine, with the settings of our engine ``name``."""
    from engine.peers.vllm_engine import VllmEngine
    from engine.peers.vllm_server import matched_settings

    if name is None:
        return VllmEngine(loaded, args.slots, enforce_eager=args.vllm_eager)
    engine = ours[name]
    settings, unmatched = matched_settings(
        loaded,
        engine.config,
        requests,
        engine.num_kv_blocks(requests),
        enforce_eager=args.vllm_eager,
    )
    vllm = VllmEngine(loaded, args.slots, settings=settings)
    vllm.matched_to, vllm.unmatched = name, unmatched
    for line in unmatched:
        print(f"warning: vllm's settings differ from {name}'s: {line}", file=sys.stderr)
    return vllm


def start_servers(engines: dict, failures: dict[str, str]) -> None:
    """Start every local server now (minutes), so no timed run pays for it."""
    registry = ServerRegistry(engines)
    for name in registry.local_names():
        if name in failures:
            continue
        engine = registry.engines[name]
        product, what = _server_kind(engine.server.settings)
        print(f"  {name}: starting {product} ({what})", file=sys.stderr, flush=True)
        try:
            engine.start()
        except EndpointError as exc:
            fail(name, exc, failures)
            continue
        server = engine.server
        print(
            f"  {name}: {product} {server.version} ready in {server.start_s:.0f} s at {server.url}",
            file=sys.stderr,
        )


def _server_kind(settings) -> tuple[str, str]:
    from engine.peers.vllm_server import VllmSettings

    if isinstance(settings, VllmSettings):
        mode = "eager" if settings.enforce_eager else "compiled"
        return "vLLM", f"{mode}; this takes minutes"
    return "llama.cpp", f"{settings.weights} weights, {settings.num_slots} slots"


def guarded_run(name: str, engine, requests, failures: dict[str, str]) -> Trace | None:
    """``engine.run(requests)``, or None with the reason in ``failures`` when a server fails."""
    if name in failures:
        return None
    try:
        return engine.run(requests)
    except EndpointError as exc:
        fail(name, exc, failures)
        return None


def fail(name: str, exc: Exception, failures: dict[str, str]) -> None:
    failures[name] = str(exc)
    print(f"  {name}: failed: {exc}", file=sys.stderr, flush=True)


def close_engines(engines: dict) -> None:
    """Stop every server the bench started."""
    ServerRegistry(engines).close()


def server_fields(trace: Trace) -> dict:
    """What a server engine's JSON entry adds (``server``; with its own record of steps,
    ``num_steps`` and ``server.schedule``: docs/bench.md); {} for other engines."""
    server = trace.info.get("server")
    if server is None:
        return {}
    samples = [dataclasses.asdict(s) for s in trace.server_samples]
    fields = {"server": {**server, "warnings": list(trace.warnings), "samples": samples}}
    schedule = trace.schedule  # a server's own record of its steps
    if schedule is not None:
        num_steps = len(schedule.steps)
        fields["num_steps"] = num_steps
        fields["ms_per_step"] = 1000 * trace.wall_s / num_steps if num_steps else 0.0
        fields["server"]["schedule"] = {
            "num_steps": num_steps,
            "step_s": sum(s.duration_s for s in schedule.steps),
            "record_s": schedule.info.get("record_s"),
            "record_cost_pct": schedule.info.get("record_cost_pct"),
            "num_preemptions": sum(len(s.preempted) for s in schedule.steps),
            "source": schedule.info.get("source"),
        }
    return fields


def failed_result(name: str, message: str, engines: dict) -> dict:
    """The JSON entry of an engine that failed: its message, and the server's facts if known."""
    engine = ServerRegistry(engines).server(name)
    info = engine.probed if engine is not None else None
    server = info.to_dict() if info is not None else {}
    if engine is not None and engine.is_local:
        server.update(settings=engine.server.info())
    return {"error": message, "server": server or None}


def schedule_line(name: str, schedule: Trace) -> str:
    """E.g. ``vllm: 301 steps in vLLM's own record (recording took 0.03 % of their time)``."""
    cost = schedule.info.get("record_cost_pct")
    cost_text = "" if cost is None else f" (recording took {cost:.2f} % of their time)"
    owner = "transformers'" if schedule.info.get("transformers") else "vLLM's"
    return f"{name}: {len(schedule.steps)} steps in {owner} own record{cost_text}"


def add_schedule_comparison(results: dict, medians: dict[str, Trace], engines: dict) -> None:
    """``results[server]["schedule_comparison"]`` (docs/bench.md) for each server with a record
    and a matched engine of ours: the two median runs' schedules."""
    from engine.peers.schedule_comparison import compare_schedules

    registry = ServerRegistry(engines)
    for server in registry.names:
        engine = registry.server(server)
        name = engine.matched_to if engine is not None else None
        schedule = medians[server].schedule if server in medians else None
        if name is None or schedule is None or name not in medians or server not in results:
            continue
        comparison = compare_schedules(medians[name], schedule)
        entry = {"engine": name, **comparison, "unmatched_settings": list(engine.unmatched)}
        if not engine.is_local:  # an endpoint with a record: ours may have taken its settings
            followed = engine.followed
            entry["settings_taken"] = None if followed is None else followed.to_dict()
        results[server]["schedule_comparison"] = entry


def comparison_lines(comparison: dict, server: str = "vllm") -> list[str]:
    """The report's lines on ``server``'s ``schedule_comparison``, e.g.::

    schedule: continuous 300 steps, vllm 301; 98.3 % of steps plan alike; first difference
      at step 0: vLLM does not run R1 (ours: 7 tokens)
      admissions 6 / 6, preemptions 0 / 0, prefix-cache hits 0 (0 tokens) / 0 (0 tokens)
    """
    ours, theirs = comparison["ours"], comparison["vllm"]
    first = comparison["first_difference"]
    where = "none" if first is None else f"at step {first['step']}: {first['reason']}"
    name = comparison["engine"]
    lines = [
        f"schedule: {name} {comparison['num_steps_ours']} steps, {server} "
        f"{comparison['num_steps_vllm']}; {100 * comparison['equal_step_fraction']:.1f} % of "
        f"steps plan alike; first difference {where}",
        f"  {name} / {server}: admissions {ours['num_admissions']} / {theirs['num_admissions']}, "
        f"preemptions {ours['num_preemptions']} / {theirs['num_preemptions']}, prefix-cache hits "
        f"{_hits(ours)} / {_hits(theirs)}",
    ]
    taken = comparison.get("settings_taken")
    if taken is not None:
        settings = {k: v for k, v in taken.items() if k != "from"}
        lines.append(
            f"  {name} ran on {taken['from']}'s settings (its record's start line): "
            + ", ".join(f"{k} {v}" for k, v in settings.items())
        )
    lines += [f"  settings differ: {line}" for line in comparison["unmatched_settings"]]
    return lines


def _hits(tally: dict) -> str:
    return f"{tally['num_prefix_hits']} ({tally['num_prefix_cached_tokens']} tokens)"
