"""Draw the effective mask: the measured influence matrix beside the mask a suite expects."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ..engine.influence import Influence


def draw_effective_mask(
    influence: Influence, expected: Tensor, path: str | Path, title: str, failed: bool = False
) -> Path:
    """Write a PNG: left, the expected mask; right, the measured influence (log scale)
    with leaks (influence where the mask forbids it) marked by red crosses, the threshold
    marked on the colour bar, padded output rows and input columns labelled. ``failed``: the suite failed,
    so a picture without leaks says the failure does not show in this one row."""
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
    bar = figure.colorbar(image, ax=right, shrink=0.8)
    if 0 < influence.threshold < math.inf:
        bar.ax.axhline(math.log10(influence.threshold), color="red", linewidth=2)
        bar.ax.text(
            1.6,
            math.log10(influence.threshold),
            "threshold",
            color="red",
            va="center",
            fontsize=8,
            transform=bar.ax.get_yaxis_transform(),
        )
    padded = [i for i in range(length_out) if not bool(influence.outputs[i])]
    if padded:  # rows that are not compared: padded outputs
        for axis in (left, right):
            axis.set_yticklabels([f"{i} pad" if i in padded else str(i) for i in range(length_out)])
    # The expected mask is restricted to real inputs, so a column no real output may read is padding.
    padded_inputs = [j for j in range(length_in) if not bool(expected[:, j].any())]
    if padded_inputs:
        for axis in (left, right):
            axis.set_xticklabels([f"{j}\npad" if j in padded_inputs else str(j) for j in range(length_in)])
    caption = ""
    if not math.isfinite(influence.threshold) or bool(torch.isnan(influence.diff[influence.outputs]).any()):
        caption = "the model's output is NaN or inf: no influence can be measured (the failing check says where)"
        right.text(0.5, 0.5, "NaN", color="red", fontsize=40, ha="center", va="center", transform=right.transAxes)
    elif failed and not leaks:
        caption = "no leak shows in this single unpadded row: the failure depends on the batch (padding, other rows); see the failing check"
    figure.suptitle(f"{title}\n{caption}" if caption else title)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
