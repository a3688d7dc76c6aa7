"""Which position a per-row output pools, and what decides it: measured for the padding suite.

A model that returns one output per row (a classifier, a reward head, an embedding) reads
it from some position, or pools over positions, and padding decides where that is. The
padding suite's drawn checks compare the pooled output with the row alone; this module
measures, before they run, the conditions under which the pooled output can equal it:

- each padding side: a row padded on it (the pad id in every padded slot, the mask right)
  against the row alone;
- what decides the pooled position: the same padded rows with other ids in the padded
  slots and the same mask. Equal: the attention mask decides. Moved (while the pad ids
  gave the row alone): the ids do, as transformers' decoder classifiers score the last
  token that is not ``pad_token_id``. Where the pad id is also the EOS id, a row ending in
  EOS is then scored before it, which is measured too.

One named condition that makes every padding check equal the row alone (one padding side,
or the pad id in every padded slot) turns the suite's findings into a ``warn`` naming it;
a side that breaks on the model's own padding side (its tokenizer's, else declared, else
right for an encoder; a decoder has none: generation pads prompts on the left, and reward
models score such batches) is a ``fail``, as is a pooled output that no condition saves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..harness.adapters.base import Adapter, AdapterError, Batch
from ..harness.adapters.outputs import KINDS
from ..harness.engine.batching import run_alone
from ..harness.engine.cases import RowBatches, aligned_outcome, perturb, real_logits, with_floor
from ..harness.engine.suite import CheckResult, Outcome, RunContext
from ..harness.engine.tolerance import LOW_PRECISION

SIDES = ("right", "left")
#: the rows measured: two lengths, so that the padded rows of one batch differ in padding
ROW_LENGTHS = (5, 3)
EXTRA_PADDING = 2


@dataclass
class Pooling:
    """What the measurement found, and the condition (if any) the drawn checks keep."""

    kind: str  # the output kind's name
    by_side: dict[str, Outcome] = field(default_factory=dict)  # the pad id in padded slots: equal to the row alone?
    other_ids: dict[str, Outcome] = field(default_factory=dict)  # other ids in padded slots, the same mask
    model_side: str | None = None  # the side the model is padded on
    side_source: str = ""  # where model_side comes from
    eos_skipped: bool | None = None  # pad id == EOS id: a row ending in EOS scores as the row without it

    @property
    def pooled(self) -> str:
        """The output, as a message names it: its kind's name and what that is."""
        return f"the pooled output ({self.kind}: {KINDS[self.kind]})"

    @property
    def sides(self) -> tuple[str, ...]:
        """The padding sides on which the pooled output equals the row alone (pad ids in padded slots)."""
        return tuple(side for side in SIDES if self.by_side[side].status == "pass")

    @property
    def ids_decide(self) -> bool:
        """Pad ids give the row alone where other ids in the same slots, under the same mask, do not."""
        return any(self.other_ids[side].status != "pass" for side in self.sides)

    @property
    def drawn_sides(self) -> tuple[str, ...]:
        """The sides the drawn checks pad on: the one side kept, where a side is the condition."""
        return self.sides if len(self.sides) == 1 and self.sides[0] == self.model_side else SIDES

    def result(self) -> CheckResult:
        """The ``pooling`` check: pass with what decides the pooled position, warn naming the
        condition the model's use keeps, or fail."""
        found = self._found()
        if not self.sides:
            worst = max(self.by_side.values(), key=lambda o: o.ratio)
            return self._check("fail", f"{self.pooled} reads padded slots: {found}", worst)
        if len(self.sides) == 1:
            broken = next(side for side in SIDES if side not in self.sides)
            if self.model_side != self.sides[0]:
                whose = (
                    f"the model's own padding side ({self.side_source})"
                    if self.model_side
                    else (
                        "and a decoder has no default padding side: generation pads prompts on the left, and reward "
                        "models score such batches (declare padding_side where the model is only ever padded on the "
                        f"{self.sides[0]})"
                    )
                )
                message = f"{broken} padding changes {self.pooled}, {whose}: {found}"
                return self._check("fail", message, self.by_side[broken])
        conditions = self._conditions()
        if not conditions:
            return CheckResult("pooling", "pass", convention=found)
        message = f"{self.pooled} equals the row alone only when {' and '.join(conditions)}: {found}"
        return self._check("warn", message, None)

    def _conditions(self) -> list[str]:
        conditions = []
        if len(self.sides) == 1:
            conditions.append(f"rows are padded on the {self.sides[0]} ({self.side_source})")
        if self.ids_decide:
            conditions.append("every padded slot holds the pad id")
        return conditions

    def _found(self) -> str:
        """The measurement in words: each side, what decides, the EOS finding."""
        parts = []
        for side in SIDES:
            outcome = self.by_side[side]
            said = "equal to the row alone" if outcome.status == "pass" else f"differ by {outcome.max_diff:.3g}"
            parts.append(f"{side}-padded rows {said}")
        if self.sides:
            decides = "input_ids == the pad id" if self.ids_decide else "the attention mask"
            parts.append(f"the pooled position is decided by {decides}")
        if self.eos_skipped:
            parts.append(
                "the pad id is also the EOS id, so a row that ends in EOS (as tokenizers append it) is scored at "
                "the token before it (measured: the same output as the row without its EOS)"
            )
        return "; ".join(parts)

    def _check(self, status: str, message: str, outcome: Outcome | None) -> CheckResult:
        """The check's result, with the measured side's difference, floor and threshold where there is one."""
        if outcome is None:
            return CheckResult("pooling", status, message)
        return CheckResult(
            "pooling", status, message, max_diff=outcome.max_diff, floor=outcome.floor, threshold=outcome.threshold
        )

    def pad_ids_condition(self) -> str | None:
        """Why pad_ids may fail and the suite still warn: the pad ids decide the pooled position."""
        if not self.ids_decide or len(self.sides) == 1 and self.model_side != self.sides[0]:
            return None
        return (
            "; the model finds its pooled position where input_ids equal the pad id, so a padded slot must hold the "
            "pad id (measured by pooling): a real behaviour to know, not a mask leak"
        )


