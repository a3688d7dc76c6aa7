"""Several cases' forwards in one: checks written as generators that ask for logits.

A check's ``evaluate`` may return its :class:`Outcome` at once, or an *evaluation*: a
generator that yields :class:`Logits` requests, receives each request's logits
``[B, T, V]`` and returns the outcome::

    logits = yield Logits(adapter, batch)
    alone, padded = yield [Logits(adapter, a), Logits(adapter, b)]  # forwards that do not wait on each other

:func:`run_alone` answers each request with its own forward, in the order asked: what a
plain function calling ``adapter.logits`` did. :func:`run_together` drives the evaluations
of several cases in lockstep: each round, every evaluation still running has asked for one
forward; requests that fit one forward are stacked along the batch dimension (a request's
rows stay together and in order), run once, and each gets its own rows back. On a CPU a
forward of a 124M model costs as much as 16-21 more tokens (docs/performance.md), so
fewer and larger forwards are cheaper for the same rows; the tokens themselves are not.
``Greedy(adapter, batch, n)`` asks for a cached greedy decoding the same way.

Stacking rows of different cases is sound only for a model whose rows do not read each
other, which the padding suite's ``batch_composition`` check measures; the runner runs it
first and drives cases together only when it passed (harness/audits/runner.py). Whatever the
model, a request keeps the attention path it asked for: rows without a mask, rows with a
mask of ones (some attention backends drop such a mask) and padded rows are never stacked
with each other, and padded rows only with rows padded on the same side. Those may be
widened by padding columns on that side (mask 0, the pad id): ``batch_composition`` and
``extra_padding`` are what shows a model ignores them.

Unpadded decoder rows (no mask, or a mask of ones) of other lengths stack too, once the
model's causality licenses it (:func:`extending`): each is extended on the right with
real tokens, no padding, so no row's attention path changes, and each gets back only its
own positions. That is sound for a model whose positions read neither the later tokens'
values nor whether any follow, which ``causal/future_tokens`` measures (it changes later
ids and cuts them off); the runner licenses it only after that passed
(harness/audits/runner.py).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Sequence, Union

import torch
from torch import Tensor

from ..adapters.base import BATCH_FIELDS, Adapter, Batch, concat, pad_token
from ..adapters.memo import not_stored
from ..adapters.paths import CallLog, current_log, logging_calls

#: A forward's fixed cost, in tokens of its per-token cost: padding that costs more than the
#: forward it saves is never added. Measured on a CPU by ``benchmarks/audit_overhead.py
#: --forward-cost`` (the figures are in docs/performance.md); this is the lower end of that range.
FORWARD_COST_TOKENS = 16
#: The most logits one stacked forward may return (rows x length x vocabulary): 256 MiB in float32.
MAX_LOGITS = 2**26


@dataclass(frozen=True)
class Logits:
    """A request for ``adapter.logits(batch)`` ``[B, T, V]``; ``keep``: of the last ``keep``
    positions only, ``[B, keep, V]`` (a check that compares only those asks for only those)."""

    adapter: Adapter
    batch: Batch
    keep: int | None = None


@dataclass(frozen=True)
class Greedy:
    """A request for greedy decoding of ``batch`` with the model's cache, ``new_tokens`` steps
    of one token: the chosen tokens ``[B, n]`` and the logits each was chosen from ``[B, n, V]``.
    Requests of the same shape and mask share one decoding; left-padded decoder prompts
    also share one across lengths, widened with more left padding (:func:`plan_decodings`)."""

    adapter: Adapter
    batch: Batch
    new_tokens: int


def greedy(adapter: Adapter, batch: Batch, new_tokens: int) -> tuple[Tensor, Tensor]:
    """Greedy decoding with the cache: the chosen tokens ``[B, n]`` and the logits each was
    chosen from ``[B, n, V]``. A fresh decode, so remembered as forwards are (adapters/memo.py)."""
    return adapter.fresh_decoding(batch, ("greedy", new_tokens), lambda: _greedy(adapter, batch, new_tokens))


def _greedy(adapter: Adapter, batch: Batch, new_tokens: int) -> tuple[Tensor, Tensor]:
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


Request = Union[Logits, Greedy, list[Logits]]
Evaluation = Generator[Request, Any, Any]
Result = Union[Any, BaseException]  # an evaluation's outcome, or what it raised

#: True where the rows of one forward may be any requests' (the model's rows were shown not to
#: read each other: ``padding/batch_composition``, harness/audits/runner.py), set by :func:`stacking`
_STACKING: ContextVar[bool] = ContextVar("maskcheck_stacking", default=False)


#: True where unpadded rows of other lengths may share a forward, each extended with later
#: tokens (the model's positions were shown to read nothing after them), set by :func:`extending`
_EXTENDING: ContextVar[bool] = ContextVar("maskcheck_extending", default=False)


@contextlib.contextmanager
def stacking(licensed: bool) -> Iterator[None]:
    """Inside, requests may share forwards (``licensed``) or each gets forwards of its own."""
    token = _STACKING.set(licensed)
    try:
        yield
    finally:
        _STACKING.reset(token)


@contextlib.contextmanager
def extending(licensed: bool) -> Iterator[None]:
    """Inside, stacked unpadded rows may be extended on the right with real tokens to the
    longest of their forward (``licensed``), or stack at equal lengths only."""
    token = _EXTENDING.set(licensed)
    try:
        yield
    finally:
        _EXTENDING.reset(token)


def one_forward(adapter: Adapter, batches: Sequence[Batch]) -> Evaluation:
    """The logits of ``batches`` stacked along the batch dimension ``[sum B, T, V]``, asked
    as one forward (every batch of one shape and kind of mask).

    Where requests may share forwards (:func:`stacking`) each batch is asked as a request
    of its own, which the engine stacks into one forward as it would have run them, and
    remembers one by one: a later check asking for one of them is served from the memo.
    Elsewhere the batches run as the one batch asked for, since each row's logits may then
    depend on the rows beside it."""
    if _STACKING.get():
        parts = yield [Logits(adapter, batch) for batch in batches]
        return torch.cat(parts)
    return (yield Logits(adapter, concat(list(batches))))


def run_alone(evaluation: Any) -> Any:
    """The outcome of one evaluation (or a plain outcome, returned as it is), one forward per request."""
    if not isinstance(evaluation, Generator):
        return evaluation
    reply: Any = None
    while True:
        try:
            request = evaluation.throw(reply) if isinstance(reply, BaseException) else evaluation.send(reply)
        except StopIteration as stop:
            return stop.value
        asked = request if isinstance(request, list) else [request]
        if _STACKING.get() and len(asked) > 1:  # forwards that do not wait on each other, stacked
            # each request's call noted where a call made here is
            replies = answer(dict(enumerate(asked)), lambda key, log=current_log(): log)
            answers = [replies[i] for i in range(len(asked))]
        else:
            answers = [_forward(r) for r in asked]
        reply = _reply(request, answers)


def _reply(request: Request, answers: list[Tensor | BaseException]) -> Any:
    """What the evaluation receives: the logits (a list for a list request), or the first
    exception, raised where it asked, as ``adapter.logits`` would have raised it."""
    failed = next((a for a in answers if isinstance(a, BaseException)), None)
    if failed is not None:
        return failed
    return answers if isinstance(request, list) else answers[0]


def run_together(
    evaluations: Sequence[Any],
    on_done: Callable[[int], None] | None = None,
    logs: Sequence[CallLog | None] | None = None,
) -> list[Result]:
    """Drive evaluations in lockstep, stacking their requests into as few forwards as fit.

    Returns, per evaluation, its outcome or the exception it raised; ``on_done(i)`` is called
    as evaluation ``i`` finishes (a progress display). ``logs[i]``: where evaluation ``i``'s
    model calls are noted (harness/adapters/paths.py:CallLog), each stacked request as its own.
    Its callers have the licence to stack (:func:`stacking`), which holds inside."""
    with stacking(True):
        return _drive_together(evaluations, on_done, logs)


def _drive_together(
    evaluations: Sequence[Any],
    on_done: Callable[[int], None] | None,
    logs: Sequence[CallLog | None] | None,
) -> list[Result]:
    results: list[Result] = [None] * len(evaluations)
    waiting: dict[int, Request] = {}

    def log_of(i: int) -> CallLog | None:
        return logs[i] if logs is not None else None

    def finish(i: int, result: Result) -> None:
        waiting.pop(i, None)
        results[i] = result
        if on_done is not None:
            on_done(i)

    def advance(i: int, reply: Any) -> None:
        evaluation = evaluations[i]
        try:
            with _noting_in(log_of(i)):  # the calls the evaluation makes itself
                waiting[i] = evaluation.throw(reply) if isinstance(reply, BaseException) else evaluation.send(reply)
        except StopIteration as stop:
            finish(i, stop.value)
        except Exception as exc:  # the case's own error; the others go on
            finish(i, exc)

    for i, evaluation in enumerate(evaluations):
        if isinstance(evaluation, Generator):
            advance(i, None)
        else:
            finish(i, evaluation)
    while waiting:
        flat = {
            (i, j): r
            for i, request in waiting.items()
            for j, r in enumerate(request if isinstance(request, list) else [request])
        }
        answers = answer(flat, lambda key: log_of(key[0]))
        for i, request in list(waiting.items()):
            count = len(request) if isinstance(request, list) else 1
            advance(i, _reply(request, [answers[(i, j)] for j in range(count)]))
    return results


def answer(
    requests: dict[Any, Logits | Greedy], log_of: Callable[[Any], CallLog | None] = lambda key: None
) -> dict[Any, Any]:
    """Each request's reply (or the exception its forward raised), from stacked forwards;
    ``log_of(key)``: where the request's model calls are noted."""
    replies: dict[Any, Any] = {}
    decodings = {key: r for key, r in requests.items() if isinstance(r, Greedy)}
    for key, request in list(decodings.items()):  # a decode made already is served, not stacked
        if request.adapter.remembers_decoding(request.batch, ("greedy", request.new_tokens)):
            replies[key] = _forward(decodings.pop(key), log_of(key))
    for group in plan_decodings(decodings):
        replies.update(_decode_together([(key, decodings[key]) for key in group], log_of))
    forwards = {key: r for key, r in requests.items() if isinstance(r, Logits)}
    for key, request in list(forwards.items()):  # a call made already is served by its adapter's memo, not stacked
        if request.adapter.remembers(request.batch, request.keep):
            replies[key] = _forward(forwards.pop(key), log_of(key))
    for group in plan(forwards):
        if len(group) == 1:
            replies[group[0]] = _forward(forwards[group[0]], log_of(group[0]))
            continue
        asked = [forwards[i] for i in group]
        length = max(r.batch.predicted_ids.shape[1] for r in asked)
        side = _padded_side(asked[0].batch)
        extend = _stack_key(asked[0])[-1] == EXTENDED  # unpadded rows, lengthened with later tokens
        for i, request in zip(group, asked):  # each request's call as it asked for it, not the stacked one
            log = log_of(i)
            if log is not None:
                log.note(
                    getattr(request.adapter, "path", None), request.batch, request.adapter.capabilities.position_offset
                )
        try:
            with logging_calls(None), not_stored():  # the stacked call is no case's own: each request was noted above
                stacked = [
                    extended(r.batch, length, r.adapter) if extend else widen(r.batch, length, side, r.adapter)
                    for r in asked
                ]
                logits = _logits(
                    asked[0].adapter, concat(stacked), _kept_together(asked, length, extend)
                )  # [sum B, length or the kept columns, V]
        except Exception:  # a stacked forward that fails is retried request by request, so each case gets its own error
            for i in group:
                replies[i] = _forward(forwards[i], log_of(i))
            continue
        start = 0
        for i, request in zip(group, asked):
            rows, own = request.batch.size, request.batch.predicted_ids.shape[1]
            if extend:  # its own positions, the first ``own``; the forward returned columns from ``start``
                first = length - logits.shape[1]
                kept = own if request.keep is None else min(request.keep, own)
                columns = slice(own - kept - first, own - first)
            elif request.keep is not None:  # the last columns: widened on the left or not at all (_stack_key)
                columns = slice(logits.shape[1] - min(request.keep, own), logits.shape[1])
            else:
                columns = slice(length - own, length) if side == "left" else slice(0, own)
            replies[i] = logits[start : start + rows, columns]  # [B, T or keep, V] of this request
            request.adapter.remember(request.batch, request.keep, replies[i])
            start += rows
    return replies


