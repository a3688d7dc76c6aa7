"""loss_masking: the loss counts only valid targets, with the right shift and normaliser.

Checks (models that compute their own loss)
- ``reference_loss``: the model's loss equals a float64 cross-entropy computed from its
  own logits: targets shifted by one for decoders (position t predicts token t + 1),
  unshifted for encoders (MLM) and encoder-decoders, ``-100`` ignored, mean over valid
  targets. On a mismatch the message says which common mistake the loss matches.
  A loss that differs is fitted once more as a label-smoothed cross-entropy (PyTorch's
  ``label_smoothing``: ``(1 - e) * nll + e * mean over the vocabulary of -log p``, both
  terms over valid targets): the model's loss of the case's labels and of the same valid
  positions labelled with their most likely tokens give ``e``, which must then predict the
  first loss within the threshold, with ``0 < e < 1``. A fit is the loss's convention, said
  in the check's message and on the suite's line; a wrong shift or normaliser fits no ``e``.
- ``ignored_logits``: what must hold in every convention, exactly: the loss's gradient with
  respect to the logits that predict an ignored (-100) target, or none (a decoder's last
  position), is zero. It holds on a random-init model, whose near-uniform logits hide most
  differences in the loss's value (a smoothing term averaged over the ignored positions too
  moves the loss by a tenth of a percent there, and its gradient by all of it).
- ``padded_inputs``: changing the ids at padded slots (labelled -100) leaves the loss
  unchanged (same-shape rule).
- ``extra_padding``: adding padding columns (labelled -100) leaves the loss unchanged.

Labels are built as collators build them: ``labels = input_ids`` with -100 at padding
(transformers' ``DataCollatorForLanguageModeling``), plus the case's own ignored targets. A
token classifier (``label_scores``, harness/adapters/outputs.py) gets label indices instead,
-100 at padding as ``DataCollatorForTokenClassification`` pads them and at the case's ignored
targets as the tokenizer's ``word_ids`` alignment leaves sub-word continuations; its targets
are never shifted.
Under left padding such labels make the last padded slot of each row predict the row's
first real token: that target's logits are computed at a padded position, so the loss of
every correct model moves with the padded ids and the padding amount (and with what a
stacked forward adds). The three checks above therefore score every target except those
(labelled -100 for them), and ``padded_inputs`` says so in its message, with what to do
about it: the behaviour belongs to every shifted loss, so it is a note, not a verdict.
Right-padded and unpadded rows keep every label, so a loss that counts its targets before
the shift is seen there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.adapters.outputs import KINDS
from ..harness.engine.batching import Evaluation, Logits
from ..harness.engine.cases import (
    GRADIENT_CASES,
    left_padding_caveat,
    pad_rows,
    pad_token,
    perturb,
    positions_for,
    random_ids,
    random_rows,
    row_lengths,
    without_positional_caveats_if,
    zero_gradient_outcome,
)
from ..harness.engine.strategies import case_strategy
from ..harness.engine.suite import Check, CheckResult, Outcome, RunContext, Suite

IGNORE = -100
MAX_LENGTH = 12
LEFT_PADDED_FIRST_TARGET = (
    "; under left padding, labels as collators build them (input_ids, -100 at padding) also make the last padded "
    "slot predict each row's first real token, a target whose loss moves with the padded ids for any model: it is "
    "left out here; label it -100 too, or pad on the right"
)


@dataclass(frozen=True)
class LossCase:
    lengths: tuple[int, ...]
    extra: int  # padded slots beyond the longest row
    side: str
    ignored: int  # how many real targets per row are also set to -100
    seed: int


def loss_cases(max_length: int) -> st.SearchStrategy[LossCase]:
    return case_strategy(
        LossCase,
        lengths=st.lists(st.integers(2, max_length), min_size=1, max_size=3),
        extra=st.integers(1, 4),
        side=st.sampled_from(["right", "left"]),
        ignored=st.integers(0, 2),
        seed=st.integers(0, 2**16),
    )


def shifts_targets(capabilities: Capabilities) -> bool:
    """Whether the loss scores position t against ``labels[t + 1]``: a language model's decoder
    does; a token classifier labels each token itself, whatever its family."""
    return capabilities.family == "decoder" and capabilities.output_kind.is_vocabulary


def tagger_labels(labels: int, lengths: list[int], seed: int) -> list[Tensor]:
    """A label index in ``[0, labels)`` for each real token of each row, drawn per row, so a row's
    labels are the same however it is padded."""
    return [
        torch.randint(0, labels, (length,), generator=torch.Generator().manual_seed(seed + 17 * (i + 1)))
        for i, length in enumerate(lengths)
    ]


def scored(logits: Tensor, labels: Tensor, shift: bool) -> tuple[Tensor, Tensor]:
    """The logits and the targets they are scored against: a decoder's (``shift``) position t
    against ``labels[t + 1]``."""
    return (logits[:, :-1], labels[:, 1:]) if shift else (logits, labels)


def reference_cross_entropy(logits: Tensor, labels: Tensor, shift: bool, normaliser: str = "valid") -> float:
    """Cross-entropy in float64; ``normaliser`` "valid" (the right one) or "all" (a common bug)."""
    logits, labels = scored(logits, labels, shift)
    flat_logits = logits.reshape(-1, logits.shape[-1]).double()
    flat_labels = labels.reshape(-1)
    total = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE, reduction="sum")
    count = (flat_labels != IGNORE).sum() if normaliser == "valid" else flat_labels.numel()
    return float(total / count)


def uniform_target_loss(logits: Tensor, labels: Tensor, shift: bool) -> float:
    """The smoothing term of a label-smoothed cross-entropy, in float64: the mean over valid
    targets of ``-mean over the vocabulary of log p``."""
    logits, labels = scored(logits, labels, shift)
    valid = labels != IGNORE  # [B, T]
    log_p = torch.log_softmax(logits.double(), -1)[valid]  # [N, V]
    return float(-log_p.mean(-1).mean()) if valid.any() else 0.0


def ignored_positions(labels: Tensor, shift: bool) -> Tensor:
    """``[B, T]`` True at the positions whose logits no valid target is scored against: a
    decoder's position t predicts ``labels[t + 1]`` (its last position predicts nothing)."""
    if not shift:
        return labels == IGNORE
    ignored = torch.ones_like(labels, dtype=torch.bool)
    ignored[:, :-1] = labels[:, 1:] == IGNORE
    return ignored


