"""``make gpu-check``: the precision checks that need a CUDA GPU, as bench runs written to JSON.

    python -m tools.gpu_check [--out out/gpu-check] [--model embedded] [--repeat 1]

Each run to ``<out>/<name>.json``, a summary to ``<out>/summary.json``; fails (exit 1) on broken
float32 parity, a run that cannot run or a non-bitwise invariant run; exit 2 without CUDA
(docs/precision.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LONG_TAIL = "assets/workloads/longtail.jsonl"
OURS = "static,continuous,continuous_paged,continuous_concat"


def runs(model: str, repeat: int) -> list[tuple[str, list[str]]]:
    base = ["--device", "cuda", "--model", model, "--repeat", str(repeat)]
    seed = ["--workload", "seed", "--slots", "3"]
    plan = [("parity_float32", [*base, *seed, "--dtype", "float32", "--engines", OURS])]
    for dtype in ("float16", "bfloat16"):
        for invariant in (False, True):
            flag = ["--batch-invariant"] if invariant else []
            name = f"divergence_{dtype}{'_invariant' if invariant else ''}"
            plan.append((name, [*base, *seed, "--dtype", dtype, "--engines", OURS, *flag]))
    plan.append(("bench_seed_float16", [*base, *seed, "--dtype", "float16"]))
    long_tail = ["--workload", LONG_TAIL, "--slots", "8", "--dtype", "float16"]
    plan.append(("bench_longtail_float16", [*base, *long_tail, "--engines", "static,continuous"]))
    return plan


def summarize(name: str, status: int, doc: dict | None) -> dict:
    keys = ("reference_match", "num_match", "num_near_tie", "num_differs", "num_logits_equal")
    keys += ("ms_per_step", "normal_ms_per_step", "invariant_cost_x")
    engines = (doc or {}).get("engines", {})
    return {
        "name": name,
        "exit_status": status,
        "dtype": (doc or {}).get("dtype"),
        "batch_invariant": (doc or {}).get("batch_invariant"),
        "engines": {e: {k: r.get(k) for k in keys} for e, r in engines.items()},
    }


def failures(summary: list[dict]) -> list[str]:
    """What makes the check fail: a run that could not run, float32 parity, invariance."""
    found = []
    for run in summary:
        if run["exit_status"] not in (0, 1):
            found.append(f"{run['name']}: exit status {run['exit_status']}")
        elif run["name"] == "parity_float32" and run["exit_status"] != 0:
            found.append("parity_float32: outputs differ from model.generate in float32")
        elif run["batch_invariant"]:
            for engine, r in run["engines"].items():
                if r["num_match"] != r["num_logits_equal"] or r["num_near_tie"] or r["num_differs"]:
                    found.append(f"{run['name']}: {engine} is not bitwise equal to its solo runs")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.gpu_check", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="out/gpu-check", help="folder for the JSON files")
    p.add_argument("--model", default="embedded", help="model id or folder (default embedded)")
    p.add_argument("--repeat", type=int, default=1, help="runs per engine (default 1)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a "
            "machine with one.",
            file=sys.stderr,
        )
        return 2
    from engine.bench import cli as bench

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for name, argv_run in runs(args.model, args.repeat):
        path = out / f"{name}.json"
        path.unlink(missing_ok=True)  # a run that fails early must not leave an old result
        print(f"gpu-check: {name}: python -m engine.bench {' '.join(argv_run)}", file=sys.stderr)
        status = bench.main([*argv_run, "--json", str(path)])
        doc = json.loads(path.read_text()) if path.exists() else None
        summary.append(summarize(name, status, doc))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    problems = failures(summary)
    for line in problems:
        print(f"gpu-check FAILED: {line}", file=sys.stderr)
    print(
        f"gpu-check: {len(summary)} runs, JSON in {out}; "
        f"{'all checks passed' if not problems else f'{len(problems)} failed'}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
