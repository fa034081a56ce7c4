"""Kernel timing: the engines' matmul chosen by timing the candidates where the engines run.

Which kernel is fastest depends on the CPU, its memory and torch's build, so every candidate
(``candidates_for``) is timed on the model's own weights at the row counts the engines meet
(``time_candidates``) and the fastest per range of row counts is kept (``choose_plan``).
``engine.model.kernel_store`` keeps the result on disk, so only a host's first start pays.

**Row counts** (``ROW_COUNTS``): a linear sees one row per token its step computes, so a decode
step one per running sequence (up to the page's 16 slots) and a prefill step up to its token
budget, plus the decodes. So: 1 to 6, 8, 12 and 16 for decode, and 32 to 512, doubling, for
prefill. A count between two measured ones takes the choice of the one below; above 512, 512's
(compute-bound there, where the order of the kernels stops changing).

**The bound: at most ``BUDGET_S`` at the first start.**

* A subset of the weights (``sample_linears``): the decoder's first whole layers until they hold
  twice the last-level cache. Every layer has the same shapes, so a few weigh each shape as the
  full stack does; more than the cache, so every pass streams its weights from memory as a real
  decode step does. The output embedding is left out: it is timed apart, alone, at the row
  counts it meets (``HEAD_ROWS``, within ``HEAD_BUDGET_S``), since a step multiplies it by one
  row per sequence only (the kept rows) and its shape (a vocabulary of up to 262 k rows) is
  unlike any decoder linear's.
* Best of ``REPEAT`` rounds, after a warm-up that builds oneDNN's primitives. Each round walks the
  row counts upwards and rotates the candidates' order, so the machine's drift falls on all alike.
* The measurement stops before a pass that would end past the budget (guessed from the same
  candidate's previous pass, scaled by the ratio of row counts). A row count no round reached
  takes the choice below it; a measurement that did not finish one round (``Timings.complete``),
  or that ran while other work used more than ``QUIET_SHARE`` of the CPU (``Timings.quiet``,
  ``engine.kernels.cpu_share``), serves this start only and is not kept.

**The rule** (``choose_plan``): at each measured row count, the candidate with the least time; a
candidate already chosen for the row count below keeps it while within ``TIE_FRACTION`` of the
least, so that noise between near-equal kernels does not split ranges. 5 %: the tolerance the
choice is held to, and about how far two timings of one kernel differ on a shared 2-core machine.
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
    """The kernels worth timing for weights of ``dtype`` here.

    ``linear`` and ``skinny`` everywhere; oneDNN on x86 where torch has it: ``onednn`` in float32,
    and in half precision only where the CPU has the native instructions (AVX512-BF16 or AMX for
    bfloat16, AVX512-FP16 or AMX-FP16 for float16), plus ``onednn_f32`` (float32 copies); and
    ``gemv`` for float32 and bfloat16 weights where it builds (``engine.kernels.gemv_build``;
    checking builds it, once per host).
    """
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
    """The first whole layers of ``linears`` (model order) whose weights hold ``target_bytes``,
    by default twice the last-level cache and at least ``MIN_TIMED_BYTES``; all of them if they
    hold less. A layer is one period of the weights' shapes (7 linears in a Llama-style decoder:
    q, k, v, o, gate, up, down); without a period, the prefix stops at the target."""
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
    """What ``time_candidates`` measured: ms per pass over the timed linears, per candidate and
    row count (best of the rounds run; None: no round reached it)."""

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
        """Whether every candidate was timed at every row count at least once."""
        return self.rounds >= 1

    @property
    def quiet(self) -> bool:
        """Whether other work used at most ``QUIET_SHARE`` of the CPU meanwhile (unknown: yes)."""
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
    """Best-of-``repeat`` ms per pass of ``F.linear(x, W)`` over every weight of ``linears`` (x: M
    random rows in the weights' dtype), for each kernel in ``names`` at each M of ``rows``, within
    about ``budget_s`` of wall time (see the module docstring); with ``whole_round``, the first
    round is finished whatever the budget (the LM head: one weight, so no smaller sample exists,
    and a 262 k-row head's first round takes about 5 s on a 2-core EPYC). A candidate that cannot
    take a weight (oneDNN refusing it) is left out, with a log line.
    """
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
    """The candidates timed at ``num_rows``: each up to its ``MAX_ROWS`` (above it, it is another
    candidate's kernel under its name)."""
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
    """Each candidate once on each weight shape at each row count it is timed at: oneDNN builds
    (and caches) a primitive per shape on its first call, which no timed pass should pay for."""
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
    """The fastest candidate per range of row counts (the rule in the module docstring).

    ``times_ms[name][i]``: ms per pass of candidate ``name`` at ``rows[i]`` (None: not measured).
    The first range starts at 1 row whatever the smallest measured count; a range of a candidate
    with a ``MAX_ROWS`` ends there at the latest (the next range starts one row past it).

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
    """The kernel of a model that is not timed: ``onednn`` on x86 (the fastest at every row count
    on this project's AMD EPYC, ``engine/kernels/linear_kernel.py``), else ``skinny``."""
    return "onednn" if on_x86() else "skinny"
