"""The command-line tools: they run the serving core (``engine``) and print what it did.

``python -m engine.bench`` (``cli``, flags in ``args``), ``verdicts`` and the ``probes``:
docs/bench.md. Never imports the page.
"""
