"""The page against the bench: the same workload timed through the page's ``/run`` API and by
``python -m engine.bench``, interleaved, on one machine.

``python -m tools.page_gap [--slots 3] [--kv-mode slots|paged] [--repeat 3] [--json F]``

Starts ``app.py`` (``tools.app_server``), then ``repeat`` times runs the seed workload once
through ``gradio_client`` (no browser, so none shares the CPUs) and once in a bench process on the
same slots and KV mode, and prints each engine's wall times both ways and the page/bench ratio of
their medians. The page's times are those its status line shows, the engines' own clocks on the
server, as the bench's are; the reference check is off on both sides. Anything else running on
the machine, a second server included, shares its cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine import settings
from engine.workloads.workload import SEED_REQUESTS
from tools import app_server
from tools.room.session import STATUS_TIMES, run_knobs, status_line

BENCH_ENGINE = {"slots": "continuous", "paged": "continuous_paged"}  # page KV mode -> engine


def page_run(url: str, slots: int, kv_mode: str) -> dict[str, float]:
    """One Run through ``/run``: ``{"static": wall_s, "continuous": wall_s}`` from its status.

    Raises:
        RuntimeError: the status line has no times (the run was refused or failed; it is quoted).
    """
    from gradio_client import Client

    table = {"headers": ["prompt", "max_new_tokens"], "data": [list(r) for r in SEED_REQUESTS]}
    knobs = run_knobs(check_reference=False, kv_mode=kv_mode)
    result = Client(url, verbose=False, download_files=False).predict(
        table, slots, *knobs, api_name="/run"
    )
    status = status_line(result)
    found = STATUS_TIMES.search(status)
    if found is None:
        raise RuntimeError(f"the page's run gave no times: {status!r}")
    return {"static": float(found[1]), "continuous": float(found[2])}


def bench_run(slots: int, kv_mode: str) -> dict[str, float]:
    """One bench process on the seed: ``{"static": wall_s, "continuous": wall_s}``.

    Raises:
        subprocess.CalledProcessError: the bench failed.
    """
    engine = BENCH_ENGINE[kv_mode]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        command = [sys.executable, "-m", "engine.bench", "--workload", "seed"]
        command += ["--slots", str(slots), "--engines", f"static,{engine}", "--no-reference"]
        subprocess.run(
            [*command, "--json", str(out)],
            cwd=app_server.REPO_ROOT,
            env=settings.environment(app_server.OFFLINE),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        engines = json.loads(out.read_text())["engines"]
    return {"static": engines["static"]["wall_s"], "continuous": engines[engine]["wall_s"]}


def compare(page: list[dict], bench: list[dict]) -> dict:
    """Medians per engine both ways and their ratio (page / bench: over 1 means the page is
    slower)."""
    summary = {}
    for engine in ("static", "continuous"):
        page_s = statistics.median(run[engine] for run in page)
        bench_s = statistics.median(run[engine] for run in bench)
        summary[engine] = {"page_s": page_s, "bench_s": bench_s, "ratio": page_s / bench_s}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--kv-mode", choices=sorted(BENCH_ENGINE), default="slots")
    parser.add_argument("--repeat", type=int, default=3, help="page and bench runs, interleaved")
    parser.add_argument("--json", dest="json_path", help="write the runs and the summary here")
    args = parser.parse_args(argv)
    log_path = Path(tempfile.mkdtemp()) / "app.log"
    proc, url = app_server.start_app(log_path)
    page, bench = [], []
    try:
        for i in range(args.repeat):
            page.append(page_run(url, args.slots, args.kv_mode))
            bench.append(bench_run(args.slots, args.kv_mode))
            print(f"run {i + 1}: page {page[-1]}  bench {bench[-1]}", flush=True)
    finally:
        app_server.stop(proc)
    summary = compare(page, bench)
    for engine, row in summary.items():
        print(
            f"{engine:<11} page {row['page_s']:.2f} s  bench {row['bench_s']:.2f} s  "
            f"page/bench {row['ratio']:.3f}"
        )
    if args.json_path:
        doc = {"settings": vars(args), "page": page, "bench": bench, "summary": summary}
        Path(args.json_path).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
