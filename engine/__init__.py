"""Continuous Batching Playground engine: static vs continuous batching on a real causal LM.

The package holds two engines that run the same requests on the same loaded model: the static
engine's padded waves behind a batch barrier, and the continuous engine's iteration-level
scheduling with every in-flight token packed into one ``[1, T]`` row (``engine.batching``). Both
write a ``Trace`` (``engine.trace``), the single source of every chart and metric.

The core is a stack of rooms, each importing only the rooms below it (``tests/engine/test_wings.py``
checks the order):

* at the root, the vocabulary every room reads: ``knobs`` (each knob of a run declared once),
  ``knob_values`` (a knob's value parsed by its kind),
  ``config``, ``sequence``, ``sampling_params``, ``token_logits``, ``trace``, ``trace_codec``
  (its JSON, full or compact), and ``settings``, the one module that reads the environment;
* ``workloads``: request tables, workload files, exports;
* ``serving``: scheduler, block manager, KV caches, packed batch, masks, sampler, run control;
* ``kernels``: packed attention and its variants, the matmul kernel, fused decoder layers;
* ``model``: loader, device, dtypes, the model runner (the only caller of the model);
* ``batching``: the static and the continuous engine;
* ``fidelity``: the per-request ``model.generate`` reference and divergence verdicts;
* ``peers``: transformers' engine, OpenAI-compatible servers and vLLM, run beside ours;
* ``llamacpp``: llama.cpp's ``llama-server`` on the loaded weights (F32 or the shipped Q4_1);
* ``worker``: a run's engine work as one typed job and one typed result, in core types only,
  for the engine process and the page's engine thread alike.

Above the core sit the page (``page``) and the command-line tools (``bench``).

Named dimensions used in shape comments and ``Shapes:`` docstring sections:

====  ==============================================================
B     number of slots (static: rows of a wave)
S     number of sequences scheduled in one step (S <= B)
T     number of query tokens packed into one step's ``[1, T]`` row
T_kv  number of keys a step's queries can see (cached + new)
P     per-slot KV capacity in tokens (``max_seq_len``)
L     number of decoder layers
H     number of query heads;  H_kv: number of key/value heads
G     query heads per key/value head (H = H_kv * G, grouped-query attention)
D     head dimension
V     vocabulary size
====  ==============================================================

Nothing heavy is imported here: import the submodules you need.
"""
