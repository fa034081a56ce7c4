"""Host servers: the host's servers (local vLLM, llama.cpp, endpoints) as one set the page and the
bench share: ``server_choice``, ``server_set``, ``server_runs``, ``server_timings``."""

__all__ = ["server_choice", "server_set", "server_runs", "server_timings"]
