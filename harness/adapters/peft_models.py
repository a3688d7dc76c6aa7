"""PEFT models: a ``PeftModel`` audited as the transformers model it runs, adapter active.

A weight adapter (LoRA, IA3, LoHa, ...) puts its layers inside the base model's modules;
``PeftModel.forward`` and ``generate()`` only call the base model with them in place. So the
model to audit is ``peft_model.get_base_model()``, a ``PreTrainedModel`` with every suite's
coverage (its forward names its mask, cache and positions, which PeftModel's ``*args,
**kwargs`` hides), and the adapter's weights are what it computes with. That is measured,
not assumed: the PeftModel's logits must equal its base model's on a probe, or the model is
refused with the difference.

A prompt-learning adapter (prompt tuning, prefix tuning, P-tuning) is not inside the base
model: PeftModel prepends virtual tokens or a prefix cache to every call, so its base model
alone is another function. Those are refused in one line.

PEFT is imported only when the model handed in is one of its classes (it is never a
dependency of maskcheck).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .hf_loading import HFLoadError


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (any task's subclass); PEFT is not imported here."""
    if "peft" not in sys.modules:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def unwrap_peft(model: Any) -> tuple[Any, str]:
    """The transformers model ``model`` (a PeftModel) runs, its adapter's layers in place, and
    a line that says so; :class:`HFLoadError` for an adapter the base model does not hold."""
    config = model.active_peft_config
    kind = str(getattr(config.peft_type, "value", config.peft_type))
    if config.is_prompt_learning:
        raise HFLoadError(
            f"a {kind} PeftModel prepends virtual tokens or a prefix cache to every call, so its base model alone is "
            "another function: maskcheck audits weight adapters (LoRA, IA3, ...) through the base model they live in; "
            "audit the base model, or a weight adapter"
        )
    base = model.get_base_model()
    difference = _forward_difference(model, base)
    if difference is not None:
        raise HFLoadError(
            f"the {type(model).__name__}'s logits differ from its base model's by {difference:.3g} on a probe, so "
            "auditing the base model would not audit what it runs"
        )
    adapters = getattr(model, "active_adapters", None) or [model.active_adapter]
    targets = getattr(config, "target_modules", None)
    where = f" on {', '.join(sorted(targets))}" if isinstance(targets, (set, list, tuple)) else ""
    merged = any(getattr(layer, "merged", False) for layer in base.modules() if hasattr(layer, "merged_adapters"))
    return base, (
        f"{type(model).__name__}: {kind} adapter {', '.join(map(repr, adapters))}{where}"
        f"{' (merged)' if merged else ''}, audited through its base model {type(base).__name__} with the adapter "
        "active (their logits measured equal)"
    )


def _forward_difference(model: Any, base: Any) -> float | None:
    """The largest difference between the PeftModel's logits and its base model's on six
    seeded tokens; None when they are the same computation (equal within rounding)."""
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    parameter = next(base.parameters())
    ids = torch.randint(1, int(config.vocab_size), (1, 6), generator=torch.Generator().manual_seed(0)).to(
        parameter.device
    )  # [1, 6]
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(base.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    with torch.inference_mode():
        wrapped, own = model(**inputs).logits, base(**inputs).logits
    if wrapped.shape != own.shape:
        return float("inf")
    difference = float((wrapped.float() - own.float()).abs().max())
    return None if difference <= 1e-5 * max(1.0, float(own.float().abs().max())) else difference
