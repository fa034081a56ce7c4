"""The request table's component: Gradio's Dataframe, drawn by its own frontend, whose API value
Gradio passes on unchecked, so that Run's handler checks it like every other input.

A plain ``gr.Dataframe`` validates each value an API client sends before any handler sees it, and
a value that is not ``{"headers": [...], "data": [[...], ...]}`` (``"hello"``) ends the call with
Gradio's opaque error and a server traceback. ``RequestsTable`` has no data model for Gradio to
validate against, so the Run event (``preprocess=False`` in ``app.py``) receives what was sent and
``engine.page.run.run_options.request_rows`` refuses a bad one with a "Not run" status line. The
API's description of the input is the Dataframe's, unchanged. (Gradio writes a ``.pyi`` stub
beside every component class it imports; git ignores it.)
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.components.dataframe import DataframeData


class RequestsTable(gr.Dataframe):
    """A ``gr.Dataframe`` whose input Gradio does not validate (see the module)."""

    is_template = True  # drawn by the Dataframe's frontend (Gradio's ``get_block_name``)
    data_model = None  # nothing for Gradio to validate a sent value against

    def api_info(self) -> dict[str, Any]:
        """The Dataframe's own description of its value, as the API lists it."""
        schema = DataframeData.model_json_schema()
        schema["additional_description"] = schema.pop("description", None)
        return schema

    def preprocess(self, payload: Any) -> Any:
        """A sent table as the Dataframe's rows (``type="array"``); any other value as it was
        sent, for its handler to refuse."""
        if isinstance(payload, DataframeData):
            return super().preprocess(payload)
        try:
            table = DataframeData.model_validate(payload)
        except ValueError:  # pydantic's ValidationError is one
            return payload
        return super().preprocess(table)
