"""A run's cost for the queue's estimate: its work in parts, and this host's pace for each part.

A page run's wall time is made of (the per-part timings that set these units are in
``docs/measurements.md``, "Queue estimates" and "A room's first minute"):

* **the static engine**: its steps (each wave to its longest cap);
* **the continuous engine**: its steps (the caps packed onto the slots); transformers' engine,
  when compared, as many steps again;
* **the engines' prefill**: the prompt positions they compute (a static wave's left padding
  included), each costing a share of a step that this host's traces say
  (``engine.trace.Trace.prefill_split``): a long system prompt is mostly prefill, a chat of short
  prompts mostly steps;
* **each server's stage** (``host_servers.run_servers``, after our engines): its seconds from its
  first report with the server up (a restart for the run's settings included, a wait for its own
  start not: ``run.StageClock``) to the next server's, in the run's continuous steps (the caps
  packed onto the slots, as a server schedules them), each server its own part
  (``server_part``), since vLLM and llama.cpp run at their own pace;
* **the reference pass**, for each request whose reference is not stored yet
  (``engine.fidelity.reference_store``): ``REFERENCE_STEPS`` per request to set up and judge, a
  step per output token (batch 1) and its prompt's prefill; nothing when stored;
* **the run itself**: rendering and judging (Python and plotly), in seconds.

So a ``Work`` counts each part but the last in *units*: steps, and prompt tokens for the prefill.
``Pace`` learns each part's seconds per unit from the runs that finish here, as moving averages of
seconds and of units (``LEARNING_RATE``): the engines' steps and prefill timed by their traces, the
rest of the wall time taught to the reference's pace when a reference was computed, else to the
run's own seconds (prior ``RUN_S``). A step count the caps over-estimate (end of sequence) or a
ratio that differs on another device is absorbed by that part's pace; a part not yet seen is priced
at the engines' pace (the prefill at ``PREFILL_TOKENS_PER_STEP`` tokens a step; a server not
run here yet, at the engines' pace per step). Before any run
finished, the pace is the running run's: its seconds so far over the units of its steps so far
(``Pace.from_progress``).

A run far over the host's per-run limit is refused before it queues (``over_limit``). A run's
``Work`` is counted from its requests (``run_work``).
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


def server_part(name: str) -> str:
    """The pace's part for the stage of the host's server ``name`` ("server:vllm")."""
    return SERVER_PREFIX + name


@dataclass(frozen=True)
class Work:
    """One run's work, in the units each part's time grows with.

    ``references``: the reference outputs it must compute, those not stored when it joined, as
    ``(prompt ids, sampling) -> cap``; a run ahead computing the same key to at least that cap makes
    it free, and so does one stored since (``recheck(references)``: those still missing now).
    ``min_wall_s``: the engines, and each server, wait for the last arrival, whatever their steps.
    ``servers``: the host's servers it runs after our engines, by name.
    """

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
        """Work known only as a number of steps (counted as the continuous engine's)."""
        return cls(continuous_steps=max(1, int(steps)))

    def missing_now(self) -> Mapping[Hashable, int]:
        """Its references still to compute now (``recheck``ed: stored since it joined are not)."""
        if self.recheck is None or not self.references:
            return self.references
        return self.recheck(self.references)

    def server_parts(self) -> list[str]:
        """The pace's parts of its servers' stages (``server_part``)."""
        return [server_part(name) for name in self.servers]

    @property
    def steps(self) -> int:
        """Every engine's steps together (the unit of a running run's progress)."""
        return self.static_steps + self.continuous_steps + self.hf_steps

    def units(self, references: Mapping[Hashable, int] | None = None) -> dict[str, float]:
        """Units per part: steps for ``ENGINE_PARTS``, prompt positions for ``PREFILL``, step
        units for ``REFERENCE``, continuous steps for each server's part; ``references``: those
        of its reference outputs still to compute once the runs ahead are done (default: all)."""
        steps = (self.static_steps, self.continuous_steps, self.hf_steps)
        units = {p: float(n) for p, n in zip(ENGINE_PARTS, steps, strict=True)}
        packed = sum(1 for n in steps[1:] if n)  # the engines that prefill each prompt once
        static = (self.static_prefill_tokens or self.prompt_tokens) if self.static_steps else 0
        units[PREFILL] = float(static + packed * self.prompt_tokens)
        refs = self.references if references is None else references
        units[REFERENCE] = sum(_reference_steps(key, cap) for key, cap in refs.items())
        units.update(dict.fromkeys(self.server_parts(), float(max(1, self.continuous_steps))))
        return units

    def engine_steps(self) -> float:
        """The engines' work in steps, their prefill at ``PREFILL_TOKENS_PER_STEP`` a step."""
        units = self.units()
        return sum(units[p] for p in ENGINE_PARTS) + units[PREFILL] / PREFILL_TOKENS_PER_STEP


@dataclass
class Pace:
    """This host's seconds per unit of each part of a run, learned from finished runs."""

    # per part: moving averages of its seconds and of its units, over the runs that had it
    _seconds: dict[str, float] = field(default_factory=dict)
    _units: dict[str, float] = field(default_factory=dict)
    run_s: float = RUN_S  # rendering and judging a run: the prior, then a moving average

    @property
    def known(self) -> bool:
        """True once a run taught a pace (before, only ``from_progress`` gives one)."""
        return bool(self._units)

    def s_per_unit(self, part: str | None = None) -> float | None:
        """Seconds per unit of ``part``; if that one was not seen (or ``part`` is None), the
        engines' seconds per step together (for ``PREFILL``: over ``PREFILL_TOKENS_PER_STEP``);
        None before any."""
        if part in self._units and self._units[part] > 0:
            return self._seconds[part] / self._units[part]
        engines = [p for p in ENGINE_PARTS if p in self._units] or list(self._units)
        units = sum(self._units[p] for p in engines)
        if units <= 0:
            return None
        s_per_step = sum(self._seconds[p] for p in engines) / units
        return s_per_step / PREFILL_TOKENS_PER_STEP if part == PREFILL else s_per_step

    def engines_s(self, work: Work) -> float:
        """Seconds of ``work``'s engine steps and prefill at this pace (0 before any)."""
        if not self.known:
            return 0.0
        units = work.units()
        return sum(units[part] * self.s_per_unit(part) for part in (*ENGINE_PARTS, PREFILL))

    def servers_s(self, work: Work) -> float:
        """Seconds of ``work``'s servers' stages at this pace, each at least its arrivals' wait
        (0 before any pace)."""
        if not self.known:
            return 0.0
        units = work.units()
        return sum(max(units[p] * self.s_per_unit(p), work.min_wall_s) for p in work.server_parts())

    def learn(self, work: Work, wall_s: float, parts_s: Mapping[str, float] | None) -> None:
        """A run of ``work`` took ``wall_s`` seconds, ``parts_s`` of them in each engine's steps,
        in their ``PREFILL`` and in each server's stage (None: unknown, one pace for all its
        units, the run's own seconds as they were, the prefill at ``PREFILL_TOKENS_PER_STEP`` a
        step)."""
        units = work.units()
        if parts_s is None:
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

    def cost_s(
        self,
        work: Work,
        references: Mapping[Hashable, int] | None = None,
        slowdown: float = 1.0,
    ) -> float | None:
        """Seconds ``work`` should take here (None: no pace yet); ``references``: those of its
        reference outputs still to compute (default: all); ``slowdown``: how much slower than
        this pace our engines go now (``RunQueue._slowdown``), applied to every part but the
        servers' stages, which keep their own learned pace (a ratio read on our engines'
        steps, applied to the longest stage, would move the wait most on the least evidence)."""
        if not self.known:
            return None
        reference_s = work.units(references)[REFERENCE] * self.s_per_unit(REFERENCE)
        engines_s = max(self.engines_s(work), work.min_wall_s)
        return slowdown * (engines_s + reference_s + self.run_s) + self.servers_s(work)

    def engine_s_left(self, work: Work, steps_done: int) -> float:
        """Seconds of ``work``'s engine steps not yet done after ``steps_done`` (and their share
        of its prefill), at this pace."""
        if work.steps <= 0:
            return 0.0
        return max(0, work.steps - steps_done) / work.steps * self.engines_s(work)

    @staticmethod
    def uniform(s_per_unit: float, run_s: float = RUN_S) -> Pace:
        """A pace of ``s_per_unit`` seconds per step for every part (the prefill at
        ``PREFILL_TOKENS_PER_STEP`` tokens a step), as if taught."""
        return Pace({"continuous": s_per_unit}, {"continuous": 1.0}, run_s)

    @staticmethod
    def from_progress(work: Work, elapsed_s: float, steps_done: int) -> Pace | None:
        """The pace of a run in progress: ``steps_done`` of ``work``'s engine steps (with their
        share of its prefill) in ``elapsed_s``; None before its first step."""
        if steps_done <= 0 or elapsed_s <= 0 or work.steps <= 0:
            return None
        done = work.engine_steps() * min(1.0, steps_done / work.steps)
        return Pace.uniform(elapsed_s / done)


def over_limit(cost_s: float | None, limit_s: float | None) -> str | None:
    """Why a run of ``cost_s`` seconds here is refused under a per-run limit of ``limit_s`` (None:
    no limit, ``CBP_RUN_TIME_LIMIT_S``), for a person: its estimate, the limit and what to change;
    None when it may run (its cost unknown, or not over ``LIMIT_MARGIN`` times the limit). Not at
    the limit itself: the machine's own speed moves, so a run estimated between the limit and
    twice it may well finish; if not, the limit stops it."""
    if cost_s is None or limit_s is None or cost_s <= LIMIT_MARGIN * limit_s:
        return None
    return (
        f"This run's estimate here is {_duration(cost_s)}, over {LIMIT_MARGIN:g} times this "
        f"host's limit of {_duration(limit_s)} a run: the limit would stop it long before its "
        "end. Make it smaller: fewer rows, smaller max_new_tokens caps, more slots, earlier "
        "arrivals, or fewer engines and checks (transformers' engine, the reference check)."
    )


def _duration(seconds: float) -> str:
    """``seconds`` for a person: "40 s", "12 min", "10.1 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _reference_steps(key: Hashable, cap: int) -> float:
    """Step units of computing one reference: set-up and judging, its prompt's prefill (the
    prompt ids are the key's first item) and its output tokens at batch 1."""
    prompt = key[0] if isinstance(key, tuple) and key else ()
    prompt_len = len(prompt) if isinstance(prompt, tuple | list) else 0
    return REFERENCE_STEPS + prompt_len / PREFILL_TOKENS_PER_STEP + cap * REFERENCE_TOKEN_STEPS


def _moved(old: float | None, new: float) -> float:
    """``old`` moved ``LEARNING_RATE`` of the way to ``new`` (``new`` itself if no ``old``)."""
    return new if old is None else old + LEARNING_RATE * (new - old)


# --- a run's work, counted from its requests ------------------------------------------------------


def _waves(requests: list[Request], config: EngineConfig) -> list[list[Request]]:
    """The static engine's waves: ``num_slots`` requests each, in order."""
    b = config.num_slots
    return [requests[i : i + b] for i in range(0, len(requests), b)]


def static_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated static steps: each wave runs to its longest cap."""
    return sum(max(r.max_new_tokens for r in wave) for wave in _waves(requests, config))


def static_prefill_tokens(requests: list[Request], config: EngineConfig) -> int:
    """The static waves' prompt positions: each wave's rows left-padded to its longest prompt."""
    waves = _waves(requests, config)
    return sum(len(w) * max(len(r.prompt_token_ids) for r in w) for w in waves)


def continuous_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated continuous steps: the caps packed onto the slots in arrival order, each request
    holding its slot for its cap's steps (plus its prefill chunks past the first under a token
    budget) and the next taking the first slot freed. ``max(sum / slots, longest)`` is only a
    lower bound: four caps 12, 20, 8, 30 on two slots take 50 steps, not 35."""
    budget = config.max_num_batched_tokens
    free_at = [0] * config.num_slots  # a heap: the step each slot is free from
    for r in sorted(requests, key=lambda r: r.arrival_s):
        chunks = math.ceil(len(r.prompt_token_ids) / budget) if budget else 1
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + r.max_new_tokens + max(0, chunks - 1))
    return max(free_at)


def run_work(requests: list[Request], config: EngineConfig, options, reference=None) -> Work:
    """A run's work in parts, for the queue's estimate; ``options``: the run's ``RunOptions``;
    ``reference``: the reference source, whose ``missing`` references are the reference pass's
    work (None: all of them)."""
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
