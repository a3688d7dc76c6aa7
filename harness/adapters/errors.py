"""What an adapter raises when the model behind it misbehaves, and the check of its logits' shape."""

from __future__ import annotations

from typing import Any

from torch import Tensor


class AdapterError(Exception):
    """The model behind an adapter misbehaved: raised, returned the wrong shape, left eval mode."""


class ModelRaised(AdapterError):
    """The model itself raised (or ran out of memory) when called; the message is its own, one line."""


class LogitsShapeError(AdapterError):
    """The model returned a tensor of logits of another shape than ``[B, T, V]``. A suite may
    turn it into a verdict where the shape itself breaks its property (a cached forward
    whose rows mix, while the full forward of the same rows has the right shape)."""

    def __init__(self, what: str, shape: list[int], expected: list[int]) -> None:
        super().__init__(f"the model returned {what} of shape {shape}, expected [B, T, V] = {expected}")
        self.what, self.shape, self.expected = what, shape, expected


def check_logits(logits: Any, batch: int, length: int, vocab_size: int, what: str = "logits") -> Tensor:
    """Raise :class:`AdapterError` unless ``logits`` is a ``[B, T, V]`` tensor."""
    if not isinstance(logits, Tensor):
        raise AdapterError(f"the model returned {type(logits).__name__} for its {what}, expected a tensor [B, T, V]")
    expected = (batch, length, vocab_size)
    if tuple(logits.shape) != expected:
        raise LogitsShapeError(what, list(logits.shape), list(expected))
    return logits
