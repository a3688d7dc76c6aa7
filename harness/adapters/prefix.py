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


def first_real_tokens(real: Tensor, count: int | list[int] | Tensor, segments: Tensor | None = None) -> Tensor:
    """``[B, T]`` bool: the first ``count`` real tokens of each sequence (``count`` one number,
    or one per row; ``real [B, T]`` True at real tokens; ``segments [B, T]`` the packed
    sequence of each token, each counted from its own start)."""
    count = torch.as_tensor(count, device=real.device)
    if count.dim() == 1:
        count = count[:, None]  # [B, 1]: a row's own
    return real.bool() & (sequence_ordinals(real.bool(), segments) < count)


def default_prefix(real: Tensor, segments: Tensor | None = None) -> Tensor:
    """``[B, T]`` bool: the audit's default prefix, the first :data:`PREFIX_TOKENS` real tokens of each sequence."""
    return first_real_tokens(real, PREFIX_TOKENS, segments)


def as_model_input(prefix: Tensor, form: str) -> Tensor:
    """``prefix [B, T]`` (True = prefix token) as a model of ``form`` takes it."""
    if form == "mask":
        return prefix.long()
    if form == "token_type_ids":
        return (~prefix.bool()).long()
    if form == "lengths":
        return prefix.long().sum(-1)
    raise ValueError(f"a prefix form is one of {', '.join(PREFIX_FORMS)}, got {form!r}")
