"""A prefix LM's prefix: the tokens of each sequence that read each other both ways.

:attr:`Batch.prefix_mask <maskcheck.harness.adapters.base.Batch>` ``[B, T]`` is 1 at the
real tokens of each sequence's bidirectional prefix (every token after it reads the prefix
and its own past, causally). A check that needs a particular prefix sets it; every other
batch a prefix-LM model is given carries the audit's default, the first
:data:`PREFIX_TOKENS` real tokens of each sequence (of each packed sequence, from its own
start; left padding does not count). Being a rule over each sequence's real tokens, it
gives a row padded in a batch, the same row alone and the same sequence packed with others
one prefix, so the padding and packing suites compare like with like.

Adapters pass it as the model takes it (:data:`PREFIX_FORMS`): a mask (1 = prefix token),
``token_type_ids`` as PaliGemma's (0 = prefix, 1 = the rest), or each row's prefix length.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ...reference_models.masks import sequence_ordinals

#: the real tokens of each sequence a batch's default prefix holds
PREFIX_TOKENS = 3
PrefixForm = Literal["mask", "token_type_ids", "lengths"]
PREFIX_FORMS: dict[str, str] = {
    "mask": "[B, T], 1 = prefix token",
    "token_type_ids": "[B, T], 0 = prefix token, 1 = the rest (PaliGemma)",
    "lengths": "[B], the real tokens of each row's prefix",
}


def default_prefix(real: Tensor, segments: Tensor | None = None, tokens: int = PREFIX_TOKENS) -> Tensor:
    """``[B, T]`` bool: the first ``tokens`` real tokens of each sequence (``real [B, T]``
    True at real tokens; ``segments [B, T]`` the packed sequence of each token)."""
    return real.bool() & (sequence_ordinals(real.bool(), segments) < tokens)


def prefix_first(prefix_lengths: list[int] | Tensor, real: Tensor) -> Tensor:
    """``[B, T]`` bool: the first ``prefix_lengths[b]`` real tokens of row ``b``."""
    lengths = torch.as_tensor(prefix_lengths, device=real.device)
    return real.bool() & (sequence_ordinals(real.bool()) < lengths[:, None])


def as_model_input(prefix: Tensor, form: str) -> Tensor:
    """``prefix [B, T]`` (True = prefix token) as a model of ``form`` takes it."""
    if form == "mask":
        return prefix.long()
    if form == "token_type_ids":
        return (~prefix.bool()).long()
    if form == "lengths":
        return prefix.long().sum(-1)
    raise ValueError(f"a prefix form is one of {', '.join(PREFIX_FORMS)}, got {form!r}")
