"""Continuous Batching Playground engine: static vs continuous batching on a real causal LM.

Rooms, each importing only those below it (docs/architecture.md holds the map and the named
dimensions of ``Shapes:`` sections): the vocabulary (``knobs``, ``knob_values``, ``config``,
``sequence``, ``sampling_params``, ``token_logits``, ``trace``, ``trace_codec``,
``settings``, ``cache_file``), then ``workloads``,
``serving``, ``kernels``, ``model``, ``batching``, ``fidelity``, ``peers``, ``llamacpp``,
``host_servers``, ``host_queue``, ``worker``; above the core, ``page`` and ``bench``.

Nothing heavy is imported here: import the submodules you need.
"""
