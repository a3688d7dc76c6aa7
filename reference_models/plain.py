"""A plain PyTorch decoder with its own KV cache, written the way a user's model is.

It knows nothing of maskcheck: it declares what it is in ``maskcheck_capabilities`` (a
dict) and implements the module cache protocol of ``maskcheck.harness.adapters.module``:

    forward(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]
    prefill(input_ids [B, T], attention_mask [B, T]) -> (logits [B, T, V], cache)
    step(cache, input_ids [B, n], attention_mask [B, T + n]) -> (logits [B, n, V], cache)

Masks: 1/True = real token. Positions are counted over real tokens only (derived from
the mask), so a left-padded row decodes like the same row unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class PlainCache:
    keys: list[Tensor]  # per layer [B, H, T_so_far, D]
    values: list[Tensor]  # per layer [B, H, T_so_far, D]
    next_position: Tensor  # [B]: real tokens seen so far


def allowed_keys(mask: Tensor, queries: int) -> Tensor:
    """``[B, 1, Tq, Tk]`` True where a query may read a key: causal, real keys only. The last
    ``queries`` of the ``Tk`` tokens are the queries; a padded query reads itself, so no row is empty."""
    keys = mask.shape[1]
    q_index = torch.arange(keys - queries, keys, device=mask.device)[:, None]  # [Tq, 1]
    k_index = torch.arange(keys, device=mask.device)[None, :]  # [1, Tk]
    causal = k_index <= q_index  # [Tq, Tk]
    return (causal & (mask.bool()[:, None, :] | (k_index == q_index)))[:, None]  # [B, 1, Tq, Tk]


class PlainLayer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(
        self, x: Tensor, allowed: Tensor, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)  # each [B, T, C]
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # [B, H, T_so_far + T, D]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, T, D]
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))  # [B, T, C]
        return x + self.mlp(self.norm2(x)), k, v


class PlainDecoder(nn.Module):
    def __init__(
        self, vocab_size: int = 64, width: int = 32, heads: int = 2, layers: int = 2, max_length: int = 64
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_length, width)
        self.layers = nn.ModuleList(PlainLayer(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.maskcheck_capabilities = {
            "family": "decoder",
            "vocab_size": vocab_size,
            "max_length": max_length,
            "n_layers": layers,
            "has_cache": True,
            "derives_positions_from_mask": True,
            "pad_token_id": 0,
        }

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.prefill(input_ids, attention_mask)[0]

    def prefill(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, PlainCache]:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]: real tokens counted from 0
        return self._run(input_ids, positions, allowed_keys(mask, input_ids.shape[1]), None, mask.sum(-1))

    def step(self, cache: PlainCache, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, PlainCache]:
        new = attention_mask[:, -input_ids.shape[1] :].long()  # [B, n]: the appended tokens' mask
        positions = cache.next_position[:, None] + (new.cumsum(-1) - 1).clamp(min=0)  # [B, n]
        allowed = self.step_mask(attention_mask, input_ids.shape[1])
        return self._run(input_ids, positions, allowed, cache, cache.next_position + new.sum(-1))

    def step_mask(self, attention_mask: Tensor, queries: int) -> Tensor:
        """The keys the appended tokens may read (a hook for the seeded bug)."""
        return allowed_keys(attention_mask, queries)

    def _run(
        self, ids: Tensor, positions: Tensor, allowed: Tensor, cache: PlainCache | None, next_position: Tensor
    ) -> tuple[Tensor, PlainCache]:
        x = self.embed(ids) + self.position(positions)  # [B, T, C]
        keys, values = [], []
        for index, layer in enumerate(self.layers):
            past = None if cache is None else (cache.keys[index], cache.values[index])
            x, k, v = layer(x, allowed, past)
            keys.append(k)
            values.append(v)
        return self.head(self.norm(x)), PlainCache(keys, values, next_position)


class StepReadsPadding(PlainDecoder):
    """A plain decoder whose decoding step forgets the padding mask: the left-padded slots
    in its cache are read by every new token."""

    def step_mask(self, attention_mask: Tensor, queries: int) -> Tensor:
        return allowed_keys(torch.ones_like(attention_mask), queries)


def plain_decoder(seed: int = 0, buggy: bool = False) -> PlainDecoder:
    torch.manual_seed(seed)
    return (StepReadsPadding() if buggy else PlainDecoder()).eval()
