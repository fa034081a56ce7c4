"""Kernel micro-benchmark: ``F.linear`` against the engines' kernels, on the model's own weights.

Best-of-repeat ms for one pass over every decoder-layer linear, per row count, per candidate and
for ``chosen`` (the engines' kernel here); docs/bench.md says more.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from collections.abc import Callable

import torch

from engine.kernels.cpu_share import OtherWork
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import candidates_for, cpu_capabilities
from engine.kernels.linear_kernel import GemvLinear, bind, linear_modules

Call = tuple[int, Callable[[torch.Tensor], torch.Tensor]]  # (input width K, x -> x @ W.T)
HEADERS = {"linear": "F.linear"}  # a candidate's column header, where it is not its name
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NEAR_BEST = 1.05  # the target: the chosen kernel within 5 % of the fastest candidate


def time_columns_ms(
    columns: dict[str, list[Call]], num_rows: int, dtype: torch.dtype, repeat: int
) -> dict[str, float]:
    """Best-of-``repeat`` ms for one pass over each column's calls on ``num_rows`` random rows;
    columns take turns within each repeat, so a slow spell of the machine lands on all alike."""
    widths = {width for calls in columns.values() for width, _ in calls}
    inputs = {width: torch.randn(num_rows, width, dtype=dtype) for width in widths}
    best_s = dict.fromkeys(columns, float("inf"))
    with torch.inference_mode():
        for _ in range(repeat):
            for name, calls in columns.items():
                t0 = time.perf_counter()
                for width, call in calls:
                    call(inputs[width])
                best_s[name] = min(best_s[name], time.perf_counter() - t0)
    return {name: 1000 * s for name, s in best_s.items()}


def _columns(decoder, kernel, dtype: torch.dtype) -> dict[str, list[Call]]:
    """Each column's calls: the candidates the runner times for ``dtype`` on the raw weights,
    then the runner's kernel as installed for each module's forward."""
    columns = {}
    names = candidates_for(dtype)
    if dtype == torch.float32 and "onednn" not in names:
        print("no onednn column: this torch or CPU has no oneDNN", file=sys.stderr)
    for name in names:
        try:
            bound = [(m.in_features, bind(name, m.weight)) for m in decoder]
        except RuntimeError as exc:
            print(f"no {name} column: {exc}", file=sys.stderr)
            continue
        columns[HEADERS.get(name, name)] = bound
    calls = kernel.modules.planned if kernel.modules is not None else {}
    columns["chosen"] = [
        (m.in_features, calls.get(m) or functools.partial(kernel.forward, m)) for m in decoder
    ]
    return columns


def near_best_line(table: list[tuple[int, dict[str, float]]], plan: RowPlan) -> str:
    """At how many row counts ``plan``'s kernel is within ``NEAR_BEST`` of the fastest, read from
    the candidates' own columns (a kernel with no column from ``chosen``)."""
    ratios = []
    for num_rows, ms in table:
        name = plan.name_at(num_rows)
        picked_ms = ms.get(HEADERS.get(name, name), ms["chosen"])
        fastest_ms = min(v for k, v in ms.items() if k != "chosen")
        ratios.append((picked_ms / fastest_ms, num_rows, name))
    near = sum(ratio <= NEAR_BEST for ratio, _, _ in ratios)
    worst, at_rows, name = max(ratios)
    return (
        f"the plan's kernel is within {100 * (NEAR_BEST - 1):.0f} % of the fastest candidate at "
        f"{near} of {len(ratios)} row counts (furthest: {name} at {at_rows} rows, "
        f"{100 * (worst - 1):+.0f} %)"
    )


def chosen_cost_line(table: list[tuple[int, dict[str, float]]], plan: RowPlan) -> str:
    """What ``chosen`` costs over the raw column of the kernel ``plan`` runs, per row count
    (the dispatch, and the copies it reads: the raw columns bind copies of their own); a row
    count whose kernel has no column is left out."""
    parts = []
    for num_rows, ms in table:
        name = plan.name_at(num_rows)
        raw_ms = ms.get(HEADERS.get(name, name))
        if raw_ms:
            rows = "row" if num_rows == 1 else "rows"
            parts.append(
                f"{100 * (ms['chosen'] / raw_ms - 1):+.0f} % over {name} at {num_rows} {rows}"
            )
    if not parts:
        return "chosen costs: no raw column of the plan's kernels to compare with"
    return "chosen costs " + ", ".join(parts)


