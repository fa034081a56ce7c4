"""vLLM's own record of its schedule (``vllm_scheduler``), read back as a ``Trace``.

``external_request_id``/``our_request_id`` name our requests inside vLLM's ids; ``ScheduleLog``
reads the file run by run, ``RecordFeed`` the record served over HTTP; ``schedule_trace`` replays
the lines into a ``Trace``. Format, ids and data-parallel ranks: docs/servers.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import httpx

from engine import settings as env_settings
from engine.trace import DECODE, PREFILL, RequestRecord, ScheduledSeq, StepRecord, Trace

REQUEST_ID_HEADER = "X-Request-Id"
SOURCE = "vLLM's own scheduler record (engine.peers.vllm_scheduler)"
RECORD_TOKEN_ENV = "CBP_VLLM_RECORD_TOKEN"  # the served record's bearer token, here as there
RECORD_KIND = "cbp-vllm-schedule"  # the served record's ``record`` field
MARK_SINCE = 1 << 62  # an index past any step: the answer has the next index and no steps
FETCH_TIMEOUT_S = 10.0


def external_request_id(run_tag: str, request_id: int) -> str:
    """The id a request is sent with (``X-Request-Id``), e.g. ``cbp-9f3a01bc-12``."""
    return f"cbp-{run_tag}-{request_id}"


def our_request_id(vllm_request_id: str, run_tag: str) -> int | None:
    """Our request id inside vLLM's (``cmpl-cbp-<tag>-<id>-0-<random>``); None for another run's."""
    match = re.search(rf"(?:^|-)cbp-{re.escape(run_tag)}-(\d+)(?=-|$)", vllm_request_id)
    return int(match.group(1)) if match else None


class ScheduleLog:
    """The JSON-lines file a recording vLLM appends to: ``mark()`` before a run, ``read(mark)``
    after it gives the start line, then the run's lines."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.start: dict | None = None  # the latest start line read
        self._offset = 0  # bytes read so far (complete lines only)

    def mark(self) -> int:
        self._read_from(self._offset)
        return self._offset

    def read(self, since: int) -> list[dict]:
        """Raises ValueError: a line that is not JSON (a line still being written is left out)."""
        before = self.start
        records = self._read_from(since)
        first_is_start = records and records[0].get("event") == "start"
        return records if first_is_start or before is None else [before, *records]

    def _read_from(self, since: int) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(since)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset = since + len(complete)
        records = parse_records(complete.decode("utf-8").splitlines())
        for record in records:
            if record.get("event") == "start":
                self.start = record
        return records


class RecordError(ValueError):
    """A record address that gives no usable record; the message says which case and what to do."""


