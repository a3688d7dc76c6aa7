"""What serving does with a decoding state besides appending to it, on every adapter.

A decoding state (what :meth:`Adapter.prefill` returns) is the serving state of a model.
Serving rolls it back after rejected draft tokens (speculative decoding), reorders and
selects its rows (beam search, finished rows dropped, rows repeated for sampling), copies
a prompt's state for many requests, and resets a cache object for the next request.
Each operation is the model's own (transformers' ``Cache`` methods, the plain-module
protocol of :mod:`.module`, the reference model's ``KVCache``); adapters only translate.

An operation the model's cache declares it cannot do raises :class:`ServingUnsupported`
with that declaration: its check is ``not_applicable`` with the reason, never a pass.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from .base import ServingUnsupported

#: how rows are rearranged: ``reorder`` keeps the batch size (beam search's ``beam_idx``,
#: rows may repeat), ``select`` keeps some rows (finished rows dropped), ``repeat`` repeats
#: every row in place (``repeat_interleave``, sampling several continuations of a prompt)
RowOperation = Literal["reorder", "select", "repeat"]
ROW_OPERATIONS: tuple[RowOperation, ...] = ("reorder", "select", "repeat")
#: transformers' ``Cache`` method for each row operation
CACHE_ROW_METHODS: dict[RowOperation, str] = {
    "reorder": "reorder_cache",
    "select": "batch_select_indices",
    "repeat": "batch_repeat_interleave",
}

__all__ = ["ROW_OPERATIONS", "RowOperation", "ServingUnsupported", "crop_cache", "rearrange_cache", "reset_cache"]


def repeats_of(index: Tensor, rows: int) -> int:
    """``r`` when ``index`` is ``arange(rows).repeat_interleave(r)``; raises otherwise."""
    r = index.numel() // max(rows, 1)
    expected = torch.arange(rows, device=index.device).repeat_interleave(r)
    if r < 1 or index.numel() != rows * r or not torch.equal(index, expected):
        raise ValueError(f"a 'repeat' index must be arange({rows}).repeat_interleave(r), got {index.tolist()}")
    return r


def select_rows(value: Any, index: Tensor, rows: int) -> Any:
    """``value`` with its batch rows taken at ``index``: tensors whose first dimension is
    ``rows``, and the same inside tuples, lists, dicts and model outputs; the rest as is."""
    if isinstance(value, Tensor):
        return value.index_select(0, index.to(value.device)) if value.dim() and value.shape[0] == rows else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(select_rows(v, index, rows) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(select_rows(v, index, rows) for v in value)
    if isinstance(value, dict):  # also transformers' ModelOutput, an ordered dict
        selected = type(value)(**{k: select_rows(v, index, rows) for k, v in value.items()})
        return selected
    return value


# -- transformers' Cache -----------------------------------------------------------------


def is_transformers_cache(value: Any) -> bool:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(value, Cache)


def layer_names(cache: Any) -> str:
    """The cache's layer classes, counted: "2 x DynamicSlidingWindowLayer, 1 x DynamicLayer"."""
    caches = [cache.self_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
    names: dict[str, int] = {}
    for part in caches:
        for layer in getattr(part, "layers", []):
            names[type(layer).__name__] = names.get(type(layer).__name__, 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in names.items()) or type(cache).__name__


def crop_cache(cache: Any, tokens: int) -> None:
    """Roll ``cache`` back by ``tokens`` as assisted decoding does (``crop(-tokens)``), after
    asking it whether it can (``is_croppable``, False for recurrent and state-space layers)."""
    if not is_transformers_cache(cache):
        raise ServingUnsupported(
            f"the model's decoding state is a {type(cache).__name__}, not a transformers Cache: it has no crop()"
        )
    if not cache.is_croppable:
        raise ServingUnsupported(
            f"the cache declares it cannot roll back (Cache.is_croppable is False; layers: {layer_names(cache)}), "
            "so generate() refuses assisted decoding for this model"
        )
    cache.crop(-tokens)


def rearrange_cache(cache: Any, operation: RowOperation, index: Tensor, rows: int) -> None:
    """Apply a row operation with the cache's own method (beam search's, ``generate()``'s)."""
    method = CACHE_ROW_METHODS[operation]
    if not is_transformers_cache(cache):
        raise ServingUnsupported(
            f"the model's decoding state is a {type(cache).__name__}, not a transformers Cache: it has no {method}()"
        )
    parts = (
        [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
    )
    for part in parts:
        missing = sorted({type(layer).__name__ for layer in part.layers if not hasattr(layer, method)})
        if missing:
            raise ServingUnsupported(
                f"{', '.join(missing)} has no {method}(), so the cache cannot {operation} its rows"
            )
    try:
        if operation == "repeat":
            cache.batch_repeat_interleave(repeats_of(index, rows))
        else:
            getattr(cache, method)(index.to(_cache_device(cache)))
    except NotImplementedError as exc:
        raise ServingUnsupported(f"the cache's {method}() is not implemented: {exc}") from exc


def reset_cache(cache: Any) -> None:
    if not is_transformers_cache(cache):
        raise ServingUnsupported(
            f"the model's decoding state is a {type(cache).__name__}, not a transformers Cache: it has no reset()"
        )
    cache.reset()


def _cache_device(cache: Any) -> torch.device | str:
    parts = [cache.self_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
    for part in parts:
        for layer in getattr(part, "layers", []):
            keys = getattr(layer, "keys", None)
            if isinstance(keys, Tensor):
                return keys.device
    return "cpu"
