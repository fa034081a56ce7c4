"""Peers: other engines run beside ours on the same requests (transformers, any OpenAI-compatible
server, vLLM, llama.cpp), written as our ``Trace``; the map is docs/architecture.md.

Modules: ``endpoints``, ``openai_engine``, ``openai_probe``, ``schedule_comparison``,
``server_metrics``, ``server_process``, ``transformers_engine``, ``transformers_scheduler``,
``vllm_engine``, ``vllm_record``, ``vllm_server``, ``vllm_scheduler``.

Nothing is imported here: import the modules by name. ``vllm_scheduler`` runs inside vLLM's process
and imports only vllm and the standard library, so no module here imports it.
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
