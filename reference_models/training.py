"""Train small reference models on synthetic tasks, on a CPU, in seconds.

Tests and scripts need models whose weights carry signal (a random-init model cannot tell
a right layout from a wrong one, or retrieve a needle). Each task is a function that draws
a batch from a ``torch.Generator``; :func:`train` runs AdamW on the model's own causal-LM
loss, so every run is reproducible from its seed.

Tasks
- ``copy_spans``: random tokens in which spans of earlier tokens recur later, as names and
  phrases recur in text; predicting a recurring span is what induction heads learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .config import ModelConfig
from .model import IGNORE_INDEX, Transformer

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


def copy_spans(generator: torch.Generator, config: ModelConfig, batch_size: int = 32, length: int = 32) -> tuple[Tensor, Tensor]:
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


TASKS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {"copy_spans": copy_spans}


def train(run: TrainingRun, log: Callable[[int, float], None] | None = None) -> Transformer:
    """Train a fresh model as ``run`` describes; returns it in eval mode."""
    torch.manual_seed(run.seed)
    model = Transformer(run.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, weight_decay=0.0)
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
        if log is not None and (step % 50 == 0 or step == run.steps - 1):
            log(step, loss.item())
    return model.eval()


__all__ = ["IGNORE_INDEX", "TASKS", "TrainingRun", "copy_spans", "train"]
