"""The C++ kernels' build: ``csrc/`` compiled once per host into one library, or the reason not.

AVX-512 F/BW/VL targeted by name, not ``-march=native``, so one build in
``CBP_CACHE_DIR/gemv/<build_digest()>`` serves every such CPU; callers else keep torch's ops.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import shutil
from pathlib import Path
from typing import Any

import torch

from engine import settings

_CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(
    _CSRC / n for n in ("gemv.cpp", "decode_attention.cpp", "layer_ops.cpp", "decoder_layers.cpp")
)
HEADERS = (_CSRC / "simd.h", _CSRC / "ops.h")  # included by the sources: part of a build's key
# -fopenmp: at::parallel_for is OpenMP in a header, so without it the kernel runs on one thread;
# the library then needs libgomp.so.1, which resolves to the copy torch has already loaded
# -ffp-contract=off: a product then a sum round twice, as torch's separate ops do (the rotary in
# decode_attention.cpp); the kernels' own fused multiply-adds are written as such
FLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-ffp-contract=off")
LINK_FLAGS = ("-fopenmp",)
NEEDED_SETS = ("avx512_f", "avx512_bw", "avx512_vl")
CHOICES = {
    "auto": "built and timed where a C++ compiler and an AVX-512 CPU are found",
    "off": "never built; the engines choose among the other kernels",
}

log = logging.getLogger(__name__)


def on_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_capabilities() -> dict[str, Any]:
    """``torch.cpu.get_capabilities()``, or ``{}`` where this torch lacks it."""
    get = getattr(torch.cpu, "get_capabilities", None)
    try:
        return dict(get()) if get is not None else {}
    except RuntimeError:
        return {}


def host_reason() -> str | None:
    if not on_x86():
        return f"the gemv kernel is written for x86-64 CPUs; this is {platform.machine()}"
    capabilities = cpu_capabilities()
    missing = [name for name in NEEDED_SETS if not capabilities.get(name)]
    if missing:
        return f"the gemv kernel needs AVX-512; this CPU lacks {', '.join(missing)}"
    compiler = settings.borrowed("CXX") or "c++"
    if shutil.which(compiler) is None:
        return f"no C++ compiler on this host ({compiler!r} not found) to build the gemv kernel"
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "ninja (pip install ninja) is missing, so torch cannot build the gemv kernel"
    return None


def unavailable_reason() -> str | None:
    """Why the kernel does not run here, or None (builds it on the first call in a process)."""
    if settings.choice("CBP_GEMV", CHOICES) == "off":  # ValueError: a bad setting
        return "CBP_GEMV=off"
    return _built()


@functools.cache
def _built() -> str | None:
    reason = host_reason()
    if reason is not None:
        return reason
    folder = Path(settings.value("CBP_CACHE_DIR")).expanduser() / "gemv" / build_digest()
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "cbp_gemv.so"
    try:
        # built before from this very source, torch and flags, and no build under way (torch's
        # builder holds a "lock" file in the folder while it writes the library): load it
        if library.exists() and not (folder / "lock").exists():
            torch.ops.load_library(str(library))
            return None
        from torch.utils import cpp_extension

        cpp_extension.load(
            name="cbp_gemv",
            sources=[str(source) for source in SOURCES],
            extra_cflags=list(FLAGS),
            extra_ldflags=list(LINK_FLAGS),
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as exc:
        line = next((ln for ln in str(exc).splitlines() if "error" in ln.lower()), str(exc))
        log.warning("the gemv kernel did not build: %s", line)
        return f"the gemv kernel did not build: {line.strip()[:300]}"
    return None


def build_digest() -> str:
    sources = [source.read_text() for source in (*SOURCES, *HEADERS)]
    text = "\n".join([*sources, torch.__version__, *FLAGS, *LINK_FLAGS])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def available() -> bool:
    return unavailable_reason() is None
