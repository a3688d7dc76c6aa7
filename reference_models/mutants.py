"""The catalogue of seeded bugs: each model it builds has exactly one deliberate mistake.

Each mutant is named after the suite that must catch it and records the check that
should fail. Most are reference models with one method swapped for a buggy subclass
(reference_bugs.py); the ``hf_*`` mutants patch real Hugging Face models, their
attention function, cache layer or forward (hf_bugs.py), so the mutation score is not
measured on our own code alone; the rest live on the paths users run (path_bugs.py) and
in plain and from-scratch decoders (plain.py, scratch.py). Build one with :func:`build`
or the spec ``mutant:NAME``.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

from .chunked_hf import CHUNKED_THEN_FULL, EVERY_LAYER_CHUNKED, llama4
from .config import ModelConfig
from .heads import PooledHead, TokenTagger, ValueHead
from .hf_bugs import (
    cache_bug,
    drop_padding,
    hf_attention,
    leak_next,
    leak_next_when_padded,
    llama_mask_dropped,
    mistral,
    no_mask_for_one_query,
    shipped_hf,
    tiny_hf,
    top_left_causal_on_cached_chunks,
)
from .path_bugs import (
    BackwardLeakDecoder,
    FaintNextToken,
    WindowedEncoderDecoder,
    WindowedMHADecoder,
    bfloat16,
    llama_padding_backward_leak,
)
from .plain import MASK_BUGS, SERVING_BUGS, StepReadsPadding, plain_decoder
from .prefix_lm import PrefillForgetsPrefix, PrefixLM, PrefixReachesSuffix, PrefixReadCausally
from .reference_bugs import (
    CHUNKED,
    DECODER,
    ENCODER,
    ENCODER_DECODER,
    LEARNED,
    SLIDING,
    CacheAppendedTwice,
    CacheSkipsCausalMask,
    ChunkBoundaryOffByOne,
    ChunksAcrossPackedSequences,
    CrossFromDecoderStates,
    CrossInverted,
    CrossUnmasked,
    LastLayerBidirectional,
    LeaksPastLength,
    LossCountedBeforeShift,
    LossCountsIgnored,
    LossOverAllPositions,
    LossSmoothed,
    LossSmoothingCountsIgnored,
    LossWithoutShift,
    PaddingIgnored,
    PaddingOfLastRow,
    PlainCausalMask,
    PolarityInverted,
    PositionsNotRestarted,
    PositionsRestartWithCache,
    ReadsRowLength,
    SeesNextToken,
    SegmentBoundaryOffByOne,
    SegmentsIgnored,
    cross_from_decoder_states,
    seeded_reference,
)
from .scratch import ScratchDecoder, StepPositionOffByOne, scratch_with_loss
from .torchtune_decoders import tiny_torchtune, torchtune_cache_advances_one_slot


@dataclass(frozen=True)
class Mutant:
    name: str
    suite: str
    check: str
    description: str
    build: Callable[[], Any]
    clean: Callable[[], Any]  # the same model without the bug
    # the test subject it is built from, where that is an optional library (torchtune: a test
    # environment of its own, pyproject.toml); None: the default environment builds it
    requires: str | None = None

    def missing(self) -> str | None:
        """Why this environment cannot build it (one line), or None."""
        if self.requires is None or importlib.util.find_spec(self.requires) is not None:
            return None
        return (
            f"{self.name} needs {self.requires}, which is not installed here (pip install -e '.[dev,{self.requires}]')"
        )


def _doc(described: Any) -> str:
    """The docstring of a bug's class or factory, on one line: the mutant's description."""
    return " ".join((described.__doc__ or "").split())


def _ref(
    name: str, suite: str, check: str, config: ModelConfig, description: str | None = None, **swaps: type
) -> Mutant:
    """A reference-model mutant; its clean twin is the same config without the swap."""
    return Mutant(
        name,
        suite,
        check,
        " ".join(description.split()) if description else _doc(next(iter(swaps.values()))),
        lambda: seeded_reference(config, **swaps),
        lambda: seeded_reference(config),
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
        lambda: tiny_hf(kind, hf_attention(f"maskcheck_{name}", transform)),
        lambda: tiny_hf(kind, "sdpa"),
    )


def _pooled(name: str, suite: str, check: str, clean: str, description: str) -> Mutant:
    """A pooled head whose pooling spans the padded slots; its clean twin pools over real tokens."""
    return Mutant(
        name,
        suite,
        check,
        description,
        lambda: PooledHead("bert", f"{clean}_over_padding"),
        lambda: PooledHead("bert", clean),
    )


def _exported(export: str, **bug: bool) -> Any:
    """An ONNX export (``onnx_exports.NAME``) as the adapter that runs it: written to a
    temporary folder (a few seconds), removed at exit."""
    from . import onnx_exports

    return onnx_exports.exported(getattr(onnx_exports, export), **bug)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        _ref("causal_sees_next_token", "causal", "future_tokens", DECODER, decoder=SeesNextToken),
        _ref("causal_last_layer_bidirectional", "causal", "future_tokens", DECODER, decoder=LastLayerBidirectional),
        _ref("causal_leaks_past_length", "causal", "future_tokens", DECODER, decoder=LeaksPastLength),
        _ref("causal_reads_row_length", "causal", "future_tokens", DECODER, decoder=ReadsRowLength),
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
            lambda: mistral(window_dropped=True),
            lambda: mistral(window_dropped=False),
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
            leak_next,
        ),
        _hf(
            "hf_llama_causal_leak_when_padded",
            "causal",
            "future_tokens",
            "Llama whose mask builder lets each position read the next token only when a row is padded (no mask is built otherwise)",
            "llama",
            leak_next_when_padded,
        ),
        _ref("causal_chunk_boundary_off_by_one", "causal", "declared_pattern", CHUNKED, decoder=ChunkBoundaryOffByOne),
        *(
            Mutant(
                name,
                suite,
                check,
                description,
                functools.partial(llama4, layers, bug=bug),
                functools.partial(llama4, layers),
            )
            for name, suite, check, layers, bug, description in (
                (
                    "hf_llama4_chunk_ignored",
                    "causal",
                    "declared_pattern",
                    EVERY_LAYER_CHUNKED,
                    "chunk_ignored",
                    "Llama 4 whose every layer declares chunks of 8 and gets a plain causal mask",
                ),
                (
                    "hf_llama4_mixed_chunk_ignored",
                    "causal",
                    "layer_windows",
                    CHUNKED_THEN_FULL,
                    "chunk_ignored",
                    "Llama 4 whose chunked layer (then a full one) gets a plain causal mask",
                ),
                (
                    "hf_llama4_chunks_from_column_zero",
                    "padding",
                    "padded_vs_unpadded",
                    EVERY_LAYER_CHUNKED,
                    "chunks_from_column_zero",
                    "Llama 4 whose chunks are counted from column 0 of a left-padded row, not its first real token",
                ),
                (
                    "hf_llama4_cache_reads_previous_chunk",
                    "kv_cache",
                    "incremental",
                    EVERY_LAYER_CHUNKED,
                    "cache_reads_previous_chunk",
                    "Llama 4 whose cached decode reads every key its chunked cache retains, the previous chunk's included",
                ),
            )
        ),
        *(
            Mutant(name, suite, check, _doc(cls), cls, PrefixLM)
            for name, suite, check, cls in (
                ("causal_prefix_reaches_suffix", "causal", "future_tokens", PrefixReachesSuffix),
                ("causal_prefix_read_causally", "causal", "declared_pattern", PrefixReadCausally),
                ("kv_cache_prefill_forgets_prefix", "kv_cache", "incremental", PrefillForgetsPrefix),
            )
        ),
        *(
            Mutant(
                name,
                suite,
                check,
                description,
                functools.partial(_exported, export, **{bug: True}),
                functools.partial(_exported, export),
                requires="onnxruntime",
            )
            for name, suite, check, export, bug, description in (
                (
                    "onnx_cached_export_forgets_padding",
                    "kv_cache",
                    "incremental",
                    "export_cached",
                    "forgets_cached_padding",
                    "an ONNX export of a decoder with its cache whose wrapper gives the model ones for the cached "
                    "slots: a left-padded prompt's padding is read by every decoding step",
                ),
                (
                    "onnx_float16_export_nan_rows",
                    "padding",
                    "pad_ids",
                    "export_additive",
                    "half",
                    "an ONNX export in float16 of a decoder whose additive mask is finfo(float32).min, -inf in "
                    "float16: a padded query's row turns NaN and the next layer carries it into real tokens",
                ),
            )
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
            drop_padding,
        ),
        _ref("cross_attention_unmasked", "cross_attention", "source_pad_ids", ENCODER_DECODER, model=CrossUnmasked),
        _ref("cross_attention_inverted", "cross_attention", "source_pad_ids", ENCODER_DECODER, model=CrossInverted),
        _ref("loss_without_shift", "loss_masking", "reference_loss", DECODER, model=LossWithoutShift),
        _ref("loss_over_all_positions", "loss_masking", "reference_loss", DECODER, model=LossOverAllPositions),
        _ref("loss_counted_before_shift", "loss_masking", "reference_loss", DECODER, model=LossCountedBeforeShift),
        _ref("loss_counts_ignored", "loss_masking", "reference_loss", DECODER, model=LossCountsIgnored),
        *(
            Mutant(
                f"loss_smoothing_counts_ignored{suffix}",
                "loss_masking",
                "ignored_logits",
                _doc(LossSmoothingCountsIgnored) + f" ({config.family})",
                lambda config=config: seeded_reference(config, model=LossSmoothingCountsIgnored),
                lambda config=config: seeded_reference(config, model=LossSmoothed),
            )
            for suffix, config in (("", DECODER), ("_seq2seq", ENCODER_DECODER))
        ),
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
        _ref(
            "packing_chunks_across_sequences",
            "packing",
            "segments_alone",
            CHUNKED,
            decoder=ChunksAcrossPackedSequences,
        ),
        _ref("kv_cache_positions_restart", "kv_cache", "incremental", DECODER, decoder=PositionsRestartWithCache),
        _ref("kv_cache_appended_twice", "kv_cache", "incremental", DECODER, model=CacheAppendedTwice),
        _ref("kv_cache_chunk_sees_its_future", "kv_cache", "incremental", DECODER, decoder=CacheSkipsCausalMask),
        Mutant(
            "kv_cache_cross_from_decoder_states",
            "kv_cache",
            "incremental",
            _doc(CrossFromDecoderStates),
            cross_from_decoder_states,
            lambda: seeded_reference(ENCODER_DECODER),
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
                f"module_mask_{bug}",
                "padding",
                "pad_ids",  # the drawn case that shows it; mask_read fails beside it with the measurement
                _doc(MASK_BUGS[bug]),
                lambda bug=bug: plain_decoder(mask_bug=bug),
                plain_decoder,
            )
            for bug in MASK_BUGS
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
                functools.partial(cache_bug, layer),
                lambda: tiny_hf("llama", "sdpa"),
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
            no_mask_for_one_query,
        ),
        _hf(
            "hf_llama_cached_chunk_top_left",
            "kv_cache",
            "incremental",
            "Llama whose attention drops the mask on cached chunks, so SDPA aligns is_causal top-left",
            "llama",
            top_left_causal_on_cached_chunks,
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
            "torchtune_cache_advances_one_slot",
            "kv_cache",
            "incremental",
            _doc(torchtune_cache_advances_one_slot) + " (torchtune, the torchtune extra)",
            torchtune_cache_advances_one_slot,
            tiny_torchtune,
            requires="torchtune",
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
            "hf_llama_left_padding_backward_leak",
            "padding",
            "padded_gradients",
            _doc(llama_padding_backward_leak),
            llama_padding_backward_leak,
            lambda: tiny_hf("llama", "sdpa", 1024),
        ),
        Mutant(
            "hf_llama_mask_dropped_default_cache",
            "padding",
            "pad_ids",
            _doc(llama_mask_dropped),
            llama_mask_dropped,
            lambda: tiny_hf("llama", "sdpa"),
        ),
        Mutant(
            "bf16_faint_next_token",
            "causal",
            "future_tokens",
            _doc(FaintNextToken) + " (the model in bfloat16)",
            lambda: bfloat16(FaintNextToken()),
            lambda: bfloat16(ScratchDecoder()),
        ),
        _pooled(
            "heads_mean_over_padding",
            "padding",
            "pad_ids",
            "mean",
            "an encoder classifier averaging every slot, padded ones too",
        ),
        _pooled(
            "heads_max_over_padding",
            "padding",
            "pad_ids",
            "max",
            "an encoder embedding taking the largest value over every slot, padded ones too",
        ),
        _pooled(
            "heads_attention_over_padding",
            "padding",
            "pad_ids",
            "attention",
            "an encoder classifier whose attention pooling's softmax spans the padded slots",
        ),
        Mutant(
            "heads_first_slot_left_padded",
            "padding",
            "pooling",
            "an encoder classifier reading the first slot ([CLS]) whose tokenizer pads on the left, where the first slot is padding",
            lambda: PooledHead("bert", "first", padding_side="left"),
            lambda: PooledHead("bert", "first", padding_side="right"),
        ),
        Mutant(
            "heads_reward_last_slot",
            "padding",
            "pooling",
            "a decoder reward model scoring the last slot, which is padding in a right-padded row (a decoder has no padding side)",
            lambda: PooledHead("gpt2", "last_slot", width=None),
            lambda: PooledHead("gpt2", "last", width=None, padding_side="left"),
        ),
        Mutant(
            "heads_tagger_loss_counts_padding",
            "loss_masking",
            "reference_loss",
            "an encoder token tagger whose loss counts the -100 targets (padding, sub-word continuations) as label 0",
            lambda: TokenTagger(counts_padding=True),
            TokenTagger,
        ),
        Mutant(
            "heads_value_reads_next",
            "causal",
            "future_tokens",
            "a decoder's value head (a PPO critic) reading position t's value from position t + 1's hidden state, "
            "which has seen the next token",
            lambda: ValueHead(reads_next=True),
            ValueHead,
        ),
        Mutant(
            "hf_gemma_weights_as_llama",
            "norm_checkpoint",
            "behaviour",
            "trained Gemma weights run as Llama (same parameter names; RMSNorm w instead of 1 + w, no embedding scale, SiLU)",
            lambda: shipped_hf("hf-gemma", as_type="llama"),
            lambda: shipped_hf("hf-gemma"),
        ),
    ]
}


#: the clean models of declared attention patterns beyond causal and sliding windows, by spec:
#: a prefix LM written as a module, Llama 4 chunked in every layer and chunked then full
CLEAN_PATTERNS = (
    "module:maskcheck.reference_models.prefix_lm:PrefixLM",
    "module:maskcheck.reference_models.chunked_hf:llama4",
    "module:maskcheck.reference_models.chunked_hf:llama4_chunked_then_full",
)


def build(name: str) -> Any:
    """Build the mutant ``name`` (a fresh model each call)."""
    return _in_eval(_mutant(name).build())


def build_clean(name: str) -> Any:
    """The mutant's clean twin: the same model without the bug (what a fixed bundle replays on)."""
    return _in_eval(_mutant(name).clean())


def _in_eval(model: Any) -> Any:
    """A module in eval mode; anything else (an exported graph's adapter) as it is."""
    return model.eval() if isinstance(getattr(model, "eval", None), Callable) else model  # type: ignore[arg-type]


def _mutant(name: str) -> Mutant:
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
    mutant = MUTANTS[name]
    if mutant.missing():
        raise ImportError(mutant.missing())
    return mutant
