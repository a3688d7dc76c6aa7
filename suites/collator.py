"""collator: what a data collator hands the model must mean what the model needs.

Many leaks are not in the model but in its inputs. The checks draw lists of examples
(lengths, an EOS inside and at the end, empty and one-token examples), run the collate
function, and check the batch against the examples, per task (labels follow the Hugging Face
convention: ``labels[t] == input_ids[t]``, the model shifts them itself):

``causal-lm`` (padded rows)
- ``attention_mask``: 1 exactly at each example's tokens, 0 at padding;
- ``padding_labels``: -100 at every padding slot (a pad label trains the model to predict padding);
- ``target_labels``: at every real token, the token itself, a real EOS included (masking
  every EOS because the pad id is the EOS id keeps the model from learning to stop).

``packed`` (examples flattened into one row, as ``DataCollatorWithFlattening``)
- ``concatenation``: the row holds the non-empty examples, in order;
- ``positions_restart``: position ids restart at every example's first token;
- ``boundary_labels``: each example's first token has label -100 (else it is trained to be
  predicted from the previous example's last token), every other token its own id.

``seq2seq`` (examples are a source and a target)
- ``attention_mask``: the source mask, as for ``causal-lm``;
- ``label_padding``: labels are the target at real slots and -100 at padding (not the pad id);
- ``decoder_inputs``: ``decoder_input_ids``, when the collator builds them, are the labels
  shifted right behind one start token (padding slots hold the pad id, never -100).

A row is matched to its example left- or right-aligned, whichever holds it; a row that holds
neither is a failure of every check. Each failure is a case Hypothesis shrinks to the fewest,
shortest examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.engine.strategies import case_strategy
from ..harness.engine.suite import Check, Outcome

IGNORE_INDEX = -100
TASKS = ("causal-lm", "packed", "seq2seq")
MAX_EXAMPLES_PER_BATCH = 4
MAX_LENGTH = 6


@dataclass(frozen=True)
class ExampleShape:
    length: int  # real tokens (0: an empty example)
    eos_at_end: bool
    eos_inside: bool
    target_length: int = 0  # seq2seq: the target's tokens


@dataclass(frozen=True)
class CollatorCase:
    examples: tuple[ExampleShape, ...]
    seed: int


@dataclass(frozen=True)
class Vocabulary:
    """The ids the examples are made of."""

    pad: int
    eos: int | None
    ordinary: tuple[int, ...]  # ids that are no special token


def collator_cases(task: str) -> st.SearchStrategy[CollatorCase]:
    smallest = 1 if task == "seq2seq" else 0  # a seq2seq example without a source is no example
    shape = st.builds(
        ExampleShape,
        length=st.integers(smallest, MAX_LENGTH),
        eos_at_end=st.booleans(),
        eos_inside=st.booleans(),
        target_length=st.integers(1, MAX_LENGTH) if task == "seq2seq" else st.just(0),
    )
    examples = st.lists(shape, min_size=1, max_size=MAX_EXAMPLES_PER_BATCH).map(tuple)
    if task == "packed":  # a row packed from nothing is no row: flattening collators refuse it, rightly
        examples = examples.filter(lambda shapes: any(s.length for s in shapes))
    return case_strategy(CollatorCase, examples=examples, seed=st.integers(0, 2**16))


def token_ids(
    shape_length: int, eos_at_end: bool, eos_inside: bool, vocabulary: Vocabulary, generator: torch.Generator
) -> list[int]:
    picks = torch.randint(0, len(vocabulary.ordinary), (shape_length,), generator=generator).tolist()
    ids = [vocabulary.ordinary[i] for i in picks]
    if vocabulary.eos is not None:
        if eos_inside and shape_length >= 3:
            ids[shape_length // 2] = vocabulary.eos
        if eos_at_end and shape_length >= 1:
            ids[-1] = vocabulary.eos
    return ids


def build_examples(case: CollatorCase, task: str, vocabulary: Vocabulary) -> list[dict[str, list[int]]]:
    """The features handed to the collator: ``{"input_ids": [...]}`` (seq2seq: and ``labels``)."""
    generator = torch.Generator().manual_seed(case.seed)
    examples = []
    for shape in case.examples:
        example = {
            "input_ids": token_ids(shape.length, False, shape.eos_inside, vocabulary, generator)
            if task == "seq2seq"
            else token_ids(shape.length, shape.eos_at_end, shape.eos_inside, vocabulary, generator)
        }
        if task == "seq2seq":
            example["labels"] = token_ids(shape.target_length, shape.eos_at_end, False, vocabulary, generator)
        examples.append(example)
    return examples


# -- reading a batch ------------------------------------------------------------------------------


def locate(row: list[int], example: list[int]) -> int | None:
    """Where ``example`` starts in a padded ``row``: right-aligned padding puts it at 0,
    left padding at the end; None when the row holds it neither way."""
    n = len(example)
    for start in (0, len(row) - n):
        if start >= 0 and row[start : start + n] == example:
            return start
    return None


def as_rows(batch: dict[str, Any], key: str) -> list[list[int]] | None:
    value = batch.get(key)
    if value is None:
        return None
    tensor = value if isinstance(value, Tensor) else torch.as_tensor(value)
    if tensor.dim() == 1:
        tensor = tensor[None]
    return tensor.tolist()


def failure(wrong: list[list[int]], message: str) -> Outcome:
    return Outcome("fail", float(len(wrong)), 0.0, 0.0, wrong[:32], message, positions_label="row, position")


PASS = Outcome("pass")


def rows_hold_examples(batch: dict[str, Any], key: str, examples: list[list[int]]) -> tuple[list[int], Outcome | None]:
    """Where each example starts in its row of ``batch[key]``, or the failure that it is not there."""
    rows = as_rows(batch, key)
    if rows is None:
        return [], failure([], f"the batch has no {key!r} (keys: {', '.join(sorted(batch))})")
    if len(rows) != len(examples):
        return [], failure([], f"the batch has {len(rows)} rows of {key} for {len(examples)} examples")
    starts = []
    for i, (row, example) in enumerate(zip(rows, examples)):
        start = locate(row, example)
        if start is None:
            return [], failure(
                [[i, 0]], f"row {i} of {key} ({row}) does not hold example {i} ({example}) left- or right-aligned"
            )
        starts.append(start)
    return starts, None


# -- checks: padded rows (causal-lm, and seq2seq's source) -----------------------------------------


def attention_mask_check(batch: dict[str, Any], examples: list[list[int]], key: str = "input_ids") -> Outcome:
    starts, problem = rows_hold_examples(batch, key, examples)
    if problem:
        return problem
    masks = as_rows(batch, "attention_mask")
    if masks is None:
        return PASS  # no mask is no wrong mask: the padding checks of the model suites cover models that need one
    wrong = [
        [i, t]
        for i, (mask, start, ex) in enumerate(zip(masks, starts, examples))
        for t, m in enumerate(mask)
        if m != int(start <= t < start + len(ex))
    ]
    if not wrong:
        return PASS
    return failure(
        wrong,
        f"attention_mask is wrong at {len(wrong)} slot(s): it must be 1 exactly at each example's tokens and 0 at padding",
    )


def padding_labels_check(
    batch: dict[str, Any],
    examples: list[list[int]],
    vocabulary: Vocabulary,
    ids_key: str = "input_ids",
    labels_key: str = "labels",
) -> Outcome:
    starts, problem = rows_hold_examples(batch, ids_key, examples)
    if problem:
        return problem
    labels = as_rows(batch, labels_key)
    if labels is None:
        return failure([], f"the batch has no {labels_key!r}")
    wrong, kept_pad = [], 0
    for i, (row, start, example) in enumerate(zip(labels, starts, examples)):
        for t, label in enumerate(row):
            if not start <= t < start + len(example) and label != IGNORE_INDEX:
                wrong.append([i, t])
                kept_pad += label == vocabulary.pad
    if not wrong:
        return PASS
    advice = (
        f"; {kept_pad} of them hold the pad id {vocabulary.pad}: set padded labels to {IGNORE_INDEX} "
        f"(labels[attention_mask == 0] = {IGNORE_INDEX}; DataCollatorForSeq2Seq's label_pad_token_id={IGNORE_INDEX})"
        if kept_pad
        else ""
    )
    return failure(
        wrong,
        f"labels are not {IGNORE_INDEX} at {len(wrong)} padding slot(s), so the loss trains the model to predict padding{advice}",
    )


def target_labels_check(batch: dict[str, Any], examples: list[list[int]], vocabulary: Vocabulary) -> Outcome:
    starts, problem = rows_hold_examples(batch, "input_ids", examples)
    if problem:
        return problem
    labels = as_rows(batch, "labels")
    if labels is None:
        return failure([], "the batch has no 'labels'")
    wrong, masked_eos, shifted = [], 0, 0
    for i, (row, start, example) in enumerate(zip(labels, starts, examples)):
        for j, token in enumerate(example):
            label = row[start + j]
            if label != token:
                wrong.append([i, start + j])
                masked_eos += label == IGNORE_INDEX and token == vocabulary.eos
                shifted += j + 1 < len(example) and label == example[j + 1]
    if not wrong:
        return PASS
    message = f"labels differ from the input ids at {len(wrong)} real token(s); the model shifts labels itself, so labels[t] must be input_ids[t]"
    if masked_eos and vocabulary.eos == vocabulary.pad:
        message = (
            f"labels are {IGNORE_INDEX} at {masked_eos} real EOS token(s) (id {vocabulary.eos}, which is also the pad id), so the model "
            "never learns to stop: give the tokenizer a pad token distinct from EOS (tokenizer.add_special_tokens({'pad_token': '<pad>'})) "
            "or mask labels by the attention mask instead of by the pad id"
        )
    elif masked_eos:
        message = f"labels are {IGNORE_INDEX} at {masked_eos} real EOS token(s) (id {vocabulary.eos}), so the model never learns to stop"
    elif shifted and shifted == len(wrong):
        message = f"labels are already shifted one position left at {shifted} token(s), and the model shifts them again: it would learn to predict two tokens ahead"
    return failure(wrong, message)


# -- checks: packed rows ------------------------------------------------------------------------


def packed_layout(examples: list[list[int]]) -> tuple[list[int], list[int]]:
    """The non-empty examples flattened, and the index at which each starts."""
    flat, starts = [], []
    for example in examples:
        if example:
            starts.append(len(flat))
            flat.extend(example)
    return flat, starts


def packed_row(batch: dict[str, Any], key: str) -> list[int] | None:
    rows = as_rows(batch, key)
    return None if rows is None or len(rows) != 1 else rows[0]


def concatenation_check(batch: dict[str, Any], examples: list[list[int]], vocabulary: Vocabulary) -> Outcome:
    flat, _ = packed_layout(examples)
    row = packed_row(batch, "input_ids")
    if row is None:
        return failure([], "a packed batch must be one row of input_ids")
    if row[: len(flat)] != flat or any(t != vocabulary.pad for t in row[len(flat) :]):
        return failure([[0, 0]], f"the packed row {row} is not the non-empty examples in order ({flat})")
    return PASS


def positions_restart_check(batch: dict[str, Any], examples: list[list[int]]) -> Outcome:
    flat, starts = packed_layout(examples)
    positions = packed_row(batch, "position_ids")
    if positions is None:
        return failure(
            [],
            "the packed batch has no position_ids (one row): without them a packed row is one long sequence to the model",
        )
    first = positions[0] if positions else 0
    expected = [first + t - start for start, end in zip(starts, starts[1:] + [len(flat)]) for t in range(start, end)]
    wrong = [[0, t] for t, (p, e) in enumerate(zip(positions, expected)) if p != e]
    if not wrong:
        return PASS
    return failure(
        wrong,
        f"position ids do not restart at every example's first token at {len(wrong)} slot(s): expected {expected}, got {positions[: len(flat)]}",
    )


def boundary_labels_check(batch: dict[str, Any], examples: list[list[int]]) -> Outcome:
    flat, starts = packed_layout(examples)
    labels = packed_row(batch, "labels")
    if labels is None:
        return failure([], "the packed batch has no labels (one row)")
    boundary = [[0, t] for t in starts[1:] if t < len(labels) and labels[t] != IGNORE_INDEX]
    if boundary:
        return failure(
            boundary,
            f"the first token of {len(boundary)} packed example(s) has a label, so it is trained to be predicted from the previous example's last token: set labels at every example's first token to {IGNORE_INDEX}",
        )
    wrong = [[0, t] for t in range(len(flat)) if t not in starts and t < len(labels) and labels[t] != flat[t]]
    if wrong:
        return failure(wrong, f"labels differ from the input ids at {len(wrong)} token(s) inside packed examples")
    return PASS


# -- checks: seq2seq ----------------------------------------------------------------------------


def decoder_inputs_check(batch: dict[str, Any], targets: list[list[int]], vocabulary: Vocabulary) -> Outcome:
    decoder = as_rows(batch, "decoder_input_ids")
    labels = as_rows(batch, "labels")
    if decoder is None:
        return PASS  # the model builds them from the labels (shift_tokens_right), which the model suites audit
    if labels is None or len(labels) != len(decoder):
        return failure([], "decoder_input_ids without labels of the same rows")
    wrong = []
    for i, (inputs, row) in enumerate(zip(decoder, labels)):
        expected = [inputs[0]] + [vocabulary.pad if label == IGNORE_INDEX else label for label in row[:-1]]
        wrong += [[i, t] for t, (a, b) in enumerate(zip(inputs, expected)) if a != b]
        wrong += [[i, 0]] if inputs[0] == IGNORE_INDEX else []
    if not wrong:
        return PASS
    return failure(
        wrong,
        f"decoder_input_ids are not the labels shifted right behind a start token at {len(wrong)} slot(s) ({IGNORE_INDEX} becomes the pad id)",
    )


# -- the checks of a task ----------------------------------------------------------------------------


class CollatorFailed(Exception):
    """The collator raised, or returned something other than a dict, on a case's examples."""


