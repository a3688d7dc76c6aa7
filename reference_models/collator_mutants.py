"""Seeded collator bugs: each collate function here has one deliberate mistake.

Each is named after what it gets wrong and records the task and the check of
:mod:`maskcheck.suites.collator` that must catch it. They wrap transformers' own collators
(with the word-level tokenizer of :func:`.hf_tiny.tiny_tokenizer`), so the mistake is the
only difference from a collator that passes. Audit one with
``maskcheck audit collator:maskcheck.reference_models.collator_mutants:NAME --task TASK``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .hf_tiny import tiny_tokenizer

IGNORE_INDEX = -100


@dataclass(frozen=True)
class CollatorMutant:
    name: str
    task: str
    check: str
    description: str


def _padded(features: list[dict[str, Any]], pad_is_eos: bool = False) -> tuple[Any, dict[str, torch.Tensor]]:
    tokenizer = tiny_tokenizer(pad_is_eos=pad_is_eos)
    return tokenizer, dict(tokenizer.pad([{"input_ids": f["input_ids"]} for f in features], return_tensors="pt"))


def _with_tokenizer(
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]], pad_is_eos: bool = False
) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    collate.tokenizer = tiny_tokenizer(pad_is_eos=pad_is_eos)  # type: ignore[attr-defined]  # the ids maskcheck draws from
    return collate


def masks_every_eos() -> Any:
    """Labels set to -100 wherever the pad id is, with pad = EOS: every real EOS loses its label."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        tokenizer, batch = _padded(features, pad_is_eos=True)
        batch["labels"] = batch["input_ids"].masked_fill(batch["input_ids"] == tokenizer.pad_token_id, IGNORE_INDEX)
        return batch

    return _with_tokenizer(collate, pad_is_eos=True)


def pads_labels_with_pad_id() -> Any:
    """Labels copied from input_ids, padding included."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        _, batch = _padded(features)
        batch["labels"] = batch["input_ids"].clone()
        return batch

    return _with_tokenizer(collate)


def mask_marks_padding_real() -> Any:
    """An attention mask of ones: padding is attended to as if it were text."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        _, batch = _padded(features)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        return batch

    return _with_tokenizer(collate)


def labels_preshifted() -> Any:
    """Labels shifted one position left by the collator, for a model that shifts them again."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        _, batch = _padded(features)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        batch["labels"] = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        return batch

    return _with_tokenizer(collate)


def _flattened(features: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    ids = [token for f in features for token in f["input_ids"]]
    starts, total = [], 0
    for f in features:
        if f["input_ids"]:
            starts.append(total)
            total += len(f["input_ids"])
    return ids, starts


def positions_not_restarted() -> Any:
    """Packing whose position ids run on across examples: the model sees one long sequence."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, starts = _flattened(features)
        labels = [IGNORE_INDEX if t in starts else token for t, token in enumerate(ids)]
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.arange(len(ids))[None],
        }

    return _with_tokenizer(collate)


def boundary_label_kept() -> Any:
    """Packing that keeps every label: each example's first token is trained to follow the previous example."""

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, starts = _flattened(features)
        positions = [t - max(s for s in starts if s <= t) for t in range(len(ids))]
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([ids]),
            "position_ids": torch.tensor([positions]),
        }

    return _with_tokenizer(collate)


def seq2seq_labels_padded_with_pad_id() -> Any:
    """Seq2seq labels padded with the pad id instead of -100."""
    from transformers import DataCollatorForSeq2Seq

    tokenizer = tiny_tokenizer()
    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=tokenizer.pad_token_id)


def decoder_inputs_not_shifted() -> Any:
    """Seq2seq decoder inputs equal to the labels: each target token is fed while it is predicted."""
    from transformers import DataCollatorForSeq2Seq

    inner = DataCollatorForSeq2Seq(tiny_tokenizer(), label_pad_token_id=IGNORE_INDEX)

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = dict(inner(features))
        batch["decoder_input_ids"] = batch["labels"].masked_fill(
            batch["labels"] == IGNORE_INDEX, inner.tokenizer.pad_token_id
        )
        return batch

    collate.tokenizer = inner.tokenizer  # type: ignore[attr-defined]
    return collate


COLLATOR_MUTANTS: dict[str, CollatorMutant] = {
    m.name: m
    for m in [
        CollatorMutant(
            "masks_every_eos",
            "causal-lm",
            "target_labels",
            "pad id = EOS id, labels masked by the pad id: every real EOS loses its label",
        ),
        CollatorMutant(
            "pads_labels_with_pad_id", "causal-lm", "padding_labels", "labels copied from input_ids, padding included"
        ),
        CollatorMutant(
            "mask_marks_padding_real", "causal-lm", "attention_mask", "an attention mask of ones over padded rows"
        ),
        CollatorMutant(
            "labels_preshifted",
            "causal-lm",
            "target_labels",
            "labels shifted left by the collator and again by the model",
        ),
        CollatorMutant(
            "positions_not_restarted", "packed", "positions_restart", "packed position ids that run on across examples"
        ),
        CollatorMutant(
            "boundary_label_kept", "packed", "boundary_labels", "packed labels that keep each example's first token"
        ),
        CollatorMutant(
            "seq2seq_labels_padded_with_pad_id", "seq2seq", "label_padding", "seq2seq labels padded with the pad id"
        ),
        CollatorMutant(
            "decoder_inputs_not_shifted",
            "seq2seq",
            "decoder_inputs",
            "decoder_input_ids equal to the labels, not shifted right",
        ),
    ]
}
