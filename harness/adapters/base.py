"""The adapter protocol: one interface in front of every kind of model.

Mask convention of :class:`Batch`, for every adapter: ``attention_mask`` 1 = real
token, 0 = padding (Hugging Face). Adapters translate for models that take PyTorch's
``key_padding_mask`` (True = ignore).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from .errors import AdapterError, ModelRaised, check_logits
from .gradient_calls import GradientCalls
from .layer_attention import LayerAttention, as_layers
from .memo import ForwardMemo, MemoisedCalls, forward_memo, memo_storing
from .outputs import OutputKind, vocabulary
from .paths import (
    CANONICAL,
    DEFAULT_CACHE,
    FLOAT32_TWIN,
    OTHER_PATHS,
    TRAINING,
    CallPath,
    PathAvailability,
    note_call,
    trainable_copy,
    training_forward,
)
from .paths import on_path as batch_on_path
from .prefix import default_prefix

Family = Literal["encoder", "decoder", "encoder_decoder"]
AttentionPattern = Literal["causal", "bidirectional", "sliding_window", "prefix_lm", "chunked"]
Packing = Literal["segment_ids", "position_ids"]


class ServingUnsupported(AdapterError):
    """The model's cache cannot do a serving operation (harness/adapters/serving.py), by
    its own declaration or for want of the method; one line, the check's n/a reason."""


class LayoutUnavailable(Exception):
    """The weights cannot be loaded under the asked layout (parameters it needs are missing)."""


@dataclass(frozen=True)
class Capabilities:
    """What a model declares about itself; suites read this to decide what applies."""

    family: Family
    vocab_size: int
    takes_attention_mask: bool = True
    takes_position_ids: bool = False
    derives_positions_from_mask: bool = False
    packing: Packing | None = None
    has_cache: bool = False
    no_cache_reason: str | None = None  # measured: why a model that could decode has no cache to check
    unpadded_cache_reason: str | None = None  # why cached calls take unpadded rows only (a protocol without a mask)
    generates: bool = False  # the adapter runs the model's own generate(), with its cache and without
    has_loss: bool = False
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    # The side the model's inputs are padded on ("left" or "right"): its tokenizer's
    # padding_side, else declared; None where neither says (a decoder has no default side).
    padding_side: str | None = None
    max_length: int | None = None
    trained_length: int | None = None
    # The declared pattern; None takes the family's: an encoder reads both ways, a decoder
    # (and an encoder-decoder's decoder) causally.
    attention: AttentionPattern | None = None
    # A sliding window's width W counts the token itself: a query reads itself and the
    # W - 1 keys before it (Mistral's and PyTorch's convention); W=1 reads only itself.
    window: int | None = None
    # A chunk's width C, for attention="chunked": every layer reads the keys at or before a
    # query within its own chunk of C tokens (harness/adapters/layer_attention.py).
    attention_chunk: int | None = None
    # Per layer, the pattern it declares, where layers differ (sliding then full, chunked
    # then full); None: every layer follows ``attention``.
    layers: tuple[LayerAttention, ...] | None = None
    # A per-layer declaration the engine cannot verify, named in one line (causal's
    # layer_windows is not_run with it, rather than judging the layers as something else).
    unverified_layers: str | None = None
    n_layers: int | None = None
    norm_layout: str | None = None
    position_scheme: str | None = None
    position_offset: int = 0  # the id of a sequence's first position (RoBERTa numbers from padding_idx + 1)
    device: str = "cpu"
    dtype: str = "float32"
    tokenizer: Any = field(default=None, compare=False, repr=False)
    # What the model returns (harness/adapters/outputs.py); None: logits over the vocabulary.
    output: OutputKind | None = None

    def __post_init__(self) -> None:
        if self.attention is None:
            object.__setattr__(self, "attention", "bidirectional" if self.family == "encoder" else "causal")
        if self.output is None:
            object.__setattr__(self, "output", vocabulary(self.vocab_size))
        if self.attention == "chunked" and not self.attention_chunk:
            raise ValueError("attention='chunked' needs attention_chunk, the chunk's width in tokens")
        if self.layers is not None:
            object.__setattr__(self, "layers", as_layers(self.layers))
        if self.padding_side not in (None, "left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")

    @property
    def output_kind(self) -> OutputKind:
        """:attr:`output`, typed as set (``__post_init__`` fills it)."""
        assert self.output is not None
        return self.output

    @property
    def output_width(self) -> int:
        """The last dimension of the ``[B, T, C]`` the adapter hands the engine."""
        return self.output_kind.width

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("tokenizer")
        data["has_tokenizer"] = self.tokenizer is not None
        return data