Features = list[dict[str, list[int]]]
CheckFunction = Callable[[dict[str, Any], Features, Vocabulary], Outcome]


def _ids(features: Features, key: str = "input_ids") -> list[list[int]]:
    return [f[key] for f in features]


#: per task, each check's name and its function of (batch, features, vocabulary)
CHECKS: dict[str, dict[str, CheckFunction]] = {
    "causal-lm": {
        "attention_mask": lambda batch, features, vocabulary: attention_mask_check(batch, _ids(features)),
        "padding_labels": lambda batch, features, vocabulary: padding_labels_check(batch, _ids(features), vocabulary),
        "target_labels": lambda batch, features, vocabulary: target_labels_check(batch, _ids(features), vocabulary),
    },
    "packed": {
        "concatenation": lambda batch, features, vocabulary: concatenation_check(batch, _ids(features), vocabulary),
        "positions_restart": lambda batch, features, vocabulary: positions_restart_check(batch, _ids(features)),
        "boundary_labels": lambda batch, features, vocabulary: boundary_labels_check(batch, _ids(features)),
    },
    "seq2seq": {
        "attention_mask": lambda batch, features, vocabulary: attention_mask_check(batch, _ids(features)),
        "label_padding": lambda batch, features, vocabulary: seq2seq_labels_check(
            batch, _ids(features, "labels"), vocabulary
        ),
        "decoder_inputs": lambda batch, features, vocabulary: decoder_inputs_check(
            batch, _ids(features, "labels"), vocabulary
        ),
    },
}


