"""Adapter for a plain ``nn.Module`` or callable that returns logits.

Such a model cannot describe itself, so its author declares :class:`Capabilities`; what
can be read or measured instead of declared is:

- **the mask keyword**: the forward's parameter named ``attention_mask``, ``mask``,
  ``padding_mask``, ``key_padding_mask``, ``src_key_padding_mask`` or ``input_mask`` (or
  the one named in ``mask_keyword``), always passed by name. A forward with none of them
  takes no mask: the suites then run every check that needs none.
- **its polarity**: ``"keep"`` (True = real token, Hugging Face and x-transformers) or
  ``"ignore"`` (True = padding, PyTorch's ``key_padding_mask``). Declared, or measured:
  a mask that says "nothing is padded" must leave the logits of the call without a mask
  unchanged in exactly one polarity. A name with a convention (``attention_mask``,
  ``mask``, ``input_mask``: 1 = real token; ``*padding_mask``: True = padding) is passed
  in that convention, as the callers of such a forward build it; a measurement that
  disagrees (the forward ignores its mask, inverts it, or reads it as neither) is a
  finding, :attr:`ModuleAdapter.mask_finding`, that fails the padding suite. Only a name
  without a convention that cannot be measured asks for the declaration.
- **where the logits are**: a forward that returns only the last position's logits at
  inference (nanoGPT's ``logits[:, [-1]]`` when no ``targets`` are given) is called with
  ``targets`` to get every position, when it takes them.
- **what it returns**: logits over the vocabulary, or any other output kind (a score per
  row, a value per position, an embedding: :mod:`.outputs`), measured at two lengths. What
  cannot be measured is declared: ``maskcheck_output_kind`` (``"row_scores"`` for class
  scores compared as log-probabilities; an undeclared ``[B, C]`` is compared raw) and
  ``maskcheck_output_name`` (the key or attribute of a structured output to read).

The calling convention::

    model(input_ids, <mask>=..., position_ids=..., segment_ids=...) -> logits [B, T, V] (or another kind)

``input_ids [B, T]`` first; the mask by its name, in its polarity, when the batch has one
(a batch without padding is passed no mask, as users call the model, unless the mask
parameter has no default); ``position_ids`` when ``takes_position_ids`` (and for
``packing="position_ids"``), ``segment_ids`` for ``packing="segment_ids"`` (0, 1, 2 ...
per packed sequence, -1 at padding). The output may be a tuple whose first item is the
logits, or an object with ``.logits``. A loss is ``loss_fn(logits, labels)`` with
unshifted labels and -100 ignored.

A KV cache, for ``has_cache=True``, has one of two shapes:

- **an object passed in and out**, two methods on the module::

      prefill(input_ids [B, T], attention_mask [B, T]) -> (logits [B, T, V], cache)
      step(cache, input_ids [B, n], attention_mask [B, T + n]) -> (logits [B, n, V], cache)

  ``step`` gets the mask of every token so far (in the model's polarity), so a model can
  place left-padded rows; a model that takes no mask gets none. The cache is forked
  (a check that branches) with ``copy.deepcopy``. ``examples/cached_decoder.py``.
- **state kept in the module**, addressed by the positions of the tokens fed (gpt-fast)::

      setup_caches(max_batch_size, max_seq_length)       # empties and sizes the cache
      forward(input_ids [B, n], input_pos=positions [n]) -> logits [B, n, V]

  The prefill is ``setup_caches`` then a forward of the prompt at positions ``0..T-1``;
  a step feeds the next positions. The module holds one request's state at a time, so a
  fork is the tokens fed so far: a step on a state that is not the module's live one
  runs that state's tokens again first. ``examples/module_state_decoder.py`` (the model:
  ``maskcheck.reference_models.scratch``).

Serving operations (the ``serving`` suite) are optional methods; a model without one gets
``not_applicable`` for its check, with the method it lacks:

- object cache: ``rollback(cache, n) -> cache`` (drop the last ``n`` tokens),
  ``reorder(cache, index [B']) -> cache`` (row ``i`` continues row ``index[i]``: beam
  search, dropped rows, repeated rows), ``reset(cache) -> cache`` (empty it for the next
  request, which ``prefill(input_ids, attention_mask, cache=cache)`` then fills), and
  ``fork(cache) -> cache`` (a copy; ``copy.deepcopy`` without it).
  ``examples/cached_decoder.py``.
- module state: a rollback is the next forward's ``input_pos`` going back (as gpt-fast's
  speculative decoding does: the stale slots must be masked); ``reorder_caches(index)``
  rearranges rows; a reused cache is the next request's prefill without ``setup_caches``
  (after ``reset_caches()`` when the module has it). It holds one request, so it has no fork.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal

import torch
from torch import Tensor

from ...reference_models.masks import positions_from_segments
from .attention_matrix import SHAPES, buildable, row_matrix
from .base import Adapter, AdapterError, Batch, Capabilities, ForwardKeywords, ServingUnsupported, call_model
from .errors import ModelRaised
from .outputs import measure_output, read_output
from .prefix import PREFIX_FORMS, as_model_input

MaskConvention = Literal["keep", "ignore"]
#: the forward parameters read as a padding mask, in the order they are looked for
MASK_KEYWORDS = ("attention_mask", "mask", "padding_mask", "key_padding_mask", "src_key_padding_mask", "input_mask")
#: the polarity a mask parameter's name promises its callers (tokenizers and collators build 1 = real token)
NAMED_CONVENTIONS: dict[str, MaskConvention] = {"attention_mask": "keep", "mask": "keep", "input_mask": "keep"}
MEANING = {"keep": "True = real token", "ignore": "True = padding"}
MATRIX_MEANING = {"keep": "True = may attend", "ignore": "True = masked out"}
LAYOUT_NAMES = {"padding": "a padding mask [B, T]", **{k: f"an attention matrix {v}" for k, v in SHAPES.items()}}
OBJECT_CACHE = ("prefill", "step")
MODULE_CACHE_SETUP = "setup_caches"
#: forward parameters that take a cache object: a forward naming one has a cache to audit
CACHE_KEYWORDS = ("past_kv_cache", "past_key_values", "kv_cache", "cache")
MODULE_CACHE_POSITIONS = "input_pos"
MaskLayout = Literal["padding", "matrix", "matrix_heads"]
#: the shapes a conventional mask keyword is tried in, in order: a padding mask, then an attention matrix
MASK_LAYOUTS: tuple[MaskLayout, ...] = ("padding", "matrix", "matrix_heads")


class DeclarationError(ValueError):
    """A declaration the module contradicts, or one maskcheck needs and cannot measure; one line."""


@dataclass
class ModuleState:
    cache: Any  # the module's own cache object
    mask: Tensor  # [B, T_so_far], 1 = real token


@dataclass
class ModuleStateCache:
    """Decoding state kept inside the module: what it was fed, to feed it again on a fork."""

    tokens: Tensor  # [B, T_so_far]
    real: Tensor | None = None  # [B, T_so_far], 1 = real token; None: every token is real

    def __getitem__(self, index: Any) -> "ModuleStateCache":
        """The state of rows and tokens ``index`` selects (``[:, :-n]``, ``[rows]``)."""
        return ModuleStateCache(self.tokens[index], None if self.real is None else self.real[index])


def forward_parameters(model: Any) -> dict[str, inspect.Parameter]:
    forward = type(model).forward if isinstance(model, torch.nn.Module) else model
    try:
        return dict(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return {}


def named_convention(keyword: str) -> MaskConvention | None:
    """The polarity ``keyword``'s name promises (:data:`NAMED_CONVENTIONS`; any ``*padding_mask``
    is True = padding), None for a name without one."""
    if keyword.endswith("padding_mask"):
        return "ignore"
    return NAMED_CONVENTIONS.get(keyword)


def find_mask_keyword(model: Any, named: str | None) -> str | None:
    """The forward's mask parameter: ``named`` (which it must take), else the first of
    :data:`MASK_KEYWORDS` it names; None when it names none."""
    parameters = forward_parameters(model)
    if named is not None:
        if named not in parameters and not ForwardKeywords.of(model).takes_any:
            raise DeclarationError(f"mask_keyword={named!r}, but the forward takes no {named!r} parameter")
        return named
    return next((name for name in MASK_KEYWORDS if name in parameters), None)


class ModuleAdapter(Adapter):
    #: the forward keyword that takes position ids ``[B, T]``
    position_keyword = "position_ids"

    def __init__(
        self,
        model: Callable[..., Any],
        capabilities: Capabilities,
        *,
        mask_convention: MaskConvention | None = None,
        mask_keyword: str | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        spec: str = "<module>",
        output_kind: str | None = None,
        output_name: str | None = None,
        prefix_keyword: str | None = None,
        prefix_form: str = "mask",
    ) -> None:
        if mask_convention not in (None, "keep", "ignore"):
            raise DeclarationError(
                f"mask_convention must be 'keep' (True = real token) or 'ignore' (True = padding), got {mask_convention!r}"
            )
        if loss_fn is None and capabilities.has_loss:
            raise DeclarationError("has_loss=True needs loss_fn(logits, labels)")
        keywords = ForwardKeywords.of(model)
        self._check_declared_positions(capabilities, keywords)
        #: the forward (and prefill) keyword that takes a prefix LM's prefix, in :attr:`prefix_form`
        self.prefix_keyword, self.prefix_form = self._declared_prefix(
            capabilities, keywords, prefix_keyword, prefix_form
        )
        self.mask_keyword = find_mask_keyword(model, mask_keyword) if capabilities.takes_attention_mask else None
        parameters = forward_parameters(model)
        mask_parameter = parameters.get(self.mask_keyword or "")
        #: whether the forward can be called without a mask (its mask parameter has a default)
        self.mask_optional = mask_parameter is None or mask_parameter.default is not inspect.Parameter.empty
        #: "targets" when the forward returns every position's logits only when given targets
        self.targets_keyword = "targets" if "targets" in parameters else None
        self.cache_shape = self._cache_shape(model, capabilities, keywords)
        unreached = next((name for name in CACHE_KEYWORDS if name in parameters), None)
        if not capabilities.has_cache and unreached and capabilities.no_cache_reason is None:
            capabilities = replace(
                capabilities,
                no_cache_reason=f"the forward takes a cache ({unreached}=) that has_cache does not declare: give the module "
                'prefill() and step() and declare has_cache (docs/modules.md, "A cache passed by keyword")',
            )
        if self.mask_keyword is None and capabilities.takes_attention_mask:
            capabilities = replace(capabilities, takes_attention_mask=False)
        if self.cache_shape == "module" and capabilities.takes_attention_mask:
            capabilities = replace(capabilities, unpadded_cache_reason=self.unpadded_cache_reason)
        measured_dtype = _parameter_dtype(model)
        if measured_dtype is not None and measured_dtype != capabilities.dtype:
            # what the weights compute in, not a default: thresholds follow the dtype
            capabilities = replace(capabilities, dtype=measured_dtype)
        super().__init__(model, capabilities)
        self.loss_fn = loss_fn
        self.spec = spec
        self._live: ModuleStateCache | None = None  # the state a module-state cache holds now
        self.mask_convention: MaskConvention | None = mask_convention
        #: the mask's shape: a padding mask [B, T], or an attention matrix (attention_matrix.py), measured
        self.mask_layout: MaskLayout = "padding"
        #: how the polarity was found, for the report: declared, measured, or by the name's convention
        self.mask_source = "declared"
        self._polarity_error: str | None = None  # why the measurement could not run (the model raised)
        #: the key or attribute of a structured output that is read (None: found by name, outputs.py)
        self.output_name = output_name
        self._measure_output(output_kind)
        if self.mask_keyword is not None and mask_convention is None:
            convention = named_convention(self.mask_keyword)
            if convention is not None:
                self.mask_convention = convention
                self.mask_finding = self._measure_against(convention)
                self.mask_source = "its name's convention, " + (
                    "measured" if self.mask_finding is None else "which the forward does not keep: see padding"
                )
            else:
                self.mask_source = "measured"
                try:
                    self.mask_convention = self._measure_polarity()
                except AdapterError as exc:  # a model that raises is a verdict of the suites, not a crash here
                    self._polarity_error = f"the mask's polarity could not be measured: {exc}"
        self._check_declared_packing(keywords)

    # -- what the module is --------------------------------------------------------------

    def _measure_output(self, declared: str | None) -> None:
        """What the forward returns (outputs.py), measured on calls without padding: without a
        mask where it has a default, else with a mask of ones in its convention (declared or
        its name's). A forward that raises on these calls keeps the vocabulary's kind: the
        suites report what it raises, and a polarity still unknown is asked for later."""
        convention = None
        if self.mask_keyword is not None and not self.mask_optional:
            convention = self.mask_convention or named_convention(self.mask_keyword)
            if convention is None:
                return

        def call(ids: Tensor) -> Any:
            real = torch.ones_like(ids, dtype=torch.bool)  # [B, T]: nothing padded
            keywords = {} if convention is None else {self.mask_keyword: real if convention == "keep" else ~real}
            return self._every_position(ids, keywords)

        caps = self.capabilities
        try:
            kind = measure_output(call, caps.vocab_size, caps.device, declared=declared)
        except ModelRaised:
            return
        except AdapterError as exc:
            raise DeclarationError(str(exc)) from None
        self.capabilities = replace(caps, output=kind)

    @staticmethod
    def _declared_prefix(
        capabilities: Capabilities, keywords: ForwardKeywords, keyword: str | None, form: str
    ) -> tuple[str | None, str]:
        """The prefix keyword and form a prefix LM declares (harness/adapters/prefix.py), checked
        against its forward; (None, form) for any other model."""
        if capabilities.attention != "prefix_lm":
            return None, form
        if keyword is None:
            raise DeclarationError(
                "attention='prefix_lm' needs maskcheck_prefix_keyword, the forward parameter that takes the prefix "
                f"(and maskcheck_prefix_form, one of {', '.join(PREFIX_FORMS)})"
            )
        if form not in PREFIX_FORMS:
            raise DeclarationError(f"maskcheck_prefix_form must be one of {', '.join(PREFIX_FORMS)}, got {form!r}")
        if not keywords.accepts(keyword):
            raise DeclarationError(
                f"maskcheck_prefix_keyword={keyword!r}, but the forward takes no {keyword!r} parameter"
            )
        if form == "lengths" and capabilities.packing is not None:
            raise DeclarationError(
                "a prefix given as lengths marks one prefix per row, so packed rows cannot carry each sequence's: "
                "declare maskcheck_prefix_form = 'mask' or 'token_type_ids', or no packing"
            )
        return keyword, form

    @classmethod
    def _check_declared_positions(cls, capabilities: Capabilities, keywords: ForwardKeywords) -> None:
        needed = {
            "takes_position_ids": capabilities.takes_position_ids,
            "packing=position_ids": capabilities.packing == "position_ids",
        }
        for what, declared in needed.items():
            if declared and not keywords.accepts(cls.position_keyword):
                raise DeclarationError(
                    f"the capabilities declare {what}, but the model's forward takes no {cls.position_keyword!r} "
                    "keyword to pass it in"
                )

    def _check_declared_packing(self, keywords: ForwardKeywords) -> None:
        """packing=segment_ids goes in as ``segment_ids=``, or as the attention matrix of a mask
        keyword that takes one (block-diagonal: each query in its own sequence)."""
        if self.capabilities.packing == "segment_ids" and self.mask_layout == "padding":
            if not keywords.accepts("segment_ids"):
                raise DeclarationError(
                    "the capabilities declare packing=segment_ids, but the model's forward takes no 'segment_ids' "
                    "keyword, nor a mask that is an attention matrix, to pass it in"
                )

    @staticmethod
    def _cache_shape(model: Any, capabilities: Capabilities, keywords: ForwardKeywords) -> str | None:
        """ "object" (prefill/step), "module" (setup_caches + input_pos) or None (no cache)."""
        if not capabilities.has_cache:
            return None
        if all(callable(getattr(model, name, None)) for name in OBJECT_CACHE):
            return "object"
        if callable(getattr(model, MODULE_CACHE_SETUP, None)) and keywords.accepts(MODULE_CACHE_POSITIONS):
            return "module"
        raise DeclarationError(
            "has_cache=True needs a cache in one of two shapes: the methods prefill(input_ids, mask) and "
            "step(cache, input_ids, mask), or setup_caches(max_batch_size, max_seq_length) with a forward that "
            "takes input_pos (see maskcheck.harness.adapters.module)"
        )

    #: why cached calls of the module-state protocol are unpadded (Capabilities.unpadded_cache_reason)
    unpadded_cache_reason = (
        "the module-state cache protocol (setup_caches, then forward(input_ids, input_pos=...)) passes no mask"
    )

    def _probe_ids(self, rows: int = 1) -> Tensor:
        """``[rows, 6]`` ids; an attention matrix is measured on 2 rows, so one that broadcasts
        over the heads instead of the rows cannot pass for a [B, T, T] one."""
        vocab = self.capabilities.vocab_size
        generator = torch.Generator().manual_seed(0)
        return torch.randint(1, vocab, (rows, 6), generator=generator).to(self.capabilities.device)

    def _measure_polarity(self) -> MaskConvention:
        """The polarity in which "nothing is padded" leaves the call without a mask unchanged."""
        where = f"the forward's {self.mask_keyword!r}"
        if not self.mask_optional:
            raise DeclarationError(
                f"{where} has no default, so its polarity cannot be measured against a call without it: declare "
                "maskcheck_mask_convention = 'keep' (True = real token) or 'ignore' (True = padding)"
            )
        ids = self._probe_ids()
        with torch.inference_mode():
            bare = self._call(ids, {})
            keep = self._call(ids, {self.mask_keyword: torch.ones_like(ids, dtype=torch.bool)})
            ignore = self._call(ids, {self.mask_keyword: torch.zeros_like(ids, dtype=torch.bool)})
        same = {name: _close(bare, out) for name, out in (("keep", keep), ("ignore", ignore))}
        if same["keep"] != same["ignore"]:
            return "keep" if same["keep"] else "ignore"
        found = "both" if same["keep"] else "neither"
        raise DeclarationError(
            f"cannot tell the polarity of {where}: a mask that pads nothing leaves the logits unchanged in {found} of "
            "True = real token and True = padding; declare maskcheck_mask_convention = 'keep' or 'ignore'"
        )

    def _measure_against(self, convention: MaskConvention) -> str | None:
        """What the forward does with a mask its name gives a convention for, measured: None
        when it reads it in that convention, else the finding, one line. The mask is tried as
        a padding mask ``[B, T]``, then as an attention matrix (``[B, T, T]``, then
        ``[B, 1, T, T]``; attention_matrix.py) where the first raises; the first shape the
        forward takes is its :attr:`mask_layout`."""
        assert self.mask_keyword is not None
        raised, findings = [], {}
        for layout in MASK_LAYOUTS:
            if layout != "padding" and not buildable(self.capabilities.attention, self.capabilities.window):
                break
            self.mask_layout = layout
            try:
                finding = self._measure_layout(convention)
            except AdapterError as exc:
                raised.append(f"as {LAYOUT_NAMES[layout]}: {exc}")
                continue
            if finding is None:
                return None
            findings[layout] = finding
        if findings:  # the first shape the forward takes without raising, and what it does with it
            self.mask_layout = next(iter(findings))
            return findings[self.mask_layout]
        self.mask_layout = "padding"
        return f"the forward's {self.mask_keyword}= raised for every mask shape tried: " + "; ".join(raised)

    def _measure_layout(self, convention: MaskConvention) -> str | None:
        """:meth:`_measure_against` in one :attr:`mask_layout`; an AdapterError when the forward
        raises on it. Two measurements: a mask that pads nothing, in each polarity, against the
        call without a mask (where the mask has a default); and a mask that hides the first
        half of each row, whose last position must then change (a causal or bidirectional
        model alike reads those tokens)."""
        assert self.mask_keyword is not None
        meaning, opposite = self._meanings[convention], self._meanings[_opposite(convention)]
        where = (
            f"the forward's {self.mask_keyword}= ({LAYOUT_NAMES[self.mask_layout]}; its name's convention: {meaning})"
        )
        ids = self._probe_ids(rows=1 if self.mask_layout == "padding" else 2)
        half = torch.ones_like(ids, dtype=torch.bool)
        half[0, : ids.shape[1] // 2] = False  # [B, T]: the first half of the first row hidden
        nothing_padded = self._mask_input(torch.ones_like(ids))  # in the convention
        with torch.inference_mode():
            unmasked = self._call(ids, {self.mask_keyword: nothing_padded})
            hidden = self._call(ids, {self.mask_keyword: self._mask_input(half)})
            same = None
            if self.mask_optional:  # each polarity's "nothing padded" against the call without a mask
                bare, inverted = self._call(ids, {}), self._call(ids, {self.mask_keyword: ~nothing_padded})
                same = {convention: _close(bare, unmasked), _opposite(convention): _close(bare, inverted)}
        if ids.shape[0] > 1 and not _close(unmasked[1:], hidden[1:]):
            # [B, T, T] against scores [B, H, T, T] broadcasts without an error when B = H: rows read heads' masks
            raise AdapterError("the other rows' logits move with the first row's mask: it is read across rows")
        if _close(unmasked[:1, -1:], hidden[:1, -1:]):
            return (
                f"{where}: a mask hiding the first half of the row changes nothing at its last position: the "
                "forward ignores its mask, so padded slots are read as tokens"
            )
        # "Everything padded" equal to no mask as well is no misreading: a row whose every key is
        # masked is degenerate (a finite mask value gives it uniform attention, which random
        # weights' near-uniform attention matches to 1e-4), and the half-hidden row above showed
        # the mask is read; the padding suite's drawn cases judge it exactly.
        if same is None or same[convention]:
            return None
        if same[_opposite(convention)]:
            return (
                f"{where}: a mask that pads nothing leaves the call without a mask unchanged only as {opposite}: "
                "the forward reads its mask inverted (as PyTorch's key_padding_mask), so a mask built by a tokenizer "
                f"or collator hides the real tokens; if that is meant, declare maskcheck_mask_convention = "
                f"{_opposite(convention)!r}"
            )
        return (
            f"{where}: a mask that pads nothing leaves the call without a mask unchanged in neither of "
            f"{meaning} and {opposite}: the forward reads it as no mask of either polarity"
        )

    @property
    def _meanings(self) -> dict[str, str]:
        """What each polarity means in the mask's :attr:`mask_layout`."""
        return MEANING if self.mask_layout == "padding" else MATRIX_MEANING

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        if self.mask_keyword is None:
            described["mask"] = f"none: the forward names none of {', '.join(MASK_KEYWORDS)} (name one: mask_keyword)"
        else:
            meaning = self._meanings.get(self.mask_convention or "", "polarity unknown")
            shape = "" if self.mask_layout == "padding" else f"{LAYOUT_NAMES[self.mask_layout]}, "
            described["mask"] = f"{self.mask_keyword}= ({shape}{meaning}, {self.mask_source})"
        described["cache"] = self.cache_shape or "none"
        described["output"] = self.capabilities.output_kind.describe()
        return described

    # -- calls ---------------------------------------------------------------------------

    def _mask(self, mask: Tensor) -> Tensor:
        """``mask`` (1 = real token) in the model's polarity."""
        if self.mask_convention is None:
            raise AdapterError(self._polarity_error or "the mask's polarity is unknown")
        return mask.bool() if self.mask_convention == "keep" else ~mask.bool()

    def _mask_input(self, real: Tensor, segments: Tensor | None = None) -> Tensor:
        """The mask keyword's value for a batch whose real tokens are ``real [B, T]`` (1 = real):
        a padding mask, or the attention matrix of the declared pattern restricted to real keys
        and, given ``segments``, to each query's own sequence; in the model's polarity."""
        if self.mask_layout == "padding":
            return self._mask(real)
        caps = self.capabilities
        assert caps.attention is not None
        matrix = row_matrix(
            real, pattern=caps.attention, window=caps.window, segments=segments, layout=self.mask_layout
        )
        return self._mask(matrix)

    def _call(self, ids: Tensor, keywords: dict[str, Any]) -> Tensor:
        """The model's output for ``ids [B, T]`` as ``[B, T, C]`` (outputs.py)."""
        value, _ = self._every_position(ids, keywords)
        return self.capabilities.output_kind.in_positions(value, ids.shape[1])

    def _every_position(self, ids: Tensor, keywords: dict[str, Any]) -> tuple[Tensor, str]:
        """The output the forward returns, read by name (outputs.py), of every position; and
        where it was read."""
        value, source = read_output(call_model(self.model, ids, **keywords), self.output_name)
        if (
            self.targets_keyword is not None and value.dim() == 3 and value.shape[1] == 1 < ids.shape[1]
        ):  # only the last position at inference: with targets, every position (their loss is not read)
            with_targets = call_model(self.model, ids, **keywords, **{self.targets_keyword: ids})
            value, source = read_output(with_targets, self.output_name)
        return value, source

    def _keywords(self, batch: Batch) -> dict[str, Any]:
        keywords: dict[str, Any] = {}
        caps = self.capabilities
        packed = batch.segment_ids if caps.packing == "segment_ids" else None
        in_matrix = packed is not None and self.mask_layout != "padding"  # the segments go in the mask
        if self.mask_keyword is not None:
            mask = batch.attention_mask
            if mask is None and in_matrix:
                mask = (packed >= 0).long()
            if mask is None and not self.mask_optional:
                mask = torch.ones_like(batch.input_ids)
            if mask is not None:
                keywords[self.mask_keyword] = self._mask_input(mask, packed if in_matrix else None)
        positions = batch.position_ids
        if positions is None and in_matrix and caps.takes_position_ids:  # as the model restarts them for segment_ids
            positions = positions_from_segments(packed) + caps.position_offset
        if positions is not None and (caps.takes_position_ids or caps.packing == "position_ids"):
            keywords[self.position_keyword] = positions
        if packed is not None and not in_matrix:
            keywords["segment_ids"] = packed
        keywords.update(self._prefix_keywords(batch))
        return keywords

    def _prefix_keywords(self, batch: Batch) -> dict[str, Tensor]:
        """A prefix LM's prefix, as its forward and prefill take it (none for other models)."""
        if self.prefix_keyword is None:
            return {}
        return {self.prefix_keyword: as_model_input(batch.prefix, self.prefix_form)}

    def _logits(self, batch: Batch) -> Tensor:
        return self._call(batch.input_ids, self._keywords(batch))

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        assert self.loss_fn is not None
        logits = self._logits(batch)
        try:
            return call_model(self.loss_fn, logits, labels)
        except AdapterError as exc:
            if "out of bounds" not in str(exc):
                raise
            raise AdapterError(
                f"{exc}: maskcheck_loss gets unshifted labels with -100 at ignored targets; for a loss with another "
                "ignore index, wrap it: lambda logits, labels: loss(logits, labels.masked_fill(labels == -100, -1))"
            ) from exc

    def loss_logit_gradients(self, batch: Batch, labels: Tensor) -> Tensor:
        """As :meth:`Adapter.loss_logit_gradients`; the loss is ``loss_fn(logits, labels)``, so
        its gradient is taken at the logits the forward returns."""
        if self.loss_fn is None:
            raise NotImplementedError(f"{self.spec} declares no loss")
        self._check_eval()
        with torch.inference_mode():
            logits = self._logits(batch)
        with torch.inference_mode(False), torch.enable_grad():
            leaf = logits.clone().requires_grad_(True)  # [B, T, V], a tensor autograd may record
            loss = call_model(self.loss_fn, leaf, labels.clone())
            if not isinstance(loss, Tensor) or not loss.requires_grad:
                raise AdapterError("the loss does not depend on the logits it is given")
            (gradient,) = torch.autograd.grad(loss.reshape(()), leaf, allow_unused=True)
        if gradient is None:
            return torch.zeros(batch.predicted_ids.shape, dtype=torch.float64)
        return gradient.detach().double().norm(dim=-1).cpu()  # [B, T]

    # -- caches --------------------------------------------------------------------------

    def _mask_arguments(self, mask: Tensor) -> tuple[Tensor, ...]:
        return (self._mask(mask),) if self.capabilities.takes_attention_mask else ()

    def _prefill(self, batch: Batch, rollback: bool = False, cache: Any = None) -> tuple[Tensor, Any]:
        if self.cache_shape == "module":
            return self._module_prefill(batch.input_ids)
        mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
        prefill = self.model.prefill  # type: ignore[attr-defined]
        reused = {} if cache is None else {"cache": cache}
        logits, cache = call_model(
            prefill, batch.input_ids, *self._mask_arguments(mask), **reused, **self._prefix_keywords(batch)
        )
        return _logits_of(logits), ModuleState(cache, mask)

    def _step(self, state: Any, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Any]:
        if isinstance(state, ModuleStateCache):
            if attention_mask is not None and not bool(attention_mask.all()):
                raise AdapterError("a module-state cache takes no padded steps: its model takes no mask")
            return self._module_step(state, tokens)
        appended = attention_mask if attention_mask is not None else torch.ones_like(tokens)
        mask = torch.cat([state.mask, appended.to(state.mask.dtype)], dim=1)  # [B, T + n]
        step = self.model.step  # type: ignore[attr-defined]
        logits, cache = call_model(step, state.cache, tokens, *self._mask_arguments(mask))
        return _logits_of(logits), ModuleState(cache, mask)

    def fork(self, state: Any) -> Any:
        if isinstance(state, ModuleStateCache):
            return state[:]  # the tokens fed: fed again when stepped (see _module_step)
        own = getattr(self.model, "fork", None)
        return ModuleState(call_model(own, state.cache) if callable(own) else copy.deepcopy(state.cache), state.mask)

    def _with_model(self, model: Any) -> "ModuleAdapter":
        other = super()._with_model(model)
        assert isinstance(other, ModuleAdapter)
        other._live = None  # the copy's buffers hold no request yet
        return other

    # -- serving (optional protocol methods; the module docstring) ---------------------------

    def _serving_method(self, name: str, what: str) -> Callable[..., Any]:
        method = getattr(self.model, name, None)
        if not callable(method):
            raise ServingUnsupported(f"the module has no {name}() method, so {what}")
        return method

    def _share(self, state: Any) -> Any:
        if isinstance(state, ModuleStateCache):
            raise ServingUnsupported(
                "the module holds one request's state in its own buffers, so there is no copy of it to share "
                "(maskcheck's fork feeds the tokens again: a fresh decode)"
            )
        return self.fork(state)

    def _rollback(self, state: Any, tokens: int) -> Any:
        if isinstance(state, ModuleStateCache):
            # The next forward's input_pos goes back: what the module holds past it is stale and must be masked.
            kept = state[:, :-tokens]
            if state is self._live:
                self._live = kept
            return kept
        rollback = self._serving_method("rollback", "its cache cannot be rolled back (speculative decoding)")
        return ModuleState(call_model(rollback, state.cache, tokens), state.mask[:, :-tokens])

    def _rearrange(self, state: Any, operation: str, index: Tensor) -> Any:
        if isinstance(state, ModuleStateCache):
            reorder = self._serving_method("reorder_caches", "the rows of its cache cannot be rearranged")
            if state is not self._live:
                self._module_prefill(state.tokens)
            call_model(reorder, index)
            self._live = state[index]
            return self._live
        reorder = self._serving_method("reorder", "the rows of its cache cannot be rearranged")
        return ModuleState(call_model(reorder, state.cache, index), state.mask[index])

    def _reuse(self, state: Any, batch: Batch) -> tuple[Tensor, Any]:
        if isinstance(state, ModuleStateCache):
            if state is not self._live:
                self._module_prefill(state.tokens)
            reset = getattr(self.model, "reset_caches", None)
            if callable(reset):
                call_model(reset)
            return self._module_prefill(batch.input_ids, setup=False)
        reset = self._serving_method("reset", "its cache cannot be emptied for another request")
        if "cache" not in forward_parameters(self.model.prefill):  # type: ignore[attr-defined]
            raise ServingUnsupported(
                "the module's prefill() takes no cache= to fill, so every request gets a new cache object and none is reused"
            )
        return self._prefill(batch, cache=call_model(reset, state.cache))

    def _module_prefill(
        self, ids: Tensor, setup: bool = True, real: Tensor | None = None
    ) -> tuple[Tensor, ModuleStateCache]:
        """The prompt at positions 0..T-1; ``setup=False`` reuses the buffers the module holds.
        ``real`` is not read: this protocol passes no mask, so its rows are unpadded."""
        length = self.capabilities.max_length or 4 * ids.shape[1] + 64
        if setup:
            call_model(getattr(self.model, MODULE_CACHE_SETUP), ids.shape[0], length)
        positions = torch.arange(ids.shape[1], device=ids.device)  # [T]
        logits = self._call(ids, {MODULE_CACHE_POSITIONS: positions})
        self._live = ModuleStateCache(ids)
        return logits, self._live

    def _module_step(self, state: ModuleStateCache, tokens: Tensor) -> tuple[Tensor, ModuleStateCache]:
        if state is not self._live:  # another request's state is in the module: this one's tokens again first
            self._module_prefill(state.tokens)
        start = state.tokens.shape[1]
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)  # [n]
        logits = self._call(tokens, {MODULE_CACHE_POSITIONS: positions})
        self._live = ModuleStateCache(torch.cat([state.tokens, tokens], dim=1))  # [B, T + n]
        return logits, self._live


def _opposite(convention: MaskConvention) -> MaskConvention:
    return "ignore" if convention == "keep" else "keep"


def _parameter_dtype(model: Any) -> str | None:
    """The dtype of a module's first floating-point parameter ("bfloat16" ...), None without one."""
    if not isinstance(model, torch.nn.Module):
        return None
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    return None if parameter is None else str(parameter.dtype).removeprefix("torch.")


def _close(a: Any, b: Any) -> bool:
    """Whether two outputs are the same logits up to the rounding of another kernel path."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.shape != b.shape:
        return False
    if not bool(torch.isfinite(b).all()):
        return False
    return bool(torch.allclose(a.float(), b.float(), atol=1e-4, rtol=1e-4))


def _logits_of(out: Any) -> Any:
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    return out
