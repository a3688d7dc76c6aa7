"""Loss normalisation over gradient accumulation.

Accumulating gradients over k micro-batches must give the gradient of the whole batch's
loss: the sum of every valid target's loss divided by the number of valid targets in the
whole batch. Averaging each micro-batch's mean instead (``loss / k`` after a per-batch
mean, the classic accumulation loop) weights a target in a micro-batch of 3 targets ten
times one in a micro-batch of 30: the model trains on another objective than it reports.

The check runs the user's accumulation loop (forward, loss, backward per micro-batch, no
optimiser step) and compares the gradients it leaves with the reference gradient, computed
by maskcheck micro-batch by micro-batch: cross-entropy summed over valid targets (labels
``-100`` ignored, ``logits[t]`` predicting ``labels[t + 1]`` unless ``shift=False``), divided
by the total count. It needs gradients, so it runs outside the inference-mode path of the
suites, with the model in eval mode (dropout would make two runs differ).

The noise floor is measured, not assumed: the reference computed a second time with the
micro-batches in reverse order differs by float rounding alone. The threshold is
``max(16 * floor, 1e-5)`` in relative gradient norm; a wrong normaliser moves it by 1e-2 or more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100
Batch = dict[str, Tensor]


@dataclass(frozen=True)
class AccumulationResult:
    status: str  # "pass" or "fail"
    relative_error: float  # |g_accumulated - g_reference| / |g_reference|
    floor: float  # the same measure between two reference computations
    threshold: float
    valid_targets: tuple[int, ...]  # per micro-batch
    message: str


def micro_batches_with_unequal_targets(vocab_size: int, pad_id: int = 0, seed: int = 0) -> list[Batch]:
    """Three right-padded micro-batches of two rows whose valid-target counts differ widely (3, 12, 20)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for lengths in ((2, 3), (4, 10), (11, 11)):
        width = max(lengths)
        ids = torch.full((2, width), pad_id, dtype=torch.long)
        mask = torch.zeros(2, width, dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(1, vocab_size, (length,), generator=generator) % vocab_size
            ids[row, :length] = torch.where(ids[row, :length] == pad_id, (pad_id + 1) % vocab_size, ids[row, :length])
            mask[row, :length] = 1
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE_INDEX)})
    return batches


def _logits(model: Any, batch: Batch) -> Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    output = model(**inputs)
    return output.logits if hasattr(output, "logits") else output


def _targets(batch: Batch, shift: bool) -> Tensor:
    return batch["labels"][:, 1:] if shift else batch["labels"]


def valid_targets(batch: Batch, shift: bool) -> int:
    return int((_targets(batch, shift) != IGNORE_INDEX).sum())


def reference_gradients(
    model: Any, micro_batches: Sequence[Batch], parameters: list[torch.nn.Parameter], shift: bool = True
) -> list[Tensor]:
    """The gradient of the whole batch's loss (summed over valid targets, divided by their count)."""
    total = sum(valid_targets(b, shift) for b in micro_batches)
    for p in parameters:
        p.grad = None
    for batch in micro_batches:
        logits = _logits(model, batch)
        logits = logits[:, :-1] if shift else logits
        targets = _targets(batch, shift)
        loss = (
            F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                targets.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            / total
        )
        loss.backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in parameters]


def _relative(a: list[Tensor], b: list[Tensor]) -> float:
    difference = torch.sqrt(sum(((x - y).double() ** 2).sum() for x, y in zip(a, b)))
    scale = torch.sqrt(sum((y.double() ** 2).sum() for y in b))
    return float(difference / scale) if scale > 0 else float(difference)


def check_gradient_accumulation(
    model: Any,
    accumulate: Callable[[Any, Sequence[Batch]], None],
    micro_batches: Sequence[Batch] | None = None,
    *,
    shift: bool = True,
    vocab_size: int | None = None,
) -> AccumulationResult:
    """Run ``accumulate(model, micro_batches)`` (the user's loop: a backward per micro-batch,
    no optimiser step) and compare the gradients it leaves with the whole batch's gradient.

    ``micro_batches`` default to :func:`micro_batches_with_unequal_targets` (``vocab_size``
    from ``model.config`` when not given): a normaliser that is wrong only shows when the
    micro-batches hold different numbers of valid targets.
    """
    if micro_batches is None:
        vocab = vocab_size or getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab is None:
            raise ValueError("pass micro_batches, or vocab_size for maskcheck to build them")
        micro_batches = micro_batches_with_unequal_targets(int(vocab))
    parameters = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for p in parameters:
                p.grad = None
            accumulate(model, micro_batches)
            accumulated = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in parameters]
            reference = reference_gradients(model, micro_batches, parameters, shift)
            again = reference_gradients(model, list(reversed(micro_batches)), parameters, shift)
    finally:
        for p in parameters:
            p.grad = None
        model.train(was_training)
    counts = tuple(valid_targets(b, shift) for b in micro_batches)
    error, floor = _relative(accumulated, reference), _relative(again, reference)
    threshold = max(16 * floor, 1e-5)
    if error <= threshold:
        return AccumulationResult(
            "pass",
            error,
            floor,
            threshold,
            counts,
            f"accumulated gradients equal the whole batch's: relative error {error:.3g} <= threshold {threshold:.3g} (floor {floor:.3g})",
        )
    message = (
        f"accumulated gradients differ from the whole batch's (its loss summed over valid targets, divided by their total): "
        f"relative error {error:.3g} > threshold {threshold:.3g} (floor {floor:.3g}); the micro-batches hold {', '.join(map(str, counts))} valid targets. "
        f"Averaging each micro-batch's mean weights a target by 1 / (its micro-batch's count): divide each micro-batch's summed loss by the total, "
        f"{sum(counts)} (transformers passes it as num_items_in_batch)"
    )
    return AccumulationResult("fail", error, floor, threshold, counts, message)


def assert_gradient_accumulation(
    model: Any,
    accumulate: Callable[[Any, Sequence[Batch]], None],
    micro_batches: Sequence[Batch] | None = None,
    **kwargs: Any,
) -> AccumulationResult:
    """:func:`check_gradient_accumulation` for a test: raises ``AssertionError`` with the message on failure."""
    result = check_gradient_accumulation(model, accumulate, micro_batches, **kwargs)
    if result.status != "pass":
        raise AssertionError(result.message)
    return result
