"""Seeded bugs in transformers' own cache operations, for the ``serving`` suite.

Each replaces the layer class of the cache ``generate()`` prepares (after the model's own
``_prepare_cache_for_generation``), so the model, its forward and its cache preparation are
transformers' own and only the one operation is wrong: as a patched or subclassed cache in
a user's serving stack would be.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class ReorderKeysOnlyLayer(DynamicLayer):
    """A dynamic cache layer whose beam-search reorder moves the keys and not the values."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self.keys = self.keys.index_select(0, beam_idx.to(self.keys.device))


class CropKeepsValuesLayer(DynamicLayer):
    """A dynamic cache layer whose rollback crops the keys and not the values: the values of
    rejected draft tokens stay, and every later token reads values one slot off."""

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            self.keys = self.keys[..., :tokens_to_remove, :]
            self.values = torch.cat([self.values[..., : tokens_to_remove - 1, :], self.values[..., -1:, :]], dim=-2)


def with_cache_layer(model: Any, layer_class: type) -> Any:
    """``model`` whose generation cache's dynamic layers are ``layer_class``."""
    prepare = model._prepare_cache_for_generation

    def prepared(generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
        result = prepare(generation_config, model_kwargs, *args, **kwargs)
        cache = model_kwargs.get("cache")
        for layer in getattr(cache, "layers", []):
            if type(layer) is DynamicLayer:
                layer.__class__ = layer_class
        return result

    model._prepare_cache_for_generation = prepared
    return model
