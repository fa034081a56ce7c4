"""The servers a host chooses at start (``ServerChoice``, from its command line's server flags,
declared once here for the page and the bench) and the ``ServerSet`` built from them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from engine.host_servers.server_set import BUILT_IN, LLAMACPP_NAMES, LOCAL_VLLM, ServerSet, Unbuilt
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


def configure(
    loaded,
    endpoint_items: Iterable[str] = (),
    environ=None,
    *,
    vllm: bool = False,
    vllm_eager: bool = False,
    vllm_max_num_seqs: int = 3,
    vllm_max_model_len: int = MAX_MODEL_LEN,
    log: Callable[[str], None] | None = None,
    record_items: Iterable[str] = (),
    llamacpp: bool = False,
    cpus: tuple[int, ...] | None = None,
) -> ServerSet:
    """The page's servers: the local vLLM if ``vllm``, the llama.cpp engines if ``llamacpp``,
    then ``--endpoint`` items, then ``CBP_ENDPOINTS``. The local vLLM runs ``--max-num-seqs
    vllm_max_num_seqs`` and ``--max-model-len vllm_max_model_len`` (both fixed at start).
    ``record_items``: ``--endpoint-record NAME=RECORD_URL`` entries, then
    ``CBP_ENDPOINT_RECORDS``'s, for endpoints of either kind. A local server whose build is
    missing (no ``.venv-vllm``: ``make vllm``; no ``llama-server``: ``make llamacpp``) is
    ``Unbuilt`` (``log`` hears the path looked at): no reason to stop the page. ``cpus``: the
    CPUs the local servers compute on, one thread each: our engines' (None: every CPU), so each
    engine of a run gets the same CPUs and threads.

    Raises:
        ValueError: a bad or repeated endpoint, a built-in engine's name, no GGUF for
            llama.cpp, a local vLLM's model with no folder or hub id, or a bad record entry (one
            for a name no endpoint has).
    """
    log = log or (lambda _line: None)
    engines: dict[str, OpenAIEngine | Unbuilt] = {}
    reserved = set(BUILT_IN)
    bind = None if cpus is None else ",".join(map(str, cpus))
    if vllm:
        from engine.peers.vllm_engine import VllmEngine

        make = functools.partial(
            VllmEngine, loaded, vllm_max_num_seqs, enforce_eager=vllm_eager,
            max_model_len=vllm_max_model_len, cpus=bind,
        )  # fmt: skip
        engines[LOCAL_VLLM] = _built(LOCAL_VLLM, make, log)
        reserved.add(LOCAL_VLLM)
    if llamacpp:
        engines |= _llamacpp_engines(loaded, vllm_max_num_seqs, log, bind)
        reserved |= set(LLAMACPP_NAMES)
    flagged = parse_endpoints(endpoint_items, reserved)
    from_env = endpoints_from_env(environ, reserved)
    for endpoint in from_env:
        if endpoint.name in {e.name for e in flagged}:
            raise ValueError(
                f"CBP_ENDPOINTS entry {endpoint.name!r}: the name is already used by another "
                "endpoint (--endpoint); pick another name."
            )
    found = with_records([*flagged, *from_env], record_items)
    found = with_records(found, records_from_env(environ), f"{RECORDS_ENV} entry")
    for endpoint in found:
        engines[endpoint.name] = endpoint_engine(endpoint, loaded, vllm_max_num_seqs)
    return ServerSet(engines, log)


def _built(name: str, make: Callable[[], OpenAIEngine], log) -> OpenAIEngine | Unbuilt:
    """``make()``, or ``Unbuilt`` when it raises ``MissingBuild`` (said in ``log``, with the
    path) or ``ModelRefused`` (the server cannot serve this model: the page starts anyway)."""
    try:
        return make()
    except (MissingBuild, ModelRefused) as exc:  # each says it without the host's path: public
        log(f"{name}: failed: {exc}")
        return Unbuilt(exc.public)


def _llamacpp_engines(loaded, num_slots: int, log: Callable[[str], None], cpus=None) -> dict:
    """``llamacpp`` (the loaded weights as an F32 GGUF, converted once: about 30 s) and, for
    the embedded model, ``llamacpp_q4`` (its shipped Q4_1 file); another model gets ``llamacpp``
    alone, said in ``log``. Without ``make llamacpp``'s build each is ``Unbuilt``.

    Raises:
        ValueError: the F32 file cannot be made (no local safetensors folder); a converter
            that fails on the model lists ``llamacpp`` as failed (``ModelRefused``).
    """
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
