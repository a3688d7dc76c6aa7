"""A plain PyTorch decoder with its own KV cache, written the way a user's model is.

It knows nothing of maskcheck: it declares what it is in ``maskcheck_capabilities`` (a
dict) and implements the module cache protocol of ``maskcheck.harness.adapters.module``:

    forward(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]
    prefill(input_ids [B, T], attention_mask [B, T], cache=None) -> (logits [B, T, V], cache)
    step(cache, input_ids [B, n], attention_mask [B, T + n]) -> (logits [B, n, V], cache)

and the serving methods: ``rollback(cache, n)``, ``reorder(cache, index)``,
``reset(cache)`` (an emptied cache that ``prefill(..., cache=cache)`` fills again).

Masks: 1/True = real token. Positions are counted over real tokens only (derived from
the mask), so a left-padded row decodes like the same row unpadded. The cache is mutable,
as transformers' ``DynamicCache`` is: each layer appends its keys, values and which of
them are real tokens, and a step reads its own layer's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class LayerCache:
    keys: Tensor | None = None  # [B, H, T_so_far, D]; None: empty
    values: Tensor | None = None  # [B, H, T_so_far, D]
    real: Tensor | None = None  # [B, T_so_far] bool: the cached keys that are real tokens

    def append(self, keys: Tensor, values: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append the new tokens' ``keys``, ``values`` ``[B, H, T, D]`` and ``real [B, T]``;
        returns everything cached now, the new tokens last."""
        real = real.bool()
        if self.keys is not None:
            assert self.values is not None and self.real is not None
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
            real = torch.cat([self.real, real], dim=1)
        self.keys, self.values, self.real = keys, values, real
        return keys, values, real


@dataclass
class PlainCache:
    layers: list[LayerCache]
    next_position: Tensor | None = None  # [B]: real tokens seen so far; None: a new request


def allowed_keys(real: Tensor, queries: int) -> Tensor:
    """``[B, 1, Tq, Tk]`` True where a query may read a key: causal, real keys only. The last
    ``queries`` of the ``Tk`` keys are the queries; a padded query reads itself, so no row is empty."""
    keys = real.shape[1]
    q_index = torch.arange(keys - queries, keys, device=real.device)[:, None]  # [Tq, 1]
    k_index = torch.arange(keys, device=real.device)[None, :]  # [1, Tk]
    causal = k_index <= q_index  # [Tq, Tk]
    return (causal & (real.bool()[:, None, :] | (k_index == q_index)))[:, None]  # [B, 1, Tq, Tk]


class PlainLayer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: Tensor, real: Tensor, cache: LayerCache, key_mask: "KeyMask") -> Tensor:
        """``real [B, T]`` of the new tokens; appends their keys and values to ``cache``."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)  # each [B, T, C]
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        k, v, real = cache.append(k, v, real)  # [B, H, T_so_far + T, D] twice, [B, T_so_far + T]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask(real, length))  # [B, H, T, D]
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))  # [B, T, C]
        return x + self.mlp(self.norm2(x))


KeyMask = Callable[[Tensor, int], Tensor]


def plain_capabilities(vocab_size: int, max_length: int, layers: int) -> dict:
    """What the plain decoder (and a port of it) declares to maskcheck."""
    return {
        "family": "decoder",
        "vocab_size": vocab_size,
        "max_length": max_length,
        "n_layers": layers,
        "has_cache": True,
        "derives_positions_from_mask": True,
        "pad_token_id": 0,
    }


def advance_positions(new: Tensor, cache: PlainCache) -> Tensor:
    """``[B, n]`` positions of the appended tokens (``new [B, n]`` 1 at real ones), counted
    over real tokens from where the cache left off; the cache's count moves past them."""
    start = torch.zeros_like(new[:, 0]) if cache.next_position is None else cache.next_position  # [B]
    cache.next_position = start + new.sum(-1)
    return start[:, None] + (new.cumsum(-1) - 1).clamp(min=0)  # [B, n]


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
        self.maskcheck_capabilities = plain_capabilities(vocab_size, max_length, layers)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.prefill(input_ids, attention_mask)[0]

    def prefill(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, cache: PlainCache | None = None
    ) -> tuple[Tensor, PlainCache]:
        """``cache``: an emptied cache (``reset``) to fill instead of a new one."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
        if cache is None:
            cache = PlainCache([LayerCache() for _ in range(self.maskcheck_capabilities["n_layers"])])
        return self._run(input_ids, mask, cache, allowed_keys)

    def step(self, cache: PlainCache, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, PlainCache]:
        new = attention_mask[:, -input_ids.shape[1] :].long()  # [B, n]: the appended tokens' mask
        return self._run(input_ids, new, cache, self.step_mask)

    def step_mask(self, real: Tensor, queries: int) -> Tensor:
        """The keys the appended tokens may read (a hook for the seeded bug)."""
        return allowed_keys(real, queries)

    # -- serving ------------------------------------------------------------------------------

    def rollback(self, cache: PlainCache, tokens: int) -> PlainCache:
        """Drop the last ``tokens`` tokens (rejected draft tokens), all of them real."""
        for layer in cache.layers:
            assert layer.keys is not None and layer.values is not None and layer.real is not None
            layer.keys, layer.values, layer.real = (
                layer.keys[:, :, :-tokens],
                layer.values[:, :, :-tokens],
                layer.real[:, :-tokens],
            )
        assert cache.next_position is not None
        cache.next_position = self.rolled_back_position(cache.next_position, tokens)
        return cache

    def rolled_back_position(self, next_position: Tensor, tokens: int) -> Tensor:
        return next_position - tokens

    def reorder(self, cache: PlainCache, index: Tensor) -> PlainCache:
        """Row ``i`` continues row ``index[i]`` (beam search, dropped or repeated rows)."""
        for layer in cache.layers:
            assert layer.keys is not None and layer.values is not None and layer.real is not None
            layer.keys, layer.real = layer.keys[index], layer.real[index]
            layer.values = self.reordered_values(layer.values, index)
        assert cache.next_position is not None
        cache.next_position = cache.next_position[index]
        return cache

    def reordered_values(self, values: Tensor, index: Tensor) -> Tensor:
        return values[index]

    def reset(self, cache: PlainCache) -> PlainCache:
        """Empty the cache for the next request."""
        for layer in self.layers_to_reset(cache):
            layer.keys = layer.values = layer.real = None
        cache.next_position = None
        return cache

    def layers_to_reset(self, cache: PlainCache) -> list[LayerCache]:
        return cache.layers

    def _run(self, ids: Tensor, new: Tensor, cache: PlainCache, key_mask: KeyMask) -> tuple[Tensor, PlainCache]:
        """``new [B, n]`` 1 at real tokens among ``ids``; positions continue the cache's count."""
        x = self.embed(ids) + self.position(advance_positions(new, cache))  # [B, n, C]
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer(x, new, layer_cache, key_mask)
        return self.head(self.norm(x)), cache


