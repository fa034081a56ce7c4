"""OpenMP settings for a process that runs the model outside its main thread.

``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=300000`` keeps libgomp's spin once its pools
outnumber the CPUs (docs/measurements.md). A host's own value wins.
"""

from __future__ import annotations

from engine import settings

# the variables libgomp reads at load, with their defaults (declared in ``engine.settings``)
SETTINGS = {name: settings.default(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


def configure() -> bool:
    """Set each of ``SETTINGS`` unless already set; False (nothing changed) when torch was imported
    first, so libgomp will not read them."""
    import sys

    if "torch" in sys.modules:
        return False
    for name in SETTINGS:
        settings.set_default(name)
    return True
