"""Each distinct forward once: a bounded memo of an audit's logits, keyed by the call.

Checks and suites ask a model for the same logits again and again: the canonical forward of
an unpadded case is a case of causal, padding, loss and packing alike, and a call path that
leaves a batch as it was (a mask of ones on a row that already has one) makes the canonical
call again. A call is *the same* when everything the model is given is the same:

- the batch as the path hands it over (the bytes, shape and dtype of every tensor),
- the positions whose logits are kept (``keep``),
- the path's call settings (training mode with gradients, the cache setting, the
  float32 twin), and which model object is called,
- the weights as they are now: a parameter's or buffer's version counter moves with every
  in-place change (loading a variant, an optimiser step), so a changed model is a new key.

What is served is a copy, so a check that writes into its logits cannot change another's.
A *fresh* cached decode is remembered the same way (``Adapter.decoded``: a prompt and the
tokens fed after it; ``batching.greedy``): it starts from a new cache, so it is a function of
its inputs, and a call path replaying a cache check reuses the canonical path's decode.
A *prefill*, and a fresh decode whose state a check operates on next
(``Adapter.decoded_state``), is remembered with the state it left (:class:`RememberedState`)
where the adapter's :meth:`~base.Adapter.fork` copies the whole state
(``Adapter.copies_states``) and the decode was measured to leave nothing in the model's
modules (:func:`module_tensors` equal before and after it: RecurrentGemma's recurrent state
lives there, and no copy of the returned state reaches it) and to return nothing a module
also holds (:func:`shared_with_modules`); it is served as its logits and a fresh copy of
that state, so the serving checks that start several decodes from one prompt prefill it
once, and the checks that rearrange one decode's rows decode it once.
Never served: a step of a decode in progress or a serving operation (they advance or change a
state), losses, the gradient checks' forwards (they call the model themselves, with their own
backward), and a forward made to measure run-to-run differences (``forward_memo(False)``).
Training-path results are keyed apart from eval results and served only to training calls.

Bounded: :data:`MEMO_BYTES` of logits, the least recently used dropped first, so an audit of
a large model keeps a few requests' logits, not every one. :func:`forward_memo` turns it
off (``with forward_memo(False): ...``): the test that reuse changes no verdict compares an
audit with it and without it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any, Union

import torch
from torch import Tensor

from .paths import on_path as batch_on_path

#: The most logits the memo holds at once: 256 MiB in float32, as one stacked forward may return.
MEMO_BYTES = 2**28

_ENABLED: ContextVar[bool] = ContextVar("maskcheck_forward_memo", default=True)
#: False inside a forward whose batch is several requests stacked: each request's rows are kept instead
_STORING: ContextVar[bool] = ContextVar("maskcheck_forward_memo_storing", default=True)


@contextmanager
def _set(variable: ContextVar[bool], value: bool) -> Iterator[None]:
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


def forward_memo(enabled: bool) -> Any:
    """Serve repeated forwards from the memo (True, the default) or compute each (False)."""
    return _set(_ENABLED, enabled)


def memo_enabled() -> bool:
    return _ENABLED.get()


def not_stored() -> Any:
    """A forward made inside is not kept (a stacked forward: its requests are kept one by one)."""
    return _set(_STORING, False)


def memo_storing() -> bool:
    return _STORING.get()


def tensor_fingerprint(value: Any) -> Any:
    """What identifies one input: None, or a tensor's shape, dtype, device and bytes."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        return ("value", repr(value))
    data = value.detach().contiguous().cpu()
    if data.dtype == torch.bool:
        data = data.to(torch.uint8)
    digest = hashlib.blake2b(data.view(-1).view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
    return (tuple(value.shape), str(value.dtype), str(value.device), digest)


def weights_version(model: Any) -> int | None:
    """The sum of the version counters of a module's parameters and buffers: it grows with
    every in-place change to any of them (counters only grow), 0 for a plain callable. None
    for a module holding an inference tensor (made under ``torch.inference_mode``), which
    keeps no counter: its calls are not remembered."""
    if not isinstance(model, torch.nn.Module):
        return 0
    version = 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_inference():
            return None
        version += tensor._version
    return version


def plain_values(holder: Any) -> tuple:
    """``holder``'s attributes that are plain values (numbers, strings, flags, None), sorted
    by name: the settings of an object, without its tensors and the objects it points to."""
    plain = (bool, int, float, str, type(None))
    return tuple(sorted((name, value) for name, value in vars(holder).items() if isinstance(value, plain)))


def _steps_fed(steps: Sequence[Tensor]) -> tuple:
    """What names a fresh decode's steps in its key: the tokens of each."""
    return ("steps", *(tensor_fingerprint(tokens) for tokens in steps))


def batch_fingerprint(batch: Any) -> tuple:
    return tuple((f.name, tensor_fingerprint(getattr(batch, f.name))) for f in fields(batch))


_LEAVES = (str, bytes, int, float, bool, type(None), torch.nn.Module)
#: what every nn.Module holds: its parameters and buffers (its weights: weights_version), its
#: submodules (walked themselves), its hooks and flags; none of it is a forward's state
_EVERY_MODULES_OWN = frozenset(vars(torch.nn.Module()))


def _held(value: Any, depth: int = 8) -> Iterator[Any]:
    """``value`` and every object it holds (a cache object's layers, masks, kwargs), depth first."""
    yield value
    if depth == 0 or isinstance(value, (Tensor, *_LEAVES)):
        return
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple, set)):
        items = list(value)
    else:
        items = list(getattr(value, "__dict__", {}).values())
    for item in items:
        yield from _held(item, depth - 1)


