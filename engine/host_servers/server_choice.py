"""The servers a host chooses at start (``ServerChoice``: the server flags, declared here once
for the page and the bench) and the ``ServerSet`` built from that choice (``build``)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from engine.host_servers.server_set import BUILT_IN, LLAMACPP_NAMES, LOCAL_VLLM, ServerSet, Unbuilt
from engine.knobs import KNOB
from engine.peers.endpoints import (
    RECORDS_ENV,
    MissingBuild,
    ModelRefused,
    endpoints_from_env,
    parse_endpoints,
    records_from_env,
    with_records,
)
from engine.peers.openai_engine import OpenAIEngine
from engine.peers.vllm_engine import endpoint_engine
from engine.peers.vllm_server import MAX_MODEL_LEN


@dataclass(frozen=True)
class ServerChoice:
    """The host's servers, one field per server flag (``add_flags``), named as its ``dest``."""

    vllm: bool = False  # a local vLLM on the loaded model
    vllm_eager: bool = False  # that vLLM with --enforce-eager
    vllm_max_num_seqs: int = KNOB["num_slots"].default  # its --max-num-seqs; llama.cpp's slots
    vllm_max_model_len: int = MAX_MODEL_LEN  # its --max-model-len, tokens
    llamacpp: bool = False  # llama.cpp's engines on the loaded weights
    endpoint: tuple[str, ...] = ()  # NAME=URL items
    endpoint_record: tuple[str, ...] = ()  # NAME=RECORD_URL items

    @classmethod
    def from_args(cls, args: argparse.Namespace, **given) -> ServerChoice:
        """The flags ``args`` holds (a command line without some takes their defaults), then
        ``given``."""
        names = {f.name for f in fields(cls)}
        found = {k: v for k, v in vars(args).items() if k in names} | given
        for name in ("endpoint", "endpoint_record"):
            found[name] = tuple(found.get(name, ()))
        return cls(**found)


def add_flags(parser: argparse.ArgumentParser, local: bool = True) -> None:
    """The server flags: with ``local`` (the page's), ``--vllm`` and its settings and
    ``--llamacpp`` first; always ``--vllm-eager``, ``--endpoint`` and ``--endpoint-record``."""
    if local:
        _add_local_flags(parser)
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="run the local vLLM with --enforce-eager, no torch.compile: it starts much sooner, "
        "its steps are slower (default: vLLM's compiled mode)",
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="an OpenAI-compatible server run as engine NAME (repeatable; the page also reads "
        "CBP_ENDPOINTS=name=url,...), e.g. gpu=http://gpu-box:8000",
    )
    parser.add_argument(
        "--endpoint-record",
        action="append",
        default=[],
        metavar="NAME=RECORD_URL",
        help="where endpoint NAME's vLLM serves its record of its steps (CBP_VLLM_RECORD_ADDRESS "
        "there; repeatable), e.g. gpu=http://gpu-box:8100: its runs are drawn from the inside, "
        "and the bench's continuous engine runs with its settings",
    )


def _add_local_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="start vLLM (from .venv-vllm: make vllm) on the loaded model with the page",
    )
    parser.add_argument(
        "--vllm-max-num-seqs",
        type=int,
        default=ServerChoice.vllm_max_num_seqs,
        metavar="N",
        help="that vLLM's --max-num-seqs, fixed at start (default: the page's default slots)",
    )
    parser.add_argument(
        "--vllm-max-model-len",
        type=int,
        default=MAX_MODEL_LEN,
        metavar="TOKENS",
        help="that vLLM's --max-model-len: its longest request, prompt and output (default "
        f"{MAX_MODEL_LEN}); its KV cache is sized for it",
    )
    parser.add_argument(
        "--llamacpp",
        action="store_true",
        help="start llama.cpp's llama-server (make llamacpp) on the loaded weights with the page: "
        "engines llamacpp (F32) and llamacpp_q4 (the embedded model's Q4_1 file)",
    )


def build(
    loaded,
    choice: ServerChoice,
    log: Callable[[str], None] | None = None,
    cpus: tuple[int, ...] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServerSet:
    """The local vLLM, the llama.cpp engines, the ``--endpoint`` items, then ``CBP_ENDPOINTS``
    (from ``environ``); a missing build is ``Unbuilt``. ``cpus``: our engines' CPUs, on which the
    local servers compute, one thread each (None: every CPU).

    Raises:
        ValueError: a bad or repeated endpoint or record entry, a built-in engine's name, no
            GGUF for llama.cpp, a local vLLM's model with no folder or hub id.
    """
    log = log or (lambda _line: None)
    num_slots = choice.vllm_max_num_seqs
    engines: dict[str, OpenAIEngine | Unbuilt] = {}
    reserved = set(BUILT_IN)
    bind = None if cpus is None else ",".join(map(str, cpus))
    if choice.vllm:
        from engine.peers.vllm_engine import VllmEngine

        make = functools.partial(
            VllmEngine, loaded, num_slots, enforce_eager=choice.vllm_eager,
            max_model_len=choice.vllm_max_model_len, cpus=bind,
        )  # fmt: skip
        engines[LOCAL_VLLM] = _built(LOCAL_VLLM, make, log)
        reserved.add(LOCAL_VLLM)
    if choice.llamacpp:
        engines |= _llamacpp_engines(loaded, num_slots, log, bind)
        reserved |= set(LLAMACPP_NAMES)
    flagged = parse_endpoints(choice.endpoint, reserved)
    from_env = endpoints_from_env(environ, reserved)
    for endpoint in from_env:
        if endpoint.name in {e.name for e in flagged}:
            raise ValueError(
                f"CBP_ENDPOINTS entry {endpoint.name!r}: the name is already used by another "
                "endpoint (--endpoint); pick another name."
            )
    found = with_records([*flagged, *from_env], choice.endpoint_record)
    found = with_records(found, records_from_env(environ), f"{RECORDS_ENV} entry")
    for endpoint in found:
        engines[endpoint.name] = endpoint_engine(endpoint, loaded, num_slots)
    return ServerSet(engines, log)


def _built(name: str, make: Callable[[], OpenAIEngine], log) -> OpenAIEngine | Unbuilt:
    """``make()``, or ``Unbuilt`` when it raises ``MissingBuild`` or ``ModelRefused``."""
    try:
        return make()
    except (MissingBuild, ModelRefused) as exc:  # each says it without the host's path: public
        log(f"{name}: failed: {exc}")
        return Unbuilt(exc.public)


def _llamacpp_engines(loaded, num_slots: int, log: Callable[[str], None], cpus=None) -> dict:
    """``llamacpp`` (the loaded weights as an F32 GGUF) and, for the embedded model alone,
    ``llamacpp_q4`` (its shipped Q4_1 file)."""
    from engine.llamacpp.engines import LlamaCppEngine, gguf_for

    log("llamacpp: the F32 GGUF of the loaded weights (converted on first use, about 30 s)")
    f32 = functools.partial(LlamaCppEngine, loaded, num_slots, cpus=cpus)
    engines = {"llamacpp": _built("llamacpp", f32, log)}
    try:
        gguf_for(loaded, "q4_1")  # the embedded model's shipped file, or why there is none
    except ValueError as exc:
        log(f"llamacpp_q4: not offered: {exc}")
        return engines
    q4 = functools.partial(LlamaCppEngine, loaded, num_slots, name="llamacpp_q4", cpus=cpus)
    engines["llamacpp_q4"] = _built("llamacpp_q4", q4, log)
    return engines
