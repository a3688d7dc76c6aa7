"""cross_attention: the decoder must not read the encoder's source padding.

Checks (encoder-decoders only)
- ``source_pad_ids``: change the ids at padded source slots; decoder logits must not move
  (same-shape rule).
- ``source_padding_amount``: a padded source row gives the same decoder logits as the
  same source unpadded (shape-changing rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.engine.batching import Evaluation, Logits
from ..harness.engine.cases import (
    aligned_outcome,
    left_padding_caveat,
    pad_rows,
    pad_token,
    perturb,
    random_ids,
    random_rows,
    same_shape_outcome,
    with_floor,
)
from ..harness.engine.influence import measure_influence
from ..harness.engine.strategies import case_strategy
from ..harness.engine.suite import Check, Outcome, RunContext, Suite

MAX_LENGTH = 10


@dataclass(frozen=True)
class SourceCase:
    source_lengths: tuple[int, ...]  # real source tokens per row
    extra: int  # padded source slots beyond the longest row
    side: str
    target_length: int
    seed: int


def source_cases(max_length: int) -> st.SearchStrategy[SourceCase]:
    return case_strategy(
        SourceCase,
        source_lengths=st.lists(st.integers(1, max_length), min_size=1, max_size=3),
        extra=st.integers(1, 4),
        side=st.sampled_from(["right", "left"]),
        target_length=st.integers(1, max_length),
        seed=st.integers(0, 2**16),
    )


class CrossAttentionSuite(Suite):
    name = "cross_attention"
    summary = "encoder source padding is never read by the decoder"
    order = 30
    kind = "mask"
    in_sweep = True
    draws_effective_mask = True
    long_rows_on_paths = False

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        if capabilities.family != "encoder_decoder":
            return f"{'an' if capabilities.family == 'encoder' else 'a'} {capabilities.family} model has no cross-attention"
        if not capabilities.takes_attention_mask:
            return "the model takes no source attention mask"
        return None

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        longest = max(2, min(MAX_LENGTH, (adapter.capabilities.max_length or MAX_LENGTH) - 4))
        cases = source_cases(longest)  # one strategy object: both checks share its draws
        return [
            Check("source_pad_ids", lambda c: self.source_pad_ids(adapter, context, c), cases),
            Check("source_padding_amount", lambda c: self.source_padding_amount(adapter, context, c), cases),
        ]

    def effective_mask(self, adapter: Adapter, context: RunContext, length: int = 8, padding: int = 2) -> tuple:
        """Influence of each source position on each decoder output, for a source with
        ``padding`` right-padded slots; expected: every decoder output may read the real source."""
        case = SourceCase((length - padding,), padding, "right", 4, context.seed)
        sources, target = self._parts(adapter, case)
        row = self._batch(adapter, sources, length, "right", target)
        influence = measure_influence(adapter, context, row, context.seed)
        expected = row.attention_mask[0].bool().cpu()[None, :].expand(target.shape[1], -1)
        return influence, expected

    def _parts(self, adapter: Adapter, case: SourceCase) -> tuple[list[torch.Tensor], torch.Tensor]:
        caps, pad = adapter.capabilities, pad_token(adapter)
        sources = random_rows(adapter, case.source_lengths, case.seed)
        target = random_ids(case.seed + 5, (len(sources), case.target_length), caps.vocab_size, pad, caps.device)
        return sources, target

    def _batch(
        self, adapter: Adapter, sources: list[torch.Tensor], length: int, side: str, target: torch.Tensor
    ) -> Batch:
        ids, mask = pad_rows(sources, length, side, pad_token(adapter))
        device = adapter.capabilities.device
        return Batch(
            ids.to(device), mask.to(device), decoder_input_ids=target, decoder_attention_mask=torch.ones_like(target)
        )

    def source_pad_ids(self, adapter: Adapter, context: RunContext, case: SourceCase) -> Evaluation:
        sources, target = self._parts(adapter, case)
        base = self._batch(adapter, sources, max(case.source_lengths) + case.extra, case.side, target)
        perturbed_source = perturb(base.input_ids, base.attention_mask == 0, adapter.capabilities.vocab_size, case.seed)
        perturbed = Batch(
            perturbed_source,
            base.attention_mask,
            decoder_input_ids=target,
            decoder_attention_mask=base.decoder_attention_mask,
        )
        what = f"changing the ids at {case.side}-padded source slots changed decoder logits"
        return (
            yield from same_shape_outcome(
                adapter, context, base, perturbed, torch.ones_like(target, dtype=torch.bool), what
            )
        )

    def source_padding_amount(self, adapter: Adapter, context: RunContext, case: SourceCase) -> Evaluation:
        sources, target = self._parts(adapter, case)
        padded = self._batch(adapter, sources, max(case.source_lengths) + case.extra, case.side, target)
        alone = yield [
            Logits(adapter, self._batch(adapter, [source], source.numel(), case.side, target[i : i + 1]))
            for i, source in enumerate(sources)
        ]  # [1, T, V] each

        def judge(logits: torch.Tensor, floor: float) -> Outcome:
            pairs = [(alone[i][0], logits[i], i) for i in range(len(sources))]
            outcome = aligned_outcome(
                context, pairs, floor, f"decoder logits differ between a {case.side}-padded and an unpadded source"
            )
            return left_padding_caveat(outcome, adapter.capabilities, case.side)

        return (yield from with_floor(adapter, padded, torch.ones_like(target, dtype=torch.bool), judge))