class RecordFeed:
    """A served record, read as ``ScheduleLog`` reads the file. ``address``: ``http://HOST:PORT``
    (path default ``/record``); ``token``: None reads ``$CBP_VLLM_RECORD_TOKEN``."""

    def __init__(self, address: str, token: str | None = None, timeout_s: float = FETCH_TIMEOUT_S):
        url = address.strip().rstrip("/")
        url = url if "://" in url else f"http://{url}"
        self.url = url if httpx.URL(url).path not in ("", "/") else f"{url}/record"
        self.token = env_settings.value(RECORD_TOKEN_ENV) if token is None else token
        self.timeout_s = timeout_s
        self.start: dict | None = None  # the latest start line fetched

    def mark(self) -> int:
        return self.fetch(MARK_SINCE)["next"]

    def read(self, since: int) -> list[dict]:
        """Raises RecordError: as ``fetch``, or steps from ``since`` on left the ring."""
        page = self.fetch(since)
        if page["next"] < since:
            raise RecordError(
                f"The record at {self.url} restarted: it has {page['next']} steps, fewer than "
                f"the {since} it had at the run's start (vLLM restarted?). Run again."
            )
        if since < page["oldest"]:
            raise RecordError(
                f"The record at {self.url} no longer holds steps {since} to {page['oldest'] - 1} "
                f"(it keeps the latest {page['max_num_steps']}): start vLLM with a larger "
                "CBP_VLLM_RECORD_STEPS, or run fewer steps between reads."
            )
        return [r for r in [page["start"], *page["steps"]] if r is not None]

    def fetch(self, since: int) -> dict:
        """Raises RecordError: no answer, a token needed or refused, or no record in the answer."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.get(
                self.url, params={"since": since}, headers=headers, timeout=self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise RecordError(
                f"The record address {self.url} does not answer ({type(exc).__name__}: {exc}). "
                "Is vLLM running with CBP_VLLM_RECORD_ADDRESS=HOST:PORT set, and can this "
                "machine reach that port?"
            ) from exc
        if response.status_code == 401:
            given = "refuses the token given" if self.token else "needs a token"
            raise RecordError(
                f"The record at {self.url} {given}: set CBP_VLLM_RECORD_TOKEN here to the "
                "value the server was started with."
            )
        return self._page(response)

    def _page(self, response: httpx.Response) -> dict:
        try:
            page = response.json()
        except ValueError:
            page = None
        fields = {"start", "steps", "oldest", "next", "max_num_steps"}
        if not (
            response.status_code == 200
            and isinstance(page, dict)
            and page.get("record") == RECORD_KIND
            and fields <= set(page)
        ):
            raise RecordError(
                f"{self.url} answers (HTTP {response.status_code}) but without a record of "
                "vLLM's schedule: give the address vLLM serves its record at "
                "(CBP_VLLM_RECORD_ADDRESS, path /record), not its API's."
            )
        if page["start"] is not None:
            self.start = page["start"]
        return page


def parse_records(lines) -> list[dict]:
    """Records from JSON lines (blank ones skipped). Raises ValueError: a line is not JSON."""
    records = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n} of vLLM's schedule record is not JSON: {exc}") from exc
    return records


def schedule_trace(
    records: list[dict],
    requests: list[RequestRecord],
    run_tag: str,
    t0_unix_s: float,
    name: str = "vllm",
) -> Trace:
    """vLLM's steps on ``requests`` as a ``Trace``, times in seconds since ``t0_unix_s``; other
    runs' lines and steps without our requests are left out. A request arrives when the client sent
    it, if later than the workload's arrival. Raises ValueError: no ``start`` line before the first
    step."""
    replay = _VllmReplay(requests, run_tag, t0_unix_s)
    for record in records:
        if record.get("event") == "start":
            replay.start(record)
        elif record.get("event") == "step":
            replay.step(record)
    return replay.vllm_trace(name)


class ScheduleReplay:
    """A server's own record (vLLM's, transformers') followed into a ``Trace``: outputs from the
    client's records, times from the server's, lanes taken and freed as slots would be."""

    def __init__(self, requests: list[RequestRecord]):
        self.requests = {r.request_id: dataclasses.replace(r, token_times_s=[]) for r in requests}
        for rec in self.requests.values():
            rec.slot = rec.admit_s = rec.first_token_s = rec.finish_s = None
            rec.num_preemptions, rec.num_cached_tokens = 0, 0
        self.steps: list[StepRecord] = []
        self.lanes: dict[int, int] = {}  # request id -> lane, while the server runs it
        self.hits: dict[int, int] = {}  # request id -> prefix-cache hit at its latest admission

    def release(self, finished: list[int], preempted: list[int]) -> None:
        for rid in [*finished, *preempted]:
            self.lanes.pop(rid, None)
        for rid in preempted:
            self.requests[rid].num_preemptions += 1

    def take_lane(self, rid: int, first: int = 0, taken: set[int] | None = None) -> None:
        taken = set(self.lanes.values()) if taken is None else taken
        self.lanes[rid] = min(set(range(first, first + len(taken) + 1)) - taken)

    def admit(self, rid: int, computed: int, start_s: float) -> None:
        rec = self.requests[rid]
        self.hits[rid] = computed
        if rec.admit_s is None:
            rec.admit_s, rec.num_cached_tokens = start_s, computed

    def scheduled(
        self, rid: int, num_new: int, computed: int, num_prompt: int, num_tokens: int, end_s: float
    ) -> ScheduledSeq:
        """One request's share of a step: ``num_new`` tokens on ``computed`` cached ones."""
        rec = self.requests[rid]
        rec.slot = self.lanes[rid] if rec.slot is None else rec.slot
        if rec.first_token_s is None and computed + num_new >= num_prompt:
            rec.first_token_s = end_s
        rec.finish_s = end_s
        prefill = computed < max(num_prompt, num_tokens - 1)  # as Sequence.is_prefill
        return ScheduledSeq(
            request_id=rid,
            slot=self.lanes[rid],
            kind=PREFILL if prefill else DECODE,
            num_new_tokens=num_new,
            num_cached_tokens=computed,
            num_prefix_cached_tokens=self.hits.get(rid, 0),
        )

    def add_step(self, start_s, end_s, seqs, preempted, tables, prefix_caching: bool) -> None:
        step = StepRecord(len(self.steps), start_s, end_s, seqs, preempted=preempted)
        step.block_tables = {rid: list(table) for rid, table in tables.items()}
        step.kv_blocks_used = len({b for table in tables.values() for b in table})
        if prefix_caching:
            holders = step.block_holders()
            step.shared_blocks = {b: rids for b, rids in holders.items() if len(rids) > 1}
        self.steps.append(step)

    def trace(self, name: str, num_slots: int, info: dict, record_s: float) -> Trace:
        num_lanes = 1 + max((s.slot for step in self.steps for s in step.seqs), default=-1)
        step_s = sum(s.duration_s for s in self.steps)
        info = {**info, "record_s": record_s}
        info["record_cost_pct"] = 100 * record_s / step_s if step_s else None
        return Trace(
            engine=name,
            num_slots=max(num_slots, num_lanes),
            steps=self.steps,
            requests=[self.requests[rid] for rid in sorted(self.requests)],
            wall_s=max((s.end_s for s in self.steps), default=0.0),
            kv_mode="paged",
            info=info,
        )


