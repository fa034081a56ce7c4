"""The bench's server engines: ``vllm`` and ``--endpoint NAME=URL``, and what can go wrong.

A server engine is an ``OpenAIEngine`` (``engine.peers.openai_engine``); ``vllm`` also owns a local
server (``engine.peers.vllm_engine``), started once before the warm-up and stopped when the bench
ends, so every repeat runs on the same warm server. A server that cannot be reached, refuses a
request or dies raises ``EndpointError``: that engine is dropped with its message, the others go on,
and its JSON entry is ``{"error": ..., "server": ...}``. Successful entries get the same fields as
every engine plus ``server`` (name, URL, version, settings, warnings, ``/metrics`` samples of the
median run); ``vllm``'s ``num_steps`` counts the steps of vLLM's own record (``server_fields``).
"""

from __future__ import annotations

import dataclasses
import sys

from engine.bench.args import endpoints
from engine.peers.endpoints import EndpointError
from engine.trace import Trace


def server_engines(args, names: list[str], loaded) -> dict:
    """The ``vllm`` engine (if named) and one engine per ``--endpoint``, by name.

    Raises:
        ValueError: no ``.venv-vllm``, or a bad ``--endpoint``.
    """
    from engine.peers.openai_engine import OpenAIEngine

    engines = {}
    if "vllm" in names:
        from engine.peers.vllm_engine import VllmEngine

        engines["vllm"] = VllmEngine(loaded, args.slots, enforce_eager=args.vllm_eager)
    for endpoint in endpoints(args):
        engines[endpoint.name] = OpenAIEngine(endpoint, loaded, args.slots)
    return engines


def start_servers(engines: dict, failures: dict[str, str]) -> None:
    """Start every local server now (minutes), so no timed run pays for it."""
    for name, engine in engines.items():
        start = getattr(engine, "start", None)
        if start is None or name in failures:
            continue
        mode = "eager" if engine.server.settings.enforce_eager else "compiled"
        print(f"  {name}: starting vLLM ({mode}); this takes minutes", file=sys.stderr, flush=True)
        try:
            start()
        except EndpointError as exc:
            fail(name, exc, failures)
            continue
        server = engine.server
        print(
            f"  {name}: vLLM {server.version} ready in {server.start_s:.0f} s at {server.url}",
            file=sys.stderr,
        )


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
    for engine in engines.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def server_fields(trace: Trace) -> dict:
    """What a server engine's JSON entry adds (its median run); {} for other engines.

    ``server``: name, URL, version, settings, warnings and ``/metrics`` samples. The ``vllm``
    engine also replaces ``num_steps`` (and ``ms_per_step``) with the steps of vLLM's own record
    (``engine.peers.vllm_record``) and adds ``server.schedule``: those steps' count, time and
    recording cost. Without a record ``num_steps`` stays 0, as for any server.
    """
    server = trace.info.get("server")
    if server is None:
        return {}
    samples = [dataclasses.asdict(s) for s in trace.server_samples]
    fields = {"server": {**server, "warnings": list(trace.warnings), "samples": samples}}
    schedule = getattr(trace, "schedule", None)  # engine.peers.vllm_record.VllmTrace
    if schedule is not None:
        num_steps = len(schedule.steps)
        fields["num_steps"] = num_steps
        fields["ms_per_step"] = 1000 * trace.wall_s / num_steps if num_steps else 0.0
        fields["server"]["schedule"] = schedule_summary(schedule)
    return fields


def schedule_summary(schedule: Trace) -> dict:
    """vLLM's own steps in brief: how many, their time, and what recording them cost."""
    info = schedule.info
    return {
        "num_steps": len(schedule.steps),
        "step_s": sum(s.duration_s for s in schedule.steps),
        "record_s": info.get("record_s"),
        "record_cost_pct": info.get("record_cost_pct"),
        "num_preemptions": sum(len(s.preempted) for s in schedule.steps),
        "source": info.get("source"),
    }


def failed_result(name: str, message: str, engines: dict) -> dict:
    """The JSON entry of an engine that failed: its message, and the server's facts if known."""
    engine = engines.get(name)
    info = getattr(engine, "_info", None)
    server = info.to_dict() if info is not None else {}
    if hasattr(engine, "server"):
        server.update(settings=engine.server.info())
    return {"error": message, "server": server or None}


def schedule_line(name: str, schedule: Trace) -> str:
    """The report's line on an engine's own steps, e.g. ``vllm: 301 steps in vLLM's own record
    (recording took 0.03 % of their time)``; transformers' (``hf_continuous``) is named by the
    ``transformers`` version its record's info carries."""
    cost = schedule.info.get("record_cost_pct")
    cost_text = "" if cost is None else f" (recording took {cost:.2f} % of their time)"
    owner = "transformers'" if schedule.info.get("transformers") else "vLLM's"
    return f"{name}: {len(schedule.steps)} steps in {owner} own record{cost_text}"
