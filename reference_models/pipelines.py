"""Training pipelines for the leak canary: clean ones, and one per seeded pipeline bug.

Each is a factory returning ``(pipeline, canary)``: what the canary drives (a training
step, a model, a transformers ``Trainer`` or TRL's ``SFTTrainer``; harness/audits/) and the
canary that must see its bug. The models are the repository's tiny ones with fixed seeds,
so a pipeline trains the same on every CPU.

The bugs live where a whole pipeline hides them from unit checks: the model's mask (the
catalogue's causal off-by-one), the model's own loss (no shift), the step (it scores each
position's own token), the collator (decoder inputs that are the labels) and the packing
(documents packed back to back, attending to each other; TRL's wrapped packing).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
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
    """The tiny reference decoder, a hand-written step."""
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
    """The tiny reference encoder-decoder, its decoder inputs the labels shifted right."""
    return seq2seq_step(False), "uniform"


def decoder_inputs_are_labels() -> tuple[Callable[[Batch], Any], str]:
    """A seq2seq collator that gives the decoder the labels as its inputs, unshifted."""
    return seq2seq_step(True), "uniform"


def _tiny_llama(vocab_size: int = 32) -> torch.nn.Module:
    """The canary's tiny Llama, seed 0 (a pad id of 0, below the canary's ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


def packed_llama_step(isolated: bool, use_cache: bool | None = False) -> Callable[[Batch], Any]:
    """A tiny Llama trained on packed rows of two documents each, padding-free: position
    ids restarting at each document and no attention mask (what transformers' flattening
    collator passes), ``use_cache`` as given (None: not passed, the config's default); or
    (``isolated=False``, the bug) packed back to back with an attention mask of ones."""
    model = _tiny_llama()
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
    """A tiny Llama trained padding-free (position ids restarting, no mask, ``use_cache=False``)."""
    return packed_llama_step(isolated=True), "twin_documents"


def packing_across_documents() -> tuple[Callable[[Batch], Any], str]:
    """Documents packed back to back with a mask of ones: each reads the one before it."""
    return packed_llama_step(isolated=False), "twin_documents"


def padding_free_with_default_cache() -> tuple[Callable[[Batch], Any], str]:
    """Padding-free packing (position ids restarting, no mask) with ``use_cache`` left at the
    config's default: on transformers 5.24 the forward then makes a cache, and packed
    documents are found from position ids only without one (docs/canary.md)."""
    return packed_llama_step(isolated=True, use_cache=None), "twin_documents"


def hf_causal_lm(model_type: str) -> tuple[Any, str]:
    """A tiny Hugging Face causal LM of ``model_type`` (reference_models/hf_tiny.py), handed
    to the canary as a model: trained on its own loss, the textbook step."""
    from .hf_tiny import tiny_model

    return tiny_model(model_type).train(), "uniform"


def scratch_directory() -> str:
    """A trainer's ``output_dir``, removed when the process exits: the canary saves nothing
    there (``save_strategy="no"``), but the arguments need a directory, and a run must leave
    no folders behind in the system's temporary directory."""
    path = tempfile.mkdtemp(prefix="maskcheck-canary-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def clean_hf_gpt2() -> tuple[Any, str]:
    """A tiny GPT-2, trained on its own loss."""
    return hf_causal_lm("gpt2")


def clean_hf_qwen2() -> tuple[Any, str]:
    """A tiny Qwen2, trained on its own loss."""
    return hf_causal_lm("qwen2")


def clean_hf_mistral() -> tuple[Any, str]:
    """A tiny Mistral (a sliding window of 4 tokens), trained on its own loss."""
    return hf_causal_lm("mistral")


def clean_trainer() -> tuple[Any, str]:
    """A transformers ``Trainer`` on a tiny Llama with the default collator."""
    from transformers import Trainer, TrainingArguments, default_data_collator

    arguments = TrainingArguments(
        output_dir=scratch_directory(),
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        use_cpu=True,
        disable_tqdm=True,
        report_to=[],
        seed=0,
    )
    return Trainer(model=_tiny_llama(), args=arguments, data_collator=default_data_collator), "uniform"


def sft_trainer(packing: bool, packing_strategy: str = "bfd") -> Any:
    """TRL's ``SFTTrainer`` on a tiny Llama, configured as users configure it: no packing
    (each example its own padded row), or ``packing=True`` with ``packing_strategy`` (TRL's
    default ``bfd``: best-fit decreasing into rows of ``max_length``, padding-free; or
    ``wrapped``: documents back to back, which lets them read each other by design)."""
    try:
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        raise ImportError("the SFTTrainer pipelines need TRL: pip install 'maskcheck[trl]'") from exc
    import datasets

    from .hf_tiny import tiny_tokenizer

    arguments = SFTConfig(
        output_dir=scratch_directory(),
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",  # as the step pipelines train: a decay to 0 over the steps halves what they learn
        max_length=32,
        packing=packing,
        packing_strategy=packing_strategy,
        use_cpu=True,
        disable_tqdm=True,
        report_to=[],
        seed=0,
    )
    users_data = datasets.Dataset.from_dict({"input_ids": [list(range(4, 20))] * 16})  # the canary brings its own
    return SFTTrainer(
        model=_tiny_llama(vocab_size=40), args=arguments, train_dataset=users_data, processing_class=tiny_tokenizer()
    )


def sft_not_packed() -> tuple[Any, str]:
    """TRL's ``SFTTrainer`` without packing: each document its own padded row."""
    return sft_trainer(packing=False), "uniform"


def sft_padding_free() -> tuple[Any, str]:
    """TRL's ``SFTTrainer`` with ``packing=True``: best-fit decreasing, padding-free."""
    return sft_trainer(packing=True), "twin_documents"


def sft_wrapped_packing() -> tuple[Any, str]:
    """TRL's wrapped packing: documents concatenated and cut into rows with no boundary the
    model is told of, so a document reads the ones before it in its row."""
    return sft_trainer(packing=True, packing_strategy="wrapped"), "twin_documents"


#: name -> (factory, leaks): the canary must fire on each leaking pipeline, never on a clean one
PIPELINES: dict[str, tuple[Callable[[], tuple[Any, str]], bool]] = {
    "clean_decoder": (clean_decoder, False),
    "clean_seq2seq": (clean_seq2seq, False),
    "clean_packing": (clean_packing, False),
    "causal_off_by_one": (causal_off_by_one, True),
    "loss_without_shift": (loss_without_shift, True),
    "step_scores_inputs": (step_scores_inputs, True),
    "decoder_inputs_are_labels": (decoder_inputs_are_labels, True),
    "packing_across_documents": (packing_across_documents, True),
    "padding_free_with_default_cache": (padding_free_with_default_cache, True),
    "clean_hf_gpt2": (clean_hf_gpt2, False),
    "clean_hf_qwen2": (clean_hf_qwen2, False),
    "clean_hf_mistral": (clean_hf_mistral, False),
    "clean_trainer": (clean_trainer, False),
    "sft_not_packed": (sft_not_packed, False),
    "sft_padding_free": (sft_padding_free, False),
    "sft_wrapped_packing": (sft_wrapped_packing, True),
}
#: pipelines that need an optional extra, and the module it installs
NEEDS = {"sft_not_packed": "trl", "sft_padding_free": "trl", "sft_wrapped_packing": "trl"}