@dataclass(frozen=True)
class PackingSetting:
    """One way to run packed rows: exactly what the caller passes, and whether the model's
    documentation asks for it (the one a packing verdict rests on)."""

    name: str
    inputs: str
    documented: bool = True


@dataclass(frozen=True)
class CheckpointRecord:
    """What a checkpoint recorded about itself when it was saved."""

    path: str
    layout: dict[str, Any]  # the architecture fields it was trained with
    probe: "Batch | None" = None  # the fixed probe batch of its fingerprint
    probe_logprobs: Tensor | None = None  # [B, T, C]: log-probabilities of the first C ids on the probe
    metadata: dict[str, str] = field(default_factory=dict)  # the rest: training run, retrieval vocabulary ...


@dataclass
class Batch:
    """Model inputs. ``input_ids [B, T]``; masks ``[B, T]`` with 1 = real token."""

    input_ids: Tensor
    attention_mask: Tensor | None = None
    position_ids: Tensor | None = None
    segment_ids: Tensor | None = None  # 0, 1, 2 ... per packed sequence; -1 for padding
    decoder_input_ids: Tensor | None = None
    decoder_attention_mask: Tensor | None = None
    # A prefix LM's bidirectional prefix, 1 at its tokens (harness/adapters/prefix.py); None:
    # the audit's default prefix, for a model that declares attention="prefix_lm".
    prefix_mask: Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(**{k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in dataclasses.asdict(self).items()})

    @property
    def predicted_ids(self) -> Tensor:
        """The ids at the positions the logits cover (the decoder's, for encoder-decoders)."""
        return self.input_ids if self.decoder_input_ids is None else self.decoder_input_ids

    @property
    def predicted_mask(self) -> Tensor | None:
        return self.attention_mask if self.decoder_input_ids is None else self.decoder_attention_mask

    @property
    def prefix(self) -> Tensor:
        """``[B, T]`` bool: the prefix the model is given, the default where none is set."""
        if self.prefix_mask is not None:
            return self.prefix_mask.bool()
        mask = self.attention_mask if self.attention_mask is not None else torch.ones_like(self.input_ids)
        return default_prefix(mask.bool(), self.segment_ids)

    @property
    def predicted_real(self) -> Tensor:
        """``[B, T]`` True at the predicted side's real tokens (every one without a mask), on the CPU."""
        mask = self.predicted_mask
        return torch.ones(self.predicted_ids.shape, dtype=torch.bool) if mask is None else mask.bool().cpu()


class PickleRefused(Exception):
    """A pickle file that ``torch.load(weights_only=True)`` would not restore as plain data."""


def load_tensors_only(path: Any) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU: tensors and plain containers only;
    anything that would run code on unpickling is a :class:`PickleRefused` with one line."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        raise PickleRefused(f"{path}: refused by torch.load(weights_only=True) ({str(exc).splitlines()[0]})") from None


OUT_OF_MEMORY = (
    "out of memory: lower the batch size or sequence length (--examples, the dev profile, or --dtype bfloat16)"
)


#: how the report begins where a request for the last positions' logits computed them all
ALL_POSITIONS = "computed for every position, the compared ones sliced: "


