"""The effective mask: which input positions influence which output positions.

Perturb each input position in turn (all perturbations batched in one forward) and
record the change of the log-probabilities at every output position. Next to the mask
a model declares, this is the fastest way to see what it really attends to.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..adapters.base import Adapter, Batch
from .cases import concat, log_probabilities, pad_token, perturb
from .suite import RunContext
from .tolerance import compare_logits


@dataclass
class Influence:
    diff: Tensor  # [T_out, T_in] float64: max |d log p| at output i when input j changes
    floor: float
    threshold: float
    outputs: Tensor  # [T_out] bool: output positions that are compared (real tokens)
    inputs: Tensor  # [T_in] bool: input positions that were perturbed

    @property
    def measured(self) -> Tensor:
        """``[T_out, T_in]`` bool: input j influences output i beyond noise."""
        return (self.diff > self.threshold) & self.outputs[:, None] & self.inputs[None, :]


def measure_influence(
    adapter: Adapter, context: RunContext, row: Batch, seed: int, decoder_side: bool = False
) -> Influence:
    """Influence matrix of a one-row batch: ``[T_out, T_in]`` over the predicted positions and
    the perturbed ids. ``decoder_side`` perturbs decoder ids; otherwise ``input_ids`` are
    perturbed (for an encoder-decoder: the source, read through cross-attention)."""
    ids = row.decoder_input_ids if decoder_side else row.input_ids
    assert ids is not None and ids.shape[0] == 1
    mask = row.predicted_mask
    length = ids.shape[1]
    length_out = row.predicted_ids.shape[1]
    outputs = torch.ones(length_out, dtype=torch.bool) if mask is None else mask[0].bool().cpu()
    inputs = torch.ones(length, dtype=torch.bool)
    eye = torch.eye(length, dtype=torch.bool)
    perturbed_ids = perturb(
        ids.expand(length, -1), eye.to(ids.device), adapter.capabilities.vocab_size, seed, pad_token(adapter)
    )
    rows = [row, row]
    for j in range(length):
        rows.append(_with_ids(row, perturbed_ids[j : j + 1], decoder_side))
    logits = adapter.logits(concat(rows))  # [T_in + 2, T_out, V]
    where = outputs[None, :].to(logits.device)
    normalise = log_probabilities(adapter)
    floor = compare_logits(logits[:1], logits[1:2], where, normalise).max_diff
    diff = torch.zeros(length_out, length, dtype=torch.float64)
    scale = 1.0
    for j in range(length):
        comparison = compare_logits(logits[:1], logits[2 + j : 3 + j], where, normalise)
        diff[:, j] = comparison.per_position[0].cpu()
        scale = max(scale, comparison.scale)
    threshold = context.tolerance.same_shape(floor, context.dtype, scale)
    return Influence(diff, floor, threshold, outputs, inputs)


def _with_ids(row: Batch, ids: Tensor, decoder_side: bool) -> Batch:
    """``row`` with other ids on the perturbed side; every other input (mask, prefix ...) kept."""
    return dataclasses.replace(row, **{"decoder_input_ids" if decoder_side else "input_ids": ids})


def expected_pattern(
    length: int,
    pattern: str,
    window: int | None,
    n_layers: int | None,
    chunk: int | None = None,
    prefix: int = 0,
) -> Tensor:
    """``[T_out, T_in]`` bool: where influence is allowed under a declared attention pattern.

    With L layers and a window of W (a query sees W keys, itself included), influence
    reaches back at most L * (W - 1) positions. Chunks of C tokens in every layer keep
    influence inside each chunk however many layers there are. A prefix LM's first
    ``prefix`` positions influence each other both ways.
    """
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    if pattern == "bidirectional":
        return torch.ones(length, length, dtype=torch.bool)
    allowed = j <= i
    if pattern == "sliding_window" and window is not None:
        reach = (n_layers or 1) * (window - 1)
        allowed = allowed & (i - j <= reach)
    if pattern == "chunked" and chunk is not None:
        allowed = allowed & (i // chunk == j // chunk)
    if pattern == "prefix_lm":
        allowed = allowed | ((i < prefix) & (j < prefix))
    return allowed
