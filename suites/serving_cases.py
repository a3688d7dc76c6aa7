"""The batches, decodes and comparisons of the serving suite (``suites/serving.py``).

A serving check decodes with the cache, operates on it, decodes again, and compares with
a fresh computation: the full forward of what the cache now holds (``against_full_forward``,
shape-changing rule), or a fresh decode of the same shapes (``same_computation``,
same-shape rule). A failing case runs the same decodes without the operation, so the
message says which is wrong. Mask polarity: ``attention_mask`` 1 = real token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from ..harness.adapters.base import Adapter, AdapterError, Batch, ServingUnsupported
from ..harness.adapters.memo import forward_memo
from ..harness.adapters.serving import select_rows
from ..harness.engine.batching import Evaluation, Logits
from ..harness.engine.cases import random_ids, random_rows, row_lengths, shape_change_outcome, verdict, with_floor
from ..harness.engine.suite import Outcome, RunContext
from ..harness.engine.tolerance import compare_logits
from .kv_cache import MAX_CHUNK, CacheBatches


def steps(count: int, seed: int) -> list[int]:
    """Step sizes of 1..MAX_CHUNK summing to ``count``, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    sizes = []
    while count > 0:
        n = min(count, int(torch.randint(1, MAX_CHUNK + 1, (1,), generator=generator)))
        sizes.append(n)
        count -= n
    return sizes


def row_index(operation: str, rows: int, seed: int) -> Tensor:
    """The rows a rearrangement keeps: ``reorder`` a same-size index that moves a row (rows
    may repeat, as beams do), ``select`` a proper subset in any order, ``repeat`` each row
    2 or 3 times in place."""
    generator = torch.Generator().manual_seed(seed)
    if operation == "repeat":
        return torch.arange(rows).repeat_interleave(2 + seed % 2)
    if operation == "select":
        keep = 1 + int(torch.randint(0, rows - 1, (1,), generator=generator))
        return torch.randperm(rows, generator=generator)[:keep]
    index = torch.randint(0, rows, (rows,), generator=generator)
    if torch.equal(index, torch.arange(rows)):  # the identity rearranges nothing
        index = index.roll(1)
    return index


class ServingBatches(CacheBatches):
    """Left-padded decoder batches (:class:`CacheBatches`) that grow and lose rows as the
    decoding state does, so a full forward sees exactly what the cache holds."""

    def prompt(self, lengths: Sequence[int], seed: int, source_padding: int) -> tuple[list[Tensor], Batch]:
        rows = random_rows(self.adapter, row_lengths(self.caps, lengths, cached=True), seed)
        return rows, self.left_padded(rows, max(len(r) for r in rows), source_padding)

    def tokens(self, rows: int, count: int, seed: int) -> Tensor:
        return random_ids(seed, (rows, count), self.caps.vocab_size, self.pad, self.caps.device)  # [B, n]

    def appended(self, batch: Batch, tokens: Tensor) -> Batch:
        """``batch`` with real ``tokens [B, n]`` appended on the predicted side."""
        ones = torch.ones_like(tokens)
        if self.caps.family == "encoder_decoder":
            assert batch.decoder_input_ids is not None and batch.decoder_attention_mask is not None
            return replace(
                batch,
                decoder_input_ids=torch.cat([batch.decoder_input_ids, tokens], dim=1),
                decoder_attention_mask=torch.cat([batch.decoder_attention_mask, ones], dim=1),
            )
        mask = None if batch.attention_mask is None else torch.cat([batch.attention_mask, ones], dim=1)
        positions = batch.position_ids
        if positions is not None:  # the next positions of each row: after its last, a real token
            positions = torch.cat([positions, positions[:, -1:] + ones.cumsum(-1)], dim=1)  # [B, T + n]
        return Batch(torch.cat([batch.input_ids, tokens], dim=1), mask, positions)

    def without_last(self, batch: Batch, tokens: int) -> Batch:
        return self.prefix(batch, batch.predicted_ids.shape[1] - tokens)

    def rows_of(self, batch: Batch, index: Tensor) -> Batch:
        """The batch whose row ``i`` is ``batch``'s row ``index[i]`` (its source too)."""
        return Batch(**select_rows(dataclasses.asdict(batch), index, batch.size))


def decoded(adapter: Adapter, state: Any, tokens: Tensor, sizes: Sequence[int]) -> tuple[Tensor, Any]:
    """Feed ``tokens [B, n]`` in steps of ``sizes``: their logits ``[B, n, V]`` and the state."""
    pieces, start = [], 0
    for n in sizes:
        logits, state = adapter.step(state, tokens[:, start : start + n])  # [B, n, V]
        pieces.append(logits)
        start += n
    return torch.cat(pieces, dim=1), state


