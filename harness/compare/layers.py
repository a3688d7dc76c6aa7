"""Where two implementations part: the first module whose output differs.

Every module's output on one call (a forward, or the last operation of a decode) is
recorded by forward hooks, in the order modules finish, so a module comes before the
modules that read its output. The two models' records are matched by a mapping the user
gives (``{A's module name: B's}``), else by name where both trees have the same names,
else by order and shape. The first matched pair whose outputs differ by more than rounding
allows (the tolerance model's term per unit of magnitude) is where they part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..engine.tolerance import EPS, Tolerance

#: how far ahead in B's records order matching looks for a module of the same shape
LOOKAHEAD = 16


@dataclass(frozen=True)
class Record:
    name: str  # the module's name in its model, "#k" added for its k-th call after the first
    output: Tensor  # its output (the first tensor of a tuple or model output), float32 on the CPU


@dataclass(frozen=True)
class FirstDifference:
    a_name: str
    b_name: str
    relative: float  # max |a - b| / max |a|
    threshold: float  # the relative difference rounding allows
    shape: tuple[int, ...]
    positions: list[list[int]]  # [row, position] where it differs, for outputs [B, T, ...]
    compared: int  # matched modules compared before and at it
    matching: str  # "mapping", "name" or "order"
    # (A's module name, relative difference at each position) for every matched module whose
    # output is [B, T, ...] over the call's positions, in order: where the two part, per layer
    profile: tuple[tuple[str, tuple[float, ...]], ...] = ()
    # True: the records are the gradients at the modules' outputs, last module first
    # (compare/gradients.py): the first module going backward whose output's gradient differs
    backward: bool = False

    def describe(self) -> str:
        where = f" at [row, position] {self.positions[:6]}" if self.positions else ""
        names = self.a_name if self.a_name == self.b_name else f"{self.a_name} (A) / {self.b_name} (B)"
        first, of, earlier = (
            ("first differing module going backward", "gradient at its output", "later ones (in the forward)")
            if self.backward
            else ("first differing module", "output", "earlier ones")
        )
        return (
            f"{first}: {names}, {of} {list(self.shape)}, relative difference {self.relative:.3g} "
            f"> {self.threshold:.3g}{where} (modules matched by {self.matching}; "
            f"{self.compared - 1} {earlier} agree)"
        )


def relative_tolerance(tolerance: Tolerance, dtype: str) -> float:
    """The largest difference, relative to a tensor's magnitude, that rounding alone makes in
    one computation done two ways: the shape-change rule's term per unit of scale."""
    return tolerance.shape_change_ulps * EPS[dtype]


def first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, Tensor):
                return item
    return None


def module_outputs(model: torch.nn.Module, run: Callable[[Callable[[], None]], Any]) -> list[Record]:
    """The outputs of ``model``'s modules during the call ``run`` makes: ``run(arm)`` calls
    ``arm()`` just before the call to record (a decode's last step), then makes it."""
    records: list[Record] = []
    calls: dict[str, int] = {}

    def hook_for(name: str) -> Callable:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is None or not tensor.is_floating_point():
                return
            count = calls.get(name, 0)
            calls[name] = count + 1
            records.append(Record(name if not count else f"{name}#{count}", tensor.detach().float().cpu().clone()))

        return hook

    with_module_hooks(model, hook_for, run)
    return records


def with_module_hooks(
    model: torch.nn.Module, hook_for: Callable[[str], Callable], run: Callable[[Callable[[], None]], Any]
) -> None:
    """Make the call ``run`` makes with ``hook_for(name)`` as a forward hook on every named
    module of ``model``, put on when ``run`` calls ``arm()`` and taken off after."""
    handles: list[Any] = []

    def arm() -> None:
        handles.extend(module.register_forward_hook(hook_for(name)) for name, module in model.named_modules() if name)

    try:
        run(arm)
    finally:
        for handle in handles:
            handle.remove()


def matched(
    a: list[Record], b: list[Record], mapping: Mapping[str, str] | None
) -> tuple[list[tuple[Record, Record]], str]:
    if mapping:
        by_name = {r.name: r for r in b}
        return [(r, by_name[mapping[r.name]]) for r in a if mapping.get(r.name) in by_name], "mapping"
    if {r.name for r in a} == {r.name for r in b}:
        by_name = {r.name: r for r in b}
        return [(r, by_name[r.name]) for r in a], "name"
    pairs, start = [], 0
    for record in a:
        for j in range(start, min(len(b), start + LOOKAHEAD)):
            if b[j].output.shape == record.output.shape:
                pairs.append((record, b[j]))
                start = j + 1
                break
    return pairs, "order"


def first_difference(
    a: list[Record], b: list[Record], relative_threshold: float, rows: int, mapping: Mapping[str, str] | None = None
) -> FirstDifference | None:
    """The first matched module whose outputs differ beyond ``relative_threshold`` of the
    output's magnitude; None when every matched one agrees. ``rows``: the call's batch size,
    so that outputs ``[B, T, ...]`` report the rows and positions that differ."""
    pairs, how = matched(a, b, mapping)
    profile = per_position_profile(pairs, rows)
    for count, (x, y) in enumerate(pairs, start=1):
        if x.output.shape != y.output.shape:
            return FirstDifference(
                x.name, y.name, float("inf"), relative_threshold, tuple(x.output.shape), [], count, how, profile
            )
        scale = float(x.output.abs().max()) if x.output.numel() else 0.0
        diff = (x.output - y.output).abs()
        if not bool(torch.isfinite(diff).all()):
            relative = float("inf")
        else:
            relative = float(diff.max()) / scale if scale > 0 else float(diff.max() > 0) * float("inf")
        if relative > relative_threshold:
            positions: list[list[int]] = []
            if diff.dim() >= 3 and diff.shape[0] == rows:  # [B, T, ...]: a row's positions
                per_position = diff.flatten(2).amax(-1)  # [B, T]
                over = (per_position > relative_threshold * scale).nonzero().tolist()
                positions = [[int(r), int(t)] for r, t in over]
            return FirstDifference(
                x.name, y.name, relative, relative_threshold, tuple(x.output.shape), positions, count, how, profile
            )
    return None


def per_position_profile(pairs: list[tuple[Record, Record]], rows: int) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """Each matched module's relative difference at each position (the largest over rows and
    features, over the largest magnitude of A's output), for outputs ``[B, T, ...]`` of the
    call's ``rows`` and its longest ``T`` (a decode step's tokens, or the forward's positions)."""
    shaped = [
        (x, y)
        for x, y in pairs
        if x.output.dim() >= 3 and x.output.shape[0] == rows and x.output.shape == y.output.shape
    ]
    if not shaped:
        return ()
    length = max(x.output.shape[1] for x, _ in shaped)
    profile = []
    for x, y in shaped:
        if x.output.shape[1] != length:
            continue
        scale = float(x.output.abs().max()) or 1.0
        per_position = (x.output - y.output).abs().transpose(0, 1).flatten(1).amax(-1) / scale  # [T]
        profile.append((x.name, tuple(float(v) for v in per_position)))
    return tuple(profile)
