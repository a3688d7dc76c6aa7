"""What a model returns, measured: the output kinds maskcheck audits.

Every adapter hands the engine one currency, ``[B, T, C]``: at each position of the
predicted side, ``C`` values. A model that does not end in a vocabulary head is put into
it by its :class:`OutputKind`:

============================  =================  =========================================
kind                          the model returns  compared as
============================  =================  =========================================
``vocabulary``                ``[B, T, V]``      log-probabilities (next or masked token)
``label_scores``              ``[B, T, C]``      log-probabilities (single-label tagging)
``position_values``           ``[B, T, D]``      raw values (hidden states, multi-label)
``position_scalars``          ``[B, T]``         raw values (value heads, per-token rewards)
``row_scores``                ``[B, C]``         log-probabilities (single-label classifier)
``row_values``                ``[B, D]``         raw values (embeddings, multi-label)
``row_scalars``               ``[B]``, ``[B,1]``  raw values (reward and regression heads)
============================  =================  =========================================

A per-row output has no positions, so it is given to the engine at every position of its
row (``[B, D] -> [B, T, D]``): every comparison of "the real positions of row i" then
compares the row's output, and a padded slot's copy is never compared, as a padded
position's logits never are. A log-softmax over one value is identically zero and would
hide every leak, so a scalar is always compared raw (harness/engine/tolerance.py refuses to
normalise a width of one).

What a model returns is measured, not read off its class: the output is called at two
lengths, so that a label count equal to one probe's length cannot pass for a sequence
dimension. Which output of a structured return is read goes by name (:data:`OUTPUT_NAMES`);
whether a ``[B, C]`` row holds class scores or a vector cannot be measured, so an adapter
says so (a transformers classifier's ``problem_type``) or the model declares it, and an
undeclared one is compared raw: raw comparison of class scores is the stricter of the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .errors import AdapterError

OutputKindName = Literal[
    "vocabulary", "label_scores", "position_values", "position_scalars", "row_scores", "row_values", "row_scalars"
]
Units = Literal["log_probabilities", "raw"]

#: what each kind is, as the report and the errors name it
KINDS: dict[str, str] = {
    "vocabulary": "logits over the vocabulary at each position [B, T, V]",
    "label_scores": "label scores at each position [B, T, C] (token classification)",
    "position_values": "a vector at each position [B, T, D] (hidden states, multi-label token scores)",
    "position_scalars": "one value at each position [B, T] (a value head, per-token rewards)",
    "row_scores": "label scores per row [B, C] (a sequence classifier)",
    "row_values": "a vector per row [B, D] (an embedding, multi-label or multi-target scores)",
    "row_scalars": "one value per row [B] (a reward or regression head)",
}
#: the kinds whose values are a distribution's logits, compared as log-probabilities
SCORES = ("vocabulary", "label_scores", "row_scores")
#: the names a model's structured output is read by, in order: a head's logits first, then what
#: embedding pipelines use (a sentence embedding, the last hidden states, the pooled output)
OUTPUT_NAMES = ("logits", "sentence_embedding", "last_hidden_state", "pooler_output")
#: the two lengths an output is measured at: a dimension that follows the length is the
#: sequence's, one that equals a length at one of them only (``num_labels=5``) is not
PROBE_LENGTHS = (5, 7)


@dataclass(frozen=True)
class OutputKind:
    """What one model returns: its kind, the width ``C`` of the ``[B, T, C]`` the engine
    sees (1 for a scalar), and where in the model's return value it is read."""

    name: OutputKindName
    width: int
    source: str = "logits"
    declared: bool = False  # the model declared the kind (maskcheck_output_kind); else measured

    def __post_init__(self) -> None:
        if self.name not in KINDS:
            raise ValueError(f"unknown output kind {self.name!r}; one of {', '.join(KINDS)}")

    @property
    def per_position(self) -> bool:
        return not self.name.startswith("row_")

    @property
    def is_vocabulary(self) -> bool:
        return self.name == "vocabulary"

    @property
    def units(self) -> Units:
        return "log_probabilities" if self.log_probabilities else "raw"

    @property
    def log_probabilities(self) -> bool:
        """Whether it is compared as log-probabilities: one distribution's scores, over more
        than one value (a log-softmax over one is 0 whatever the value)."""
        return self.name in SCORES and self.width > 1

    @property
    def decodes_no_tokens(self) -> str:
        """Why a model of this kind has no cache to audit, one line (every kind but the vocabulary's)."""
        return f"the model returns {KINDS[self.name]}, not next-token logits: it decodes no tokens"

    def describe(self) -> str:
        """One line for the report: what it is, where it is read, how it is compared."""
        how = "declared" if self.declared else "measured"
        units = "log-probabilities" if self.log_probabilities else "raw values"
        return (
            f"{self.name}: {KINDS[self.name]}, width {self.width}, read from {self.source} ({how}), compared as {units}"
        )

    def in_positions(self, value: Any, length: int) -> Any:
        """``value`` as ``[B, T, C]``: ``[B, T]`` gains a last dimension of one, a per-row
        ``[B]`` or ``[B, C]`` stands at each of the ``length`` positions of its row. Anything
        of another rank is handed back for the shape check to name."""
        if not isinstance(value, Tensor):
            return value
        if self.per_position:
            return value.unsqueeze(-1) if value.dim() == 2 else value
        if value.dim() == 1:
            value = value.unsqueeze(-1)  # [B] -> [B, 1]
        if value.dim() != 2:
            return value
        return value.unsqueeze(1).expand(-1, length, -1).contiguous()  # [B, C] -> [B, T, C]


