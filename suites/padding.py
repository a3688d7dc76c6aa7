"""padding: padded slots must carry no information into real positions.

Checks (encoder-decoders are padded on the decoder side; the source is the
cross_attention suite's business)
- ``pad_ids``: change the ids at padded slots, left or right padding; logits at real
  positions must not move (same-shape rule).
- ``padded_vs_unpadded``: each row padded in a batch equals the same row run alone,
  unpadded (shape-changing rule), with position ids derived from the mask where the
  model takes them.
- ``extra_padding``: adding all-padding columns changes no real logit.
- ``batch_composition``: a row's logits do not depend on the other rows of its batch:
  other contents, other lengths, fully padded rows, and batches with no padding at all
  (some attention backends build no mask when nothing is padded).
- ``mask_read``: only where the adapter measured that the forward does not read its mask
  as the mask's name promises (it ignores it, or inverts it: ``ModuleAdapter.mask_finding``);
  it fails with that measurement, so the suite's reason is the cause, not one of its effects.
- ``positions_from_mask``: for models that take position ids, whether left padding
  without them shifts positions. That is a real behaviour to know, not a leak: ``warn``.
- ``pooling``: only for a model that returns one output per row (a classifier, a reward
  head, an embedding: harness/adapters/outputs.py), first. Every check above compares that
  pooled output with the row alone; ``pooling`` measures which padding side it survives
  and whether the mask or the pad ids decide its position (suites/pooling.py), and names
  the condition a ``warn`` rests on. The drawn cases then keep to that condition's side.

A NaN or inf at a real position fails the check it appears in: a row that attends to
nothing must not poison the others.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, AdapterError, Batch, Capabilities
from ..harness.engine.batching import Evaluation, Logits
from ..harness.engine.cases import (
    RowBatches,
    aligned_outcome,
    gradient_check,
    gradient_outcome,
    left_padding_caveat,
    perturb,
    real_logits,
    same_shape_outcome,
    with_floor,
    without_positional_caveats_if,
)
from ..harness.engine.influence import expected_pattern, measure_influence
from ..harness.engine.profiles import length_cap
from ..harness.engine.strategies import case_strategy, short_or_long
from ..harness.engine.suite import Check, CheckResult, Outcome, RunContext, Suite
from .pooling import SIDES, Pooling, measure_pooling

MAX_LENGTH = 12


@dataclass(frozen=True)
class PaddedCase:
    lengths: tuple[int, ...]  # real tokens per row
    extra: int  # padded slots beyond the longest row (>= 1: every row has padding)
    side: str  # "left" or "right"
    seed: int


@dataclass(frozen=True)
class CompositionCase:
    length: int  # the real tokens of the row under test (row 0)
    others_a: tuple[int, ...]  # lengths of the other rows in the first batch (0 = fully padded)
    others_b: tuple[int, ...]
    side: str
    seed: int


def padded_cases(
    max_length: int, min_extra: int = 1, longest: int | None = None, sides: tuple[str, ...] = SIDES
) -> st.SearchStrategy[PaddedCase]:
    """Up to three rows of up to ``max_length`` real tokens; in the first case of an example,
    one row of up to ``longest`` alone (harness/engine/strategies.py, ``short_or_long``),
    padded on one of ``sides``."""
    return case_strategy(
        PaddedCase,
        lengths=st.lists(short_or_long(1, max_length, longest), min_size=1, max_size=3).map(
            functools.partial(long_row_alone, max_length)
        ),
        extra=st.integers(min_extra, 4),
        side=st.sampled_from(list(sides)),
        seed=st.integers(0, 2**16),
    )


def long_row_alone(short: int, lengths: list[int]) -> tuple[int, ...]:
    """A long row's case holds that row alone, padded by the case's ``extra`` slots. Short
    rows padded to its length would be mostly padded slots, testing again what every short
    case of several rows tests (rows of other lengths padded in one batch) at the price of
    the long row's length each. The short rows stay drawn, so a failure that needs no long
    row shrinks to short rows as before."""
    long = [length for length in lengths if length > short]
    return (long[0],) if long else tuple(lengths)


def composition_cases(max_length: int, sides: tuple[str, ...] = SIDES) -> st.SearchStrategy[CompositionCase]:
    others = st.lists(st.integers(0, max_length), min_size=0, max_size=2)
    return case_strategy(
        CompositionCase,
        length=st.integers(1, max_length),
        others_a=others,
        others_b=others,
        side=st.sampled_from(list(sides)),
        seed=st.integers(0, 2**16),
    )


class PaddingSuite(Suite):
    name = "padding"
    summary = "padded slots carry no information into real positions, whatever the batch"
    order = 20
    kind = "mask"
    in_sweep = True
    draws_effective_mask = True
    long_rows_on_paths = False
    batching_gate = "batch_composition"

    def __init__(self) -> None:
        self._pooling: Pooling | None = None  # set by checks() for a per-row output

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        if not capabilities.takes_attention_mask:
            return "the model takes no attention mask, so it cannot be padded"
        return None

    def conclude(self, results: list) -> None:
        """A per-row output whose pooled position the pad ids decide (measured by ``pooling``)
        fails pad_ids by design: that failure is the condition ``pooling`` warns about. A
        positional caveat rests on pad_ids passing: a model whose padded ids move real
        outputs (RWKV ignores its mask) has no positions to blame."""
        condition = self._pooling.pad_ids_condition() if self._pooling is not None else None
        for result in results:
            if condition and result.name == "pad_ids" and result.status == "fail":
                result.status, result.message = "warn", result.message + condition
                for path in result.paths:
                    path["status"] = "warn" if path["status"] == "fail" else path["status"]
        without_positional_caveats_if(results, "pad_ids")

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        caps = adapter.capabilities
        longest = max(2, min(MAX_LENGTH, (caps.max_length or MAX_LENGTH) - 4))
        batches = RowBatches(adapter)
        cap = length_cap(context.profile, caps.max_length)  # None: no declared context, short rows only
        long_rows = None if cap is None else max(longest, cap - 4)  # room for the padding
        # What the adapter measured of the mask comes first, so the suite's line gives it as the reason.
        found = [CheckResult("mask_read", "fail", adapter.mask_finding)] if adapter.mask_finding else []
        sides = SIDES
        if not caps.output_kind.per_position:
            pooled = self._measured_pooling(adapter, context)
            found.append(pooled)
            if self._pooling is not None:
                sides = self._pooling.drawn_sides
        padded = padded_cases(longest, longest=long_rows, sides=sides)  # one strategy object: these checks share it
        checks = [
            *found,
            Check("pad_ids", lambda c: self.pad_ids(batches, context, c), padded),
            Check("padded_vs_unpadded", lambda c: self.padded_vs_unpadded(batches, context, c), padded),
            Check("extra_padding", lambda c: self.extra_padding(batches, context, c), padded),
            gradient_check(adapter, "padded_gradients", lambda c: self.padded_gradients(batches, context, c), padded),
            # Its cases keep their forwards to themselves: it decides whether other checks may stack theirs.
            Check(
                "batch_composition",
                lambda c: self.batch_composition(batches, context, c),
                composition_cases(longest, sides),
                batchable=False,
            ),
        ]
        shifts = caps.takes_position_ids and not caps.derives_positions_from_mask and caps.family != "encoder_decoder"
        if shifts and "left" in sides:  # it pads on the left, which a pooled output's side condition may rule out
            checks.append(
                # Short rows: any left padding shifts every real position that the model does not
                # derive from the mask, at any length, and the long padded rows are checked above.
                Check(
                    "positions_from_mask",
                    lambda c: self.positions_from_mask(batches, context, c),
                    padded_cases(longest),
                    max_examples=3,
                )
            )
        return checks

    def _measured_pooling(self, adapter: Adapter, context: RunContext) -> CheckResult:
        """The ``pooling`` check (suites/pooling.py); an error of the model's is its result."""
        try:
            self._pooling = measure_pooling(adapter, context)
        except AdapterError as exc:
            return CheckResult("pooling", "error", str(exc))
        return self._pooling.result()

    def effective_mask(self, adapter: Adapter, context: RunContext, length: int = 8, padding: int = 2) -> tuple:
        """The influence matrix of one row with ``padding`` slots (left for decoders, right for
        encoders) and the expected mask: the declared pattern, restricted to real inputs."""
        b = RowBatches(adapter)
        side = "right" if b.caps.family == "encoder" else "left"
        row = b.batch(b.rows((length - padding,), context.seed), length, side)
        influence = measure_influence(
            adapter, context, row, context.seed, decoder_side=b.caps.family == "encoder_decoder"
        )
        pattern = "bidirectional" if b.caps.attention == "bidirectional" else "causal"
        real = row.predicted_mask[0].bool().cpu()
        expected = expected_pattern(length, pattern, b.caps.window, b.caps.n_layers) & real[None, :] & real[:, None]
        return influence, expected

    def pad_ids(self, b: RowBatches, context: RunContext, case: PaddedCase) -> Evaluation:
        length = max(case.lengths) + case.extra
        base = b.batch(b.rows(case.lengths, case.seed), length, case.side)
        ids, mask = base.predicted_ids, base.predicted_mask
        assert mask is not None
        perturbed = b.with_ids(base, perturb(ids, mask == 0, b.caps.vocab_size, case.seed))
        what = f"changing the ids at {case.side}-padded slots changed {b.outputs}"
        return (yield from same_shape_outcome(b.adapter, context, base, perturbed, mask.bool(), what))

    def padded_gradients(self, b: RowBatches, context: RunContext, case: PaddedCase) -> Outcome:
        """The training backward: the gradient of the log-probabilities at real positions with
        respect to the token embeddings at padded slots must be zero."""
        length = max(case.lengths) + case.extra
        batch = b.batch(b.rows(case.lengths, case.seed), length, case.side)
        real = batch.predicted_mask.bool()
        what = f"the training backward carries gradient from the token embeddings at {case.side}-padded slots into real positions"
        return gradient_outcome(b.adapter, context, batch, real, ~real, case.seed, what)

    def padded_vs_unpadded(self, b: RowBatches, context: RunContext, case: PaddedCase) -> Evaluation:
        rows = b.rows(case.lengths, case.seed)
        padded = b.batch(rows, max(case.lengths) + case.extra, case.side)
        mask = padded.predicted_mask
        alone = yield [
            Logits(b.adapter, b.batch([row], row.numel(), case.side, first_row=i)) for i, row in enumerate(rows)
        ]  # [1, n, V] each

        def judge(logits: Tensor, floor: float) -> Outcome:
            pairs = [(alone[i][0], real_logits(logits, mask, i), i) for i in range(len(rows))]
            outcome = aligned_outcome(
                context, pairs, floor, f"a {case.side}-padded row differs from the same row unpadded"
            )
            return left_padding_caveat(outcome, b.caps, case.side)

        return (yield from with_floor(b.adapter, padded, mask.bool(), judge))

    def extra_padding(self, b: RowBatches, context: RunContext, case: PaddedCase) -> Evaluation:
        rows = b.rows(case.lengths, case.seed)
        shortest = max(case.lengths)
        base = b.batch(rows, shortest, case.side)
        wider = b.batch(rows, shortest + case.extra, case.side)
        reference = yield Logits(b.adapter, base)  # [B, T, V]

        def judge(logits: Tensor, floor: float) -> Outcome:
            pairs = [
                (real_logits(reference, base.predicted_mask, i), real_logits(logits, wider.predicted_mask, i), i)
                for i in range(len(rows))
            ]
            outcome = aligned_outcome(
                context, pairs, floor, f"adding {case.extra} {case.side} padding column(s) changed {b.outputs}"
            )
            return left_padding_caveat(outcome, b.caps, case.side)

        return (yield from with_floor(b.adapter, wider, wider.predicted_mask.bool(), judge))

    def batch_composition(self, b: RowBatches, context: RunContext, case: CompositionCase) -> Evaluation:
        row = b.rows((case.length,), case.seed)[0]
        others_a = b.rows(case.others_a, case.seed + 1)
        others_b = b.rows(case.others_b, case.seed + 2)
        batch_a = b.batch([row, *others_a], max((case.length, *case.others_a)), case.side)
        batch_b = b.batch([row, *others_b], max((case.length, *case.others_b)), case.side)
        logits_a = yield Logits(b.adapter, batch_a)
        what = f"row 0 changed when the other rows changed from {_rows(case.others_a)} to {_rows(case.others_b)} ({case.side} padding)"

        def judge(logits_b: Tensor, floor: float) -> Outcome:
            pairs = [
                (real_logits(logits_a, batch_a.predicted_mask, 0), real_logits(logits_b, batch_b.predicted_mask, 0), 0)
            ]
            return left_padding_caveat(aligned_outcome(context, pairs, floor, what), b.caps, case.side)

        return (yield from with_floor(b.adapter, batch_b, batch_b.predicted_mask.bool(), judge))

    def positions_from_mask(self, b: RowBatches, context: RunContext, case: PaddedCase) -> Evaluation:
        """Left-padded rows without position ids against the same rows with positions derived
        from the mask. A difference is only the model's if the rows without position ids match
        the positions a model that ignores the mask uses (``0 .. T-1`` over the padding too)
        better than the derived ones; a model that derives them another way (a float path for
        its rotary angles, say) differs from both by rounding, and passes."""
        rows = b.rows(case.lengths, case.seed)
        length = max(case.lengths) + case.extra
        with_positions = b.batch(rows, length, "left")
        without = b.batch(rows, length, "left", with_positions=False)
        mask = with_positions.predicted_mask
        counting_padding = torch.arange(length, device=mask.device).expand_as(mask) + b.caps.position_offset  # [B, T]
        ignoring_mask = Batch(without.input_ids, without.attention_mask, counting_padding)
        # The derived positions' forward is asked here, beside the forward of positions counting
        # the padding (the same inputs, so the two share one), and handed to with_floor below.
        logits_without, logits_ignoring, logits_derived = yield [
            Logits(b.adapter, without),
            Logits(b.adapter, ignoring_mask),
            Logits(b.adapter, with_positions),
        ]

        def judge(logits: Tensor, floor: float) -> Outcome:
            pairs = [
                (real_logits(logits, mask, i), real_logits(logits_without, mask, i), i)
                for i in range(with_positions.size)
            ]
            outcome = aligned_outcome(context, pairs, floor, "left padding without position_ids")
            if outcome.status != "fail":
                return outcome
            shifted = max(
                float((real_logits(logits_ignoring, mask, i) - real_logits(logits_without, mask, i)).abs().max())
                for i in range(with_positions.size)
            )
            if shifted >= outcome.max_diff:  # no closer to shifted positions than to derived ones: not a shift
                outcome.status = "pass"
                outcome.message = (
                    f"without position ids, left-padded rows differ from derived positions by {outcome.max_diff:.3g} (over the threshold "
                    f"{outcome.threshold:.3g}) but from positions counting the padding by {shifted:.3g}: the model derives positions from "
                    "the mask by another computation, not a shift"
                )
                outcome.positions = []
                return outcome
            outcome.status = "warn"
            outcome.message = (
                "the model does not derive positions from attention_mask: with left padding, pass "
                "position_ids = attention_mask.cumsum(-1) - 1 (as generate() does), or real tokens get shifted positions. "
                + outcome.message
            )
            return outcome

        return (yield from with_floor(b.adapter, with_positions, mask.bool(), judge, first=logits_derived))


def _rows(lengths: tuple[int, ...]) -> str:
    """The other rows of a batch, as a message names them."""
    return f"rows of lengths {list(lengths)}" if lengths else "none (row 0 alone)"
