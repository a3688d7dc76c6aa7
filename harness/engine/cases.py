"""Building blocks for cases: token ids from a seed, padding, perturbation, comparisons.

Token ids are drawn from a ``torch.Generator`` seeded by the case, never by
Hypothesis directly: the case stays a few integers that shrink well, and the same
case gives the same ids in every process.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..adapters.base import Adapter, Batch, Capabilities, concat, pad_token, positions_from_mask
from ..adapters.outputs import OutputKind
from ..adapters.paths import TRAINING_BACKWARD
from .batching import Evaluation, Logits, one_forward
from .suite import Check, Outcome, RunContext
from .tolerance import Comparison, compare_logits, compare_rows, quantity_of
from .verdict import CheckResult


def random_ids(
    seed: int, shape: Sequence[int], vocab_size: int, avoid: int | None = None, device: str = "cpu"
) -> Tensor:
    """Uniform ids in ``[0, vocab)``, never equal to ``avoid`` (the pad id) when given."""
    generator = torch.Generator().manual_seed(seed)
    if avoid is None or vocab_size < 2:
        return torch.randint(0, vocab_size, tuple(shape), generator=generator).to(device)
    if avoid == 0:  # the usual pad id: the same ids as the general case below, in one op
        return torch.randint(1, vocab_size, tuple(shape), generator=generator).to(device)
    ids = torch.randint(0, vocab_size - 1, tuple(shape), generator=generator)
    return ids.add_(ids >= avoid).to(device)  # skips the avoided id


def random_rows(adapter: Adapter, lengths: Sequence[int], seed: int) -> list[Tensor]:
    """One 1-D row of non-pad ids per length; row i depends only on (seed, i), so a row is
    the same whether it is run in its batch or alone."""
    vocab, pad = adapter.capabilities.vocab_size, pad_token(adapter)
    return [random_ids(seed * 31 + i, (n,), vocab, pad) for i, n in enumerate(lengths)]


def row_lengths(capabilities: Capabilities, lengths: Sequence[int], cached: bool = False) -> list[int]:
    """A case's row lengths as the model can take them: a model that takes no attention mask
    cannot be padded, nor can the rows of a cache whose protocol takes none (``cached``), so
    every row then has the longest length."""
    if capabilities.takes_attention_mask and not (cached and capabilities.unpadded_cache_reason):
        return list(lengths)
    return [max(lengths)] * len(lengths)


def perturb(ids: Tensor, where: Tensor, vocab_size: int, seed: int, avoid: int | None = None) -> Tensor:
    """A copy of ``ids`` with every position in ``where [B, T]`` changed to another id."""
    generator = torch.Generator().manual_seed(seed + 1_000_003)
    offset = torch.randint(1, max(2, vocab_size - 1), ids.shape, generator=generator).to(ids.device)
    changed = offset.add_(ids).remainder_(vocab_size)  # never the original id: 0 < offset < V - 1
    if avoid is not None and vocab_size > 2:
        # Step past the pad id, then past the original id, then past the pad id again.
        for skip in (avoid, ids, avoid):
            changed.add_(changed == skip).remainder_(vocab_size)
    return torch.where(where.bool(), changed, ids)


def pad_rows(rows: Sequence[Tensor], length: int, side: str, pad_id: int) -> tuple[Tensor, Tensor]:
    """Stack 1-D id rows into ``[B, length]`` with padding on ``side``; returns (ids, mask)."""
    batch = len(rows)
    ids = torch.full((batch, length), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i, row in enumerate(rows):
        n = row.numel()
        if n > length:
            raise ValueError(f"row of {n} tokens does not fit in length {length}")
        start = length - n if side == "left" else 0
        ids[i, start : start + n] = row
        mask[i, start : start + n] = 1
    return ids, mask


def positions_for(adapter: Adapter, mask: Tensor) -> Tensor | None:
    """Position ids derived from the mask, for models that take them (so padding does not shift positions)."""
    if not adapter.capabilities.takes_position_ids:
        return None
    return positions_from_mask(mask, offset=adapter.capabilities.position_offset)


def same_shape_outcome(
    adapter: Adapter,
    context: RunContext,
    base: Batch,
    perturbed: Batch,
    where: Tensor,
    what: str,
    first: Tensor | None = None,
) -> Evaluation:
    """Logits at ``where [B, T]`` must not move beyond the same-shape threshold when
    ``base`` becomes ``perturbed``, both run in one forward (``first``: its logits
    ``[2B, T, V]``, asked for already; None: asked here).

    The repeat floor (a copy of ``base`` in the same forward) is measured only for a case
    that does not pass without it: every threshold grows with the floor, so a case that
    passes at floor 0 passes at any floor. A case that does not is judged again on the
    forward the floor needs, ``[base, base, perturbed]``, as if the first had not run."""
    size, normalise = base.size, log_probabilities(adapter)
    logits = (yield from one_forward(adapter, [base, perturbed])) if first is None else first  # [2B, T, V]
    comparison = compare_logits(logits[:size], logits[size:], where, normalise)
    outcome = verdict(comparison, 0.0, context.tolerance.same_shape(0.0, context.dtype, comparison.scale), what)
    if outcome.status == "pass":
        return outcome
    logits = yield Logits(adapter, concat([base, base, perturbed]))  # [3B, T, V]: the copy gives the floor
    floor = repeat_floor(logits, size, where, normalise)
    comparison = compare_logits(logits[:size], logits[2 * size :], where, normalise)
    threshold = context.tolerance.same_shape(floor, context.dtype, comparison.scale)
    return verdict(comparison, floor, threshold, what)


def with_floor(
    adapter: Adapter,
    batch: Batch,
    where: Tensor,
    judge: Callable[[Tensor, float], Outcome],
    keep: int | None = None,
    first: Tensor | None = None,
) -> Evaluation:
    """``judge(logits of batch [B, T, V], floor)`` at floor 0; a judgement that is not a pass
    is made again on ``batch`` run beside its copy, at the floor the copy measures (the
    difference of the two at ``where [B, T]``). Every threshold grows with the floor, so a
    pass at floor 0 is a pass at any floor, and the copy costs nothing on a case that passes.
    ``keep``: the judge compares only the last ``keep`` positions, and gets (and ``where``
    covers) only those, ``[B, keep, V]``. ``first``: the logits of ``batch`` (and ``keep``),
    asked for already beside other requests; None: asked here."""
    logits = (yield Logits(adapter, batch, keep)) if first is None else first  # [B, T or keep, V]
    outcome = judge(logits, 0.0)
    if outcome.status == "pass":
        return outcome
    logits = yield Logits(adapter, concat([batch, batch]), keep)  # [2B, T or keep, V]: the copy gives the floor
    return judge(logits[: batch.size], repeat_floor(logits, batch.size, where, log_probabilities(adapter)))


def shape_change_outcome(
    context: RunContext,
    reference: Tensor,
    test: Tensor,
    where: Tensor,
    floor: float,
    what: str,
    normalise: bool | None = None,
    offset: int = 0,
) -> Outcome:
    """``[B, T, V]`` logits computed two ways (cached vs full, saved vs loaded) compared at
    ``where [B, T]`` under the shape-changing rule, in the context's units (``normalise=False``
    for saved log-probabilities); ``offset``: the logits are a sequence's from that position on
    (:func:`compare_logits`)."""
    if normalise is None:
        normalise = context.log_probabilities
    comparison = compare_logits(reference, test, where, normalise, offset=offset)
    threshold = context.tolerance.shape_change(floor, context.dtype, comparison.scale)
    return verdict(comparison, floor, threshold, what)


def verdict(comparison: Comparison, floor: float, threshold: float, what: str) -> Outcome:
    """Turn a comparison into pass/fail with a message that prints measured, floor and threshold."""
    if not math.isfinite(floor):
        return nonfinite_floor(floor, threshold, what)
    nonfinite = comparison.nonfinite
    if nonfinite:
        label = f"{comparison.index_name}, position"
        return Outcome(
            "fail",
            float("inf"),
            floor,
            threshold,
            nonfinite,
            f"the model's logits are NaN/inf at {len(nonfinite)} compared position(s) {nonfinite[:8]}, so nothing "
            f"could be compared (while checking: {what})",
            positions_label=label,
        )
    if comparison.max_diff > threshold:
        positions = comparison.positions_over(threshold)
        message = (
            f"{what}: max |d {comparison.quantity}| = {comparison.max_diff:.3g} > threshold {threshold:.3g} "
            f"(noise floor {floor:.3g}) at [{comparison.index_name}, position] {positions[:8]}"
        )
        return Outcome(
            "fail",
            comparison.max_diff,
            floor,
            threshold,
            positions,
            message,
            positions_label=f"{comparison.index_name}, position",
        )
    return Outcome("pass", comparison.max_diff, floor, threshold, [], "")


def nonfinite_floor(floor: float, threshold: float, what: str) -> Outcome:
    """A repeat floor that is NaN or inf: the model's own output at a compared position is
    not finite, so no threshold can be derived and nothing can pass."""
    message = (
        f"the model's logits are NaN/inf at compared positions (noise floor {floor}), so nothing could be compared "
        f"(while checking: {what})"
    )
    return Outcome("fail", float("inf"), floor, threshold, [], message)


def gradient_check(adapter: Adapter, name: str, evaluate: Callable[[Any], Outcome], cases: Any) -> Any:
    """A backward leak check (:func:`gradient_outcome`), or its ``not_applicable`` result for a
    model without a token embedding to differentiate. It runs once, on the training forward
    it differentiates: the call paths do not apply to it."""
    if adapter.embedding_module() is None:
        reason = adapter.no_backward_reason or (
            "the model has no nn.Embedding whose output can be differentiated (name one in maskcheck_embedding)"
        )
        return CheckResult(name, "not_applicable", reason)
    return Check(
        name,
        evaluate,
        cases,
        max_examples=GRADIENT_CASES,
        on_paths=False,
        path=TRAINING_BACKWARD.name,
        replays=GRADIENT_CASES,
    )


#: Cases a gradient check evaluates: each is a forward and a backward, and a masked gradient
#: is exactly zero or not, so a few cases suffice when they hold the structure the forward
#: checks drew (the longest row, each padding side). They are the forward check's most
#: informative cases (``Check.replays``), not draws of their own: five draws of their own can
#: all be right-padded, which shows no leak of a model that ignores its mask. Where every
#: forward check failed, it searches their draws itself (harness/audits/runner.py).
GRADIENT_CASES = 3


def gradient_outcome(
    adapter: Adapter, context: RunContext, batch: Batch, outputs: Tensor, hidden: Tensor, seed: int, what: str
) -> Outcome:
    """The backward leak test: the gradient of the log-probabilities at ``outputs [B, T]``
    with respect to the token embeddings at ``hidden [B, T]`` (positions those outputs must
    not see) must be zero under the same-shape rule at floor 0. A masked contribution is an
    exact zero in the backward pass as in the forward one, so the threshold is only the
    arithmetic term, ``same_shape_ulps * eps * scale``, with ``scale`` the largest gradient
    at a position the outputs may see."""
    gradients, _ = adapter.input_gradients(batch, outputs, seed)  # [B, T]
    nonfinite = (
        "a training step on this batch gets NaN/inf gradients (often a fully masked query row whose NaN the backward "
        "carries into real positions)"
    )
    return zero_gradient_outcome(context, gradients, hidden, what, "the token embeddings", nonfinite)


def zero_gradient_outcome(
    context: RunContext,
    gradients: Tensor,
    hidden: Tensor,
    what: str,
    at: str,
    nonfinite: str,
    visible: str = "a visible position",
) -> Outcome:
    """``gradients [B, T]`` (a norm per position, of a gradient taken ``at`` something) must be
    zero where ``hidden [B, T]`` is True, under the same-shape rule at floor 0: a contribution
    that is masked, or never read, is an exact zero in the backward pass. The threshold is only
    the arithmetic term, ``same_shape_ulps * eps * scale``, with ``scale`` the largest gradient
    where ``hidden`` is False (``visible`` names such a position). ``nonfinite`` says what a
    NaN/inf gradient means."""
    hidden, shown = hidden.cpu().bool(), (~hidden.cpu().bool())
    if not bool(torch.isfinite(gradients).all()):
        cells = (~torch.isfinite(gradients)).nonzero().tolist()
        return Outcome(
            "fail", float("inf"), 0.0, 0.0, cells[:8],
            f"the gradient at {at} is NaN/inf at [row, position] {cells[:8]}: {nonfinite}, so nothing could be "
            f"compared (while checking: {what})",
        )  # fmt: skip
    scale = float(gradients[shown].max()) if shown.any() else 0.0
    threshold = context.tolerance.same_shape(0.0, context.dtype, scale)
    leaked = gradients.masked_fill(~hidden, 0.0)  # [B, T]
    measured = float(leaked.max()) if hidden.any() else 0.0
    if measured <= threshold:
        return Outcome("pass", measured, 0.0, threshold)
    positions = (leaked > threshold).nonzero().tolist()
    message = (
        f"{what}: gradient norm {measured:.3g} > threshold {threshold:.3g} (largest at {visible} "
        f"{scale:.3g}; noise floor 0) at [row, position] {positions[:8]}"
    )
    return Outcome("fail", measured, 0.0, threshold, positions, message)


def real_logits(logits: Tensor, mask: Tensor, row: int) -> Tensor:
    """The logits ``[n, V]`` of the real tokens of one row, in order."""
    return logits[row][mask[row].bool().to(logits.device)]


def aligned_outcome(
    context: RunContext,
    pairs: Sequence[tuple[Tensor, Tensor, int]],
    floor: float,
    what: str,
    index_name: str = "row",
) -> Outcome:
    """Shape-changing comparison: each pair is (reference ``[n, V]``, test ``[n, V]``, index);
    the threshold follows the FlashAttention rule (``k * floor + arithmetic floor``).
    Failing positions are reported as ``[index, position]``; ``index_name`` says what the
    index counts (batch rows, or packed sequences)."""
    pairs = [(ref, tst, row) for ref, tst, row in pairs if ref.shape[0]]
    if not pairs:
        return Outcome("pass", message="no real positions to compare")
    if not math.isfinite(floor):
        return nonfinite_floor(floor, float("nan"), what)
    device = pairs[0][0].device
    normalise = context.log_probabilities
    diff, max_diff, scale = compare_rows(
        torch.cat([ref for ref, _, _ in pairs]), torch.cat([tst.to(device) for _, tst, _ in pairs]), normalise
    )  # [N]
    threshold = context.tolerance.shape_change(floor, context.dtype, scale)
    if max_diff <= threshold:  # a pass: no positions to name
        return Outcome("pass", max_diff, floor, threshold)
    lengths = [ref.shape[0] for ref, _, _ in pairs]
    index = (
        torch.repeat_interleave(torch.arange(len(pairs)), torch.tensor(lengths)),
        torch.cat([torch.arange(n) for n in lengths]),
    )  # ([N], [N])
    comparison = Comparison(
        max_diff,
        scale,
        diff.cpu(),
        index,
        (len(pairs), max(lengths)),
        [row for _, _, row in pairs],
        index_name,
        quantity_of(normalise),
    )
    return verdict(comparison, floor, threshold, what)


def repeat_floor(logits: Tensor, size: int, where: Tensor, normalise: bool = True) -> float:
    """The difference between the two copies of a batch run twice in one forward (``[2B, T, V]``),
    in the units the comparison uses (``normalise``: log-probabilities)."""
    first, second = logits[:size], logits[size : 2 * size]
    if torch.equal(first, second):  # the usual answer on a CPU, in one op instead of a comparison
        return 0.0
    return compare_logits(first, second, where, normalise, with_scale=False).max_diff


def log_probabilities(adapter: Adapter) -> bool:
    """Whether ``adapter``'s outputs are compared as log-probabilities (else raw: outputs.py)."""
    return adapter.capabilities.output_kind.log_probabilities


