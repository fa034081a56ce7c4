"""The KV block map: which requests hold each block of the paged KV cache at one step::

    blocks 0..15 at step 40 (block size 16):
    R0×3 R0×3 R2 -- R0 R2 R5 R5 cc -- R5 -- -- -- -- --     (-- free, cc free but cached)

Shared blocks carry their reference count; blocks out of a window, reserved ones and KV cache
groups are drawn apart (docs/engines.md).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from engine.page.figures.style import (
    PALETTE,
    counted,
    discrete_colors,
    message_figure,
    request_color,
    request_ids,
    style_figure,
)
from engine.trace import StepRecord, Trace

FREE_BLOCK_COLOR = "rgba(128,128,128,0.25)"
CACHED_FREE_BLOCK_COLOR = "rgba(128,128,128,0.6)"  # free, but keeps its prefix hash (evictable)
RESERVED_BLOCK_COLOR = "rgba(40,40,40,0.9)"  # reserved by the server, never held nor free
WINDOW_FREED_BLOCK_COLOR = "rgba(0,150,136,0.35)"  # free: fell out of its sequence's window
BLOCK_MAP_COLUMNS = 16  # narrow enough for each block's "R12" label on a phone (390 px)


def block_map_figure(trace: Trace, step_index: int) -> go.Figure:
    """Which requests hold each KV block at one step, in rows of ``BLOCK_MAP_COLUMNS`` (a shared
    block: ``R0 ×3``); other KV modes get a figure saying why."""
    total = trace.info.get("kv_blocks")
    if not total or not trace.steps:
        return message_figure("KV block map", "The block map needs the paged KV mode.")
    step = trace.steps[min(step_index, len(trace.steps) - 1)]
    colors = [
        FREE_BLOCK_COLOR,
        *PALETTE,
        CACHED_FREE_BLOCK_COLOR,
        RESERVED_BLOCK_COLOR,
        WINDOW_FREED_BLOCK_COLOR,
    ]
    cols = min(BLOCK_MAP_COLUMNS, total)
    rows = math.ceil(total / cols)
    z = [[None] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    labels = [[""] * cols for _ in range(rows)]
    for block, (code, label, text) in enumerate(_block_cells(step, total, trace.info)):
        r, c = divmod(block, cols)
        z[r][c], labels[r][c], hover[r][c] = code, label, text
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=labels,
            texttemplate="%{text}",
            textfont={"size": 10},
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            **discrete_colors(colors),
            xgap=2,
            ygap=2,
        )
    )
    style_figure(
        fig, f"KV block map at step {step.index}", _block_map_subtitle(step, total, trace.info)
    )
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    # No tick labels: the blocks take the whole width (a phone's blocks then fit "R12"; labels
    # that still do not fit are hidden in the browser, assets/page.js).
    return fig.update_layout(height=150 + 30 * rows, margin={"l": 12, "r": 12})


def num_reserved_blocks(info: dict) -> int:
    """Block ids at the start of the map that its owner reserves, never held (0: none)."""
    return int(info.get("kv_reserved_blocks") or info.get("kv_trash_blocks") or 0)


def _block_map_subtitle(step: StepRecord, total: int, info: dict) -> str:
    reserved = num_reserved_blocks(info)
    aside = f" ({reserved} more reserved, black)" if reserved else ""
    text = (
        f"{step.kv_blocks_used}/{total - reserved} blocks in use{aside} · "
        f"{counted(info['block_size'], 'token')} per block · "
        f"preempted here: {request_ids(step.preempted) or 'none'}"
    )
    if info.get("prefix_caching"):
        shared = [h for h in step.block_holders().values() if len(h) > 1]
        cached = len(step.cached_free_blocks or [])
        text += f"<br>prefix cache: {counted(len(shared), 'shared block')}"
        if shared:
            first = shared[0]
            text += f" (R{first[0]} ×{len(first)}: held by {len(first)} requests; hover for which)"
        if step.cached_free_blocks is not None:  # vLLM's own record does not list them
            text += f" · {cached} free but cached (dark grey)"
    if info.get("kv_window"):
        freed = len(step.window_freed_blocks or [])
        text += (
            f"<br>window of {counted(info['kv_window'], 'token')}: "
            f"{counted(freed, 'block')} freed: out of window (teal)"
        )
    if info.get("kv_groups") and step.group_block_tables is not None:
        text += "<br>" + _groups_line(step, info["kv_groups"])
    return text


def _group_name(group: dict) -> str:
    """``global, layer 1`` or ``window 8, layers 0, 2``."""
    kind = "global" if group["window"] is None else f"window {group['window']}"
    layers = group["layers"]
    return f"{kind}, {'layer' if len(layers) == 1 else 'layers'} {', '.join(map(str, layers))}"


def _groups_line(step: StepRecord, groups: list[dict]) -> str:
    """Blocks each KV cache group holds, and those the sliding groups freed (teal)."""
    held = [
        len({b for table in tables.values() for b in table if b >= 0})
        for tables in step.group_block_tables
    ]
    parts = [f"{_group_name(g)}: {n}" for g, n in zip(groups, held, strict=True)]
    freed = len(step.window_freed_blocks or [])
    return (
        f"blocks held per KV cache group: {' · '.join(parts)} · "
        f"{counted(freed, 'block')} freed: out of a sliding window (teal)"
    )


def _block_places(step: StepRecord, info: dict) -> dict[int, tuple[int, str]]:
    """Held block -> (its position in its tables, its group's words: "" with one group)."""
    groups = info.get("kv_groups")
    if not groups or step.group_block_tables is None:
        tables = [step.block_tables or {}]
        names = [""]
    else:
        tables = step.group_block_tables
        names = [f", group {g} ({_group_name(group)})" for g, group in enumerate(groups)]
    return {
        block: (pos, name)
        for group_tables, name in zip(tables, names, strict=True)
        for table in group_tables.values()
        for pos, block in enumerate(table)
        if block >= 0
    }


def _block_cells(step: StepRecord, total: int, info: dict) -> list[tuple[int, str, str]]:
    """Per block: (colour code, label, hover); codes: free, held (1 + palette index), cached,
    reserved, out of window."""
    block_size = info["block_size"]
    holders = step.block_holders()
    places = _block_places(step, info)
    eviction_order = {block: n for n, block in enumerate(step.cached_free_blocks or [], start=1)}
    window_freed = set(step.window_freed_blocks or [])
    reserved = num_reserved_blocks(info)
    cells = []
    for block in range(total):
        rids = holders.get(block)
        if block < reserved and not rids:
            cells.append((2 + len(PALETTE), "", f"block {block}: reserved, never held"))
            continue
        if rids:
            (pos, group), rid = places[block], int(rids[0])
            first = pos * block_size
            code = 1 + PALETTE.index(request_color(rid))
            tokens = f"tokens {first}–{first + block_size - 1}{group}"
            if len(rids) == 1:
                cells.append((code, f"R{rid}", f"block {block}: R{rid}, {tokens}"))
                continue
            shared = f"shared by {request_ids(rids)} (refcount {len(rids)})"
            cells.append(
                (code, f"R{rid} ×{len(rids)}", f"block {block}: {shared}, {tokens} of each")
            )
        elif block in window_freed:
            kept = ", keeps a cached prefix" if block in eviction_order else ""
            text = f"block {block}: freed: out of window{kept}"
            cells.append((3 + len(PALETTE), "", text))
        elif block in eviction_order:
            order = f"{eviction_order[block]} of {len(eviction_order)} to be evicted"
            text = (
                f"block {block}: free, keeps a cached prefix ({order}, least recently used first)"
            )
            cells.append((1 + len(PALETTE), "", text))
        else:
            cells.append((0, "", f"block {block}: free"))
    return cells
