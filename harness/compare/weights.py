"""One model's weights loaded into another under a key mapping, every tensor accounted for.

A port renames modules (``model.layers.0.self_attn.q_proj`` becomes ``blocks.0.attn.wq``);
compare then needs both to hold the same numbers. Every tensor of A's state dict is read
and placed, and every parameter and persistent buffer of B is loaded, or the load stops
and names what is left over: a mapping that silently leaves B's random init in place
would make compare report a "difference" that is only a missing tensor. Tied parameters
(an output head tied to the embeddings, as checkpoint fit reads them) count as loaded
with what they are tied to.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..adapters.checkpoint_fit import tied_names

KeyMapping = Mapping[str, str | None] | Callable[[str], str | None]


class WeightsMismatch(ValueError):
    """A's tensors and B's parameters do not correspond one to one under the mapping."""


def name_map(value: Any, what: str) -> dict[str, Any] | None:
    """A mapping of names given as a JSON file's path, inline JSON or pairs (``--weights``,
    ``--map``, a configured pair's ``weights`` and ``map``); ValueError says which in one line."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, tuple):
        return dict(value)
    path = Path(value)
    text = path.read_text() if path.is_file() else value
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what} is neither a JSON file nor inline JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{what} must be a JSON object of names to names")
    return parsed


def mapped_name(mapping: KeyMapping | None, name: str) -> str | None:
    if mapping is None:
        return name
    if callable(mapping):
        return mapping(name)
    return mapping.get(name, name)


def load_weights(source: torch.nn.Module, target: torch.nn.Module, mapping: KeyMapping | None = None) -> dict[str, Any]:
    """Load ``source``'s state dict into ``target`` under ``mapping`` (A's name -> B's; None
    drops a tensor on purpose, and the summary counts it). Raises :class:`WeightsMismatch`
    naming every tensor that has no place, every shape that differs and every parameter left
    unloaded. Returns the accounting: tensors read, loaded, dropped, tied."""
    state = source.state_dict()
    wanted = target.state_dict()
    tied = tied_names(target)
    loaded: dict[str, torch.Tensor] = {}
    dropped, unknown, misshapen, twice = [], [], [], []
    for name, tensor in state.items():
        destination = mapped_name(mapping, name)
        if destination is None:
            dropped.append(name)
        elif destination not in wanted:
            unknown.append(f"{name} -> {destination}")
        elif tuple(wanted[destination].shape) != tuple(tensor.shape):
            misshapen.append(f"{name} {list(tensor.shape)} -> {destination} {list(wanted[destination].shape)}")
        elif destination in loaded:
            twice.append(destination)
        else:
            loaded[destination] = tensor
    missing = sorted(set(wanted) - set(loaded) - tied)
    problems = [
        (unknown, "tensors of A with no parameter of that name in B"),
        (misshapen, "tensors whose shapes differ"),
        (twice, "parameters of B that two of A's tensors map to"),
        (missing, "parameters of B that no tensor of A loads"),
    ]
    said = [
        f"{len(names)} {what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}"
        for names, what in problems
        if names
    ]
    if said:
        raise WeightsMismatch("A's weights do not fit B under the mapping: " + "; ".join(said))
    target.load_state_dict(loaded, strict=False)
    if hasattr(target, "tie_weights"):
        target.tie_weights()
    return {"read": len(state), "loaded": len(loaded), "dropped": dropped, "tied": sorted(tied & set(wanted))}
