"""OpenMP settings for a process that runs the model outside its main thread.

Once a process's libgomp pools hold more threads than CPUs, a waiting thread spins 100 loops instead
of 300,000 (``GOMP_SPINCOUNT``, libgomp manual) and each small parallel region pays a sleep and
wake-up; ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=300000`` keeps the spin
(docs/measurements.md). A guard: the page calls torch from one thread. A host's own value wins.
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
