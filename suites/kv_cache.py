"""kv_cache: decoding with a cache must give the logits of the full-prefix forward.

Checks (decoders and encoder-decoders that declare a cache)
- ``incremental``: prefill a left-padded prompt batch, then feed the rest of the sequence
  in chunks whose sizes Hypothesis draws. A causal mask that is not offset by the cache
  length only shows with chunks longer than one token, so chunks are not all 1. The logits
  of every real position must equal the full forward of the whole sequence
  (shape-changing rule: cached and full attention reduce over other lengths). For
  encoder-decoders the source is right-padded, and the cross-attention cache must keep
  reading that source and its mask.
- ``greedy_generation``: greedy decoding of a left-padded batch, one token per step with
  the cache, gives each row at every step the logits the model gives that row alone: one
  forward, without padding or cache, over the row's prompt and the tokens the batch
  generated for it. That reference is the model as it is evaluated (the mission: generation
  must not diverge from it), costs one forward per row where decoding each row alone cost
  one per token (kv_cache took 40 of a GPT-2-small audit's 94 s that way, about 27 of
  81-83 s since), and scores the same tokens on both sides, so a near-tie of the argmax cannot make
  a row's tokens diverge. A bug of the cache itself, not of padding, fails here too (the
  reference runs without a cache), but the ``incremental`` check names it. A model whose
  positions cannot follow the mask (no position ids, as BART's decoder) gets a ``warn``:
  left padding shifts its positions.

Cases cover what a sliding window needs: prompts and continuations longer than the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.cases import (
    RowBatches,
    aligned_outcome,
    concat,
    left_padding_caveat,
    pad_rows,
    random_ids,
    random_rows,
    repeat_floor,
    shape_change_outcome,
)
from ..harness.strategies import case_strategy
from ..harness.suite import Check, Outcome, RunContext, Suite

MAX_CHUNK = 4
MAX_CHUNKS = 4


@dataclass(frozen=True)
class CacheCase:
    prompt_lengths: tuple[int, ...]  # real prompt tokens per row, left-padded to the longest
    chunks: tuple[int, ...]  # sizes of the steps fed after the prefill
    source_padding: int  # encoder-decoders: right-padded source slots
    seed: int


@dataclass(frozen=True)
class GenerationCase:
    prompt_lengths: tuple[int, ...]  # at least two rows: a row alone is its own batch
    new_tokens: int
    source_padding: int
    seed: int


def longest_prompt(capabilities: Capabilities) -> int:
    """Long enough to outgrow a sliding window, short enough for the model's positions."""
    longest = 8 if not capabilities.window else max(8, capabilities.window + 2)
    room = (capabilities.max_length or 64) - MAX_CHUNK * MAX_CHUNKS
    return max(1, min(longest, room))


def source_paddings(capabilities: Capabilities) -> st.SearchStrategy[int]:
    """Only encoder-decoders have a source to pad; the others keep 0 and draw nothing."""
    return st.integers(0, 3) if capabilities.family == "encoder_decoder" else st.just(0)


def cache_cases(capabilities: Capabilities) -> st.SearchStrategy[CacheCase]:
    return case_strategy(
        CacheCase,
        prompt_lengths=st.lists(st.integers(1, longest_prompt(capabilities)), min_size=1, max_size=3),
        chunks=st.lists(st.integers(1, MAX_CHUNK), min_size=1, max_size=MAX_CHUNKS),
        source_padding=source_paddings(capabilities),
        seed=st.integers(0, 2**16),
    )


def generation_cases(capabilities: Capabilities) -> st.SearchStrategy[GenerationCase]:
    return case_strategy(
        GenerationCase,
        prompt_lengths=st.lists(st.integers(1, longest_prompt(capabilities)), min_size=2, max_size=3),
        new_tokens=st.integers(1, MAX_CHUNK * MAX_CHUNKS),
        source_padding=source_paddings(capabilities),
        seed=st.integers(0, 2**16),
    )


class CacheBatches(RowBatches):
    """Left-padded decoder batches; encoder-decoders get a right-padded source per row, of
    2 to 4 tokens plus the case's padding, so the cross-attention cache must keep its mask."""

    def sources(self, count: int, first_row: int, padding: int) -> tuple[Tensor, Tensor]:
        sources = [random_ids(7919 + first_row + i, (2 + (first_row + i) % 3,), self.caps.vocab_size, self.pad) for i in range(count)]
        return pad_rows(sources, max(s.numel() for s in sources) + padding, "right", self.pad)

    def left_padded(self, rows: list[Tensor], length: int, source_padding: int, first_row: int = 0) -> Batch:
        return self.batch(rows, length, "left", first_row=first_row, source_padding=source_padding)

    def prefix(self, batch: Batch, length: int) -> Batch:
        """The first ``length`` columns of the predicted side (the source is kept whole)."""
        if self.caps.family == "encoder_decoder":
            assert batch.decoder_input_ids is not None and batch.decoder_attention_mask is not None
            return Batch(batch.input_ids, batch.attention_mask, decoder_input_ids=batch.decoder_input_ids[:, :length], decoder_attention_mask=batch.decoder_attention_mask[:, :length])
        assert batch.attention_mask is not None
        positions = None if batch.position_ids is None else batch.position_ids[:, :length]
        return Batch(batch.input_ids[:, :length], batch.attention_mask[:, :length], positions)


