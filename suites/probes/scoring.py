"""Teacher-forced scoring of an answer: one forward over prompt + candidates, no generation.

For a sample the batch holds the prompt followed by the true value, by each distractor
value, and the closed-book prompt (needle removed) followed by the true value; rows are
right-padded, which a causal model never reads. From it:

- ``logprob`` of the value tokens, total and per token;
- ``is_greedy``: every value token is the argmax at its position, which is exactly
  "greedy decoding reproduces the value" (so it equals exact match under greedy decoding);
- ``rank`` (1 = best) and ``margin`` of the value against the distractors by total
  log-probability;
- ``gain``: log-probability with the needle minus without it (what retrieval added), and
  ``closed_book_greedy``: whether the value is the greedy answer even without the needle
  (a guess or memorisation, the control every retrieval number is read against).

:func:`greedy_answer` decodes for real with the adapter's cache, for parity with published
needle benchmarks that match generated strings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ...harness.adapters.base import Adapter, Batch
from .haystacks import Sample


@dataclass
class Score:
    logprob: float
    logprob_per_token: float
    is_greedy: bool
    rank: int
    margin: float
    gain: float
    closed_book_greedy: bool  # the value is still the greedy answer with the needle removed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rows(prompt: Tensor, candidate: Tensor) -> Tensor:
    return torch.cat([prompt, candidate])


def score(adapter: Adapter, sample: Sample) -> Score:
    sequences = (
        [(sample.prompt, sample.answer)]
        + [(sample.prompt, d) for d in sample.distractors]
        + [(sample.closed_book, sample.answer)]
    )
    rows = [_rows(p, c) for p, c in sequences]
    width = max(len(r) for r in rows)
    pad = adapter.capabilities.pad_token_id or 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    device = adapter.capabilities.device
    logits = adapter.logits(Batch(ids.to(device), mask.to(device)))  # [R, W, V]
    logprobs = torch.log_softmax(logits.double(), -1).cpu()
    totals, greedy = [], []
    for i, (prompt, candidate) in enumerate(sequences):
        # Position t predicts token t + 1: the candidate's tokens are read one position earlier.
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(candidate))
        totals.append(float(logprobs[i, positions, candidate].sum()))
        greedy.append(bool((logprobs[i, positions].argmax(-1) == candidate).all()))
    value, distractors, closed = totals[0], totals[1:-1], totals[-1]
    best_other = max(distractors) if distractors else float("-inf")
    return Score(
        logprob=value,
        logprob_per_token=value / len(sample.answer),
        is_greedy=greedy[0],
        rank=1 + sum(d > value for d in distractors),
        margin=value - best_other,
        gain=value - closed,
        closed_book_greedy=greedy[-1],
    )


def greedy_answer(adapter: Adapter, prompt: Tensor, new_tokens: int) -> Tensor:
    """The ``new_tokens`` a greedy decode produces after ``prompt``, with the adapter's cache."""
    device = adapter.capabilities.device
    ids = prompt[None].to(device)
    logits, state = adapter.prefill(Batch(ids, torch.ones_like(ids)))
    token = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
    out = [token]
    for _ in range(new_tokens - 1):
        logits, state = adapter.step(state, token)
        token = logits[:, -1].argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, dim=1)[0].cpu()