def checks(task: str, collate: Callable[[Features], dict[str, Any]], vocabulary: Vocabulary) -> list[Check]:
    """The task's checks, each over the same drawn cases (one strategy object)."""
    strategy = collator_cases(task)

    def evaluator(function: CheckFunction) -> Callable[[CollatorCase], Outcome]:
        def evaluate(case: CollatorCase) -> Outcome:
            features = build_examples(case, task, vocabulary)
            try:
                batch = collate(features)
            except CollatorFailed as exc:  # shrunk like any failure: the fewest examples that make it raise
                return failure([], str(exc))
            return function(batch, features, vocabulary)

        return evaluate

    return [Check(name, evaluator(function), strategy) for name, function in CHECKS[task].items()]


def seq2seq_labels_check(batch: dict[str, Any], targets: list[list[int]], vocabulary: Vocabulary) -> Outcome:
    """Labels hold each target (a real EOS included) and -100 at padding."""
    labels = as_rows(batch, "labels")
    if labels is None or len(labels) != len(targets):
        return failure([], f"the batch has no labels row per example (keys: {', '.join(sorted(batch))})")
    padded, kept_pad, real = [], 0, []
    for i, (row, target) in enumerate(zip(labels, targets)):
        start = max((0, len(row) - len(target)), key=lambda s: sum(a == b for a, b in zip(row[s:], target)))
        for t, label in enumerate(row):
            if start <= t < start + len(target):
                if label != target[t - start]:
                    real.append([i, t])
            elif label != IGNORE_INDEX:
                padded.append([i, t])
                kept_pad += label == vocabulary.pad
    if padded:
        advice = (
            f"; {kept_pad} hold the pad id {vocabulary.pad}: pad labels with {IGNORE_INDEX} (DataCollatorForSeq2Seq(label_pad_token_id={IGNORE_INDEX}))"
            if kept_pad
            else ""
        )
        return failure(
            padded,
            f"labels are not {IGNORE_INDEX} at {len(padded)} padding slot(s), so the loss trains the model to predict padding{advice}",
        )
    if real:
        return failure(
            real, f"labels differ from the target at {len(real)} real token(s) (a real EOS must stay a target)"
        )
    return PASS
