"""Several precisions of one model within the host's memory: the kernels' copies of the
precisions held go, largest first, when the next would not fit beside them, and come back on
their next run with the same outputs."""

from __future__ import annotations

import pytest
import torch
from tiny_model import make_requests, tiny_worker_model

from engine.config import EngineConfig
from engine.model import memory_account as account_module
from engine.model.memory_account import copies_to_release, host_memory_bytes, memory_account
from engine.worker import worker_model
from engine.worker.comparison import ComparisonJob, work_in_worker

SPECS = [("hello world", 5), ("abc", 7), ("the quick brown fox", 3)]
HAS_ONEDNN = torch.backends.mkldnn.is_available()


def test_nothing_is_released_while_everything_fits():
    """Held 3 + incoming 4 within a bound of 7: no precision loses its copies."""
    assert (
        copies_to_release({"float32": 2, "bfloat16": 1}, {"float32": 1, "bfloat16": 1}, 4, 7) == []
    )


def test_the_largest_copies_go_first_until_it_fits():
    """Held 10 (copies 4 and 2) + incoming 3 over a bound of 9: float32's 4 go, and that fits."""
    held, copies = {"float32": 6, "bfloat16": 4}, {"float32": 4, "bfloat16": 2}
    assert copies_to_release(held, copies, 3, 9) == ["float32"]
    assert copies_to_release(held, copies, 3, 8) == ["float32", "bfloat16"]
    assert copies_to_release(held, copies, 3, 1) == ["float32", "bfloat16"], "all, never fits"
    assert copies_to_release(held, {"float32": 0, "bfloat16": 0}, 3, 1) == [], "no copies"


def test_the_host_s_memory_is_read_on_linux():
    """The bound is a share of a real size: the cgroup's limit or MemTotal, under 64 TB."""
    size = host_memory_bytes()
    assert size is None or 2**26 < size < 2**46, size
    bound = account_module.memory_bound_bytes()
    assert bound is None or bound == int(account_module.MEMORY_SHARE * size)


def _run(model, dtype: str | None) -> dict[int, list[int]]:
    job = ComparisonJob(make_requests(SPECS), EngineConfig(num_slots=2), dtype=dtype)
    result = work_in_worker(model, job, lambda *args, **kwargs: None)
    return {r.request_id: list(r.output_token_ids) for r in result.continuous.requests}


@pytest.mark.skipif(not HAS_ONEDNN, reason="no packed copies without oneDNN")
def test_a_second_precision_over_the_bound_releases_the_first_s_copies(monkeypatch):
    """With a 1-byte bound, loading bfloat16 releases float32's copies; float32's next run makes
    them again (releasing bfloat16's) and gives the same tokens as before; with no bound
    (unknown host memory) nothing is released."""
    model = tiny_worker_model()
    before = _run(model, None)
    assert memory_account(model.runner)["packed_total_bytes"] > 0, "the tiny model has no copies"
    monkeypatch.setattr(worker_model, "memory_bound_bytes", lambda: 1)
    _run(model, "bfloat16")
    assert "engine_kernel" not in model.runner.__dict__, "float32's copies were kept"
    assert memory_account(model.runner)["packed_total_bytes"] == 0
    half = model.variants["bfloat16"].runner
    assert memory_account(half)["packed_total_bytes"] > 0, "bfloat16 ran without its copies"
    assert _run(model, None) == before, "float32's tokens changed after its copies came back"
    assert "engine_kernel" not in half.__dict__, "bfloat16's copies stayed over the bound"
    assert memory_account(model.runner)["packed_total_bytes"] > 0
    kept = tiny_worker_model()
    monkeypatch.setattr(worker_model, "memory_bound_bytes", lambda: None)
    _run(kept, "bfloat16")
    assert "engine_kernel" in kept.runner.__dict__, "copies released without a bound"
    assert kept.make_room("bfloat16", 10**15) == [], "released within a large bound"
