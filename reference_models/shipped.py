"""Checkpoints shipped with maskcheck as package data, by name (``ref:NAME``).

``kv-retrieval``: a 2-layer decoder with token shift trained on the synthetic key-value
retrieval task of :mod:`maskcheck.reference_models.retrieval` (sequences up to 64 tokens). Its
training run is in its metadata; ``scripts/train_reference.py`` retrains it.

``hf-llama``, ``hf-gemma``: Hugging Face checkpoint directories (audited as ``hf:PATH``; their
paths are in :data:`SHIPPED_HF`), each with the ``training.json`` of its run.
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).with_name("checkpoints")
SHIPPED: dict[str, Path] = {"kv-retrieval": CHECKPOINTS / "kv-retrieval.safetensors"}
#: Hugging Face checkpoint directories (``hf:PATH``): a Llama and a Gemma of the same widths, trained
#: by scripts/train_hf_checkpoint.py to continue repeated sequences (for norm_checkpoint's behaviour evidence)
SHIPPED_HF: dict[str, Path] = {"hf-llama": CHECKPOINTS / "hf-llama", "hf-gemma": CHECKPOINTS / "hf-gemma"}