def likeliest_targets(logits: Tensor, labels: Tensor, shift: bool) -> Tensor:
    """``labels`` with each valid target replaced by the token its logits rank first, so the
    same positions are scored, each at its lowest cross-entropy: against the case's labels it
    moves the cross-entropy term as far as the logits allow and the smoothing term not at all."""
    predicted = logits.argmax(-1).to(labels.device)  # [B, T]
    if shift:
        predicted = torch.cat([labels[:, :1], predicted[:, :-1]], dim=1)  # labels[t + 1] is read at logits[t]
    return torch.where(labels == IGNORE, labels, predicted)


@dataclass(frozen=True)
class SmoothingFit:
    """A label smoothing that explains the model's loss: ``(1 - e) * cross_entropy + e * uniform``."""

    smoothing: float
    residual: float  # |the model's loss - the fitted loss|, on the case's labels

    def describe(self) -> str:
        return f"label-smoothed cross-entropy, smoothing {self.smoothing:.4g} (fitted)"


def fit_smoothing(
    measured: float, other: float, logits: Tensor, labels: Tensor, other_labels: Tensor, shift: bool
) -> SmoothingFit | None:
    """The smoothing ``e`` that makes ``measured`` (the loss of ``labels``) and ``other`` (of
    ``other_labels``, the same valid positions) two label-smoothed cross-entropies of
    ``logits``; None when the two labellings do not move the cross-entropy enough to tell."""
    first = reference_cross_entropy(logits, labels, shift)
    second = reference_cross_entropy(logits, other_labels, shift)
    if abs(first - second) <= 1e-6 * max(1.0, abs(first)):
        return None
    smoothing = 1.0 - (measured - other) / (first - second)
    fitted = (1.0 - smoothing) * first + smoothing * uniform_target_loss(logits, labels, shift)
    return SmoothingFit(smoothing, abs(measured - fitted))


