"""Draw the effective mask: the measured influence matrix beside the mask a suite expects."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from .influence import Influence


def draw_effective_mask(influence: Influence, expected: Tensor, path: str | Path, title: str) -> Path:
    """Write a PNG: left, the expected mask; right, the measured influence (log scale)
    with leaks (influence where the mask forbids it) marked by red crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    length_out, length_in = influence.diff.shape
    shown = torch.log10(influence.diff.clamp(min=1e-12)).masked_fill(~influence.outputs[:, None], float("nan"))
    leaks = (influence.measured & ~expected).nonzero().tolist()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6), constrained_layout=True)
    left.imshow(expected.float().numpy(), cmap="Greys", vmin=0, vmax=1.4)
    left.set_title("expected: input may influence output")
    image = right.imshow(shown.numpy(), cmap="viridis", vmin=-12, vmax=0)
    right.set_title(f"measured: log10 max |d log p| (threshold {influence.threshold:.1e})")
    if leaks:
        ys, xs = zip(*leaks)
        right.scatter(xs, ys, marker="x", color="red", s=60, linewidths=2, label=f"{len(leaks)} leaking cells")
        right.legend(loc="upper right", fontsize=8)
    for axis in (left, right):
        axis.set_xlabel("input position (perturbed)")
        axis.set_ylabel("output position")
        axis.set_xticks(range(length_in))
        axis.set_yticks(range(length_out))
    figure.colorbar(image, ax=right, shrink=0.8)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
