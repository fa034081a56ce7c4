"""llama.cpp beside our engines: ``llama-server`` on the loaded weights as two engines. Modules:
``gguf_file``, ``server``, ``engines``; docs/servers.md and docs/architecture.md.

Nothing is imported here: import the modules by name.
"""

__all__ = ["gguf_file", "server", "engines"]
