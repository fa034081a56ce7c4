"""Attention-mask heatmaps: the packed step's block-diagonal mask and the static wave's padded one,
drawn through the engines' own mask functions (``engine.serving.masks``).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import torch

from engine.page.figures.style import (
    TEXT_COLOR,
    PageFigure,
    counted,
    discrete_colors,
    request_color,
    style_figure,
)
from engine.serving.masks import (
    PackedLayout,
    block_diagonal_causal_mask,
    packed_layout,
    padded_wave_mask,
)
from engine.trace import IDLE, PREFILL, StepRecord, Trace

PAD_COLOR = "#c8c8c8"  # static mask: cells of left-padding tokens
WINDOW_COLOR = "#dedede"  # packed mask: a key of the query's own request outside its window
IDLE_ROW_COLOR = "#6e6e6e"  # static mask: attention of a row whose request already finished
MAX_HEATMAP_CELLS = 512 * 4096
MAX_QUERY_CELLS, MAX_KEY_CELLS = 512, 4096  # tile sizes are chosen to fit this box
PREFIX_MARK = "*"  # after the label of a key column taken from the prefix cache: "R3 pos 12*"
GLOBAL_LAYERS = "global"  # the layer type without a window (``layer_types``)
SMALL_GRID_CELLS = 80  # heatmaps up to this many cells a side get a 1-px gap between cells


def _tile_factors(num_rows: int, num_cols: int) -> tuple[int, int]:
    if num_rows * num_cols <= MAX_HEATMAP_CELLS:
        return 1, 1
    return math.ceil(num_rows / MAX_QUERY_CELLS), math.ceil(num_cols / MAX_KEY_CELLS)


def _max_pool(codes: torch.Tensor, fq: int, fk: int) -> torch.Tensor:
    """Max over fq x fk tiles of an integer grid whose blank cells are -1.

    Shapes:
        codes: [T, T_kv] -> returns [ceil(T / fq), ceil(T_kv / fk)]
    """
    rows, cols = codes.shape
    padded = torch.full((math.ceil(rows / fq) * fq, math.ceil(cols / fk) * fk), -1)
    padded[:rows, :cols] = codes
    return padded.reshape(padded.shape[0] // fq, fq, padded.shape[1] // fk, fk).amax(dim=(1, 3))


def _tile_labels(n: int, factor: int) -> list[str]:
    return [f"{i}–{min(i + factor, n) - 1}" for i in range(0, n, factor)]


def _heatmap(
    codes: torch.Tensor, x: list, y: list, colors: list[str], hover: str, under: int = -1
) -> tuple[go.Figure, int, int]:
    """A figure of integer codes (-1 = blank), a colour per code, and its tile size ``(fq, fk)``."""
    fq, fk = _tile_factors(*codes.shape)
    if (fq, fk) != (1, 1):
        y, x = _tile_labels(codes.shape[0], fq), _tile_labels(codes.shape[1], fk)
        hover, low = "queries %{y} → keys %{x}", codes == under
        codes = _max_pool(torch.where(low, -1, codes), fq, fk)
        codes = torch.where((codes < 0) & (_max_pool(low.long(), fq, fk) > 0), under, codes)
    z = codes.to(torch.float32)
    z[codes < 0] = float("nan")
    gap = 1 if max(codes.shape) <= SMALL_GRID_CELLS else 0  # cell borders only where they show
    heatmap = go.Heatmap(
        z=z.numpy(),
        x=x,
        y=y,
        **discrete_colors(colors),
        hoverongaps=False,
        xgap=gap,
        ygap=gap,
        hovertemplate=hover + "<extra></extra>",
    )
    return PageFigure(heatmap), fq, fk


def _tiles_note(fq: int, fk: int) -> str:
    return f"<br>aggregated: each cell is a {fq}×{fk} tile of tokens" if fq * fk > 1 else ""


def mask_heatmap(trace: Trace, step_index: int, window: int | None = None) -> go.Figure:
    """The causal mask of one packed step coloured by request (rows: queries in packed order;
    columns: keys ``[all cached | all new]``); with a ``window``, the hidden keys light grey."""
    step = trace.steps[step_index]
    layout = packed_layout(
        [s.num_cached_tokens for s in step.seqs], [s.num_new_tokens for s in step.seqs]
    )
    codes, from_cache = _packed_codes(step, layout, window)  # (T, T_kv), (T_kv,)
    num_q, num_kv = codes.shape
    names = [f"R{s.request_id}" for s in step.seqs]
    y = _token_labels(names, layout.q_seq, layout.q_pos)
    x = _token_labels(names, layout.k_seq, layout.k_pos, from_cache)
    colors = [request_color(s.request_id) for s in step.seqs]
    colors += [paler(c) for c in colors]  # the same requests' keys from the prefix cache
    band = len(colors)  # the code of a key outside the window
    hover = "query %{y} → key %{x}"
    fig, fq, fk = _heatmap(codes, x, y, [*colors, WINDOW_COLOR], hover, under=band)
    if layout.num_cached_keys > 0:
        fig.add_vline(
            x=layout.num_cached_keys / fk - 0.5,
            name="cached | new",
            line_color=TEXT_COLOR,
            annotation_text="cached | new",
            annotation_position="top",
        )
    n_prefill = sum(s.kind == PREFILL for s in step.seqs)
    title = f"Packed step {step_index}: T={num_q}, T_kv={num_kv}"
    subtitle = (
        f"{counted(num_q, 'query', 'queries')} × {counted(num_kv, 'key')} · "
        f"{n_prefill} prefill + {len(step.seqs) - n_prefill} decode"
    ) + _tiles_note(fq, fk)
    if window is not None or trace.info.get("sliding_windows"):
        subtitle += "<br>" + _layers_note(window, int((codes == band).sum()))
    num_from_cache = int(from_cache.sum())
    if num_from_cache:
        subtitle += (
            f"<br>pale key columns (pos{PREFIX_MARK}): {counted(num_from_cache, 'key')} from the "
            "prefix cache"
        )
    starts = [sum(q.num_new_tokens for q in step.seqs[:i]) for i in range(len(step.seqs))]
    _mark_repeated_colours(
        fig, [(q.request_id, a // fq) for q, a in zip(step.seqs, starts, strict=True)]
    )
    return _mask_axes(style_figure(fig, title, subtitle), "keys: cached | this step's new tokens")


def _packed_codes(
    step: StepRecord, layout: PackedLayout, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell codes of a packed step (S sequences): the query's sequence index where it
    attends, + S where the key came from the prefix cache, 2S where a causal key is outside the
    ``window``, -1 elsewhere; and which keys came from the prefix cache.

    Shapes:
        returns: codes [T, T_kv], from_cache [T_kv] bool
    """
    num_seqs = len(step.seqs)
    causal = block_diagonal_causal_mask(layout)  # (T, T_kv)
    mask = block_diagonal_causal_mask(layout, window)  # (T, T_kv): causal within the window
    codes = torch.where(mask, layout.q_seq[:, None].expand_as(mask), -1)  # (T, T_kv)
    from_cache = prefix_cached_keys(step, layout)  # (T_kv,)
    codes = torch.where(mask & from_cache[None, :], codes + num_seqs, codes)
    return torch.where(causal & ~mask, 2 * num_seqs, codes), from_cache


