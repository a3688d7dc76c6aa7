"""A sentence-transformers ``SentenceTransformer`` as users build and load it, audited whole.

Its forward takes a features dict (``input_ids``, ``attention_mask``, ...) and returns it
with ``sentence_embedding`` added, after its modules (a Transformer, a Pooling, perhaps a
Normalize) ran in order. :class:`SentenceTransformerCall` gives it the module protocol's
call (``input_ids`` first, the mask by name) and nothing else: the pooling, the
normalisation and the transformer underneath are the user's, and the embedding audited is
the one ``encode()`` returns. What the module protocol asks to be declared is read off the
first module's transformers model and the tokenizer: the family (an encoder unless its type
has a causal LM and no masked LM, as for a classifier), vocabulary, pad and EOS ids, padding
side, longest input, and whether it takes position ids (the Transformer module passes every
feature its model's forward accepts).

sentence-transformers is imported only where the model handed in is one of its classes.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor, nn

from .base import Capabilities, ForwardKeywords
from .hf_loading import family_of


def is_sentence_transformer(model: Any) -> bool:
    if "sentence_transformers" not in sys.modules:
        return False
    from sentence_transformers import SentenceTransformer

    return isinstance(model, SentenceTransformer)


class SentenceTransformerCall(nn.Module):
    """``model`` called as a plain module: ``forward(input_ids, attention_mask=None,
    position_ids=None) -> the features dict``, whose ``sentence_embedding [B, D]`` is read."""

    maskcheck_output_name = "sentence_embedding"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        backbone = first_transformer(model)
        tokenizer = getattr(model, "tokenizer", None)
        config = backbone.config
        self.maskcheck_embedding = backbone.get_input_embeddings()
        self.maskcheck_capabilities = Capabilities(
            family=family_of(config, "feature-extraction", backbone),  # type: ignore[arg-type]
            vocab_size=int(config.vocab_size),
            takes_position_ids=ForwardKeywords.of(backbone).named("position_ids"),
            pad_token_id=_first(getattr(tokenizer, "pad_token_id", None), getattr(config, "pad_token_id", None)),
            eos_token_id=_first(getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)),
            padding_side=getattr(tokenizer, "padding_side", None),
            max_length=getattr(model, "max_seq_length", None) or getattr(config, "max_position_embeddings", None),
            tokenizer=tokenizer,
            device=str(next(model.parameters()).device),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        )

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> dict[str, Tensor]:
        features = {
            "input_ids": input_ids,
            # The pooling reads the mask: a call without one is a call whose every token is real.
            "attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask,
        }
        if position_ids is not None:
            features["position_ids"] = position_ids
        return self.model(features)


def first_transformer(model: Any) -> Any:
    """The transformers model of the first module that holds one (``Transformer.model``)."""
    for module in model:
        inner = getattr(module, "model", None) or getattr(module, "auto_model", None)
        if inner is not None and hasattr(inner, "config"):
            return inner
    raise ValueError("the SentenceTransformer holds no transformers model (a Transformer module) to audit")


def _first(*values: Any) -> int | None:
    return next((v for v in values if isinstance(v, int)), None)
