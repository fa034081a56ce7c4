"""Continuous Batching Playground engine: static vs continuous batching on a real causal LM. Rooms,
each importing only those below it (map and named dimensions: docs/architecture.md): the
vocabulary (``knobs``, ``knob_values``, ``config``, ``sequence``, ``sampling_params``,
``token_logits``, ``trace``, ``trace_codec``, ``settings``, ``cache_file``), then ``workloads``,
``serving``, ``kernels``, ``model``, ``batching``, ``fidelity``, ``peers``, ``llamacpp``,
``host_servers``, ``host_queue``, ``worker``; above the core, ``page`` and ``bench``. Nothing
heavy is imported here."""
