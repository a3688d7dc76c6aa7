"""Adapter for the project's own reference models (``ref:`` and ``mutant:`` specs)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...reference_models import (
    KVCache,
    ModelConfig,
    Transformer,
    fingerprint_ids,
    read_fingerprint,
)
from ...reference_models.checkpoint import CONFIG_KEY, FINGERPRINT_KEY, read_metadata
from ...reference_models.config import ARCHITECTURE_FIELDS, LAYOUT_VALUES
from ...reference_models.masks import positions_from_segments
from .base import (
    Adapter,
    Batch,
    Capabilities,
    CheckpointRecord,
    LayoutUnavailable,
    ServingUnsupported,
    extend,
    positions_from_mask,
)


@dataclass(frozen=True)
class ReferenceState:
    cache: KVCache
    mask: Tensor  # [B, T_so_far], 1 = real token
    next_position: Tensor  # [B]: number of real tokens so far


class ReferenceAdapter(Adapter):
    """Positions are derived from the mask (or restart per segment), as a careful user would pass them."""

    def __init__(self, model: Transformer, spec: str = "<reference model>") -> None:
        config = model.config
        parameter = next(model.parameters())
        attention = "bidirectional" if config.family == "encoder" else "causal"
        if config.sliding_window is not None:
            attention = "sliding_window"
        if config.attention_chunk is not None:
            attention = "chunked"
        if config.prefix_lm:
            attention = "prefix_lm"
        capabilities = Capabilities(
            family=config.family,
            vocab_size=config.vocab_size,
            takes_attention_mask=True,
            takes_position_ids=True,
            derives_positions_from_mask=True,
            packing="segment_ids" if config.family != "encoder_decoder" else None,
            has_cache=config.family != "encoder",
            has_loss=True,
            pad_token_id=config.pad_token_id,
            max_length=config.max_seq_len,
            attention=attention,
            window=config.sliding_window,
            attention_chunk=config.attention_chunk,
            n_layers=config.n_layers,
            norm_layout=config.norm_layout,
            position_scheme=config.position,
            device=str(parameter.device),
            dtype=str(parameter.dtype).removeprefix("torch."),
        )
        super().__init__(model, capabilities)
        self.spec = spec

    def layout(self) -> dict[str, Any]:
        config = self.model.config
        return {name: getattr(config, name) for name in ARCHITECTURE_FIELDS}

    def relayout(self, **changes: Any) -> "ReferenceAdapter":
        """The same weights in a model built with ``changes``; parameters the new layout does not
        use are ignored, and one it needs but the weights lack makes it unavailable."""
        model: Transformer = self.model
        try:
            config = model.config.replace(**changes)
        except ValueError as exc:
            raise LayoutUnavailable(str(exc)) from None
        parameter = next(model.parameters())
        other = Transformer(config)  # its random init is overwritten below: every weight is loaded, or none is used
        if (parameter.device, parameter.dtype) != (torch.device("cpu"), torch.float32):
            other = other.to(device=parameter.device, dtype=parameter.dtype)
        missing, _ = other.load_state_dict(model.state_dict(), strict=False)
        if missing:
            raise LayoutUnavailable(f"the weights have no {', '.join(missing[:3])} for {changes}")
        described = ", ".join(f"{k}={v}" for k, v in changes.items())
        relaid = ReferenceAdapter(other, f"{self.spec} as {described}")  # which puts it in eval mode
        # Same weights, same record of how they were saved and trained.
        relaid.checkpoint = self.checkpoint
        relaid.capabilities = dataclasses.replace(relaid.capabilities, trained_length=self.capabilities.trained_length)
        return relaid

    def layout_variants(self) -> Iterator[tuple[str, Adapter]]:
        """Every layout one field away from the declared one that the weights fit."""
        declared = self.layout()
        for field, values in LAYOUT_VALUES.items():
            for value in values:
                if declared[field] == value:
                    continue
                try:
                    yield f"{field}={value}", self.relayout(**{field: value})
                except LayoutUnavailable:
                    continue

    def _positions(
        self, ids: Tensor, mask: Tensor | None, explicit: Tensor | None, segments: Tensor | None
    ) -> Tensor | None:
        if explicit is not None:
            return explicit
        if segments is not None:
            return positions_from_segments(segments)
        if mask is not None:
            return positions_from_mask(mask)
        return None

    def _forward(self, batch: Batch) -> Any:
        model: Transformer = self.model
        positions = self._positions(batch.input_ids, batch.attention_mask, batch.position_ids, batch.segment_ids)
        if model.config.family != "encoder_decoder":
            prefix = batch.prefix if model.config.prefix_lm else None
            return model(batch.input_ids, batch.attention_mask, positions, batch.segment_ids, prefix_mask=prefix)
        decoder_positions = None
        if batch.decoder_attention_mask is not None:
            decoder_positions = positions_from_mask(batch.decoder_attention_mask)
        return model(
            batch.input_ids,
            batch.attention_mask,
            positions,
            decoder_input_ids=batch.decoder_input_ids,
            decoder_attention_mask=batch.decoder_attention_mask,
            decoder_position_ids=decoder_positions,
        )

    def _logits(self, batch: Batch) -> Tensor:
        return self._forward(batch).logits

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        return self.model.loss(self._forward(batch).logits, labels)

    def _prefill(self, batch: Batch, rollback: bool = False) -> tuple[Tensor, ReferenceState]:
        out = self._forward(batch)
        mask = batch.predicted_mask
        if mask is None:
            mask = torch.ones_like(batch.predicted_ids)
        return out.logits, ReferenceState(out.cache, mask, mask.long().sum(-1))

    def _step(
        self, state: ReferenceState, tokens: Tensor, attention_mask: Tensor | None
    ) -> tuple[Tensor, ReferenceState]:
        full_mask, positions, next_position = extend(state.mask, state.next_position, attention_mask, tokens.shape[1])
        model: Transformer = self.model
        if model.config.family == "encoder_decoder":
            out = model(
                None,
                decoder_input_ids=tokens,
                decoder_attention_mask=full_mask,
                decoder_position_ids=positions,
                cache=state.cache,
            )
        else:
            out = model(tokens, full_mask, positions, cache=state.cache)
        return out.logits, ReferenceState(out.cache, full_mask, next_position)

    # -- serving: the KVCache is immutable, so every operation makes a new one -----------------

    def _rollback(self, state: ReferenceState, tokens: int) -> ReferenceState:
        dropped = state.mask[:, -tokens:].long().sum(-1)  # [B]: real tokens rolled back
        return ReferenceState(state.cache.without_last(tokens), state.mask[:, :-tokens], state.next_position - dropped)

    def _rearrange(self, state: ReferenceState, operation: str, index: Tensor) -> ReferenceState:
        index = index.to(state.mask.device)
        return ReferenceState(state.cache.rows(index), state.mask[index], state.next_position[index])

    def _reuse(self, state: ReferenceState, batch: Batch) -> tuple[Tensor, ReferenceState]:
        raise ServingUnsupported(
            "the reference model's KVCache is immutable: a prefill makes a new one, "
            "so no cache object outlives a request to be reused"
        )


def checkpoint_record(path: str, saved: ModelConfig) -> CheckpointRecord:
    """The layout, fingerprint and other metadata a reference checkpoint recorded when it was saved."""
    layout = {name: getattr(saved, name) for name in ARCHITECTURE_FIELDS}
    metadata = {k: v for k, v in read_metadata(path).items() if k not in (CONFIG_KEY, FINGERPRINT_KEY)}
    fingerprint = read_fingerprint(path)
    if fingerprint is None:
        return CheckpointRecord(path, layout, metadata=metadata)
    ids = fingerprint_ids(saved)
    probe = Batch(ids, decoder_input_ids=ids if saved.family == "encoder_decoder" else None)
    return CheckpointRecord(path, layout, probe, fingerprint.logprobs, metadata)


def trained_length(record: CheckpointRecord) -> int | None:
    """The sequence length the checkpoint's recorded training run used, if it recorded one."""
    try:
        return int(json.loads(record.metadata["maskcheck.training"])["length"])
    except (KeyError, ValueError, TypeError):
        return None
