"""OpenMP settings for a process that runs the model outside its main thread (the web page).

torch's CPU kernels (MKL matmuls included) run on OpenMP thread pools, one pool per thread that
starts parallel work. GNU libgomp counts every pool's threads; once they outnumber the CPUs, it
cuts how long a waiting thread spins before it sleeps from 300,000 to 100 loops
(``GOMP_SPINCOUNT`` in the libgomp manual). The page runs each comparison in a worker thread
while the main thread, which loaded the model, keeps its own pool, so on a 2-CPU machine every
one of the ~200 matmuls of a step paid a sleep and a wake-up. Measured on the seed workload's
continuous run in one worker thread (2026-11-30): 8.9 s, and 15.5 s once the main thread had run
one parallel op. With ``OMP_WAIT_POLICY=ACTIVE`` the crowded case spins 1,000 loops instead, and
``GOMP_SPINCOUNT=300000`` keeps the uncrowded spin at libgomp's default: 9.2 s and 10.0 s.

``configure()`` acts only before torch is imported; a value the user already set is kept.
"""

from __future__ import annotations

import os

SETTINGS = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}


def configure() -> bool:
    """Set each of ``SETTINGS`` unless already set, if torch is not loaded yet.

    Returns True when libgomp will read the settings; False (nothing changed) when torch was
    imported first (as in a test process that imports ``app``), since then they come too late.
    """
    import sys

    if "torch" in sys.modules:
        return False
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)
    return True
