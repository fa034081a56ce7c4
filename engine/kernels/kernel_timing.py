"""Kernel timing: the engines' matmul chosen by timing the candidates where the engines run.

Candidates, row counts, the time budget and the choice rule: docs/engines.md#kernels.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from engine.kernels import gemv_build
from engine.kernels.cpu_share import OtherWork
from engine.kernels.gemv_build import cpu_capabilities, on_x86
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.linear_kernel import HALF_DTYPES, MAX_GEMV_ROWS, bind

DECODE_ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
PREFILL_ROWS = (32, 64, 128, 256, 512)
ROW_COUNTS = DECODE_ROWS + PREFILL_ROWS
HEAD_ROWS = DECODE_ROWS  # the LM head's: one row per sequence, up to the page's 16 slots
BUDGET_S = 5.0
HEAD_BUDGET_S = 5.0  # as the decoder's: binding and warming up a 262 k-row head take seconds
REPEAT = 3
TIE_FRACTION = 0.05
QUIET_SHARE = 0.2  # other work's share of the CPU up to which a measurement is kept
MIN_TIMED_BYTES = 64 * 2**20
DEFAULT_CACHE_BYTES = 32 * 2**20  # where the OS does not say how large the last-level cache is
MAX_ROWS = {"gemv": MAX_GEMV_ROWS}  # candidates timed only up to a row count (F.linear above)
_NATIVE_HALF = {  # the CPU capabilities (torch.cpu.get_capabilities) of oneDNN's half kernels
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}

log = logging.getLogger(__name__)


def candidates_for(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels worth timing for weights of ``dtype`` here."""
    names = ["linear", "skinny"]
    if on_x86() and torch.backends.mkldnn.is_available():
        if dtype not in HALF_DTYPES:
            names.append("onednn")
        else:
            flags = cpu_capabilities()
            if any(flags.get(flag) for flag in _NATIVE_HALF[dtype]):
                names.append("onednn")
            names.append("onednn_f32")
    if dtype in (torch.float32, torch.bfloat16) and gemv_build.available():
        names.append("gemv")
    return tuple(names)


