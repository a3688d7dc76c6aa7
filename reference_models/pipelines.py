"""Training pipelines for the leak canary: clean ones, and one per seeded pipeline bug.

Each is a factory returning ``(step, canary)``: the training step the canary drives
(``harness/audits/canary.py``) and the canary that must see its bug. The models are the
repository's tiny ones with fixed seeds, so a pipeline trains the same on every CPU.

The bugs live where a whole pipeline hides them from unit checks: the model's mask (the
catalogue's causal off-by-one), the model's own loss (no shift), the step (it scores each
position's own token), the collator (decoder inputs that are the labels) and the packing
(documents packed back to back, attending to each other).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ModelConfig
from .model import IGNORE_INDEX, Transformer

Batch = dict[str, Tensor]
LEARNING_RATE = 3e-3


def _adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)


def _reference(name: str | None = None, seed: int = 0) -> Transformer:
    """The tiny reference decoder, or catalogue mutant ``name`` (the same weights' seed)."""
    from .mutants import build, build_clean

    torch.manual_seed(seed)
    return build(name) if name else build_clean("causal_sees_next_token")


def decoder_step(model: Transformer, shift: bool = True, own_loss: bool = False) -> Callable[[Batch], Any]:
    """A hand-written step of a decoder: cross-entropy of ``logits[t]`` against ``labels[t + 1]``
    (``shift=False``: ``labels[t]``, the bug of a step that scores its inputs), or the model's
    own ``loss``; AdamW. Returns the loss and the logits."""
    optimizer = _adamw(model)

    def step(batch: Batch) -> tuple[Tensor, Tensor]:
        model.train()
        logits = model(batch["input_ids"], batch["attention_mask"]).logits  # [B, T, V]
        if own_loss:
            loss = model.loss(logits, batch["labels"])
        else:
            scores, targets = (logits[:, :-1], batch["labels"][:, 1:]) if shift else (logits, batch["labels"])
            loss = F.cross_entropy(scores.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), logits.detach()

    return step


def clean_decoder() -> tuple[Callable[[Batch], Any], str]:
    return decoder_step(_reference()), "uniform"


def causal_off_by_one() -> tuple[Callable[[Batch], Any], str]:
    """The catalogue's decoder whose causal mask lets position t read t + 1, trained correctly."""
    return decoder_step(_reference("causal_sees_next_token")), "uniform"


def loss_without_shift() -> tuple[Callable[[Batch], Any], str]:
    """The catalogue's decoder whose own loss scores ``logits[t]`` against ``labels[t]``."""
    return decoder_step(_reference("loss_without_shift"), own_loss=True), "uniform"


def step_scores_inputs() -> tuple[Callable[[Batch], Any], str]:
    """A correct decoder whose training step scores each position's own input token."""
    return decoder_step(_reference(), shift=False), "uniform"


def seq2seq_step(labels_as_decoder_inputs: bool) -> Callable[[Batch], Any]:
    """The tiny reference encoder-decoder trained to emit the batch's ids as its target
    (from a source of other random ids): the collator makes the decoder inputs the labels
    shifted right behind a start token, or (the bug) the labels themselves."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(family="encoder_decoder", position="sinusoidal"))
    optimizer = _adamw(model)
    start = model.config.pad_token_id

    def step(batch: Batch) -> Tensor:
        model.train()
        labels = batch["labels"]
        source = labels.roll(1, dims=0)  # another row's ids: says nothing of this row's target
        if labels_as_decoder_inputs:
            decoder_inputs = labels
        else:
            decoder_inputs = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
        logits = model(
            source,
            torch.ones_like(source),
            decoder_input_ids=decoder_inputs,
            decoder_attention_mask=torch.ones_like(decoder_inputs),
        ).logits
        loss = model.loss(logits, labels)  # encoder-decoders score logits[t] against labels[t]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def clean_seq2seq() -> tuple[Callable[[Batch], Any], str]:
    return seq2seq_step(False), "uniform"


def decoder_inputs_are_labels() -> tuple[Callable[[Batch], Any], str]:
    """A seq2seq collator that gives the decoder the labels as its inputs, unshifted."""
    return seq2seq_step(True), "uniform"


def packed_llama_step(isolated: bool, use_cache: bool | None = False) -> Callable[[Batch], Any]:
    """A tiny Llama trained on packed rows of two documents each, padding-free: position
    ids restarting at each document and no attention mask (what transformers' flattening
    collator passes), ``use_cache`` as given (None: not passed, the config's default); or
    (``isolated=False``, the bug) packed back to back with an attention mask of ones."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    optimizer = _adamw(model)

    def step(batch: Batch) -> tuple[Tensor, Tensor]:
        model.train()
        inputs: dict[str, Any] = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
        if isolated:
            inputs["position_ids"] = batch["position_ids"]
            if use_cache is not None:
                inputs["use_cache"] = use_cache
        else:
            inputs["attention_mask"] = batch["attention_mask"]
        output = model(**inputs)
        optimizer.zero_grad()
        output.loss.backward()
        optimizer.step()
        return output.loss.detach(), output.logits.detach()

    return step


def clean_packing() -> tuple[Callable[[Batch], Any], str]:
    return packed_llama_step(isolated=True), "twin_documents"


def packing_across_documents() -> tuple[Callable[[Batch], Any], str]:
    """Documents packed back to back with a mask of ones: each reads the one before it."""
    return packed_llama_step(isolated=False), "twin_documents"


def padding_free_with_default_cache() -> tuple[Callable[[Batch], Any], str]:
    """Padding-free packing (position ids restarting, no mask) with ``use_cache`` left at the
    config's default: on transformers 5.24 the forward then makes a cache, and packed
    documents are found from position ids only without one (docs/canary.md)."""
    return packed_llama_step(isolated=True, use_cache=None), "twin_documents"


#: name -> (factory, leaks): the canary must fire on each leaking pipeline, never on a clean one
PIPELINES: dict[str, tuple[Callable[[], tuple[Callable[[Batch], Any], str]], bool]] = {
    "clean_decoder": (clean_decoder, False),
    "clean_seq2seq": (clean_seq2seq, False),
    "clean_packing": (clean_packing, False),
    "causal_off_by_one": (causal_off_by_one, True),
    "loss_without_shift": (loss_without_shift, True),
    "step_scores_inputs": (step_scores_inputs, True),
    "decoder_inputs_are_labels": (decoder_inputs_are_labels, True),
    "packing_across_documents": (packing_across_documents, True),
    "padding_free_with_default_cache": (padding_free_with_default_cache, True),
}
