"""causal: changing future tokens must not change past logits, and the measured
influence pattern must match the attention pattern the model declares.

Checks
- ``future_tokens``: change one later id, or every id after position t; logits at
  positions <= t must not move (same-shape rule). Then cut the rows after position t:
  logits at positions <= t must not move either (shape-changing rule: the rows are
  shorter). A position that reads how many tokens follow it (a length scale taken from
  the whole row) moves no logit when later ids change; only the cut shows it. Decoders,
  and the decoder side of encoder-decoders.
- ``declared_pattern``: measure which inputs influence which outputs and compare with
  the declared pattern: no influence from the future (causal), none from further back
  than L x (W - 1) (sliding window), and an encoder declared bidirectional must really
  read both ways.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.adapters.layer_attention import LayerAttention
from ..harness.adapters.outputs import KINDS
from ..harness.adapters.prefix import first_real_tokens
from ..harness.engine.batching import Evaluation, one_forward
from ..harness.engine.cases import (
    gradient_check,
    gradient_outcome,
    pad_rows,
    pad_token,
    perturb,
    positions_for,
    random_ids,
    same_shape_outcome,
    shape_change_outcome,
    with_floor,
)
from ..harness.engine.influence import expected_pattern, measure_influence
from ..harness.engine.profiles import LENGTH_CAPS, length_cap
from ..harness.engine.strategies import case_strategy, short_or_long
from ..harness.engine.suite import Check, CheckResult, Outcome, RunContext, Suite

MAX_LENGTH = 16


@dataclass(frozen=True)
class FutureCase:
    batch: int
    length: int
    cut: int  # the last protected position t
    suffix: bool  # change every id after t (True) or one id (False)
    offset: int  # with suffix=False, change position t + 1 + offset
    source_length: int  # encoder-decoders: length of the (fixed) source
    padding: int  # pad slots in every row: a mask builder's padded path can differ from its unpadded one
    side: str  # "left" or "right"
    seed: int


@dataclass(frozen=True)
class PatternCase:
    length: int
    seed: int


@functools.cache
def _zero_to(n: int) -> st.SearchStrategy[int]:
    """``st.integers(0, n)``, built once per n: building it inside a draw costs a cache lookup per case."""
    return st.integers(0, n)


_BATCHES, _BOOLEANS, _SEEDS = st.integers(1, 3), st.booleans(), st.integers(0, 2**16)
_SIDES = st.sampled_from(["right", "left"])


@st.composite
def _future_case(
    draw: st.DrawFn,
    lengths: st.SearchStrategy[int],
    source_lengths: st.SearchStrategy[int],
    paddings: st.SearchStrategy[int],
    short: int,
) -> FutureCase:
    length = draw(lengths)
    if length > short:  # a long row: its cut lies in the positions only long rows have
        cut = length - 2 - draw(_zero_to(min(short, length - 2)))
    else:
        cut = draw(_zero_to(length - 2))
    batch = draw(_BATCHES)  # drawn either way, so a long length shrunk to a short one keeps the choices after it
    return FutureCase(
        # One long row: it tests every position it has at once, and more rows of the same
        # length would test the same positions again (the short cases have up to three).
        batch=1 if length > short else batch,
        length=length,
        cut=cut,
        suffix=draw(_BOOLEANS),
        offset=draw(_zero_to(length - cut - 2)),
        source_length=draw(source_lengths),
        padding=draw(paddings),
        side=draw(_SIDES),
        seed=draw(_SEEDS),
    )


def future_cases(
    max_length: int, encoder_decoder: bool, takes_mask: bool, longest: int | None = None
) -> st.SearchStrategy[FutureCase]:
    """Only encoder-decoders draw a source length (the others keep the minimal 1); only
    models that take a mask draw padded rows (the rest keep 0 pad slots). Rows are up to
    ``max_length`` tokens, or up to ``longest`` in the first case of an example
    (harness/engine/strategies.py, ``short_or_long``); a long row's cut is within its last
    ``max_length`` positions, which no short row has, and shrinks toward its end."""
    source_lengths = st.integers(1, max_length) if encoder_decoder else st.just(1)
    paddings = st.integers(0, 3) if takes_mask else st.just(0)
    return _future_case(short_or_long(2, max_length, longest), source_lengths, paddings, max(2, max_length))


def future_prefix(case: FutureCase) -> int:
    """A prefix LM's prefix in a future_tokens case: 1 to t + 1 tokens (t the cut), drawn by
    the case's seed, so the ids changed after the cut all lie after the prefix (inside it,
    the prefix reads them by design)."""
    return 1 + case.seed % (case.cut + 1)


def model_length(capabilities: Capabilities, cap: int) -> int:
    return max(2, min(cap, capabilities.max_length or cap))


def pattern_length(capabilities: Capabilities, profile: str = "dev") -> int:
    """Long enough to see the declared pattern end: a sliding window's reach plus a few
    positions (at most 64), or two chunks and a few positions, up to the profile's length cap
    (a chunk's end is seen only past it)."""
    if capabilities.attention == "chunked" and capabilities.attention_chunk:
        cap = length_cap(profile, capabilities.max_length) or MAX_LENGTH
        return model_length(capabilities, min(2 * capabilities.attention_chunk + 4, cap))
    length = 12
    if capabilities.attention == "sliding_window" and capabilities.window:
        length = (capabilities.n_layers or 1) * (capabilities.window - 1) + 4
    return model_length(capabilities, min(length, 64))


def declared_pattern_name(capabilities: Capabilities) -> str:
    """The whole model's declared pattern with its width: what ``declared_pattern`` verifies."""
    caps = capabilities
    if caps.attention == "sliding_window":
        reach = (caps.n_layers or 1) * ((caps.window or 1) - 1)
        return f"sliding window W={caps.window} over L={caps.n_layers} layers (reach {reach})"
    if caps.attention == "chunked":
        return f"chunked attention C={caps.attention_chunk} in every layer"
    if caps.attention == "prefix_lm":
        return "prefix LM (a prefix of half the row read both ways, then causal)"
    return str(caps.attention)


def unseen_chunk(chunk: int, length: int, profile: str) -> str | None:
    """Why a chunk of ``chunk`` tokens is not verified at ``length`` tokens, the longest a case
    may have (no case sees the chunk end), or None."""
    if chunk < length:
        return None
    return (
        f"chunk C={chunk} not verified: the {profile} profile's cases are at most {length} tokens, so none sees a "
        f"chunk end (--profile thorough reaches {LENGTH_CAPS['thorough']})"
    )


def source_batch(adapter: Adapter, batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_ids(
        seed + 7, (batch, length), adapter.capabilities.vocab_size, pad_token(adapter), adapter.capabilities.device
    )
    return ids, torch.ones_like(ids)


class CausalSuite(Suite):
    name = "causal"
    summary = "changing future tokens must not change past logits; influence matches the declared pattern"
    order = 10
    kind = "mask"
    in_sweep = True
    draws_effective_mask = True
    # A position that reads nothing after it gives the logits of a longer row's prefix:
    # the suites after this one may then stack unpadded rows of other lengths.
    extension_gate = ("future_tokens",)

    def __init__(self) -> None:
        self.verified: dict[str, str] = {}  # check name -> the pattern it verifies, once it has run

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        output = capabilities.output_kind
        if not output.per_position:  # every model with an output per position has a pattern to check
            return f"the model returns {KINDS[output.name]}: no output of a position to order against later tokens"
        return None

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        caps = adapter.capabilities
        checks: list = []
        self.verified = {}
        if caps.family != "encoder":
            length = model_length(caps, MAX_LENGTH)
            room = 3 if caps.takes_attention_mask and length > 5 else 0  # for the padded slots
            longest = length_cap(context.profile, caps.max_length)  # None: no declared context, short cases only
            cases = future_cases(
                length - room,
                caps.family == "encoder_decoder",
                caps.takes_attention_mask,
                None if longest is None else max(length, longest) - room,
            )
            checks.append(Check("future_tokens", lambda case: self.future_tokens(adapter, context, case), cases))
            checks.append(
                gradient_check(
                    adapter, "future_gradients", lambda case: self.future_gradients(adapter, context, case), cases
                )
            )
        checks.append(self.pattern_check(adapter, context))
        layer_check = self.layer_check(adapter, context)
        if layer_check is not None:
            checks.append(layer_check)
        return checks

    def pattern_check(self, adapter: Adapter, context: RunContext) -> Check | CheckResult:
        """``declared_pattern``: the influence of one unpadded row, long enough to see the
        pattern end; ``not_run`` for a chunk no case of the profile is long enough to see end."""
        caps = adapter.capabilities
        length = pattern_length(caps, context.profile)
        unseen = unseen_chunk(caps.attention_chunk, length, context.profile) if caps.attention_chunk else None
        if unseen:
            return CheckResult("declared_pattern", "not_run", unseen)
        self.verified["declared_pattern"] = declared_pattern_name(caps)
        strategy = case_strategy(PatternCase, length=st.just(length), seed=st.integers(0, 2**16))
        return Check(
            "declared_pattern", lambda case: self.declared_pattern(adapter, context, case), strategy, max_examples=2
        )

    def layer_check(self, adapter: Adapter, context: RunContext) -> Check | CheckResult | None:
        """``layer_windows``: each layer's measured mask against the pattern it declares, for a
        model whose layers declare a window or a chunk. Through two layers, influence at the
        edge of a window's reach is too small to measure, and one full layer lets everything
        reach everything: each layer is checked on its own, at the real width of its window or
        chunk. Where layers differ and cannot be measured (the adapter cannot show its layers'
        attention, or a chunk is longer than any case), what is not verified says so:
        ``not_run``, naming it."""
        caps = adapter.capabilities
        layers = adapter.declared_layers()
        if caps.unverified_layers:
            return CheckResult("layer_windows", "not_run", caps.unverified_layers)
        if not layers or all(layer.kind == "full" for layer in layers):
            return None
        uniform = len(set(layers)) == 1  # declared_pattern verifies the whole pattern
        bounded = {layer for layer in layers if layer.kind != "full"}
        cap = length_cap(context.profile, caps.max_length) or MAX_LENGTH
        unseen = [
            reason
            for layer in sorted(bounded, key=str)
            if layer.kind == "chunked" and (reason := unseen_chunk(layer.width, cap, context.profile))
        ]
        if not adapter.shows_layer_attention:
            if uniform:
                return None
            named = ", ".join(layer.describe() for layer in sorted(bounded, key=str))
            return CheckResult(
                "layer_windows",
                "not_run",
                f"{named} not verified: the model mixes it with full attention layers, and "
                f"{type(adapter).__name__} cannot show its layers' attention to check each layer",
            )
        if unseen:
            return CheckResult("layer_windows", "not_run", "; ".join(unseen))
        widest = max(layer.width for layer in bounded if layer.width is not None)
        layer_length = model_length(caps, widest + LAYER_MARGIN)
        self.verified["layer_windows"] = "per layer: " + ", ".join(layer.describe() for layer in layers)
        strategy = case_strategy(PatternCase, length=st.just(layer_length), seed=st.integers(0, 2**16))
        return Check(
            "layer_windows",
            lambda case: layer_windows(adapter, layers, case),
            strategy,
            max_examples=1,
            on_paths=False,  # it reads the eager attention weights through hooks, on no path of a user's
        )

    def conclude(self, results: list[CheckResult]) -> None:
        """Each pattern check that ran says what it verified, on the suite's line."""
        for result in results:
            if result.name in self.verified and result.status in ("pass", "warn"):
                result.verified = self.verified[result.name]

    def effective_mask(self, adapter: Adapter, context: RunContext, length: int = 10) -> tuple:
        """The influence matrix of one unpadded row and the pattern the model declares."""
        length = model_length(adapter.capabilities, max(length, pattern_length(adapter.capabilities, context.profile)))
        influence, expected, _ = measure_pattern(adapter, context, length, context.seed)
        return influence, expected

    # -- future_tokens ----------------------------------------------------------------------

    def future_rows(
        self, adapter: Adapter, case: FutureCase, kept: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The case's ids and real-token mask ``[B, T]``, padded as the case says; ``kept``:
        only each row's first ``kept`` real tokens (the same padding around them)."""
        caps = adapter.capabilities
        pad = pad_token(adapter)
        real = random_ids(case.seed, (case.batch, case.length), caps.vocab_size, pad)[:, :kept]  # [B, length or kept]
        ids, mask = pad_rows(list(real), real.shape[1] + case.padding, case.side, pad)  # [B, T]
        return ids.to(caps.device), mask.to(caps.device)

    def as_batch(self, adapter: Adapter, case: FutureCase, ids: torch.Tensor, mask: torch.Tensor) -> Batch:
        """Rows ``ids [B, T]`` as the case calls the model: unpadded rows without a mask, as
        users call them; padded rows with their mask (and positions that skip the padding,
        for models that take them); the decoder's side of an encoder-decoder, beside a source."""
        row_mask = mask if case.padding else None
        if adapter.capabilities.family == "encoder_decoder":
            source, source_mask = source_batch(adapter, case.batch, case.source_length, case.seed)
            return Batch(source, source_mask, decoder_input_ids=ids, decoder_attention_mask=row_mask)
        prefix = None
        if adapter.capabilities.attention == "prefix_lm":
            prefix = first_real_tokens(mask, future_prefix(case)).long()
        return Batch(ids, row_mask, positions_for(adapter, mask) if case.padding else None, prefix_mask=prefix)

    def future_batches(self, adapter: Adapter, case: FutureCase) -> tuple[Batch, Batch, torch.Tensor, torch.Tensor]:
        """The case's rows and the rows with later ids changed, the protected positions
        ``[B, T]`` (real, at or before the cut) and the real-token mask ``[B, T]``."""
        caps = adapter.capabilities
        ids, mask = self.future_rows(adapter, case)
        index = mask.cumsum(-1) - 1  # [B, T]: each real token's index among the real ones
        if case.suffix:
            changed = mask.bool() & (index > case.cut)
        else:
            changed = mask.bool() & (index == case.cut + 1 + case.offset)
        perturbed = perturb(ids, changed, caps.vocab_size, case.seed, pad_token(adapter))
        protected = mask.bool() & (index <= case.cut)
        return self.as_batch(adapter, case, ids, mask), self.as_batch(adapter, case, perturbed, mask), protected, mask

    def future_tokens(self, adapter: Adapter, context: RunContext, case: FutureCase) -> Evaluation:
        base, test, protected, mask = self.future_batches(adapter, case)
        padded = f" in {case.side}-padded rows" if case.padding else ""
        if base.prefix_mask is not None:
            padded += f" with a bidirectional prefix of {future_prefix(case)} token(s)"
        what = f"changing {'ids after' if case.suffix else 'one id after'} position {case.cut}{padded} changed logits at positions <= {case.cut}"
        logits = yield from one_forward(adapter, [base, test])  # [2B, T, V]
        changed = yield from same_shape_outcome(adapter, context, base, test, protected, what, first=logits)
        if changed.status != "pass":
            return changed
        cut = yield from self.truncation(adapter, context, case, mask, logits[: base.size])
        return cut if cut.status != "pass" or cut.ratio >= changed.ratio else changed

    def truncation(
        self, adapter: Adapter, context: RunContext, case: FutureCase, mask: torch.Tensor, full: torch.Tensor
    ) -> Evaluation:
        """The case's rows (their logits ``full [B, T, V]``, real tokens ``mask [B, T]``)
        against the same rows cut after position t, padded as they were: the kept positions
        sit in the same columns of both (the pad slots are before the real tokens or after
        them), so the logits compare column by column. t is the case's cut, or within the
        first ``MAX_LENGTH`` positions for a long row: every later position it drops is one
        the kept ones must not read, and the short rows cost few tokens."""
        cut_after = min(case.cut, MAX_LENGTH - 2)
        cut = self.as_batch(adapter, case, *self.future_rows(adapter, case, kept=cut_after + 1))
        columns = cut.predicted_ids.shape[1]
        kept = (mask.bool() & (mask.cumsum(-1) - 1 <= cut_after))[:, :columns].cpu()  # [B, T']: all in the cut rows
        padded = f" of {case.side}-padded rows" if case.padding else ""
        what = (
            f"cutting the {case.length - cut_after - 1} id(s) after position {cut_after}{padded} changed logits at "
            f"positions <= {cut_after}: a position reads how many tokens follow it"
        )

        def judge(logits: torch.Tensor, floor: float) -> Outcome:  # logits [B, T', V]
            return shape_change_outcome(context, full[:, :columns], logits, kept, floor, what)

        return (yield from with_floor(adapter, cut, kept, judge))

    # -- future_gradients --------------------------------------------------------------------

    def future_gradients(self, adapter: Adapter, context: RunContext, case: FutureCase) -> Outcome:
        """The gradient of the log-probabilities at real positions <= t with respect to the token
        embeddings of the real tokens after t must be zero (the ids future_tokens changes): a
        kernel can be exact forward and leak backward, and a training step runs both."""
        base, _, protected, mask = self.future_batches(adapter, case)
        hidden = mask.bool() & ~protected  # the real tokens after the cut (padded slots are the padding suite's)
        padded = f" in {case.side}-padded rows" if case.padding else ""
        what = (
            f"the training backward{padded} carries gradient from the token embeddings after position {case.cut} "
            f"into the log-probabilities at positions <= {case.cut}"
        )
        return gradient_outcome(adapter, context, base, protected, hidden, case.seed, what)

    # -- declared_pattern -------------------------------------------------------------------

    def declared_pattern(self, adapter: Adapter, context: RunContext, case: PatternCase) -> Outcome:
        influence, expected, pattern = measure_pattern(adapter, context, case.length, case.seed)
        return judge_pattern(influence, expected, pattern, adapter.capabilities)


def measure_pattern(adapter: Adapter, context: RunContext, length: int, seed: int) -> tuple:
    """Influence of one unpadded row (the decoder's, for encoder-decoders), the pattern it
    should follow, and that pattern's name."""
    caps = adapter.capabilities
    ids = random_ids(seed, (1, length), caps.vocab_size, pad_token(adapter), caps.device)
    decoder_side = caps.family == "encoder_decoder"
    if decoder_side:
        source, source_mask = source_batch(adapter, 1, 4, seed)
        row, pattern = Batch(source, source_mask, decoder_input_ids=ids), "causal"
    else:
        row, pattern = Batch(ids), caps.attention
    prefix = length // 2 if pattern == "prefix_lm" else 0
    if prefix:
        row.prefix_mask = first_real_tokens(torch.ones_like(ids), prefix).long()
    influence = measure_influence(adapter, context, row, seed, decoder_side)
    expected = expected_pattern(length, pattern, caps.window, caps.n_layers, caps.attention_chunk, prefix)
    return influence, expected, pattern


LAYER_MARGIN = 8  # queries past the widest window, so its edge is seen from several rows


def layer_windows(adapter: Adapter, declared: tuple[LayerAttention, ...], case: PatternCase) -> Outcome:
    """Each layer's measured mask against its declared pattern (harness/adapters/layer_attention.py):
    a sliding window ``W`` lets query ``q`` read keys ``q - W < k <= q``, a chunk ``C`` the keys
    ``k <= q`` of ``q``'s own chunk, a full layer every ``k <= q``."""
    caps = adapter.capabilities
    ids = random_ids(case.seed, (1, case.length), caps.vocab_size, pad_token(adapter), caps.device)
    measured = adapter.layer_attention_masks(ids)
    if len(measured) != len(declared):
        return Outcome(
            "fail", message=f"measured {len(measured)} attention layers, but the config declares {len(declared)}"
        )
    distance = torch.arange(case.length)[:, None] - torch.arange(case.length)[None, :]  # [T, T]: q - k
    wrong, off_by = [], 0  # off_by: the most positions a layer's reach is off its declared reach
    for index, (mask, layer) in enumerate(zip(measured, declared)):
        expected = layer.allowed(case.length)
        declared_reach = int(distance[expected].max())
        reach = int(distance[mask].max()) if mask.any() else 0
        leaks, unread = mask & ~expected, expected & ~mask
        if leaks.any() and layer.kind == "chunked":
            assert layer.width is not None
            chunk_start = torch.arange(case.length)[:, None] // layer.width * layer.width  # [T, 1]
            outside = int((chunk_start - torch.arange(case.length)[None, :])[leaks].max())  # keys before the chunk
            wrong.append(
                f"layer {index} ({layer.describe()}) reads keys up to {outside} positions before its query's chunk, "
                f"e.g. [query, key] {leaks.nonzero()[:3].tolist()}"
            )
            off_by = max(off_by, outside)
            continue
        if leaks.any():
            wrong.append(
                f"layer {index} ({layer.describe()}) reads keys up to {reach} positions back, e.g. [query, key] "
                f"{leaks.nonzero()[:3].tolist()}"
            )
        elif unread.any() and layer.kind == "chunked":
            wrong.append(
                f"layer {index} ({layer.describe()}) does not read keys of its query's chunk, e.g. [query, key] "
                f"{unread.nonzero()[:3].tolist()}"
            )
        elif unread.any():
            wrong.append(
                f"layer {index} ({layer.describe()}) reads only {reach} positions back, {declared_reach} declared "
                f"(length {case.length})"
            )
        else:
            continue
        off_by = max(off_by, abs(reach - declared_reach), 1)
    if wrong:
        return Outcome(
            "fail",
            float(off_by),
            0.0,
            0.0,
            message=f"a layer's mask differs from its declared pattern: {'; '.join(wrong)}",
        )
    return Outcome("pass")


def judge_pattern(influence, expected: torch.Tensor, pattern: str, caps: Capabilities) -> Outcome:  # type: ignore[no-untyped-def]
    compared = influence.diff[influence.outputs]
    if not bool(torch.isfinite(compared).all()):  # NaN compares false: it would read as "no influence"
        cells = (~torch.isfinite(influence.diff) & influence.outputs[:, None]).nonzero().tolist()
        message = (
            f"the model's logits are NaN/inf when inputs change ([output, input] {cells[:8]}), so the influence "
            "pattern cannot be measured"
        )
        return Outcome("fail", float("inf"), influence.floor, influence.threshold, cells, message,
                       positions_label="output, input")  # fmt: skip
    measured = influence.measured
    leaks = measured & ~expected
    detail = {"influence": influence.diff.tolist(), "expected": expected.tolist(), "threshold": influence.threshold}
    described = declared_pattern_name(caps) if pattern == caps.attention else pattern
    if leaks.any():
        cells = leaks.nonzero().tolist()
        worst = float(influence.diff[leaks].max())
        message = (
            f"influence outside the declared {described} pattern: [output, input] {cells[:8]}"
            f"{' ...' if len(cells) > 8 else ''}; max |d log p| = {worst:.3g} > threshold {influence.threshold:.3g} "
            f"(noise floor {influence.floor:.3g}); the pattern rests on attention={caps.attention!r} for a "
            f"{caps.family!r} model"
        )
        return Outcome(
            "fail", worst, influence.floor, influence.threshold, cells, message, detail, positions_label="output, input"
        )
    missing = expected & ~measured & influence.outputs[:, None]
    strictly_future = torch.triu(torch.ones_like(expected), diagonal=1)
    if pattern == "bidirectional" and missing[strictly_future].all():
        message = "declared bidirectional, but no output is influenced by any later input: the model behaves causally"
        return Outcome("fail", 0.0, influence.floor, influence.threshold, [], message, detail)
    allowed_diff = float(influence.diff[expected & influence.outputs[:, None]].max()) if expected.any() else 0.0
    if pattern == "prefix_lm":
        in_prefix = expected & strictly_future  # [output, input]: a prefix position and a later one in the prefix
        if in_prefix.any() and missing[in_prefix].all():
            message = (
                "declared a prefix LM, but no position of the prefix is influenced by a later one in it: "
                "the prefix is read causally, not both ways"
            )
            return Outcome("fail", 0.0, influence.floor, influence.threshold, [], message, detail)
    if missing.any() and pattern in ("bidirectional", "prefix_lm"):
        cells = missing.nonzero().tolist()
        message = f"declared {described}, but {len(cells)} output/input pairs show no influence (first {cells[:4]})"
        return Outcome("warn", allowed_diff, influence.floor, influence.threshold, [], message, detail)
    distance = torch.arange(expected.shape[0])[:, None] - torch.arange(expected.shape[0])[None, :]  # [T, T]: out - in
    reach = int(distance[measured].max()) if measured.any() else 0
    declared_reach = int(distance[expected].max()) if expected.any() else 0
    if missing.any() and pattern == "sliding_window" and reach < declared_reach:
        if not (missing & (distance <= reach)).any():  # a clean band: every input up to `reach` back moves, none beyond
            cells = (missing & (distance == reach + 1)).nonzero().tolist()
            message = (
                f"declared {described} (Capabilities.attention='sliding_window', window={caps.window}), but influence "
                f"reaches back only {reach} positions: the window is narrower than declared, so the model does not "
                f"use the context it declares (first missing [output, input] {cells[:4]})"
            )
            return Outcome(
                "fail", float(declared_reach - reach), influence.floor, influence.threshold, cells, message, detail,
                positions_label="output, input",
            )  # fmt: skip
    if missing.any() and pattern == "causal":
        if not (missing & (distance <= reach)).any():
            beyond = influence.diff[missing]
            tail = float(beyond.max()) if beyond.numel() else 0.0
            kind = (
                "nothing farther moves at all: an undeclared window"
                if tail == 0.0
                else f"farther, influence is below the threshold but not zero (at most {tail:.3g}): a recurrence whose memory decays, or a window plus numerical noise"
            )
            message = f"declared full causal attention, but influence above the threshold reaches back only {reach} positions; {kind}"
            return Outcome("warn", allowed_diff, influence.floor, influence.threshold, [], message, detail)
    return Outcome(
        "pass",
        float(influence.diff[~expected].max()) if (~expected).any() else 0.0,
        influence.floor,
        influence.threshold,
        [],
        "",
        detail,
    )
