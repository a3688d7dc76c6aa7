"""A synthetic key-value retrieval language: the vocabulary and the sequences of its task.

A prompt is filler tokens with key-value pairs (``k v``, two adjacent tokens) inserted
into it, ending in a question ``QUERY k``; the answer is the one token ``v``. The shipped
retrieval model is trained on it, and the long-context probes use the same layout over
this vocabulary (needle = one pair, haystack = filler, distractors = other pairs).

Vocabulary (``RetrievalVocab``, recorded in the checkpoint's metadata):
``0`` pad, ``1`` BOS, ``2`` QUERY, then keys, values and filler in three disjoint ranges.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch
from torch import Tensor

from .model import IGNORE_INDEX

VOCAB_KEY = "maskcheck.retrieval_vocab"


@dataclass(frozen=True)
class RetrievalVocab:
    keys: int = 32
    values: int = 32
    filler: int = 60
    pad: int = 0
    bos: int = 1
    query: int = 2

    @property
    def first_key(self) -> int:
        return 3

    @property
    def first_value(self) -> int:
        return self.first_key + self.keys

    @property
    def first_filler(self) -> int:
        return self.first_value + self.values

    @property
    def size(self) -> int:
        return self.first_filler + self.filler

    def key(self, i: int | Tensor) -> int | Tensor:
        return self.first_key + i

    def value(self, i: int | Tensor) -> int | Tensor:
        return self.first_value + i

    def value_ids(self) -> Tensor:
        return torch.arange(self.first_value, self.first_value + self.values)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RetrievalVocab":
        return cls(**json.loads(text))


def filler(vocab: RetrievalVocab, length: int, generator: torch.Generator) -> Tensor:
    return vocab.first_filler + torch.randint(0, vocab.filler, (length,), generator=generator)


def prompt(
    vocab: RetrievalVocab,
    length: int,
    pairs: list[tuple[int, int]],
    slots: list[int],
    asked: int,
    generator: torch.Generator,
) -> Tensor:
    """``[BOS, filler ..., k v at each slot ..., QUERY, k_asked]`` of exactly ``length`` tokens.

    ``slots[i]`` is where pair i's key goes (an index into the row, between BOS and the
    question); pairs must not overlap.
    """
    row = torch.cat([torch.tensor([vocab.bos]), filler(vocab, length - 3, generator), torch.tensor([vocab.query, 0])])
    for (k, v), slot in zip(pairs, slots):
        if not 1 <= slot <= length - 4:
            raise ValueError(f"slot {slot} does not fit a prompt of {length} tokens")
        row[slot], row[slot + 1] = vocab.key(k), vocab.value(v)
    row[-1] = vocab.key(pairs[asked][0])
    return row


def retrieval_batch(
    generator: torch.Generator, config: object, batch_size: int = 32, length: int = 64
) -> tuple[Tensor, Tensor]:
    """Training batches: 1..6 pairs at random slots, one asked; only the answer is labelled.

    The row length is drawn per batch between 16 and ``length`` so the model retrieves at
    every length it is trained for, not at one.
    """
    vocab = RetrievalVocab()
    rows, labels = [], []
    span = int(torch.randint(16, length + 1, (1,), generator=generator))
    for _ in range(batch_size):
        count = int(torch.randint(1, 7, (1,), generator=generator))
        keys = torch.randperm(vocab.keys, generator=generator)[:count].tolist()
        values = torch.randint(0, vocab.values, (count,), generator=generator).tolist()
        # Non-overlapping slots: choose count positions among the pair-sized cells.
        cells = torch.randperm((span - 4) // 2, generator=generator)[:count].tolist()
        slots = [1 + 2 * c for c in cells]
        asked = int(torch.randint(0, count, (1,), generator=generator))
        question = prompt(vocab, span, list(zip(keys, values)), slots, asked, generator)
        answer = torch.tensor([vocab.value(values[asked])])
        rows.append(torch.cat([question, answer]))
        label = torch.full((span + 1,), IGNORE_INDEX)
        label[-1] = answer[0]
        labels.append(label)
    return torch.stack(rows), torch.stack(labels)
