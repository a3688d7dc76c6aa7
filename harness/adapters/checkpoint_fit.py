"""Which transformers classes a checkpoint's tensors fit: for a checkpoint loaded under the wrong class.

A class fits when its parameter names, with layer and expert indices folded
(``model.layers.N.mlp.experts.N.w1``), are exactly the checkpoint's tensor names folded
the same way. Candidates are built on the meta device (no memory, milliseconds each) from
each causal-LM type's default config with its counts shrunk.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

INDEX = re.compile(r"\.\d+(?=\.|$)")


def tied_names(model: Any) -> set[str]:
    """The parameter names a model ties to another (``lm_head.weight`` to the embeddings), in
    either form transformers has declared them (a list, or a dict of tied -> source)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied if isinstance(tied, (list, tuple, set)) else tied.keys())


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


@dataclass(frozen=True)
class ClassTemplate:
    name: str
    parameters: frozenset[str]  # every parameter name, indices folded
    head: frozenset[str]  # the names tied to the embeddings when the config ties them (lm_head.weight)
    ties_by_default: bool

    @property
    def saved(self) -> frozenset[str]:
        """The names a checkpoint of the default config holds: a tied head is saved once, under the embedding's name."""
        return self.parameters - self.head if self.ties_by_default else self.parameters


def cache_directory() -> Path:
    """Where maskcheck keeps what it measured once per installed library version."""
    configured = os.environ.get("MASKCHECK_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maskcheck"


@lru_cache(maxsize=1)
def _class_templates() -> tuple[ClassTemplate, ...]:
    """Every causal-LM class's parameter names: built once per transformers version (seconds:
    every class on the meta device) and kept in :func:`cache_directory`."""
    import transformers

    path = cache_directory() / f"class-templates-transformers-{transformers.__version__}.json"
    try:
        return tuple(
            ClassTemplate(r["name"], frozenset(r["parameters"]), frozenset(r["head"]), r["ties_by_default"])
            for r in json.loads(path.read_text())
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    templates = _build_class_templates()
    rows = [
        {
            "name": t.name,
            "parameters": sorted(t.parameters),
            "head": sorted(t.head),
            "ties_by_default": t.ties_by_default,
        }
        for t in templates
    ]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(rows))
        scratch.replace(path)  # atomic: parallel workers never read half a file
    except OSError:  # a read-only home only costs the next run the 15 s again
        pass
    return templates


def _build_class_templates() -> tuple[ClassTemplate, ...]:
    import torch
    import transformers

    from ...reference_models.hf_tiny import model_types, shrunk_config

    templates = []
    for model_type in model_types("causal-lm"):
        try:
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(shrunk_config(model_type, "counts"))
        except Exception:  # noqa: BLE001 - a type that cannot be built is no candidate
            continue
        head = folded(tied_names(model))
        ties = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
        templates.append(ClassTemplate(type(model).__name__, folded(set(model.state_dict())), head, ties))
    return tuple(templates)


def matching_classes(names: set[str]) -> list[str]:
    """Causal-LM classes whose saved tensor names are exactly ``names`` (indices folded)."""
    wanted = folded(names)
    return [t.name for t in _class_templates() if t.saved == wanted]


def classes_with_parameters(names: set[str]) -> list[str]:
    """Causal-LM classes whose parameter names, the output head aside, are exactly ``names``
    (the head aside too): whether a model ties its head is its config's choice, not its class's."""
    return [t.name for t in _class_templates() if t.parameters - t.head == folded(names) - t.head]