def last_level_cache_bytes() -> int:
    """The largest CPU cache (Linux's sysfs), else ``DEFAULT_CACHE_BYTES``."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes, default=DEFAULT_CACHE_BYTES)


def sample_linears(linears: list[nn.Linear], target_bytes: int | None = None) -> list[nn.Linear]:
    """The first whole layers of ``linears`` whose weights hold ``target_bytes`` (default: twice
    the last-level cache, at least ``MIN_TIMED_BYTES``); a layer is one period of their shapes."""
    if target_bytes is None:
        target_bytes = max(2 * last_level_cache_bytes(), MIN_TIMED_BYTES)
    shapes = [tuple(m.weight.shape) for m in linears]
    period = next(p for p in range(1, len(shapes) + 1) if shapes[p:] == shapes[: len(shapes) - p])
    period = 1 if period == len(shapes) else period
    count, total = 0, 0
    while count < len(linears) and (total < target_bytes or count % period):
        total += linears[count].weight.numel() * linears[count].weight.element_size()
        count += 1
    return linears[:count]


@dataclasses.dataclass(frozen=True)
class Timings:
    """Best ms per pass over the timed linears, per candidate and row count (None: not reached)."""

    rows: tuple[int, ...]
    times_ms: dict[str, tuple[float | None, ...]]  # candidate -> one per row count
    timed_linears: int  # how many linears a pass multiplies
    total_linears: int  # of how many (the decoder's)
    timed_bytes: int  # their weights
    measured_s: float  # wall time of the measurement, building the candidates included
    rounds: int  # complete rounds (every candidate at every row count)
    others_cpu_share: float | None = None  # other work's share of the CPU meanwhile (cpu_share)

    @property
    def complete(self) -> bool:
        return self.rounds >= 1

    @property
    def quiet(self) -> bool:
        return self.others_cpu_share is None or self.others_cpu_share <= QUIET_SHARE


def time_candidates(
    linears: list[nn.Linear],
    names: tuple[str, ...],
    rows: tuple[int, ...] = ROW_COUNTS,
    total_linears: int | None = None,
    budget_s: float = BUDGET_S,
    repeat: int = REPEAT,
    clock: Callable[[], float] = time.perf_counter,
    whole_round: bool = False,
) -> Timings:
    """Best-of-``repeat`` ms per pass over ``linears`` for each of ``names`` at each row count,
    within about ``budget_s``; ``whole_round`` finishes the first round whatever the budget."""
    start_s = clock()
    bound: dict[str, list] = {}
    for name in names:
        try:
            bound[name] = [(m.in_features, bind(name, m.weight.detach(), m.bias)) for m in linears]
        except RuntimeError as err:
            log.info("kernel %s left out of the timing: %s", name, err)
    dtype = linears[0].weight.dtype
    widths = {m.in_features for m in linears}
    best = {name: [float("inf")] * len(rows) for name in bound}
    num_passes = 0
    with torch.inference_mode(), OtherWork() as others:
        inputs = [{k: torch.randn(num_rows, k).to(dtype) for k in widths} for num_rows in rows]
        _warm_up(bound, inputs, linears, rows)
        last = dict.fromkeys(bound, (1, 0.0))  # each candidate's latest pass: (rows, seconds)
        per_round = sum(len(_timed(bound, r)) for r in rows)
        for i, name in _pass_order(list(bound), rows, repeat):
            last_rows, last_s = last[name]
            guess_s = last_s * max(1.0, rows[i] / last_rows)  # time grows at most with rows
            held = whole_round and num_passes < per_round
            if not held and clock() - start_s + guess_s > budget_s:
                break
            t0 = clock()
            for width, linear in bound[name]:
                linear(inputs[i][width])
            last[name] = (rows[i], clock() - t0)
            best[name][i] = min(best[name][i], 1000 * last[name][1])
            num_passes += 1
    times = {n: tuple(None if t == float("inf") else t for t in ts) for n, ts in best.items()}
    return Timings(
        rows=tuple(rows),
        times_ms=times,
        timed_linears=len(linears),
        total_linears=total_linears or len(linears),
        timed_bytes=sum(m.weight.numel() * m.weight.element_size() for m in linears),
        measured_s=clock() - start_s,
        rounds=num_passes // max(per_round, 1),
        others_cpu_share=others.share,
    )


def _timed(names, num_rows: int) -> list[str]:
    return [n for n in names if num_rows <= MAX_ROWS.get(n, num_rows)]


def _pass_order(names: list[str], rows: tuple[int, ...], repeat: int):
    """``(row index, candidate)`` per pass: rounds, row counts upwards, candidates rotating."""
    for round_index in range(repeat):
        for i, num_rows in enumerate(rows):
            timed = _timed(names, num_rows)
            shift = (round_index + i) % len(timed)
            for name in timed[shift:] + timed[:shift]:
                yield i, name


def _warm_up(bound: dict[str, list], inputs: list[dict], linears: list[nn.Linear], rows) -> None:
    """Each candidate once per weight shape and row count: oneDNN builds a primitive per shape."""
    first_of_shape = {tuple(m.weight.shape): i for i, m in reversed(list(enumerate(linears)))}
    for by_width, num_rows in zip(inputs, rows, strict=True):
        for name in _timed(bound, num_rows):
            for i in first_of_shape.values():
                width, linear = bound[name][i]
                linear(by_width[width])


def choose_plan(
    rows: tuple[int, ...],
    times_ms: dict[str, tuple[float | None, ...]],
    tie_fraction: float = TIE_FRACTION,
) -> RowPlan:
    """The fastest candidate per range of row counts; ``times_ms[name][i]`` at ``rows[i]``.

    Raises:
        ValueError: no candidate has a time at any row count.
    """
    starts: list[int] = []
    names: list[str] = []
    for i, num_rows in sorted(enumerate(rows), key=lambda pair: pair[1]):
        measured = {n: ts[i] for n, ts in times_ms.items() if ts[i] is not None}
        if not measured:
            continue
        fastest = min(measured, key=measured.__getitem__)
        held = names[-1] if names else None
        if held in measured and measured[held] <= measured[fastest] * (1 + tie_fraction):
            fastest = held
        if fastest != held:
            # a held candidate that stops at its MAX_ROWS hands over just past it
            starts.append(min(num_rows, MAX_ROWS.get(held, num_rows) + 1) if starts else 1)
            names.append(fastest)
    if not names:
        raise ValueError("no kernel was timed at any row count")
    return RowPlan(tuple(starts), tuple(names))


def untimed_kernel() -> str:
    """The kernel of a model that is not timed: ``onednn`` on x86, else ``skinny``."""
    return "onednn" if on_x86() else "skinny"
