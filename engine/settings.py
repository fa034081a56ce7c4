"""Settings: every environment variable the project reads, declared once and read here only.

``SETTINGS`` declares each ``CBP_*`` variable (docs/hosting.md's table is checked against it);
``number``, ``count`` and ``choice`` read one at each call, their messages from its declaration.
``BORROWED``: other tools' variables.
The vLLM recording scheduler reads its own variables inside vLLM; they are declared here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``default`` is what unset or blank means ("" when none)."""

    name: str
    kind: str
    default: str
    meaning: str


SETTINGS: tuple[Setting, ...] = (
    Setting("CBP_MAX_ROWS", "count", "256", "requests per run (read at every run)"),
    Setting("CBP_MAX_NEW_TOKENS", "count", "2048", "largest max_new_tokens cap (every run)"),
    Setting("CBP_MAX_PROMPT_CHARS", "count", "20000", "characters per prompt (every run)"),
    Setting(
        "CBP_REPLAY_WINDOW_S",
        "seconds",
        "600",
        "how old a finished run may be and still be shown at once for an identical setup "
        "(0: every Run runs live)",
    ),
    Setting(
        "CBP_SERVER_NICE",
        "0 to 19",
        "10",
        "nice steps the page's server threads run below the engines (0: no change; Linux)",
    ),
    Setting(
        "CBP_ENGINE_PROCESS",
        "auto, on, off",
        "auto",
        "where app.py runs the engines: an engine process of their own, or the page's thread "
        "(auto: on, except on ZeroGPU); read at start",
    ),
    Setting(
        "CBP_ENGINE_CPUS",
        "auto, all, N",
        "auto",
        "the CPUs the engine process keeps to while the page serves on the rest (Linux); "
        "read at start",
    ),
    Setting(
        "CBP_RUN_TIME_LIMIT_S",
        "seconds",
        "600",
        "seconds per run, all engines and the reference together (0: no limit; every run)",
    ),
    Setting(
        "CBP_MODEL_ALLOWLIST",
        "names",
        "embedded",
        "comma-separated model ids or folders app.py --model and the page's model picker may "
        "load (*: any); several: the page offers them in a picker, listed at start",
    ),
    Setting(
        "CBP_ENGINE_KERNEL",
        "auto, measure, linear, skinny, onednn, onednn_f32, gemv",
        "auto",
        "the engines' CPU matmul kernel, or the fastest per row count timed on this host; "
        "read at start",
    ),
    Setting(
        "CBP_WEIGHT_COPIES_MAX",
        "number >= 0",
        "1.5",
        "the most bytes the engines' packed weight copies may take, as a multiple of the "
        "weights' bytes; past it the copies that save least time per byte are dropped; read "
        "at start",
    ),
    Setting(
        "CBP_FUSED_LAYERS",
        "auto, off",
        "auto",
        "the continuous engines' fused decoder layers on CPU, or transformers' own (off); "
        "read at start",
    ),
    Setting(
        "CBP_GEMV",
        "auto, off",
        "auto",
        "this project's C++ matmul for a few rows (engine/kernels/csrc/gemv.cpp): built at the "
        "first start and timed against the other kernels where a C++ compiler and AVX-512 are "
        "found (auto), or never (off); read at start",
    ),
    Setting(
        "CBP_COMPILED_STEP",
        "off",
        "off",
        "retired: the compiled step is gone and every step runs eager; any other value is "
        "ignored with a warning in the log, so an old host setting still starts",
    ),
    Setting(
        "CBP_CACHE_DIR",
        "path",
        "~/.cache/cb-playground",
        "the converted model, the stored references and the kernel choices",
    ),
    Setting(
        "CBP_REFERENCE_CACHE",
        "on, off",
        "on",
        "off: every run computes its model.generate references afresh",
    ),
    Setting(
        "CBP_ENDPOINTS",
        "name=url,...",
        "",
        "OpenAI-compatible servers offered beside the engines; read at start",
    ),
    Setting(
        "CBP_ENDPOINT_RECORDS",
        "name=url,...",
        "",
        "where those endpoints' vLLMs serve their records of their steps, as app.py "
        "--endpoint-record; read at start",
    ),
    Setting(
        "CBP_VLLM_VENV",
        "path",
        "",
        "vLLM's virtual environment (unset: the repository's .venv-vllm)",
    ),
    Setting(
        "CBP_LLAMACPP_DIR",
        "path",
        "",
        "llama.cpp's build folder: its llama-server, source and converter (unset: the "
        "repository's .llamacpp)",
    ),
    Setting(
        "CBP_VLLM_SCHEDULE_PATH",
        "path",
        "",
        "where the local vLLM records its schedule (unset: a temporary file)",
    ),
    Setting(
        "CBP_VLLM_RECORD_ADDRESS",
        "HOST:PORT",
        "",
        "where a recording vLLM serves its schedule over HTTP (GET /record; unset: not served)",
    ),
    Setting(
        "CBP_VLLM_RECORD_TOKEN",
        "text",
        "",
        "bearer token the served record requires, and that its reader here sends (unset: none)",
    ),
    Setting(
        "CBP_VLLM_RECORD_STEPS",
        "count",
        "4096",
        "how many of its latest steps a recording vLLM keeps to serve",
    ),
    Setting(
        "OMP_WAIT_POLICY",
        "OpenMP",
        "ACTIVE",
        "OpenMP's wait policy, set by app.py before torch loads unless already set",
    ),
    Setting(
        "GOMP_SPINCOUNT",
        "OpenMP",
        "300000",
        "libgomp's spin count, set by app.py before torch loads unless already set",
    ),
)