def greedy(adapter: Adapter, batch: Batch, new_tokens: int) -> tuple[Tensor, Tensor]:
    """Greedy decoding with the cache: the chosen tokens ``[B, n]`` and the logits each was chosen from ``[B, n, V]``."""
    logits, state = adapter.prefill(batch)
    last = logits[:, -1]  # [B, V]: left padding puts every row's last real token in the last column
    tokens, chosen_from = [], []
    for step in range(new_tokens):
        token = last.argmax(-1, keepdim=True)  # [B, 1]
        tokens.append(token)
        chosen_from.append(last)
        if step + 1 < new_tokens:
            logits, state = adapter.step(state, token)
            last = logits[:, -1]
    return torch.cat(tokens, dim=1), torch.stack(chosen_from, dim=1)


class KVCacheSuite(Suite):
    name = "kv_cache"
    summary = "incremental decoding with the cache equals the full-prefix forward"

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        if not capabilities.has_cache:
            return capabilities.no_cache_reason or "the model declares no KV cache"
        if not capabilities.takes_attention_mask:
            return "the model takes no attention mask, so a left-padded batch cannot be decoded"
        return None

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        batches = CacheBatches(adapter)
        caps = adapter.capabilities
        return [
            Check("incremental", lambda c: self.incremental(batches, context, c), cache_cases(caps)),
            Check("greedy_generation", lambda c: self.greedy_generation(batches, context, c), generation_cases(caps)),
        ]

    def incremental(self, b: CacheBatches, context: RunContext, case: CacheCase) -> Outcome:
        prompt = max(case.prompt_lengths)
        total = prompt + sum(case.chunks)
        rows = random_rows(b.adapter, case.prompt_lengths, case.seed)
        continuation = random_ids(case.seed + 17, (len(rows), sum(case.chunks)), b.caps.vocab_size, b.pad)
        full = b.left_padded([torch.cat([row, continuation[i]]) for i, row in enumerate(rows)], total, case.source_padding)
        mask = full.predicted_mask
        assert mask is not None
        logits = b.adapter.logits(concat([full, full]))  # [2B, T, V]: the copy gives the floor
        size = full.size
        where = mask.bool()
        floor = repeat_floor(logits, size, where)

        incremental, state = b.adapter.prefill(b.prefix(full, prompt))  # [B, P, V]
        pieces, start, spans = [incremental], prompt, []
        for n in case.chunks:
            step_logits, state = b.adapter.step(state, full.predicted_ids[:, start : start + n])  # [B, n, V]
            pieces.append(step_logits)
            spans.append((start, n))
            start += n
        cached = torch.cat(pieces, dim=1)  # [B, T, V]
        chunks = " + ".join(str(n) for n in case.chunks)
        what = f"cached decoding (prefill {prompt}, then steps of {chunks}) differs from the full forward"
        outcome = shape_change_outcome(context, logits[:size], cached, where, floor, what)
        if outcome.status == "fail" and outcome.positions:
            first = min(t for _, t in outcome.positions)
            where_first = "the prefill" if first < prompt else next(f"the step of {n} token(s) starting at position {s}" for s, n in spans if s <= first < s + n)
            outcome.message += f"; first wrong position {first}, in {where_first}"
            if first < prompt:  # no cache is involved yet: the prompt's logits depend on the tokens after it
                outcome.message += " (no cache exists before the first step: the model's logits depend on later tokens, so it is not causal; see the causal suite)"
        return outcome

    def greedy_generation(self, b: CacheBatches, context: RunContext, case: GenerationCase) -> Outcome:
        rows = random_rows(b.adapter, case.prompt_lengths, case.seed)
        batch = b.left_padded(rows, max(case.prompt_lengths), case.source_padding)
        tokens, logits = greedy(b.adapter, concat([batch, batch]), case.new_tokens)  # [2B, n], [2B, n, V]: the copy gives the floor
        size = batch.size
        floor = repeat_floor(logits, size, torch.ones(size, case.new_tokens, dtype=torch.bool))
        pairs = []
        for i, row in enumerate(rows):
            fed = torch.cat([row, tokens[i, :-1].to(row.device)])  # [P + n - 1]: the prompt and what the batch generated before the last step
            alone = b.adapter.logits(b.left_padded([fed], fed.numel(), case.source_padding, first_row=i))[0, row.numel() - 1 :]  # [n, V]
            pairs.append((alone, logits[i], i))
        what = f"greedy decoding of a left-padded batch of {size} rows with the cache differs from each row's own forward (alone, no cache) over the same tokens"
        outcome = aligned_outcome(context, pairs, floor, what)
        if outcome.status == "fail":
            diverged = []
            for alone, _, i in pairs:
                steps = (alone.argmax(-1) != tokens[i].to(alone.device)).nonzero().flatten()
                if steps.numel():
                    diverged.append(f"row {i} at step {int(steps[0])}")
            if diverged:
                outcome.message += f"; the batch generated other tokens than each row's own argmax: {', '.join(diverged)}"
        return left_padding_caveat(outcome, b.caps, "left")
