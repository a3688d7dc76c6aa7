"""Seeded bugs: each model here has exactly one deliberate mistake.

Each mutant is named after the suite that must catch it and records the check that
should fail. Most are reference models with one method swapped for a buggy
subclass; the ``hf_*`` mutants patch real Hugging Face models (their attention
function or forward), so the mutation score is not measured on our own code alone.
Build one with :func:`build` or the spec ``mutant:NAME``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ModelConfig
from .masks import build_attention_mask
from .model import IGNORE_INDEX, Block, ModelOutput, Stack, Transformer
from .path_bugs import BackwardLeakDecoder, FaintNextToken, WindowedEncoderDecoder, WindowedMHADecoder, bfloat16
from .plain import SERVING_BUGS, StepReadsPadding, plain_decoder
from .scratch import ScratchDecoder, StepPositionOffByOne, scratch_with_loss


@dataclass(frozen=True)
class Mutant:
    name: str
    suite: str
    check: str
    description: str
    build: Callable[[], Any]
    clean: Callable[[], Any]  # the same model without the bug


def _doc(described: Any) -> str:
    """The docstring of a bug's class or factory, on one line: the mutant's description."""
    return " ".join((described.__doc__ or "").split())


def _reference(config: ModelConfig, **swaps: type) -> Transformer:
    """A random-init reference model (seed 0) with some submodules' classes swapped."""
    torch.manual_seed(0)
    model = Transformer(config)
    for attribute, cls in swaps.items():
        if attribute == "model":
            model.__class__ = cls
        else:
            getattr(model, attribute).__class__ = cls
    return model


# -- causal -----------------------------------------------------------------------------------


class SeesNextToken(Stack):
    """Causal mask off by one: ``k <= q + 1`` lets each position read the next token."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        return build_attention_mask(
            q_index=q_index + 1,
            k_index=k_index,
            causal=True,
            key_real=real,
            q_segments=segments,
            k_segments=segments,
            batch=batch,
        )


LONG_FROM = 40  # the first position at which LeaksPastLength's mask is wrong


class LeaksPastLength(Stack):
    """A causal mask that is right up to position 39 and lets every later position read the
    next token: a mask built for a shorter context than the model declares."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        reach = q_index + (q_index >= LONG_FROM).to(q_index.dtype)  # [.., Tq]: one key further past the length
        return build_attention_mask(
            q_index=reach, k_index=k_index, causal=True, key_real=real, q_segments=segments, k_segments=segments,
            batch=batch,
        )  # fmt: skip


class LastLayerBidirectional(Stack):
    """The causal mask is missing in the last layer only."""

    def layer_mask(self, layer: int, mask: Tensor) -> Tensor:
        if layer != len(self.blocks) - 1:
            return mask
        padding_only = mask.any(dim=1, keepdim=True)  # [B, 1, Tk]: keys some query may see
        return padding_only.expand_as(mask)


class PlainCausalMask(Stack):
    """Builds a plain causal mask whatever the config says: a sliding window that is
    declared but ignored, or an encoder that was accidentally made causal."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        return build_attention_mask(
            q_index=q_index,
            k_index=k_index,
            causal=True,
            key_real=real,
            q_segments=segments,
            k_segments=segments,
            batch=batch,
        )


# -- padding ----------------------------------------------------------------------------------


class PaddingIgnored(Stack):
    """Builds the causal mask but drops the padding mask."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        return build_attention_mask(
            q_index=q_index, k_index=k_index, causal=self.causal, window=self.config.sliding_window, batch=batch
        )


class PolarityInverted(Stack):
    """Reads the 1 = keep mask as PyTorch's key_padding_mask (True = ignore)."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        return build_attention_mask(q_index=q_index, k_index=k_index, causal=self.causal, key_real=~real, batch=batch)


class PaddingOfLastRow(Stack):
    """Every row gets the padding mask of the batch's last row (a ``[1, T]`` mask broadcast
    where ``[B, T]`` was meant): a row's outputs depend on what else is in its batch."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        last = real[-1:].expand_as(real)  # [B, T]: the last row's real slots, for every row
        return build_attention_mask(
            q_index=q_index,
            k_index=k_index,
            causal=self.causal,
            window=self.config.sliding_window,
            key_real=last,
            batch=batch,
        )


