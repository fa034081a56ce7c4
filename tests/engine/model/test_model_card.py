"""The model card: a loaded model less its weights, as a process without them reads it."""

from __future__ import annotations

import pickle

from tiny_model import tiny_runner

from engine.model.model_card import ModelCard


def test_the_card_carries_the_device_label_the_loaded_model_says():
    """A card sent through a pipe (pickled) says the loaded model's device label as a value of its
    own, so the page shows it without working it out again (``engine.model.device``)."""
    runner = tiny_runner()
    card = pickle.loads(pickle.dumps(ModelCard.of(runner)))
    assert card.device_label == runner.loaded.device_label == "CPU · float32", card.device_label
    assert "device_label" in vars(card), "the label is worked out again where the card is read"
