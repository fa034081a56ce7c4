"""The kernel store: the engines' matmul choice (``KernelChoice``), kept on disk per host.

File layout, key and what is not kept: docs/engines.md#kernels.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine import cache_file
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import Timings, cpu_capabilities
from engine.kernels.linear_kernel import CANDIDATES
from engine.model import loader
from engine.model.device import cpu_model

FORMAT = 3  # bump when the file's layout, or the timing behind a choice, changes (3: parts)
FOLDER = "kernel-choice"

log = logging.getLogger(__name__)
ORIGINS = {  # KernelChoice.origin -> what it means for people
    "measured": "measured at this start",
    "cached": "measured at an earlier start on this host",
    "forced": "named by CBP_ENGINE_KERNEL",
    "default": "not measured: a model built in memory",
    "fallback": "timing finished no pass within its budget: the device's own matmul",
    "none": "no CPU matmul to choose: the device's own",
}


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """The engines' matmul plan and how it was chosen (``origin``: a key of ``ORIGINS``)."""

    plan: RowPlan
    origin: str
    timings: Timings | None = None
    path: str | None = None

    def summary(self) -> str:
        """E.g. ``"linear 1-4 rows, onednn 5+ rows (measured at this start, in 2.1 s)"``."""
        how = ORIGINS[self.origin]
        if self.timings is not None:
            how += f", in {self.timings.measured_s:.1f} s"
            if not self.timings.quiet:  # kept for this start only (engine.model.kernel_store)
                how += f", other work using {self.timings.others_cpu_share:.0%} of the CPU"
        return f"{self.plan.describe()} ({how})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (docs/engines.md#kernels); timing fields null when nothing was timed."""
        plan = [{"kernel": n, "from_rows": lo, "to_rows": hi} for lo, hi, n in self.plan.ranges()]
        fields = dataclasses.fields(Timings)
        timed = {f.name: None for f in fields}
        if self.timings is not None:
            timed = dataclasses.asdict(self.timings)
            timed["rows"] = list(timed["rows"])
            timed["times_ms"] = {n: list(ts) for n, ts in timed["times_ms"].items()}
        return {"origin": self.origin, "plan": plan, "file": self.path, **timed}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], origin: str, path: str | None = None) -> KernelChoice:
        """Raises ValueError, TypeError, KeyError: ``doc`` is not what ``as_dict`` writes."""
        ranges = doc["plan"]
        plan = RowPlan(tuple(r["from_rows"] for r in ranges), tuple(r["kernel"] for r in ranges))
        unknown = set(plan.names) - set(CANDIDATES)
        if unknown:
            raise ValueError(f"unknown kernels {sorted(unknown)}")
        rows = tuple(int(r) for r in doc["rows"])
        times = {
            str(n): tuple(None if t is None else float(t) for t in ts)
            for n, ts in doc["times_ms"].items()
        }
        if any(len(ts) != len(rows) for ts in times.values()):
            raise ValueError("a candidate's times do not match the row counts")
        share = doc.get("others_cpu_share")  # absent from files written before it existed
        timings = Timings(
            rows=rows,
            times_ms=times,
            timed_linears=int(doc["timed_linears"]),
            total_linears=int(doc["total_linears"]),
            timed_bytes=int(doc["timed_bytes"]),
            measured_s=float(doc["measured_s"]),
            rounds=int(doc["rounds"]),
            others_cpu_share=None if share is None else float(share),
        )
        return cls(plan, origin, timings, path)


def host_key(
    model_name: str,
    source: str,
    dtype: torch.dtype,
    linears: list[nn.Linear],
    candidates,
    part: str = "decoder",
    rows: tuple[int, ...] = (),
) -> dict[str, Any]:
    """What a kernel choice depends on, as JSON-ready fields."""
    capabilities = cpu_capabilities()
    flags = sorted(name for name, value in capabilities.items() if value is True)
    shapes = Counter(tuple(m.weight.shape) for m in linears)
    return {
        "format": FORMAT,
        "cpu": capabilities.get("cpu_name") or cpu_model(),
        "machine": platform.machine(),
        "cpu_flags": flags or [torch.backends.cpu.get_cpu_capability()],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "model": model_name,
        "source": source,
        "linear_shapes": sorted([*shape, count] for shape, count in shapes.items()),
        "candidates": list(candidates),
        "part": part,
        "rows": list(rows),
    }


def choice_path(key: dict[str, Any]) -> Path:
    return cache_file.key_path(loader.cache_dir() / FOLDER, key)


def stored_or_measured(
    key: dict[str, Any], measure: Callable[[], KernelChoice], remeasure: bool = False
) -> KernelChoice:
    """The choice kept for ``key``, else ``measure()``'s, written for the next start."""
    path = choice_path(key)
    stored = None if remeasure else read_choice(path, key)
    if stored is not None:
        return stored
    choice = measure()
    timings = choice.timings
    if timings is not None and not (timings.complete and timings.quiet):
        why = (
            "cut short by its time budget (machine busy?)"
            if not timings.complete
            else f"taken while other work used {timings.others_cpu_share:.0%} of the CPU"
        )
        head = key.get("part") == "lm_head"
        if choice.origin == "fallback":
            what = "the LM head" if head else "the engines' matmul"
            why += f" before it timed any kernel, so {what} is plain F.linear"
        log.warning(
            "%s timing was %s; the choice is used at this start and measured again at the next.",
            "The LM head's kernel" if head else "Kernel",
            why,
        )
        return choice
    if write_choice(path, key, choice):
        choice = KernelChoice(choice.plan, choice.origin, choice.timings, str(path))
    return choice


def read_choice(path: Path, key: dict[str, Any]) -> KernelChoice | None:
    """The choice in ``path`` (origin ``"cached"``), or None (a warning says why)."""

    def parse(doc: dict) -> KernelChoice:
        return KernelChoice.from_dict(doc["choice"], "cached", str(path))

    return cache_file.read_keyed(path, key, parse, "kernel choice", "measuring again", log)


def write_choice(path: Path, key: dict[str, Any], choice: KernelChoice) -> bool:
    """Atomically; False (and a warning) if it failed."""
    doc = {"key": key, "choice": {**choice.as_dict(), "origin": "measured", "file": None}}
    return cache_file.keep_keyed(path, doc, "kernel choice", log)
