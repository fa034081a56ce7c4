"""Kernel micro-benchmark: ``F.linear`` against the engines' kernel, on the model's own weights.

    python -m engine.bench.kernel_bench [--rows 1,2,3,4,8,16,64] [--repeat 9] [--model embedded]

For each row count M, times one pass of every decoder-layer ``nn.Linear`` of the model (the
weights a decode step streams, ``lm_head`` left out) with M random input rows, as plain
``F.linear``, as ``engine.kernels.linear_kernel.skinny_linear`` and, where this torch has oneDNN, as
``engine.kernels.linear_kernel.onednn_linear`` on packed weights; prints the best of ``--repeat`` in
ms. This is the table in ``engine/kernels/linear_kernel.py``'s docstring.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from engine.kernels.linear_kernel import linear_modules, onednn_linear, onednn_pack, skinny_linear


def time_pass_ms(weights: list[torch.Tensor], num_rows: int, linear, repeat: int) -> float:
    """Best-of-``repeat`` ms for ``linear(x, W)`` over every ``W``, x of ``num_rows`` rows."""
    inputs = {w.shape[1]: torch.randn(num_rows, w.shape[1], dtype=w.dtype) for w in weights}
    best_s = float("inf")
    with torch.inference_mode():
        for _ in range(repeat):
            t0 = time.perf_counter()
            for w in weights:
                linear(inputs[w.shape[1]], w)
            best_s = min(best_s, time.perf_counter() - t0)
    return 1000 * best_s


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

    model = load_model(args.model, "cpu", "float32").model
    weights = [m.weight for m in linear_modules(model) if m is not model.get_output_embeddings()]
    megabytes = sum(w.numel() * w.element_size() for w in weights) / 1e6
    print(f"{len(weights)} linear weights, {megabytes:.0f} MB; best of {args.repeat}, ms")
    kernels = {"F.linear": (weights, F.linear), "skinny": (weights, skinny_linear)}
    try:
        kernels["onednn"] = ([onednn_pack(w) for w in weights], onednn_linear)
    except RuntimeError as exc:
        print(f"no onednn column: {exc}", file=sys.stderr)
    print(f"{'rows':>6}" + "".join(f"{name:>10}" for name in kernels))
    for num_rows in rows:
        times = [time_pass_ms(ws, num_rows, fn, args.repeat) for ws, fn in kernels.values()]
        print(f"{num_rows:>6}" + "".join(f"{ms:>10.2f}" for ms in times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
