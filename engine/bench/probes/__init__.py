"""The bench's probes: what this machine and one engine step cost, the yardsticks for its tables.

``hardware``: the time to read every weight once (a decode step's floor) and the peak memory;
``step_profile``: where a continuous decode step's time goes, by torch op group. May import the
core; imported by the rest of ``engine.bench`` through this face.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = ["hardware", "step_profile"]