# Other tools' variables that the engine reads too; their meaning is theirs.
BORROWED = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_ENDPOINT",
    "PYTHONPATH",
    "CXX",  # the C++ compiler the kernels' build calls (engine.kernels.gemv_build)
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


def setting(name: str) -> Setting:
    """Raises KeyError: a variable ``SETTINGS`` does not declare."""
    if name not in _BY_NAME:
        raise KeyError(f"{name} is not declared in engine.settings.SETTINGS")
    return _BY_NAME[name]


def default(name: str) -> str:
    return setting(name).default


def value(name: str, environ: Mapping[str, str] | None = None) -> str:
    """``name``'s text, stripped, or its default when unset
    or blank. Raises KeyError: undeclared."""
    declared = setting(name)
    text = (os.environ if environ is None else environ).get(name) or ""
    return text.strip() or declared.default


def number(name: str, environ: Mapping[str, str] | None = None, finite: bool = True) -> float:
    """``name`` as a number >= 0, finite unless ``finite`` is False (seconds, where its kind says
    so). Raises ValueError naming it and its meaning."""
    declared = setting(name)
    text = value(name, environ)
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not (0 <= number < float("inf") or (number == float("inf") and not finite)):  # NaN too
        unit = "a number of seconds" if declared.kind == "seconds" else "a number"
        raise ValueError(
            f"The environment variable {name}={text!r} must be {unit} >= 0 ({declared.meaning})."
        )
    return number


def count(
    name: str, low: int = 1, high: int | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """``name`` as a whole number from ``low`` to ``high`` (None: no top). Raises ValueError
    naming it and its meaning."""
    text = value(name, environ)
    if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        span = f"a whole number from {low} to {high}" if high is not None else f">= {low}"
        if (low, high) == (1, None):
            span = "a positive integer"
        raise ValueError(
            f"The environment variable {name}={text!r} must be {span} ({setting(name).meaning})."
        )
    return int(text)


def choice(
    name: str, explained: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """``name`` lower-cased, one of the choices its declared kind lists (``explained``: what each
    means, for the message). Raises ValueError naming the variable and every choice."""
    choices = setting(name).kind.split(", ")
    assert explained is None or list(explained) == choices, f"{name}: {choices} != {explained}"
    text = value(name, environ).lower()
    if text not in choices:
        if explained:
            spelled = " or ".join(f"{key!r} ({what})" for key, what in explained.items())
            raise ValueError(f"{name}={text!r}: use {spelled}")
        raise ValueError(f"{name}={text!r}: give {', '.join(choices[:-1])} or {choices[-1]}")
    return text


def borrowed(name: str) -> str:
    assert name in BORROWED, f"{name} is not declared in engine.settings.BORROWED"
    return os.environ.get(name, "")


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


def set_default(name: str) -> None:
    """Set ``name`` to its declared default for libraries loaded later, unless the host set it."""
    os.environ.setdefault(name, setting(name).default)