def plan_decodings(requests: dict[Any, Greedy]) -> list[list[Any]]:
    """Groups of greedy requests to decode as one each.

    Requests stack when they have the same adapter, inputs and kind of mask. Decoder
    prompts padded on the left (the side generation pads, so every row's next token is
    predicted in the last column) also stack across lengths, widened with more left
    padding, where that padding costs less than the decode steps it saves
    (:func:`_partition`); every other request stacks at equal shapes only. The
    cache then holds more padded slots before a row's first token, which its mask hides as
    it hides the slots the row was padded with already: only a request that is padded
    already is widened, so no request's attention path changes."""
    groups: dict[tuple, list[Any]] = {}
    for key, request in requests.items():
        batch = request.batch
        present = tuple(name for name in BATCH_FIELDS if getattr(batch, name) is not None)
        kinds = (_mask_kind(batch.attention_mask), _mask_kind(batch.decoder_attention_mask))
        if batch.decoder_input_ids is None and kinds[0] == "left":
            stack_key: tuple = (id(request.adapter), present, "left")
        else:
            shapes = tuple(None if v is None else tuple(v.shape) for v in (getattr(batch, n) for n in BATCH_FIELDS))
            stack_key = (id(request.adapter), shapes, kinds)
        groups.setdefault(stack_key, []).append(key)
    planned: list[list[Any]] = []
    for stack_key, members in groups.items():
        if stack_key[-1] == "left" and len(members) > 1:
            vocab = max(1, requests[members[0]].adapter.capabilities.vocab_size)
            sizes = {i: (requests[i].batch.input_ids.shape[1], requests[i].batch.size) for i in members}
            planned.extend(_partition(members, sizes, vocab, steps={i: requests[i].new_tokens for i in members}))
        else:
            planned.append(members)
    return planned


