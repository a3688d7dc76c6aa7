"""Train small reference models on synthetic tasks, on a CPU, in seconds.

Tests and scripts need models whose weights carry signal (a random-init model cannot tell
a right layout from a wrong one, or retrieve a needle). Each task is a function that draws
a batch from a ``torch.Generator``; :func:`train` runs AdamW on the model's own causal-LM
loss, so every run is reproducible from its seed.

Tasks
- ``copy_spans``: random tokens in which spans of earlier tokens recur later, as names and
  phrases recur in text; predicting a recurring span is what induction heads learn.
- ``kv_retrieval``: key-value pairs hidden in filler, then a question; only the answer is
  labelled (:mod:`maskcheck.reference_models.retrieval`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .config import ModelConfig
from .model import IGNORE_INDEX, Transformer
from .retrieval import retrieval_batch

Task = Callable[[torch.Generator, ModelConfig], tuple[Tensor, Tensor]]  # -> (input_ids, labels), each [B, T]


@dataclass(frozen=True)
class TrainingRun:
    config: ModelConfig
    task: str
    steps: int
    seed: int
    batch_size: int = 32
    length: int = 32
    lr: float = 3e-3
    schedule: str = "constant"  # or "cosine": linear warm-up over 5% of the steps, then cosine decay to 0


def copy_spans(
    generator: torch.Generator, config: ModelConfig, batch_size: int = 32, length: int = 32
) -> tuple[Tensor, Tensor]:
    """Random ids (never the pad id) where a span of 4..length/2 tokens recurs later in the row."""
    low = 1 if config.pad_token_id == 0 else 0
    ids = torch.randint(low, config.vocab_size, (batch_size, length), generator=generator)
    ids = torch.where(ids == config.pad_token_id, (ids + 1) % config.vocab_size, ids)
    for row in range(batch_size):
        span = int(torch.randint(4, max(5, length // 2 + 1), (1,), generator=generator))
        source = int(torch.randint(0, length // 2 - span + 1, (1,), generator=generator))
        target = int(torch.randint(source + span, length - span + 1, (1,), generator=generator))
        ids[row, target : target + span] = ids[row, source : source + span]
    return ids, ids.clone()


TASKS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {"copy_spans": copy_spans, "kv_retrieval": retrieval_batch}


def learning_rate_factor(run: TrainingRun, step: int) -> float:
    if run.schedule == "constant":
        return 1.0
    if run.schedule != "cosine":
        raise ValueError(f"unknown schedule {run.schedule!r}; choose constant or cosine")
    warmup = max(1, run.steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, run.steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train(run: TrainingRun, log: Callable[[int, float], None] | None = None) -> Transformer:
    """Train a fresh model as ``run`` describes; returns it in eval mode."""
    torch.manual_seed(run.seed)
    model = Transformer(run.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(run, step))
    generator = torch.Generator().manual_seed(run.seed + 1)
    task = TASKS[run.task]
    model.train()
    for step in range(run.steps):
        ids, labels = task(generator, run.config, run.batch_size, run.length)
        logits = model(ids).logits  # [B, T, V]
        loss = model.loss(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if log is not None and (step % 50 == 0 or step == run.steps - 1):
            log(step, loss.item())
    return model.eval()


__all__ = ["IGNORE_INDEX", "TASKS", "TrainingRun", "copy_spans", "train"]
