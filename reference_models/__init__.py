"""Small, readable Transformer implementations and a catalogue of seeded bugs.

This package depends on torch and safetensors only, never on the rest of maskcheck.
"""

if not __name__.startswith("maskcheck."):  # pragma: no cover - a second copy of the package
    # Loaded by its bare name (the repository root on sys.path): a second module object
    # beside maskcheck.reference_models, and the name a user's own package may have.
    raise ImportError(f"import {__name__} as maskcheck.{__name__} (pip install -e . from the repository root)")

from .checkpoint import (
    CheckpointError,
    fingerprint_ids,
    load_checkpoint,
    read_config,
    read_fingerprint,
    save_checkpoint,
    weights_hash,
)
from .config import PRESETS, ModelConfig, preset
from .memory import MemoryEstimate, estimate_memory, parameter_count
from .model import IGNORE_INDEX, KVCache, ModelOutput, Transformer
from .shipped import SHIPPED, SHIPPED_HF

__all__ = [
    "IGNORE_INDEX",
    "PRESETS",
    "SHIPPED",
    "SHIPPED_HF",
    "CheckpointError",
    "KVCache",
    "MemoryEstimate",
    "ModelConfig",
    "ModelOutput",
    "Transformer",
    "estimate_memory",
    "fingerprint_ids",
    "load_checkpoint",
    "parameter_count",
    "preset",
    "read_config",
    "read_fingerprint",
    "save_checkpoint",
    "weights_hash",
]