def layer_types(trace: Trace) -> dict[str, int | None]:
    """The layer types by label with their windows: "global" (None), then "sliding (window W)"."""
    windows = trace.info.get("sliding_windows") or []
    return {GLOBAL_LAYERS: None} | {f"sliding (window {w})": w for w in windows}


def _layers_note(window: int | None, num_outside: int) -> str:
    if window is None:
        return "global layers: each query sees every earlier key of its request"
    return (
        f"sliding layers, window {window}: each query sees its request's last "
        f"{counted(window, 'key')}; light grey: {counted(num_outside, 'cell')} outside the window"
    )


def _token_labels(names: list[str], seq, pos, from_cache=None) -> list[str]:
    """Axis labels "R3 pos 12" per token; ``PREFIX_MARK`` after keys from the prefix cache."""
    cached = from_cache.tolist() if from_cache is not None else [False] * len(seq)
    return [
        f"{names[s]} pos {p}" + (PREFIX_MARK if c else "")
        for s, p, c in zip(seq.tolist(), pos.tolist(), cached, strict=True)
    ]


def prefix_cached_keys(step: StepRecord, layout: PackedLayout) -> torch.Tensor:
    """Key columns from the prefix cache, [T_kv] bool: each sequence's first cached tokens."""
    prefix = torch.tensor([s.num_prefix_cached_tokens for s in step.seqs], dtype=torch.long)
    assert all(s.num_prefix_cached_tokens <= s.num_cached_tokens for s in step.seqs), (
        "prefix-cached keys must be cached keys"
    )
    return layout.k_pos < prefix[layout.k_seq]  # (T_kv,)


def paler(hex_color: str, share: float = 0.55) -> str:
    """``hex_color`` mixed with ``share`` white ("#0072B2" -> "#8cc0dc")."""
    rgb = [int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * share):02x}" for c in rgb)