# -- cross-attention --------------------------------------------------------------------------


class CrossUnmasked(Transformer):
    """The decoder's cross-attention reads the source padding."""

    def cross_mask(self, source_real: Tensor, length: int) -> Tensor:
        return torch.ones_like(source_real)[:, None, :].expand(-1, length, -1)


class CrossInverted(Transformer):
    """Cross-attention mask with inverted polarity: attends to the padding only (or to all when unpadded)."""

    def cross_mask(self, source_real: Tensor, length: int) -> Tensor:
        inverted = ~source_real
        inverted = torch.where(inverted.any(-1, keepdim=True), inverted, torch.ones_like(inverted))
        return inverted[:, None, :].expand(-1, length, -1)


# -- loss masking -----------------------------------------------------------------------------


class LossWithoutShift(Transformer):
    """Scores position t against labels[t]: the model is trained to copy its input."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX
        )


class LossOverAllPositions(Transformer):
    """Sums over valid targets but divides by every position, ignored ones included."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        logits, labels = logits[:, :-1], labels[:, 1:]
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return total / labels.numel()


class LossCountedBeforeShift(Transformer):
    """Divides the shifted targets' loss by the valid labels counted before the shift: one
    target too many per row whose first label is valid (labels = input_ids, as collators build them)."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        count = (labels != IGNORE_INDEX).sum()
        logits, shifted = logits[:, :-1], labels[:, 1:]
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            shifted.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        return total / count


class LossCountsIgnored(Transformer):
    """Replaces -100 with the pad id before the loss, as a collator that forgot to mask padding."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        labels = labels.masked_fill(labels == IGNORE_INDEX, self.config.pad_token_id)
        return super().loss(logits, labels)


# -- packing ----------------------------------------------------------------------------------


class SegmentsIgnored(Stack):
    """The block-diagonal mask is missing: packed sequences attend to each other."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        return super().build_mask(q_index, k_index, real, None, batch)


class PositionsNotRestarted(Stack):
    """Packed sequences get positions 0..T-1 across the row instead of restarting at 0.
    Invisible under rotary positions (relative within a segment), so the mutant uses learned ones."""

    def forward(
        self,
        input_ids: Tensor,
        real: Tensor,
        positions: Tensor,
        segments: Tensor | None = None,
        cache: Any = None,
        cross: Any = None,
    ) -> Any:
        if segments is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return super().forward(input_ids, real, positions, segments, cache, cross)


class SegmentBoundaryOffByOne(Stack):
    """Segment ids are read one token late (cu_seqlens off by one): the last token of each
    packed sequence is grouped with the next one and attends to it."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        if segments is not None:
            segments = torch.cat([segments[:, 1:], segments[:, -1:]], dim=1)  # [B, T]
        return super().build_mask(q_index, k_index, real, segments, batch)


# -- KV cache ---------------------------------------------------------------------------------


class PositionsRestartWithCache(Stack):
    """Positions are not advanced with the cache: new tokens get 0, 1, ... again (rotary restarts at 0)."""

    def forward(
        self,
        input_ids: Tensor,
        real: Tensor,
        positions: Tensor,
        segments: Tensor | None = None,
        cache: Any = None,
        cross: Any = None,
    ) -> Any:
        if cache is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return super().forward(input_ids, real, positions, segments, cache, cross)