class LossMaskingSuite(Suite):
    name = "loss_masking"
    summary = "the loss counts only valid target positions, with the right shift and normaliser"
    order = 40
    kind = "mask"
    in_sweep = True
    long_rows_on_paths = False

    def __init__(self) -> None:
        # Set by checks(); a replay concludes without running them, so both start empty.
        self._shifted = False  # whether the model's loss shifts its targets (a decoder)
        self._fits: list[SmoothingFit] = []  # the label smoothings reference_loss fitted, case by case

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        output = capabilities.output_kind
        if output.name not in ("vocabulary", "label_scores"):
            return (
                f"the model returns {KINDS[output.name]}: these checks judge a loss over scores at each position "
                "(a language model's, a token classifier's); a pooled output's loss reads only that output, which "
                "the padding suite judges"
            )
        if not capabilities.has_loss:
            return "the model computes no loss of its own"
        return None  # without a mask, reference_loss runs on unpadded rows

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        self._shifted = shifts_targets(adapter.capabilities)
        self._fits = []
        longest = max(3, min(MAX_LENGTH, (adapter.capabilities.max_length or MAX_LENGTH) - 4))
        cases = loss_cases(longest)  # one strategy object: the three checks share its draws
        # ... and each computes the model's loss on the case's padded batch: once per case.
        padded_loss: dict[LossCase, float] = {}

        def loss_of(case: LossCase) -> float:
            if case not in padded_loss:
                padded_loss[case] = float(adapter.loss(*self._batch(adapter, case, max(case.lengths) + case.extra)))
            return padded_loss[case]

        reference = Check("reference_loss", lambda c: self.reference_loss(adapter, context, c, loss_of), cases)
        # A backward a case, of the loss alone: it evaluates the reference check's most informative cases.
        ignored = Check(
            "ignored_logits",
            lambda c: self.ignored_logits(adapter, context, c),
            cases,
            max_examples=GRADIENT_CASES,
            on_paths=False,
            replays=GRADIENT_CASES,
        )
        if not adapter.capabilities.takes_attention_mask:
            unpadded = "the model takes no attention mask, so its rows cannot be padded"
            return [
                reference,
                ignored,
                CheckResult("padded_inputs", "not_applicable", unpadded),
                CheckResult("extra_padding", "not_applicable", unpadded),
            ]
        checks = [
            reference,
            ignored,
            Check("padded_inputs", lambda c: self.padded_inputs(adapter, context, c, loss_of), cases),
            Check("extra_padding", lambda c: self.extra_padding(adapter, context, c, loss_of), cases),
        ]
        return checks

    def conclude(self, results: list) -> None:
        """extra_padding's positional caveat rests on padded_inputs passing: a loss that moves
        with the ids in padded slots (xLSTM ignores its mask) has no positions to blame. A
        decoder's padded_inputs notes the left-padded first target it leaves out."""
        without_positional_caveats_if(results, "padded_inputs")
        for result in results:
            if result.name == "reference_loss" and result.status == "pass" and self._fits:
                smoothing = sorted(fit.smoothing for fit in self._fits)[len(self._fits) // 2]
                result.convention = (
                    f"label-smoothed cross-entropy, smoothing {smoothing:.3g} (fitted on {len(self._fits)} cases)"
                )
                if "label-smoothed" not in result.message:
                    result.message = f"the loss is a {result.convention}; {result.message}"
            if result.name == "padded_inputs" and self._shifted and result.status in ("pass", "warn"):
                result.message += LEFT_PADDED_FIRST_TARGET

    def _batch(self, adapter: Adapter, case: LossCase, length: int) -> tuple[Batch, Tensor]:
        """The case's batch padded to ``length`` and its labels as collators build them, less
        the targets predicted from a padded slot: a left-padded decoder row's first real token
        is labelled -100 too (the module docstring)."""
        caps, pad = adapter.capabilities, pad_token(adapter)
        lengths = row_lengths(caps, case.lengths)
        if not caps.takes_attention_mask:  # nothing can be padded: no extra padding either
            length = max(lengths)
        rows = random_rows(adapter, lengths, case.seed)
        ids, mask = pad_rows(rows, length, case.side, pad)
        if caps.output_kind.is_vocabulary:
            labels = ids.masked_fill(mask == 0, IGNORE)  # [B, T]: DataCollatorForLanguageModeling's labels
        else:  # a tagger's: one label per real token, -100 at padding (DataCollatorForTokenClassification)
            labels, _ = pad_rows(tagger_labels(caps.output_width, lengths, case.seed), length, case.side, IGNORE)
        if shifts_targets(caps) and case.side == "left" and caps.takes_attention_mask:
            labels[torch.arange(len(rows)), mask.argmax(-1)] = IGNORE
        if case.ignored:  # up to that many valid targets a row become -100, never all of them
            generator = torch.Generator().manual_seed(case.seed)
            for i in range(len(rows)):
                # drawn among the real tokens after the first: the same choice whatever the first's label
                real = (mask[i] != 0).nonzero().flatten()[1:]
                n = real.numel()
                chosen = real[torch.randperm(n, generator=generator)[: max(0, min(case.ignored, n - 1))]]
                labels[i, chosen] = IGNORE
        ids, mask, labels = ids.to(caps.device), mask.to(caps.device), labels.to(caps.device)
        if caps.family == "encoder_decoder":
            source = random_ids(case.seed + 3, (len(rows), 4), caps.vocab_size, pad, caps.device)
            return Batch(source, torch.ones_like(source), decoder_input_ids=ids, decoder_attention_mask=mask), labels
        if not caps.takes_attention_mask:
            return Batch(ids, None, positions_for(adapter, mask)), labels
        return Batch(ids, mask, positions_for(adapter, mask)), labels

    def _judge(
        self, context: RunContext, measured: float, expected: float, floor: float, what: str, shape_change: bool
    ) -> Outcome:
        scale = max(1.0, abs(expected))
        rule = context.tolerance.shape_change if shape_change else context.tolerance.same_shape
        threshold = rule(floor, context.dtype, scale)
        diff = abs(measured - expected)
        if diff != diff or diff > threshold:  # NaN compares unequal to itself
            message = f"{what}: loss {measured:.6g} vs {expected:.6g}, |diff| = {diff:.3g} > threshold {threshold:.3g} (noise floor {floor:.3g})"
            return Outcome("fail", diff, floor, threshold, [], message)
        return Outcome("pass", diff, floor, threshold)

    def reference_loss(
        self, adapter: Adapter, context: RunContext, case: LossCase, loss_of: Callable[[LossCase], float]
    ) -> Evaluation:
        batch, labels = self._batch(adapter, case, max(case.lengths) + case.extra)
        shift = shifts_targets(adapter.capabilities)
        logits = yield Logits(adapter, batch)
        measured = loss_of(case)
        expected = reference_cross_entropy(logits, labels, shift)
        outcome = self._judge(
            context, measured, expected, 0.0, "the model's loss differs from cross-entropy over valid targets", True
        )
        if outcome.status != "fail":
            return outcome
        other_labels = likeliest_targets(logits, labels, shift)
        fit = fit_smoothing(measured, float(adapter.loss(batch, other_labels)), logits, labels, other_labels, shift)
        if fit is not None and 0.0 < fit.smoothing < 1.0 and fit.residual <= outcome.threshold:
            self._fits.append(fit)
            return Outcome(
                "pass",
                fit.residual,
                0.0,
                outcome.threshold,
                message=(
                    f"the loss is a {fit.describe()}: it predicts the model's loss {measured:.6g} within "
                    f"{fit.residual:.3g} (threshold {outcome.threshold:.3g}), its cross-entropy alone by {outcome.max_diff:.3g}"
                ),
            )
        outcome.message += "; " + self._diagnose(logits, labels, shift, measured, outcome.threshold)
        if fit is not None:
            outcome.message += (
                f"; nor is it label-smoothed: the smoothing that fits a second labelling of the same targets, "
                f"{fit.smoothing:.4g}, misses this loss by {fit.residual:.3g}"
            )
        return outcome

    def ignored_logits(self, adapter: Adapter, context: RunContext, case: LossCase) -> Outcome:
        """The gradient of the model's loss with respect to the logits that predict no valid
        target must be zero (``zero_gradient_outcome``): the loss does not read them."""
        batch, labels = self._batch(adapter, case, max(case.lengths) + case.extra)
        shift = shifts_targets(adapter.capabilities)
        gradients = adapter.loss_logit_gradients(batch, labels)  # [B, T]
        predicts = "its next token's label" if shift else "its label"
        what = f"the loss reads the logits of positions whose target ({predicts}) is ignored (-100) or absent"
        nonfinite = "the loss's backward is NaN/inf"
        return zero_gradient_outcome(
            context,
            gradients,
            ignored_positions(labels, shift).cpu(),
            what,
            "the logits",
            nonfinite,
            "a scored position",
        )

    def _diagnose(self, logits: Tensor, labels: Tensor, shift: bool, measured: float, threshold: float) -> str:
        candidates = {
            "targets not shifted" if shift else "targets shifted by one": reference_cross_entropy(
                logits, labels, not shift
            ),
            "normalised by all positions, not valid targets": reference_cross_entropy(logits, labels, shift, "all"),
            "ignored (-100) targets counted as padding targets": reference_cross_entropy(
                logits, labels.masked_fill(labels == IGNORE, 0), shift
            ),
        }
        if shift:  # the shifted targets' loss over the valid labels counted before the shift
            shifted = reference_cross_entropy(logits, labels, shift) * int((labels[:, 1:] != IGNORE).sum())
            candidates["valid targets counted before the shift (one too many per row)"] = shifted / max(
                1, int((labels != IGNORE).sum())
            )
        advice = {
            "targets not shifted": (
                "; a loss that takes targets already shifted (nanoGPT's) is given labels as a collator builds them "
                "(unshifted): wrap it as lambda logits, labels: loss(logits[:, :-1], labels[:, 1:])"
            ),
        }
        matches = [
            f"{name} ({value:.6g}){advice.get(name, '')}"
            for name, value in candidates.items()
            if abs(value - measured) <= max(threshold, 1e-6 * abs(value))
        ]
        if matches:  # on a small case two mistakes can give the same number: each is named
            return "it matches a loss with " + ", or with ".join(matches)
        return "it matches none of: " + ", ".join(candidates)

    def padded_inputs(
        self, adapter: Adapter, context: RunContext, case: LossCase, loss_of: Callable[[LossCase], float]
    ) -> Outcome:
        batch, labels = self._batch(adapter, case, max(case.lengths) + case.extra)
        mask = batch.predicted_mask
        changed = perturb(batch.predicted_ids, mask == 0, adapter.capabilities.vocab_size, case.seed)
        if adapter.capabilities.family == "encoder_decoder":
            perturbed = Batch(
                batch.input_ids, batch.attention_mask, decoder_input_ids=changed, decoder_attention_mask=mask
            )
        else:
            perturbed = Batch(changed, mask, batch.position_ids)
        first = loss_of(case)
        measured = float(adapter.loss(perturbed, labels))
        what = f"changing the ids at {case.side}-padded slots changed the loss"
        return with_repeat(
            lambda: float(adapter.loss(batch, labels)),
            first,
            lambda floor: self._judge(context, measured, first, floor, what, False),
        )

    def extra_padding(
        self, adapter: Adapter, context: RunContext, case: LossCase, loss_of: Callable[[LossCase], float]
    ) -> Outcome:
        narrow, narrow_labels = self._batch(adapter, case, max(case.lengths))
        wide, wide_labels = self._batch(adapter, case, max(case.lengths) + case.extra)
        first = loss_of(case)  # the loss of the wide batch
        expected = float(adapter.loss(narrow, narrow_labels))
        what = f"adding {case.extra} {case.side} padding column(s) changed the loss"

        def judge(floor: float) -> Outcome:
            return left_padding_caveat(
                self._judge(context, first, expected, floor, what, True), adapter.capabilities, case.side
            )

        return with_repeat(lambda: float(adapter.loss(wide, wide_labels)), first, judge)


def with_repeat(again: Callable[[], float], first: float, judge: Callable[[float], Outcome]) -> Outcome:
    """``judge(floor)`` at floor 0; a judgement that is not a pass is made again at the floor
    a repeat of the first loss measures, ``|first - again()|``. Thresholds grow with the
    floor, so the repeat costs nothing on a case that passes (as harness.engine.cases.with_floor)."""
    outcome = judge(0.0)
    if outcome.status == "pass":
        return outcome
    return judge(abs(first - again()))
