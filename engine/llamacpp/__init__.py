"""llama.cpp beside our engines: its ``llama-server`` on the loaded model's weights, as two engines.

``gguf_file`` gives llama.cpp the weights in its own format (the loaded float32 weights converted
to an F32 GGUF, or the embedded model's shipped Q4_1 file), ``server`` starts and stops one
``llama-server`` (built by ``make llamacpp``), and ``engines`` plays workloads at it through the
peers' OpenAI client: ``llamacpp`` (F32) and ``llamacpp_q4`` (Q4_1). May import every core room
below it (``peers`` for the client); in the core nothing imports it (the bench and the page's
host servers do).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = ["gguf_file", "server", "engines"]
