"""The adapter protocol and its implementations (imported lazily: they pull in torch)."""

from .base import Adapter, AdapterError, Batch, Capabilities, check_logits

__all__ = ["Adapter", "AdapterError", "Batch", "Capabilities", "check_logits"]
