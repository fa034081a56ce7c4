"""The ``llamacpp`` and ``llamacpp_q4`` engines: a local ``llama-server``, driven as an endpoint.

``LlamaCppEngine`` owns a ``LlamaServer`` (``engine.llamacpp.server``) and plays workloads at it
through ``OpenAIEngine``, the client every server engine shares, its prompts sent as our token
ids. llama.cpp streams text, and text re-tokenized is not always the tokens generated (two "\n"
tokens come back as the one token "\n\n"), so each request asks for ``verbose`` chunks, whose
``__verbose.tokens`` ``_take`` hands to the client as ``token_ids``, the field vLLM fills. The
server starts on the first run (or ``start()``) and stays up until ``close()``; a host that keeps
it for many workloads calls ``fit`` before each.

``llamacpp`` serves the loaded model's float32 weights as an F32 GGUF
(``engine.llamacpp.gguf_file``) and should match the reference up to near-ties; ``llamacpp_q4``
serves the embedded model's shipped Q4_1 file, so a token may differ where the weights' rounding
decides it: its trace says so (``info["differences_expected"]``) and the bench never counts that
as a failure. docs/servers.md tells the whole story.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.llamacpp.gguf_file import f32_gguf, q4_gguf
from engine.llamacpp.server import LlamaServer, server_binary, settings_for
from engine.model.loader import EMBEDDED_CACHE_NAME, cache_dir
from engine.peers.endpoints import Endpoint, EndpointError
from engine.peers.openai_engine import OpenAIEngine
from engine.sequence import Request
from engine.trace import Trace

WEIGHTS = {"llamacpp": "f32", "llamacpp_q4": "q4_1"}  # engine name -> the GGUF's weights
QUANTIZED_NOTE = "quantized weights: differences expected"


def gguf_for(loaded, weights: str) -> Path:
    """The GGUF file that serves ``loaded`` with ``weights`` ("f32" or "q4_1").

    Raises:
        ValueError: no local safetensors folder to convert (F32), a model other than the
            embedded one (Q4_1: only its shipped file exists), or what ``f32_gguf`` raises.
    """
    source = getattr(loaded, "source", None)
    folder = Path(source) if source else None
    if weights == "q4_1":
        if folder is None or folder.resolve() != (cache_dir() / EMBEDDED_CACHE_NAME).resolve():
            raise ValueError(
                "llamacpp_q4 serves the embedded model's shipped Q4_1 file; the loaded model "
                f"is {getattr(loaded, 'name', source)}."
            )
        return q4_gguf()
    if weights != "f32":
        raise ValueError(f"Unknown llama.cpp weights {weights!r}; choose f32 or q4_1.")
    if folder is None or not folder.is_dir():
        raise ValueError(
            f"llama.cpp's F32 GGUF is converted from a local safetensors folder; the loaded "
            f"model comes from {source!r}."
        )
    return f32_gguf(folder)


class LlamaCppEngine(OpenAIEngine):
    """llama-server with ``--parallel`` = ``num_slots`` on the loaded model's weights."""

    fits_runs = True  # ``fit``: sized to each run's slots and requests

    def __init__(
        self,
        loaded,
        num_slots: int,
        *,
        name: str = "llamacpp",
        requests: list[Request] | None = None,
        binary=None,
        cpus: str | None = None,
    ):
        """``name``: ``llamacpp`` (F32) or ``llamacpp_q4`` (the shipped Q4_1 file);
        ``requests``: the workload, whose longest request sizes each slot's context;
        ``binary``: the server to start (default: ``make llamacpp``'s); ``cpus``: the CPUs it
        computes on, one thread each (e.g. "1"; default every CPU).

        Raises:
            ValueError: an unknown name, or no GGUF for this model (``gguf_for``; the F32 file
                is converted here on first use, in about 30 s).
            MissingBuild: no server binary (looked for first), or no converter for the F32 file.
        """
        if name not in WEIGHTS:
            raise ValueError(f"Unknown llama.cpp engine {name!r}; choose {' or '.join(WEIGHTS)}.")
        self.weights = WEIGHTS[name]
        binary = server_binary(binary)  # before a conversion of half a minute
        path = gguf_for(loaded, self.weights)
        settings = settings_for(path, self.weights, Path(loaded.source).name, num_slots, requests)
        if cpus is not None:
            settings = replace(settings, cpus=cpus)
        self.server = LlamaServer(settings, binary)
        super().__init__(Endpoint(name, self.server.url), loaded, num_slots)

    def fit(self, requests: list[Request], num_slots: int) -> bool:
        """Settings for this workload: ``num_slots`` slots, each sized to the longest of
        ``requests``. A running server with other settings is stopped (``start`` or ``run`` starts
        it with these). Returns True when the settings changed.

        Raises:
            ValueError: fewer than one slot.
        """
        old = self.server.settings
        new = settings_for(old.model_path, old.weights, old.alias, num_slots, requests)
        new = replace(new, cpus=old.cpus)
        if new == old:
            return False
        self.server.stop()
        self.server.settings, self.num_slots = new, num_slots
        return True

    def start(self, on_progress: Callable[[str], None] | None = None) -> LlamaCppEngine:
        """Start the server unless it runs. Raises EndpointError (with its log's tail)."""
        if not self.server.running:
            self._info = None  # a restarted server is probed again
            self.server.start(on_progress)
        return self

    def server_info(self):
        """``OpenAIEngine.server_info`` with the server's build and settings; outputs as its
        token ids (``_take``) whenever prompts go as ours."""
        info = super().server_info()
        info.settings.update(self.server.info(), **self.server.settings.describe())
        info.returns_token_ids = info.prompt_token_ids
        return info

    def _body(self, request: Request) -> dict:
        """The request's body, asking for ``verbose`` chunks: each then names its token's id."""
        return super()._body(request) | {"verbose": True}

    def _take(self, chunk: dict, rec, pieces, ids, t0: float, label: str):
        """``OpenAIEngine._take`` with the chunk's token id (``__verbose.tokens``, the end of
        sequence's included) where that client reads ids (``token_ids``)."""
        tokens = (chunk.get("__verbose") or {}).get("tokens")
        choices = chunk.get("choices") or []
        if tokens and choices and isinstance(choices[0], dict):
            choices[0]["token_ids"] = tokens
        return super()._take(chunk, rec, pieces, ids, t0, label)

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """``OpenAIEngine.run`` on the local server, started first if it is not running; the
        trace's info says which weights ran (and, for Q4_1, that differences are expected).

        Raises:
            EndpointError: what ``OpenAIEngine.run`` raises; when the server died, the message
                says so, with its exit code and log (``exc.trace`` is the partial trace).
        """
        self.start()
        try:
            trace = super().run(requests, on_step, on_wait)
        except EndpointError as exc:
            if self.server.running:
                raise
            message = self.server.exit_message(f"during a run of {self.name}")
            raise EndpointError(message, exc.trace) from exc
        trace.info["weights"] = self.weights
        if self.weights != "f32":
            trace.info["differences_expected"] = QUANTIZED_NOTE
        if str(self.loaded.dtype) != "torch.float32" and self.weights == "f32":
            trace.warnings.append(
                f"{self.name} runs the float32 weights; ours run {self.loaded.dtype}."
            )
        return trace

    def close(self) -> None:
        """Stop the server."""
        self.server.stop()
