"""Where a continuous decode step's time goes, by torch op: matmuls, attention and the rest.

Self time per op under ``torch.profiler``, in three groups (``op_group``), says whether a step
over its weight-read floor is slow matmuls or per-op dispatch; the profiler adds a few µs per op,
so read the groups as shares.
"""

from __future__ import annotations

import time
from collections import defaultdict

from torch.profiler import ProfilerActivity, profile

from engine.config import EngineConfig
from engine.sequence import Request
from engine.worker.engines import make_engine

MATMUL_OPS = (
    "mkldnn::_linear_pointwise",
    "cbp_gemv::linear",  # this project's kernel (engine/kernels/csrc/gemv.cpp)
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
)
ATTENTION_MARK = "scaled_dot_product"  # aten::scaled_dot_product_attention and its kernels
ATTENTION_OPS = ("cbp_attention::",)  # this project's decode attention (csrc/decode_attention.cpp)
TOP_OTHER = 6  # the costliest other ops listed


def op_group(name: str) -> str:
    if name.startswith(MATMUL_OPS):
        return "matmul"
    if name.startswith(ATTENTION_OPS) or ATTENTION_MARK in name or "flash_attention" in name:
        return "attention"
    return "other"


def decode_op_profile(runner, num_slots: int, num_steps: int = 24, prompt_len: int = 100) -> dict:
    """Self ms per op group per decode step of ``num_slots`` sequences at about ``num_slots *
    prompt_len`` cached tokens (after one unprofiled warm-up run).

    Returns ``{"num_steps", "step_ms", "matmul_ms", "attention_ms", "other_ms", "other_ops",
    "top_other": [[op, ms per step], ...]}``.
    """
    vocab = runner.loaded.model.config.vocab_size
    prompt = tuple((1000 + i % 500) % vocab for i in range(prompt_len))
    requests = [Request(i, "profile", num_steps + 1, prompt) for i in range(num_slots)]
    config = EngineConfig(num_slots, ignore_eos=True)
    make_engine("continuous", runner, config).run(requests)  # warm-up
    prof = profile(activities=[ProfilerActivity.CPU])
    started_s = []

    def start_after_prefill(trace, step) -> None:
        if not started_s:
            prof.start()
            started_s.append(time.perf_counter())

    trace = make_engine("continuous", runner, config).run(requests, on_step=start_after_prefill)
    wall_s = time.perf_counter() - started_s[0]
    prof.stop()
    num_decode = len(trace.steps) - 1
    ms, counts, other = defaultdict(float), defaultdict(int), defaultdict(float)
    for event in prof.key_averages():
        group = op_group(event.key)
        ms[group] += event.self_cpu_time_total / 1000 / num_decode
        counts[group] += event.count
        if group == "other":
            other[event.key] += event.self_cpu_time_total / 1000 / num_decode
    top = sorted(other.items(), key=lambda kv: -kv[1])[:TOP_OTHER]
    return {
        "num_steps": num_decode,
        "step_ms": 1000 * wall_s / num_decode,
        **{f"{g}_ms": ms[g] for g in ("matmul", "attention", "other")},
        "other_ops": round(counts["other"] / num_decode),
        "top_other": [[name, round(v, 2)] for name, v in top],
    }


def profile_line(result: dict) -> str:
    total = result["matmul_ms"] + result["attention_ms"] + result["other_ms"]
    share = {g: 100 * result[f"{g}_ms"] / total for g in ("matmul", "attention", "other")}
    top = ", ".join(f"{name} {ms:.2f}" for name, ms in result["top_other"][:3])
    return (
        f"decode step under the profiler: {result['step_ms']:.1f} ms; self time per step: "
        f"matmuls {result['matmul_ms']:.1f} ms ({share['matmul']:.0f} %), attention "
        f"{result['attention_ms']:.1f} ms ({share['attention']:.0f} %), {result['other_ops']} "
        f"other ops {result['other_ms']:.1f} ms ({share['other']:.0f} %: {top})"
    )