class _VllmReplay(ScheduleReplay):
    """vLLM's lines: block tables grow step by step, and each data-parallel rank has its lanes."""

    def __init__(self, requests: list[RequestRecord], run_tag: str, t0_unix_s: float):
        sent = [
            dataclasses.replace(r, arrival_s=max(r.arrival_s, r.admit_s or 0.0)) for r in requests
        ]
        super().__init__(sent)
        self.run_tag, self.t0_unix_s = run_tag, t0_unix_s
        self.settings: dict | None = None
        self.tables: dict[int, list[int]] = {}  # request id -> its block ids, in order
        self.num_prompt: dict[int, int] = {}
        self.rank_of: dict[int, int] = {}  # request id -> the data-parallel rank that runs it
        self.ranks: set[int] = set()  # ranks seen, in start lines and steps
        self.record_s = 0.0
        self.num_foreign = 0  # scheduled entries of other runs or clients, skipped

    def start(self, record: dict) -> None:
        self.settings = record
        self.ranks.add(int(record.get("dp_rank", 0)))

    @property
    def lanes_per_rank(self) -> int:
        return int((self.settings or {}).get("max_num_seqs") or 1)

    def _ours(self, vllm_ids) -> list[int]:
        found = [our_request_id(v, self.run_tag) for v in vllm_ids]
        return [rid for rid in found if rid is not None and rid in self.requests]

    def step(self, record: dict) -> None:
        if self.settings is None:
            raise ValueError("vLLM's schedule record has a step before its start line.")
        finished, preempted = self._ours(record["finished"]), self._ours(record["preempted"])
        self.release(finished, preempted)
        for rid in [*finished, *preempted]:
            self.tables.pop(rid, None)
        start_s = record["start_unix_s"] - self.t0_unix_s
        end_s = record["end_unix_s"] - self.t0_unix_s
        rank = int(record.get("dp_rank", 0))
        self.ranks.add(rank)
        seqs = [
            s for e in record["scheduled"] if (s := self._seq(e, rank, start_s, end_s)) is not None
        ]
        if not seqs or not record["num_tokens"]:
            return
        self.record_s += record["record_s"]
        tables = {r: t for r, t in self.tables.items() if self.rank_of.get(r, 0) == rank}
        self.add_step(start_s, end_s, seqs, preempted, tables, self.settings["prefix_caching"])

    def _seq(self, entry: dict, rank: int, start_s: float, end_s: float) -> ScheduledSeq | None:
        rid = our_request_id(entry["req_id"], self.run_tag)
        if rid is None or rid not in self.requests:
            self.num_foreign += 1
            return None
        computed = entry["num_computed"]
        if "block_ids" in entry:  # new or resumed: the whole table, and an admission
            self.tables[rid] = list(entry["block_ids"])
            self.admit(rid, computed, start_s)
        else:
            self.tables.setdefault(rid, []).extend(entry["new_block_ids"])
        self.rank_of[rid] = rank
        if rid not in self.lanes:  # rank r's lanes start at r * max_num_seqs
            taken = {lane for r, lane in self.lanes.items() if self.rank_of.get(r, 0) == rank}
            self.take_lane(rid, rank * self.lanes_per_rank, taken)
        num_prompt = entry.get("num_prompt", self.requests[rid].num_prompt_tokens)
        num_prompt = self.num_prompt.setdefault(rid, num_prompt)
        num_tokens = num_prompt + entry.get("num_output", 0)
        return self.scheduled(rid, entry["num_tokens"], computed, num_prompt, num_tokens, end_s)

    def vllm_trace(self, name: str) -> Trace:
        settings = self.settings or {}
        dp_size = max(int(settings.get("dp_size", 1)), len(self.ranks))
        info = {
            "source": SOURCE,
            "vllm": settings.get("vllm"),
            "scheduler": settings.get("scheduler"),
            "token_budget": settings.get("max_num_batched_tokens"),
            "prefix_caching": settings.get("prefix_caching"),
            "chunked_prefill": settings.get("chunked_prefill"),
            "kv_blocks": settings.get("num_blocks"),
            "kv_reserved_blocks": 1,  # block 0, vLLM's null block, is never held
            "block_size": settings.get("block_size"),
            "dtype": settings.get("dtype"),  # None in a record older than the field
            "hold_limit_s": settings.get("hold_limit_s"),
            "num_foreign_seqs": self.num_foreign,
            "dp_size": dp_size,
            "lanes_per_rank": self.lanes_per_rank,
        }
        num_slots = settings.get("max_num_seqs", 0) * dp_size
        return self.trace(name, num_slots, info, self.record_s)