def _decode_together(
    asked: list[tuple[Any, Greedy]], log_of: Callable[[Any], CallLog | None] = lambda key: None
) -> dict[Any, Any]:
    """One greedy decoding of the stacked batches (widened on the left to the longest, in a
    group of several lengths), as long as the longest asks; each request gets its rows and
    its first steps. (A decoding makes no logits or loss call: nothing
    to note for a stacked one.)"""
    if len(asked) == 1:
        return {asked[0][0]: _forward(asked[0][1], log_of(asked[0][0]))}
    steps = max(r.new_tokens for _, r in asked)
    length = max(r.batch.input_ids.shape[1] for _, r in asked)  # a group of several lengths is padded on the left
    try:
        with not_stored():  # the stacked decode is no request's own: each request's rows are kept below
            tokens, logits = greedy(
                asked[0][1].adapter, concat([widen(r.batch, length, "left", r.adapter) for _, r in asked]), steps
            )  # [sum B, n], [sum B, n, V]
    except Exception:
        return {key: _forward(r, log_of(key)) for key, r in asked}
    replies, start = {}, 0
    for key, request in asked:
        rows = slice(start, start + request.batch.size)
        replies[key] = (tokens[rows, : request.new_tokens], logits[rows, : request.new_tokens])
        request.adapter.remember_decoding(request.batch, ("greedy", request.new_tokens), replies[key])
        start += request.batch.size
    return replies


