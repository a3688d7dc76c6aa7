"""Call paths: the ways users call a model that can take another branch of its code.

Every check builds its inputs one way (its *canonical* path: eval mode, no gradients,
a mask wherever a row is padded, ``use_cache=False`` for Hugging Face full forwards).
Users call models other ways, and a model's mask can be right on one branch and wrong
on another: SDPA's ``is_causal`` fast path when no mask is given, transformers building
no mask when nothing is padded, a kernel used only with gradients on. A :class:`CallPath`
changes how the adapter calls the model, never what a check compares, so every check can
be run on every path (harness/audits/runner.py runs them; the report shows which ran).

A path applies to a *plain* batch only where it says so: a batch whose rows have no
padding and whose position ids (if any) are the default ``0 .. T-1`` (plus the model's
offset). Padded and packed batches keep their mask and positions on every path, since
dropping them would change what the model is asked, not how.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class CallPath:
    """How an adapter calls its model; the flags combine."""

    name: str
    description: str  # what the call looks like, for the report
    bare: bool = False  # plain batches: no attention mask and no position ids, ``model(input_ids)``
    mask_of_ones: bool = False  # plain batches: an explicit attention mask of ones
    default_cache: bool = False  # the forward's cache setting left at its default (``use_cache`` not passed)
    training: bool = False  # ``model.train()``, dropout off, gradients on: the training forward
    twin: bool = False  # the same weights in float32, judged at float32's thresholds (low-precision models)


CANONICAL = CallPath("canonical", "as each check builds its inputs: eval mode, no gradients, use_cache=False")
BARE_CALL = CallPath("bare_call", "model(input_ids) with no mask or position ids wherever nothing is padded", bare=True)
MASK_OF_ONES = CallPath("mask_of_ones", "an attention mask of ones wherever nothing is padded", mask_of_ones=True)
DEFAULT_CACHE = CallPath("default_cache", "use_cache left at the model's default", default_cache=True)
TRAINING = CallPath("training", "model.train() with dropout off and gradients on (the training forward)", training=True)
#: A low-precision model's weights in float32: a check comparing two computations of other
#: shapes (cached against full, padded against alone) must allow the dtype's rounding, which
#: in bfloat16 is larger than many leaks; the mask's structure is the same in float32,
#: where the threshold is 2**16 times tighter. Every check of the low-precision model still
#: runs at its own dtype on the other paths; this one judges the structure.
FLOAT32_TWIN = CallPath(
    "float32_twin", "the same weights in float32, judged at float32's thresholds (the mask's structure)", twin=True
)
#: the paths besides the canonical one, in the order they run and are reported
OTHER_PATHS = (BARE_CALL, MASK_OF_ONES, DEFAULT_CACHE, TRAINING, FLOAT32_TWIN)
#: the one path of the gradient checks, which differentiate the training forward
TRAINING_BACKWARD = CallPath(
    "training_backward", "the training forward and its backward to the token embeddings", training=True
)
PATHS = {path.name: path for path in (CANONICAL, *OTHER_PATHS, TRAINING_BACKWARD)}


@dataclass(frozen=True)
class PathAvailability:
    """Whether a path can run on a model, and why not when it cannot."""

    path: CallPath
    reason: str | None = None  # None: it runs

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path.name, "description": self.path.description, "unavailable": self.reason}


def plain(batch: Any, position_offset: int) -> bool:
    """Whether ``batch`` has no padding and default positions (the batches a path may change)."""
    for mask in (batch.attention_mask, batch.decoder_attention_mask):
        if mask is not None and not bool(mask.bool().all()):
            return False
    if batch.segment_ids is not None:
        return False
    positions = batch.position_ids
    if positions is None:
        return True
    default = torch.arange(positions.shape[-1], device=positions.device) + position_offset  # [T]
    return bool((positions == default).all())


def on_path(batch: Any, path: CallPath, position_offset: int) -> Any:
    """``batch`` as ``path`` calls the model with it."""
    if not (path.bare or path.mask_of_ones) or not plain(batch, position_offset):
        return batch
    return _rewritten(batch, path)


def _rewritten(batch: Any, path: CallPath) -> Any:
    """A plain ``batch`` as a path that rewrites batches passes it."""
    if path.bare:
        return replace(batch, attention_mask=None, position_ids=None, decoder_attention_mask=None)
    ones = torch.ones_like(batch.input_ids)
    decoder_ones = None if batch.decoder_input_ids is None else torch.ones_like(batch.decoder_input_ids)
    return replace(batch, attention_mask=ones, decoder_attention_mask=decoder_ones)


def changes_call(path: CallPath, batch: Any, position_offset: int, is_plain: bool | None = None) -> bool:
    """Whether ``path`` calls the model otherwise than the canonical path does for a logits,
    loss or gradient call with ``batch``: a path that sets a mode, a cache setting or other
    weights changes every such call; one that rewrites batches changes those it rewrites to
    other values.
    ``is_plain``: :func:`plain` of the batch, where the caller knows it."""
    if path.training or path.default_cache or path.twin:
        return True
    if not (path.bare or path.mask_of_ones):
        return False
    if not (plain(batch, position_offset) if is_plain is None else is_plain):
        return False
    rewritten = _rewritten(batch, path)
    return not all(_same_tensor(getattr(rewritten, f.name), getattr(batch, f.name)) for f in fields(batch))


def _same_tensor(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


@dataclass
class CallLog:
    """Which other paths would call the model otherwise than the canonical path did, for the
    logits, loss and gradient calls one case made there: the only calls a path changes,
    except on the float32 twin, whose other weights answer every call (a prefill and a
    decode step too).

    A case that a path leaves unchanged makes the same calls there and gets the same
    logits (up to the rows it is stacked with, which the batching gate licenses), so its
    canonical outcome is its outcome on that path: replaying it there costs its forwards
    and can change no verdict (``harness/audits/runner.py:PathChecks``)."""

    changed: set[str] = field(default_factory=set)  # names of the paths that change some call

    def note(self, path: CallPath | None, batch: Any, position_offset: int) -> None:
        """Note a call made on ``path`` (only the canonical path's calls are compared)."""
        if path != CANONICAL:
            return
        pending = [other for other in OTHER_PATHS if other.name not in self.changed]
        is_plain = plain(batch, position_offset) if any(p.bare or p.mask_of_ones for p in pending) else False
        for other in pending:
            if changes_call(other, batch, position_offset, is_plain):
                self.changed.add(other.name)

    def same_on(self, path: CallPath) -> bool:
        """Whether ``path`` would make exactly the calls this case made on the canonical path."""
        return not path.twin and path.name not in self.changed


#: the log of the case being evaluated, if its calls are being logged (harness/engine/suite.py)
_CALLS: ContextVar[CallLog | None] = ContextVar("maskcheck_calls", default=None)


@contextmanager
def logging_calls(log: CallLog | None) -> Iterator[None]:
    """Note in ``log`` every logits, loss and gradient call made inside (None: note nowhere)."""
    token = _CALLS.set(log)
    try:
        yield
    finally:
        _CALLS.reset(token)


def current_log() -> CallLog | None:
    """Where the calls made here are noted (None: nowhere)."""
    return _CALLS.get()


def note_call(path: CallPath, batch: Any, position_offset: int) -> None:
    """Note a logits, loss or gradient call in the current case's log, if one is kept."""
    log = _CALLS.get()
    if log is not None:
        log.note(path, batch, position_offset)


def trainable_copy(batch: Any) -> Any:
    """A copy of a :class:`~.base.Batch` whose tensors can be saved for backward: tensors made
    under ``torch.inference_mode`` (every case's) cannot take part in a graph that records them.
    Call it with inference mode off."""
    values = {f.name: getattr(batch, f.name) for f in fields(batch)}
    return replace(batch, **{k: v.clone() for k, v in values.items() if isinstance(v, Tensor)})


@contextmanager
def training_forward(model: Any) -> Iterator[None]:
    """Run ``model`` as a training step does: train mode, gradients recorded, every
    ``nn.Dropout`` at ``p = 0`` so a comparison is not noise. Restores each module's mode,
    each dropout's ``p`` and every buffer (train-mode BatchNorm updates its statistics)."""
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    modes = [(module, module.training) for module in modules]
    dropouts = [(module, module.p) for module in modules if isinstance(module, torch.nn.modules.dropout._DropoutNd)]
    # Each module's own buffers, read from its registry: a generator per module cost more
    # than the forward of a tiny model, and this runs on every training-path call.
    buffers = [
        (buffer, buffer.detach().clone())
        for module in modules
        for buffer in module._buffers.values()
        if buffer is not None
    ]
    try:
        for module, _ in dropouts:
            module.p = 0.0
        if modules:
            model.train()  # the model's own train(), which a model may override
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for module, p in dropouts:
            module.p = p
        for module, mode in modes:
            # a plain attribute: Module.__setattr__'s checks for parameters, buffers and
            # submodules cost about 3 microseconds a module, on every training-path call
            object.__setattr__(module, "training", mode)
        with torch.no_grad():
            for buffer, saved in buffers:
                if not torch.equal(buffer, saved):
                    buffer.copy_(saved)
