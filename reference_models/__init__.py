"""Small, readable Transformer implementations and a catalogue of seeded bugs.

This package depends on torch and safetensors only, never on the rest of maskcheck.
"""

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
from .shipped import SHIPPED

__all__ = [
    "IGNORE_INDEX",
    "PRESETS",
    "SHIPPED",
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
