"""Cached decoding of a Hugging Face model the way ``generate()`` feeds it.

A cache is only worth checking on the path users run, and that path is the model's own:
``generate()`` makes the cache (``_prepare_cache_for_generation``), turns the running
sequence into each forward's inputs (``prepare_inputs_for_generation``: which tokens, which
cache keyword, whether the attention mask is passed at all) and carries the cache to the
next forward (``_update_model_kwargs_for_generation``: ``cache``, RWKV's ``state``,
Reformer's buckets ...). Mamba's steps take no attention mask, RWKV's cache is ``state``,
a stateful RecurrentGemma keeps part of its cache in its modules: building step inputs by
hand gets each of these wrong, so maskcheck calls the model's own methods instead.

A step of ``n`` tokens is fed as assisted decoding feeds its candidates: the kwargs update
with ``num_new_tokens=n``, then ``prepare_inputs_for_generation(ids, next_sequence_length=n)``.

Position ids are the one input chosen here rather than by the model: the ones the full
forward of the comparison gets (``positions_from_mask`` plus the model's measured offset),
which are ``generate()``'s own for every model that numbers positions from 0.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import AdapterError, ServingUnsupported, call_model, positions_from_mask
from .serving import RowOperation, crop_cache, is_transformers_cache, rearrange_cache, select_rows


@dataclass
class GenerationState:
    """What ``generate()`` keeps between two forwards."""

    kwargs: dict[str, Any]  # the model kwargs: cache, masks, position ids, encoder outputs
    ids: Tensor  # [B, T_so_far]: the predicted side's ids so far
    output: Any  # the last forward's output, from which the model's own update takes its cache


def drives_generation(model: Any) -> bool:
    """Whether ``model`` has the generation methods this module calls, with the signatures it
    knows (transformers 5.x after ``cache_position`` left the generation loop)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if not isinstance(model, GenerationMixin) or not hasattr(model, "_update_model_kwargs_for_generation"):
        return False
    return "next_sequence_length" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters


class GenerationPath:
    """Prefill and steps of one model through its own generation methods."""

    def __init__(self, model: Any, encoder_decoder: bool, takes_position_ids: bool, position_offset: int) -> None:
        self.model = model
        self.encoder_decoder = encoder_decoder
        self.takes_position_ids = takes_position_ids and not encoder_decoder
        self.position_offset = position_offset
        self.ids_key = "decoder_input_ids" if encoder_decoder else "input_ids"
        self.mask_key = "decoder_attention_mask" if encoder_decoder else "attention_mask"
        #: generate()'s ``cache_implementation`` ("static", "offloaded"); None: the model's default
        self.cache_implementation: str | None = None

    def prefill(
        self,
        ids: Tensor,
        mask: Tensor,
        source: Tensor | None = None,
        source_mask: Tensor | None = None,
        positions: Tensor | None = None,
        rollback: bool = False,
        cache: Any = None,
    ) -> tuple[Tensor, GenerationState]:
        """``ids``/``mask [B, T]`` of the predicted side; encoder-decoders also get their source.
        ``rollback``: the cache records its past, as assisted decoding prepares it; ``cache``:
        a cache object to fill (passed as a user's cache is) instead of a new one."""
        kwargs: dict[str, Any] = {"use_cache": True, self.mask_key: mask}
        if self.encoder_decoder:
            encoder = self.model.get_encoder()
            encoded = call_model(encoder, input_ids=source, attention_mask=source_mask, return_dict=True)
            if isinstance(encoded, tuple):  # an encoder that ignores return_dict: wrapped as generate() wraps it
                from transformers.modeling_outputs import BaseModelOutput

                encoded = BaseModelOutput(last_hidden_state=encoded[0])
            kwargs["encoder_outputs"] = encoded
            kwargs["attention_mask"] = source_mask
        if cache is not None:
            kwargs["cache"] = cache
        else:
            self._new_cache(kwargs, ids.shape[0], ids.shape[1])
        if rollback and is_transformers_cache(kwargs.get("cache")):
            kwargs["cache"].activate_past_recording()  # before the prefill, as _assisted_decoding does
        if self.takes_position_ids and self._generate_passes_positions(ids, mask):
            kwargs["position_ids"] = (
                positions if positions is not None else positions_from_mask(mask, offset=self.position_offset)
            )
        inputs = _every_logit(self.model.prepare_inputs_for_generation(ids, is_first_iteration=True, **kwargs))
        self._check_fed(inputs, ids.shape[1], f"a prompt of {ids.shape[1]} token(s)")
        output = call_model(self.model, **inputs, return_dict=True)
        return output.logits, GenerationState(kwargs, ids, output)

    def step(
        self, state: GenerationState, tokens: Tensor, attention_mask: Tensor | None
    ) -> tuple[Tensor, GenerationState]:
        """Append ``tokens [B, n]`` (``attention_mask [B, n]``; None: all real)."""
        n = tokens.shape[1]
        kwargs = self.model._update_model_kwargs_for_generation(
            state.output, dict(state.kwargs), is_encoder_decoder=self.encoder_decoder, num_new_tokens=n
        )
        if attention_mask is not None:  # the update takes every new token to be real
            full_mask = torch.cat(
                [state.kwargs[self.mask_key], attention_mask.to(state.kwargs[self.mask_key].dtype)], dim=1
            )  # [B, T + n]
            kwargs[self.mask_key] = full_mask
            if "position_ids" in kwargs:
                kwargs["position_ids"] = positions_from_mask(full_mask, offset=self.position_offset)
        ids = torch.cat([state.ids, tokens.to(state.ids.device)], dim=1)  # [B, T + n]
        inputs = _every_logit(self.model.prepare_inputs_for_generation(ids, next_sequence_length=n, **kwargs))
        self._check_fed(inputs, n, f"a step of {n} token(s)")
        output = call_model(self.model, **inputs, return_dict=True)
        return output.logits, GenerationState(kwargs, ids, output)

    # -- serving (harness/adapters/serving.py) -----------------------------------------------

    def cache_of(self, state: GenerationState) -> tuple[str, Any]:
        """Where the state's cache is and the cache: the last output's (which the model's own
        update carries on), else the kwargs'. Raises for a state that holds no transformers Cache."""
        found = [(k, v) for k, v in dict(state.output).items() if v is not None and k != "logits"]
        found += [(k, v) for k, v in state.kwargs.items() if v is not None]
        for key, value in found:
            if is_transformers_cache(value):
                return key, value
        kinds = ", ".join(f"{k}: {type(v).__name__}" for k, v in found if not isinstance(v, (Tensor, bool))) or "none"
        raise ServingUnsupported(
            f"the model keeps its decoding state in no transformers Cache ({kinds}), so there is no crop, reorder or reset to call"
        )

    def rollback(self, state: GenerationState, tokens: int) -> GenerationState:
        """Roll the cache back by ``tokens`` and cut every per-token model kwarg (masks,
        position ids) as assisted decoding does after rejecting draft tokens."""
        crop_cache(self.cache_of(state)[1], tokens)
        # The predicted side's per-token kwargs only: an encoder-decoder's source mask may have
        # as many columns as the decoder has tokens, and is the source's.
        per_token = (self.mask_key, "position_ids", "decoder_position_ids", "token_type_ids")
        kwargs = {
            k: v[:, :-tokens] if k in per_token and isinstance(v, Tensor) and v.dim() >= 2 else v
            for k, v in state.kwargs.items()
        }
        return GenerationState(kwargs, state.ids[:, :-tokens], state.output)

    def rearrange(self, state: GenerationState, operation: RowOperation, index: Tensor) -> GenerationState:
        """Rearrange the cache's rows with its own method, and every per-row kwarg (masks,
        position ids, encoder outputs) with them, as beam search does."""
        rows = state.ids.shape[0]
        rearrange_cache(self.cache_of(state)[1], operation, index, rows)
        return GenerationState(
            select_rows(state.kwargs, index, rows),
            select_rows(state.ids, index, rows),
            select_rows(state.output, index, rows),
        )

    def feeds_only_new_tokens(self, vocab_size: int) -> str | None:
        """None when a decoding step feeds the model only its new token, as a cache needs;
        otherwise why ``generate()`` decodes this model without one. Found by preparing (not
        running) a prompt of 2 tokens and a step of 1."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([[3 % vocab_size, 4 % vocab_size]], device=device)
        kwargs: dict[str, Any] = {"use_cache": True, self.mask_key: torch.ones_like(ids)}
        if self.encoder_decoder:
            kwargs["encoder_outputs"] = None
        try:
            first = self.model.prepare_inputs_for_generation(ids, is_first_iteration=True, **kwargs)
            prompt = _fed_length(first, self.ids_key)
            if prompt is not None and prompt != 2:
                return f"generate() does not feed this model its prompt as it is (prepare_inputs_for_generation turns 2 prompt tokens into {prompt}), so there is no cached decoding of a prompt to compare"
            kwargs[self.mask_key] = torch.ones(1, 3, dtype=ids.dtype, device=device)
            later = self.model.prepare_inputs_for_generation(
                torch.cat([ids, ids[:, :1]], dim=1), next_sequence_length=1, **kwargs
            )
            fed = _fed_length(later, self.ids_key)
        except Exception:  # noqa: BLE001 - a model that cannot even prepare inputs fails in the suite, with its message
            return None
        if fed is not None and fed != 1:
            return f"generate() runs this model without a cache: prepare_inputs_for_generation feeds {fed} tokens for a step of 1 (the whole sequence again)"
        return None

    # -- helpers --------------------------------------------------------------------------------

    def _new_cache(self, kwargs: dict[str, Any], batch: int, length: int) -> None:
        """The cache ``generate()`` would make before the prefill, put in ``kwargs``."""
        from transformers import GenerationConfig
        from transformers.generation.utils import GenerationMode

        try:
            self.model._prepare_cache_for_generation(
                GenerationConfig(
                    use_cache=True, cache_implementation=self.cache_implementation, num_beams=1, num_return_sequences=1
                ),
                kwargs,
                GenerationMode.GREEDY_SEARCH,
                batch,
                length + 64,
            )
        except TypeError:
            # Another signature of this private method: the model then makes its own cache on
            # the first forward, as it does when called outside generate().
            pass

    def _generate_passes_positions(self, ids: Tensor, mask: Tensor) -> bool:
        """Whether ``generate()`` hands this model position ids (Reformer's generation says no)."""
        own = getattr(self.model, "_prepare_position_ids_for_generation", None)
        return own is None or own(ids, {"attention_mask": mask}) is not None

    def _check_fed(self, inputs: dict[str, Any], expected: int, what: str) -> None:
        fed = _fed_length(inputs, self.ids_key)
        if fed is not None and fed != expected:
            raise AdapterError(f"prepare_inputs_for_generation fed the model {fed} tokens for {what}")


def _every_logit(inputs: dict[str, Any]) -> dict[str, Any]:
    """The prepared inputs with every position's logits kept. State-space hybrids (Bamba,
    Zamba, Falcon-H1 ...) prepare ``logits_to_keep=1``: generation needs only the last
    position, and the head then scores only it. That slices the output, not the cache path,
    and the comparison needs every fed position (0 keeps all)."""
    if "logits_to_keep" in inputs:
        inputs["logits_to_keep"] = 0
    return inputs


def _fed_length(inputs: dict[str, Any], key: str) -> int | None:
    fed = inputs.get(key)
    return int(fed.shape[1]) if isinstance(fed, Tensor) else None