#: Explanations a verdict's message may end with, by name. A check that later finds the
#: explanation wrong (the padded ids themselves move real outputs) removes it by name.
CAVEATS = {
    "left_padding_positions": (
        "; the model takes no position ids and does not derive them from the mask, so left padding shifts "
        "the positions of real tokens: a real behaviour to know (pad on the right for this model), not a mask leak"
    ),
    "decoder_positions": (
        "; the model takes no position ids, so left padding shifts the positions of real tokens, and batched "
        "generation must left-pad a decoder-only model: nothing a caller passes can fix it (derive positions from "
        "attention_mask, or accept position_ids)"
    ),
}
MASK_NOT_APPLIED = (
    "; other ids in the padded slots move real outputs too, so this is not only shifted positions: "
    "the padding mask is not applied"
)


def without_positional_caveat(check: Any) -> None:
    """A left-padding verdict explained by shifted positions, for a model whose padded ids
    were shown to move real outputs: the mask itself leaks, so the caveat does not hold."""
    if check.caveat in CAVEATS:
        check.status = "fail"
        check.message = check.message.removesuffix(CAVEATS[check.caveat]) + MASK_NOT_APPLIED
        check.caveat = None


def without_positional_caveats_if(results: list, leak_check: str) -> None:
    """A suite's positional caveats rest on ``leak_check`` (other ids in the padded slots)
    passing: where it failed, the mask is not applied and no check keeps its caveat."""
    if any(r.name == leak_check and r.status == "fail" for r in results):
        for result in results:
            without_positional_caveat(result)


