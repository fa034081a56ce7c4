"""The CPUs a run's engines keep to themselves, and the rest, on which the page serves.

A run is a measurement, and on a small host the page that serves a room shares the CPUs with it.
Nice values (``engine.page.host.server_priority``) and a process of their own
(``engine.worker.worker_process``) did not keep a room off the engines' times: on the 2-core AMD
EPYC, torch's two OpenMP threads wait for each other at every parallel region of a step, so a
page thread that takes either CPU for a moment stalls both, and a 30-session room's runs took
1.5x to 2.3x their idle time (docs/measurements.md, "What a waiting room costs the page").

Split, the engine process is pinned (``sched_setaffinity``: ``worker_process.pin_process``) to
the engine CPUs with one torch thread per CPU, and the page's process (Gradio's event loop and
workers, the figures it draws for everyone else) to the rest. On two CPUs that is one each: the
engines run on one thread, about 1.3x slower than on two on an idle page, and a busy page no
longer touches them (a Python loop kept busy on the page's CPU leaves the engines' times within
the machine's noise).

``CBP_ENGINE_CPUS`` (read at start, with the engine process only):

* ``auto`` (default): every CPU this process may use but the first, when it may use two or more;
* ``all``: no split; the engines' threads share every CPU with the page;
* a count ``N``: the last ``N`` CPUs, from 1 to one less than the CPUs this process may use.

Linux only (``os.sched_setaffinity``); elsewhere, or on a host with one CPU, there is no split.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine import settings

ENV = "CBP_ENGINE_CPUS"


@dataclass(frozen=True)
class CpuSplit:
    """CPU numbers (as ``os.sched_getaffinity`` names them): the engines' and the page's."""

    engine: tuple[int, ...]
    page: tuple[int, ...]

    @property
    def engine_threads(self) -> int:
        """torch threads for the engines: one per engine CPU."""
        return len(self.engine)

    def short(self) -> str:
        """A few words for the page's model line, e.g. "engines on 1 of 2 CPUs"."""
        total = len(self.engine) + len(self.page)
        return f"engines on {len(self.engine)} of {total} CPUs"

    def describe(self) -> str:
        """One line for the start's log and the page, e.g. "engines on CPU 1 (1 thread), the
        page on CPU 0"."""
        n = self.engine_threads
        return (
            f"engines on {_cpus(self.engine)} ({n} thread{'s' * (n != 1)}), "
            f"the page on {_cpus(self.page)}"
        )


def cpu_split(
    environ: Mapping[str, str] | None = None, available: tuple[int, ...] | None = None
) -> CpuSplit | None:
    """The split ``CBP_ENGINE_CPUS`` asks for on the CPUs ``available`` (default: this process's
    affinity); None for no split (``all``, ``auto`` on one CPU, or a system without affinity).

    Raises:
        ValueError: a value other than ``auto``, ``all`` or a whole number from 1 to one less
            than the CPUs available.
    """
    text = settings.value(ENV, environ).lower()
    if available is None:
        available = _available()
    cpus = tuple(sorted(available or ()))
    if text == "all" or not cpus:  # shared, or a system that cannot pin
        return None
    if text == "auto":
        count = len(cpus) - 1
    elif text.isdigit() and 1 <= int(text) < len(cpus):
        count = int(text)
    else:
        most = f"from 1 to {len(cpus) - 1}" if len(cpus) > 1 else "(this host has one CPU)"
        raise ValueError(f"{ENV}={text!r}: give auto, all or a number of CPUs {most}")
    if count < 1:
        return None
    return CpuSplit(engine=cpus[-count:], page=cpus[:-count])


def _available() -> tuple[int, ...]:
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(os.sched_getaffinity(0))


def _cpus(cpus: tuple[int, ...]) -> str:
    """ "CPU 1", "CPUs 1-7" or "CPUs 0, 2"."""
    if len(cpus) == 1:
        return f"CPU {cpus[0]}"
    if list(cpus) == list(range(cpus[0], cpus[-1] + 1)):
        return f"CPUs {cpus[0]}-{cpus[-1]}"
    return "CPUs " + ", ".join(map(str, cpus))
