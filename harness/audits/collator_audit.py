"""Auditing a data collator: ``maskcheck audit collator:pkg.mod:factory --task causal-lm|packed|seq2seq``.

The factory returns the collate function (a transformers ``DataCollator...`` or any callable
taking a list of feature dicts and returning a dict of tensors). The examples are made of
the collator's own ids: its tokenizer's pad and EOS ids and ids that are no special token;
a collator without a tokenizer (``DataCollatorWithFlattening``) gets pad 0, EOS 2 and
ordinary ids from 3, or the ids passed in. The checks are in :mod:`maskcheck.suites.collator`;
a failing check's shrunk examples go to a bundle with a standalone test that rebuilds the
collator and shows the batch.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...suites import collator as checks_of
from ..engine.profiles import check_profile, examples_of
from ..engine.suite import CaseFailed, Outcome, RunContext, run_check
from ..engine.tolerance import tolerance_for
from ..engine.verdict import SuiteResult
from .runner import AuditResult

SUITE = "collator"


class CollatorError(Exception):
    """A collator spec that cannot be loaded; one line for the user."""


@dataclass
class CollatorTarget:
    spec: str
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
    vocabulary: checks_of.Vocabulary
    factory: str | None  # ``pkg.mod:factory`` when the collator can be rebuilt by name


def vocabulary_of(collate: Any, pad_id: int | None = None, eos_id: int | None = None) -> checks_of.Vocabulary:
    tokenizer = getattr(collate, "tokenizer", None)
    pad = pad_id if pad_id is not None else getattr(tokenizer, "pad_token_id", None)
    eos = eos_id if eos_id is not None else getattr(tokenizer, "eos_token_id", None)
    if tokenizer is None:
        pad = 0 if pad is None else pad
        eos = 2 if eos is None else eos
    if pad is None:
        raise CollatorError(
            "the collator's tokenizer has no pad token: padding needs one (set tokenizer.pad_token, or pass pad_id)"
        )
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | {pad, eos}
    size = len(tokenizer) if tokenizer is not None else 64
    ordinary = tuple(i for i in range(size) if i not in special)[:32]
    if len(ordinary) < 2:
        raise CollatorError("the collator's tokenizer has fewer than two ordinary ids to build examples from")
    return checks_of.Vocabulary(pad, eos, ordinary)


def load_collator(
    spec: str | Callable[..., Any], pad_id: int | None = None, eos_id: int | None = None
) -> CollatorTarget:
    """A collator from ``collator:pkg.mod:factory`` (or ``pkg.mod:factory``), or from a collate callable itself."""
    from ..adapters.specs import SpecError, call_factory

    if callable(spec):
        return CollatorTarget(
            getattr(spec, "__name__", type(spec).__name__), spec, vocabulary_of(spec, pad_id, eos_id), None
        )
    target = spec.removeprefix("collator:")
    try:
        collate = call_factory(target, "collator")
    except SpecError as exc:
        raise CollatorError(str(exc)) from None
    if not callable(collate):
        raise CollatorError(f"the factory {target} returned {type(collate).__name__}, not a collate function")
    return CollatorTarget(f"collator:{target}", collate, vocabulary_of(collate, pad_id, eos_id), target)


def audit_collator(
    collator: str | Callable[..., Any] | CollatorTarget,
    task: str = "causal-lm",
    *,
    seed: int = 0,
    profile: str = "dev",
    examples: int | None = None,
    bundle_dir: str | Path | None = None,
    pad_id: int | None = None,
    eos_id: int | None = None,
) -> AuditResult:
    """Run the ``task``'s collator checks; a failing check's shrunk case goes to ``bundle_dir``."""
    if task not in checks_of.TASKS:
        raise CollatorError(f"unknown collator task {task!r}; choose one of {', '.join(checks_of.TASKS)}")
    check_profile(profile)
    target = collator if isinstance(collator, CollatorTarget) else load_collator(collator, pad_id, eos_id)
    context = RunContext(
        tolerance=tolerance_for("cpu", "float32"),
        seed=seed,
        examples=examples if examples is not None else examples_of(profile),
        profile=profile,
    )
    import platform

    import torch
    import transformers

    # The report schema's environment; a collator's work is on token ids on the CPU.
    environment = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "dtype": "int64",
        "seed": seed,
        "profile": profile,
        "task": task,
        "pad_id": target.vocabulary.pad,
        "eos_id": target.vocabulary.eos,
    }
    result = AuditResult(target.spec, environment, adapter={"spec": target.spec, "kind": "collator", "task": task})
    started = time.perf_counter()
    suite = SuiteResult(SUITE)
    failures: list[tuple[str, CaseFailed]] = []
    for check in checks_of.checks(task, guarded(target.collate), target.vocabulary):
        check_result, cases, failure = run_check(check, context)
        suite.cases += cases
        suite.checks.append(check_result)
        if failure is not None:
            failures.append((check.name, failure))
            # The examples themselves say more than the shapes they were drawn from.
            check_result.case = {"examples": checks_of.build_examples(failure.case, task, target.vocabulary)}
    suite.seconds = time.perf_counter() - started
    if failures and bundle_dir is not None:
        suite.reproduction = str(write_collator_bundle(Path(bundle_dir) / "repro-collator", target, task, failures))
    result.suites.append(suite)
    return result


def guarded(
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """The collate function; what it raises, or returns instead of a dict, fails the case."""

    def call(features: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            batch = collate([dict(f) for f in features])  # a copy each: a collator may edit its features
        except Exception as exc:  # noqa: BLE001 - a collator that raises on valid examples is a finding
            raise checks_of.CollatorFailed(
                f"the collator raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        if not hasattr(batch, "keys"):
            raise checks_of.CollatorFailed(f"the collator returned {type(batch).__name__}, not a dict of tensors")
        return dict(batch)

    return call


def write_collator_bundle(
    directory: Path, target: CollatorTarget, task: str, failures: list[tuple[str, CaseFailed]]
) -> Path:
    """``case.json`` and ``test_repro_collator.py``: the shrunk examples of each failing check,
    run through the rebuilt collator and the check again."""
    directory.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, failure in failures:
        features = checks_of.build_examples(failure.case, task, target.vocabulary)
        cases.append({"check": name, "message": failure.outcome.message, "examples": features})
    from ..adapters.specs import import_root

    root = import_root(f"module:{target.factory}") if target.factory else None
    data = {
        "format": 1,
        "kind": "collator",
        "spec": target.spec,
        "factory": target.factory,
        "import_root": root,
        "task": task,
        "pad_id": target.vocabulary.pad,
        "eos_id": target.vocabulary.eos,
        "cases": cases,
    }
    (directory / "case.json").write_text(json.dumps(data, indent=1) + "\n")
    (directory / "test_repro_collator.py").write_text(REPRO_TEST)
    return directory


REPRO_TEST = '''"""Reproduction of a maskcheck collator finding: run with pytest (or python) in this directory.

