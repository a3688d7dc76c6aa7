"""What one attention layer may read, as a model declares it: the keys a query ``q`` may
attend to, counted in tokens of its own sequence (from the sequence's first real token:
left padding and packing do not move a chunk's boundaries).

Polarity, stated once: every mask built here is ``[T_q, T_k]`` bool, **True = the query
may read the key**.

- ``full``: every key ``k <= q``.
- ``sliding`` of width ``W``: the keys ``q - W < k <= q`` (W counts the query itself:
  Mistral's and PyTorch's convention).
- ``chunked`` of width ``C``: the keys ``k <= q`` of the query's own chunk, chunks being
  the tokens ``[0, C)``, ``[C, 2C)`` ... of the sequence (Llama 4's ``attention_chunk_size``).
  A chunk is not a window: the first query of a chunk reads only itself, however long
  the sequence before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

LayerKind = Literal["full", "sliding", "chunked"]
LAYER_KINDS: tuple[LayerKind, ...] = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerAttention:
    """One layer's declared pattern: its kind and, for a window or a chunk, its width in tokens."""

    kind: LayerKind = "full"
    width: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"a layer's attention is one of {', '.join(LAYER_KINDS)}, got {self.kind!r}")
        if (self.kind == "full") != (self.width is None) or (self.width is not None and self.width < 1):
            raise ValueError(
                f"a {self.kind} layer takes {'no width' if self.kind == 'full' else 'a width >= 1'}, got {self.width!r}"
            )

    def describe(self) -> str:
        if self.kind == "sliding":
            return f"sliding window W={self.width}"
        if self.kind == "chunked":
            return f"chunk C={self.width}"
        return "full attention"

    def allowed(self, length: int) -> Tensor:
        """``[T, T]`` True where query ``q`` may read key ``k`` in one unpadded sequence of ``length``."""
        q = torch.arange(length)[:, None]
        k = torch.arange(length)[None, :]
        allowed = k <= q
        if self.kind == "sliding":
            assert self.width is not None
            allowed = allowed & (q - k < self.width)
        if self.kind == "chunked":
            assert self.width is not None
            allowed = allowed & (q // self.width == k // self.width)
        return allowed


def as_layers(declared: Any) -> tuple[LayerAttention, ...]:
    """A declaration of layers as :class:`LayerAttention` each: given so, or by its fields as a
    tuple (``("chunked", 8)``) or a dict (a declaration written in a dict)."""
    return tuple(
        layer if isinstance(layer, LayerAttention)
        else LayerAttention(**layer) if isinstance(layer, dict)
        else LayerAttention(*layer)
        for layer in declared
    )  # fmt: skip


def bounded_layers(capabilities: Any) -> list[LayerAttention]:
    """The window and chunk layers a model declares (``Capabilities``): its layers' where they
    are told apart (``layers``), else its one pattern's (``attention`` with its ``window`` or
    ``attention_chunk``); full attention layers left out."""
    if capabilities.layers:
        return [layer for layer in capabilities.layers if layer.kind != "full"]
    if capabilities.attention == "sliding_window" and capabilities.window:
        return [LayerAttention("sliding", capabilities.window)]
    if capabilities.attention == "chunked" and capabilities.attention_chunk:
        return [LayerAttention("chunked", capabilities.attention_chunk)]
    return []


def declared_chunk(capabilities: Any) -> int | None:
    """The attention chunk a model declares, in every layer or in its chunked layers, or None."""
    return min((layer.width for layer in bounded_layers(capabilities) if layer.kind == "chunked"), default=None)


def evicting_layer(capabilities: Any) -> LayerAttention | None:
    """The layer whose cache keeps the fewest keys (a window of W keeps W - 1, a chunk of C
    keeps up to C - 1): the one a cache that evicts must get right first."""
    return min(bounded_layers(capabilities), key=lambda layer: layer.width or 0, default=None)
