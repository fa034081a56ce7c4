"""The CPUs a run's engines keep to themselves, and the rest, on which the page serves.

A run is a measurement, and on a small host the page that serves a room shares the CPUs with it.
Nice values (``engine.page.host.server_priority``) and a process of their own did not keep a room
off the engines' times: torch's OpenMP threads wait for each other at every parallel region of a
step, so a page thread that takes any of their CPUs for a moment stalls them all
(docs/measurements.md, "CPUs of their own"). Split, each process keeps to its own CPUs
(``engine.worker.worker_main.pin_process``): the engine process to the engine CPUs, with one
torch thread each, and the page's (Gradio's event loop and workers, the figures it draws) to the
rest.

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

    def short(self) -> str:
        """A few words for the page's model line, e.g. "engines on 1 of 2 CPUs"."""
        total = len(self.engine) + len(self.page)
        return f"engines on {len(self.engine)} of {total} CPUs"

    def describe(self) -> str:
        """One line for the start's log and the page, e.g. "engines on CPU 1 (1 thread), the
        page on CPU 0"."""
        n = len(self.engine)  # torch threads: one per engine CPU
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
