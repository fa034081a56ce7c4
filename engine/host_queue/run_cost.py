"""A run's cost for the queue's estimate: its work in parts, and this host's pace for each part.

The parts, their units and how ``Pace`` learns them: docs/page.md, "A run's cost, and the live
pacing".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.sequence import Request

LEARNING_RATE = 0.5  # each finished run moves a part's pace this share of the way to its own
ENGINE_PARTS = ("static", "continuous", "hf_continuous")  # each timed by its own trace
PREFILL = "prefill"  # the engines' prompt tokens: their steps' time beyond a step without prefill
REFERENCE = "reference"  # the references computed: the wall time less the engines' and the run's
PREFILL_TOKENS_PER_STEP = 15.0  # prompt tokens whose prefill costs one step, until a trace timed it
RUN_S = 1.5  # rendering and judging a run, before one was timed here (measured: CPU)
REFERENCE_STEPS = 2.0  # setting up and judging one reference computed, in steps
REFERENCE_TOKEN_STEPS = 1.0  # one reference output token (batch 1), in steps
LIMIT_MARGIN = 2.0  # a run whose cost is over this many times the run limit is refused
SERVER_PREFIX = "server:"  # a server's stage is the part SERVER_PREFIX + its name
# A server's stage's seconds per continuous step over our engines' per step, before a stage of it
# was timed here: a server's step is an HTTP round trip and its own scheduling, besides the model.
SERVER_STEP_RATIO = 2.0


def server_part(name: str) -> str:
    return SERVER_PREFIX + name


@dataclass(frozen=True)
class Work:
    """One run's work, in the units each part's time grows with. ``references``: ``(prompt ids,
    sampling) -> cap`` not stored when it joined; ``min_wall_s``: the last arrival."""

    static_steps: int = 0
    continuous_steps: int = 0
    hf_steps: int = 0
    prompt_tokens: int = 0  # every request's prompt, prefilled once by each engine
    static_prefill_tokens: int = 0  # the static waves' prompt positions, padding included
    references: Mapping[Hashable, int] = field(default_factory=dict)
    min_wall_s: float = 0.0
    servers: tuple[str, ...] = ()
    recheck: Callable[[Mapping], Mapping] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_steps(cls, steps: int) -> Work:
        """Work known only as steps (counted as the continuous engine's)."""
        return cls(continuous_steps=max(1, int(steps)))

    def missing_now(self) -> Mapping[Hashable, int]:
        if self.recheck is None or not self.references:
            return self.references
        return self.recheck(self.references)

    def server_parts(self) -> list[str]:
        return [server_part(name) for name in self.servers]

    @property
    def steps(self) -> int:
        """Every engine's steps together (the unit of a running run's progress)."""
        return self.static_steps + self.continuous_steps + self.hf_steps

    def units(self, references: Mapping[Hashable, int] | None = None) -> dict[str, float]:
        """Units per part; ``references``: those still to compute (default: all)."""
        steps = (self.static_steps, self.continuous_steps, self.hf_steps)
        units = {p: float(n) for p, n in zip(ENGINE_PARTS, steps, strict=True)}
        packed = sum(1 for n in steps[1:] if n)  # the engines that prefill each prompt once
        static = (self.static_prefill_tokens or self.prompt_tokens) if self.static_steps else 0
        units[PREFILL] = float(static + packed * self.prompt_tokens)
        refs = self.references if references is None else references
        units[REFERENCE] = sum(_reference_steps(key, cap) for key, cap in refs.items())
        units.update(dict.fromkeys(self.server_parts(), self.server_steps()))
        return units

    def server_steps(self) -> float:
        """A server's stage's units: the run's continuous steps (at least one)."""
        return float(max(1, self.continuous_steps))

    def engine_steps(self) -> float:
        units = self.units()
        return sum(units[p] for p in ENGINE_PARTS) + units[PREFILL] / PREFILL_TOKENS_PER_STEP


@dataclass
class Pace:
    """This host's seconds per unit of each part of a run, learned from finished runs."""

    # per part: moving averages of its seconds and of its units, over the runs that had it
    _seconds: dict[str, float] = field(default_factory=dict)
    _units: dict[str, float] = field(default_factory=dict)
    run_s: float = RUN_S  # rendering and judging a run: the prior, then a moving average
    # per server name: its stage's seconds per step over our engines' per step (moving averages)
    server_ratios: dict[str, float] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return bool(self._units)

    def s_per_unit(self, part: str | None = None) -> float | None:
        """Seconds per unit of ``part``, else from the engines' per step (a server's stage: its
        ratio times it); None before any."""
        if part in self._units and self._units[part] > 0:
            return self._seconds[part] / self._units[part]
        engines = [p for p in ENGINE_PARTS if p in self._units] or list(self._units)
        units = sum(self._units[p] for p in engines)
        if units <= 0:
            return None
        s_per_step = sum(self._seconds[p] for p in engines) / units
        if part is not None and part.startswith(SERVER_PREFIX):
            return (
                self.server_ratios.get(part[len(SERVER_PREFIX) :], SERVER_STEP_RATIO) * s_per_step
            )
        return s_per_step / PREFILL_TOKENS_PER_STEP if part == PREFILL else s_per_step

    def engines_s(self, work: Work) -> float:
        if not self.known:
            return 0.0
        units = work.units()
        return sum(units[part] * self.s_per_unit(part) for part in (*ENGINE_PARTS, PREFILL))

    def server_stage_s(self, work: Work, name: str) -> float:
        """Seconds of ``work``'s stage on server ``name`` (a wait for its start left out)."""
        if not self.known:
            return 0.0
        return max(work.server_steps() * self.s_per_unit(server_part(name)), work.min_wall_s)

    def learn(
        self,
        work: Work,
        wall_s: float,
        parts_s: Mapping[str, float] | None,
        beside_start: bool = False,
    ) -> None:
        """Learn from a run of ``work`` that took ``wall_s``; ``beside_start``: a server started
        meanwhile, so only the servers' stages are learned (the engines shared their CPUs)."""
        units = work.units()
        if beside_start:
            stages = work.server_parts()
            seconds = {p: s for p, s in (parts_s or {}).items() if p in stages}
        elif parts_s is None:
            weights = dict(units, **{PREFILL: units[PREFILL] / PREFILL_TOKENS_PER_STEP})
            total = sum(weights.values())
            work_s = max(0.0, wall_s - self.run_s)
            seconds = {part: work_s * n / total for part, n in weights.items()} if total else {}
        else:
            timed = (*ENGINE_PARTS, PREFILL, *work.server_parts())
            seconds = {p: s for p, s in parts_s.items() if p in timed}
            rest_s = max(0.0, wall_s - sum(seconds.values()))
            if units[REFERENCE] > 0:
                seconds[REFERENCE] = max(0.0, rest_s - self.run_s)
            else:
                self.run_s = _moved(self.run_s, rest_s)
        for part, part_s in seconds.items():
            if units.get(part, 0.0) > 0:
                self._seconds[part] = _moved(self._seconds.get(part), part_s)
                self._units[part] = _moved(self._units.get(part), units[part])
        if parts_s is not None and not beside_start:
            self._learn_server_ratios(work, parts_s)

    def _learn_server_ratios(self, work: Work, parts_s: Mapping[str, float]) -> None:
        """Each server's stage in ``parts_s``: its seconds per step over our engines' in it."""
        engines_s = sum(parts_s.get(p, 0.0) for p in (*ENGINE_PARTS, PREFILL))
        if engines_s <= 0 or work.engine_steps() <= 0:
            return
        s_per_step = engines_s / work.engine_steps()
        for name in work.servers:
            if (stage_s := parts_s.get(server_part(name))) is not None:
                ratio = stage_s / work.server_steps() / s_per_step
                self.server_ratios[name] = _moved(self.server_ratios.get(name), ratio)

    def cost_s(
        self,
        work: Work,
        references: Mapping[Hashable, int] | None = None,
        slowdown: float = 1.0,
    ) -> float | None:
        """Seconds ``work`` should take (None: no pace); ``slowdown`` spares the server stages."""
        if not self.known:
            return None
        reference_s = work.units(references)[REFERENCE] * self.s_per_unit(REFERENCE)
        engines_s = max(self.engines_s(work), work.min_wall_s)
        servers_s = sum(self.server_stage_s(work, name) for name in work.servers)
        return slowdown * (engines_s + reference_s + self.run_s) + servers_s

    def engine_s_left(self, work: Work, steps_done: int) -> float:
        if work.steps <= 0:
            return 0.0
        return max(0, work.steps - steps_done) / work.steps * self.engines_s(work)

    @staticmethod
    def uniform(s_per_unit: float, run_s: float = RUN_S) -> Pace:
        return Pace({"continuous": s_per_unit}, {"continuous": 1.0}, run_s)

    @staticmethod
    def from_progress(work: Work, elapsed_s: float, steps_done: int) -> Pace | None:
        """A running run's pace from ``steps_done`` steps in ``elapsed_s``; None before a step."""
        if steps_done <= 0 or elapsed_s <= 0 or work.steps <= 0:
            return None
        done = work.engine_steps() * min(1.0, steps_done / work.steps)
        return Pace.uniform(elapsed_s / done)


def over_limit(cost_s: float | None, limit_s: float | None) -> str | None:
    """Why a run of ``cost_s`` seconds is refused under ``limit_s``; None within ``LIMIT_MARGIN``
    times it (or cost unknown)."""
    if cost_s is None or limit_s is None or cost_s <= LIMIT_MARGIN * limit_s:
        return None
    return (
        f"This run's estimate here is {_duration(cost_s)}, over {LIMIT_MARGIN:g} times this "
        f"host's limit of {_duration(limit_s)} a run: the limit would stop it long before its "
        "end. Make it smaller: fewer rows, smaller max_new_tokens caps, more slots, earlier "
        "arrivals, or fewer engines and checks (transformers' engine, the reference check)."
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _reference_steps(key: Hashable, cap: int) -> float:
    """Step units of one reference: set-up and judging, prefill, and output at batch 1."""
    prompt = key[0] if isinstance(key, tuple) and key else ()
    prompt_len = len(prompt) if isinstance(prompt, tuple | list) else 0
    return REFERENCE_STEPS + prompt_len / PREFILL_TOKENS_PER_STEP + cap * REFERENCE_TOKEN_STEPS


def _moved(old: float | None, new: float) -> float:
    return new if old is None else old + LEARNING_RATE * (new - old)


# --- a run's work, counted from its requests ------------------------------------------------------


def _waves(requests: list[Request], config: EngineConfig) -> list[list[Request]]:
    b = config.num_slots
    return [requests[i : i + b] for i in range(0, len(requests), b)]


def static_steps(requests: list[Request], config: EngineConfig) -> int:
    return sum(max(r.max_new_tokens for r in wave) for wave in _waves(requests, config))


def static_prefill_tokens(requests: list[Request], config: EngineConfig) -> int:
    waves = _waves(requests, config)
    return sum(len(w) * max(len(r.prompt_token_ids) for r in w) for w in waves)


def continuous_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated continuous steps: caps packed onto the slots in arrival order, plus prefill
    chunks past the first (caps 12, 20, 8, 30 on two slots take 50 steps, not 35)."""
    budget = config.max_num_batched_tokens
    free_at = [0] * config.num_slots  # a heap: the step each slot is free from
    for r in sorted(requests, key=lambda r: r.arrival_s):
        chunks = math.ceil(len(r.prompt_token_ids) / budget) if budget else 1
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + r.max_new_tokens + max(0, chunks - 1))
    return max(free_at)


def run_work(requests: list[Request], config: EngineConfig, options, reference=None) -> Work:
    """A run's ``Work``; ``reference``: the reference source (None: every reference missing)."""
    continuous = continuous_steps(requests, config)
    references, recheck = {}, None
    if options.check_reference and reference is not None:
        references, recheck = reference.missing(requests), reference.still_missing
    elif options.check_reference:
        references = {(r.prompt_token_ids, r.request_id): r.max_new_tokens for r in requests}
    return Work(
        static_steps=static_steps(requests, config),
        continuous_steps=continuous,
        hf_steps=continuous if options.compare_hf else 0,
        prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
        static_prefill_tokens=static_prefill_tokens(requests, config),
        references=references,
        min_wall_s=max((r.arrival_s for r in requests), default=0.0),
        servers=tuple(getattr(options, "servers", ())),
        recheck=recheck,
    )