def checked_positional_caveat(
    b: RowBatches, context: RunContext, outcome: Outcome, batch: Batch, seed: int
) -> Evaluation:
    """``outcome`` with its positional caveat (:func:`left_padding_caveat`) checked on
    ``batch``: other ids in its padded slots must not move its real logits (same shapes).
    Where they do, the mask is not applied and the caveat goes. For suites that do not
    measure that themselves (the padding suite's pad_ids does); costs forwards only when
    the caveat was given."""
    if outcome.caveat not in CAVEATS:
        return outcome
    ids, mask = batch.predicted_ids, batch.predicted_mask
    assert mask is not None
    perturbed = b.with_ids(batch, perturb(ids, mask == 0, b.caps.vocab_size, seed))
    moved = yield from same_shape_outcome(
        b.adapter, context, batch, perturbed, mask.bool(), "other ids in the padded slots"
    )
    if moved.status == "fail":
        without_positional_caveat(outcome)
    return outcome


def left_padding_caveat(outcome: Outcome, capabilities, side: str) -> Outcome:  # type: ignore[no-untyped-def]
    """What a shape-changing failure under left padding means for a model whose positions
    may not follow the mask (same-shape checks rule out a mask leak):

    - a decoder-only model that takes no position ids: ``fail`` (generation left-pads it,
      and no input fixes its positions);
    - an encoder or encoder-decoder: ``warn`` (left padding is not their convention; they
      are right-padded, where the checks must hold exactly).

    A model whose positions follow the mask (it takes position ids, which the suites pass,
    or derives them) keeps its ``fail``: the difference is not positional."""
    positions_follow_mask = capabilities.takes_position_ids or capabilities.derives_positions_from_mask
    if outcome.status != "fail" or side != "left" or positions_follow_mask or outcome.max_diff == float("inf"):
        return outcome
    if capabilities.family == "decoder":
        outcome.caveat = "decoder_positions"
    else:
        outcome.status = "warn"
        outcome.caveat = "left_padding_positions"
    outcome.message += CAVEATS[outcome.caveat]
    return outcome


