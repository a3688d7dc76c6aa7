"""Tiny torchtune decoders: a test subject as torchtune builds it, and one with a seeded cache bug.

torchtune is a test subject (the dev extra), never a dependency: it is imported when a
decoder is built. The decoder is ``torchtune.models.llama3.llama3`` at a tiny size, with
random weights drawn from a fixed seed (the clean model and the mutant share them).
"""

from __future__ import annotations

from typing import Any

import torch

#: a llama3 small enough for a test: 2 layers, grouped-query attention (4 query heads, 2 key/value heads)
TINY = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64, intermediate_dim=64)


def tiny_torchtune(seed: int = 0) -> Any:
    """``llama3(**TINY)`` in eval mode, its weights drawn from ``seed``."""
    from torchtune.models.llama3 import llama3

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return llama3(**TINY).eval()


def torchtune_cache_advances_one_slot(seed: int = 0) -> Any:
    """A torchtune llama3 whose KV cache moves its write position one slot per forward,
    not one per token (a cache written for one-token steps): a step after a longer prefill
    or chunk overwrites earlier slots and the mask points at slots never written."""
    from torchtune.modules import KVCache, TransformerDecoder

    class AdvancesOneSlot(KVCache):
        def update(self, k_val: torch.Tensor, v_val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = super().update(k_val, v_val)
            self.cache_pos.sub_(k_val.shape[2] - 1)  # super() advanced it by the tokens written: keep one
            return keys, values

    class SetsUpTheBug(TransformerDecoder):
        def setup_caches(self, *args: Any, **kwargs: Any) -> None:
            super().setup_caches(*args, **kwargs)
            for module in self.modules():
                if isinstance(getattr(module, "kv_cache", None), KVCache):
                    module.kv_cache.__class__ = AdvancesOneSlot

    model = tiny_torchtune(seed)
    model.__class__ = SetsUpTheBug
    return model
