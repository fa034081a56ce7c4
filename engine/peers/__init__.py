"""Peers: other engines run beside ours, on the same requests, written as our ``Trace``.

transformers' own continuous batching (``transformers_engine``, with ``transformers_manager``),
any OpenAI-compatible server (``openai_engine``, ``openai_probe``, ``endpoints``,
``server_metrics``) and a local vLLM (``vllm_engine``, ``vllm_server``). May import every core room
below it; nothing in the core imports it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``transformers_manager``, ``openai_probe``, ``server_metrics`` serve it from inside.
"""

__all__ = [
    "transformers_engine",
    "openai_engine",
    "endpoints",
    "vllm_engine",
    "vllm_server",
]