def call_model(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the model; anything it raises becomes an :class:`AdapterError` with a one-line message."""
    try:
        return function(*args, **kwargs)
    except torch.OutOfMemoryError as exc:
        raise ModelRaised(OUT_OF_MEMORY) from exc
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        raise ModelRaised(f"the model raised {type(exc).__name__}: {first_line}") from exc


@dataclass(frozen=True)
class ForwardKeywords:
    """The keywords a model's forward accepts, read from its class (a plain callable: itself).

    An instance's ``forward`` is often a wrapper (a monkeypatch, a training framework's
    hook) whose ``*args, **kwargs`` hide the real signature; the class's forward is what
    runs underneath. A ``**kwargs`` in the class's own forward accepts anything.
    """

    names: frozenset[str]
    takes_any: bool

    @classmethod
    def of(cls, model: Any) -> "ForwardKeywords":
        forward = type(model).forward if isinstance(model, torch.nn.Module) else model
        try:
            parameters = inspect.signature(forward).parameters
        except (TypeError, ValueError):  # no signature to read: assume every keyword, and let the suites measure
            return cls(frozenset(), True)
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        return cls(frozenset(parameters), takes_any)

    def named(self, name: str) -> bool:
        return name in self.names

    def accepts(self, name: str) -> bool:
        return name in self.names or self.takes_any


class Adapter(MemoisedCalls, GradientCalls, abc.ABC):
    """One model behind the protocol in docs/design.md.

    Subclasses implement :meth:`_logits` (and optionally loss and cache methods); the
    public methods run under ``torch.inference_mode``, check the model is still in eval
    mode, and check the output shape.
    """

    #: the spec this adapter was built from, or a description when built from an object
    spec: str = "<object>"
    #: what the checkpoint behind this model recorded at save time, when it was loaded from one
    checkpoint: CheckpointRecord | None = None
    #: the maskcheck.harness.adapters.specs.LoadOptions the spec was loaded with (None for objects)
    load_options: Any = None
    #: a spec that rebuilds a model given as an object (an importable factory), for reproduction bundles
    replay_spec: str | None = None
    #: set by a bundle's replay when the weights differ from the ones it recorded
    replay_note: str | None = None
    #: how this adapter calls its model (harness/adapters/paths.py); :meth:`on_path` gives the others
    path: CallPath = CANONICAL
    #: what a measurement found the model doing with its padding mask when that is not what its
    #: mask's convention promises (it ignores or inverts it), one line; the padding suite fails on it
    mask_finding: str | None = None

    def __init__(self, model: Any, capabilities: Capabilities) -> None:
        self.model = model
        self.capabilities = capabilities
        if isinstance(model, torch.nn.Module):
            model.eval()
        #: logits of calls already made (memo.py); shared by this adapter's path copies and twin
        self.forward_memo = ForwardMemo()

    # -- the protocol -----------------------------------------------------------------------

    def logits(self, batch: Batch, keep: int | None = None) -> Tensor:
        """Logits ``[B, T, V]`` over the predicted positions, called on this adapter's :attr:`path`;
        ``keep``: those of the last ``keep`` positions only, ``[B, keep, V]``, computed alone
        where the model can (:meth:`_kept_logits`)."""
        self._check_eval()
        note_call(self.path, batch, self.capabilities.position_offset)
        batch = batch_on_path(batch, self.path, self.capabilities.position_offset)
        ids = batch.predicted_ids
        keep = None if keep is None or keep >= ids.shape[1] else keep
        key = self._call_key(batch, keep)
        remembered = None if key is None else self.forward_memo.get(key)
        if remembered is not None:
            return remembered
        if self.path.training:
            with training_forward(self.model):
                out = self._kept_logits(trainable_copy(batch), keep)
                out = out.detach() if isinstance(out, Tensor) else out
        else:
            with torch.inference_mode():
                out = self._kept_logits(batch, keep)
        logits = check_logits(out, ids.shape[0], keep or ids.shape[1], self.capabilities.output_width)
        if key is not None and memo_storing():
            self.forward_memo.put(key, logits)
        return logits

    def loss(self, batch: Batch, labels: Tensor) -> Tensor:
        """The model's own loss for unshifted ``labels [B, T]`` (-100 ignored), on :attr:`path`."""
        if not self.capabilities.has_loss:
            raise NotImplementedError(f"{self.spec} declares no loss")
        self._check_eval()
        note_call(self.path, batch, self.capabilities.position_offset)
        batch = batch_on_path(batch, self.path, self.capabilities.position_offset)
        if self.path.training:
            with training_forward(self.model):
                out = self._loss(trainable_copy(batch), labels.clone())
                out = out.detach() if isinstance(out, Tensor) else out
        else:
            with torch.inference_mode():
                out = self._loss(batch, labels)
        if not isinstance(out, Tensor) or out.numel() != 1:
            raise AdapterError(
                f"the model's loss is {type(out).__name__} {getattr(out, 'shape', '')}, expected a scalar"
            )
        return out.reshape(())

    def prefill(self, batch: Batch, rollback: bool = False) -> tuple[Tensor, Any]:
        """Run the prompt; return its logits ``[B, T, V]`` and a state to continue from.
        ``rollback=True`` prepares a state that :meth:`rollback` may roll back, as assisted
        decoding prepares its cache (transformers: ``activate_past_recording``)."""
        if not self.capabilities.has_cache:
            raise NotImplementedError(
                f"{self.spec} has no cache: {self.capabilities.no_cache_reason or 'none declared'}"
            )
        self._check_eval()

        def prefill() -> tuple[tuple[Tensor], Any]:
            with torch.inference_mode():
                logits, state = self._prefill(batch, rollback=True) if rollback else self._prefill(batch)
            return (self._prefill_logits(logits, batch),), state

        (logits,), state = self.remembered_state(batch, ("prefill", rollback), prefill)
        return logits, state

    def _prefill_logits(self, logits: Any, batch: Batch) -> Tensor:
        ids = batch.predicted_ids
        return check_logits(logits, ids.shape[0], ids.shape[1], self.capabilities.output_width, "prefill logits")

    def step(self, state: Any, tokens: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Any]:
        """Append ``tokens [B, n]`` (``attention_mask [B, n]``; None: all real); the state is
        consumed. Returns logits ``[B, n, V]`` and the new state."""
        self._check_eval()
        with torch.inference_mode():
            logits, new_state = self._step(state, tokens, attention_mask)
        return check_logits(
            logits, tokens.shape[0], tokens.shape[1], self.capabilities.output_width, "step logits"
        ), new_state

    def fork(self, state: Any) -> Any:
        """An independent copy of a state, for when a test branches."""
        return state

    # -- serving: what a server does with a state besides appending to it (serving.py) ------

    def rollback(self, state: Any, tokens: int) -> Any:
        """``state`` without its last ``tokens`` tokens (speculative decoding's rejected
        drafts), from a prefill made with ``rollback=True``; the state is consumed."""
        self._check_eval()
        with torch.inference_mode():
            return self._rollback(state, tokens)

    def rearrange(self, state: Any, operation: str, index: Tensor) -> Any:
        """``state`` whose row ``i`` continues the row ``index[i]`` held (serving.RowOperation
        says which method of the model's cache does it); the state is consumed."""
        self._check_eval()
        with torch.inference_mode():
            return self._rearrange(state, operation, index)

    def share(self, state: Any) -> Any:
        """A copy of the state by the model's own means, as a prompt cache is copied for many
        requests; :meth:`fork` where that is one (it may instead replay the tokens)."""
        return self._share(state)

    def reuse(self, state: Any, batch: Batch) -> tuple[Tensor, Any]:
        """The prefill of another request ``batch`` into the cache object ``state`` holds,
        reset the model's own way (a serving slot given to the next user)."""
        self._check_eval()
        with torch.inference_mode():
            logits, new_state = self._reuse(state, batch)
        return self._prefill_logits(logits, batch), new_state

    def cache_implementations(self) -> dict[str, str | None]:
        """The model's other cache implementations by name, each with why it cannot run
        here (None: it runs); empty for a model with one cache of its own."""
        return {}

    def with_cache_implementation(self, name: str) -> "Adapter":
        """This adapter decoding with cache implementation ``name`` (see :meth:`cache_implementations`)."""
        raise ServingUnsupported(f"{self.spec} has no cache implementation {name!r}")

    def generate(self, batch: Batch, new_tokens: int, use_cache: bool) -> tuple[Tensor, Tensor]:
        """The model's own greedy ``generate()`` of ``new_tokens`` after ``batch``, with its cache
        or without: the tokens ``[B, n]`` and the logits each was chosen from ``[B, n, V]``."""
        if not self.capabilities.generates:
            raise NotImplementedError(f"{self.spec} has no generate() of its own")
        self._check_eval()
        with torch.inference_mode():
            tokens, logits = self._generate(batch, new_tokens, use_cache)
        return tokens, check_logits(logits, batch.size, new_tokens, self.capabilities.output_width, "generate() logits")

    def packing_settings(self) -> list[tuple[PackingSetting, "Adapter"]]:
        """The ways to run packed rows, the documented one first, each with the adapter that runs it."""
        packing = self.capabilities.packing
        if packing is None:
            return []
        inputs = (
            "segment_ids per packed sequence (positions restart per sequence)"
            if packing == "segment_ids"
            else "position_ids restarting at 0 per sequence"
        )
        return [(PackingSetting(packing, inputs), self)]

    def declared_layers(self) -> tuple[LayerAttention, ...] | None:
        """Per layer, the pattern it declares (:attr:`Capabilities.layers`), or None when every
        layer follows the model's one pattern."""
        return self.capabilities.layers

    #: whether :meth:`layer_attention_masks` can measure each layer's attention
    shows_layer_attention = False
    #: why the model has no backward to audit, where that is what it is (an exported graph)
    no_backward_reason: str | None = None
    #: whether the model can be called without its optional inputs (an exported graph cannot)
    inputs_have_defaults = True

    def layer_attention_masks(self, input_ids: Tensor) -> list[Tensor]:
        """Per layer, ``[T, T]`` True where some head of that layer gives a query's attention to
        a key, measured on one unpadded row ``input_ids [1, T]``."""
        raise NotImplementedError(f"{type(self).__name__} cannot show its layers' attention")

    def layout(self) -> dict[str, Any] | None:
        """The architecture fields the model runs with (norm layout, norm kind, position scheme ...),
        or None when the adapter cannot tell."""
        return None

    def relayout(self, **changes: Any) -> "Adapter":
        """The same weights under another layout; raises :class:`LayoutUnavailable` when they do not fit it."""
        raise LayoutUnavailable(f"{type(self).__name__} cannot rebuild its model under another layout")

    def layout_variants(self) -> Iterator[tuple[str, "Adapter"]]:
        """The same weights under each other variant of the architecture they fit, built one at
        a time and each named by what differs from :meth:`layout` (``field=value``)."""
        return iter(())

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec, "kind": type(self).__name__, "capabilities": self.capabilities.to_dict()}

    # -- call paths ---------------------------------------------------------------------------

    def on_path(self, path: CallPath) -> "Adapter":
        """This adapter calling its model on ``path``: a shallow copy sharing the model, the
        same object for the same path (so its forwards stack with each other, never with
        another path's). Asked of a path's copy, it answers for the adapter it was made from."""
        base = self.__dict__.get("_path_base")
        if base is not None:
            return base.on_path(path)
        memo = self.__dict__.get("_path_adapters")
        if memo is None or memo.get(self.path) is not self:  # none yet, or one copied from another adapter
            memo = self.__dict__["_path_adapters"] = {self.path: self}
        if path not in memo:
            other = self.float32_twin() if path.twin else copy.copy(self)
            other.path = path
            other.__dict__["_path_base"] = self
            memo[path] = other
        return memo[path]

    def float32_twin(self) -> "Adapter":
        """This adapter over a float32 copy of the model's weights (made once; raises
        :class:`AdapterError` for a model that cannot be copied or does not fit twice)."""
        return self._twin("_float32_twin", torch.float32)

    def float64_twin(self) -> "Adapter":
        """This adapter over a float64 copy of the model's weights (made once, on first need,
        by the adapter the path copies come from): the precision a float32 failure near its
        threshold is judged again in (harness/audits/rounding.py). Raises like :meth:`float32_twin`."""
        return self.__dict__.get("_path_base", self)._twin("_float64_twin", torch.float64)

    def _twin(self, attribute: str, dtype: torch.dtype) -> "Adapter":
        twin = self.__dict__.get(attribute)
        if twin is None:
            model = self.model
            if not isinstance(model, torch.nn.Module) or getattr(model, "hf_device_map", None):
                raise AdapterError("the model is not one torch.nn.Module on one device, so it cannot be copied")
            name = str(dtype).removeprefix("torch.")
            try:
                copied = copy.deepcopy(model).to(dtype)
            except (torch.OutOfMemoryError, RuntimeError, TypeError) as exc:
                raise AdapterError(
                    f"a {name} copy of the model could not be made: {type(exc).__name__}: {exc}"
                ) from exc
            twin = self.__dict__[attribute] = self._with_model(copied)
        return twin

    def release_state(self) -> None:
        """Leave the model as the audit found it once a suite is done (a cache kept in the
        model's own buffers, set up by maskcheck, is deleted); nothing for most adapters."""

    def release_float32_twin(self) -> None:
        """Drop the float32 copy (an audit that does not run its path needs no second model)."""
        self.__dict__.pop("_float32_twin", None)

    def release_float64_twin(self) -> None:
        """Drop the float64 copy once the suite that judged a failure on it is done."""
        self.__dict__.pop("_float64_twin", None)

    def _with_model(self, model: Any) -> "Adapter":
        """A copy of this adapter calling ``model`` (the same model in another dtype)."""
        other = copy.copy(self)
        for key in ("_path_adapters", "_path_base", "_availability", "_float32_twin", "_float64_twin"):
            other.__dict__.pop(key, None)
        other.model = model
        other.path = CANONICAL
        dtype = next((str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()), None)
        other.capabilities = dataclasses.replace(self.capabilities, dtype=dtype or self.capabilities.dtype)
        return other

    def paths(self) -> list[PathAvailability]:
        """Every path besides the canonical one, each with why it cannot run here (None: it runs).
        Measured once per adapter: the training path needs two equal train-mode forwards."""
        known = self.__dict__.get("_availability")
        if known is None:
            low_precision = self.capabilities.dtype in ("bfloat16", "float16")
            paths = [p for p in OTHER_PATHS if low_precision or not p.twin]  # a float32 model is its own twin
            known = self.__dict__["_availability"] = [PathAvailability(p, self._unavailable(p)) for p in paths]
        return known

    def _unavailable(self, path: CallPath) -> str | None:
        caps = self.capabilities
        if path.bare and not (caps.takes_attention_mask or caps.takes_position_ids):
            return "the model takes neither an attention mask nor position ids, so every call is already bare"
        if path.mask_of_ones and not caps.takes_attention_mask:
            return "the model takes no attention mask"
        if path == DEFAULT_CACHE:
            return self._default_cache_unavailable()
        if path == TRAINING:
            return self._training_unavailable()
        if path == FLOAT32_TWIN:
            return self._twin_unavailable()
        return None

    def _twin_unavailable(self) -> str | None:
        try:
            self.float32_twin()
        except AdapterError as exc:
            return f"no float32 copy of the weights: {exc}"
        return None

    def _default_cache_unavailable(self) -> str | None:
        """Why the default-cache path is no other path than the canonical one (adapters that
        pass a cache setting on full forwards override this)."""
        return "the canonical call already leaves the model's cache setting at its default"

    def _training_unavailable(self) -> str | None:
        """Why the training forward cannot be compared: no train mode, or two train-mode
        forwards of one batch that differ (randomness outside ``nn.Dropout``)."""
        if not isinstance(self.model, torch.nn.Module):
            return "the model is not a torch.nn.Module, so it has no train mode"
        ids = torch.arange(2 * 8, device=self.capabilities.device).reshape(2, 8) % self.capabilities.vocab_size
        probe = Batch(ids)  # [2, 8], unpadded
        if self.capabilities.family == "encoder_decoder":
            probe = Batch(ids, torch.ones_like(ids), decoder_input_ids=ids, decoder_attention_mask=torch.ones_like(ids))
        training = self.on_path(TRAINING)
        try:
            with forward_memo(False):  # the second forward is the measurement: computed, never served
                first, second = training.logits(probe), training.logits(probe)
        except AdapterError as exc:
            return f"the training forward failed: {exc}"
        if not torch.equal(first, second):
            differ = float((first.double() - second.double()).abs().max())
            return (
                f"two train-mode forwards of one batch differ by {differ:.3g} with every nn.Dropout at p=0: the "
                "model draws randomness elsewhere (attention or router dropout, jitter noise), so its training "
                "forward cannot be compared with itself"
            )
        return None

    # -- for subclasses ---------------------------------------------------------------------

    @abc.abstractmethod
    def _logits(self, batch: Batch) -> Tensor: ...

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        raise NotImplementedError

    def _kept_logits(self, batch: Batch, keep: int | None) -> Tensor:
        """The logits of the last ``keep`` positions (None: all). Here the model computes
        every position's and the last are sliced; an adapter whose model can compute fewer
        overrides this (harness/adapters/hf.py: ``logits_to_keep``) and says so in
        :meth:`describe_kept_logits`."""
        out = self._logits(batch)
        if keep is None or not isinstance(out, Tensor) or out.dim() != 3:
            return out
        return out[:, -keep:]

    def describe_kept_logits(self) -> str:
        """How a request for the last positions' logits is answered, for the report."""
        return ALL_POSITIONS + "this adapter has no way to ask for fewer"

    def _prefill(self, batch: Batch, rollback: bool = False) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def _rollback(self, state: Any, tokens: int) -> Any:
        raise ServingUnsupported(f"the {type(self).__name__} has no rollback of a decoding state")

    def _rearrange(self, state: Any, operation: str, index: Tensor) -> Any:
        raise ServingUnsupported(f"the {type(self).__name__} cannot rearrange the rows of a decoding state")

    def _share(self, state: Any) -> Any:
        return self.fork(state)

    def _reuse(self, state: Any, batch: Batch) -> tuple[Tensor, Any]:
        raise ServingUnsupported(f"the {type(self).__name__} cannot reuse a decoding state for another request")

    def _step(self, state: Any, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def _generate(self, batch: Batch, new_tokens: int, use_cache: bool) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _probe_batch(self, ids: Tensor) -> Batch:
        """One unpadded row of ``ids [1, T]`` on the predicted side (an encoder-decoder's decoder,
        beside a source of another length, so only the decoder's ids match them)."""
        if self.capabilities.family != "encoder_decoder":
            return Batch(ids)
        source = ids[:, :4].flip(-1)
        return Batch(
            source, torch.ones_like(source), decoder_input_ids=ids, decoder_attention_mask=torch.ones_like(ids)
        )

    def _check_eval(self) -> None:
        if isinstance(self.model, torch.nn.Module) and self.model.training:
            raise AdapterError(
                "the model was switched back to train mode after the adapter put it in eval mode; "
                "dropout would make every comparison noise"
            )


def extend(mask: Tensor, next_position: Tensor, attention_mask: Tensor | None, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """For ``n`` appended tokens: the mask so far ``[B, T + n]``, their position ids ``[B, n]``
    and the next position ``[B]``. ``attention_mask`` None means every token is real (every
    decoding step the suites take): positions then follow ``next_position`` without the
    cumulative sum a mask needs."""
    if attention_mask is None:
        appended = torch.ones(mask.shape[0], n, dtype=mask.dtype, device=mask.device)
        positions = next_position[:, None] + torch.arange(n, device=next_position.device)
        return torch.cat([mask, appended], dim=1), positions, next_position + n
    full_mask = torch.cat([mask, attention_mask.to(mask.dtype)], dim=1)
    positions = positions_from_mask(attention_mask, next_position)
    return full_mask, positions, next_position + attention_mask.sum(-1, dtype=torch.long)


BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(Batch))


def concat(batches: list[Batch] | tuple[Batch, ...]) -> Batch:
    """Stack batches of the same length along the batch dimension."""
    fields = {}
    for name in BATCH_FIELDS:
        values = [getattr(b, name) for b in batches]
        if all(v is None for v in values):
            fields[name] = None
        elif any(v is None for v in values):
            raise ValueError(f"cannot concatenate batches where only some have {name}")
        else:
            fields[name] = torch.cat(values, dim=0)
    return Batch(**fields)


def pad_token(adapter: "Adapter") -> int:
    """The id used to fill padded slots: the model's pad id, else 0 (a masked slot's id must not matter)."""
    pad = adapter.capabilities.pad_token_id
    return 0 if pad is None else int(pad)


def positions_from_mask(mask: Tensor, start: Tensor | None = None, offset: int = 0) -> Tensor:
    """Position ids counting only real tokens (``[0, 0, 1, 1] -> [0, 0, 0, 1]``), offset by ``start [B]``."""
    counts = mask.cumsum(-1, dtype=torch.long)  # [B, T], a new tensor: the in-place ops below are safe
    if start is None:
        counts.sub_(1)
    else:
        counts.add_(start[:, None] - 1)
    return counts.clamp_(min=0).add_(offset)
