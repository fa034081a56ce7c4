"""OpenMP settings for a process that runs the model outside its main thread.

torch's CPU kernels (MKL and oneDNN matmuls included) run on GNU libgomp's OpenMP thread pools,
one pool per thread that starts parallel work. Once a process's pools hold more threads than
there are CPUs, libgomp cuts how long a waiting thread spins before it sleeps from 300,000 to 100
loops (``GOMP_SPINCOUNT`` in the libgomp manual), and every small parallel region of a step pays a
sleep and a wake-up. With ``OMP_WAIT_POLICY=ACTIVE`` the crowded case spins 1,000 loops instead,
and ``GOMP_SPINCOUNT=300000`` keeps the uncrowded spin at libgomp's default (docs/measurements.md).

The page makes every torch call on one thread (``engine.worker.worker_process``), so these matter
only if some other thread starts parallel work: they are a guard. On a machine other processes
keep busy a spinning thread takes a CPU another process wanted; such a host can set
``OMP_WAIT_POLICY=PASSIVE`` in the environment, which wins over these defaults.

``configure()`` acts only before torch is imported; a value the user already set is kept.
"""

from __future__ import annotations

from engine import settings

# the variables libgomp reads at load, with their defaults (declared in ``engine.settings``)
SETTINGS = {name: settings.default(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


def configure() -> bool:
    """Set each of ``SETTINGS`` unless already set, if torch is not loaded yet.

    Returns True when libgomp will read the settings; False (nothing changed) when torch was
    imported first (as in a test process that imports ``app``), since then they come too late.
    """
    import sys

    if "torch" in sys.modules:
        return False
    for name in SETTINGS:
        settings.set_default(name)
    return True
