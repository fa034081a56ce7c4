"""The ``llamacpp`` and ``llamacpp_q4`` engines: a local ``llama-server``, driven as an endpoint.

Requests ask for ``verbose`` chunks, whose ``__verbose.tokens`` become ``token_ids``: re-tokenized
text is not always the tokens generated (two "\\n" come back as one "\\n\\n"). ``llamacpp_q4``'s
quantized weights make its differences expected. docs/servers.md.
"""

from __future__ import annotations

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
    """The GGUF that serves ``loaded`` with ``weights`` ("f32" or "q4_1"). Raises ValueError: no
    safetensors folder (F32), a model other than the embedded one (Q4_1), or what ``f32_gguf``
    raises."""
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
        """``requests``: the workload, whose longest request sizes each slot's context; ``cpus``:
        the CPUs it computes on (e.g. "1"; default every CPU). Raises ValueError: an unknown name,
        or no GGUF for this model (F32: converted on first use); MissingBuild: no server binary
        (looked for first), or no converter for the F32 file."""
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
        """Settings for this workload; a running server with other settings is stopped. True when
        they changed. Raises ValueError: fewer than one slot."""
        old = self.server.settings
        new = settings_for(old.model_path, old.weights, old.alias, num_slots, requests)
        new = replace(new, cpus=old.cpus)
        if new == old:
            return False
        self.server.stop()
        self.server.settings, self.num_slots = new, num_slots
        return True

    def server_info(self):
        info = super().server_info()
        info.settings.update(self.server.info(), **self.server.settings.describe())
        info.returns_token_ids = info.prompt_token_ids
        return info

    def _body(self, request: Request) -> dict:
        return super()._body(request) | {"verbose": True}

    def _take(self, chunk: dict, rec, pieces, ids, t0: float, label: str):
        """``OpenAIEngine._take`` with the chunk's token id (``__verbose.tokens``, EOS included)."""
        tokens = (chunk.get("__verbose") or {}).get("tokens")
        choices = chunk.get("choices") or []
        if tokens and choices and isinstance(choices[0], dict):
            choices[0]["token_ids"] = tokens
        return super()._take(chunk, rec, pieces, ids, t0, label)

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """``OpenAIEngine.run`` on the local server, started first if needed. Raises EndpointError:
        as ``OpenAIEngine.run``; a dead server's exit code and log included."""
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
