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
  must not diverge from it), costs one forward per row where decoding each row alone costs
  one per token, and scores the same tokens on both sides, so a near-tie of the argmax cannot make
  a row's tokens diverge. A bug of the cache itself, not of padding, fails here too (the
  reference runs without a cache), but the ``incremental`` check names it. A model whose
  positions cannot follow the mask (no position ids, as BART's decoder) gets a ``warn``:
  left padding shifts its positions.

- ``generate_use_cache`` (only where the two above cannot run: ``generate()`` does not feed
  the model its prompt as it is, as XLM's and XLNet's append a token to every forward's
  input, or feeds the whole sequence again): the model's own greedy ``generate()`` of a
  left-padded batch with its cache (``use_cache=True``, the default) gives the logits it
  gives without one (``use_cache=False``), step by step until the two choose different
  tokens. It compares generate() with itself, so it needs no knowledge of how the model
  prepares its inputs; it is weaker than the two above (both sides share every padding and
  input-preparation bug), which is why they run wherever they can.

Cases cover what a sliding window or a chunk needs: prompts and continuations longer than
the window or the chunk, and for chunked attention prefills that end just inside a chunk, at
its end and just past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.adapters.errors import LogitsShapeError
from ..harness.adapters.layer_attention import declared_chunk
from ..harness.adapters.prefix import PREFIX_TOKENS
from ..harness.engine.batching import Evaluation, Greedy, Logits
from ..harness.engine.cases import (
    RowBatches,
    aligned_outcome,
    checked_positional_caveat,
    concat,
    left_padding_caveat,
    pad_rows,
    random_ids,
    random_rows,
    repeat_floor,
    row_lengths,
    shape_change_outcome,
    with_floor,
)
from ..harness.engine.profiles import length_cap
from ..harness.engine.strategies import case_strategy, short_or_long
from ..harness.engine.suite import Check, CheckResult, Outcome, RunContext, Suite

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


def longest_prompt(capabilities: Capabilities, profile: str = "dev") -> tuple[int, int]:
    """A short prompt's longest (long enough to outgrow a sliding window or a chunk) and a
    long one's (the profile's cache cap less the chunks decoded after it), within the model's
    positions."""
    span = capabilities.window or declared_chunk(capabilities)
    longest = 8 if not span else max(8, span + 2)
    room = length_cap(profile, capabilities.max_length or 64, cached=True) - MAX_CHUNK * MAX_CHUNKS
    short = max(1, min(longest, room))
    return short, max(short, room)


def prompt_lengths(capabilities: Capabilities, profile: str) -> st.SearchStrategy[int]:
    """Drawn up to :func:`longest_prompt`; a model with chunked attention also draws prefills
    that end one token inside a chunk, at its end and one token into the next, so the steps
    after them cross a chunk's boundary at each offset the cache must keep apart. A prefix
    LM's prompts hold the whole default prefix (harness/adapters/prefix.py): a prefill may
    not split a prefix, since the prefix's first tokens would then have to read later ones
    that the cache has not seen."""
    short, long = longest_prompt(capabilities, profile)
    lengths = short_or_long(PREFIX_TOKENS if capabilities.attention == "prefix_lm" else 1, short, long)
    chunk = declared_chunk(capabilities)
    boundaries = sorted({n for n in (chunk - 1, chunk, chunk + 1) if 1 <= n <= long} if chunk else set())
    return st.one_of(lengths, st.sampled_from(boundaries)) if boundaries else lengths


def source_paddings(capabilities: Capabilities) -> st.SearchStrategy[int]:
    """Only encoder-decoders have a source to pad; the others keep 0 and draw nothing."""
    return st.integers(0, 3) if capabilities.family == "encoder_decoder" else st.just(0)


def cache_cases(capabilities: Capabilities, profile: str = "dev") -> st.SearchStrategy[CacheCase]:
    return case_strategy(
        CacheCase,
        prompt_lengths=st.lists(prompt_lengths(capabilities, profile), min_size=1, max_size=3),
        chunks=st.lists(st.integers(1, MAX_CHUNK), min_size=1, max_size=MAX_CHUNKS),
        source_padding=source_paddings(capabilities),
        seed=st.integers(0, 2**16),
    )


def generation_cases(capabilities: Capabilities, profile: str = "dev") -> st.SearchStrategy[GenerationCase]:
    return case_strategy(
        GenerationCase,
        prompt_lengths=st.lists(prompt_lengths(capabilities, profile), min_size=2, max_size=3),
        new_tokens=st.integers(1, MAX_CHUNK * MAX_CHUNKS),
        source_padding=source_paddings(capabilities),
        seed=st.integers(0, 2**16),
    )


def note_unpadded_prompts(results: list, reason: str | None, checks: Sequence[str]) -> None:
    """Where the cache protocol takes no mask, each cached check that ran says that its
    prompts were unpadded, and why (on the suite's line: its ``convention``)."""
    if reason is None:
        return
    for result in results:
        if result.name in checks and result.status in ("pass", "warn", "fail"):
            result.convention = f"unpadded prompts only: {reason}"


def misshapen_cache(adapter: Adapter, batch: Batch, error: LogitsShapeError) -> Evaluation:
    """The verdict when a cached forward returned logits of the wrong shape: a FAIL when the
    full forward of the same rows has the right one (the cache path then computes something
    else than the model, which no tolerance can compare), an error when it does not (the
    model's logits are wrong everywhere: raised by the forward below)."""
    full = yield Logits(adapter, batch)  # [B, T, V]
    return Outcome(
        "fail",
        message=(
            f"a cached forward returned {error.what} of shape {error.shape} where [B, T, V] = {error.expected} was due, "
            f"while the full forward of this case's rows (no cache) returns the right shape, {list(full.shape)}: the cached forward does not give one row of logits per row and token, "
            "so what generate() reads from it (each row's last position) is not the model's prediction for that row"
        ),
    )


class CacheBatches(RowBatches):
    """Left-padded decoder batches; encoder-decoders get a right-padded source per row, of
    2 to 4 tokens plus the case's padding, so the cross-attention cache must keep its mask.

    A model that takes no attention mask cannot be padded: every row of a case then has its
    longest prompt, and batches carry no mask (what such a model is called with)."""

    def batch(self, rows: Sequence[Tensor], length: int, side: str, **options: Any) -> Batch:
        batch = super().batch(rows, length, side, **options)
        if self.caps.takes_attention_mask or self.caps.family == "encoder_decoder":
            return batch
        assert batch.attention_mask is not None and bool(batch.attention_mask.all()), "rows of one length only"
        return Batch(batch.input_ids, None, batch.position_ids)

    def pad_side(self, batch: Batch) -> str:
        """The batch's padding side: left when it holds left padding, none for rows that fill
        it (no padding to blame a difference on)."""
        mask = batch.predicted_mask
        return "left" if mask is not None and not bool(mask.all()) else "none"

    def sources(self, count: int, first_row: int, padding: int) -> tuple[Tensor, Tensor]:
        sources = [
            random_ids(7919 + first_row + i, (2 + (first_row + i) % 3,), self.caps.vocab_size, self.pad)
            for i in range(count)
        ]
        return pad_rows(sources, max(s.numel() for s in sources) + padding, "right", self.pad)

    def left_padded(self, rows: list[Tensor], length: int, source_padding: int, first_row: int = 0) -> Batch:
        return self.batch(rows, length, "left", first_row=first_row, source_padding=source_padding)

    def prefix(self, batch: Batch, length: int) -> Batch:
        """The first ``length`` columns of the predicted side (the source is kept whole)."""
        if self.caps.family == "encoder_decoder":
            assert batch.decoder_input_ids is not None and batch.decoder_attention_mask is not None
            return Batch(
                batch.input_ids,
                batch.attention_mask,
                decoder_input_ids=batch.decoder_input_ids[:, :length],
                decoder_attention_mask=batch.decoder_attention_mask[:, :length],
            )
        mask = None if batch.attention_mask is None else batch.attention_mask[:, :length]
        positions = None if batch.position_ids is None else batch.position_ids[:, :length]
        return Batch(batch.input_ids[:, :length], mask, positions)


class KVCacheSuite(Suite):
    name = "kv_cache"
    summary = "incremental decoding with the cache equals the full-prefix forward"
    order = 60
    kind = "state"
    in_sweep = True

    @staticmethod
    def no_cache(capabilities: Capabilities) -> str:
        return capabilities.no_cache_reason or "the model declares no KV cache"

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        if not capabilities.output_kind.is_vocabulary:
            return capabilities.output_kind.decodes_no_tokens
        if not capabilities.has_cache and not capabilities.generates:
            return self.no_cache(capabilities)
        return None  # a model that takes no mask decodes unpadded rows: CacheBatches

    def __init__(self) -> None:
        self._unpadded: str | None = None  # set by checks(): why its prompts are unpadded

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        batches = CacheBatches(adapter)
        caps = adapter.capabilities
        self._unpadded = caps.unpadded_cache_reason
        if not caps.has_cache:  # generate() runs, but not on a path the two cache checks can follow
            reason = self.no_cache(caps)
            return [
                CheckResult("incremental", "not_applicable", reason),
                CheckResult("greedy_generation", "not_applicable", reason),
                Check(
                    "generate_use_cache",
                    lambda c: self.generate_use_cache(batches, context, c),
                    generation_cases(caps, context.profile),
                ),
            ]
        return [
            Check("incremental", lambda c: self.incremental(batches, context, c), cache_cases(caps, context.profile)),
            Check(
                "greedy_generation",
                lambda c: self.greedy_generation(batches, context, c),
                generation_cases(caps, context.profile),
            ),
        ]

    def conclude(self, results: list) -> None:
        note_unpadded_prompts(results, self._unpadded, ("incremental", "greedy_generation"))

    def incremental(self, b: CacheBatches, context: RunContext, case: CacheCase) -> Evaluation:
        prompt = max(case.prompt_lengths)
        total = prompt + sum(case.chunks)
        rows = random_rows(b.adapter, row_lengths(b.caps, case.prompt_lengths, cached=True), case.seed)
        continuation = random_ids(case.seed + 17, (len(rows), sum(case.chunks)), b.caps.vocab_size, b.pad)
        full = b.left_padded(
            [torch.cat([row, continuation[i]]) for i, row in enumerate(rows)], total, case.source_padding
        )
        mask = full.predicted_mask
        where = torch.ones_like(full.predicted_ids, dtype=torch.bool) if mask is None else mask.bool()

        spans, start = [], prompt
        for n in case.chunks:
            spans.append((start, n))
            start += n
        try:  # the prompt's logits [B, P, V], then each step's [B, n, V]
            pieces = b.adapter.decoded(b.prefix(full, prompt), [full.predicted_ids[:, s : s + n] for s, n in spans])
        except LogitsShapeError as error:
            return (yield from misshapen_cache(b.adapter, full, error))
        cached = torch.cat(pieces, dim=1)  # [B, T, V]
        chunks = " + ".join(str(n) for n in case.chunks)
        what = f"cached decoding (prefill {prompt}, then steps of {chunks}) differs from the full forward"

        def judge(logits: Tensor, floor: float) -> Outcome:
            outcome = shape_change_outcome(context, logits, cached, where, floor, what)
            if outcome.status == "fail" and outcome.positions:
                first = min(t for _, t in outcome.positions)
                where_first = (
                    "the prefill"
                    if first < prompt
                    else next(
                        f"the step of {n} token(s) starting at position {s}" for s, n in spans if s <= first < s + n
                    )
                )
                outcome.message += f"; first wrong position {first}, in {where_first}"
                if (
                    first < prompt
                ):  # no cache is read yet: the prompt alone is scored otherwise than inside the full sequence
                    outcome.message += (
                        " (no cache is read before the first step: the prompt's logits differ from the full forward's at the same positions, "
                        "so the model reads later tokens (the causal suite), reads the padded slots its mask hides (the padding suite), "
                        "or scores a prompt otherwise than the start of a longer sequence)"
                    )
            return outcome

        return (yield from with_floor(b.adapter, full, where, judge))

    def greedy_generation(self, b: CacheBatches, context: RunContext, case: GenerationCase) -> Evaluation:
        rows = random_rows(b.adapter, row_lengths(b.caps, case.prompt_lengths, cached=True), case.seed)
        batch = b.left_padded(rows, max(case.prompt_lengths), case.source_padding)
        size, side = batch.size, b.pad_side(batch)
        kind = "a left-padded batch" if side == "left" else "an unpadded batch"
        what = f"greedy decoding of {kind} of {size} rows with the cache differs from each row's own forward (alone, no cache) over the same tokens"

        def decoded(copies: int) -> Evaluation:
            """Decode ``copies`` copies of the batch (2: the copy gives the floor) and judge the first."""
            try:
                tokens, logits = yield Greedy(
                    b.adapter, concat([batch] * copies), case.new_tokens
                )  # [cB, n], [cB, n, V]
            except LogitsShapeError as error:
                return (yield from misshapen_cache(b.adapter, batch, error))
            floor = (
                repeat_floor(logits, size, torch.ones(size, case.new_tokens, dtype=torch.bool)) if copies == 2 else 0.0
            )
            fed = [
                torch.cat([row, tokens[i, :-1].to(row.device)]) for i, row in enumerate(rows)
            ]  # [P + n - 1]: the prompt and what the batch generated before the last step
            alone = yield [
                Logits(b.adapter, b.left_padded([f], f.numel(), case.source_padding, first_row=i), case.new_tokens)
                for i, f in enumerate(fed)
            ]  # [1, n, V] each: the positions that predicted the generated tokens, P - 1 .. P + n - 2
            pairs = [(alone[i][0], logits[i], i) for i in range(len(rows))]  # ([n, V], [n, V], row)
            outcome = aligned_outcome(context, pairs, floor, what)
            if outcome.status == "fail":
                diverged = []
                for reference, _, i in pairs:
                    steps = (reference.argmax(-1) != tokens[i].to(reference.device)).nonzero().flatten()
                    if steps.numel():
                        diverged.append(f"row {i} at step {int(steps[0])}")
                if diverged:
                    outcome.message += (
                        f"; the batch generated other tokens than each row's own argmax: {', '.join(diverged)}"
                    )
            return left_padding_caveat(outcome, b.caps, side)

        # Every threshold grows with the floor: the copy is decoded only for a case that does not pass without it.
        outcome = yield from decoded(1)
        if outcome.status == "pass":
            return outcome
        # The caveat is checked once, on the verdict that stands (its forwards are the same for both).
        return (yield from checked_positional_caveat(b, context, (yield from decoded(2)), batch, case.seed))

    def generate_use_cache(self, b: CacheBatches, context: RunContext, case: GenerationCase) -> Outcome:
        rows = random_rows(b.adapter, case.prompt_lengths, case.seed)
        batch = b.left_padded(rows, max(case.prompt_lengths), case.source_padding)
        size, n = batch.size, case.new_tokens
        what = f"generate() with its cache (use_cache=True) differs from generate() without one (use_cache=False) on a left-padded batch of {size} rows"
        plain_tokens, plain = b.adapter.generate(batch, n, use_cache=False)  # [B, n], [B, n, V]

        def compared(copies: int) -> Outcome:
            """Generate with the cache for ``copies`` copies of the batch (2: the copy gives the floor); judge the first."""
            tokens, cached = b.adapter.generate(concat([batch] * copies), n, use_cache=True)  # [cB, n], [cB, n, V]
            floor = repeat_floor(cached, size, torch.ones(size, n, dtype=torch.bool)) if copies == 2 else 0.0
            pairs = []
            for i in range(size):
                differ = (tokens[i] != plain_tokens[i].to(tokens.device)).nonzero().flatten()
                same_prefix = int(differ[0]) + 1 if differ.numel() else n  # later steps continue other tokens
                pairs.append((plain[i, :same_prefix], cached[i, :same_prefix], i))
            return aligned_outcome(context, pairs, floor, what)

        outcome = compared(1)
        return outcome if outcome.status == "pass" else compared(2)
