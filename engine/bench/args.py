"""The bench's command line: flags, their scopes and defaults, and the workload they select.

Scoped flags (``SCOPED``) parse as None or False, so a given flag that nothing selected uses can
be named (``ignored_flags``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from engine.config import EngineConfig
from engine.host_servers import server_choice
from engine.knob_values import knob_value
from engine.knobs import KNOB, KNOBS, Knob
from engine.peers.endpoints import Endpoint, parse_endpoints, with_records
from engine.sampling_params import SamplingParams, with_defaults
from engine.worker.engines import KV_MODE_OF
from engine.workloads.workload import load_jsonl, poisson_arrivals, seed_specs

DESCRIPTION = (
    "Benchmark CLI: the same requests through each engine on one loaded model, side by side."
)
ENGINES = (
    "static",
    "static_generate",
    "continuous",
    "continuous_paged",
    "continuous_concat",
    "hf_continuous",
    "vllm",  # a local vLLM server from .venv-vllm (make vllm), started and stopped by the bench
    "llamacpp",  # a local llama-server (make llamacpp) on the loaded weights as an F32 GGUF
    "llamacpp_q4",  # the same server on the embedded model's shipped Q4_1 GGUF
)
SERVERS = ("vllm", "llamacpp", "llamacpp_q4")  # the engines that are local servers
# Engines that --batch-invariant cannot reach, and why (the bench says so rather than ignore it).
OWN_KERNELS = "runs its own kernels, outside this project's control"
NOT_INVARIANT = {
    "static_generate": "it runs plain model.generate matmuls by design",
    "hf_continuous": f"transformers' engine {OWN_KERNELS}",
    **dict.fromkeys(SERVERS, f"a server engine {OWN_KERNELS}"),
}
# The defaults of the scoped flags that have one, set after parsing.
SCOPED_DEFAULTS = {"rate": 1.0, "seed": 0} | {
    name: KNOB[name].default for name in ("policy", "block_size")
}
# Flags that only some engines or arrival modes use (``ignored_flags``).
SCOPED = (*SCOPED_DEFAULTS, "token_budget", "kv_budget_mib", "prefix_caching", "vllm_eager")
# The sampling flags' values where another one is given (any one makes a request sample).
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed_base": 0}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; scoped flags (``SCOPED_DEFAULTS``) get their defaults after parsing."""
    p = argparse.ArgumentParser(prog="python -m engine.bench", description=DESCRIPTION)
    p.add_argument("--workload", default="seed", help="'seed' or a JSONL file path (default seed)")
    p.add_argument(
        "--engines",
        default="static,continuous",
        help=f"comma list of {ENGINES} (default static,continuous)",
    )
    for knob in KNOBS:
        if knob.bench_flag:
            _add_knob_flag(p, knob)
    p.add_argument("--json", dest="json_path", help="write results to this JSON file")
    p.add_argument(
        "--model", default=None, help="model id, folder or .gguf file (default: embedded)"
    )
    p.add_argument("--device", default=None, help="auto, cpu, cuda or mps (default auto)")
    p.add_argument("--repeat", type=int, default=1, help="runs per engine, interleaved (default 1)")
    p.add_argument(
        "--arrival",
        choices=("file", "all", "poisson"),
        default="file",
        help="file: the JSONL's arrival_s (0 if absent); all: t=0; poisson: --rate (default file)",
    )
    p.add_argument("--rate", type=float, help="poisson: arrivals per second (default 1.0)")
    p.add_argument("--seed", type=int, help="poisson: the arrivals' random seed (default 0)")
    p.add_argument("--out", help="folder for requests.csv, traces.json, trace.perfetto.json")
    p.add_argument(
        "--floor", action="store_true", help="time generate on the longest request alone"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="continuous: forward vs host time split, and a decode step's time by op group",
    )
    _add_sampling_flags(p)
    server_choice.add_flags(p, local=False)
    p.epilog = (
        "A flag that no selected engine (or arrival mode) uses is ignored with a warning on "
        "stderr, e.g. --kv-budget-mib without continuous_paged, or --rate without "
        "--arrival poisson."
    )
    args = p.parse_args(argv)
    args.given = {name for name in SCOPED if getattr(args, name) not in (None, False)}
    for name, default in SCOPED_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def _add_knob_flag(p: argparse.ArgumentParser, knob: Knob) -> None:
    """The knob's flag: ``store_true`` for on/off (``--no-reference``), else a typed value."""
    if knob.kind == "flag":
        p.add_argument(knob.bench_flag, action="store_true", help=knob.bench_help)
    else:
        default = None if knob.name in SCOPED_DEFAULTS else knob.unset
        p.add_argument(knob.bench_flag, type=knob_type(knob), default=default, help=knob.bench_help)


