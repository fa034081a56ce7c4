"""Peers: other engines run beside ours, on the same requests, written as our ``Trace``.

transformers' own continuous batching (``transformers_engine``, with ``transformers_scheduler``,
the scheduler transformers builds by name that records its steps),
any OpenAI-compatible server (``openai_engine``, ``openai_probe``, ``endpoints``,
``server_metrics``) and vLLM (``vllm_engine``: any recording vLLM endpoint, and a local one with
``vllm_server``; ``server_process`` starts and stops it, and llama.cpp's server too;
``openai_engine.ServerRegistry`` holds the server engines by name for the page and the bench),
whose own schedule is recorded inside it by ``vllm_scheduler``, read back as a
``Trace`` by ``vllm_record`` and set beside ours step by step by ``schedule_comparison``, which
also gives ours a deployment's settings. May import
every core room below it; in the core only ``worker`` imports it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``transformers_scheduler``, ``openai_probe``, ``server_metrics`` serve it from inside.
``vllm_scheduler`` is the face to vLLM: vLLM loads it by name (``--scheduler-cls``) in its own
process, and it imports only vllm and the standard library, so no module here ever imports it.
"""

__all__ = [
    "transformers_engine",
    "openai_engine",
    "endpoints",
    "vllm_engine",
    "vllm_server",
    "server_process",
    "vllm_record",
    "vllm_scheduler",
    "schedule_comparison",
]
