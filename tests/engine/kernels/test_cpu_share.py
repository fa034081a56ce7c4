"""Other work's share of the CPU, read from /proc as Linux writes it."""

import subprocess
import sys
import time

import pytest

from engine.kernels.cpu_share import OtherWork, machine_ticks, process_ticks, wait_quiet

# user nice system idle iowait irq softirq steal guest guest_nice
STAT = "cpu  {u} 0 {s} {idle} 5 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n"
# pid (comm with a space) state ppid ... utime (14) stime (15)
SELF = "4242 (python x) R 1 1 1 0 -1 4194304 10 0 0 0 {ut} {st} 0 0 20 0 3 0 100 1 1\n"


def _write(proc, u, s, idle, steal, ut, st):
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(STAT.format(u=u, s=s, idle=idle, steal=steal))
    (proc / "self" / "stat").write_text(SELF.format(ut=ut, st=st))


def test_ticks_are_read_from_the_cpu_line_and_after_the_command_name():
    """Busy excludes idle and iowait; a process's utime+stime come after its (spaced) name."""
    assert machine_ticks(STAT.format(u=10, s=20, idle=100, steal=3)) == (33, 138)
    assert process_ticks(SELF.format(ut=7, st=4)) == 11
    with pytest.raises(ValueError, match="cpu"):
        machine_ticks("intr 1 2\n")


def test_the_share_is_the_machines_busy_time_less_this_process_over_all_time(tmp_path):
    """1,000 ticks pass: 600 busy, 200 of them ours (steal counts as others): share 0.4."""
    _write(tmp_path, u=0, s=0, idle=0, steal=0, ut=0, st=0)
    with OtherWork(tmp_path) as others:
        _write(tmp_path, u=400, s=100, idle=400, steal=100, ut=150, st=50)
    assert others.share == pytest.approx(0.4), f"share {others.share}, expected 0.4"


def test_a_machine_running_only_this_process_is_quiet(tmp_path):
    """All busy ticks are this process's: share 0.0."""
    _write(tmp_path, u=0, s=0, idle=0, steal=0, ut=0, st=0)
    with OtherWork(tmp_path) as others:
        _write(tmp_path, u=300, s=100, idle=595, steal=0, ut=300, st=100)
    assert others.share == 0.0


def test_without_proc_the_share_is_unknown(tmp_path):
    """No /proc (macOS, Windows): None, and timing goes on as before."""
    with OtherWork(tmp_path / "missing") as others:
        pass
    assert others.share is None


def test_waiting_for_a_quiet_machine_stops_when_it_is_quiet_or_at_its_limit():
    """A process spinning beside this one keeps the machine busy: the wait runs to its limit;
    where any share counts as quiet, it ends after its first window."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy_s = wait_quiet(max_wait_s=0.6, window_s=0.1, quiet_share=0.1)
    finally:
        spinner.kill()
        spinner.wait()
    quiet_s = wait_quiet(max_wait_s=3.0, window_s=0.1, quiet_share=1.01)
    assert busy_s >= 0.6, f"waited {busy_s:.2f} s beside a spinning process"
    assert 0.1 <= quiet_s < busy_s, f"waited {quiet_s:.2f} s on a quiet machine"


# cpu0 and cpu1 lines beside the machine's: user nice system idle iowait irq softirq steal
PER_CPU = "cpu  {a} 0 0 {ai} 0 0 0 0\ncpu0 {b} 0 0 {bi} 0 0 0 0\ncpu1 {c} 0 0 {ci} 0 0 0 0\n"
# pid (comm) state ppid pgrp ... utime (14) stime (15)
MEMBER = "{pid} (llama-server) S 1 {group} 1 0 -1 0 0 0 0 0 {ut} {st} 0 0 20 0 3 0 100 1 1\n"


def test_cpus_sum_their_own_lines_and_a_missing_cpu_is_an_error():
    """cpu1 alone: 30 busy of 130; cpu0 and cpu1: 40 of 200; a CPU /proc/stat lacks raises."""
    text = PER_CPU.format(a=40, ai=160, b=10, bi=60, c=30, ci=100)
    assert machine_ticks(text, frozenset({1})) == (30, 130)
    assert machine_ticks(text, frozenset({0, 1})) == (40, 200)
    with pytest.raises(ValueError, match="cpu7"):
        machine_ticks(text, frozenset({7}))


def test_a_servers_own_work_is_its_process_groups_on_its_cpus(tmp_path):
    """On cpu1, 1,000 ticks pass, 700 busy; group 50's two processes took 300 + 100 of them, a
    process of another group 500 (not subtracted): others' share (700 - 400) / 1000 = 0.3."""

    def write(c, ci, ticks):
        (tmp_path / "stat").write_text(PER_CPU.format(a=0, ai=0, b=0, bi=0, c=c, ci=ci))
        for pid, group, ut in ((50, 50, ticks[0]), (51, 50, ticks[1]), (60, 60, ticks[2])):
            (tmp_path / str(pid)).mkdir(exist_ok=True)
            (tmp_path / str(pid) / "stat").write_text(
                MEMBER.format(pid=pid, group=group, ut=ut, st=0)
            )

    write(0, 0, (0, 0, 0))
    with OtherWork(tmp_path, cpus={1}, group=50) as others:
        write(700, 300, (300, 100, 500))
    assert others.share == pytest.approx(0.3), f"share {others.share}, expected 0.3"
