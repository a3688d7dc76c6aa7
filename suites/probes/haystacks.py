"""Prompts for the probes: a needle (or several items) in a haystack, as token ids.

Two builders make the same :class:`Sample`:

- :class:`SyntheticHaystack` for reference models trained on the retrieval language of
  :mod:`maskcheck.reference_models.retrieval` (keys, values and filler are disjoint token ranges);
- :class:`TextHaystack` for models with a tokenizer: text templates (needle, question,
  answer prefix), filler from seeded pseudo-prose over a shipped word list or the user's
  own text, the needle inserted at a sentence boundary, the whole prompt tokenized once,
  and the needle's token span found from character offsets (never by decoding and
  re-encoding). Lengths are fitted exactly (in tokens) by search.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch
from torch import Tensor


@dataclass
class Sample:
    """One prompt to score: the answer's candidates and where the needle sits."""

    prompt: Tensor  # [T] ids, ending where the answer starts
    closed_book: Tensor  # [T'] the same prompt with the needle removed (retrieval gain)
    answer: Tensor  # [n] the value's ids
    distractors: list[Tensor]  # other values of the same format
    needle: tuple[int, int]  # token span [start, end) of the needle in ``prompt``
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def distance(self) -> int:
        """Tokens from the end of the needle to the end of the prompt (where the answer is asked)."""
        return len(self.prompt) - self.needle[1]


class SyntheticHaystack:
    """Prompts over the retrieval vocabulary: ``[BOS, filler, k v, ..., QUERY, k]`` -> ``v``."""

    def __init__(self, vocab: Any, distractor_pairs: int = 2, candidates: int = 4) -> None:
        self.vocab = vocab
        self.distractor_pairs = distractor_pairs
        self.candidates = candidates

    def _pairs(self, rng: random.Random, count: int) -> list[tuple[int, int]]:
        keys = rng.sample(range(self.vocab.keys), count)
        return [(k, rng.randrange(self.vocab.values)) for k in keys]

    def _values(self, rng: random.Random, answer: int) -> list[Tensor]:
        others = [v for v in range(self.vocab.values) if v != answer]
        return [torch.tensor([self.vocab.value(v)]) for v in rng.sample(others, self.candidates)]

    def _without(self, row: Tensor, slot: int) -> Tensor:
        """The closed-book control: the pair at ``slot`` replaced by filler."""
        closed = row.clone()
        closed[slot : slot + 2] = torch.tensor([self.vocab.first_filler, self.vocab.first_filler + 1])
        return closed

    def _row(self, length: int, pairs: list[tuple[int, int]], slots: list[int], asked: int, seed: int) -> Tensor:
        from ...reference_models.retrieval import prompt

        return prompt(self.vocab, length, pairs, slots, asked, torch.Generator().manual_seed(seed))

    def needle(self, length: int, depth: float, seed: int) -> Sample:
        """One needle at ``depth`` (0 = just after BOS, 1 = just before the question)."""
        rng = random.Random(seed)
        last = length - 4
        slot = 1 + round(depth * (last - 1))
        pairs = self._pairs(rng, 1 + self.distractor_pairs)
        # Distractor pairs sit at other free slots, never overlapping the needle.
        free = [s for s in range(1, last + 1) if abs(s - slot) >= 2]
        slots = [slot]
        for _ in range(self.distractor_pairs):
            choice = rng.choice([s for s in free if all(abs(s - t) >= 2 for t in slots)])
            slots.append(choice)
        row = self._row(length, pairs, slots, 0, seed)
        closed = self._without(row, slot)
        answer = torch.tensor([self.vocab.value(pairs[0][1])])
        return Sample(
            row, closed, answer, self._values(rng, pairs[0][1]), (slot, slot + 2), {"depth": depth, "length": length}
        )

    def items(self, length: int, count: int, asked_slot: int, seed: int) -> Sample:
        """``count`` pairs spread evenly from just after BOS to just before the question; the
        pair in ``asked_slot`` is asked. The other pairs stay where they are as the asked one moves."""
        rng = random.Random(seed)
        last = length - 4
        slots = [1 + round(i * (last - 1) / max(1, count - 1)) for i in range(count)]
        slots = [s - (s % 2 == 0) for s in slots]  # odd slots never overlap
        pairs = self._pairs(rng, count)
        row = self._row(length, pairs, slots, asked_slot, seed)
        start = slots[asked_slot]
        closed = self._without(row, start)
        value = pairs[asked_slot][1]
        answer = torch.tensor([self.vocab.value(value)])
        return Sample(
            row, closed, answer, self._values(rng, value), (start, start + 2), {"slot": asked_slot, "length": length}
        )


