"""A prefix LM written as a user's module: a decoder whose prefix (a prompt, an image's
tokens) reads itself both ways, and whose later tokens read the prefix and their own past.
No transformers causal-LM class takes a prefix, so this is the shape such a model has in a
user's repository.

It knows nothing of maskcheck beyond its declarations: ``maskcheck_capabilities`` (a dict),
the keyword that takes the prefix and its form (PaliGemma's ``token_type_ids``: 0 = prefix,
1 = the rest), and the object cache protocol of ``maskcheck.harness.adapters.module``::

    forward(input_ids [B, T], attention_mask [B, T] = None, token_type_ids [B, T] = None) -> logits [B, T, V]
    prefill(input_ids, attention_mask, token_type_ids=None) -> (logits [B, T, V], cache)
    step(cache, input_ids [B, n], attention_mask [B, T + n]) -> (logits [B, n, V], cache)

A prefill holds the whole prefix; the steps after it continue causally (the prefix's keys
in the cache were computed reading both ways). The arithmetic is the reference model's
(``ModelConfig(prefix_lm=True)``); positions count real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .masks import positions_from_mask
from .model import KVCache, Transformer


@dataclass
class PrefixCache:
    cache: KVCache
    next_position: Tensor  # [B]: real tokens so far


class PrefixLM(nn.Module):
    maskcheck_capabilities = {
        "family": "decoder",
        "vocab_size": 64,
        "attention": "prefix_lm",
        "has_cache": True,
        "max_length": 128,
        "pad_token_id": 0,
    }
    maskcheck_prefix_keyword = "token_type_ids"
    maskcheck_prefix_form = "token_type_ids"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.decoder = Transformer(ModelConfig(prefix_lm=True, vocab_size=64, max_seq_len=128))

    @staticmethod
    def _prefix(token_type_ids: Tensor | None) -> Tensor | None:
        return None if token_type_ids is None else token_type_ids == 0

    def _run(
        self, input_ids: Tensor, attention_mask: Tensor | None, prefix: Tensor | None
    ) -> tuple[Tensor, PrefixCache]:
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        out = self.decoder(input_ids, real, positions_from_mask(real.bool()), prefix_mask=prefix)
        return out.logits, PrefixCache(out.cache, real.long().sum(-1))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        logits, _ = self._run(input_ids, attention_mask, self._prefix(token_type_ids))
        return logits

    def prefill(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, PrefixCache]:
        return self._run(input_ids, attention_mask, self._prefix(token_type_ids))

    def step(self, cache: PrefixCache, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, PrefixCache]:
        new = attention_mask[:, -input_ids.shape[1] :].bool()  # [B, n]
        positions = positions_from_mask(new, cache.next_position)
        out = self.decoder(input_ids, attention_mask, positions, cache=cache.cache)
        return out.logits, PrefixCache(out.cache, cache.next_position + new.long().sum(-1))


class PrefillForgetsPrefix(PrefixLM):
    """Its prefill ignores the prefix: the cache holds keys computed causally, while the
    forward it was evaluated with reads the prefix both ways."""

    def prefill(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, PrefixCache]:
        return self._run(input_ids, attention_mask, None)


class PrefixReadCausally(PrefixLM):
    """It takes its prefix and does nothing with it: the prefix is read causally, as the
    rest is (a mask builder that drops the bidirectional block)."""

    @staticmethod
    def _prefix(token_type_ids: Tensor | None) -> Tensor | None:
        return None


class PrefixReachesSuffix(PrefixLM):
    """Its prefix ends one token late: the last prefix token reads the first token after the
    prefix (a prefix length counted from 1, say)."""

    @staticmethod
    def _prefix(token_type_ids: Tensor | None) -> Tensor | None:
        if token_type_ids is None:
            return None
        prefix = token_type_ids == 0
        return prefix | torch.cat([torch.zeros_like(prefix[:, :1]), prefix[:, :-1]], dim=1)  # [B, T]
