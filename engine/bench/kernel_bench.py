"""Kernel micro-benchmark: ``F.linear`` against the engines' kernels, on the model's own weights.

    python -m engine.bench.kernel_bench [--rows 1,2,3,4,8,16,64] [--repeat 9] [--model embedded]

For each row count M, times one pass of every decoder-layer ``nn.Linear`` of the model (the
weights a decode step streams, ``lm_head`` left out) with M random input rows, as plain
``F.linear``, as ``engine.kernels.linear_kernel.skinny_linear`` and, where this torch has oneDNN, as
``engine.kernels.linear_kernel.onednn_linear`` on packed weights; prints the best of ``--repeat`` in
ms. The last column, ``chosen``, is the engines' kernel as the runner chose it for this host
(``engine.model.kernel_choice``: measured at the first start, or named by ``CBP_ENGINE_KERNEL``),
timed the same way through its row-count dispatch; the line under the table names it. This is the
table in ``engine/kernels/linear_kernel.py``'s docstring.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.kernels.cpu_share import OtherWork
from engine.kernels.kernel_timing import cpu_capabilities
from engine.kernels.linear_kernel import linear_modules, onednn_linear, onednn_pack, skinny_linear

Call = tuple[int, Callable[[torch.Tensor], torch.Tensor]]  # (input width K, x -> x @ W.T)


def time_pass_ms(calls: list[Call], num_rows: int, dtype: torch.dtype, repeat: int) -> float:
    """Best-of-``repeat`` ms for one pass over ``calls``, each on ``num_rows`` random rows."""
    inputs = {width: torch.randn(num_rows, width, dtype=dtype) for width, _ in calls}
    best_s = float("inf")
    with torch.inference_mode():
        for _ in range(repeat):
            t0 = time.perf_counter()
            for width, call in calls:
                call(inputs[width])
            best_s = min(best_s, time.perf_counter() - t0)
    return 1000 * best_s


def _columns(decoder, kernel) -> dict[str, list[Call]]:
    """Each column's calls: the candidates on the raw weights, then the runner's kernel."""
    weights = [m.weight for m in decoder]
    columns = {
        "F.linear": [(w.shape[1], lambda x, w=w: F.linear(x, w)) for w in weights],
        "skinny": [(w.shape[1], lambda x, w=w: skinny_linear(x, w)) for w in weights],
    }
    try:
        packed = [(w.shape[1], onednn_pack(w)) for w in weights]
        columns["onednn"] = [(k, lambda x, p=p: onednn_linear(x, p)) for k, p in packed]
    except RuntimeError as exc:
        print(f"no onednn column: {exc}", file=sys.stderr)
    columns["chosen"] = [(m.in_features, lambda x, m=m: kernel.forward(m, x)) for m in decoder]
    return columns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.kernel_bench", description=__doc__)
    p.add_argument("--rows", default="1,2,3,4,8,16,64", help="comma list of row counts M")
    p.add_argument("--repeat", type=int, default=9, help="passes per cell; the best is shown")
    p.add_argument("--model", default=None, help="model id or folder (default: embedded)")
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

    loaded = load_model(args.model, "cpu", "float32")
    model, runner = loaded.model, ModelRunner(loaded)
    decoder = [m for m in linear_modules(model) if m is not model.get_output_embeddings()]
    megabytes = sum(m.weight.numel() * m.weight.element_size() for m in decoder) / 1e6
    print(f"{len(decoder)} linear weights, {megabytes:.0f} MB; best of {args.repeat}, ms")
    columns = _columns(decoder, runner.engine_kernel)
    print(f"{'rows':>6}" + "".join(f"{name:>10}" for name in columns))
    kernels = list(columns.values())
    with OtherWork() as others:
        for num_rows in rows:
            times = [time_pass_ms(c, num_rows, torch.float32, args.repeat) for c in kernels]
            print(f"{num_rows:>6}" + "".join(f"{ms:>10.2f}" for ms in times))
    cpu = cpu_capabilities().get("cpu_name") or platform.processor() or platform.machine()
    chosen = runner.kernel_summary().removeprefix("matmul: ")
    print(f"chosen: {chosen}; on {cpu}, torch {torch.__version__}")
    if others.share is not None:  # a busy machine times the contention, not the kernels
        print(f"other work used {100 * others.share:.0f} % of the CPU while the table was timed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
