"""Peers: other engines run beside ours on the same requests, written as our ``Trace``:
``endpoints``, ``openai_engine``, ``openai_probe``, ``schedule_comparison``, ``server_metrics``,
``server_process``, ``transformers_engine``, ``transformers_scheduler``, ``vllm_engine``,
``vllm_record``, ``vllm_server``, ``vllm_scheduler`` (runs inside vLLM; nothing imports it).
Import them by name."""

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
