"""llama.cpp's ``llama-server`` on the loaded weights as two engines: ``gguf_file``, ``server``,
``engines``. Import them by name."""

__all__ = ["gguf_file", "server", "engines"]
