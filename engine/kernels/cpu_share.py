"""Other work's share of the CPU: was the machine quiet while something was timed?

Over an interval, from ``/proc/stat`` (the machine, or given CPUs' lines) and ``/proc/self/stat``
(this process; a server's whole process group)::

    others = (busy ticks of the machine - ticks of this process) / all ticks of the machine

busy being all but idle and iowait, so a hypervisor's steal counts as other work. Without ``/proc``
(macOS, Windows) the share is None and a timing is trusted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle 3, iowait 4)


LOADED_SHARE = 0.2  # other work's share of a run's CPUs over which its result is marked


def machine_ticks(stat_text: str, cpus: frozenset[int] | None = None) -> tuple[int, int]:
    """``(busy, total)`` ticks of the ``cpu`` line, or the sum of ``cpus``' lines. Raises
    ValueError: no such line with at least 8 numbers."""
    names = {"cpu"} if cpus is None else {f"cpu{n}" for n in cpus}
    busy = total = found = 0
    for line in stat_text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in names:
            continue
        ticks = [int(value) for value in parts[1:9]]
        if len(ticks) < 8:
            break
        busy, total, found = (
            busy + sum(ticks[i] for i in BUSY_FIELDS),
            total + sum(ticks),
            found + 1,
        )
    if found != len(names):
        raise ValueError(f"no line with 8 counters for {sorted(names)} in /proc/stat")
    return busy, total


def process_ticks(stat_text: str) -> int:
    """utime + stime ticks of a ``/proc/<pid>/stat`` text (fields counted after the command name,
    which may hold spaces). Raises ValueError: not a stat line."""
    after_name = stat_text.rpartition(")")[2].split()
    if len(after_name) < 13:
        raise ValueError("not a /proc/<pid>/stat line")
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 overall


def group_ticks(proc: Path, group: int) -> int:
    """utime + stime ticks of every live process in process group ``group``."""
    ticks = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if int(text.rpartition(")")[2].split()[2]) == group:
                ticks += process_ticks(text)
        except (OSError, ValueError, IndexError):
            continue
    return ticks


def own_cpus() -> frozenset[int] | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def load_warning(name: str, share: float | None) -> list[str]:
    if share is None or share <= LOADED_SHARE:
        return []
    return [
        f"{name} ran while other work took {share:.0%} of its CPUs: its times are slower than "
        "on a quiet host (taken under load)."
    ]


class OtherWork:
    """Other work's share of ``cpus`` (default: the machine) over a ``with`` block, besides this
    process or process ``group``; ``share``: 0.0 to 1.0, or None where unknown."""

    def __init__(self, proc: Path = Path("/proc"), cpus=None, group: int | None = None) -> None:
        self._proc = proc
        self._cpus = None if cpus is None else frozenset(cpus)
        self._group = group
        self._start: tuple[int, int, int] | None = None
        self.share: float | None = None

    def __enter__(self) -> OtherWork:
        self._start = self._read()
        return self

    def __exit__(self, *exc_info) -> None:
        end = self._read()
        if self._start is None or end is None:
            return
        busy, total, own = (after - before for after, before in zip(end, self._start, strict=True))
        if total > 0:
            self.share = min(max((busy - own) / total, 0.0), 1.0)

    def _read(self) -> tuple[int, int, int] | None:
        try:
            busy, total = machine_ticks((self._proc / "stat").read_text(), self._cpus)
            if self._group is None:
                own = process_ticks((self._proc / "self" / "stat").read_text())
            else:
                own = group_ticks(self._proc, self._group)
        except (OSError, ValueError):
            return None
        return busy, total, own


def wait_quiet(max_wait_s: float = 5.0, window_s: float = 0.25, quiet_share: float = 0.1) -> float:
    """Wait in windows of ``window_s`` until other work's share is under ``quiet_share`` (at most
    about ``max_wait_s``); the seconds waited. The bench calls it before each timed run."""
    started_s = time.perf_counter()
    while True:
        with OtherWork() as others:
            time.sleep(window_s)
        waited_s = time.perf_counter() - started_s
        if others.share is None or others.share < quiet_share or waited_s >= max_wait_s:
            return waited_s
