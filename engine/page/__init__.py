"""The Gradio page: everything the playground's browser page needs beyond ``app.py``'s layout.

Rooms, bottom up: ``figures``, ``inputs``, ``run``, ``views``, ``handlers``, ``panels``,
``host``; each imports the core and only the rooms below it, and the core never imports this
package (map: docs/architecture.md; ``tests/engine/test_wings.py`` checks the order).
"""

__all__ = ["figures", "inputs", "run", "views", "handlers", "panels", "host"]