def _mark_repeated_colours(fig: go.Figure, bands: list[tuple[int, int]]) -> None:
    """Name each request whose colour another in the heatmap shares (``bands``: id, first row)."""
    colours = [request_color(rid) for rid, _ in bands]
    for (rid, row), colour in zip(bands, colours, strict=True):
        if colours.count(colour) > 1:
            fig.add_annotation(
                x=0,
                xref="x domain",
                xanchor="left",
                y=row,
                yref="y",
                yanchor="top",
                text=f"<b>R{rid}</b>",
                showarrow=False,
                name="repeated colour",
                font={"size": 10, "color": "#000000"},
                bgcolor="rgba(255,255,255,0.8)",
            )


def _mask_axes(fig: go.Figure, x_title: str) -> go.Figure:
    fig.update_xaxes(type="category", title_text=x_title, showgrid=False)
    fig.update_yaxes(type="category", title_text="queries", showgrid=False, autorange="reversed")
    fig.update_layout(height=460)
    return fig


def _wave_start(trace: Trace, step_index: int) -> int:
    """Position of the first step (the prefill) of the static wave holding ``step_index``."""
    wave, pos = trace.steps[step_index].wave, step_index
    while pos > 0 and trace.steps[pos - 1].wave == wave:
        pos -= 1
    return pos


def _static_codes(step: StepRecord, pads: list[int], num_q: int, num_k: int) -> torch.Tensor:
    """Per-cell codes of a padded wave step: row b, B = pad, B + 1 = idle row, -1 = blocked.

    Shapes:
        returns: [B * num_q, num_k]
    """
    num_rows = len(step.seqs)
    mask = padded_wave_mask(pads, num_q, num_k)  # (B, Q, K)
    k = torch.arange(num_k)[None, None, :]  # (1, 1, K)
    q = torch.arange(num_k - num_q, num_k)[None, :, None]  # (1, Q, 1)
    p = torch.tensor(pads)[:, None, None]  # (B, 1, 1)
    pad = ((k < p) | (q < p)) & (k <= q)  # (B, Q, K)
    idle = torch.tensor([s.kind == IDLE for s in step.seqs])[:, None, None]  # (B, 1, 1)
    codes = torch.where(mask, torch.arange(num_rows)[:, None, None], -1)  # (B, Q, K)
    codes = torch.where(pad, num_rows, codes)
    codes = torch.where(mask & idle, num_rows + 1, codes)
    return codes.reshape(num_rows * num_q, num_k)


def static_mask_heatmap(trace: Trace, step_index: int) -> go.Figure:
    """The padded mask of one static step as ``model.generate`` applies it, rows top-down."""
    step = trace.steps[step_index]
    first = _wave_start(trace, step_index)
    prefill = trace.steps[first].seqs
    pad_of = {s.slot: s.num_padding_tokens for s in prefill}
    width = max(s.num_new_tokens + s.num_padding_tokens for s in prefill)
    num_q = width if step_index == first else 1
    num_k = width + step_index - first
    pads = [pad_of.get(s.slot, 0) for s in step.seqs]
    codes = _static_codes(step, pads, num_q, num_k)
    y = [f"R{s.request_id} col {c}" for s in step.seqs for c in range(num_k - num_q, num_k)]
    colors = [request_color(s.request_id) for s in step.seqs] + [PAD_COLOR, IDLE_ROW_COLOR]
    fig, fq, fk = _heatmap(codes, list(range(num_k)), y, colors, "query %{y} → key col %{x}")
    for b in range(1, len(step.seqs)) if num_q > 1 and (fq, fk) == (1, 1) else ():
        fig.add_hline(y=b * num_q - 0.5, name="row", line_color=TEXT_COLOR, line_width=1)
    num_idle = sum(s.kind == IDLE for s in step.seqs)
    title = f"Static step {step_index}: wave {step.wave}, its step {step_index - first}"
    subtitle = (
        f"{counted(len(step.seqs), 'row')} × {counted(num_q, 'query', 'queries')} × "
        f"{counted(num_k, 'key')}<br>{counted(sum(pads), 'pad token')} (light grey)<br>"
        f"{counted(num_idle, 'idle row')} (dark grey: its request has ended)" + _tiles_note(fq, fk)
    )
    if (fq, fk) == (1, 1):
        _mark_repeated_colours(fig, [(s.request_id, b * num_q) for b, s in enumerate(step.seqs)])
    return _mask_axes(style_figure(fig, title, subtitle), "key column (left padding first)")
