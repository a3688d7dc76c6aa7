"""Collator factories for ``maskcheck audit collator:examples.collators:NAME --task ...``.

transformers' own collators, configured as their documentation says and in the ways users
misconfigure them, with a word-level tokenizer built on the spot (no download). Run from the
repository root:

    maskcheck audit collator:examples.collators:language_modeling --task causal-lm   # passes
    maskcheck audit collator:examples.collators:pad_is_eos --task causal-lm          # fails: every EOS masked
    maskcheck audit collator:examples.collators:flattening --task packed             # passes
    maskcheck audit collator:examples.collators:seq2seq --task seq2seq               # passes
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorWithFlattening,
)

from maskcheck.reference_models.hf_tiny import tiny_tokenizer


def language_modeling() -> Any:
    """Causal-LM collation as documented: mlm=False, a pad token distinct from EOS."""
    return DataCollatorForLanguageModeling(tiny_tokenizer(), mlm=False)


def pad_is_eos() -> Any:
    """The common set-up for a tokenizer without a pad token (tokenizer.pad_token = tokenizer.eos_token):
    the collator sets labels to -100 wherever the pad id is, which is every real EOS too."""
    return DataCollatorForLanguageModeling(tiny_tokenizer(pad_is_eos=True), mlm=False)


def flattening() -> Any:
    """Padding-free packing: examples flattened into one row, position ids restarting, -100 at each boundary."""
    return DataCollatorWithFlattening()


def seq2seq() -> Any:
    """Seq2seq collation as documented: labels padded with -100."""
    return DataCollatorForSeq2Seq(tiny_tokenizer(), label_pad_token_id=-100)


def seq2seq_labels_padded_with_pad_id() -> Any:
    """Seq2seq collation with label_pad_token_id set to the pad id: the loss trains on padding."""
    tokenizer = tiny_tokenizer()
    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=tokenizer.pad_token_id)


def labels_are_input_ids() -> Any:
    """A hand-written collator that pads and copies input_ids to labels, padding included."""
    tokenizer = tiny_tokenizer()

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = tokenizer.pad([{"input_ids": f["input_ids"]} for f in features], return_tensors="pt")
        batch["labels"] = batch["input_ids"].clone()
        return dict(batch)

    collate.tokenizer = tokenizer  # type: ignore[attr-defined]  # how maskcheck learns the pad and EOS ids
    return collate
