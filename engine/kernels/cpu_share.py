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
"""

from __future__ import annotations

import time
from pathlib import Path

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle 3, iowait 4)


def machine_ticks(stat_text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of the whole machine from ``/proc/stat``'s text.

    Raises:
        ValueError: the text has no ``cpu`` line with at least 8 numbers.
    """
    for line in stat_text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(value) for value in parts[1:9]]
            if len(ticks) < 8:
                break
            return sum(ticks[i] for i in BUSY_FIELDS), sum(ticks)
    raise ValueError("no 'cpu' line with 8 counters in /proc/stat")


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


class OtherWork:
    """Measures other work's share of the machine's CPU over a ``with`` block.

    ``share`` after the block: a fraction of all the machine's CPU time in the block (0.0 to
    1.0), or None where ``/proc`` cannot be read or no tick passed.
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
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
            busy, total = machine_ticks((self._proc / "stat").read_text())
            own = process_ticks((self._proc / "self" / "stat").read_text())
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
