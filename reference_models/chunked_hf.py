"""Tiny Llama 4 text models with chunked attention at a width a case can see end (8 tokens),
clean and with one seeded bug each in how transformers' mask builder applies the chunk.

Llama 4 declares ``attention_chunk_size`` and per-layer ``layer_types``: a
``chunked_attention`` layer lets a query read the keys at or before it in its own chunk
only, chunks counted from the row's first real token. Its cache keeps a chunked layer's
last C - 1 keys (a sliding-window layer of width C) and its mask hides those of the
previous chunk.
"""

from __future__ import annotations

import functools
from typing import Any, Callable
from unittest import mock

import torch

CHUNK = 8
EVERY_LAYER_CHUNKED = ("chunked_attention", "chunked_attention")
CHUNKED_THEN_FULL = ("chunked_attention", "full_attention")

#: each bug: the transformers mask builder it swaps, as a context manager given the mask's keywords
BUGS = ("chunk_ignored", "chunks_from_column_zero", "cache_reads_previous_chunk")


def llama4(
    layer_types: tuple[str, ...] = EVERY_LAYER_CHUNKED, chunk: int = CHUNK, bug: str | None = None, seed: int = 0
) -> Any:
    """A random-init Llama 4 text model (2 layers of ``layer_types``, chunks of ``chunk``), in
    eval mode; ``bug`` (one of :data:`BUGS`) swaps its chunked mask builder for a wrong one."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown chunked-attention bug {bug!r}; known: {', '.join(BUGS)}")
    config = Llama4TextConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        moe_layers=[],  # dense layers: a router's ties would only add noise
        no_rope_layers=[1] * len(layer_types),
        attention_chunk_size=chunk,
        layer_types=list(layer_types),
        max_position_embeddings=256,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = Llama4ForCausalLM(config)
    if bug is not None:
        model.__class__ = _with_mask_builder(type(model), _BUGGY_BUILDERS[bug])
    return model.eval()


def _with_mask_builder(cls: type, builder: Callable[[Callable[..., Any]], Callable[..., Any]]) -> type:
    """``cls`` whose forward builds its chunked layers' masks with ``builder(original)``."""
    from transformers.models.llama4 import modeling_llama4

    @functools.wraps(cls.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        original = modeling_llama4.create_chunked_causal_mask
        with mock.patch.object(modeling_llama4, "create_chunked_causal_mask", builder(original)):
            return cls.forward(self, *args, **kwargs)

    return type(f"Buggy{cls.__name__}", (cls,), {"forward": forward})


def _chunk_ignored(original: Callable[..., Any]) -> Callable[..., Any]:
    """The chunked layers get a plain causal mask: every key before the query is read."""
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask


def _chunks_from_column_zero(original: Callable[..., Any]) -> Callable[..., Any]:
    """Chunks counted from column 0 of a left-padded row, not from its first real token."""
    from transformers import masking_utils

    chunked = masking_utils.chunked_causal_mask_function

    def build(**kwargs: Any) -> Any:
        def from_zero(chunk: int, left_padding: torch.Tensor) -> Any:
            return chunked(chunk, torch.zeros_like(left_padding))

        with mock.patch.object(masking_utils, "chunked_causal_mask_function", from_zero):
            return original(**kwargs)

    return build


def _cache_reads_previous_chunk(original: Callable[..., Any]) -> Callable[..., Any]:
    """A cached forward's mask reads every key the chunked layer's cache retains (its last
    C - 1: a sliding window of C), so a query early in a chunk reads the previous chunk's end."""
    from transformers import masking_utils

    def build(**kwargs: Any) -> Any:
        cache = kwargs.get("cache")
        if cache is None or cache.get_seq_length() == 0:
            return original(**kwargs)

        def as_window(chunk: int, left_padding: torch.Tensor) -> Any:
            return masking_utils.sliding_window_causal_mask_function(chunk)

        with mock.patch.object(masking_utils, "chunked_causal_mask_function", as_window):
            return original(**kwargs)

    return build


_BUGGY_BUILDERS = {
    "chunk_ignored": _chunk_ignored,
    "chunks_from_column_zero": _chunks_from_column_zero,
    "cache_reads_previous_chunk": _cache_reads_previous_chunk,
}


def llama4_chunked_then_full() -> Any:
    """The clean Llama 4 whose first layer is chunked and second full (a ``module:`` spec's factory)."""
    return llama4(CHUNKED_THEN_FULL)
