"""The command-line tools: they run the serving core (``engine``) and print what it did.

* ``python -m engine.bench``: the benchmark, the same requests through each engine side by side
  (``engine.bench.cli``, flags in ``engine.bench.args``);
* ``python -m engine.bench.kernel_bench``: the engines' matmul kernel against ``F.linear``;
* ``python -m engine.bench.gpu_check`` (``make gpu-check``): the precision checks on a CUDA GPU;
* ``engine.bench.verdicts``: the bench's ✓ / ≈ / ✗ per request and the batch-invariant cost;
* ``engine.bench.probes``: weight-read time, peak memory and a decode step by op group, the
  yardsticks.

This wing depends on the core and never on the page (``engine.page``). Nothing heavy is imported
here.
"""
