"""What the page says about its servers: the servers line, and a run's server results in words."""

from __future__ import annotations

import time

from engine.host_servers.server_set import FAILED, READY, STARTING, ServerSet
from engine.page.figures.style import counted
from engine.page.views.markup import one_line, plain_markdown
from engine.peers.server_process import cpus_of
from engine.trace import Trace


def servers_markdown(servers: ServerSet | None) -> str:
    if servers is None or not servers.names:
        return ""
    parts = [_server_part(servers, name) for name in servers.names]
    return "**Servers** · " + " · ".join(parts)


def _server_part(servers: ServerSet, name: str) -> str:
    status = servers.status(name)
    label = f"**{plain_markdown(name)}**"
    if status.state == FAILED:
        return f"{label}: ✗ {plain_markdown(one_line(status.detail))}"
    if status.state == READY:
        return f"{label}: ready · {_facts(servers, name)}"
    if status.state == STARTING and servers.is_local(name):
        # its stage in words; not status.detail, its log's latest line: the server's own jargon
        elapsed_s = time.monotonic() - status.since_s
        what = "llama.cpp" if servers.fits(name) else "vLLM"
        stage = f"{status.stage} " if status.stage else ""
        return f"{label}: starting {what}… {stage}({_settings(servers, name)}) · {elapsed_s:.0f} s"
    return f"{label}: asking what it serves"


def _facts(servers: ServerSet, name: str) -> str:
    """What a ready server serves and runs with (never its address)."""
    engine = servers.engines[name]
    info = engine.probed
    facts = []
    if servers.is_local(name):
        server = engine.server
        started = f" · started in {server.start_s:.0f} s" if server.start_s else ""
        what = "llama.cpp" if servers.fits(name) else "vLLM"
        facts.append(f"{what} {server.version or '?'} ({_settings(servers, name)}){started}")
    elif info is not None:
        facts.append(f"serves {info.model or 'an unnamed model'}")
        if info.version:
            facts.append(f"version {info.version}")
    if info is not None and info.same_model is False:
        facts.append("⚠ another model than the one loaded here: its outputs are not compared")
    return plain_markdown(" · ".join(facts)) if facts else "answering"


def _settings(servers: ServerSet, name: str) -> str:
    s = servers.engines[name].server.settings
    if servers.fits(name):  # llama.cpp: its weights, and the last run's slots
        return (
            f"{s.weights.upper()} weights · {counted(s.num_slots, 'slot')} of "
            f"{counted(s.ctx_per_slot, 'token')} (each run's own) · "
            f"{counted(len(cpus_of(s.cpus)), 'thread')}"
        )
    mode = "eager" if s.enforce_eager else "compiled"
    return (
        f"{mode} · {s.dtype} · up to {counted(s.max_num_seqs, 'sequence')} at once · "
        f"{counted(s.max_model_len, 'token')} per request · "
        f"{counted(len(cpus_of(s.omp_threads_bind)), 'thread')}"
    )


def status_parts(servers: dict[str, Trace], failures: dict[str, str]) -> tuple[list[str], str]:
    """(parts of the status line's first line, further lines): wall times, failures, warnings."""
    parts = [f"{plain_markdown(name)} {t.wall_s:.2f} s" for name, t in servers.items()]
    lines = [
        f"**✗ {plain_markdown(name)}:** {plain_markdown(one_line(message))}"
        for name, message in failures.items()
    ]
    for trace in servers.values():
        lines += [f"⚠ {plain_markdown(one_line(w))}" for w in trace.warnings]
    if failures:
        lines.append("The other engines' results are kept.")
    return parts, "  \n".join(lines)
