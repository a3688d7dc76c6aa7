"""Attention masks, built in one place.

Polarity, stated once for the whole package: in every mask here **True means "this
query may attend to this key"**. Inputs follow the Hugging Face convention for
padding (``attention_mask`` 1 = real token, 0 = padding). PyTorch's
``key_padding_mask`` (True = ignore) is the opposite; :func:`check_padding_mask`
refuses float masks so an additive or inverted mask cannot slip in unnoticed.

Causal order and sliding windows are defined on the absolute *sequence index* of a
token (its column in the row, counting cached tokens), not on its position id: with
left padding or packing the two differ, and the index is what decides what came
before.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_padding_mask(
    mask: Tensor, batch: int, length: int, name: str = "attention_mask", meaning: str = "1 = real token and 0 = padding"
) -> Tensor:
    """Validate a ``[B, T]`` padding mask (1/True = real token; another 0/1 mask of tokens
    says its ``meaning``) and return it as bool."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(
            f"{name} must be bool or integer with {meaning}, got {mask.dtype}; "
            "an additive float mask (0 / -inf) is not accepted here"
        )
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"{name} must have shape [B, T] = [{batch}, {length}], got {list(mask.shape)}")
    if mask.dtype != torch.bool:
        if ((mask != 0) & (mask != 1)).any():
            raise ValueError(f"{name} must hold only 0 and 1")
        mask = mask != 0
    return mask


def build_attention_mask(
    *,
    q_index: Tensor,
    k_index: Tensor,
    causal: bool,
    window: int | None = None,
    sinks: int = 0,
    key_real: Tensor | None = None,
    q_segments: Tensor | None = None,
    k_segments: Tensor | None = None,
    q_chunks: Tensor | None = None,
    k_chunks: Tensor | None = None,
    batch: int,
) -> Tensor:
    """Combine causal, window, chunk, padding and segment masks into one ``[B, Tq, Tk]`` bool mask.

    ``q_index [Tq]`` and ``k_index [Tk]`` are absolute sequence indices; ``key_real
    [B, Tk]`` is True at real keys; ``q_segments [B, Tq]`` / ``k_segments [B, Tk]`` give
    each token's packed-sequence id (block-diagonal attention when given). ``sinks``: with
    a window, keys at index < sinks stay visible (StreamingLLM's attention sinks).
    ``q_chunks [B, Tq]`` / ``k_chunks [B, Tk]``: each token's attention chunk; a query reads
    keys of its own chunk only.
    """
    allowed = torch.ones(q_index.numel(), k_index.numel(), dtype=torch.bool, device=q_index.device)
    distance = q_index[:, None] - k_index[None, :]  # [Tq, Tk]: how far back the key is
    if causal:
        allowed = allowed & (distance >= 0)
    if window is not None:
        in_window = distance < window
        if sinks:
            in_window = in_window | (k_index[None, :] < sinks)  # attention sinks: the row's first tokens
        allowed = allowed & in_window
    allowed = allowed.expand(batch, -1, -1)  # [B, Tq, Tk]
    if q_chunks is not None and k_chunks is not None:
        allowed = allowed & (q_chunks[:, :, None] == k_chunks[:, None, :])
    if key_real is not None:
        allowed = allowed & key_real[:, None, :]
    if q_segments is not None and k_segments is not None:
        allowed = allowed & (q_segments[:, :, None] == k_segments[:, None, :])
    return allowed


def positions_from_mask(real: Tensor, start: Tensor | None = None) -> Tensor:
    """Position ids that count only real tokens: ``[1, 1, 0, 1, 1] -> [0, 1, 1, 1, 2]``.

    ``padding [B, T]`` is True at real tokens; ``start [B]`` is each row's next position
    (the number of real tokens already cached). Padded slots get the position of the
    previous real token (or 0), which keeps every id in range.
    """
    counts = real.long().cumsum(-1)  # [B, T]
    if start is not None:
        counts = counts + start[:, None]
    return (counts - 1).clamp(min=0)


def positions_from_segments(segments: Tensor) -> Tensor:
    """Position ids restarting at 0 at each new segment id: ``[0, 0, 1, 1, 1] -> [0, 1, 0, 1, 2]``."""
    _, length = segments.shape
    index = torch.arange(length, device=segments.device).expand_as(segments)  # [B, T]
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values  # [B, T]
    return index - start_index


def sequence_ordinals(real: Tensor, segments: Tensor | None = None) -> Tensor:
    """``[B, T]``: each token's index among the real tokens of its sequence, counted from the
    sequence's first real token (left padding does not count; with ``segments``, each
    packed sequence counts from its own start). Padded slots repeat the previous index."""
    if segments is not None:
        return positions_from_segments(segments)
    return (real.long().cumsum(-1) - 1).clamp(min=0)


def prefix_pairs(prefix: Tensor, real: Tensor, segments: Tensor | None = None) -> Tensor:
    """``[B, T, T]``: the (query, key) pairs a bidirectional prefix adds to a causal mask:
    both real tokens of the prefix (``prefix [B, T]`` True there) of one sequence."""
    inside = prefix & real  # [B, T]
    pairs = inside[:, :, None] & inside[:, None, :]
    if segments is not None:
        pairs = pairs & (segments[:, :, None] == segments[:, None, :])
    return pairs
