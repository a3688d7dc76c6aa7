"""Checkpoints shipped with maskcheck as package data, by name (``ref:NAME``).

``kv-retrieval``: a 2-layer decoder with token shift trained on the synthetic key-value
retrieval task of :mod:`maskcheck.reference_models.retrieval` (sequences up to 64 tokens). Its
training run is in its metadata; ``scripts/train_reference.py`` retrains it.
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).with_name("checkpoints")
SHIPPED: dict[str, Path] = {"kv-retrieval": CHECKPOINTS / "kv-retrieval.safetensors"}