def model_side(adapter: Adapter) -> tuple[str | None, str]:
    """The side the model is padded on, and where that comes from: its tokenizer's
    ``padding_side`` (read into ``Capabilities.padding_side``), else right for an encoder
    (BERT's tokenizers pad there), else none (a decoder: generation pads on the left)."""
    caps = adapter.capabilities
    if caps.padding_side is not None:
        source = "its tokenizer's padding_side" if caps.tokenizer is not None else "declared padding_side"
        return caps.padding_side, source
    if caps.family == "encoder":
        return "right", "an encoder's default"
    return None, ""


def measure_pooling(adapter: Adapter, context: RunContext) -> Pooling:
    """The measurement the module docstring describes, on two rows of :data:`ROW_LENGTHS`. It
    measures structure (which slots the pooled output reads), so a bfloat16 or float16 model
    is measured on its float32 copy at float32's thresholds, as its checks' ``float32_twin``
    path judges them: the low precision's rounding hides a first slot read from the padding
    (0.015 on a BERT classifier, under bfloat16's threshold)."""
    if context.dtype in LOW_PRECISION and context.twin_tolerance is not None:
        try:
            adapter = adapter.float32_twin()
        except AdapterError:
            pass  # no copy: measured in the model's own precision
        else:
            context = dataclasses.replace(context, tolerance=context.twin_tolerance, dtype="float32")
    b = RowBatches(adapter)
    side, source = model_side(adapter)
    pooling = Pooling(adapter.capabilities.output_kind.name, model_side=side, side_source=source)
    rows = b.rows(ROW_LENGTHS, context.seed)
    alone = [adapter.logits(b.batch([row], row.numel(), "right")) for row in rows]  # [1, n, C] each
    length = max(ROW_LENGTHS) + EXTRA_PADDING
    for padded_on in SIDES:
        padded = b.batch(rows, length, padded_on)
        mask = padded.predicted_mask
        assert mask is not None
        pooling.by_side[padded_on] = _against_alone(
            adapter, context, padded, alone, f"{padded_on}-padded rows against the rows alone"
        )
        other = b.with_ids(padded, perturb(padded.predicted_ids, mask == 0, b.caps.vocab_size, context.seed, b.pad))
        pooling.other_ids[padded_on] = _against_alone(
            adapter, context, other, alone, f"{padded_on}-padded rows holding other ids against the rows alone"
        )
    eos = adapter.capabilities.eos_token_id
    if pooling.ids_decide and eos is not None and eos == adapter.capabilities.pad_token_id:
        ended = torch.cat([rows[0], torch.tensor([eos], device=rows[0].device)])  # [n + 1]
        with_eos = adapter.logits(b.batch([ended], ended.numel(), "right"))[:, -1]  # [1, C]
        pooling.eos_skipped = bool(torch.equal(with_eos, alone[0][:, -1]))
    return pooling


def _against_alone(adapter: Adapter, context: RunContext, batch: Batch, alone: list, what: str) -> Outcome:
    """``batch``'s rows against each row alone, under the shape-changing rule, at the floor a
    copy of ``batch`` measures where the judgement at floor 0 is not a pass (``with_floor``)."""
    mask = batch.predicted_mask
    assert mask is not None

    def judge(logits: torch.Tensor, floor: float) -> Outcome:
        pairs = [(alone[i][0], real_logits(logits, mask, i), i) for i in range(len(alone))]
        return aligned_outcome(context, pairs, floor, what)

    return run_alone(with_floor(adapter, batch, mask.bool(), judge))
