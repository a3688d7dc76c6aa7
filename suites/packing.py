"""packing: sequences packed in one row must not interfere.

A packed row holds several sequences back to back. Adapters say how they pack
(``Capabilities.packing``): ``segment_ids`` (0, 1, 2 ... per sequence; the model builds a
block-diagonal mask and restarts positions) or ``position_ids`` (the padding-free path of
Hugging Face decoders: position ids restart at 0 per sequence and no attention mask is
passed). Checks, run with the adapter's documented packing setting:

- ``segment_isolation``: change the ids of one sequence; no other sequence's logits may
  move (same-shape rule).
- ``segments_alone``: each sequence's logits equal the same sequence run alone
  (shape-changing rule). Catches positions that do not restart.
- ``packed_vs_padded``: the packed row equals the same sequences as a right-padded batch.
- ``no_packing_input``: for a model with no packing input at all (RoBERTa, MPT, a plain
  module), the sequences back to back with nothing else, as flattening collators leave
  them: a leak is a ``warn`` ("not safe to pack"), since nothing the model takes can
  isolate them. Encoder-decoders without a packing input are not applicable.
- ``settings``: when an adapter knows other ways a user might pack (Hugging Face: leaving
  ``use_cache`` at its default, or passing an attention mask of ones), each is run on the
  same cases; the check reports exactly which inputs and settings keep packing safe and
  ``warn`` s when some leak (a real behaviour to know, not a bug in the documented path).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.adapters.outputs import KINDS
from ..harness.engine.batching import Evaluation, Logits, run_alone
from ..harness.engine.cases import (
    aligned_outcome,
    gradient_check,
    gradient_outcome,
    pad_rows,
    pad_token,
    perturb,
    positions_for,
    random_rows,
    same_shape_outcome,
    with_floor,
)
from ..harness.engine.profiles import length_cap
from ..harness.engine.strategies import case_strategy, short_or_long
from ..harness.engine.suite import Check, Outcome, RunContext, Suite

MAX_SEGMENT = 6


@dataclass(frozen=True)
class PackedCase:
    segment_lengths: tuple[int, ...]  # the packed sequences, in order
    changed: int  # segment_isolation: the sequence whose ids change (taken modulo the count)
    padding: int  # trailing padded slots (segment_ids packing only: the padding-free path has no mask)
    seed: int


def packed_cases(capabilities: Capabilities, profile: str = "dev", reach: bool = True) -> st.SearchStrategy[PackedCase]:
    """Two or three packed sequences of up to MAX_SEGMENT tokens; with ``reach``, in the
    first case of an example one is up to a third of the profile's length cap, within the
    model's context (harness/engine/strategies.py, ``short_or_long``)."""
    room = length_cap(profile, capabilities.max_length or 64) - 2  # the padded slots
    longest = max(1, min(MAX_SEGMENT, room // 3))
    reaching = max(longest, room // 3) if reach else None
    return case_strategy(
        PackedCase,
        segment_lengths=st.lists(short_or_long(1, longest, reaching), min_size=2, max_size=3),
        changed=st.integers(0, 2),
        padding=st.integers(0, 2) if capabilities.packing == "segment_ids" else st.just(0),
        seed=st.integers(0, 2**16),
    )


@dataclass
class PackedRow:
    batch: Batch  # one packed row
    rows: list[Tensor]  # the sequences, 1-D
    starts: list[int]  # where each sequence starts in the row

    def span(self, index: int) -> slice:
        return slice(self.starts[index], self.starts[index] + self.rows[index].numel())

    def real(self) -> Tensor:
        """``[1, T]`` True at the tokens of a sequence (not at trailing padding)."""
        real = torch.zeros_like(self.batch.input_ids, dtype=torch.bool)
        real[0, : self.starts[-1] + self.rows[-1].numel()] = True
        return real


def pack(adapter: Adapter, case: PackedCase) -> PackedRow:
    rows = random_rows(adapter, case.segment_lengths, case.seed)
    starts = [sum(case.segment_lengths[:i]) for i in range(len(rows))]
    ids = torch.cat(rows)
    segments = torch.cat([torch.full((row.numel(),), i) for i, row in enumerate(rows)])
    if case.padding:
        ids = torch.cat([ids, torch.full((case.padding,), pad_token(adapter))])
        segments = torch.cat([segments, torch.full((case.padding,), -1)])
    device = adapter.capabilities.device
    ids, segments = ids[None].to(device), segments[None].to(device)  # [1, T]
    if adapter.capabilities.packing == "segment_ids":
        batch = Batch(ids, (segments >= 0).long(), segment_ids=segments)
    elif adapter.capabilities.packing == "position_ids":
        offset = adapter.capabilities.position_offset  # the model's own first position id
        positions = torch.cat([torch.arange(row.numel()) for row in rows])[None].to(device) + offset  # [1, T]
        batch = Batch(ids, position_ids=positions)
    else:  # no packing input: the sequences back to back, as a flattening collator leaves them
        batch = Batch(ids)
    return PackedRow(batch, rows, starts)


def with_ids(batch: Batch, ids: Tensor) -> Batch:
    return Batch(ids, batch.attention_mask, batch.position_ids, batch.segment_ids)


def segment_isolation(adapter: Adapter, context: RunContext, case: PackedCase) -> Evaluation:
    packed = pack(adapter, case)
    changed = case.changed % len(packed.rows)
    inside = torch.zeros_like(packed.batch.input_ids, dtype=torch.bool)
    inside[0, packed.span(changed)] = True
    others = torch.zeros_like(inside)
    for i in range(len(packed.rows)):
        if i != changed:
            others[0, packed.span(i)] = True
    caps = adapter.capabilities
    perturbed = with_ids(
        packed.batch, perturb(packed.batch.input_ids, inside, caps.vocab_size, case.seed, pad_token(adapter))
    )
    what = f"changing packed sequence {changed} of lengths {list(case.segment_lengths)} changed the logits of another sequence"
    return (yield from same_shape_outcome(adapter, context, packed.batch, perturbed, others, what))


def packed_gradients(adapter: Adapter, context: RunContext, case: PackedCase) -> Outcome:
    """The training backward of a packed row: the gradient of the other sequences'
    log-probabilities with respect to the token embeddings of one sequence must be zero."""
    packed = pack(adapter, case)
    changed = case.changed % len(packed.rows)
    inside = torch.zeros_like(packed.batch.input_ids, dtype=torch.bool)  # [1, T]
    inside[0, packed.span(changed)] = True
    others = packed.real() & ~inside
    what = (
        f"the training backward of a packed row (lengths {list(case.segment_lengths)}) carries gradient from "
        f"sequence {changed}'s token embeddings into another sequence's log-probabilities"
    )
    return gradient_outcome(adapter, context, packed.batch, others, inside, case.seed, what)


NO_PACKING_INPUT = "it takes neither segment ids nor position ids that restart per sequence"
POSITIONS_DO_NOT_ISOLATE = "position ids restarting per sequence change nothing about it: its attention builds no packed-sequence mask from them"


def unisolated(adapter: Adapter, context: RunContext, case: PackedCase, why: str = NO_PACKING_INPUT) -> Evaluation:
    """Packing a model that has no packing input: a leak is a ``warn`` (nothing it takes can
    isolate the sequences, so it is a property of the model, not a broken path)."""
    outcome = yield from segment_isolation(adapter, context, case)
    if outcome.status == "fail":
        outcome.status = "warn"
        outcome.message = (
            f"not safe to pack: {outcome.message}; no input of this model isolates packed sequences ({why})"
        )
    return outcome


def without_packing_input(adapter: Adapter) -> Adapter:
    """The same adapter packing sequences back to back, with no position ids."""
    plain = copy.copy(adapter)
    plain.capabilities = dataclasses.replace(adapter.capabilities, packing=None)
    return plain


def isolates_by_positions(adapter: Adapter, context: RunContext) -> bool:
    """Whether the model has a padding-free path at all, measured on two packed sequences of
    three tokens: restarting position ids must change which positions of the second
    sequence the first one reaches. A model whose leak is the same with and without them
    has no path to fail (a broken path leaks at fewer positions, or none)."""
    case = PackedCase(segment_lengths=(3, 3), changed=0, padding=0, seed=context.seed)
    with_positions = run_alone(segment_isolation(adapter, context, case))
    if with_positions.status != "fail":
        return True
    plain = run_alone(segment_isolation(without_packing_input(adapter), context, case))
    return not (plain.status == "fail" and plain.positions == with_positions.positions)


def alone_logits(adapter: Adapter, packed: PackedRow) -> list[Logits]:
    """The requests for each packed sequence run alone: ``[1, n, V]`` logits each."""
    return [Logits(adapter, Batch(row[None].to(adapter.capabilities.device))) for row in packed.rows]


def segments_alone(
    adapter: Adapter, context: RunContext, case: PackedCase, alone: list[Tensor] | None = None
) -> Evaluation:
    """Each packed sequence's logits equal the same sequence run alone (``alone``: those
    logits, already computed; None: run them here)."""
    packed = pack(adapter, case)
    if alone is None:
        alone = yield alone_logits(adapter, packed)

    def judge(logits: Tensor, floor: float) -> Outcome:
        pairs = [(alone[i][0], logits[0, packed.span(i)], i) for i in range(len(packed.rows))]
        return aligned_outcome(
            context,
            pairs,
            floor,
            f"a packed sequence (lengths {list(case.segment_lengths)}) differs from the same sequence run alone",
            "sequence",
        )

    return (yield from with_floor(adapter, packed.batch, packed.real(), judge))


def packed_vs_padded(adapter: Adapter, context: RunContext, case: PackedCase) -> Evaluation:
    packed = pack(adapter, case)
    ids, mask = pad_rows(packed.rows, max(case.segment_lengths), "right", pad_token(adapter))
    device = adapter.capabilities.device
    ids, mask = ids.to(device), mask.to(device)
    padded = yield Logits(adapter, Batch(ids, mask, positions_for(adapter, mask)))  # [S, L, V]

    def judge(logits: Tensor, floor: float) -> Outcome:
        pairs = [(padded[i, : row.numel()], logits[0, packed.span(i)], i) for i, row in enumerate(packed.rows)]
        return aligned_outcome(
            context, pairs, floor, "a packed row differs from the same sequences in a right-padded batch", "sequence"
        )

    return (yield from with_floor(adapter, packed.batch, packed.real(), judge))


class PackingSuite(Suite):
    name = "packing"
    summary = "sequences packed in one row do not interfere"
    order = 50
    kind = "state"
    in_sweep = True
    long_rows_on_paths = False

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        output = capabilities.output_kind
        if not output.per_position:
            return f"the model returns {KINDS[output.name]}: a packed row's one output cannot be split by sequence"
        if capabilities.packing is None and capabilities.family == "encoder_decoder":
            return "packing is checked for encoders and decoders; this encoder-decoder declares no packing input"
        return None

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        strategy = packed_cases(adapter.capabilities, context.profile)
        if adapter.capabilities.packing is None:
            # People pack such models anyway (flattening collators): measure what it does.
            return [Check("no_packing_input", lambda c: unisolated(adapter, context, c), strategy)]
        if adapter.capabilities.packing == "position_ids" and not isolates_by_positions(adapter, context):
            plain = without_packing_input(adapter)
            return [
                Check("no_packing_input", lambda c: unisolated(plain, context, c, POSITIONS_DO_NOT_ISOLATE), strategy)
            ]
        settings = adapter.packing_settings()
        documented = settings[0][1]
        checks = [
            Check("segment_isolation", lambda c: segment_isolation(documented, context, c), strategy),
            gradient_check(
                documented, "packed_gradients", lambda c: packed_gradients(documented, context, c), strategy
            ),
            Check("segments_alone", lambda c: segments_alone(documented, context, c), strategy),
        ]
        if adapter.capabilities.takes_attention_mask:
            checks.append(Check("packed_vs_padded", lambda c: packed_vs_padded(documented, context, c), strategy))
        if len(settings) > 1:
            # Which packing inputs isolate is the same at any length (the documented
            # setting's long rows are checked above): short packed rows, every setting.
            short = packed_cases(adapter.capabilities, context.profile, reach=False)
            checks.append(Check("settings", lambda c: self.settings(settings, context, c), short, max_examples=3))
        return checks

    def settings(self, settings: list, context: RunContext, case: PackedCase) -> Evaluation:
        """Run the isolation and alone checks under every setting; name the ones that leak.

        Each sequence alone is run once, under the documented setting, and every setting's
        packed row is compared with it: a sequence alone has no packing input, so what a
        setting changes for it (``use_cache``, a mask of ones) is what the call paths audit
        on every check, and a packed row is right when it equals the model's own answer."""
        documented = settings[0][1]
        alone = yield alone_logits(documented, pack(documented, case))
        safe, leaks, worst = [], [], Outcome("pass")
        for setting, adapter in settings:
            outcomes = [
                (yield from segment_isolation(adapter, context, case)),
                (yield from segments_alone(adapter, context, case, alone)),
            ]
            bad = [o for o in outcomes if o.status == "fail"]
            if bad:
                leaks.append(f"{setting.inputs} ({bad[0].message})")
                worst = max([worst, *bad], key=lambda o: o.ratio)
            else:
                safe.append(setting.inputs)
        if not leaks:
            return Outcome("pass", worst.max_diff, worst.floor, worst.threshold)
        if safe:
            message = f"packing is safe with: {'; '.join(safe)}. It leaks with: {' | '.join(leaks)}"
        else:
            message = f"packing leaks under every setting tried: {' | '.join(leaks)}"
        return Outcome("warn", worst.max_diff, worst.floor, worst.threshold, worst.positions, message)