class CacheAppendedTwice(Transformer):
    """Each forward appends its new keys and values to the cache twice (the layer and its
    caller both update it); the caller's mask is stretched to fit, so nothing raises."""

    def forward(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        segment_ids: Any = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> ModelOutput:
        if cache is not None and attention_mask is not None:
            fresh = attention_mask[:, -input_ids.shape[1] :]
            attention_mask = torch.cat([cache.key_real.to(fresh.dtype), fresh], dim=1)  # [B, T_cache + T]
        out = super().forward(input_ids, attention_mask, position_ids, segment_ids, cache, **kwargs)
        past = 0 if cache is None else cache.length
        assert out.cache is not None

        def twice(t: Tensor, dim: int) -> Tensor:
            return torch.cat([t, t.narrow(dim, past, t.shape[dim] - past)], dim=dim)

        out.cache = replace(
            out.cache,
            keys=tuple(twice(k, 2) for k in out.cache.keys),
            values=tuple(twice(v, 2) for v in out.cache.values),
            key_real=twice(out.cache.key_real, 1),
            positions=twice(out.cache.positions, 1),
        )
        return out


class CacheSkipsCausalMask(Stack):
    """With a cache, the causal mask is built as if one token were decoded (every new query at
    the last index): harmless one token at a time, a chunk of new tokens sees its own future."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        if q_index.numel() < k_index.numel():
            q_index = torch.full_like(q_index, int(k_index[-1]))
        return super().build_mask(q_index, k_index, real, segments, batch)


class CrossFromDecoderStates(Block):
    """On cached steps, cross-attention keys and values are recomputed from the decoder's own
    hidden states instead of the encoder output (the wrong source)."""

    def forward(self, x: Tensor, mask: Tensor, past: Any, rotary: Any, bias: Any, cross: Any) -> Any:
        if past is not None and cross is not None and self.cross_attn is not None:
            k, v = self.cross_attn.project_kv(x)  # [B, Hkv, T, Dh] each
            cross = (k, v, torch.ones(x.shape[0], x.shape[1], x.shape[1], dtype=torch.bool, device=x.device))
        return super().forward(x, mask, past, rotary, bias, cross)


def _cross_from_decoder_states() -> Transformer:
    model = _reference(ENCODER_DECODER)
    assert model.decoder is not None
    for block in model.decoder.blocks:
        block.__class__ = CrossFromDecoderStates
    return model


# -- Hugging Face models with a seeded bug ----------------------------------------------------


def _hf_attention(name: str, transform: Callable[[Any, Any, Any], Any]) -> str:
    """Register an SDPA attention function whose mask goes through ``transform(mask, q_len, k_len)``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(
        module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
    ) -> Any:
        kwargs.pop("is_causal", None)
        mask = transform(attention_mask, query.shape[2], key.shape[2])
        return sdpa_attention_forward(
            module, query, key, value, mask, is_causal=mask is None and query.shape[2] > 1, **kwargs
        )

    AttentionInterface.register(name, attention)
    # Without a registered mask function transformers builds no mask at all for a custom name.
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _leak_next(mask: Tensor | None, q_len: int, k_len: int) -> Tensor:
    q = torch.arange(k_len - q_len, k_len)[:, None]
    k = torch.arange(k_len)[None, :]
    return (k <= q + 1)[None, None]  # [1, 1, Tq, Tk]: each query also reads the next key


def _leak_next_when_padded(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # A shared mask builder with the bug on its padded path only: with nothing padded SDPA
    # gets no mask and applies is_causal (right); the mask built for a padded batch lets
    # each query read the next key. Unpadded rows never show it.
    if mask is None:
        return None
    return mask | _leak_next(mask, q_len, k_len).to(mask.device)


def _drop_padding(mask: Tensor | None, q_len: int, k_len: int) -> None:
    return None  # SDPA then applies is_causal only: padding is read


def _top_left_causal_on_cached_chunks(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # No mask with a cache: SDPA's is_causal then aligns the triangle top-left when q_len < k_len.
    return None if 1 < q_len < k_len else mask


def _no_mask_for_one_query(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # The decode fast path: one query cannot see its own future, so no mask is built; the
    # padding of a left-padded batch's cached keys goes with it.
    return None if q_len == 1 < k_len else mask


def _tiny_hf(kind: str, attn_implementation: str) -> Any:
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
        )
    else:
        config = LlamaConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
        )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def _cache_bug(layer: str) -> Any:
    """The tiny Llama whose generation cache's dynamic layers are ``serving_bugs.<layer>``."""
    from . import serving_bugs

    return serving_bugs.with_cache_layer(_tiny_hf("llama", "sdpa"), getattr(serving_bugs, layer))


def _mistral(window_dropped: bool) -> Any:
    """A tiny Mistral with a real-width sliding window (512 tokens); with ``window_dropped``
    its mask builder makes a plain causal mask, as a model class that forgets to build the
    sliding mask would. The window is wider than any toy-size pattern, so only a check at
    the window's own width sees it."""
    import functools
    from unittest import mock

    from transformers import MistralConfig, MistralForCausalLM
    from transformers.models.mistral import modeling_mistral

    class WindowDroppedMistral(MistralForCausalLM):
        @functools.wraps(MistralForCausalLM.forward)
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            with mock.patch.object(
                modeling_mistral, "create_sliding_window_causal_mask", modeling_mistral.create_causal_mask
            ):
                return super().forward(*args, **kwargs)

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=512,
        pad_token_id=0,
    )
    cls = WindowDroppedMistral if window_dropped else MistralForCausalLM
    return cls(config).eval()


def _shipped_hf(name: str, as_type: str | None = None) -> Any:
    """A shipped Hugging Face checkpoint; with ``as_type``, its weights under that type's class
    (the layout mismatch a hand-written config makes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .hf_tiny import CHECKPOINT_FIELDS
    from .shipped import SHIPPED_HF

    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED_HF[name]), use_safetensors=True)
    if as_type is None:
        return model.eval()
    declared, defaults = model.config.to_dict(), AutoConfig.for_model(as_type).to_dict()
    config = AutoConfig.for_model(
        as_type, **{k: declared[k] for k in CHECKPOINT_FIELDS if k in declared and k in defaults}
    )
    mismatched = AutoModelForCausalLM.from_config(config, attn_implementation=model.config._attn_implementation)
    mismatched.load_state_dict(model.state_dict(), strict=True)  # the shipped checkpoints fit both classes
    return mismatched.eval()


DECODER = ModelConfig()
LEARNED = ModelConfig(position="learned")
ENCODER = ModelConfig(family="encoder", position="learned")
ENCODER_DECODER = ModelConfig(family="encoder_decoder", position="sinusoidal")
SLIDING = ModelConfig(sliding_window=3, n_layers=2)


def _llama_mask_dropped() -> Any:
    """A tiny Llama whose forward drops the attention mask it is given. With use_cache=False
    and position ids derived from the mask, transformers reads the restarting positions as
    packed sequences and isolates the padded slots, so the drop looks exact; with the cache
    at its default (as users call it) nothing isolates them."""
    model = _tiny_hf("llama", "sdpa")
    model.__class__ = _mask_dropping(type(model))
    return model


def _mask_dropping(cls: type) -> type:
    @functools.wraps(cls.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["attention_mask"] = None
        return cls.forward(self, *args, **kwargs)

    return type(f"MaskDropping{cls.__name__}", (cls,), {"forward": forward})


def _ref(
    name: str, suite: str, check: str, config: ModelConfig, description: str | None = None, **swaps: type
) -> Mutant:
    """A reference-model mutant; its clean twin is the same config without the swap."""
    return Mutant(
        name,
        suite,
        check,
        " ".join(description.split()) if description else _doc(next(iter(swaps.values()))),
        lambda: _reference(config, **swaps),
        lambda: _reference(config),
    )


def _hf(
    name: str, suite: str, check: str, description: str, kind: str, transform: Callable[[Any, int, int], Any]
) -> Mutant:
    """A tiny Hugging Face model whose attention mask goes through ``transform``; its clean twin runs sdpa."""
    return Mutant(
        name,
        suite,
        check,
        description,
        lambda: _tiny_hf(kind, _hf_attention(f"maskcheck_{name}", transform)),
        lambda: _tiny_hf(kind, "sdpa"),
    )


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        _ref("causal_sees_next_token", "causal", "future_tokens", DECODER, decoder=SeesNextToken),
        _ref("causal_last_layer_bidirectional", "causal", "future_tokens", DECODER, decoder=LastLayerBidirectional),
        _ref("causal_leaks_past_length", "causal", "future_tokens", DECODER, decoder=LeaksPastLength),
        _ref(
            "causal_window_ignored",
            "causal",
            "declared_pattern",
            SLIDING,
            "a sliding window is declared but the mask is plain causal",
            decoder=PlainCausalMask,
        ),
        Mutant(
            "hf_mistral_window_dropped",
            "causal",
            "layer_windows",
            "Mistral whose mask builder ignores its 512-token sliding window (a plain causal mask in every layer)",
            lambda: _mistral(window_dropped=True),
            lambda: _mistral(window_dropped=False),
        ),
        _ref(
            "causal_encoder_is_causal",
            "causal",
            "declared_pattern",
            ENCODER,
            "an encoder built with a causal mask",
            encoder=PlainCausalMask,
        ),
        _hf(
            "hf_gpt2_sees_next_token",
            "causal",
            "future_tokens",
            "GPT-2 whose attention lets each position read the next token",
            "gpt2",
            _leak_next,
        ),
        _hf(
            "hf_llama_causal_leak_when_padded",
            "causal",
            "future_tokens",
            "Llama whose mask builder lets each position read the next token only when a row is padded (no mask is built otherwise)",
            "llama",
            _leak_next_when_padded,
        ),
        _ref("padding_mask_ignored", "padding", "pad_ids", DECODER, decoder=PaddingIgnored),
        _ref("padding_polarity_inverted", "padding", "pad_ids", ENCODER, encoder=PolarityInverted),
        _ref("padding_mask_of_last_row", "padding", "batch_composition", DECODER, decoder=PaddingOfLastRow),
        _hf(
            "hf_llama_ignores_padding",
            "padding",
            "pad_ids",
            "Llama whose attention drops the padding mask and applies is_causal only",
            "llama",
            _drop_padding,
        ),
        _ref("cross_attention_unmasked", "cross_attention", "source_pad_ids", ENCODER_DECODER, model=CrossUnmasked),
        _ref("cross_attention_inverted", "cross_attention", "source_pad_ids", ENCODER_DECODER, model=CrossInverted),
        _ref("loss_without_shift", "loss_masking", "reference_loss", DECODER, model=LossWithoutShift),
        _ref("loss_over_all_positions", "loss_masking", "reference_loss", DECODER, model=LossOverAllPositions),
        _ref("loss_counted_before_shift", "loss_masking", "reference_loss", DECODER, model=LossCountedBeforeShift),
        _ref("loss_counts_ignored", "loss_masking", "reference_loss", DECODER, model=LossCountsIgnored),
        _ref("packing_segments_ignored", "packing", "segment_isolation", DECODER, decoder=SegmentsIgnored),
        _ref(
            "packing_encoder_segments_ignored",
            "packing",
            "segment_isolation",
            ENCODER,
            "an encoder whose block-diagonal mask is missing",
            encoder=SegmentsIgnored,
        ),
        _ref("packing_positions_not_restarted", "packing", "segments_alone", LEARNED, decoder=PositionsNotRestarted),
        _ref("packing_boundary_off_by_one", "packing", "segment_isolation", DECODER, decoder=SegmentBoundaryOffByOne),
        _ref("kv_cache_positions_restart", "kv_cache", "incremental", DECODER, decoder=PositionsRestartWithCache),
        _ref("kv_cache_appended_twice", "kv_cache", "incremental", DECODER, model=CacheAppendedTwice),
        _ref("kv_cache_chunk_sees_its_future", "kv_cache", "incremental", DECODER, decoder=CacheSkipsCausalMask),
        Mutant(
            "kv_cache_cross_from_decoder_states",
            "kv_cache",
            "incremental",
            _doc(CrossFromDecoderStates),
            _cross_from_decoder_states,
            lambda: _reference(ENCODER_DECODER),
        ),
        Mutant(
            "module_cache_step_reads_padding",
            "kv_cache",
            "greedy_generation",
            _doc(StepReadsPadding),
            lambda: plain_decoder(buggy=True),
            plain_decoder,
        ),
        *(
            Mutant(
                f"module_cache_{name}",
                "serving",
                check,
                _doc(SERVING_BUGS[bug]),
                lambda bug=bug: plain_decoder(serving_bug=bug),
                plain_decoder,
            )
            for name, bug, check in (
                ("rollback_keeps_position", "rollback", "rollback"),
                ("reorder_keys_only", "reorder", "beam_reorder"),
                ("reset_keeps_last_layer", "reset", "reuse"),
            )
        ),
        *(
            Mutant(
                name,
                "serving",
                check,
                description,
                functools.partial(_cache_bug, layer),
                lambda: _tiny_hf("llama", "sdpa"),
            )
            for name, layer, check, description in (
                (
                    "hf_llama_reorder_keys_only",
                    "ReorderKeysOnlyLayer",
                    "beam_reorder",
                    "Llama whose generation cache reorders the keys for beam search and not the values",
                ),
                (
                    "hf_llama_crop_keeps_values",
                    "CropKeepsValuesLayer",
                    "rollback",
                    "Llama whose generation cache's rollback (crop) crops the keys and not the values",
                ),
            )
        ),
        _hf(
            "hf_llama_decode_step_reads_padding",
            "kv_cache",
            "greedy_generation",
            "Llama whose attention builds no mask for a one-token decoding step, so left-padded cache slots are read",
            "llama",
            _no_mask_for_one_query,
        ),
        _hf(
            "hf_llama_cached_chunk_top_left",
            "kv_cache",
            "incremental",
            "Llama whose attention drops the mask on cached chunks, so SDPA aligns is_causal top-left",
            "llama",
            _top_left_causal_on_cached_chunks,
        ),
        Mutant(
            "module_state_cache_position_off_by_one",
            "kv_cache",
            "incremental",
            _doc(StepPositionOffByOne) + " (a model that takes no mask)",
            StepPositionOffByOne,
            ScratchDecoder,
        ),
        Mutant(
            "scratch_loss_without_shift",
            "loss_masking",
            "reference_loss",
            "a from-scratch decoder that takes no mask scores each position against its own token, not the next",
            lambda: scratch_with_loss(shifted=False),
            scratch_with_loss,
        ),
        Mutant(
            "scratch_window_narrower_than_declared",
            "causal",
            "declared_pattern",
            "a from-scratch decoder declaring a sliding window of 4 whose layers read only 3 (themselves and 2 back)",
            lambda: ScratchDecoder(window=3, declared_window=4),
            lambda: ScratchDecoder(window=4),
        ),
        Mutant(
            "module_mha_window_hint",
            "causal",
            "declared_pattern",
            _doc(WindowedMHADecoder)
            + " (exact under inference mode; the window is dropped when called without a mask with gradients on)",
            lambda: WindowedMHADecoder(is_causal_hint=True),
            lambda: WindowedMHADecoder(is_causal_hint=False),
        ),
        Mutant(
            "module_encoder_window_dropped_with_grad",
            "causal",
            "declared_pattern",
            _doc(WindowedEncoderDecoder) + " (the window holds under inference mode and is dropped with gradients on)",
            lambda: WindowedEncoderDecoder(is_causal_hint=True),
            lambda: WindowedEncoderDecoder(is_causal_hint=False),
        ),
        Mutant(
            "scratch_backward_leak",
            "causal",
            "future_gradients",
            _doc(BackwardLeakDecoder),
            BackwardLeakDecoder,
            ScratchDecoder,
        ),
        Mutant(
            "hf_llama_mask_dropped_default_cache",
            "padding",
            "pad_ids",
            _doc(_llama_mask_dropped),
            _llama_mask_dropped,
            lambda: _tiny_hf("llama", "sdpa"),
        ),
        Mutant(
            "bf16_faint_next_token",
            "causal",
            "future_tokens",
            _doc(FaintNextToken) + " (the model in bfloat16)",
            lambda: bfloat16(FaintNextToken()),
            lambda: bfloat16(ScratchDecoder()),
        ),
        Mutant(
            "hf_gemma_weights_as_llama",
            "norm_checkpoint",
            "behaviour",
            "trained Gemma weights run as Llama (same parameter names; RMSNorm w instead of 1 + w, no embedding scale, SiLU)",
            lambda: _shipped_hf("hf-gemma", as_type="llama"),
            lambda: _shipped_hf("hf-gemma"),
        ),
    ]
}


def build(name: str) -> Any:
    """Build the mutant ``name`` (a fresh model each call)."""
    return _mutant(name).build().eval()


def build_clean(name: str) -> Any:
    """The mutant's clean twin: the same model without the bug (what a fixed bundle replays on)."""
    return _mutant(name).clean().eval()


def _mutant(name: str) -> Mutant:
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
    return MUTANTS[name]
