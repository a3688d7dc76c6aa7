"""Adapter for a plain ``nn.Module`` or callable that returns logits.

Such a model cannot describe itself, so its author declares :class:`Capabilities` and
the mask convention it expects:

- ``"keep"``: 1/True = real token (Hugging Face), passed through unchanged;
- ``"ignore"``: True = padding, as PyTorch's ``key_padding_mask``; the adapter inverts.

The calling convention, the same for every plain module::

    model(input_ids, attention_mask, position_ids=..., segment_ids=...) -> logits [B, T, V]

``input_ids [B, T]`` first; the mask second, in the declared convention, when
``takes_attention_mask``; ``position_ids`` as a keyword when ``takes_position_ids`` (and
for ``packing="position_ids"``), ``segment_ids`` as a keyword for ``packing="segment_ids"``
(0, 1, 2 ... per packed sequence, -1 at padding). A capability the forward cannot take is
refused when the adapter is built. The output may also be a tuple whose first item is
the logits, or an object with ``.logits``. A loss is ``loss_fn(logits, labels)`` with
unshifted labels and -100 ignored.

A KV cache, for ``has_cache=True``, is two methods on the module::

    prefill(input_ids [B, T], attention_mask [B, T]) -> (logits [B, T, V], cache)
    step(cache, input_ids [B, n], attention_mask [B, T + n]) -> (logits [B, n, V], cache)

``step`` gets the mask of every token so far (in the declared convention), so a model
can place left-padded rows; the cache is the module's own object, copied with
``copy.deepcopy`` when a check branches. ``examples/cached_decoder.py`` implements it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import Tensor

from .base import Adapter, Batch, Capabilities, ForwardKeywords, call_model

MaskConvention = Literal["keep", "ignore"]
CACHE_METHODS = ("prefill", "step")


@dataclass
class ModuleState:
    cache: Any  # the module's own cache object
    mask: Tensor  # [B, T_so_far], 1 = real token


class ModuleAdapter(Adapter):
    def __init__(
        self,
        model: Callable[..., Any],
        capabilities: Capabilities,
        *,
        mask_convention: MaskConvention = "keep",
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        spec: str = "<module>",
    ) -> None:
        if mask_convention not in ("keep", "ignore"):
            raise ValueError(
                f"mask_convention must be 'keep' (1 = real token) or 'ignore' (True = padding), got {mask_convention!r}"
            )
        if loss_fn is None and capabilities.has_loss:
            raise ValueError("has_loss=True needs loss_fn(logits, labels)")
        missing = [name for name in CACHE_METHODS if not callable(getattr(model, name, None))]
        if capabilities.has_cache and missing:
            raise ValueError(
                f"has_cache=True needs the module's cache methods {', '.join(missing)}(...): see maskcheck.harness.adapters.module"
            )
        keywords = ForwardKeywords.of(model)
        needed = {
            "takes_position_ids": "position_ids",
            "packing=position_ids": "position_ids",
            "packing=segment_ids": "segment_ids",
        }
        declared = {
            "takes_position_ids": capabilities.takes_position_ids,
            "packing=position_ids": capabilities.packing == "position_ids",
            "packing=segment_ids": capabilities.packing == "segment_ids",
        }
        for what, keyword in needed.items():
            if declared[what] and not keywords.accepts(keyword):
                raise ValueError(
                    f"the capabilities declare {what}, but the model's forward takes no {keyword!r} keyword to pass it in"
                )
        super().__init__(model, capabilities)
        self.mask_convention = mask_convention
        self.loss_fn = loss_fn
        self.spec = spec

    def _mask(self, mask: Tensor) -> Tensor:
        """``mask`` (1 = real token) in the convention the model declared."""
        return mask.bool() if self.mask_convention == "keep" else ~mask.bool()

    def _logits(self, batch: Batch) -> Tensor:
        args: list[Any] = [batch.input_ids]
        if self.capabilities.takes_attention_mask:
            args.append(
                self._mask(
                    batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
                )
            )
        keywords: dict[str, Any] = {}
        if batch.position_ids is not None and (
            self.capabilities.takes_position_ids or self.capabilities.packing == "position_ids"
        ):
            keywords["position_ids"] = batch.position_ids
        if batch.segment_ids is not None and self.capabilities.packing == "segment_ids":
            keywords["segment_ids"] = batch.segment_ids
        return _logits_of(call_model(self.model, *args, **keywords))

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        assert self.loss_fn is not None
        return self.loss_fn(self._logits(batch), labels)

    def _prefill(self, batch: Batch) -> tuple[Tensor, ModuleState]:
        mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
        logits, cache = call_model(self.model.prefill, batch.input_ids, self._mask(mask))  # type: ignore[attr-defined]
        return _logits_of(logits), ModuleState(cache, mask)

    def _step(self, state: ModuleState, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, ModuleState]:
        appended = attention_mask if attention_mask is not None else torch.ones_like(tokens)
        mask = torch.cat([state.mask, appended.to(state.mask.dtype)], dim=1)  # [B, T + n]
        logits, cache = call_model(self.model.step, state.cache, tokens, self._mask(mask))  # type: ignore[attr-defined]
        return _logits_of(logits), ModuleState(cache, mask)

    def fork(self, state: ModuleState) -> ModuleState:
        return ModuleState(copy.deepcopy(state.cache), state.mask)


def _logits_of(out: Any) -> Any:
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return out
