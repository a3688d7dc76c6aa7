"""Leakage versus floating-point noise: thresholds from measured noise floors.

Two kinds of comparison, two rules (docs/design.md, "Deciding \"equal\""):

* **same shape** (ids changed at masked positions, future tokens changed): a masked
  contribution is an exact zero, so the difference of a correct model equals the
  *repeat floor*, measured in the same forward pass as the difference between a row
  and an identical copy of it. ``threshold = 2 * floor + same_shape_ulps * eps * scale``,
  where ``eps`` is float32's when the floor is 0 (a bitwise-reproducible kernel), even
  for a bfloat16 or float16 model: the low-precision term would hide leaks.
* **shape changing** (padded vs unpadded, extra padding, other batch rows of another
  length): reductions run over other lengths and round differently. Following the
  FlashAttention rule ``err(test) <= k * err(reference) + arithmetic floor``:
  ``threshold = k * floor + shape_change_ulps * eps * scale``.

``eps`` is the machine epsilon of the model's compute dtype; ``scale`` is the largest
magnitude among the compared logits and log-probabilities (at least 1), because
rounding errors grow with the values rounded. Differences are taken between
float64 log-softmax values at the compared positions only.

The noise floors behind the defaults, and the margin the defaults keep over them, are
measured by ``python scripts/noise_floor.py`` and tabled in docs/tolerance.md (the one
place they are kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10, "float64": 2.0**-52}


@dataclass(frozen=True)
class Tolerance:
    same_shape_ulps: float
    shape_change_k: float
    shape_change_ulps: float
    # Low precision only: how far this model's log-probabilities lie from its float32 twin's,
    # in units of eps * scale (FlashAttention's err_ref), measured by the audit itself.
    reference_error: float = 0.0

    def same_shape(self, floor: float, dtype: str, scale: float) -> float:
        # A repeat floor of 0 shows the kernel bitwise reproducible: a masked change is then
        # an exact zero in any dtype, so the arithmetic term is float32's at most. Only a
        # kernel that rounds a copy differently earns the low-precision dtype's eps, whose
        # term (0.08 at scale 5 in bfloat16) would hide a leak of that size.
        eps = EPS[dtype] if floor > 0 else min(EPS[dtype], EPS["float32"])
        return 2.0 * floor + self.same_shape_ulps * eps * scale

    def shape_change(self, floor: float, dtype: str, scale: float) -> float:
        # Two low-precision computations, each within err_ref of the float32 result, may differ by twice it.
        return self.shape_change_k * floor + (self.shape_change_ulps + 2.0 * self.reference_error) * EPS[dtype] * scale


# (device type, dtype) -> defaults; "*" matches any device. Override per key in
# [tool.maskcheck.tolerance."cpu.float32"] (same_shape_ulps, shape_change_k, shape_change_ulps).
DEFAULT_TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("cpu", "float32"): Tolerance(same_shape_ulps=8, shape_change_k=4, shape_change_ulps=32),
    ("cuda", "float32"): Tolerance(same_shape_ulps=16, shape_change_k=4, shape_change_ulps=64),
    ("*", "bfloat16"): Tolerance(same_shape_ulps=2, shape_change_k=4, shape_change_ulps=8),
    ("*", "float16"): Tolerance(same_shape_ulps=4, shape_change_k=4, shape_change_ulps=16),
    ("*", "float64"): Tolerance(same_shape_ulps=64, shape_change_k=4, shape_change_ulps=4096),
}


def tolerance_for(device: str, dtype: str, overrides: dict[str, dict[str, float]] | None = None) -> Tolerance:
    """The tolerance for a device and dtype; ``overrides`` maps ``"cpu.float32"`` to field values."""
    device_type = device.split(":")[0]
    base = DEFAULT_TOLERANCES.get((device_type, dtype)) or DEFAULT_TOLERANCES.get(("*", dtype))
    if base is None:
        raise ValueError(f"no tolerance for dtype {dtype!r}; known: {sorted({d for _, d in DEFAULT_TOLERANCES})}")
    for key in (f"*.{dtype}", f"{device_type}.{dtype}"):
        if overrides and key in overrides:
            base = replace(base, **{k: float(v) for k, v in overrides[key].items()})
    return base


@dataclass
class Comparison:
    """The difference between two logit tensors at the compared positions.

    Kept as one value per compared position with its place, not as a ``[B, T]`` table: a
    passing case (nearly all of them) needs only the largest difference, and building the
    table took two tensor ops of every comparison."""

    max_diff: float  # inf when any compared position is not finite
    scale: float
    diff: Tensor  # [N] float64, max over the vocabulary at each compared position; inf where not finite
    index: tuple[Tensor, Tensor]  # ([N], [N]): the row and the position of each
    shape: tuple[int, int]  # [B, T], the rows and positions the index points into
    rows: list[int] | None = None  # the label of each row, when not its index
    index_name: str = "row"  # what the row labels count (batch rows, packed sequences)
    quantity: str = "log p"  # what was compared: log-probabilities, or the raw outputs ("output")

    @property
    def nonfinite(self) -> list[list[int]]:
        """[row, position] pairs with NaN/inf in the compared logits."""
        return self._labelled(torch.isinf(self.diff)) if self.max_diff == float("inf") else []

    def positions_over(self, threshold: float) -> list[list[int]]:
        return self._labelled(self.diff > threshold)

    @property
    def per_position(self) -> Tensor:
        """``[B, T]`` float64, the difference at each compared position (0 where not compared)."""
        table = torch.zeros(self.shape, dtype=torch.float64, device=self.diff.device)
        table[self.index] = self.diff
        return table

    def _labelled(self, selected: Tensor) -> list[list[int]]:
        labels = self.rows or range(self.shape[0])
        rows, positions = self.index[0][selected].tolist(), self.index[1][selected].tolist()
        return [[labels[b], t] for b, t in zip(rows, positions)]


def compare_rows(
    reference: Tensor, test: Tensor, normalise: bool = True, with_scale: bool = True
) -> tuple[Tensor, float, float]:
    """Per-row max |difference| between ``[N, V]`` rows of float64 log-softmax (``normalise=False``:
    of the values as given), ``inf`` where either row holds NaN or inf; its largest value; and
    the scale, the largest compared logit or log-probability magnitude (at least 1; 1 when
    ``with_scale`` is off, for a noise floor, which needs no threshold).

    Bitwise-equal finite rows (every same-shape check of a correct model, and every repeat
    floor) skip the float64 pass: with a 50k vocabulary that pass is most of a check's cost.
    On a small model the small ops count too: the scale doubles as the finiteness test.
    """
    if normalise and reference.shape[-1] == 1:
        # log_softmax over one value is 0 whatever the value: every leak would pass unseen.
        raise ValueError("a single value per position cannot be compared as log-probabilities; compare it raw")
    if reference.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=reference.device), 0.0, 1.0
    if torch.equal(reference, test):  # False when either holds NaN
        # Bitwise-equal rows: only an inf is left to rule out, and the largest magnitude,
        # which the scale needs anyway, is finite exactly when every value is.
        largest = _largest(reference, normalise)
        if math.isfinite(largest):
            return (
                torch.zeros(reference.shape[0], dtype=torch.float64, device=reference.device),
                0.0,
                (max(1.0, largest) if with_scale else 1.0),
            )
    ref, tst = reference.double(), test.double()
    if normalise:
        ref, tst = torch.log_softmax(ref, -1), torch.log_softmax(tst, -1)
    diff = (ref - tst).abs().amax(-1)  # [N]; NaN where either row holds NaN or inf
    max_diff = float(diff.max())  # NaN if any row is: max propagates it
    if not math.isfinite(max_diff):
        finite = diff.isfinite()
        diff, max_diff = diff.masked_fill(~finite, float("inf")), float("inf")
        reference, ref = reference[finite], ref[finite]
    if not with_scale or reference.shape[0] == 0:
        return diff, max_diff, 1.0
    # The scale from what is at hand: log p <= 0, so the largest |log p| is -min(log p);
    # aminmax finds the largest |logit| without an abs() copy (a third of the time at 50k).
    lowest, highest = reference.aminmax()
    largest = max(float(highest), -float(lowest))
    if normalise:
        largest = max(largest, -float(ref.amin()))
    return diff, max_diff, max(1.0, largest)


def _largest(rows: Tensor, normalise: bool) -> float:
    """The largest logit magnitude of ``[N, V]`` rows, or log-probability magnitude with
    ``normalise`` (logsumexp minus the smallest logit); NaN or inf if any value is not finite."""
    rows = rows.float()
    largest = rows.abs().amax()
    if normalise:
        largest = torch.maximum(largest, (torch.logsumexp(rows, -1) - rows.amin(-1)).amax())
    return float(largest)


def compare_logits(
    reference: Tensor, test: Tensor, where: Tensor, normalise: bool = True, with_scale: bool = True, offset: int = 0
) -> Comparison:
    """Compare ``[B, T, V]`` logits at the positions where ``where [B, T]`` is True.

    Differences of float64 log-softmax (``normalise=False``: of the values as given, for
    log-probabilities saved over part of a vocabulary); NaN or inf in ``test`` (or
    ``reference``) at a compared position is reported separately and counts as an
    infinite difference. ``offset``: the logits are those of a sequence's positions from
    ``offset`` on (its last ones), and positions are reported from the sequence's start.
    """
    where = where.to(device=reference.device, dtype=torch.bool)
    index = where.nonzero(as_tuple=True)
    diff, max_diff, scale = compare_rows(reference[index], test[index], normalise, with_scale)  # [N]
    if offset:
        index = (index[0], index[1] + offset)
    return Comparison(
        max_diff, scale, diff, index, (where.shape[0], offset + where.shape[1]), quantity=quantity_of(normalise)
    )


def quantity_of(normalise: bool) -> str:
    """What a comparison compared, as its message names it: log-probabilities, or raw outputs."""
    return "log p" if normalise else "output"


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


LOW_PRECISION = ("bfloat16", "float16")


def measure_reference_error(adapter: Any) -> float | None:
    """FlashAttention's reference error for a low-precision model: max |log p - log p_float32|
    against a float32 twin of the same weights on one random batch, in units of eps * scale.

    None when the model runs in float32, cannot be copied (not an ``nn.Module``, or a model
    sharded by accelerate), or its float32 twin does not fit in memory.
    """
    from ..adapters.base import AdapterError, Batch

    caps = adapter.capabilities
    if caps.dtype not in LOW_PRECISION:
        return None
    try:
        twin = adapter.float32_twin()  # kept: the float32_twin path runs on it
    except AdapterError:
        return None
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(1, caps.vocab_size, (4, 12), generator=generator).to(caps.device)
    batch = Batch(ids, torch.ones_like(ids), decoder_input_ids=ids if caps.family == "encoder_decoder" else None)
    comparison = compare_logits(
        twin.logits(batch),
        adapter.logits(batch).float(),
        torch.ones(ids.shape, dtype=torch.bool),
        normalise=caps.output_kind.log_probabilities,
    )
    return comparison.max_diff / (EPS[caps.dtype] * comparison.scale)
