"""The Gradio page: everything the playground's browser page needs beyond ``app.py``'s layout.

* panel builders (``panels``, ``settings_panel``, ``results_panel``), handlers (``playground``),
  each session's run for Run and Stop (``run_handle``) and the live run (``live_run``,
  ``progress_view``);
* views of a finished run (``run_view``), figures (``style``, ``figures``, ``mask_figures``,
  ``serving_figures``), tables (``tables``) and the recorded run the page opens on
  (``recording``);
* page input and output: uploads, downloads and links (``page_io``), presets (``presets``), the
  guided tour (``tour``), run options (``run_options``);
* the one shared model (``shared_model``), public links (``share``) and ZeroGPU Spaces
  (``zerogpu``).

It reads the serving core's public interface (``engine.*``: engines, traces, workloads) and never
reaches into an engine's internals; the core never imports this package. Nothing heavy is imported
here.
"""
