"""Other work's share of the CPU: was the machine quiet while something was timed?

A kernel timing taken while other processes (or a hypervisor's other guests) use the cores
times the contention, not the kernels, so the kernel store keeps a measurement only when the
machine was quiet (``engine.model.kernel_store``).

Linux counts CPU time for the whole machine in ``/proc/stat`` (the ``cpu`` line: user, nice,
system, idle, iowait, irq, softirq, steal, in clock ticks) and for this process, all its threads
together, in ``/proc/self/stat`` (utime and stime, fields 14 and 15). Over an interval::

    others = (busy ticks of the machine - ticks of this process) / all ticks of the machine

where busy is everything but idle and iowait, so steal (time the hypervisor gave this machine's
cores to someone else) counts as other work. 0.0 is a machine running nothing but this process;
0.5 on 2 cores is one core's worth of other work. Where ``/proc`` is missing (macOS, Windows)
the share is unknown (None) and the timing is trusted.

A run kept to some CPUs (the page's engines, and its local servers beside them) is measured on
those CPUs' own lines (``cpu1`` ...), and a server's own work is its whole process group's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle 3, iowait 4)


LOADED_SHARE = 0.2  # other work's share of a run's CPUs over which its result is marked


def machine_ticks(stat_text: str, cpus: frozenset[int] | None = None) -> tuple[int, int]:
    """``(busy, total)`` clock ticks from ``/proc/stat``'s text: the whole machine's (the ``cpu``
    line), or the sum of ``cpus``' own lines (``cpu0``, ``cpu1`` ...).

    Raises:
        ValueError: no such line with at least 8 numbers.
    """
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
    """utime + stime clock ticks of a process from its ``/proc/<pid>/stat`` text (the command
    name, field 2, is in parentheses and may hold spaces, so fields are counted after it).

    Raises:
        ValueError: the text is not a process's stat line.
    """
    after_name = stat_text.rpartition(")")[2].split()
    if len(after_name) < 13:
        raise ValueError("not a /proc/<pid>/stat line")
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 overall


def group_ticks(proc: Path, group: int) -> int:
    """utime + stime clock ticks of every live process in process group ``group`` (field 5 of
    each ``/proc/<pid>/stat``); a process that ends meanwhile is skipped."""
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
    """The CPUs this process may run on; None where the system does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def load_warning(name: str, share: float | None) -> list[str]:
    """One line when other work took over ``LOADED_SHARE`` of ``name``'s CPUs during its run."""
    if share is None or share <= LOADED_SHARE:
        return []
    return [
        f"{name} ran while other work took {share:.0%} of its CPUs: its times are slower than "
        "on a quiet host (taken under load)."
    ]


class OtherWork:
    """Measures other work's share of the CPU over a ``with`` block: of the whole machine, or of
    ``cpus`` only; the measured work is this process, or process group ``group`` (a server's).

    ``share`` after the block: a fraction of those CPUs' time in the block (0.0 to 1.0), or None
    where ``/proc`` cannot be read or no tick passed.
    """

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
    """Wait, in windows of ``window_s``, until other work's share of the CPU over a window is
    below ``quiet_share`` (or unknown), at most about ``max_wait_s``; the seconds waited.

    The bench calls it before each timed run, so that a run does not pay for the work its
    predecessor left behind (a server's threads still busy after its run ends)."""
    started_s = time.perf_counter()
    while True:
        with OtherWork() as others:
            time.sleep(window_s)
        waited_s = time.perf_counter() - started_s
        if others.share is None or others.share < quiet_share or waited_s >= max_wait_s:
            return waited_s
