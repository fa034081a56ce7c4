"""The page's ``run_state``: a Gradio State whose config never converts the run it keeps."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import pytest

from engine.page.views.run_view import RunStateHolder


class Pair(list):
    """A list that ``dataclasses.asdict`` cannot rebuild (its constructor takes two values)."""

    def __init__(self, first, second):
        super().__init__([first, second])


@dataclass
class Kept:
    pair: Pair


def test_the_run_states_config_leaves_the_kept_run_unread():
    """Gradio's State converts a dataclass value each time a session sets it (53 ms for the
    recorded run, on the event loop); the holder's config is a State's, with nothing read."""
    kept = Kept(Pair(1, 2))
    with pytest.raises(TypeError):  # the conversion the holder skips
        gr.State(kept).get_config()
    holder = RunStateHolder(kept)
    assert holder.get_config() == gr.State(None).get_config()
    assert holder.get_block_name() == "state", "the frontend and API clients must see a State"
