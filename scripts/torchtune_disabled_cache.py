"""torchtune 0.6.1, in plain torchtune calls: with KV caches set up and disabled
(``disable_kv_cache``, as an evaluation loop inside generation code does), a forward without
a mask is not causal. ``MultiHeadAttention`` passes ``is_causal`` only when no cache is set
up, so with a cache present and no mask, attention reads every position.

    python scripts/torchtune_disabled_cache.py

Prints the largest change of an early position's logits when later tokens change: 0 for the
forward without caches (causal), far from 0 with caches set up and disabled.
"""

from __future__ import annotations

import torch
from torchtune.models.llama3 import llama3
from torchtune.modules.common_utils import disable_kv_cache


def early_logits_move(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """How much position 0..2's logits move when the tokens after position 2 change."""
    changed = ids.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 64
    with torch.inference_mode():
        return float((model(ids)[:, :3] - model(changed)[:, :3]).abs().max())


def main() -> None:
    torch.manual_seed(0)
    model = llama3(
        vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64, intermediate_dim=64
    ).eval()
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    print(f"no caches:                    {early_logits_move(model, ids):.3g}")
    model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=64)
    with disable_kv_cache(model):
        print(f"caches set up, then disabled: {early_logits_move(model, ids):.3g}")


if __name__ == "__main__":
    main()
