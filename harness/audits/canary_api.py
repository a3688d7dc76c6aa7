"""What users hand the leak canary (harness/audits/canary.py), and the entry point for
their tests: a training step, a transformers or TRL trainer, or a model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .canary import Batch, CanaryError, CanaryResult, CanarySettings, Step, logits_of, run_canary
from .canary_trainers import trainer_canary


def model_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
    inputs: Callable[[Batch], dict[str, Any]] | None = None,
) -> Step:
    """The textbook step for ``model``: ``inputs(batch)`` as its keywords (default: a Hugging
    Face causal LM's, ``input_ids``, ``attention_mask``, ``labels``), its own loss (or
    ``loss(logits, labels)``), backward, an AdamW step (or ``optimizer``'s). Returns the loss
    and the logits, so the reference loss is computed too."""
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=3e-3)
    keywords = inputs or (
        lambda b: {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": b["labels"]}
    )

    def step(batch: Batch) -> tuple[Tensor, Tensor]:
        model.train()
        output = model(**keywords(batch))
        logits = logits_of(output)
        value = loss(logits, batch["labels"]) if loss is not None else output.loss
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        return value.detach(), logits.detach()

    return step


def resolve_pipeline(pipeline: Any, default_canary: str = "uniform") -> tuple[Callable[..., CanaryResult], str]:
    """``(run, canary)`` for what a user hands over: a step function ``step(batch)``, a
    hand-written loop's ``step(model, batch)`` with its model as ``(step, model)``, a
    transformers ``Trainer`` (TRL's ``SFTTrainer`` included), a model (trained with
    :func:`model_step`), or any of them paired with its canary, ``(pipeline, canary)``;
    ``run`` takes ``(canary, settings, seed)``."""
    if isinstance(pipeline, tuple) and len(pipeline) == 2 and isinstance(pipeline[1], str):
        run, _ = resolve_pipeline(pipeline[0])
        return run, pipeline[1]
    if isinstance(pipeline, tuple) and len(pipeline) == 2 and isinstance(pipeline[1], torch.nn.Module):
        step, model = pipeline
        return (lambda c, s, seed: run_canary(lambda batch: step(model, batch), c, s, seed)), default_canary
    from transformers import Trainer

    if isinstance(pipeline, Trainer):
        return (lambda c, s, seed: trainer_canary(pipeline, c, s, seed)), default_canary
    if isinstance(pipeline, torch.nn.Module):
        return (lambda c, s, seed: run_canary(model_step(pipeline), c, s, seed)), default_canary
    if callable(pipeline):
        return (lambda c, s, seed: run_canary(pipeline, c, s, seed)), default_canary
    raise CanaryError(
        "a canary runs a training step (or a (step, model) pair), a transformers Trainer or a model, "
        "or one of them paired with its canary; "
        f"got {type(pipeline).__name__}"
    )


class CanaryFired(AssertionError):
    """What :func:`assert_no_leak` raises: the verdict as its message, the whole result as
    ``.result``."""

    def __init__(self, result: CanaryResult) -> None:
        message = "\n".join([result.message, *(f"measured: {note}" for note in result.notes)])
        super().__init__(message)
        self.result = result


def assert_no_leak(
    pipeline: Any, canary: str | None = None, settings: CanarySettings | None = None, seed: int = 0
) -> CanaryResult:
    """For a test: run the canary on ``pipeline`` (see :func:`resolve_pipeline`) and raise
    :class:`CanaryFired`, an ``AssertionError`` with the verdict, unless it passes (a loss
    computed wrongly, or a pipeline that did not train enough to show a leak, raise too);
    the result otherwise."""
    run, own = resolve_pipeline(pipeline)
    result = run(canary or own, settings, seed)
    if result.status != "pass":
        raise CanaryFired(result)
    return result
