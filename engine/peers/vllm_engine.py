"""The ``vllm`` engine: a local vLLM server on the loaded model, driven as an endpoint.

``VllmEngine`` owns a ``VllmServer`` (``engine.peers.vllm_server``) and plays workloads at it
through ``OpenAIEngine``, so its trace is an endpoint's trace (per-request times, server samples)
with the server's version and settings in ``trace.info["server"]["settings"]``. The server starts on
the first run, or earlier with ``start()`` (a caller that wants to show its start-up passes
``on_progress``), and stays up until ``close()``, so repeats and warm-ups pay the start once.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.peers.openai_engine import OpenAIEngine
from engine.peers.openai_probe import ServerInfo
from engine.peers.vllm_server import MAX_MODEL_LEN, VllmServer, settings_for
from engine.sequence import Request
from engine.trace import Trace


class VllmEngine(OpenAIEngine):
    """vLLM with ``--max-num-seqs`` = ``num_slots``, the loaded model's folder and dtype."""

    def __init__(
        self,
        loaded,
        num_slots: int,
        *,
        enforce_eager: bool = False,
        name: str = "vllm",
        venv: str | None = None,
        max_model_len: int = MAX_MODEL_LEN,
    ):
        """``max_model_len``: the longest request (prompt and output tokens) the server takes;
        its KV cache is sized for that many tokens per slot.

        Raises ValueError: no ``.venv-vllm`` (``make vllm``) or nothing vLLM could load."""
        settings = settings_for(
            loaded, num_slots, enforce_eager=enforce_eager, max_model_len=max_model_len
        )
        self.server = VllmServer(settings, venv)
        super().__init__(self.server.endpoint(name), loaded, num_slots)

    def start(self, on_progress: Callable[[str], None] | None = None) -> VllmEngine:
        """Start the server unless it runs; ``on_progress(line)`` sees its log while it starts.

        Raises:
            EndpointError: the server exited or did not become healthy (with its log's tail).
        """
        if not self.server.running:
            self._info = None  # a restarted server is probed again
            self.server.start(on_progress)
        return self

    def server_info(self) -> ServerInfo:
        info = super().server_info()
        info.settings.update(self.server.info())
        return info

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """``OpenAIEngine.run`` on the local server, started first if it is not running."""
        self.start()
        return super().run(requests, on_step, on_wait)

    def close(self) -> None:
        """Stop the server (and its engine processes)."""
        self.server.stop()