def word_list() -> list[str]:
    """The shipped word list (plain English words) for seeded pseudo-prose."""
    text = resources.files(__package__).joinpath("words.txt").read_text()
    return [w for w in text.split() if w.isalpha()]


@dataclass(frozen=True)
class Templates:
    """The text around the needle; ``{key}`` and ``{value}`` are filled per sample."""

    needle: str = "The special magic number for {key} is {value}."
    question: str = "What is the special magic number for {key}? The special magic number for {key} is"
    answer: str = " {value}"
    item: str = "The special magic number for {key} is {value}."


class TextHaystack:
    """Prompts in text, tokenized by the model's own tokenizer (with its BOS policy)."""

    def __init__(
        self, tokenizer: Any, text: str | None = None, templates: Templates | None = None, candidates: int = 4
    ) -> None:
        self.tokenizer = tokenizer
        self.templates = templates or Templates()
        self.candidates = candidates
        self.words = word_list()
        self.user_sentences = _sentences(text) if text else None

    # -- text ------------------------------------------------------------------------------

    def _filler(self, rng: random.Random, count: int) -> list[str]:
        if self.user_sentences:
            start = rng.randrange(len(self.user_sentences))
            return [self.user_sentences[(start + i) % len(self.user_sentences)] for i in range(count)]
        sentences = []
        for _ in range(count):
            words = rng.choices(self.words, k=rng.randint(6, 12))
            sentences.append(" ".join(words).capitalize() + ".")
        return sentences

    def _key_value(self, rng: random.Random) -> tuple[str, str]:
        return f"{rng.choice(self.words)}-{rng.choice(self.words)}", str(rng.randrange(10_000, 100_000))

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoded = self.tokenizer(text, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]

    def _answer_ids(self, value: str) -> Tensor:
        return torch.tensor(
            self.tokenizer(self.templates.answer.format(value=value), add_special_tokens=False)["input_ids"]
        )

    def _assemble(
        self, sentences: list[str], inserts: dict[int, str], question: str
    ) -> tuple[str, dict[int, tuple[int, int]]]:
        """Join sentences with inserts before sentence index i; returns the text and each insert's char span."""
        parts, spans, position = [], {}, 0
        for i in range(len(sentences) + 1):
            if i in inserts:
                spans[i] = (position, position + len(inserts[i]))
                parts.append(inserts[i])
                position += len(inserts[i]) + 1
            if i < len(sentences):
                parts.append(sentences[i])
                position += len(sentences[i]) + 1
        parts.append(question)
        return " ".join(parts), spans

    def _fit(self, length: int, build: Any, rng: random.Random) -> tuple[str, Any, list[int], list[tuple[int, int]]]:
        """A prompt of exactly ``length`` tokens where the tokenizer allows it: a binary search over
        whole filler sentences, then words added one at a time to a last sentence, skipping any
        word that would overshoot. ``build(count, tail_words)`` returns (text, extra)."""

        def size(count: int, tail: list[str]) -> int:
            return len(self._encode(build(count, tail)[0])[0])

        low, high = 0, 1
        while size(high, []) <= length and high < 100_000:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if size(middle, []) <= length else (low, middle)
        # A last sentence costs its words and a period: with one sentence fewer there is room
        # for it, so try the last few counts and keep the first that lands exactly.
        best: tuple[int, int, list[str]] = (size(low, []), low, [])
        for count in range(low, max(-1, low - 3), -1):
            tail: list[str] = []
            for word in rng.sample(self.words, min(200, len(self.words))):
                if size(count, tail + [word]) <= length:
                    tail.append(word)
                if size(count, tail) == length:
                    break
            reached = size(count, tail)
            if reached > best[0]:
                best = (reached, count, tail)
            if reached == length:
                break
        _, count, tail = best
        text, extra = build(count, tail)
        ids, offsets = self._encode(text)
        return text, extra, ids, offsets

    def _span(self, offsets: list[tuple[int, int]], chars: tuple[int, int]) -> tuple[int, int]:
        tokens = [i for i, (a, b) in enumerate(offsets) if b > a and a < chars[1] and b > chars[0]]
        if not tokens:
            raise ValueError("the needle produced no tokens")
        return tokens[0], tokens[-1] + 1

    def needle(self, length: int, depth: float, seed: int) -> Sample:
        rng = random.Random(seed)
        key, value = self._key_value(rng)
        pool = self._filler(rng, 4096 if self.user_sentences is None else len(self.user_sentences))
        needle = self.templates.needle.format(key=key, value=value)
        question = self.templates.question.format(key=key)

        def build(count: int, tail: list[str]) -> tuple[str, tuple[int, int]]:
            sentences = pool[:count] + ([" ".join(tail).capitalize() + "."] if tail else [])
            at = round(depth * len(sentences))
            text, spans = self._assemble(sentences, {at: needle}, question)
            return text, spans[at]

        text, chars, ids, offsets = self._fit(length, build, rng)
        span = self._span(offsets, chars)
        closed_text = text[: chars[0]] + text[chars[1] + 1 :]
        closed = torch.tensor(self._encode(closed_text)[0])
        distractors = [self._answer_ids(self._key_value(rng)[1]) for _ in range(self.candidates)]
        meta = {
            "depth": depth,
            "length": len(ids),
            "asked_length": length,
            "needle_text": needle,
            "needle_chars": chars,
            "text": text,
            "value": value,
        }
        return Sample(torch.tensor(ids), closed, self._answer_ids(value), distractors, span, meta)

    def items(self, length: int, count: int, asked_slot: int, seed: int) -> Sample:
        rng = random.Random(seed)
        pairs = [self._key_value(rng) for _ in range(count)]
        pool = self._filler(rng, 4096 if self.user_sentences is None else len(self.user_sentences))
        key, value = pairs[asked_slot]
        question = self.templates.question.format(key=key)
        items = [self.templates.item.format(key=k, value=v) for k, v in pairs]

        def build(n: int, tail: list[str]) -> tuple[str, tuple[int, int]]:
            sentences = pool[:n] + ([" ".join(tail).capitalize() + "."] if tail else [])
            where = [round(i * len(sentences) / max(1, count - 1)) for i in range(count)]
            inserts: dict[int, str] = {}
            for position, item in zip(where, items):
                inserts[position] = (inserts[position] + " " + item) if position in inserts else item
            text, spans = self._assemble(sentences, inserts, question)
            start = spans[where[asked_slot]][0] + inserts[where[asked_slot]].index(items[asked_slot])
            return text, (start, start + len(items[asked_slot]))

        text, chars, ids, offsets = self._fit(length, build, rng)
        closed_text = text[: chars[0]] + text[chars[1] + 1 :]
        distractors = [self._answer_ids(v) for k, v in pairs if v != value][: self.candidates]
        meta = {"slot": asked_slot, "length": len(ids), "needle_chars": chars, "value": value}
        return Sample(
            torch.tensor(ids),
            torch.tensor(self._encode(closed_text)[0]),
            self._answer_ids(value),
            distractors,
            self._span(offsets, chars),
            meta,
        )


def _sentences(text: str) -> list[str]:
    pieces = [s.strip() for s in text.replace("\n", " ").split(".")]
    return [p + "." for p in pieces if p]