def vocabulary(vocab_size: int) -> OutputKind:
    """The kind of a language model's logits, the one every model had before it was measured."""
    return OutputKind("vocabulary", vocab_size)


def read_output(out: Any, name: str | None = None) -> tuple[Any, str]:
    """The tensor a model's return value holds, and where it was found: ``name`` when given (an
    attribute or key), else the value itself when it is a tensor, else the first of
    :data:`OUTPUT_NAMES` it holds, else the first item of a tuple or list. An
    :class:`AdapterError` of one line when there is none."""
    if name is not None:
        value = out.get(name) if isinstance(out, Mapping) else getattr(out, name, None)
        if not isinstance(value, Tensor):
            raise AdapterError(f"the model's output has no tensor {name!r} (it returned {_described(out)})")
        return value, name
    if isinstance(out, Tensor):
        return out, "the returned tensor"
    for candidate in OUTPUT_NAMES:
        value = out.get(candidate) if isinstance(out, Mapping) else getattr(out, candidate, None)
        if isinstance(value, Tensor):
            return value, candidate
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0], "the first item returned"
    raise AdapterError(
        f"the model returned {_described(out)}: no tensor named {', '.join(OUTPUT_NAMES)} to audit "
        "(name the output in maskcheck_output_name)"
    )


def measure_output(
    call: Callable[[Tensor], tuple[Tensor, str]],
    vocab_size: int,
    device: str,
    *,
    scores: bool | None = None,
    declared: str | None = None,
) -> OutputKind:
    """The kind of what ``call(input_ids [2, T])`` returns (the tensor read from the model's
    output, and where it was read: :func:`read_output`), measured at two lengths.

    ``scores``: whether a ``[.., C]`` output holds single-label class scores (True), raw
    values (False), or is unknown (None: a per-position width equal to the vocabulary is a
    language model's logits, anything else raw values). ``declared``: the kind the model
    declares, which must agree with the measurement. Raises :class:`AdapterError` with one
    line for an output that fits no kind."""
    shapes, source = [], "the returned tensor"
    for length in PROBE_LENGTHS:
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(1, max(2, vocab_size), (2, length), generator=generator).to(device)
        with torch.inference_mode():
            value, source = call(ids)
        shapes.append(tuple(value.shape))
    kind = _kind_of(shapes, vocab_size, scores)
    if kind is None:
        raise AdapterError(
            f"the model's output ({source}) has shape {list(shapes[0])} for ids [2, {PROBE_LENGTHS[0]}] and "
            f"{list(shapes[1])} for ids [2, {PROBE_LENGTHS[1]}]: it fits no output kind maskcheck audits "
            "([B, T, C], [B, T], [B, C] or [B])"
        )
    name_found, width = kind
    if declared is not None:
        return _declared(declared, name_found, width, source, shapes)
    if name_found.startswith("row_") and width == vocab_size and scores is None:
        raise AdapterError(
            f"the model's output ({source}) is {list(shapes[0])} for ids [2, {PROBE_LENGTHS[0]}]: one row of "
            f"{vocab_size} values, as wide as the vocabulary, is one position's logits of a language model, which "
            "maskcheck audits at every position (return [B, T, V]; a forward taking targets= is given them), or a "
            "head of as many outputs: declare maskcheck_output_kind"
        )
    return OutputKind(name_found, width, source)  # type: ignore[arg-type]


