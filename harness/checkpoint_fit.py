"""Which transformers classes a checkpoint's tensors fit: for a checkpoint loaded under the wrong class.

A class fits when its parameter names, with layer and expert indices folded
(``model.layers.N.mlp.experts.N.w1``), are exactly the checkpoint's tensor names folded
the same way. Candidates are built on the meta device (no memory, milliseconds each) from
each causal-LM type's default config with its counts shrunk.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

INDEX = re.compile(r"\.\d+(?=\.|$)")


def folded(names: list[str] | tuple[str, ...] | set[str]) -> frozenset[str]:
    return frozenset(INDEX.sub(".N", name) for name in names)


def checkpoint_names(directory: str | Path) -> set[str]:
    """Every tensor name in a directory's safetensors files (headers only, no tensor is read)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names.update(handle.keys())
    return names


@lru_cache(maxsize=1)
def _class_templates() -> tuple[tuple[str, frozenset[str]], ...]:
    import torch
    import transformers

    from ..reference_models.hf_tiny import model_types, shrunk_config

    templates = []
    for model_type in model_types("causal-lm"):
        try:
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(shrunk_config(model_type, "counts"))
        except Exception:  # noqa: BLE001 - a type that cannot be built is no candidate
            continue
        names = set(model.state_dict())
        if getattr(model.config.get_text_config(), "tie_word_embeddings", False):  # saved once, under the embedding's name
            tied = getattr(model, "_tied_weights_keys", None) or {}
            names -= set(tied if isinstance(tied, (list, tuple, set)) else tied.keys())
        templates.append((type(model).__name__, folded(names)))
    return tuple(templates)


def matching_classes(names: set[str]) -> list[str]:
    """Causal-LM classes whose parameter names are exactly ``names`` (indices folded)."""
    wanted = folded(names)
    return [name for name, template in _class_templates() if template == wanted]