case.json holds, per failing check, the shrunk list of examples; each is collated again by the
collator's factory and checked again, printing the batch.
"""

import json
from pathlib import Path

import pytest

from maskcheck.harness.audits.collator_audit import replay_collator_case

DATA = json.loads((Path(__file__).parent / "case.json").read_text())


@pytest.mark.parametrize("index", range(len(DATA["cases"])), ids=[c["check"] for c in DATA["cases"]])
def test_repro_collator(index: int) -> None:
    outcome, batch = replay_collator_case(DATA, index)
    print(DATA["cases"][index]["examples"], "->", batch)
    assert outcome.status != "fail", outcome.message


if __name__ == "__main__":
    for i, case in enumerate(DATA["cases"]):
        outcome, batch = replay_collator_case(DATA, i)
        print(case["check"], case["examples"], "->", batch, "\\n ", outcome.status, outcome.message)
'''


def replay_collator_case(data: dict[str, Any], index: int) -> tuple[Outcome, dict[str, Any] | None]:
    """Collate a bundle's recorded examples again and run its check on them."""
    if not data.get("factory"):
        raise CollatorError(
            "the bundle's collator was passed as an object, not a factory importable by name: it cannot be rebuilt"
        )
    root = data.get("import_root")
    if root and root not in sys.path:  # the factory's package, importable from any working directory
        sys.path.insert(0, root)
    target = load_collator(data["factory"], data["pad_id"], data["eos_id"])
    case = data["cases"][index]
    try:
        batch = guarded(target.collate)(case["examples"])
    except checks_of.CollatorFailed as exc:
        return Outcome("fail", message=str(exc)), None
    return checks_of.CHECKS[data["task"]][case["check"]](batch, case["examples"], target.vocabulary), batch