def dispatch_line(decoder, kernel, rows: list[int], dtype: torch.dtype, repeat: int) -> str:
    """What ``chosen`` costs over the gemv op called straight on the engines' own packed copies:
    the dispatch alone, at each row count the plan gives gemv. The raw columns above bind copies
    of their own, made later, which can read faster for that alone (docs/measurements.md)."""
    planned = kernel.modules.planned if kernel.modules is not None else {}
    parts = []
    for num_rows in rows:
        own = [planned[m].kernel_at(num_rows) if m in planned else None for m in decoder]
        if not all(isinstance(g, GemvLinear) for g in own):
            continue
        columns = {
            "own": [(m.in_features, _raw_gemv(g)) for m, g in zip(decoder, own, strict=True)],
            "chosen": [(m.in_features, planned[m]) for m in decoder],
        }
        ms = time_columns_ms(columns, num_rows, dtype, repeat)
        rows_word = "row" if num_rows == 1 else "rows"
        parts.append(f"{100 * (ms['chosen'] / ms['own'] - 1):+.0f} % at {num_rows} {rows_word}")
    if not parts:
        return "dispatch: the plan runs no gemv at these row counts"
    return "dispatch costs " + ", ".join(parts) + " over gemv on the engines' own copies"


def _raw_gemv(gemv: GemvLinear) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gemv op on ``gemv``'s packed copy, with nothing around it (no bias)."""
    op, packed, num_out = torch.ops.cbp_gemv.linear.default, gemv.packed, gemv.num_out
    return lambda x: op(x, packed, num_out, None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.kernel_bench", description=__doc__)
    p.add_argument("--rows", default="1,2,3,4,8,16,64", help="comma list of row counts M")
    p.add_argument("--repeat", type=int, default=9, help="passes per cell; the best is shown")
    p.add_argument("--model", default=None, help="model id or folder (default: embedded)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights' dtype")
    args = p.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        if args.repeat < 1 or min(rows) < 1:
            raise ValueError
    except ValueError:
        print("error: --rows takes whole numbers >= 1, --repeat >= 1", file=sys.stderr)
        return 2
    from engine.model.loader import load_model
    from engine.model.model_runner import ModelRunner

    loaded = load_model(args.model, "cpu", args.dtype)
    model, runner = loaded.model, ModelRunner(loaded)
    decoder = [m for m in linear_modules(model) if m is not model.get_output_embeddings()]
    megabytes = sum(m.weight.numel() * m.weight.element_size() for m in decoder) / 1e6
    dtype = loaded.dtype  # what the loader gave: the weights' dtype
    dtype_name = str(dtype).removeprefix("torch.")
    size = f"{len(decoder)} linear weights, {megabytes:.0f} MB in {dtype_name}"
    print(f"{size}; best of {args.repeat}, ms")
    columns = _columns(decoder, runner.engine_kernel, dtype)
    print(f"{'rows':>6}" + "".join(f"{name:>11}" for name in columns))
    table = []
    with OtherWork() as others:
        for num_rows in rows:
            times = time_columns_ms(columns, num_rows, dtype, args.repeat)
            print(f"{num_rows:>6}" + "".join(f"{ms:>11.2f}" for ms in times.values()))
            table.append((num_rows, times))
    cpu = cpu_capabilities().get("cpu_name") or platform.processor() or platform.machine()
    chosen = runner.kernel_summary().removeprefix("matmul: ")
    print(f"chosen: {chosen}; on {cpu}, torch {torch.__version__}")
    print(near_best_line(table, runner.engine_kernel.plan))
    print(chosen_cost_line(table, runner.engine_kernel.plan))
    print(dispatch_line(decoder, runner.engine_kernel, rows, dtype, args.repeat))
    if others.share is not None:  # a busy machine times the contention, not the kernels
        print(f"other work used {100 * others.share:.0f} % of the CPU while the table was timed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