class StepReadsPadding(PlainDecoder):
    """A plain decoder whose decoding step forgets the padding mask: the left-padded slots
    in its cache are read by every new token."""

    def step_mask(self, real: Tensor, queries: int) -> Tensor:
        return allowed_keys(torch.ones_like(real), queries)


class RollbackKeepsPosition(PlainDecoder):
    """A plain decoder whose rollback drops the rejected tokens' keys but not their count:
    the tokens decoded after a rollback take positions past the ones they hold."""

    def rolled_back_position(self, next_position: Tensor, tokens: int) -> Tensor:
        return next_position


class ReorderKeysOnly(PlainDecoder):
    """A plain decoder whose row reorder moves the keys but not the values: after beam
    search reorders rows, each row reads its keys beside another row's values."""

    def reordered_values(self, values: Tensor, index: Tensor) -> Tensor:
        return values if values.shape[0] == index.numel() else values[index]


class ResetKeepsLastLayer(PlainDecoder):
    """A plain decoder whose reset empties every layer but the last: the next request's
    tokens read the previous request's keys there (one user's state reaches another)."""

    def layers_to_reset(self, cache: PlainCache) -> list[LayerCache]:
        return cache.layers[:-1]


class MaskIgnored(PlainDecoder):
    """A plain decoder whose forward ignores its attention_mask: padded slots are read as tokens."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return super().forward(input_ids)


class MaskFromPadIds(PlainDecoder):
    """A plain decoder whose forward ignores its attention_mask and masks the slots holding the
    pad id instead: right while the padded slots hold it, wrong for any other id there."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, (input_ids != self.maskcheck_capabilities["pad_token_id"]).long())


class MaskInverted(PlainDecoder):
    """A plain decoder whose forward reads its attention_mask as True = padding (passes
    ``attention_mask.bool()`` where PyTorch's key_padding_mask goes): it hides the real tokens."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, None if attention_mask is None else (~attention_mask.bool()).long())


SERVING_BUGS = {"rollback": RollbackKeepsPosition, "reorder": ReorderKeysOnly, "reset": ResetKeepsLastLayer}
MASK_BUGS = {"ignored": MaskIgnored, "from_pad_ids": MaskFromPadIds, "inverted": MaskInverted}


def plain_decoder(
    seed: int = 0, buggy: bool = False, serving_bug: str | None = None, mask_bug: str | None = None
) -> PlainDecoder:
    """The clean decoder, or one with a bug: ``buggy`` its step's mask, ``serving_bug`` one
    of :data:`SERVING_BUGS`, ``mask_bug`` one of :data:`MASK_BUGS` (the same weights: the
    seed draws them)."""
    torch.manual_seed(seed)
    cls = StepReadsPadding if buggy else PlainDecoder
    cls = SERVING_BUGS[serving_bug] if serving_bug else MASK_BUGS[mask_bug] if mask_bug else cls
    return cls().eval()