def _noting_in(log: CallLog | None) -> Any:
    """Note the calls made inside in ``log``; None: wherever the caller notes them."""
    return logging_calls(log) if log is not None else contextlib.nullcontext()


def _forward(request: Logits | Greedy, log: CallLog | None = None) -> Any:
    """The request's reply, its calls noted in ``log`` (None: wherever the caller notes them)."""
    try:
        with _noting_in(log):
            if isinstance(request, Greedy):
                return greedy(request.adapter, request.batch, request.new_tokens)
            return _logits(request.adapter, request.batch, request.keep)
    except Exception as exc:
        return exc


def _logits(adapter: Adapter, batch: Batch, keep: int | None) -> Tensor:
    """``adapter.logits(batch, keep)``; without ``keep``, called as any adapter takes it."""
    return adapter.logits(batch) if keep is None else adapter.logits(batch, keep)


def plan(requests: dict[Any, Logits]) -> list[list[Any]]:
    """Groups of requests to run as one forward each.

    Requests stack when they have the same adapter, the same inputs and the same kind of
    mask (:func:`_stack_key`); of those, exact lengths stack, and requests padded on one
    side also stack across lengths where the padding this adds costs less than the forwards
    it saves (:func:`_partition`)."""
    keyed: dict[tuple, list[Any]] = {}
    for i, request in requests.items():
        keyed.setdefault(_stack_key(request), []).append(i)
    groups: list[list[Any]] = []
    for key, members in keyed.items():
        vocab = max(1, requests[members[0]].adapter.capabilities.vocab_size)
        sizes = {i: (requests[i].batch.predicted_ids.shape[1], requests[i].batch.size) for i in members}
        groups.extend(_partition(members, sizes, vocab, exact=key[-1] is None))
    return groups