def knob_type(knob: Knob):
    """The flag's parser: ``knob_values.knob_value``, the page's, so 0 and bad values read alike."""

    def parse(text: str):
        try:
            return knob_value(knob, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = knob.name  # argparse names a type by it
    return parse


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--top-k``, ``--top-p``, ``--seed-base``: defaults for requests."""
    sampled = "requests without their own settings sample"
    p.add_argument(
        "--temperature",
        type=float,
        help=f"{sampled} at this temperature (default 1 once any sampling flag is given; "
        "without any, they are greedy; 0: greedy)",
    )
    p.add_argument("--top-k", type=int, help=f"{sampled} from the top k tokens (default 0: all)")
    p.add_argument("--top-p", type=float, help=f"{sampled} with this top-p (default 1: all)")
    p.add_argument(
        "--seed-base", type=int, help=f"{sampled}; request i gets seed SEED_BASE + i (default 0)"
    )


def sampling_flags(args: argparse.Namespace) -> dict | None:
    given = {name: getattr(args, name) for name in SAMPLING_DEFAULTS}
    return given if any(value is not None for value in given.values()) else None


def sampling_defaults(args: argparse.Namespace) -> SamplingParams | None:
    """The sampling flags' settings, seeded by the seed base (None: no flag); ValueError naming a
    bad flag."""
    given = sampling_flags(args)
    if given is None:
        return None
    values = {name: SAMPLING_DEFAULTS[name] if v is None else v for name, v in given.items()}
    for name, value in values.items():
        try:
            SamplingParams(**{"seed" if name == "seed_base" else name: value})
        except ValueError as exc:
            raise ValueError(f"--{name.replace('_', '-')}: {exc}") from None
    return SamplingParams(
        values["temperature"], values["top_k"], values["top_p"], values["seed_base"]
    )


def ignored_flags(args: argparse.Namespace, names: list[str]) -> list[str]:
    """One line per given flag that no selected engine or arrival mode uses."""
    paged = "continuous_paged" in names
    continuous = any(name in KV_MODE_OF for name in names)
    poisson = args.arrival == "poisson"
    sharing = paged or "hf_continuous" in names
    scopes = {
        "prefix_caching": (sharing, "only continuous_paged and hf_continuous use it"),
        "kv_budget_mib": (paged, "only continuous_paged uses it"),
        "block_size": (paged, "only continuous_paged uses it"),
        "token_budget": (continuous, "only the continuous engines use it"),
        "policy": (continuous, "only the continuous engines use it"),
        "rate": (poisson, "only --arrival poisson uses it"),
        "seed": (poisson, "only --arrival poisson uses it"),
        "vllm_eager": ("vllm" in names, "only the vllm engine uses it"),
    }
    lines = [
        f"--{name.replace('_', '-')} is ignored: {why}."
        for name, (used, why) in scopes.items()
        if name in args.given and not used
    ]
    if args.batch_invariant:
        lines += [
            f"--batch-invariant does not apply to {name}: {why}."
            for name, why in NOT_INVARIANT.items()
            if name in names
        ]
    return lines


def check_args(args: argparse.Namespace, names: list[str]) -> None:
    """Refuse bad flags before the model loads. Raises ValueError."""
    endpoint_names = {e.name for e in endpoints(args)}  # raises on a bad --endpoint
    unknown = [n for n in names if n not in ENGINES and n not in endpoint_names]
    if unknown or not names:
        raise ValueError(
            f"Unknown engine {unknown[0] if unknown else ''!r}; choose from {', '.join(ENGINES)}."
        )
    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1.")
    EngineConfig(args.slots, **engine_options(args))
    sampling_defaults(args)
    if "vllm" in names:
        from engine.peers.vllm_server import vllm_python

        vllm_python()  # refuses before the model loads when .venv-vllm is missing
    if "llamacpp" in names or "llamacpp_q4" in names:
        from engine.llamacpp.server import server_binary

        server_binary()  # refuses before the model loads when llama-server is not built


def endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """The ``--endpoint`` flags with their ``--endpoint-record``; ValueError for a bad entry, a
    name taken, or a record for a name no ``--endpoint`` has."""
    found = parse_endpoints(args.endpoint, reserved=ENGINES)
    return with_records(found, args.endpoint_record)


def engine_options(args: argparse.Namespace) -> dict:
    """The continuous engines' ``EngineConfig`` options from the knobs' flags, less the slots and
    ``--prefix-caching`` (``make_engine``'s own argument)."""
    return {
        knob.config: getattr(args, knob.name)
        for knob in KNOBS
        if knob.bench_flag and knob.config and knob.name not in ("num_slots", "prefix_caching")
    }


def load_specs(args: argparse.Namespace):
    """The workload with arrivals and sampling settings; ValueError for a missing file
    (suggesting ``seed``), a bad line or a bad sampling flag."""
    if args.workload == "seed":
        specs = seed_specs()
    elif not Path(args.workload).exists():
        raise ValueError(f"No workload file {args.workload!r}; pass 'seed' or a JSONL file path.")
    else:
        specs = load_jsonl(args.workload)
    specs = apply_sampling_flags(specs, args)
    if args.arrival == "all":
        return [dataclasses.replace(s, arrival_s=0.0) for s in specs]
    if args.arrival == "poisson":
        return poisson_arrivals(specs, args.rate, args.seed)
    return specs


def apply_sampling_flags(specs, args: argparse.Namespace):
    """``specs``, each without settings of its own given the flags' (request i seeded
    ``--seed-base + i``); ValueError for a bad flag or a seed beyond 2^63 - 1."""
    defaults = sampling_defaults(args)
    if defaults is None:
        return specs
    out = []
    for i, spec in enumerate(specs):
        try:
            sampling = with_defaults(spec.sampling, defaults, defaults.seed, i)
        except ValueError as exc:
            raise ValueError(f"--seed-base: request {i}: {exc}") from None
        out.append(dataclasses.replace(spec, sampling=sampling))
    return out
