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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields
from typing import Any, Union

import torch
from torch import Tensor

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


def batch_fingerprint(batch: Any) -> tuple:
    return tuple((f.name, tensor_fingerprint(getattr(batch, f.name))) for f in fields(batch))


Remembered = Union[Tensor, tuple[Tensor, ...]]


def _bytes(value: Remembered) -> int:
    tensors = value if isinstance(value, tuple) else (value,)
    return sum(t.numel() * t.element_size() for t in tensors)


def _copy(value: Remembered) -> Remembered:
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
