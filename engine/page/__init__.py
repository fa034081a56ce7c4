"""The Gradio page: everything the playground's browser page needs beyond ``app.py``'s layout.
Rooms, bottom up, as ``__all__`` lists them; map: docs/architecture.md.
"""

__all__ = ["figures", "inputs", "run", "views", "handlers", "panels", "host"]
