"""The trace: what happened at every step of a run, the single source of every chart and metric.
Times are seconds since the run started (``perf_counter``); a server engine's trace has no steps,
client-clock times per request (sent = ``admit_s``) and the fields marked "server engines only"."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from engine.token_logits import LogitTrail

PREFILL = "prefill"
DECODE = "decode"
IDLE = "idle"  # static only: a row still computed after its request finished (padding waste)


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: ``num_cached_tokens`` real tokens in the KV cache before
    it, ``num_new_tokens`` fed in it, ``num_padding_tokens`` of left padding (static rows only), and
    ``num_prefix_cached_tokens``: the first cached keys, taken from the prefix cache at admission.
    """

    request_id: int
    slot: int
    kind: str  # PREFILL | DECODE | IDLE
    num_new_tokens: int
    num_cached_tokens: int
    num_padding_tokens: int = 0
    num_prefix_cached_tokens: int = 0


@dataclass
class StepRecord:
    """One forward pass. ``seqs`` is in packed order (continuous) or row order (static)."""

    index: int
    start_s: float
    end_s: float
    seqs: list[ScheduledSeq]
    wave: int | None = None  # static only: which wave this step belongs to
    forward_s: float | None = None  # continuous only: time inside the model's forward pass
    preempted: list[int] = field(default_factory=list)  # request ids preempted for this step
    kv_blocks_used: int | None = None  # paged KV only: blocks held during the step
    # paged KV only: request id -> block ids (-1: freed out of the sliding window)
    block_tables: dict[int, list[int]] | None = None
    # prefix caching only: blocks held by 2+ sequences -> their request ids (refcount = length)
    shared_blocks: dict[int, list[int]] | None = None
    # prefix caching only: free blocks that keep their prefix hash, next evicted first
    cached_free_blocks: list[int] | None = None
    # sliding window only: free blocks that fell out of a sequence's window, none taken since
    window_freed_blocks: list[int] | None = None
    # several KV cache groups only (``info["kv_groups"]``): each group's block tables, over one
    # pool; ``block_tables`` is group 0's (the global layers')
    group_block_tables: list[dict[int, list[int]]] | None = None

    def block_holders(self) -> dict[int, list[int]]:
        """Paged KV: every held block -> the request ids whose tables (of every KV cache group)
        list it (its refcount is the length); empty for other KV modes."""
        holders: dict[int, list[int]] = {}
        groups = self.group_block_tables or [self.block_tables or {}]
        for rid, table in ((rid, t) for tables in groups for rid, t in tables.items()):
            for block in table:
                if block >= 0:  # not freed out of the window
                    holders.setdefault(block, []).append(rid)
        return holders

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens fed in this step (what the token budget caps)."""
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def num_cached_tokens(self) -> int:
        """Context the step attended over: cached tokens of all its sequences."""
        return sum(s.num_cached_tokens for s in self.seqs)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class RequestRecord:
    """One request's life in a run; times are ``None`` until the event happens. ``comparable``:
    False when the engine sampled it from its own random stream (transformers' manager)."""

    request_id: int
    prompt: str
    max_new_tokens: int
    num_prompt_tokens: int
    arrival_s: float = 0.0
    slot: int | None = None
    admit_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    finish_reason: str | None = None
    num_preemptions: int = 0
    sampling: SamplingParams | None = None
    comparable: bool = True
    # prompt tokens taken from the prefix cache at (first) admission, not prefilled; None where
    # an engine shares blocks but does not say how many (transformers' manager)
    num_cached_tokens: int | None = 0
    # Server engines only: when each output token reached the client (one per streamed chunk
    # when the server sends text without token ids).
    token_times_s: list[float] = field(default_factory=list)
    # per output token, the run's own logits there (engine.token_logits); empty when not recorded
    # (transformers' and server engines). Not in the JSON: engine.fidelity.divergence turns it into
    # verdicts.
    token_logits: LogitTrail = field(default_factory=LogitTrail, repr=False, compare=False)

    @property
    def queue_s(self) -> float | None:
        """Time waiting for a slot, from arrival to admission."""
        return None if self.admit_s is None else self.admit_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float | None:
        """End-to-end latency, from arrival to the last token."""
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first one (None with fewer than 2 tokens)."""
        n = len(self.output_token_ids)
        if n < 2 or self.finish_s is None or self.first_token_s is None:
            return None
        return (self.finish_s - self.first_token_s) / (n - 1)


@dataclass
class RunMetrics:
    """Whole-run figures shown in the metrics table and written by the bench."""

    wall_s: float
    num_steps: int
    num_generated_tokens: int
    tok_per_s: float
    padding_waste_pct: float
    slot_utilisation_pct: float
    mean_step_ms: float
    mean_ttft_s: float
    mean_latency_s: float
    requests_per_s: float
    num_preemptions: int = 0
    num_cached_tokens: int | None = 0  # prompt tokens served by the prefix cache, all requests
    prefix_cache_hit_rate: float | None = 0.0  # those over all prompt tokens, 0 to 1


LATENCY_METRICS = ("queue_s", "ttft_s", "tpot_s", "latency_s")
PERCENTILES = (50, 95, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between ranks (numpy's default method)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class SlotRun:
    """Consecutive steps in which one slot worked on one request (or idled after it); a
    preemption or a step the token budget left it out of starts another run."""

    request_id: int
    slot: int
    idle: bool  # static only: the row was computed after its request finished
    first: int  # step positions, inclusive
    last: int

    def continues_with(self, s: ScheduledSeq) -> bool:
        """True if ``s``, in this run's slot at the next step, belongs to this run."""
        return (self.request_id, self.idle) == (s.request_id, s.kind == IDLE)


@dataclass
class ServerSample:
    """One reading of a server's ``/metrics`` (``engine.peers.server_metrics``); a metric the
    server lacks is absent from ``values``, never zero."""

    t_s: float  # seconds since the run started, on the client's clock
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class Trace:
    """Everything one engine run recorded."""

    engine: str
    num_slots: int
    steps: list[StepRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    kv_mode: str | None = None
    info: dict = field(default_factory=dict)  # engine-specific facts (e.g. KV bytes per token)
    server_samples: list[ServerSample] = field(default_factory=list)  # server engines only
    warnings: list[str] = field(default_factory=list)  # e.g. the server serves another model
    # server engines only: the server's own record of its steps, when it keeps one (vLLM with
    # engine.peers.vllm_scheduler): steps, lanes, block tables, on the same clock as this trace
    schedule: Trace | None = None

    def request(self, request_id: int) -> RequestRecord:
        return self.requests[request_id]

    def slot_runs(self) -> list[SlotRun]:
        """Every run of every slot; a slot missing from a step closes its run."""
        done: list[SlotRun] = []
        open_runs: dict[int, SlotRun] = {}  # slot -> its current run
        for pos, step in enumerate(self.steps):
            for s in step.seqs:
                run = open_runs.get(s.slot)
                if run is not None and run.continues_with(s):
                    run.last = pos
                    continue
                if run is not None:
                    done.append(run)
                open_runs[s.slot] = SlotRun(s.request_id, s.slot, s.kind == IDLE, pos, pos)
            busy = {s.slot for s in step.seqs}
            done.extend(open_runs.pop(slot) for slot in [k for k in open_runs if k not in busy])
        return done + list(open_runs.values())

    def metrics(self) -> RunMetrics:
        num_tokens = sum(len(r.output_token_ids) for r in self.requests)
        ttfts = [r.ttft_s for r in self.requests if r.ttft_s is not None]
        latencies = [r.latency_s for r in self.requests if r.latency_s is not None]
        return RunMetrics(
            wall_s=self.wall_s,
            num_steps=len(self.steps),
            num_generated_tokens=num_tokens,
            tok_per_s=num_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            padding_waste_pct=self.padding_waste_pct(),
            slot_utilisation_pct=self.slot_utilisation_pct(),
            mean_step_ms=1000 * self.wall_s / len(self.steps) if self.steps else 0.0,
            mean_ttft_s=statistics.fmean(ttfts) if ttfts else 0.0,
            mean_latency_s=statistics.fmean(latencies) if latencies else 0.0,
            requests_per_s=len(self.requests) / self.wall_s if self.wall_s > 0 else 0.0,
            num_preemptions=sum(len(step.preempted) for step in self.steps),
            num_cached_tokens=self.num_prefix_cached_tokens(),
            prefix_cache_hit_rate=self.prefix_cache_hit_rate(),
        )

    def num_prefix_cached_tokens(self) -> int | None:
        """Prompt tokens the prefix cache served, over all requests (None if not reported)."""
        counts = [r.num_cached_tokens for r in self.requests]
        return None if None in counts else sum(counts)

    def prefix_cache_hit_rate(self) -> float | None:
        """Prefix-cache hit rate: cached prompt tokens over all prompt tokens (0 to 1; vLLM's
        ``prefix_cache_hit_rate`` counts the same tokens). None if an engine does not report it."""
        cached = self.num_prefix_cached_tokens()
        prompt = sum(r.num_prompt_tokens for r in self.requests)
        if cached is None:
            return None
        return cached / prompt if prompt else 0.0

    def latency_percentiles(self) -> dict[str, dict[str, float | None]]:
        """p50/p95/p99 of queue time, TTFT, TPOT and end-to-end latency (s), over the requests
        that have a value (TPOT needs two tokens)."""
        result = {}
        for name in LATENCY_METRICS:
            values = [v for r in self.requests if (v := getattr(r, name)) is not None]
            result[name] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
        return result

    def padding_waste_pct(self) -> float:
        """% of computed token positions that were padding (fed at a wave's prefill) or finished
        (IDLE) rows."""
        computed = wasted = 0
        for step in self.steps:
            for s in step.seqs:
                fed_padding = s.num_padding_tokens if s.kind == PREFILL else 0
                computed += s.num_new_tokens + fed_padding
                wasted += fed_padding + (s.num_new_tokens if s.kind == IDLE else 0)
        return 100.0 * wasted / computed if computed else 0.0

    def prefill_split(self) -> tuple[int, float]:
        """The run's prefill as the run queue prices it: ``(tokens, seconds)``; ``(0, 0.0)``
        without.

        ``tokens``: prompt positions computed, static left padding included. ``seconds``: each
        prefill step's time beyond the median step without prefill (or the shortest step), as a
        step's fixed cost, reading every weight once, is its decodes' anyway.
        """
        steps = [(step.duration_s, _prefill_tokens(step)) for step in self.steps]
        prefills = [(s, n) for s, n in steps if n]
        if not prefills:
            return 0, 0.0
        decodes = [s for s, n in steps if not n] or [min(s for s, _ in steps)]
        step_s = statistics.median(decodes)
        return sum(n for _, n in prefills), sum(max(0.0, s - step_s) for s, _ in prefills)

    def slot_utilisation_pct(self) -> float:
        """Share of slot-steps that worked on a live request (idle rows and empty slots count 0)."""
        if not self.steps or self.num_slots == 0:
            return 0.0
        useful = sum(s.kind != IDLE for step in self.steps for s in step.seqs)
        return 100.0 * useful / (len(self.steps) * self.num_slots)


def new_request_records(requests) -> list[RequestRecord]:
    """One empty ``RequestRecord`` per ``engine.sequence.Request``, indexed by request id."""
    return [
        RequestRecord(
            request_id=r.request_id,
            prompt=r.prompt,
            max_new_tokens=r.max_new_tokens,
            num_prompt_tokens=r.num_prompt_tokens,
            arrival_s=r.arrival_s,
            sampling=r.sampling,
        )
        for r in requests
    ]


def _prefill_tokens(step: StepRecord) -> int:
    """The prompt positions ``step`` computed: its prefill tokens and their left padding."""
    return sum(s.num_new_tokens + s.num_padding_tokens for s in step.seqs if s.kind == PREFILL)
