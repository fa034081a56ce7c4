"""The bench's probes, the yardsticks for its tables. Modules: ``hardware`` (weight read, peak
memory), ``step_profile`` (a decode step by op group)."""

__all__ = ["hardware", "step_profile"]
