"""The Gradio page: everything the playground's browser page needs beyond ``app.py``'s layout.

Rooms, from the bottom up; each imports the serving core and only the page rooms below it
(``tests/engine/test_wings.py`` checks the order):

* ``figures``: every chart, from a ``Trace`` alone (the only plotly in the project);
* ``inputs``: presets, uploads, downloads and links;
* ``run``: one visitor's run, the engine thread, the shared model, the host's servers;
* ``views``: what the page shows of a run, running or finished;
* ``handlers``: Run, Stop and the step slider as plain functions; the recorded run;
* ``panels``: the component builders ``app.py`` lays out;
* ``host``: the command line, the server, the queue, share links and ZeroGPU Spaces.

It reads the serving core's public interface (``engine.*``: engines, traces, workloads) and never
reaches into an engine's internals; the core never imports this package. Nothing heavy is imported
here.
"""

__all__ = ["figures", "inputs", "run", "views", "handlers", "panels", "host"]