def _module_attributes(model: torch.nn.Module) -> Iterator[tuple[str, str, Any]]:
    """``(module name, attribute, value)`` of what each module holds beyond what every module does."""
    for module_name, module in model.named_modules():
        for name, value in vars(module).items():
            if name not in _EVERY_MODULES_OWN:
                yield module_name, name, value


def module_tensors(model: Any) -> tuple | None:
    """Every tensor a module of ``model`` holds outside its parameters and buffers (an
    attribute, or one inside a list, dict or object it holds), by module, attribute,
    identity and version counter: a forward that keeps state in its modules
    (RecurrentGemma's recurrent states, a cache in the module's own attributes) assigns or
    writes one of them, so this differs before and after it. None for a model that is not a
    module: nothing is known of it."""
    if not isinstance(model, torch.nn.Module):
        return None
    return tuple(
        (module_name, name, id(item), None if item.is_inference() else item._version)
        for module_name, name, value in _module_attributes(model)
        for item in _held(value, depth=3)
        if isinstance(item, Tensor)
    )


def state_bytes(state: Any) -> int:
    """The bytes of the tensors a decoding state holds, each storage counted once: what a
    remembered prefill costs the memo."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in _held(state) if isinstance(t, Tensor)}
    return sum(storage.nbytes() for storage in storages.values())


def shared_with_modules(model: Any, state: Any) -> bool:
    """Whether an object of ``state`` is also an attribute of one of the model's modules (a
    cache the model keeps and resets for the next request, as older transformers kept a
    static cache in ``model._cache``): a copy of the state would not be what the next call
    of the model finds."""
    if not isinstance(model, torch.nn.Module):
        return True
    attributes = {id(value) for _, _, value in _module_attributes(model) if not isinstance(value, _LEAVES)}
    return any(id(item) in attributes for item in _held(state) if not isinstance(item, _LEAVES))


@dataclass(frozen=True)
class RememberedState:
    """A fresh decode's logits (the prompt's ``[B, T, V]``, then each step's ``[B, n, V]``)
    and the state it left, kept as a copy nobody decodes from: each serving is the logits
    cloned and a fresh ``fork`` of the state."""

    logits: tuple[Tensor, ...]
    state: Any
    fork: Callable[[Any], Any]
    nbytes: int

    def copy(self) -> "RememberedState":
        logits = tuple(t.detach().clone() for t in self.logits)
        return RememberedState(logits, self.fork(self.state), self.fork, self.nbytes)


Remembered = Union[Tensor, tuple[Tensor, ...], RememberedState]


def _bytes(value: Remembered) -> int:
    if isinstance(value, RememberedState):
        return value.nbytes
    tensors = value if isinstance(value, tuple) else (value,)
    return sum(t.numel() * t.element_size() for t in tensors)


def _copy(value: Remembered) -> Remembered:
    if isinstance(value, RememberedState):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(t.detach().clone() for t in value)
    return value.detach().clone()


class ForwardMemo:
    """Logits (or a decode's tensors) by call key, least recently used first out, at most
    ``limit`` bytes."""

    def __init__(self, limit: int = MEMO_BYTES) -> None:
        self.limit = limit
        self._entries: OrderedDict[tuple, Tensor] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def get(self, key: tuple) -> Any:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return _copy(value)

    def put(self, key: tuple, value: Remembered) -> None:
        size = _bytes(value)
        if size > self.limit or key in self._entries:
            return
        self._entries[key] = _copy(value)
        self._bytes += size
        while self._bytes > self.limit:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= _bytes(dropped)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self.hits = self.misses = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes


class MemoisedCalls:
    """How an adapter keys its calls for its :class:`ForwardMemo` (``self.forward_memo``), and
    the fresh decode it remembers (:meth:`decoded`). Mixed into ``base.Adapter``, whose
    ``model``, ``path``, ``capabilities``, ``prefill`` and ``step`` it uses."""

    model: Any
    path: Any
    capabilities: Any
    forward_memo: ForwardMemo
    #: whether :meth:`fork` copies everything a decoding state holds, so a prefill may be served
    copies_states: bool = False
    fork: Callable[[Any], Any]

    def _call_key(self, batch: Any, keep: int | None) -> tuple | None:
        """What identifies this call of the model (the module docstring), for ``batch`` as the path hands it
        over; None when the memo is off."""
        version = weights_version(self.model) if memo_enabled() else None
        if version is None:
            return None
        path = self.path
        return (
            id(self.model),
            version,
            path.training,
            path.default_cache,
            self._call_settings(),
            keep,
            batch_fingerprint(batch),
        )

    def _decoding_key(self, prompt: Any, what: tuple) -> tuple | None:
        """What identifies a fresh decode of ``prompt`` (``what``: the tokens fed after it, or
        a greedy decode's length). Cached calls take the batch as it is on every path, in eval
        mode and with the cache on, so no path setting is part of it: a path replaying a cache
        check compares its own full forward with the decode the canonical path made."""
        version = weights_version(self.model) if memo_enabled() else None
        if version is None:
            return None
        settings = (self._call_settings(), self._state_settings())
        return ("decode", id(self.model), version, settings, batch_fingerprint(prompt), what)

    def remembers_decoding(self, prompt: Any, what: tuple) -> bool:
        key = self._decoding_key(prompt, what)
        return key is not None and key in self.forward_memo

    def remember_decoding(self, prompt: Any, what: tuple, value: tuple[Tensor, ...]) -> None:
        key = self._decoding_key(prompt, what)
        if key is not None and memo_storing():
            self.forward_memo.put(key, value)

    def fresh_decoding(self, prompt: Any, what: tuple, decode: Callable[[], tuple[Tensor, ...]]) -> Any:
        """``decode()``, a fresh decode of ``prompt`` that ``what`` names, or what an identical
        one gave earlier in this audit."""
        key = self._decoding_key(prompt, what)
        remembered = None if key is None else self.forward_memo.get(key)
        if remembered is not None:
            return remembered
        value = decode()
        self.remember_decoding(prompt, what, value)
        return value

    def decoded(self, prompt: Any, steps: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """A fresh decode: :meth:`prefill` of ``prompt``, then each of ``steps`` (``[B, n]``
        tokens) fed in turn; the prompt's logits ``[B, P, V]`` and each step's ``[B, n, V]``.
        It starts from a new cache, so it is a function of its inputs alone and is remembered
        as a forward is: a call path replaying a cache check decodes once."""
        return self.fresh_decoding(prompt, _steps_fed(steps), lambda: self._decode(prompt, steps)[0])

    def decoded_state(self, prompt: Any, steps: Sequence[Tensor]) -> tuple[tuple[Tensor, ...], Any]:
        """:meth:`decoded`'s logits and the state the decode leaves, for a check that operates
        on that state next; served as a fresh copy of the state where :meth:`remembered_state` can."""
        return self.remembered_state(prompt, _steps_fed(steps), lambda: self._decode(prompt, steps))

    def _decode(self, prompt: Any, steps: Sequence[Tensor]) -> tuple[tuple[Tensor, ...], Any]:
        logits, state = self.prefill(prompt)
        pieces = [logits]
        for tokens in steps:
            step_logits, state = self.step(state, tokens)
            pieces.append(step_logits)
        return tuple(pieces), state

    def remembered_state(
        self, prompt: Any, what: tuple, decode: Callable[[], tuple[tuple[Tensor, ...], Any]]
    ) -> tuple[tuple[Tensor, ...], Any]:
        """``decode()``, a fresh decode of ``prompt`` that ``what`` names (its logits and the
        state it leaves), or the logits and a fresh copy of the state an identical decode left
        earlier in this audit (the module docstring says when)."""
        key = self._state_key(prompt, what)
        remembered = None if key is None else self.forward_memo.get(key)
        if remembered is not None:
            return remembered.logits, remembered.state
        before = None if key is None else module_tensors(self.model)
        logits, state = decode()
        if (
            before is not None
            and memo_storing()
            and module_tensors(self.model) == before
            and not shared_with_modules(self.model, state)
        ):
            kept = self.fork(state)
            self.forward_memo.put(key, RememberedState(logits, kept, self.fork, _bytes(logits) + state_bytes(kept)))
        return logits, state

    def remembers_state(self, prompt: Any, what: tuple) -> bool:
        """Whether the decode ``what`` names of ``prompt`` is remembered with its state: it
        was measured to leave its whole state in what it returned (:meth:`remembered_state`)."""
        key = self._state_key(prompt, what)
        return key is not None and key in self.forward_memo

    def _state_key(self, prompt: Any, what: tuple) -> tuple | None:
        return self._decoding_key(prompt, ("state", *what)) if self.copies_states else None

    def _state_settings(self) -> tuple:
        """What shapes a decoding state besides the call settings (a cache implementation
        chosen for a copy of the adapter): part of a decode's key."""
        return ()

    def _call_settings(self) -> tuple:
        """What of this adapter shapes a call besides the batch and the path: its capabilities
        and every plain value it holds (a copy left at ``use_cache=None``, one that passes a
        mask of ones, another measured mask layout all call the model otherwise). Plain
        values only: one that is bookkeeping can cost a memo hit, never serve a wrong call."""
        return (self.capabilities, plain_values(self))

    def _request_key(self, batch: Any, keep: int | None) -> tuple | None:
        """:meth:`_call_key` of the call :meth:`logits` would make for ``batch`` and ``keep``."""
        moved = batch_on_path(batch, self.path, self.capabilities.position_offset)
        length = moved.predicted_ids.shape[1]
        return self._call_key(moved, None if keep is None or keep >= length else keep)

    def remembers(self, batch: Any, keep: int | None = None) -> bool:
        """Whether :meth:`logits` of ``batch`` would be served from the memo: the batching
        engine asks before it stacks a request with others."""
        key = self._request_key(batch, keep)
        return key is not None and key in self.forward_memo

    def remember(self, batch: Any, keep: int | None, logits: Tensor) -> None:
        """Keep ``logits`` as the call's for ``batch`` (a request answered from a stacked forward)."""
        key = self._request_key(batch, keep)
        if key is not None:
            self.forward_memo.put(key, logits)


class DecodesThroughOwnCalls:
    """For a wrapper whose own ``prefill`` and ``step`` must see every call of a decode
    (compare's paired adapter compares each; a bundle's recorder keeps their inputs): the
    decode whose state a check operates on is made through them, and nothing is remembered.
    Named on the class, since a wrapper's ``__getattr__`` would hand over the wrapped
    adapter's, which decodes on that adapter alone."""

    decoded_state = MemoisedCalls.decoded_state
    _decode = MemoisedCalls._decode

    def remembered_state(self, prompt: Any, what: tuple, decode: Callable[[], Any]) -> Any:
        return decode()
