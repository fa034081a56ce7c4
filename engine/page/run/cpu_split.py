"""Where the engines run (an engine process or the page's engine thread), and the CPUs they keep
to themselves: a page thread on an OpenMP pool's CPU stalls the whole pool (docs/measurements.md,
"CPUs of their own"). ``CBP_ENGINE_CPUS``: docs/hosting.md. Linux only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine import settings

ENV = "CBP_ENGINE_CPUS"
PROCESS_ENV = "CBP_ENGINE_PROCESS"


def engine_process_wanted(environ=None, on_zerogpu: bool = False) -> bool:
    """Whether ``app.py`` runs the engines in a ``ProcessWorker`` (``CBP_ENGINE_PROCESS``:
    docs/hosting.md); raises ValueError for another value."""
    text = settings.choice(PROCESS_ENV, environ=environ)
    return text == "on" or (text == "auto" and not on_zerogpu)


@dataclass(frozen=True)
class CpuSplit:
    """CPU numbers (as ``os.sched_getaffinity`` names them): the engines' and the page's."""

    engine: tuple[int, ...]
    page: tuple[int, ...]

    def short(self) -> str:
        total = len(self.engine) + len(self.page)
        return f"engines on {len(self.engine)} of {total} CPUs"

    def describe(self) -> str:
        """E.g. "engines on CPU 1 (1 thread), the page on CPU 0"."""
        n = len(self.engine)  # torch threads: one per engine CPU
        return (
            f"engines on {_cpus(self.engine)} ({n} thread{'s' * (n != 1)}), "
            f"the page on {_cpus(self.page)}"
        )


def cpu_split(
    environ: Mapping[str, str] | None = None, available: tuple[int, ...] | None = None
) -> CpuSplit | None:
    """The split ``CBP_ENGINE_CPUS`` asks for on ``available`` (default: this process's
    affinity); None for no split. Raises ValueError for a bad value."""
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
    """In words: "CPU 1", "CPUs 1-7" or "CPUs 0, 2"."""
    if len(cpus) == 1:
        return f"CPU {cpus[0]}"
    if list(cpus) == list(range(cpus[0], cpus[-1] + 1)):
        return f"CPUs {cpus[0]}-{cpus[-1]}"
    return "CPUs " + ", ".join(map(str, cpus))
