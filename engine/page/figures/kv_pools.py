"""What 100 % KV use is for each engine: the pool its share is of, in blocks and MiB where known
(each engine sizes its own pool, so a chart of several says what each whole is).
"""

from __future__ import annotations

from engine.page.figures.style import counted
from engine.trace import Trace

OUR_WHOLE = "every block of its paged KV pool"
UNKNOWN_WHOLE = "its whole KV cache, as its /metrics counts it"


def kv_pool_size(trace: Trace) -> str | None:
    """E.g. "28 blocks of 16 tokens, 0.4 MiB", "3 slots × 512 tokens (llama.cpp /props)", None."""
    blocks, block_size, kv_bytes = _pool(trace)
    if not (blocks or kv_bytes):
        return _slots_size(trace)
    parts = []
    if blocks:
        of_tokens = f" of {counted(block_size, 'token')}" if block_size else ""
        parts.append(f"{blocks:,} {'block' if blocks == 1 else 'blocks'}{of_tokens}")
    if kv_bytes:
        mib = kv_bytes / 2**20
        parts.append(f"{mib:,.1f} MiB" if mib >= 10 else f"{mib:.3g} MiB")  # 80.0, 3.94, 0.0123
    return ", ".join(parts) or None


def kv_pool_whole(trace: Trace) -> str:
    """E.g. "100 % = every block of its paged KV pool: 28 blocks of 16 tokens, 0.4 MiB"."""
    server = trace.info.get("server")
    if server is None:
        whole = OUR_WHOLE
    else:
        whole = (server.get("kv_pool") or {}).get("whole") or UNKNOWN_WHOLE
    size = kv_pool_size(trace)
    return f"100 % = {whole}" + (f": {size}" if size else " (its size is not published)")


def _pool(trace: Trace) -> tuple[int | None, int | None, int | None]:
    """(blocks, tokens per block, bytes) of the pool, each None where unknown."""
    server = trace.info.get("server")
    if server is None:
        blocks = trace.info.get("kv_blocks")
        return blocks, trace.info.get("block_size"), trace.info.get("kv_bytes") if blocks else None
    pool = server.get("kv_pool") or {}
    kv_bytes = (server.get("settings") or {}).get("kv_cache_bytes")
    return pool.get("num_blocks"), pool.get("block_size"), kv_bytes


def _slots_size(trace: Trace) -> str | None:
    """llama.cpp's pool as slots × context, from ``/props`` or ``/slots`` (None: neither said)."""
    server = trace.info.get("server") or {}
    props = (server.get("settings") or {}).get("props") or {}
    pool = server.get("kv_pool") or {}
    for slots, tokens, source in (
        (props.get("total_slots"), props.get("n_ctx"), "llama.cpp /props"),
        (pool.get("num_slots"), pool.get("slot_tokens"), "llama.cpp /slots"),
    ):
        if slots and tokens:
            return f"{counted(slots, 'slot')} × {counted(tokens, 'token')} ({source})"
    return None
