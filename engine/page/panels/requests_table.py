"""The request table's component: a Dataframe whose API value Gradio passes on unchecked, so that
Run refuses a malformed one in words (docs/page.md, "Gradio's costs").
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.components.dataframe import DataframeData


class RequestsTable(gr.Dataframe):
    """A ``gr.Dataframe`` whose input Gradio does not validate."""

    is_template = True  # drawn by the Dataframe's frontend (Gradio's ``get_block_name``)
    data_model = None  # nothing for Gradio to validate a sent value against

    def api_info(self) -> dict[str, Any]:
        schema = DataframeData.model_json_schema()
        schema["additional_description"] = schema.pop("description", None)
        return schema

    def preprocess(self, payload: Any) -> Any:
        """A sent table as rows; any other value as sent, for its handler to refuse."""
        if isinstance(payload, DataframeData):
            return super().preprocess(payload)
        try:
            table = DataframeData.model_validate(payload)
        except ValueError:  # pydantic's ValidationError is one
            return payload
        return super().preprocess(table)
