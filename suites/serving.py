"""serving: what a server does with the cache must not leak or drift.

The cache is a model's serving state. ``kv_cache`` checks that appending to it gives the
full forward's logits; serving also rolls it back, rearranges its rows, copies it and
hands it to the next request. Each check does one of these with the model's own
operation (transformers' ``Cache`` methods, the plain-module protocol, the reference
model's ``KVCache``) and compares with a fresh computation of what the user asked for:

- ``rollback``: decode draft tokens, roll back some (transformers: ``crop(-j)`` on a
  cache prepared as assisted decoding prepares it, ``activate_past_recording``), decode
  other tokens: their logits are the full forward's over the kept prefix and the new
  tokens (shape-changing rule: cached and full attention reduce over other lengths).
- ``beam_reorder``, ``row_select``, ``row_repeat``: beam search's ``reorder_cache`` (rows
  may repeat), ``batch_select_indices`` (finished rows dropped), ``batch_repeat_interleave``
  (sampling several continuations): each row, given its own new tokens, continues as the
  full forward of the row it now holds.
- ``reuse``: a cache reset (transformers' ``reset()``) and filled by another request of the
  same batch size gives that request's fresh logits. This is tenant isolation, judged by
  influence rather than closeness: the reused logits must equal a fresh decode, and must not
  move when the first request's ids change, both under the same-shape rule at the floor
  two fresh decodes measure (0 on the CPU in float32: the same computation).
- ``shared_prefix``: a prompt's cache copied (``copy.deepcopy``, as transformers' docs copy a
  prompt cache) and continued with two suffixes, one copy continued again after the other:
  each equals its fresh decode (same-shape rule), so continuing one copy changed nothing of
  the other.
- ``window_eviction``: decoding far past a sliding window or an attention chunk (whose cache
  keeps the last C - 1 keys as a window of C does, its mask hiding the previous chunk's),
  one cache step at a time, equals the full forward; then a rollback across the window's
  edge and new tokens equal it too.
- ``static_cache``: the same decode with the static cache (``cache_implementation="static"``)
  equals the full forward, and a static cache reused by a second request (as a second
  ``generate()`` call reuses it) gives that request's fresh logits.
- ``offloaded_cache``: the same with the offloaded cache, which needs CUDA.

An operation the cache declares it cannot do (``Cache.is_croppable`` False, a layer
without the method, a module without the protocol method) is measured once on a probe
decode and its check is ``not_applicable`` with that reason.

Mask polarity: ``attention_mask`` 1 = real token, as everywhere in maskcheck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities, ServingUnsupported
from ..harness.adapters.layer_attention import evicting_layer
from ..harness.adapters.memo import forward_memo, module_tensors
from ..harness.adapters.serving import ROW_OPERATIONS
from ..harness.engine.batching import Evaluation
from ..harness.engine.profiles import CACHE_LENGTH_CAPS
from ..harness.engine.strategies import case_strategy
from ..harness.engine.suite import Check, CheckResult, Outcome, RunContext, Suite
from .kv_cache import MAX_CHUNK, longest_prompt, note_unpadded_prompts, prompt_lengths, source_paddings
from .serving_cases import (
    ServingBatches,
    against_full_forward,
    decoded,
    operated,
    row_index,
    same_computation,
    steps,
    supported,
)

ROW_CHECKS = {"reorder": "beam_reorder", "select": "row_select", "repeat": "row_repeat"}
CACHE_IMPLEMENTATION_CHECKS = {"static": "static_cache", "offloaded": "offloaded_cache"}


@dataclass(frozen=True)
class RollbackCase:
    prompt_lengths: tuple[int, ...]  # left-padded to the longest
    drafted: int  # tokens decoded with the cache, then partly rejected
    rejected: int  # rolled back: min(rejected, drafted)
    new_tokens: int  # decoded after the rollback
    source_padding: int
    seed: int


@dataclass(frozen=True)
class RowsCase:
    prompt_lengths: tuple[int, ...]  # at least two rows
    before: int  # tokens decoded before the rows are rearranged
    after: int  # tokens each new row decodes after
    order_seed: int  # draws the index
    source_padding: int
    seed: int


@dataclass(frozen=True)
class ReuseCase:
    first_lengths: tuple[int, ...]  # the first request's rows
    second_lengths: tuple[int, ...]  # the next request's: the first len(first_lengths) of them
    first_steps: int  # tokens the first request decodes before its cache is reused
    steps: int  # tokens the next request decodes
    source_padding: int
    seed: int


@dataclass(frozen=True)
class SharedPrefixCase:
    prompt_lengths: tuple[int, ...]
    first: int  # the first copy's suffix
    second: int  # the second copy's, decoded after the first
    more: int  # the first copy's, decoded after the second
    source_padding: int
    seed: int


@dataclass(frozen=True)
class EvictionCase:
    prompt: int  # a prompt within the window
    past_window: int  # tokens decoded past twice the window, one step of 1-4 at a time
    rejected: int  # rolled back across the window's edge: 1 .. window + 1
    new_tokens: int
    seed: int


class ServingSuite(Suite):
    name = "serving"
    summary = "rollback, row reorders, reuse and copies of the cache give a fresh decode's logits"
    order = 65
    kind = "state"
    in_sweep = True
    # Its checks fix their own path: cached decoding as a server drives it.
    call_paths = False

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        if not capabilities.output_kind.is_vocabulary:
            return capabilities.output_kind.decodes_no_tokens
        if not capabilities.has_cache:
            return capabilities.no_cache_reason or "the model declares no KV cache"
        return None

    def __init__(self) -> None:
        self._unpadded: str | None = None  # set by checks(): why its prompts are unpadded

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        b = ServingBatches(adapter)
        caps = adapter.capabilities
        self._unpadded = caps.unpadded_cache_reason
        support = self.support(b)
        prompts = prompt_lengths(caps, context.profile)
        sources = source_paddings(caps)
        seeds = st.integers(0, 2**16)
        tokens = st.integers(1, MAX_CHUNK)

        def check(name: str, evaluate: Callable[[Any], Any], strategy: Any, reason: str | None) -> Any:
            if reason is not None:
                return CheckResult(name, "not_applicable", reason)
            return Check(name, evaluate, strategy, max_examples=self.examples(context), on_paths=False)

        def drawn(case_type: type, rows: int = 1, **fields: Any) -> Any:
            """Cases of left-padded prompts (``rows`` to 3), the case's own fields, a seed."""
            prompt_rows = st.lists(prompts, min_size=rows, max_size=3)
            return case_strategy(case_type, prompt_lengths=prompt_rows, **fields, source_padding=sources, seed=seeds)

        rows_cases = drawn(RowsCase, rows=2, before=tokens, after=tokens, order_seed=seeds)
        result = [
            check(
                "rollback",
                lambda c: self.rollback(b, context, c),
                drawn(RollbackCase, drafted=tokens, rejected=tokens, new_tokens=tokens),
                support["rollback"],
            ),
            *(
                check(
                    ROW_CHECKS[operation],
                    lambda c, operation=operation: self.rearranged(b, context, operation, c),
                    rows_cases,
                    support[operation],
                )
                for operation in ROW_OPERATIONS
            ),
            check(
                "reuse",
                lambda c: self.reuse(b, context, c),
                self.reuse_cases(caps, context.profile, sources),
                support["reuse"],
            ),
            check(
                "shared_prefix",
                lambda c: self.shared_prefix(b, context, c),
                drawn(SharedPrefixCase, first=tokens, second=tokens, more=tokens),
                support["share"],
            ),
            self.eviction_check(b, context, support["rollback"]),
        ]
        for implementation, name in CACHE_IMPLEMENTATION_CHECKS.items():
            result.append(self.implementation_check(b, context, implementation, name, sources))
        return result

    def conclude(self, results: list) -> None:
        note_unpadded_prompts(results, self._unpadded, [result.name for result in results])

    @staticmethod
    def examples(context: RunContext) -> int:
        """A quarter of the profile's cases (2 in dev and ci, 50 in thorough; 2 at least): a
        case is several decodes (fresh ones beside the operated one) and exercises the
        operation at every row and layer at once. Every seeded bug fails the first case, the
        minimal one (``benchmarks/cases_needed.py``); the second is a drawn one."""
        return max(2, context.examples // 4)

    # -- what the cache can do, measured on a probe decode -------------------------------------

    def support(self, b: ServingBatches) -> dict[str, str | None]:
        """Each operation's reason to be n/a (None: it runs), from 2 rows of 3 tokens decoded 2 more.

        What a cache declares it cannot do is a property of its kind, not of what it holds,
        so the probes operate on branches (:meth:`Adapter.fork`) of one decode, and the
        rollback probe on one decode prepared for rollback."""
        adapter = b.adapter
        _, prompt = b.prompt([3, 2], 97, 0)
        more = b.tokens(prompt.size, 2, 98)
        decodes: dict[bool, Any] = {}

        def decoded_state(rollback: bool = False) -> Any:
            if rollback not in decodes:
                decodes[rollback] = adapter.step(adapter.prefill(prompt, rollback=rollback)[1], more)[1]
            return adapter.fork(decodes[rollback])

        answers = {
            "rollback": supported(lambda: adapter.rollback(decoded_state(rollback=True), 1)),
            "reuse": supported(lambda: adapter.reuse(decoded_state(), prompt)),
            "share": supported(lambda: adapter.step(adapter.share(decoded_state()), more)),
        }
        for operation in ROW_OPERATIONS:
            answers[operation] = supported(
                lambda o=operation: adapter.rearrange(decoded_state(), o, row_index(o, prompt.size, 0))
            )
        return answers

    # -- the checks ----------------------------------------------------------------------------

    def rollback(self, b: ServingBatches, context: RunContext, case: RollbackCase) -> Evaluation:
        """Draft tokens are verified in one forward and the next ones too, as assisted decoding feeds them."""
        rejected = min(case.rejected, case.drafted)
        _, prompt = b.prompt(case.prompt_lengths, case.seed, case.source_padding)
        draft = b.tokens(prompt.size, case.drafted, case.seed + 17)
        new = b.tokens(prompt.size, case.new_tokens, case.seed + 23)
        kept_draft = draft[:, : case.drafted - rejected]
        full = b.appended(b.appended(prompt, kept_draft), new)

        def with_rollback() -> Tensor:
            _, state = b.adapter.prefill(prompt, rollback=True)
            _, state = decoded(b.adapter, state, draft, [case.drafted])
            state = b.adapter.rollback(state, rejected)
            return decoded(b.adapter, state, new, [case.new_tokens])[0]

        def without_rollback() -> list[tuple[Batch, Tensor]]:
            """The draft's own forward, and the kept draft and new tokens decoded in chunks of
            the same sizes with no rollback: if either is wrong already, the cache was wrong
            before any rollback (chunks of several tokens: kv_cache's case)."""
            _, state = b.adapter.prefill(prompt)
            drafted = decoded(b.adapter, state, draft, [case.drafted])[0]
            _, state = b.adapter.prefill(prompt)
            if kept_draft.shape[1]:
                _, state = decoded(b.adapter, state, kept_draft, [kept_draft.shape[1]])
            continued = decoded(b.adapter, state, new, [case.new_tokens])[0]
            return [(b.appended(prompt, draft), drafted), (full, continued)]

        what = (
            f"after decoding {case.drafted} draft token(s) and rolling back {rejected}, the next "
            f"{case.new_tokens} token(s) decoded with the cache differ from the full forward of the kept "
            "prefix and them"
        )
        control = ("rollback", without_rollback)
        cached = operated(with_rollback, control)
        if isinstance(cached, Outcome):
            return cached
        return (yield from against_full_forward(b, context, full, cached, what, control))

    def rearranged(self, b: ServingBatches, context: RunContext, operation: str, case: RowsCase) -> Evaluation:
        """One token a step, as beam search and sampling decode."""
        _, prompt = b.prompt(case.prompt_lengths, case.seed, case.source_padding)
        before = b.tokens(prompt.size, case.before, case.seed + 17)
        index = row_index(operation, prompt.size, case.order_seed)
        after = b.tokens(index.numel(), case.after, case.seed + 29)  # each new row its own tokens
        grown = b.appended(prompt, before)

        def with_rearranging() -> Tensor:
            # one decode the three rearranging checks share: their cases are the same draws
            _, state = b.adapter.decoded_state(prompt, [before[:, i : i + 1] for i in range(case.before)])
            state = b.adapter.rearrange(state, operation, index)
            return decoded(b.adapter, state, after, [1] * case.after)[0]

        def without_rearranging() -> list[tuple[Batch, Tensor]]:
            """The rows kept, in their own order, each continued with the tokens of a row that holds it."""
            holder = {int(source): i for i, source in enumerate(index)}
            kept = torch.tensor(sorted(holder))
            own = after[[holder[int(r)] for r in kept]]  # [B', n]
            _, state = b.adapter.prefill(b.rows_of(prompt, kept))
            _, state = decoded(b.adapter, state, before[kept], [1] * case.before)
            return [(b.appended(b.rows_of(grown, kept), own), decoded(b.adapter, state, own, [1] * case.after)[0])]

        what = (
            f"after the cache's rows were rearranged ({operation}, row i now holds row {index.tolist()}[i]), the next "
            f"{case.after} token(s) of each row differ from the full forward of the row it holds"
        )
        full = b.appended(b.rows_of(grown, index), after)
        control = (operation, without_rearranging)
        cached = operated(with_rearranging, control)
        if isinstance(cached, Outcome):
            return cached
        return (yield from against_full_forward(b, context, full, cached, what, control))

    @staticmethod
    def reuse_cases(caps: Capabilities, profile: str, sources: Any) -> Any:
        """The first request's prompts as ``kv_cache`` draws them; the next request's short,
        so that it fits in a static cache sized for the first."""
        short, _ = longest_prompt(caps, profile)
        return case_strategy(
            ReuseCase,
            first_lengths=st.lists(prompt_lengths(caps, profile), min_size=1, max_size=3),
            second_lengths=st.lists(st.integers(1, short), min_size=3, max_size=3),
            first_steps=st.integers(0, MAX_CHUNK),
            steps=st.integers(1, MAX_CHUNK),
            source_padding=sources,
            seed=st.integers(0, 2**16),
        )

    def reuse(self, b: ServingBatches, context: RunContext, case: ReuseCase, adapter: Adapter | None = None) -> Outcome:
        adapter = adapter or b.adapter
        second_lengths = case.second_lengths[: len(case.first_lengths)]
        _, second = b.prompt(second_lengths, case.seed + 5, case.source_padding)
        more = b.tokens(second.size, case.steps, case.seed + 7)

        def after(first_seed: int | None) -> Tensor:
            """The next request's logits ``[B, T + n, V]``: in a cache reused after a first
            request drawn from ``first_seed``, or (None) in a fresh one."""
            if first_seed is None:
                prompt_logits, state = adapter.prefill(second)
            else:
                _, first = b.prompt(case.first_lengths, first_seed, case.source_padding)
                _, state = adapter.prefill(first)
                if case.first_steps:
                    _, state = decoded(
                        adapter, state, b.tokens(first.size, case.first_steps, first_seed + 3), [case.first_steps]
                    )
                prompt_logits, state = adapter.reuse(state, second)
            logits, _ = decoded(adapter, state, more, [1] * case.steps)  # one token a step, as generate()
            return torch.cat([prompt_logits, logits], dim=1)

        # A floor measured after another request could hold that request's state (a cache
        # kept in the module's buffers), and that floor would hide the very leak this check
        # looks for. So the repeat runs now, before any other request, unless the fresh
        # decode was measured to keep nothing outside the state it returned: then it runs
        # only where the judgement at floor 0 is not a pass, as every other floor does.
        before = module_tensors(adapter.model)
        fresh = after(None)
        repeated = None
        if not (adapter.remembers_state(second, ("prefill", False)) and module_tensors(adapter.model) == before):
            with forward_memo(False):  # the repeat is the floor's measurement: computed, never served
                repeated = after(None)
        real = torch.cat(
            [second.predicted_real, torch.ones(second.size, case.steps, dtype=torch.bool)], dim=1
        )  # [B, T + n]
        return same_computation(
            context,
            fresh,
            lambda: after(None) if repeated is None else repeated,
            [
                (
                    after(case.seed),
                    "a cache reset and filled by the next request gives other logits than a fresh cache",
                ),
                (
                    after(case.seed + 1),
                    "the next request's logits in a reused cache move when the previous request's ids change: "
                    "one request's state reaches another's",
                ),
            ],
            real,
        )

    def shared_prefix(self, b: ServingBatches, context: RunContext, case: SharedPrefixCase) -> Outcome:
        adapter = b.adapter
        _, prompt = b.prompt(case.prompt_lengths, case.seed, case.source_padding)
        first, more = (
            b.tokens(prompt.size, case.first, case.seed + 11),
            b.tokens(prompt.size, case.more, case.seed + 13),
        )
        second = b.tokens(prompt.size, case.second, case.seed + 19)

        def fresh(*suffixes: Tensor) -> Tensor:
            state = adapter.prefill(prompt)[1]
            pieces = []
            for suffix in suffixes:
                logits, state = decoded(adapter, state, suffix, [suffix.shape[1]])
                pieces.append(logits)
            return torch.cat(pieces, dim=1)  # [B, n, V]

        _, original = adapter.prefill(prompt)
        copy = adapter.share(original)
        first_logits, copy = decoded(adapter, copy, first, [case.first])
        second_logits, original = decoded(adapter, original, second, [case.second])
        more_logits, _ = decoded(adapter, copy, more, [case.more])
        one = same_computation(
            context,
            fresh(first, more),
            lambda: fresh(first, more),
            [
                (
                    torch.cat([first_logits, more_logits], dim=1),
                    "a copy of a prompt's cache, continued while the original was continued with another suffix, "
                    "gives other logits than a fresh decode of the prompt and its own suffix",
                )
            ],
        )
        if one.status != "pass":
            return one
        other = same_computation(
            context,
            fresh(second),
            lambda: fresh(second),
            [
                (
                    second_logits,
                    "a prompt's cache continued after a copy of it was continued gives other logits than a fresh "
                    "decode of the prompt and its suffix: the copy shares state with the original",
                )
            ],
        )
        return other if other.status != "pass" or other.ratio >= one.ratio else one

    def eviction_check(self, b: ServingBatches, context: RunContext, rollback: str | None) -> Any:
        layer = evicting_layer(b.caps)
        if layer is None or layer.width is None:
            return CheckResult(
                "window_eviction",
                "not_applicable",
                "the model declares no sliding window or attention chunk, so its cache evicts nothing",
            )
        window, span = layer.width, layer.describe()
        room = (b.caps.max_length or 4 * window + 64) - 2 * window - MAX_CHUNK
        if room < 1:
            return CheckResult(
                "window_eviction",
                "not_applicable",
                f"the model's {b.caps.max_length} positions leave no room to decode past twice its {span}",
            )
        budget = CACHE_LENGTH_CAPS.get(context.profile, CACHE_LENGTH_CAPS["dev"])
        if 2 * window + 2 * MAX_CHUNK > budget:
            # Decoding that far one step at a time is the check; a profile that cannot pay for it says so.
            return CheckResult(
                "window_eviction",
                "not_run",
                f"decoding past twice the {span} takes {2 * window + 2 * MAX_CHUNK} cached tokens, "
                f"over the {context.profile} profile's {budget}; --profile thorough decodes "
                f"{CACHE_LENGTH_CAPS['thorough']}",
            )
        cases = case_strategy(
            EvictionCase,
            prompt=st.integers(1, window),
            past_window=st.integers(1, min(room, MAX_CHUNK * 2)),
            rejected=st.integers(1, window + 1),
            new_tokens=st.integers(1, MAX_CHUNK),
            seed=st.integers(0, 2**16),
        )
        return Check(
            "window_eviction",
            lambda c: self.eviction(b, context, c, rollback),
            cases,
            max_examples=self.examples(context),
            on_paths=False,
        )

    def eviction(self, b: ServingBatches, context: RunContext, case: EvictionCase, rollback: str | None) -> Evaluation:
        layer = evicting_layer(b.caps)
        assert layer is not None and layer.width is not None
        window, span = layer.width, layer.describe()
        _, prompt = b.prompt([case.prompt], case.seed, 0)
        decoded_count = 2 * window + case.past_window - case.prompt
        later = b.tokens(1, decoded_count, case.seed + 17)
        sizes = steps(decoded_count, case.seed)
        _, state = b.adapter.prefill(prompt)
        cached, _ = decoded(b.adapter, state, later, sizes)
        full = b.appended(prompt, later)
        what = (
            f"decoding {decoded_count} token(s) past a prompt of {case.prompt}, beyond twice the "
            f"{span}, differs from the full forward"
        )
        outcome = yield from against_full_forward(b, context, full, cached, what)
        if outcome.status != "pass" or rollback is not None:  # no rollback to check: said in the message
            if outcome.status == "pass":
                outcome.message = f"rollback across the {span}'s edge not checked: {rollback}"
            return outcome
        rejected = min(case.rejected, decoded_count)
        new = b.tokens(1, case.new_tokens, case.seed + 23)
        _, state = b.adapter.prefill(prompt, rollback=True)
        _, state = decoded(b.adapter, state, later, sizes)
        state = b.adapter.rollback(state, rejected)
        after, _ = decoded(b.adapter, state, new, steps(case.new_tokens, case.seed + 1))
        what = (
            f"after decoding {decoded_count} token(s) past the {span} and rolling back {rejected} "
            "across its edge, the next tokens differ from the full forward"
        )
        return (
            yield from against_full_forward(b, context, b.appended(b.without_last(full, rejected), new), after, what)
        )

    def implementation_check(
        self, b: ServingBatches, context: RunContext, implementation: str, name: str, sources: Any
    ) -> Any:
        available = b.adapter.cache_implementations()
        if implementation not in available:
            return CheckResult(
                name,
                "not_applicable",
                "the model has one cache implementation, its own: kv_cache and the checks above audit it",
            )
        try:
            other = b.adapter.with_cache_implementation(implementation)
        except ServingUnsupported as exc:
            return CheckResult(name, "not_applicable", str(exc))
        except Exception as exc:  # noqa: BLE001 - transformers cannot build it: generate() would raise the same
            return CheckResult(
                name,
                "not_applicable",
                f"transformers cannot build the {implementation} cache for this model "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}), so generate() "
                f"with cache_implementation={implementation!r} raises too",
            )
        other_batches = ServingBatches(other)
        return Check(
            name,
            lambda c: self.implementation(other_batches, context, implementation, c),
            self.reuse_cases(b.caps, context.profile, sources),
            max_examples=self.examples(context),
            on_paths=False,
        )

    def implementation(
        self, b: ServingBatches, context: RunContext, implementation: str, case: ReuseCase
    ) -> Evaluation:
        _, prompt = b.prompt(case.first_lengths, case.seed, case.source_padding)
        more = b.tokens(prompt.size, case.steps, case.seed + 7)
        _, state = b.adapter.prefill(prompt)
        cached, _ = decoded(b.adapter, state, more, [1] * case.steps)  # one token a step, as generate()
        what = f"decoding with the {implementation} cache differs from the full forward"
        outcome = yield from against_full_forward(b, context, b.appended(prompt, more), cached, what)
        if outcome.status != "pass":
            return outcome
        reused = self.reuse(b, context, case, b.adapter)
        if reused.status != "pass":
            reused.message = f"with the {implementation} cache: {reused.message}"
        return reused if reused.status != "pass" or reused.ratio >= outcome.ratio else outcome