def _partition(
    members: list[Any],
    sizes: dict[Any, tuple[int, int]],
    vocab: int,
    exact: bool = False,
    steps: dict[Any, int] | None = None,
) -> list[list[Any]]:
    """Contiguous groups of the members sorted by length (``sizes[i]``: its length and
    rows), minimising the cost of running each group as one: ``FORWARD_COST_TOKENS`` a
    forward plus the tokens each forward computes. A group of forwards is one forward of
    its rows at its longest length; a group of greedy decodings (``steps[i]``: a request's
    new tokens) is as many forwards as its longest asks, the prefill at its longest length
    then a token a row each step. At most :data:`MAX_LOGITS` logits a group's first
    forward (one request alone may exceed it, as it would on its own); ``exact``: only
    equal lengths in a group."""
    order = sorted(members, key=lambda i: sizes[i][0])  # stable: ties keep the order asked
    length = [sizes[i][0] for i in order]
    rows = [sizes[i][1] for i in order]
    new_tokens = [1 if steps is None else steps[i] for i in order]
    best = [0.0] + [float("inf")] * len(order)  # best[j]: the cheapest cost of the first j requests
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        stacked, forwards = 0, 0
        for i in range(j, 0, -1):  # the last group is order[i-1 : j]
            stacked, forwards = stacked + rows[i - 1], max(forwards, new_tokens[i - 1])
            if (exact and length[i - 1] != length[j - 1]) or (i < j and stacked * length[j - 1] * vocab > MAX_LOGITS):
                break
            cost = best[i - 1] + forwards * FORWARD_COST_TOKENS + stacked * (length[j - 1] + forwards - 1)
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups


#: the last element of the stack key of unpadded rows that stack across lengths (:func:`extended`)
EXTENDED = "extended"


def _stack_key(request: Logits) -> tuple:
    """Requests with equal keys may share a forward. The last element is the side a
    decoder-only batch is padded on, where requests of other lengths may be widened to
    stack, or :data:`EXTENDED` for unpadded rows that may be lengthened (:func:`extending`);
    otherwise ``None``, and the lengths are part of the key."""
    batch = request.batch
    present = tuple(name for name in BATCH_FIELDS if getattr(batch, name) is not None)
    if batch.decoder_input_ids is None:
        kind = _mask_kind(batch.attention_mask)
        # Kept positions are the last columns: a batch widened on the right would move them.
        if kind == "left" or (kind == "right" and request.keep is None):
            return (id(request.adapter), present, kind)
        if kind in ("none", "ones") and batch.segment_ids is None and _EXTENDING.get():
            return (id(request.adapter), present, kind, EXTENDED)
        return (id(request.adapter), present, kind, batch.input_ids.shape[1], None)
    kinds = (_mask_kind(batch.attention_mask), _mask_kind(batch.decoder_attention_mask))
    return (id(request.adapter), present, kinds, batch.input_ids.shape[1], batch.decoder_input_ids.shape[1], None)