def _kind_of(shapes: list[tuple[int, ...]], vocab_size: int, scores: bool | None) -> tuple[str, int] | None:
    """The kind and width two shapes at :data:`PROBE_LENGTHS` show, or None."""
    (first, second), (short, long) = shapes, PROBE_LENGTHS
    if first[:1] != (2,) or second[:1] != (2,) or len(first) != len(second):
        return None
    tracks_length = len(first) >= 2 and first[1] == short and second[1] == long
    if tracks_length and len(first) == 2:
        return "position_scalars", 1
    if tracks_length and len(first) == 3 and first[2] == second[2]:
        width = first[2]
        if width == 1:
            return "position_scalars", 1
        if scores is None:
            return ("vocabulary" if width == vocab_size else "position_values"), width
        return ("label_scores" if scores else "position_values"), width
    if first != second:  # a dimension that moves with the length but is not the second
        return None
    if len(first) == 1 or (len(first) == 2 and first[1] == 1):
        return "row_scalars", 1
    if len(first) == 2:
        return ("row_scores" if scores else "row_values"), first[1]
    return None


def _declared(declared: str, measured: str, width: int, source: str, shapes: list[tuple[int, ...]]) -> OutputKind:
    """The declared kind, where the measurement agrees with it (per row or per position, and a
    width of one for a scalar); an :class:`AdapterError` of one line where it does not."""
    if declared not in KINDS:
        raise AdapterError(f"maskcheck_output_kind={declared!r} is no output kind; one of {', '.join(KINDS)}")
    kind = OutputKind(declared, width, source, declared=True)  # type: ignore[arg-type]
    measured_kind = OutputKind(measured, width, source)  # type: ignore[arg-type]
    scalar = declared.endswith("_scalars")
    if kind.per_position != measured_kind.per_position or scalar != (width == 1):
        raise AdapterError(
            f"maskcheck_output_kind={declared!r} ({KINDS[declared]}), but the model returns {list(shapes[0])} for ids "
            f"[2, {PROBE_LENGTHS[0]}] and {list(shapes[1])} for ids [2, {PROBE_LENGTHS[1]}]: {KINDS[measured]}"
        )
    return kind


def _described(out: Any) -> str:
    """A model's return value in a few words: its type, its tensors' names and shapes."""
    if isinstance(out, Mapping):
        fields = {k: list(v.shape) if isinstance(v, Tensor) else type(v).__name__ for k, v in out.items()}
        return f"a {type(out).__name__} {fields}"
    if isinstance(out, (tuple, list)):
        items = [list(v.shape) if isinstance(v, Tensor) else type(v).__name__ for v in out]
        return f"a {type(out).__name__} of {items}"
    return f"a {type(out).__name__}"