def outputs_named(kind: OutputKind) -> str:
    """How a check's message names the outputs it compares at real positions: a language
    model's logits, another head's outputs, or the one output of each row (outputs.py)."""
    if kind.is_vocabulary:
        return "real logits"
    return "real positions' outputs" if kind.per_position else f"the pooled output ({kind.name})"


class RowBatches:
    """Batches of padded rows for one adapter, padded on the side whose logits it predicts.

    Encoder-decoders are padded on the decoder side; each row gets a source that depends
    only on its index in the case (``first_row + i``), so a row run alone reads the same
    source as in its batch. :meth:`sources` is the hook a suite overrides for other sources.
    """

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.caps = adapter.capabilities
        self.pad = pad_token(adapter)
        #: what a message calls the outputs compared at real positions (outputs.py)
        self.outputs = outputs_named(self.caps.output_kind)

    def rows(self, lengths: Sequence[int], seed: int) -> list[Tensor]:
        return random_rows(self.adapter, lengths, seed)

    def sources(self, count: int, first_row: int, padding: int) -> tuple[Tensor, Tensor]:
        """``count`` unpadded sources of 4 tokens (``padding`` is for subclasses)."""
        sources = [random_ids(12345 + first_row + i, (4,), self.caps.vocab_size, self.pad) for i in range(count)]
        source = torch.stack(sources)
        return source, torch.ones_like(source)

    def batch(
        self,
        rows: Sequence[Tensor],
        length: int,
        side: str,
        with_positions: bool = True,
        first_row: int = 0,
        source_padding: int = 0,
    ) -> Batch:
        """Pad ``rows`` to ``length``; ``first_row`` is the index of rows[0] in the case."""
        ids, mask = pad_rows(rows, length, side, self.pad)
        device = self.caps.device
        ids, mask = ids.to(device), mask.to(device)
        if self.caps.family == "encoder_decoder":
            source, source_mask = self.sources(len(rows), first_row, source_padding)
            return Batch(source.to(device), source_mask.to(device), decoder_input_ids=ids, decoder_attention_mask=mask)
        positions = positions_for(self.adapter, mask) if with_positions else None
        return Batch(ids, mask, positions)

    def with_ids(self, batch: Batch, ids: Tensor) -> Batch:
        """``batch`` with other ids on the predicted side."""
        if self.caps.family == "encoder_decoder":
            return Batch(
                batch.input_ids,
                batch.attention_mask,
                decoder_input_ids=ids,
                decoder_attention_mask=batch.decoder_attention_mask,
            )
        return Batch(ids, batch.attention_mask, batch.position_ids)
