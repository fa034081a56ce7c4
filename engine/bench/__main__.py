"""``python -m engine.bench``: the benchmark CLI (``engine.bench.cli``)."""

import sys

from engine.bench.cli import main

sys.exit(main())
