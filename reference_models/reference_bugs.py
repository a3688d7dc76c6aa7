"""The seeded bugs of the reference models: each class overrides one method of a correct
one with a deliberate mistake (reference_models/mutants.py names each and says which
check must catch it)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ModelConfig
from .masks import build_attention_mask, sequence_ordinals
from .model import IGNORE_INDEX, Block, ModelOutput, Stack, Transformer

DECODER = ModelConfig()
LEARNED = ModelConfig(position="learned")
ENCODER = ModelConfig(family="encoder", position="learned")
ENCODER_DECODER = ModelConfig(family="encoder_decoder", position="sinusoidal")
SLIDING = ModelConfig(sliding_window=3, n_layers=2)
CHUNKED = ModelConfig(attention_chunk=4, n_layers=2)


def seeded_reference(config: ModelConfig, **swaps: type) -> Transformer:
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


class ReadsRowLength(Stack):
    """A length scale taken from the whole row instead of each position's own prefix: the
    input embeddings are multiplied by log(1 + n) / log(16), n the row's real tokens (log-n
    scaling as long-context models apply it, computed once per row), so every position
    reads how many tokens follow it while no later token's value moves it."""

    def embed_tokens(
        self, input_ids: Tensor, positions: Tensor, real: Tensor, segments: Tensor | None, cache: Any
    ) -> tuple[Tensor, Tensor]:
        x, kept = super().embed_tokens(input_ids, positions, real, segments, cache)
        count = real.sum(dim=-1).to(x.dtype)  # [B]: the row's real tokens, the cache's too
        return x * (count.log1p() / math.log(16))[:, None, None], kept


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


#: the label smoothing of the smoothed losses below (fairseq's and many MT recipes' default)
SMOOTHING = 0.1


class LossSmoothed(Transformer):
    """A correct label-smoothed cross-entropy (PyTorch's ``label_smoothing``): not a bug, the
    clean twin of :class:`LossSmoothingCountsIgnored`."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.config.family == "decoder":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            label_smoothing=SMOOTHING,
        )


class LossSmoothingCountsIgnored(Transformer):
    """A hand-written label-smoothed loss whose smoothing term averages over every position,
    the ignored (-100) targets and padding included."""

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.config.family == "decoder":
            logits, labels = logits[:, :-1], labels[:, 1:]
        flat = logits.reshape(-1, logits.shape[-1]).float()  # [N, V]
        nll = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX)
        uniform = -torch.log_softmax(flat, -1).mean(-1).mean()  # over all N positions: the bug
        return (1 - SMOOTHING) * nll + SMOOTHING * uniform


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
        prefix: Tensor | None = None,
    ) -> Any:
        if segments is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return super().forward(input_ids, real, positions, segments, cache, cross, prefix)


class SegmentBoundaryOffByOne(Stack):
    """Segment ids are read one token late (cu_seqlens off by one): the last token of each
    packed sequence is grouped with the next one and attends to it."""

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        if segments is not None:
            segments = torch.cat([segments[:, 1:], segments[:, -1:]], dim=1)  # [B, T]
        return super().build_mask(q_index, k_index, real, segments, batch)


class ChunkBoundaryOffByOne(Stack):
    """Chunks start one token late (a 1-based index divided by the chunk width): the last
    token of each chunk is grouped with the next chunk and reads it, and not its own."""

    def chunk_ids(self, real: Tensor, segments: Tensor | None) -> Tensor | None:
        assert self.config.attention_chunk is not None
        return (sequence_ordinals(real, segments) + 1) // self.config.attention_chunk


class ChunksAcrossPackedSequences(Stack):
    """Chunks counted from the packed row's first token, not from each packed sequence's:
    a sequence packed after another splits into chunks at other places than alone."""

    def chunk_ids(self, real: Tensor, segments: Tensor | None) -> Tensor | None:
        assert self.config.attention_chunk is not None
        return sequence_ordinals(real) // self.config.attention_chunk


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
        prefix: Tensor | None = None,
    ) -> Any:
        if cache is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return super().forward(input_ids, real, positions, segments, cache, cross, prefix)


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
            attention_mask = torch.cat([cache.real.to(fresh.dtype), fresh], dim=1)  # [B, T_cache + T]
        out = super().forward(input_ids, attention_mask, position_ids, segment_ids, cache, **kwargs)
        past = 0 if cache is None else cache.length
        assert out.cache is not None

        def twice(t: Tensor, dim: int) -> Tensor:
            return torch.cat([t, t.narrow(dim, past, t.shape[dim] - past)], dim=dim)

        out.cache = replace(
            out.cache,
            keys=tuple(twice(k, 2) for k in out.cache.keys),
            values=tuple(twice(v, 2) for v in out.cache.values),
            real=twice(out.cache.real, 1),
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


def cross_from_decoder_states() -> Transformer:
    model = seeded_reference(ENCODER_DECODER)
    assert model.decoder is not None
    for block in model.decoder.blocks:
        block.__class__ = CrossFromDecoderStates
    return model
