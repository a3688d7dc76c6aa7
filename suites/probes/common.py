"""What both probes share: choosing a haystack for a model, the result object, and the files it writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...harness.adapters.base import Adapter
from ...harness.engine.suite import ProbeError
from .haystacks import Sample, SyntheticHaystack, Templates, TextHaystack
from .scoring import greedy_answer, score

Progress = Callable[[int, int], None]  # (done, total)


def haystack_for(
    adapter: Adapter, text: str | None = None, templates: Templates | dict[str, str] | None = None
) -> SyntheticHaystack | TextHaystack:
    """Text prompts for a model with a tokenizer; the synthetic retrieval language for a
    reference model trained on it (its checkpoint records the vocabulary). ``templates``
    may be given as a dict of :class:`Templates` fields."""
    if isinstance(templates, dict):
        templates = Templates(**templates)
    if adapter.capabilities.tokenizer is not None:
        return TextHaystack(adapter.capabilities.tokenizer, text, templates)
    record = adapter.checkpoint
    vocab = None if record is None else record.metadata.get("maskcheck.retrieval_vocab")
    if vocab:
        from ...reference_models.retrieval import RetrievalVocab

        return SyntheticHaystack(RetrievalVocab.from_json(vocab))
    raise ProbeError(
        f"{adapter.spec} has no tokenizer and was not trained on the synthetic retrieval language; "
        "probe a Hugging Face directory with tokenizer files, or ref:kv-retrieval"
    )


def default_lengths(adapter: Adapter, start: int = 32) -> list[int]:
    """Doubling lengths from ``start`` up to the model's maximum (at most 8192)."""
    top = min(adapter.capabilities.max_length or 1024, 8192)
    lengths, length = [], start
    while length <= top:
        lengths.append(length)
        length *= 2
    return lengths or [top]


def beyond(adapter: Adapter, length: int) -> str | None:
    caps = adapter.capabilities
    if caps.trained_length and length > caps.trained_length:
        return f"beyond the trained length {caps.trained_length}"
    if caps.max_length and length > caps.max_length:
        return f"beyond the declared maximum {caps.max_length}"
    return None


@dataclass
class ProbeResult:
    name: str
    model: str
    summary: dict[str, Any]
    grid: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    grid_path: str | None = None
    picture: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report's ``probes`` entry (docs/design.md): name, summary, grid file, picture."""
        return {"name": self.name, "summary": self.summary, "grid": self.grid_path, "picture": self.picture}

    def write(self, directory: str | Path, draw: Callable[[Any, Path], Path]) -> None:
        """``<name>.json`` (summary, grid and every sample's scores) and ``<name>.png``."""
        from ...harness.report.render import write_json

        directory = Path(directory)
        stem = self.name
        grid_path = directory / f"{stem}.json"
        write_json(
            grid_path,
            {
                "name": self.name,
                "model": self.model,
                "summary": self.summary,
                "grid": self.grid,
                "samples": self.samples,
            },
        )
        self.grid_path = str(grid_path)
        self.picture = str(draw(self, directory / f"{stem}.png"))


def sample_row(adapter: Adapter, prompt: Sample, generate: bool, **fields: Any) -> dict[str, Any]:
    """One sample's scores; with ``generate``, also whether real greedy decoding produces the
    value (the string match of published needle benchmarks, for parity)."""
    row = {**fields, "distance": prompt.distance, "tokens": len(prompt.prompt), **score(adapter, prompt).to_dict()}
    if generate:
        generated = greedy_answer(adapter, prompt.prompt, len(prompt.answer))
        tokenizer = adapter.capabilities.tokenizer
        if tokenizer is not None and "value" in prompt.meta:
            row["generated_match"] = prompt.meta["value"] in tokenizer.decode(generated.tolist())
        else:
            row["generated_match"] = generated.tolist() == prompt.answer.tolist()
    return row
