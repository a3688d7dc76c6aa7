"""Adapter for a plain ``nn.Module`` or callable ``f(input_ids, attention_mask) -> logits``.

Such a model cannot describe itself, so its author declares :class:`Capabilities`
and the mask convention it expects:

- ``"keep"``: 1/True = real token (Hugging Face), passed through unchanged;
- ``"ignore"``: True = padding, as PyTorch's ``key_padding_mask``; the adapter inverts.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import torch
from torch import Tensor

from .base import Adapter, Batch, Capabilities, call_model

MaskConvention = Literal["keep", "ignore"]


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
            raise ValueError(f"mask_convention must be 'keep' (1 = real token) or 'ignore' (True = padding), got {mask_convention!r}")
        if capabilities.has_cache:
            raise ValueError("a plain module has no cache protocol; wrap it in an Adapter subclass to test its cache")
        if loss_fn is None and capabilities.has_loss:
            raise ValueError("has_loss=True needs loss_fn(logits, labels)")
        super().__init__(model, capabilities)
        self.mask_convention = mask_convention
        self.loss_fn = loss_fn
        self.spec = spec

    def _logits(self, batch: Batch) -> Tensor:
        args: list[Any] = [batch.input_ids]
        if self.capabilities.takes_attention_mask:
            mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
            args.append(mask.bool() if self.mask_convention == "keep" else ~mask.bool())
        out = call_model(self.model, *args)
        if hasattr(out, "logits"):
            out = out.logits
        elif isinstance(out, (tuple, list)) and out:
            out = out[0]
        return out

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        assert self.loss_fn is not None
        return self.loss_fn(self._logits(batch), labels)
