"""A run's workload played at each chosen server after our engines (``run_servers``): a server
that fails is reported with its message while the other engines' results are kept, and a local
server fixed otherwise at its start says how the comparison is not like for like."""

from __future__ import annotations

import contextlib
import functools

from engine.config import EngineConfig
from engine.host_servers.server_set import ServerSet
from engine.kernels import cpu_share
from engine.peers.endpoints import EndpointError
from engine.peers.schedule_comparison import num_shared_prompt_blocks, tally
from engine.sequence import Request
from engine.serving.run_control import RunStopped
from engine.trace import Trace


def run_servers(
    servers: ServerSet,
    names: list[str],
    requests: list[Request],
    config: EngineConfig,
    watch,
    dtype: str | None = None,
) -> tuple[dict[str, Trace], dict[str, str]]:
    """Run ``requests`` on each server in ``names``: (traces, failures), both by name.

    ``watch`` is ``ProgressLog.watch``. After a stop, the servers not run yet are failed as not
    run. ``config`` and ``dtype`` are our engines' run settings, for the warnings.
    """
    num_slots = config.num_slots
    traces: dict[str, Trace] = {}
    failures: dict[str, str] = {}
    for i, name in enumerate(names):
        streaming = []  # not empty once its streams began
        try:
            watched = functools.partial(watch, name)
            trace = _run_one(servers, name, requests, num_slots, watched, streaming)
        except EndpointError as exc:
            failures[name] = servers.public(name, str(exc))
            servers.refresh(name, failures[name])
            continue
        except RunStopped as exc:
            done = "Its streams were cancelled." if streaming else "It had not started streaming."
            failures[name] = f"stopped: {exc} {done}"
            failures.update(dict.fromkeys(names[i + 1 :], f"not run: {exc}"))
            break
        servers.refresh(name)
        servers.public_trace(name, trace)
        precision = _precision_warnings(servers, name, trace, dtype, config.batch_invariant)
        unlike = [*_slot_warnings(servers, name, num_slots), *precision]
        unlike += _prefix_warnings(servers, name, config.prefix_caching, requests, trace)
        trace.warnings = [*trace.warnings, *unlike]
        watch(name, trace, done=True)
        traces[name] = trace
    return traces, failures


def _run_one(
    servers: ServerSet, name: str, requests, num_slots: int, watch, streaming: list
) -> Trace:
    """One server's run; ``streaming`` gets an item when its streams begin."""
    watch(None, waiting=True, note="waiting for the server")
    on_wait = lambda note: watch(None, waiting=True, note=note)  # noqa: E731
    servers.wait_ready(name, on_wait)
    if servers.fits(name) and servers.engines[name].fit(requests, num_slots):
        servers.wait_ready(name, on_wait)  # it starts again with this run's settings
    streaming.append(True)
    engine = servers.engines[name]
    with _other_work(servers, name) as others:
        trace = engine.run(requests, on_wait=lambda t: watch(t, waiting=True))
    trace.info["others_cpu_share"] = others.share

    trace.warnings = [*trace.warnings, *cpu_share.load_warning(name, others.share)]
    return trace


def _other_work(servers: ServerSet, name: str):
    """Measures other work's share of a local server's CPUs beside its own process group's; an
    endpoint elsewhere is not measured (its ``share`` stays None)."""
    server = servers.engines[name].server if servers.is_local(name) else None
    if server is None or server.proc is None:
        return contextlib.nullcontext(cpu_share.OtherWork())
    return cpu_share.OtherWork(cpus=server.cpus(), group=server.proc.pid)


def _slot_warnings(servers: ServerSet, name: str, num_slots: int) -> list[str]:
    """The local vLLM's sequences are fixed at start: say so when the run has other slots."""
    if not servers.is_local(name) or servers.fits(name):
        return []
    max_num_seqs = servers.engines[name].server.settings.max_num_seqs
    if max_num_seqs == num_slots:
        return []
    sequences = "sequence" if max_num_seqs == 1 else "sequences"
    slots = "1 slot" if num_slots == 1 else f"{num_slots} slots"
    return [
        f"{name} runs up to {max_num_seqs} {sequences} at once (--max-num-seqs, fixed when the "
        f"page started; app.py --vllm-max-num-seqs changes it), while this run gave our engines "
        f"{slots}: the comparison is not like for like."
    ]


def _prefix_warnings(
    servers: ServerSet,
    name: str,
    prefix_caching: bool | None,
    requests: list[Request],
    trace: Trace,
) -> list[str]:
    """The local vLLM's prefix caching is fixed at start: say so when the run's engines did
    otherwise and the run's prompts share full KV blocks (of vLLM's block size; unknown: 16, its
    smallest default) or its record shows prefix-cache hits."""
    if not servers.is_local(name) or servers.fits(name) or prefix_caching is None:
        return []
    settings = servers.engines[name].server.settings
    served = settings.prefix_caching is not False
    if served == prefix_caching:
        return []
    record = trace.schedule or Trace(engine=name, num_slots=0)
    block_size = record.info.get("block_size") or settings.block_size or 16
    num_shared = num_shared_prompt_blocks(requests, block_size)
    num_hits = tally(record).num_prefix_hits
    if not num_shared and not num_hits:
        return []
    theirs, ours = ("caches", "did not") if served else ("does not cache", "did")
    blocks = f"{num_shared} block{'s' * (num_shared != 1)} of {block_size} tokens"
    why = f"this run's prompts share {blocks}"
    if num_hits:
        why = f"{num_hits} of its admissions started from cached blocks"
    return [
        f"{name} {theirs} prompt prefixes (fixed when the page started), while this run's "
        f"engines {ours} (the prefix caching setting), and {why}: its time to first token and "
        "its plans differ for that reason, not for its scheduler."
    ]


def _precision_warnings(
    servers: ServerSet, name: str, trace: Trace, dtype: str | None, batch_invariant: bool
) -> list[str]:
    """The local server's dtype is fixed at start: when the run has another, say so and record
    both in ``trace.info["server"]`` (``dtype``, ``run_dtype``); say it has no batch-invariant
    mode."""
    if not servers.is_local(name) or dtype is None:
        return []
    served = servers.engines[name].server.settings.dtype
    trace.info["server"] = {**trace.info.get("server", {}), "dtype": served, "run_dtype": dtype}
    lines = []
    fixed_by = "fixed when the page started; app.py --dtype sets it"
    if servers.fits(name):
        fixed_by = "llama.cpp computes in it, whatever the weights"
    if served != dtype:
        lines.append(
            f"{name} runs in {served} ({fixed_by}), "
            f"while this run ran our engines in {dtype}: its outputs are not compared with the "
            "reference, which is in the run's precision."
        )
    if batch_invariant:
        lines.append(
            f"{name} does not run in batch-invariant mode: its outputs depend on the batch, and "
            "its wall time is not that of our engines in that mode."
        )
    return lines
