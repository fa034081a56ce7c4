"""The server's side of a run: its Prometheus ``/metrics``, read a few times a second.

``MetricsSampler`` turns each reading into a ``ServerSample`` under this project's names
(``METRIC_ALIASES``; llama.cpp's KV use from ``/slots``); ``note`` says why a value is missing and
``kv_pool`` what a KV % is of. The fields: docs/bench.md.
"""

from __future__ import annotations

import math
import re
import threading
import time

import httpx

from engine.trace import ServerSample, Trace

SAMPLE_PERIOD_S = 0.25
# this project's name -> (server's gauge, scale to this project's unit), first found wins
METRIC_ALIASES: dict[str, tuple[tuple[str, float], ...]] = {
    "num_requests_running": (
        ("vllm:num_requests_running", 1.0),
        ("sglang:num_running_reqs", 1.0),
        ("tgi_batch_current_size", 1.0),
        ("llamacpp:requests_processing", 1.0),
    ),
    "num_requests_waiting": (
        ("vllm:num_requests_waiting", 1.0),
        ("sglang:num_queue_reqs", 1.0),
        ("tgi_queue_size", 1.0),
        ("llamacpp:requests_deferred", 1.0),
    ),
    "kv_cache_usage_pct": (
        ("vllm:kv_cache_usage_perc", 100.0),  # a fraction despite its name ("1 means 100 percent")
        ("vllm:gpu_cache_usage_perc", 100.0),  # its name before vLLM 0.10
        ("sglang:token_usage", 100.0),
        ("llamacpp:kv_cache_usage_ratio", 100.0),
    ),
}


SLOTS_GAUGE = "llamacpp /slots"  # KV use from llama.cpp's slots (``slots_kv_pct``)
# what 100 % of each KV gauge is: the pool the share is of
KV_WHOLES = {
    "vllm:kv_cache_usage_perc": "every block of vLLM's KV block pool",
    "vllm:gpu_cache_usage_perc": "every block of vLLM's KV block pool",
    "sglang:token_usage": "every token of SGLang's KV token pool",
    "llamacpp:kv_cache_usage_ratio": "every cell of llama.cpp's KV cache (its context)",
    SLOTS_GAUGE: "every slot's context in llama.cpp's KV cache, from /slots",
}
POOL_INFO = "vllm:cache_config_info"  # an info gauge: the pool's size in its labels
LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {metric: value summed over label sets}; bad lines and NaN skipped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, labels_end = line, -1
        if "{" in line:
            name, labels_end = line[: line.index("{")], line.rfind("}")
        else:
            name = line.split()[0]
        rest = line[labels_end + 1 :] if labels_end >= 0 else line[len(name) :]
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        if not math.isnan(value):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def project_values(metrics: dict[str, float]) -> dict[str, float]:
    values = {}
    for ours, aliases in METRIC_ALIASES.items():
        for theirs, scale in aliases:
            if theirs in metrics:
                values[ours] = metrics[theirs] * scale
                break
    return values


def slots_kv_pct(slots: list[dict]) -> tuple[float, dict] | None:
    """KV use % from llama.cpp's ``/slots``: busy slots' tokens over the sum of every slot's
    ``n_ctx``, with the pool (``kv_pool``'s form); None without slots."""
    whole = sum(int(s.get("n_ctx") or 0) for s in slots)
    if not slots or whole <= 0:
        return None
    used = sum(
        int(s.get("n_prompt_tokens") or 0)
        + int((s.get("next_token") or [{}])[0].get("n_decoded") or 0)
        for s in slots
        if s.get("is_processing")
    )
    return 100.0 * used / whole, {
        "gauge": SLOTS_GAUGE,
        "whole": KV_WHOLES[SLOTS_GAUGE],
        "num_slots": len(slots),
        "slot_tokens": whole // len(slots),
    }


def kv_pool(text: str) -> dict:
    """What 100 % of the KV gauge is: ``{"gauge", "whole"}`` and, where published, ``"num_blocks"``,
    ``"block_size"`` (tokens); {} without a known KV gauge."""
    metrics = parse_prometheus(text)
    gauge = next((g for g, _ in METRIC_ALIASES["kv_cache_usage_pct"] if g in metrics), None)
    if gauge is None:
        return {}
    pool = {"gauge": gauge, "whole": KV_WHOLES[gauge]}
    for line in text.splitlines():
        if line.startswith(POOL_INFO + "{"):
            labels = dict(LABEL.findall(line))
            for ours, theirs in (("num_blocks", "num_gpu_blocks"), ("block_size", "block_size")):
                if labels.get(theirs, "").isdigit():
                    pool[ours] = int(labels[theirs])
            break
    return pool


class MetricsSampler:
    """Reads ``<base_url>/metrics`` every ``period_s`` in a thread into ``trace.server_samples``
    (times: ``perf_counter() - t0``); each sample makes a new list, so a mid-run copy never changes.
    """

    def __init__(self, base_url: str, t0: float, trace: Trace, period_s: float = SAMPLE_PERIOD_S):
        self.url = base_url.rstrip("/") + "/metrics"
        self.t0 = t0
        self.period_s = period_s
        self.trace = trace
        self.note: str | None = None  # why there are no samples, for a person
        self.kv_pool: dict = {}  # what its KV use % is of (``kv_pool``), from the first reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)

    def start(self) -> MetricsSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while not self._stop.is_set():
                if not self._sample(client):
                    return
                self._stop.wait(self.period_s)

    def _sample(self, client: httpx.Client) -> bool:
        """One reading; False when sampling should end (no usable /metrics)."""
        t_s = time.perf_counter() - self.t0
        try:
            response = client.get(self.url)
        except httpx.HTTPError as exc:
            self.note = f"/metrics did not answer ({type(exc).__name__}); sampling paused"
            return True  # a busy or dying server; the run itself reports what went wrong
        if response.status_code != 200:
            self.note = f"/metrics answered HTTP {response.status_code}: no server samples"
            return False
        metrics = parse_prometheus(response.text)
        values = project_values(metrics)
        if not values:
            self.note = "/metrics has none of the known gauges: no server samples"
            return False
        self.note = None
        self.kv_pool = self.kv_pool or kv_pool(response.text)
        if "kv_cache_usage_pct" not in values and any(m.startswith("llamacpp:") for m in metrics):
            self._slots_kv(client, values)
        sample = ServerSample(t_s, values)
        self.trace.server_samples = [*self.trace.server_samples, sample]
        return True

    def _slots_kv(self, client: httpx.Client, values: dict[str, float]) -> None:
        try:
            response = client.get(self.url.removesuffix("/metrics") + "/slots")
            found = slots_kv_pct(response.json()) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, TypeError, AttributeError, IndexError):
            return
        if found is not None:
            values["kv_cache_usage_pct"], pool = found
            self.kv_pool = self.kv_pool or pool
