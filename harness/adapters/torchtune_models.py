"""torchtune's ``TransformerDecoder``, audited as it is built, with its mask and its KV cache.

A torchtune decoder (``torchtune.models.llama3.llama3(...)``, the LoRA builders, any
``torchtune.modules.TransformerDecoder``) needs no declaration. What maskcheck reads off it:
its vocabulary (``tok_embeddings``), ``max_seq_len`` and layers; the rest is measured, as
for any module (module.py): its ``mask=`` is found to be an attention matrix ``[B, T, T]``
(True = may attend; attention_matrix.py), which replaces its causal default, so every
matrix carries the causal pattern. ``input_pos [B, T]`` is its position ids; packing is
torchtune's own (``PackedDataset``): a block-diagonal causal matrix and positions that
restart per sequence. A declared ``maskcheck_capabilities`` is used instead of what is
read (``maskcheck_loss`` adds its loss).

Its KV cache, driven as torchtune's ``generate()`` drives it::

    setup_caches(batch_size, dtype, decoder_max_seq_len=S)
    forward(tokens [B, n], mask=[B, n, S], input_pos=[B, n]) -> logits [B, n, V]

- Each ``KVCache`` keeps its own write position: a forward writes its tokens at the next
  slots whatever ``input_pos`` says. So slots and positions are two things: the mask's
  columns are cache slots (a left-padded row's padding occupies slots too, masked out), and
  ``input_pos`` follows each row's real tokens.
- ``setup_caches`` a second time is skipped with a warning, keeping the old cache (sized for
  the old batch). A fresh request deletes the caches (``delete_kv_caches``) and sets up new
  ones, sized for the batch and ``max_seq_len``; a reused one is ``reset_caches()``.
- While caches exist, every forward must have ``mask`` and ``input_pos`` and writes to the
  cache; with caches disabled (``disable_kv_cache``) a forward without a mask is not causal
  (its attention turns ``is_causal`` off whenever a cache is set up). So a plain forward
  deletes the caches first, and a cached state continued after one feeds its tokens again.
- Serving: ``reuse`` runs (``reset_caches``); there is no rollback (no method moves the write
  position back) and no row reorder: those checks are n/a with that reason.
- The model is left as it was found: caches maskcheck set up are deleted after each suite
  (:meth:`TorchtuneAdapter.release_state`); caches it came with are set up again, empty.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

import torch
from torch import Tensor

from .attention_matrix import allowed_keys
from .base import Batch, Capabilities, ServingUnsupported, call_model, positions_from_mask
from .module import ModuleAdapter, ModuleStateCache

CACHE_METHODS = ("setup_caches", "caches_are_setup", "reset_caches")


def is_torchtune_decoder(model: Any) -> bool:
    """Whether ``model`` is a torchtune ``TransformerDecoder`` (torchtune is imported only
    where the model's own code already imported it)."""
    if "torchtune" not in sys.modules:
        return False
    decoder = getattr(importlib.import_module("torchtune.modules"), "TransformerDecoder", None)
    return decoder is not None and isinstance(model, decoder)


def torchtune_capabilities(model: Any, has_loss: bool) -> Capabilities:
    """What a torchtune decoder is, read off the module."""
    parameter = next(model.parameters())
    return Capabilities(
        family="decoder",
        vocab_size=model.tok_embeddings.num_embeddings,
        takes_position_ids=True,  # input_pos
        packing="segment_ids",  # as a block-diagonal mask matrix with restarted input_pos
        has_cache=True,
        has_loss=has_loss,
        max_length=model.max_seq_len,
        n_layers=len(model.layers),
        device=str(parameter.device),
    )


def _common_utils() -> Any:
    return importlib.import_module("torchtune.modules.common_utils")


class TorchtuneAdapter(ModuleAdapter):
    position_keyword = "input_pos"
    unpadded_cache_reason = None  # its cached forward takes a mask over the cache's slots

    def __init__(
        self,
        model: Any,
        capabilities: Capabilities | None = None,
        *,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        spec: str = "<torchtune>",
    ) -> None:
        # Caches the model came with: a forward without a mask would raise. Set up again, empty, when released.
        self._found_caches = self._cache_shape_of(model) if model.caches_are_setup() else None
        if self._found_caches is not None:
            _common_utils().delete_kv_caches(model)
        self._cache_batch: int | None = None  # the batch size of the caches maskcheck set up
        declared = capabilities or torchtune_capabilities(model, has_loss=loss_fn is not None)
        super().__init__(model, declared, mask_keyword="mask", loss_fn=loss_fn, spec=spec)

    @staticmethod
    def _cache_shape_of(model: Any) -> tuple[int, torch.dtype, int]:
        """(batch size, dtype, slots) of the caches a model holds."""
        cache = next(m.kv_cache for m in model.modules() if getattr(m, "kv_cache", None) is not None)
        batch, _, slots, _ = cache.k_cache.shape  # [B, H_kv, S, D]
        return batch, cache.k_cache.dtype, slots

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["cache"] = "torchtune KVCache (setup_caches; mask over its slots, input_pos)"
        return described

    # -- plain forwards run without caches ----------------------------------------------------

    def _logits(self, batch: Batch) -> Tensor:
        self._delete_caches()
        return super()._logits(batch)

    def _delete_caches(self) -> None:
        if self.model.caches_are_setup():
            _common_utils().delete_kv_caches(self.model)
            self._live = None  # the next step of any state feeds its tokens again
            self._cache_batch = None

    def release_state(self) -> None:
        self._delete_caches()
        if self._found_caches is not None:
            batch, dtype, slots = self._found_caches
            with next(self.model.parameters()).device:
                self.model.setup_caches(batch, dtype, decoder_max_seq_len=slots)

    # -- the cache ----------------------------------------------------------------------------

    @property
    def _slots(self) -> int:
        return self.model.max_seq_len

    def _prefill(self, batch: Batch, rollback: bool = False, cache: Any = None) -> tuple[Tensor, Any]:
        return self._module_prefill(batch.input_ids, real=batch.attention_mask)

    def _module_prefill(
        self, ids: Tensor, setup: bool = True, real: Tensor | None = None
    ) -> tuple[Tensor, ModuleStateCache]:
        """The prompt from slot 0: in new caches, or (``setup=False``) in the ones the model
        holds, emptied by the caller."""
        if setup or self._cache_batch != ids.shape[0]:
            self._delete_caches()
            parameter = next(self.model.parameters())
            with parameter.device:  # torchtune builds cache buffers on the default device (local_kv_cache does this)
                self.model.setup_caches(ids.shape[0], parameter.dtype, decoder_max_seq_len=self._slots)
            self._cache_batch = ids.shape[0]
        state = ModuleStateCache(ids[:, :0], None if real is None else real[:, :0])  # nothing fed yet
        return self._feed(state, ids, real)

    def _step(self, state: Any, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Any]:
        if state is not self._live:  # another request's state is in the caches: this one's tokens again first
            _, state = self._module_prefill(state.tokens, real=state.real)
        return self._feed(state, tokens, attention_mask)

    def _feed(self, state: ModuleStateCache, tokens: Tensor, real: Tensor | None) -> tuple[Tensor, ModuleStateCache]:
        """``tokens [B, n]`` at the slots after ``state``'s: the mask ``[B, n, S]`` lets each
        read the real tokens of the slots so far (and itself); ``input_pos [B, n]`` counts
        each row's real tokens."""
        start, n = state.tokens.shape[1], tokens.shape[1]
        fed_real = torch.ones_like(state.tokens) if state.real is None else state.real
        new_real = torch.ones_like(tokens) if real is None else real
        so_far = torch.cat([fed_real, new_real.to(fed_real.dtype)], dim=1)  # [B, start + n]
        key_real = torch.zeros(tokens.shape[0], self._slots, dtype=so_far.dtype, device=tokens.device)  # [B, S]
        key_real[:, : start + n] = so_far
        caps = self.capabilities
        assert caps.attention is not None
        query_slots = torch.arange(start, start + n, device=tokens.device)  # [n]
        mask = allowed_keys(key_real, query_slots, pattern=caps.attention, window=caps.window)  # [B, n, S]
        positions = positions_from_mask(so_far, offset=caps.position_offset)[:, start:]  # [B, n]
        logits = self._call(tokens, {"mask": self._mask(mask), self.position_keyword: positions})
        self._live = ModuleStateCache(torch.cat([state.tokens, tokens], dim=1), so_far)  # [B, start + n]
        return logits, self._live

    def _rollback(self, state: Any, tokens: int) -> Any:
        raise ServingUnsupported(
            "torchtune's KVCache has no rollback: each forward writes at the cache's own next slots, whatever "
            "input_pos says, and no method moves that position back"
        )

    def _reuse(self, state: Any, batch: Batch) -> tuple[Tensor, Any]:
        if state is not self._live:
            self._module_prefill(state.tokens, real=state.real)
        call_model(self.model.reset_caches)
        return self._module_prefill(batch.input_ids, setup=False, real=batch.attention_mask)
