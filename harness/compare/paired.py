"""Adapter A's protocol with every model call made on adapter B too, on the same inputs.

The suites build their cases and drive A as they always do; each logits call, prefill,
decode step and serving operation is made on B with the same batch, tokens and operation,
and B's log-probabilities are compared with A's at the positions the suites protect: real
tokens (``attention_mask`` 1 = real token), never padded slots, whose outputs are a
convention two implementations may choose differently. What the suite then judges is A's
output, so A's own verdict is not compare's concern; compare's verdict on a case is
whether B ever parted from A during it (:class:`Recorder`).

A decoding state is a pair of the two models' states with the operations that made it
(:class:`PairedState`), so a step that parts can be replayed from a fresh prompt with hooks
on the last operation only (``layers.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from ..adapters.base import Adapter, Batch
from ..adapters.memo import DecodesThroughOwnCalls, MemoisedCalls, forward_memo
from ..engine.cases import log_probabilities
from ..engine.suite import Outcome
from ..engine.tolerance import Tolerance, compare_logits
from .gradients import compare_reach

#: one operation on a decoding state: (name, arguments), replayable on either adapter
Operation = tuple[str, tuple]


@dataclass
class PairedState:
    a: Any
    b: Any
    history: list[Operation]


@dataclass
class Parting:
    """One call at which B's log-probabilities left A's by more than the threshold."""

    what: str  # the call, in words
    max_diff: float
    floor: float
    threshold: float
    positions: list[list[int]]  # [row, position] where it differs (positions of the call's own tokens)
    # the operations that make the call again from nothing, the call last (:func:`replay`)
    history: list[Operation]
    where: Tensor  # [B, T] the compared positions of the call
    offset: int = 0  # the call's first position in its sequence
    path: str = "canonical"  # the call path both made it on (harness/adapters/paths.py)
    # "logits": the call's log-probabilities differ; "gradients": its backward reaches other
    # positions (gradients.py), ``how`` says which side reaches them
    kind: str = "logits"
    how: str = ""
    quantity: str = "log p"  # what was compared: log-probabilities, or raw outputs (tolerance.quantity_of)

    def measurement(self) -> str:
        """What was measured, in words (after "B parts from A in <what>: ")."""
        if self.kind == "gradients":
            return (
                f"{self.how}: gradient norm {self.max_diff:.3g} > threshold {self.threshold:.3g} "
                f"(noise floor 0) at [row, position] {self.positions[:8]}"
            )
        return (
            f"max |d {self.quantity}| = {self.max_diff:.3g} > threshold {self.threshold:.3g} (floor {self.floor:.3g})"
        )

    @property
    def ratio(self) -> float:
        return self.max_diff / self.threshold if self.threshold > 0 else float("inf")


@dataclass
class Recorder:
    """What B did against A during the case being evaluated."""

    tolerance: Tolerance
    dtype: str
    calls: int = 0
    # over every case of the check being run (:meth:`start_check`)
    check_calls: int = 0
    check_worst: float = 0.0
    partings: list[Parting] = field(default_factory=list)
    b_errors: list[str] = field(default_factory=list)

    def start_check(self) -> None:
        self.check_calls, self.check_worst = 0, 0.0

    def start(self) -> None:
        self.calls, self.partings, self.b_errors = 0, [], []

    def outcome(self) -> Outcome:
        if self.b_errors:
            return Outcome("fail", float("inf"), message=f"B raised where A ran: {self.b_errors[0]}")
        if not self.partings:
            return Outcome("pass")
        first = self.partings[0]
        return Outcome(
            "fail",
            first.max_diff,
            first.floor,
            first.threshold,
            first.positions[:8],
            message=(
                f"B parts from A in {first.what}: {first.measurement()}; "
                f"{len(self.partings)} of {self.calls} call(s) part"
            ),
            detail={"parting": first},  # the call compare makes again with hooks (run.py: locate)
        )


class PairedAdapter(DecodesThroughOwnCalls):
    """A's adapter, every model call made on B as well (see the module's docstring).

    What it does not intercept (capabilities, loss values, the suites' attention hooks) is
    A's alone: compare judges the outputs both compute, and where the
    suites differentiate, the positions both backwards reach (``gradients.py``)."""

    def __init__(self, a: Adapter, b: Adapter, recorder: Recorder) -> None:
        self.a, self.b, self.recorder = a, b, recorder

    def __getattr__(self, name: str) -> Any:
        if name in ("a", "b", "recorder"):  # not set yet (a copy being made): not A's
            raise AttributeError(name)
        return getattr(self.a, name)

    @property
    def capabilities(self) -> Any:
        """A's, except that a call B cannot be given is not planned: an exported graph's
        inputs have no defaults, so a call without position ids exists for A alone."""
        caps = self.a.capabilities
        if not self.b.inputs_have_defaults and caps.takes_position_ids:
            caps = dataclasses.replace(caps, derives_positions_from_mask=True)
        return caps

    # -- variants of the adapter, paired -------------------------------------------------

    def packing_settings(self) -> list[tuple[Any, "PairedAdapter"]]:
        """A's packing settings, each paired with B's of the same inputs; a setting B lacks is A's alone."""
        theirs = {setting.inputs: adapter for setting, adapter in self.b.packing_settings()}
        return [
            (setting, PairedAdapter(adapter, theirs[setting.inputs], self.recorder))
            for setting, adapter in self.a.packing_settings()
            if setting.inputs in theirs
        ]

    def with_cache_implementation(self, name: str) -> "PairedAdapter":
        return PairedAdapter(
            self.a.with_cache_implementation(name), self.b.with_cache_implementation(name), self.recorder
        )

    def on_path(self, path: Any) -> "PairedAdapter":
        """A and B both calling their models on ``path`` (the training forward, the default cache, ...)."""
        return PairedAdapter(self.a.on_path(path), self.b.on_path(path), self.recorder)

    # -- calls compared ------------------------------------------------------------------

    def _judge(
        self, what: str, a_logits: Tensor, b_logits: Tensor, where: Tensor, history: list[Operation], offset: int = 0
    ) -> None:
        """Compare one call's outputs; a call over its threshold at floor 0 is judged again at
        the floor A's own repeat of it measures (the suites' way: every threshold grows with it)."""
        self.recorder.calls += 1
        self.recorder.check_calls += 1
        normalise = log_probabilities(self.a)
        comparison = compare_logits(a_logits.float(), b_logits.to(a_logits.device).float(), where, normalise)
        threshold = self.recorder.tolerance.shape_change(0.0, self.recorder.dtype, comparison.scale)
        floor = 0.0
        if comparison.max_diff > threshold:
            with forward_memo(False):
                again = replay(self.a, history)
            floor = compare_logits(a_logits.float(), again.to(a_logits.device).float(), where, normalise).max_diff
            threshold = self.recorder.tolerance.shape_change(floor, self.recorder.dtype, comparison.scale)
        ratio = (
            comparison.max_diff / threshold if threshold > 0 else (0.0 if comparison.max_diff == 0 else float("inf"))
        )
        self.recorder.check_worst = max(self.recorder.check_worst, ratio)
        if comparison.max_diff > threshold:
            positions = [[b, t + offset] for b, t in comparison.positions_over(threshold)]
            self.recorder.partings.append(
                Parting(
                    what,
                    comparison.max_diff,
                    floor,
                    threshold,
                    positions,
                    history,
                    where,
                    offset,
                    self.a.path.name,
                    quantity=comparison.quantity,
                )
            )

    def _on_b(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - B failing where A ran is the finding
            self.recorder.b_errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            raise

    def logits(self, batch: Batch, keep: int | None = None) -> Tensor:
        a_logits = self.a.logits(batch, keep)
        b_logits = self._on_b(lambda: self.b.logits(batch, keep))
        where = batch.predicted_real
        count = a_logits.shape[1]
        where = where[:, where.shape[1] - count :]
        self._judge(
            f"a forward of a {sized(batch.predicted_ids)} batch{' (last %d positions)' % count if keep else ''}",
            a_logits,
            b_logits,
            where,
            [("logits", (batch, keep))],
            offset=batch.predicted_ids.shape[1] - count,
        )
        return a_logits

    def prefill(self, batch: Batch, rollback: bool = False) -> tuple[Tensor, PairedState]:
        a_logits, a_state = self.a.prefill(batch, rollback=rollback)
        b_logits, b_state = self._on_b(lambda: self.b.prefill(batch, rollback=rollback))
        history: list[Operation] = [("prefill", (batch, rollback))]
        self._judge_op(history, a_logits, b_logits, batch.predicted_real)
        return a_logits, PairedState(a_state, b_state, history)

    def step(
        self, state: PairedState, tokens: Tensor, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, PairedState]:
        a_logits, a_state = self.a.step(state.a, tokens, attention_mask)
        b_logits, b_state = self._on_b(lambda: self.b.step(state.b, tokens, attention_mask))
        history = [*state.history, ("step", (tokens, attention_mask))]
        where = torch.ones(tokens.shape, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
        self._judge_op(history, a_logits, b_logits, where)
        return a_logits, PairedState(a_state, b_state, history)

    def reuse(self, state: PairedState, batch: Batch) -> tuple[Tensor, PairedState]:
        a_logits, a_state = self.a.reuse(state.a, batch)
        b_logits, b_state = self._on_b(lambda: self.b.reuse(state.b, batch))
        history = [*state.history, ("reuse", (batch,))]
        self._judge_op(history, a_logits, b_logits, batch.predicted_real)
        return a_logits, PairedState(a_state, b_state, history)

    def generate(self, batch: Batch, new_tokens: int, use_cache: bool) -> tuple[Tensor, Tensor]:
        """Both models' own ``generate()``; each row's step logits compared up to the first step
        where the two chose other tokens (the steps after it continue other prefixes)."""
        a_tokens, a_logits = self.a.generate(batch, new_tokens, use_cache)
        b_tokens, b_logits = self._on_b(lambda: self.b.generate(batch, new_tokens, use_cache))
        chose_other = (a_tokens.cpu() != b_tokens.cpu()).long()  # [B, n]
        before = chose_other.cumsum(-1) - chose_other == 0  # [B, n]: steps up to the first other choice
        cache = "with" if use_cache else "without"
        self._judge(
            f"generate() of {new_tokens} token(s) {cache} its cache after a "
            f"{sized(batch.predicted_ids)} batch",
            a_logits, b_logits, before, [("generate", (batch, new_tokens, use_cache))],
            offset=batch.predicted_ids.shape[1],
        )  # fmt: skip
        return a_tokens, a_logits

    # -- backwards compared: the positions each gradient reaches ---------------------------

    def embedding_module(self) -> Any:
        """A's token embedding, where both have a backward to compare (an exported graph has none)."""
        return self.a.embedding_module() if self.b.no_backward_reason is None else None

    @property
    def no_backward_reason(self) -> str | None:
        reason = self.a.no_backward_reason or self.b.no_backward_reason
        return None if reason is None else f"{'A' if self.a.no_backward_reason else 'B'}: {reason}"

    def input_gradients(self, batch: Batch, outputs: Tensor, seed: int) -> tuple[Tensor, Tensor]:
        a_norms, a_logits = self.a.input_gradients(batch, outputs, seed)
        b_norms, b_logits = self._on_b(lambda: self.b.input_gradients(batch, outputs, seed))
        history: list[Operation] = [("input_gradients", (batch, outputs, seed))]
        shape = sized(batch.predicted_ids)
        self._judge(f"the training forward of a {shape} batch", a_logits, b_logits, batch.predicted_real, history)
        self._judge_reach(f"the backward of a {shape} batch to its token embeddings", a_norms, b_norms, history)
        return a_norms, a_logits

    def loss_logit_gradients(self, batch: Batch, labels: Tensor) -> Tensor:
        a_norms = self.a.loss_logit_gradients(batch, labels)
        b_norms = self._on_b(lambda: self.b.loss_logit_gradients(batch, labels))
        shape = sized(batch.predicted_ids)
        history: list[Operation] = [("loss_logit_gradients", (batch, labels))]
        self._judge_reach(f"the loss's backward to the logits of a {shape} batch", a_norms, b_norms, history)
        return a_norms

    def _judge_reach(self, what: str, a_norms: Tensor, b_norms: Tensor, history: list[Operation]) -> None:
        """Compare where two backwards reach (``gradients.py``): exact zeros, floor 0."""
        self.recorder.calls += 1
        self.recorder.check_calls += 1
        reach = compare_reach(a_norms, b_norms, self.recorder.tolerance, self.recorder.dtype)
        ratio = reach.max_diff / reach.threshold if reach.threshold > 0 else float(reach.parts) * float("inf")
        self.recorder.check_worst = max(self.recorder.check_worst, ratio)
        if reach.parts:
            where = torch.ones(a_norms.shape, dtype=torch.bool)
            self.recorder.partings.append(
                Parting(
                    what, reach.max_diff, 0.0, reach.threshold, reach.positions, history, where,
                    path=self.a.path.name, kind="gradients", how=reach.how,
                )
            )  # fmt: skip

    def _judge_op(self, history: list[Operation], a_logits: Tensor, b_logits: Tensor, where: Tensor) -> None:
        steps = sum(name == "step" for name, _ in history)
        last = history[-1][0]
        what = (
            f"cached decoding, step {steps} ({describe(history)})"
            if last == "step"
            else f"the {last} of a {'x'.join(map(str, a_logits.shape[:2]))} prompt ({describe(history)})"
        )
        self._judge(what, a_logits, b_logits, where, history)

    # -- operations on the state, made on both -------------------------------------------

    def rollback(self, state: PairedState, tokens: int) -> PairedState:
        return self._operated(state, "rollback", tokens)

    def rearrange(self, state: PairedState, operation: str, index: Tensor) -> PairedState:
        return self._operated(state, "rearrange", operation, index)

    def share(self, state: PairedState) -> PairedState:
        return PairedState(self.a.share(state.a), self._on_b(lambda: self.b.share(state.b)), list(state.history))

    def fork(self, state: PairedState) -> PairedState:
        return PairedState(self.a.fork(state.a), self.b.fork(state.b), list(state.history))

    def _operated(self, state: PairedState, name: str, *arguments: Any) -> PairedState:
        a_state = getattr(self.a, name)(state.a, *arguments)
        b_state = self._on_b(lambda: getattr(self.b, name)(state.b, *arguments))
        return PairedState(a_state, b_state, [*state.history, (name, arguments)])

    # -- decodes: made step by step here, so each step is compared; nothing is memoised ---

    # a fresh decode, prefill then steps, through this adapter's paired calls (no memo:
    # fresh_decoding below; decoded_state comes from DecodesThroughOwnCalls)
    decoded = MemoisedCalls.decoded

    def fresh_decoding(self, prompt: Any, what: tuple, decode: Callable[[], Any]) -> Any:
        return decode()

    def remembers(self, batch: Any, keep: int | None = None) -> bool:
        return False

    def remembers_decoding(self, prompt: Any, what: tuple) -> bool:
        return False

    def remember(self, batch: Any, keep: int | None, logits: Tensor) -> None:
        pass

    def remember_decoding(self, prompt: Any, what: tuple, value: Any) -> None:
        pass

    def release_state(self) -> None:
        self.a.release_state()
        self.b.release_state()


def replay(
    adapter: Adapter, history: list[Operation], before_last: Callable[[], Any] | None = None, kind: str = "logits"
) -> Tensor:
    """Make a call again on ``adapter`` from nothing: a forward (``logits``, one operation), a
    backward (``input_gradients``, ``loss_logit_gradients``), or a decoding state's
    operations from a fresh prompt. Returns what :class:`Parting` ``kind`` compares of the
    last operation: its logits, or its gradients' norms; ``before_last()`` is called just
    before it (to put hooks on)."""
    state: Any = None
    logits: Tensor | None = None
    for i, (name, arguments) in enumerate(history):
        if before_last is not None and i == len(history) - 1:
            before_last()
        if name == "logits":
            batch, keep = arguments
            logits = adapter.logits(batch, keep)
        elif name == "input_gradients":
            norms, training_logits = adapter.input_gradients(*arguments)
            logits = norms if kind == "gradients" else training_logits
        elif name == "loss_logit_gradients":
            logits = adapter.loss_logit_gradients(*arguments)
        elif name == "generate":
            _, logits = adapter.generate(*arguments)
        elif name == "prefill":
            batch, rollback = arguments
            logits, state = adapter.prefill(batch, rollback=rollback)
        elif name == "step":
            logits, state = adapter.step(state, *arguments)
        elif name == "reuse":
            logits, state = adapter.reuse(state, *arguments)
        else:
            state = getattr(adapter, name)(state, *arguments)
    assert logits is not None
    return logits


def sized(tensor: Tensor) -> str:
    """``[2, 5]`` ids as "2x5", as a call is named in a report."""
    return "x".join(map(str, tensor.shape))


def describe(history: list[Operation]) -> str:
    words = []
    for name, arguments in history:
        if name == "prefill":
            words.append(f"prefill {sized(arguments[0].predicted_ids)}")
        elif name == "step":
            words.append(f"+{arguments[0].shape[1]}")
        elif name == "rearrange":
            words.append(f"{arguments[0]} {arguments[1].tolist()}")
        elif name == "rollback":
            words.append(f"rollback {arguments[0]}")
        else:
            words.append(name)
    return ", ".join(words)


__all__ = ["PairedAdapter", "PairedState", "Parting", "Recorder", "replay"]
