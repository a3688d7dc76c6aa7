"""Attention matrices for a forward whose mask is a ``[B, T, S]`` matrix, not a padding mask.

Mask polarity, stated once: ``allowed[b, i, j]`` is True when query ``i`` of row ``b`` may
attend to key ``j``. This is torchtune's ``mask=`` and the boolean ``attn_mask`` of
``F.scaled_dot_product_attention``. Such a mask *replaces* the model's own pattern, so the
matrix a collator builds must carry the pattern too: maskcheck builds the declared one
(causal, or a sliding window), AND-ed with the real keys (padding) and the query's own
sequence (packing). A padded query attends to itself alone, as torchtune's
``get_causal_mask_from_padding_mask`` does: a row with no key to attend to would be NaN,
and its logits are never read.

Columns are key *slots*: the tokens of the row for a plain forward, the slots of a KV
cache for a cached one (``key_slots``). Slots and positions differ only by a row's left
padding, which shifts both ends of a distance alike, so a causal or windowed pattern on
slots is the pattern on positions.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ...reference_models.masks import build_attention_mask

#: how the matrix is shaped for the forward: [B, T, S], or [B, 1, T, S] (broadcast over heads)
MatrixLayout = Literal["matrix", "matrix_heads"]
SHAPES = {"matrix": "[B, T, T]", "matrix_heads": "[B, 1, T, T]"}


def buildable(pattern: str | None, window: int | None) -> bool:
    """Whether a batch gives the matrix of ``pattern``: causal, bidirectional, or a sliding
    window of a known width (a prefix-LM's or chunked pattern needs what no batch holds)."""
    return pattern in ("causal", "bidirectional") or (pattern == "sliding_window" and bool(window))


def allowed_keys(
    key_real: Tensor,
    query_slots: Tensor,
    *,
    pattern: str,
    window: int | None = None,
    segments: Tensor | None = None,
) -> Tensor:
    """The matrix ``[B, n, S]`` (True = may attend) for queries at cache or row slots
    ``query_slots [n]`` over ``S`` keys whose real tokens are ``key_real [B, S]`` (1 = real).
    ``segments [B, S]`` (0, 1, 2 ... per packed sequence, -1 at padding) keeps each query in
    its own sequence. ``pattern`` is "causal", "sliding_window" (``window`` counts the
    query itself) or "bidirectional"; any other cannot be built from a batch. The pattern,
    padding and segments are combined by the reference models' one mask builder."""
    if not buildable(pattern, window):
        raise ValueError(f"an attention matrix for the {pattern!r} pattern cannot be built from a batch")
    key_slots = torch.arange(key_real.shape[1], device=key_real.device)  # [S]
    allowed = build_attention_mask(
        q_index=query_slots,
        k_index=key_slots,
        causal=pattern != "bidirectional",
        window=window if pattern == "sliding_window" else None,
        key_real=key_real.bool(),
        q_segments=None if segments is None else segments[:, query_slots],
        k_segments=segments,
        batch=key_real.shape[0],
    )  # [B, n, S]
    itself = query_slots[None, :, None] == key_slots[None, None, :]  # [1, n, S]: each query's own slot
    return allowed | itself


def row_matrix(
    real: Tensor, *, pattern: str, window: int | None = None, segments: Tensor | None = None, layout: MatrixLayout
) -> Tensor:
    """The matrix a collator builds for a plain forward of a batch whose real tokens are
    ``real [B, T]``: ``[B, T, T]``, or ``[B, 1, T, T]`` for ``layout="matrix_heads"``."""
    slots = torch.arange(real.shape[1], device=real.device)  # [T]
    matrix = allowed_keys(real, slots, pattern=pattern, window=window, segments=segments)  # [B, T, T]
    return matrix[:, None] if layout == "matrix_heads" else matrix