def _mask_kind(mask: Tensor | None) -> str:
    """``none`` (no mask), ``ones``, ``left`` or ``right`` (every row padded on that side
    only, some row padded), or ``other`` (fully padded rows beside others, holes)."""
    if mask is None:
        return "none"
    if bool(mask.all()):
        return "ones"
    steps = mask.diff(dim=1)  # [B, T - 1]
    rising, falling = bool((steps >= 0).all()), bool((steps <= 0).all())
    real_rows = bool(mask.any(dim=1).all())  # a row of nothing but padding fits either side
    if rising and not falling and real_rows:
        return "left"
    if falling and not rising and real_rows:
        return "right"
    return "other"


def _padded_side(batch: Batch) -> str | None:
    kind = _mask_kind(batch.predicted_mask)
    return kind if kind in ("left", "right") else None


def widen(batch: Batch, length: int, side: str | None, adapter: Adapter) -> Batch:
    """``batch`` padded to ``length`` on ``side``: the pad id, mask 0, segment -1, and the
    position id of the column beside (what a padded slot holds does not matter to a model
    whose masks work, which is what licenses stacking)."""
    extra = length - batch.input_ids.shape[1]
    if extra == 0 or batch.decoder_input_ids is not None:
        return batch
    assert side in ("left", "right"), "only rows padded on one side are widened"
    fills = {"input_ids": pad_token(adapter), "attention_mask": 0, "segment_ids": -1}
    widened = {}
    for name in BATCH_FIELDS:
        value = getattr(batch, name)
        if value is None:
            widened[name] = None
            continue
        edge = value[:, :1] if side == "left" else value[:, -1:]  # [B, 1]
        fill = (
            edge.expand(-1, extra)
            if name == "position_ids"
            else torch.full((value.shape[0], extra), fills[name], dtype=value.dtype, device=value.device)
        )
        widened[name] = torch.cat([fill, value] if side == "left" else [value, fill], dim=1)  # [B, length]
    return Batch(**widened)


def extended(batch: Batch, length: int, adapter: Adapter) -> Batch:
    """Unpadded decoder rows ``batch [B, T]`` lengthened to ``length`` with real tokens on
    the right (never the pad id; a mask of ones and the next positions where the batch has
    them): the call of the same kind, longer. Its first ``T`` positions are the batch's own
    for a model whose positions read nothing after them (:func:`extending`), so any ids
    serve: the vocabulary in order."""
    extra = length - batch.input_ids.shape[1]
    if extra == 0:
        return batch
    pad = pad_token(adapter)
    ids = torch.arange(extra, device=batch.input_ids.device) % max(1, adapter.capabilities.vocab_size - 1)  # [extra]
    ids = (ids + (ids >= pad).long()).to(batch.input_ids.dtype).expand(batch.size, -1)  # [B, extra]: the pad id skipped
    mask, positions = batch.attention_mask, batch.position_ids
    if mask is not None:
        mask = torch.cat([mask, torch.ones_like(ids, dtype=mask.dtype)], dim=1)  # [B, length]
    if positions is not None:  # each row's next positions after its last
        following = torch.arange(1, extra + 1, device=positions.device, dtype=positions.dtype)  # [extra]
        positions = torch.cat([positions, positions[:, -1:] + following], dim=1)  # [B, length]
    return Batch(torch.cat([batch.input_ids, ids], dim=1), mask, positions)


def _kept_together(asked: list[Logits], length: int, extend: bool) -> int | None:
    """The last positions a stacked forward of ``asked`` (at ``length``) must return: the most
    any request keeps, counted from the end of the forward (an extended request's kept
    positions end at its own length, before the extension); None where one keeps them all."""
    kept = [(r.keep, r.batch.predicted_ids.shape[1]) for r in asked]
    if any(keep is None for keep, _ in kept):
        return None
    return max(min(keep, own) + (length - own if extend else 0) for keep, own in kept if keep is not None)
