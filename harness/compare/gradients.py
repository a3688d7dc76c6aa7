"""Two backwards compared: which positions a gradient reaches, and where the two part.

A gradient check of the suites asks where a backward reaches (the token embeddings a
training step's loss differentiates into, the logits a loss reads) and judges by exact
zeros: a masked contribution, or one never read, is an exact zero in the backward pass.
compare asks the same of B against A: the positions a gradient reaches (a norm over the
same-shape rule's threshold at floor 0, scaled by the largest norm) must be the same in
both. Magnitudes are not compared: a loss normaliser is a convention (the loss_masking
suite's), and it scales every gradient alike.

Where the two reach different positions, :func:`module_output_gradients` records the
gradient at each module's output during the backward, in the order the backward makes
them (the last module first). The first module whose output's gradient differs, going
backward, is the one after which the backward parts: its gradient is computed from the
modules after it, which agree, so the difference enters in the computation that reads its
output (for a softmax whose backward ignores the mask: its attention's input projection).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..engine.tolerance import Tolerance
from .layers import Record, first_tensor, with_module_hooks


@dataclass(frozen=True)
class ReachComparison:
    """Where one backward reaches and another does not."""

    max_diff: float  # the largest norm on the side that reaches a position the other does not
    threshold: float  # that side's zero threshold (same-shape rule, floor 0, its largest norm)
    positions: list[list[int]]  # [row, position] reached by exactly one of the two
    # how the first position differs, in words ("B's gradient reaches it, A's is exactly zero")
    how: str

    @property
    def parts(self) -> bool:
        return bool(self.positions)


def reached(norms: Tensor, tolerance: Tolerance, dtype: str) -> tuple[Tensor, float]:
    """``norms [B, T]`` -> the positions a gradient reaches ``[B, T]`` (a non-finite norm
    reaches), and the zero threshold: the same-shape rule at floor 0, scaled by the largest
    finite norm."""
    norms = norms.double().cpu()
    finite = torch.isfinite(norms)
    scale = float(norms[finite].max()) if bool(finite.any()) else 0.0
    threshold = tolerance.same_shape(0.0, dtype, scale)
    return (norms > threshold) | ~finite, threshold


def compare_reach(a_norms: Tensor, b_norms: Tensor, tolerance: Tolerance, dtype: str) -> ReachComparison:
    """The positions A's and B's gradients reach, compared (``[B, T]`` norms of each)."""
    a_norms, b_norms = a_norms.double().cpu(), b_norms.double().cpu()
    a_reach, a_threshold = reached(a_norms, tolerance, dtype)
    b_reach, b_threshold = reached(b_norms, tolerance, dtype)
    differ = a_reach != b_reach  # [B, T]
    if not bool(differ.any()):
        # the closest B comes to parting: its largest norm where A's gradient is zero
        closest = float(b_norms.masked_fill(a_reach, 0.0).max()) if a_norms.numel() else 0.0
        return ReachComparison(closest, b_threshold, [], "")
    positions = differ.nonzero().tolist()
    b_only = differ & b_reach
    if bool(b_only.any()):
        measured = float(b_norms[b_only].nan_to_num(float("inf")).max())
        return ReachComparison(
            measured, b_threshold, positions, "B's gradient reaches positions where A's is exactly zero"
        )
    measured = float(a_norms[differ].nan_to_num(float("inf")).max())
    return ReachComparison(measured, a_threshold, positions, "B's gradient is exactly zero at positions A's reaches")


def module_output_gradients(model: torch.nn.Module, run: Callable[[Callable[[], None]], Any]) -> list[Record]:
    """The gradient at each module's output during the backward of the call ``run`` makes
    (``run(arm)`` calls ``arm()`` just before it), in the order the backward reaches them:
    the module that finished last first. A module whose output no gradient reaches has no
    record."""
    names: list[str] = []
    gradients: dict[int, Tensor] = {}
    calls: dict[str, int] = {}

    def hook_for(name: str) -> Callable:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is None or not tensor.is_floating_point() or not tensor.requires_grad:
                return
            count = calls.get(name, 0)
            calls[name] = count + 1
            index = len(names)
            names.append(name if not count else f"{name}#{count}")

            def keep(gradient: Tensor) -> None:
                gradients[index] = gradient.detach().float().cpu().clone()

            tensor.register_hook(keep)

        return hook

    with_module_hooks(model, hook_for, run)
    return [Record(names[i], gradients[i]) for i in reversed(range(len(names))) if i in gradients]


__all__ = ["ReachComparison", "compare_reach", "module_output_gradients", "reached"]
