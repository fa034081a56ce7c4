"""A local ``llama-server`` on a GGUF file, started and stopped from here (``ServerProcess``).

``--parallel`` is the slot count and ``--ctx-size`` the whole KV cache, split evenly between the
slots, each sized to the longest request; ``--alias`` names the served model after the loaded one,
so the client sends token ids both ways.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import httpx

from engine import settings as env_settings
from engine.peers.endpoints import MissingBuild
from engine.peers.server_process import ServerProcess, cpus_of

LLAMACPP_DIR_ENV = "CBP_LLAMACPP_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]  # engine/llamacpp/server.py -> the repository
SERVER_BINARY = Path("build") / "bin" / "llama-server"
CTX_PER_SLOT = 2048  # tokens per slot when the requests are not known (vLLM's max_model_len)
BIND_FAILED = "couldn't bind HTTP server socket"  # llama-server's words for a port in use


def llamacpp_dir() -> Path:
    """``CBP_LLAMACPP_DIR``, else the repository's ``.llamacpp``."""
    return Path(env_settings.value(LLAMACPP_DIR_ENV) or REPO_ROOT / ".llamacpp").expanduser()


def server_binary(binary: str | os.PathLike | None = None) -> Path:
    """``binary``, else ``make llamacpp``'s. Raises MissingBuild, saying how to build it."""
    path = Path(binary) if binary is not None else llamacpp_dir() / SERVER_BINARY
    if not (path.is_file() and os.access(path, os.X_OK)):
        build = "build it with `make llamacpp` (cmake and a C++ compiler; minutes, once)."
        raise MissingBuild(
            f"llama.cpp's server {path} is missing; {build}", f"no llama-server here; {build}"
        )
    return path


@dataclass(frozen=True)
class LlamaSettings:
    model_path: str  # the GGUF file
    weights: str  # "f32" or "q4_1": what the file holds
    alias: str  # the served model's name (the loaded model's folder name)
    num_slots: int  # --parallel: = our slot count
    ctx_per_slot: int = CTX_PER_SLOT  # tokens one slot holds: its longest request
    cpus: str = f"0-{(os.cpu_count() or 1) - 1}"  # the CPUs it computes on, e.g. "0-1"
    # The precision its outputs are compared in: its activations and logits on a CPU are float32
    # whichever weights it multiplies (its KV cache is llama.cpp's default, F16).
    dtype: ClassVar[str] = "float32"

    def args(self, port: int) -> list[str]:
        threads = str(len(cpus_of(self.cpus)))
        args = ["--model", self.model_path, "--alias", self.alias]
        args += ["--host", "127.0.0.1", "--port", str(port), "--parallel", str(self.num_slots)]
        args += ["--ctx-size", str(self.num_slots * self.ctx_per_slot)]
        args += ["--threads", threads, "--threads-batch", threads, "--metrics", "--no-webui"]
        return args

    def describe(self) -> dict:
        return asdict(self)


def settings_for(
    model_path, weights: str, alias: str, num_slots: int, requests=None
) -> LlamaSettings:
    """``num_slots`` slots, each sized to the longest of ``requests`` (``CTX_PER_SLOT`` without).
    Raises ValueError: fewer than one slot."""
    if num_slots < 1:
        raise ValueError("llama.cpp needs at least 1 slot (--parallel).")
    lengths = [r.num_prompt_tokens + r.max_new_tokens for r in requests or []]
    ctx = max(lengths) if lengths else CTX_PER_SLOT
    return LlamaSettings(str(model_path), weights, alias, num_slots, ctx)


def published_props(props: dict) -> dict:
    """``{"total_slots", "n_ctx"}`` from ``/props``, each left out unless a positive count."""
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    found = {"total_slots": props.get("total_slots"), "n_ctx": n_ctx}
    return {k: v for k, v in found.items() if isinstance(v, int) and v > 0}


class LlamaServer(ServerProcess):
    NAME = "llama-server"
    LOG_PREFIX = "llama-server-"
    POLL_S = 0.2
    START_TIMEOUT_S = 300.0  # SmolLM2-135M loads in about a second; a busy machine takes longer
    STOP_TIMEOUT_S = 10.0
    TAIL_LINES = 20

    def __init__(self, settings: LlamaSettings, binary=None, port: int | None = None):
        """Raises MissingBuild: no such binary."""
        super().__init__(port)
        self.settings = settings
        self.binary = server_binary(binary)
        self.props: dict = {}  # {"total_slots", "n_ctx"} from /props (``published_props``)

    def info(self) -> dict:
        return {
            "version": self.version,
            "url": self.url,
            "start_s": self.start_s,
            "props": dict(self.props),
        }

    def command(self) -> list[str]:
        return [str(self.binary), *self.settings.args(self.port)]

    def cpus(self) -> set[int]:
        return cpus_of(self.settings.cpus)

    def _on_healthy(self, client: httpx.Client) -> None:
        props = client.get("/props").json() or {}
        self.version, self.props = props.get("build_info"), published_props(props)

    def exit_message(self, when: str) -> str:
        """Why the server is gone, for a person: the port in use, or its exit code and log."""
        log = self.log_tail()
        if BIND_FAILED in log:
            return (
                f"llama-server could not listen on 127.0.0.1:{self.port}: the port is in use "
                f"by another program; pick another port or stop that one.\n{log}"
            )
        return super().exit_message(when)