#: the same decodes without the serving operation: each (its full batch, its cached logits [B, n, V])
Control = Callable[[], list[tuple[Batch, Tensor]]]


def against_full_forward(
    b: ServingBatches,
    context: RunContext,
    full: Batch,
    cached: Tensor,
    what: str,
    control: tuple[str, Control] | None = None,
) -> Evaluation:
    """``cached [B, n, V]`` against the last ``n`` positions of the full forward of ``full``.

    ``control``: the operation's name and the same decode without it, run only for a case
    that fails, so the message says whether the operation broke the decode or the cache
    was wrong before it (which ``kv_cache`` names)."""

    def judged(full: Batch, cached: Tensor, what: str, floor: float | None = None) -> Evaluation:
        count = cached.shape[1]  # the full forward's last positions: the only ones compared, the only ones asked for
        offset = full.predicted_ids.shape[1] - count
        where = torch.ones(full.size, count, dtype=torch.bool)

        def judge(logits: Tensor, floor: float) -> Outcome:  # logits [B, count, V]
            # positions count from the sequence's start
            return shape_change_outcome(context, logits, cached.to(logits.device), where, floor, what, offset=offset)

        if floor is not None:
            return judge((yield Logits(b.adapter, full, count)), floor)
        return (yield from with_floor(b.adapter, full, where, judge, count))

    outcome = yield from judged(full, cached, what)
    if outcome.status != "fail" or control is None:
        return outcome
    operation, without = control
    for batch, logits in without():
        alone = yield from judged(batch, logits, f"the same decode without the {operation}", outcome.floor)
        if alone.status == "fail":
            break
    if alone.status == "fail":
        outcome.message += (
            f"; the same decode without the {operation} differs from the full forward too (max |d log p| = "
            f"{alone.max_diff:.3g}): the cache is wrong before any {operation}, as kv_cache's incremental check says"
        )
    else:
        outcome.message += (
            f"; the same decode without the {operation} equals the full forward (max |d log p| = "
            f"{alone.max_diff:.3g} <= {alone.threshold:.3g}): the {operation} breaks it"
        )
    return outcome


def operated(decode: Callable[[], Tensor], control: tuple[str, Control]) -> Tensor | Outcome:
    """The logits ``decode()`` gives after a serving operation; where the model raises after
    it but the same decode without it runs, a failure: the operation left the cache
    inconsistent (transformers' hybrid layers that select keys and values and not their
    recurrent state). Where both raise, the error stands (the model cannot decode at all)."""
    try:
        return decode()
    except ServingUnsupported:
        raise
    except AdapterError as error:
        operation, without = control
        without()  # raises too: the model's own error, not the operation's
        return Outcome(
            "fail",
            float("inf"),
            message=(
                f"after the cache's {operation}, the next forward raised ({error}), while the same decode without "
                f"the {operation} runs: the {operation} leaves the cache inconsistent"
            ),
        )


def same_computation(
    context: RunContext,
    fresh: Tensor,
    again: Callable[[], Tensor],
    tested: Sequence[tuple[Tensor, str]],
    where: Tensor | None = None,
) -> Outcome:
    """Each ``tested`` logits ``[B, n, V]`` against ``fresh`` at ``where [B, n]`` (default:
    everywhere) under the same-shape rule: the first that moves fails. Judged at floor 0
    first; ``again()`` (the fresh computation repeated) is run only where that judgement
    is not a pass, and the judgement made again at the floor it measures. Every threshold
    grows with the floor, so a pass at floor 0 is a pass at any floor (as ``with_floor``)."""
    where = torch.ones(fresh.shape[:2], dtype=torch.bool) if where is None else where

    def judged(floor: float) -> Outcome:
        worst = Outcome("pass")
        for logits, what in tested:
            comparison = compare_logits(fresh, logits, where)
            threshold = context.tolerance.same_shape(floor, context.dtype, comparison.scale)
            outcome = verdict(comparison, floor, threshold, what)
            if outcome.status != "pass":
                return outcome
            worst = outcome if outcome.ratio >= worst.ratio else worst
        return worst

    outcome = judged(0.0)
    if outcome.status == "pass":
        return outcome
    with forward_memo(False):  # the repeat is the measurement: computed, never served
        repeated = again()
    return judged(compare_logits(fresh, repeated, where).max_diff)


def supported(probe: Callable[[], Any]) -> str | None:
    """None when ``probe`` runs; the reason when the cache says it cannot. Any other error
    is left to the check, which then reports it on a real case."""
    try:
        probe()
    except ServingUnsupported as exc:
        return str(exc)
    except (AdapterError, RuntimeError, ValueError, TypeError, IndexError):
        return None
    return None
