"""Verdicts and cases of a fixed set of audits, recorded once and compared after engine changes.

    python -m tests.verdict_record --write     # record tests/data/verdicts.json
    python -m tests.verdict_record --add       # record only the audits it does not hold yet

The set is the mutation score's (every seeded bug under its suite, every clean model
under every suite), ``dev`` profile, seed 0. For every check it keeps the status, the
case that decided a ``fail`` (shrunk) or a ``warn``, and for a check that did not fail,
the cases it evaluated (their number and a digest): an engine change that batches,
reorders or memoises forwards must leave all of it as it was. Audits run on the
canonical call path only, and checks added after the record (the gradient checks) are
left out of the comparison; every recorded check must be there and equal. The case a ``pass``
reports is its worst by measured ratio, a choice among differences at the noise floor
that any change of forward shapes may reorder, so it is not kept.
``tests/test_batching.py`` compares fresh audits against the file (``--compare``), in a
process of its own, as it was recorded.

The record holds the engine after the cases were made to be what users give (labels
as collators build them, lengths up to the profile's cap): every status is the one the
engine before batching recorded, and the cases are those the engine draws since. Its
searches draw without Hypothesis's pool of constants from local modules
(``harness.engine.profiles.without_local_constants``). Make it again only for a change
that means to move cases, after checking that no status moved; say so in the changelog.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

RECORD = Path(__file__).parent / "data" / "verdicts.json"
#: checks a suite measures on fixed inputs instead of drawn cases (a pooled output's padding
#: sides, suites/pooling.py): their status is kept, and they have no cases to keep
MEASUREMENTS = ("pooling",)


def targets() -> dict[str, tuple[Any, list[str] | None]]:
    """label -> (model, suites): what the mutation score audits."""
    from maskcheck.reference_models import PRESETS
    from maskcheck.reference_models.heads import CLEAN_HEADS
    from maskcheck.reference_models.hf_tiny import TINY_CONFIGS
    from maskcheck.reference_models.mutants import CLEAN_PATTERNS, MUTANTS

    chosen: dict[str, tuple[Any, list[str] | None]] = {}
    for name, mutant in MUTANTS.items():
        chosen[f"mutant:{name}"] = (f"mutant:{name}", [mutant.suite])  # where it cannot be built: unbuildable()
    for preset in PRESETS:
        chosen[f"ref:{preset}"] = (f"ref:{preset}", None)
    for name in TINY_CONFIGS:
        for implementation in ("eager", "sdpa"):
            chosen[f"hf:{name}/{implementation}"] = ((name, implementation), None)
    for spec in (*CLEAN_HEADS, *CLEAN_PATTERNS):
        chosen[spec] = (spec, None)
    return chosen


def unbuildable() -> dict[str, str]:
    """label -> why this environment cannot build it: the seeded bugs of an optional test
    subject (torchtune, in a test environment of its own); compared only where it is installed."""
    from maskcheck.reference_models.mutants import MUTANTS

    return {f"mutant:{name}": str(mutant.missing()) for name, mutant in MUTANTS.items() if mutant.missing()}


def record(label: str, batch_cases: bool = True) -> dict[str, dict[str, dict[str, Any]]]:
    """suite -> check -> what :mod:`this module <tests.verdict_record>` keeps, for one audit of :func:`targets`."""
    import dataclasses
    import hashlib

    from maskcheck import audit
    from maskcheck.harness.adapters.hf import HFAdapter
    from maskcheck.harness.audits import runner
    from maskcheck.reference_models.hf_tiny import tiny_model

    model, suites = targets()[label]
    if isinstance(model, tuple):
        model = HFAdapter(tiny_model(*model))
    evaluated: dict[str, set[str]] = {}
    # The batching gate runs its check through run_check_keeping_cases, the suites through _run_one: both are seen.
    originals = {"run_check_keeping_cases": runner.run_check_keeping_cases, "_run_one": runner._run_one}

    def recording(name: str) -> Any:
        def run(check: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
            seen = evaluated.setdefault(check.name, set())

            def evaluate(case: Any) -> Any:
                seen.add(repr(case))
                return check.evaluate(case)

            return originals[name](dataclasses.replace(check, evaluate=evaluate), context, *args, **kwargs)

        return run

    for name in originals:
        setattr(runner, name, recording(name))
    try:
        # The canonical path only: the record predates call paths, which add runs of their own.
        result = audit(
            model, suites, paths=("canonical",), **({} if batch_cases else {"batch_cases": False})
        )  # the engine before batching had no such option
    finally:
        for name, original in originals.items():
            setattr(runner, name, original)
    kept: dict[str, dict[str, dict[str, Any]]] = {}
    for suite in result.suites:
        for check in suite.checks:
            entry: dict[str, Any] = {"status": check.status}
            if check.status in ("fail", "warn"):
                entry["case"] = check.case
            if check.status in ("pass", "warn") and not evaluated.get(check.name) and check.name not in MEASUREMENTS:
                raise RuntimeError(
                    f"{label}: the recorder saw no case of {suite.name}/{check.name}, which passed or warned:"
                    " the runner runs checks another way; mend record() before recording"
                )
            if check.status != "fail" and check.name in evaluated:
                cases = sorted(evaluated[check.name])
                entry["evaluated"] = [len(cases), hashlib.sha256("\n".join(cases).encode()).hexdigest()[:16]]
            kept.setdefault(suite.name, {})[check.name] = entry
    return json.loads(json.dumps(kept))  # cases hold tuples; the file holds lists


def recorded_part(fresh: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The checks of a fresh audit that the record holds: checks added since (the gradient
    checks) are new, not changed; a recorded check that is missing still differs."""
    return {suite: {name: fresh.get(suite, {}).get(name) for name in checks} for suite, checks in expected.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {RECORD}")
    parser.add_argument(
        "--compare", action="store_true", help=f"audit every model of {RECORD.name} again; exit 1 if any differs"
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help=f"record the audits {RECORD.name} does not hold yet (new seeded bugs and clean models), keeping the rest",
    )
    parser.add_argument(
        "--statuses",
        action="store_true",
        help="with --compare: compare only each recorded check's status (before --write for a change that moves cases)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if args.compare:
        expected = json.loads(RECORD.read_text())
        for label, why in unbuildable().items():
            expected.pop(label, None)
            print(f"not compared here: {why}", flush=True)
        differing = []
        for label in sorted(expected):
            fresh = recorded_part(record(label), expected[label])
            if args.statuses:
                moved = [
                    f"{suite}/{name}: {entry['status']} -> {(fresh[suite][name] or {}).get('status', 'missing')}"
                    for suite, checks in expected[label].items()
                    for name, entry in checks.items()
                    if (fresh[suite][name] or {}).get("status") != entry["status"]
                ]
                if moved:
                    differing.append(label)
                    print(f"statuses differ from the record: {label}: {'; '.join(moved)}", flush=True)
            elif fresh != expected[label]:
                differing.append(label)
                print(f"differs from the record: {label}", flush=True)
        what = "audits' statuses" if args.statuses else "audits"
        print(f"{len(expected) - len(differing)} of {len(expected)} {what} equal to the record")
        return 1 if differing else 0
    if args.add:
        kept = json.loads(RECORD.read_text())
        for label in targets():
            if label not in kept and label not in unbuildable():
                kept[label] = record(label)
                print(f"added {label}", flush=True)
        RECORD.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        return 0
    recorded = {}
    missing = unbuildable()
    for label in targets():
        if label in missing:  # kept as recorded where it could be built
            recorded[label] = json.loads(RECORD.read_text()).get(label)
            print(f"kept as recorded: {missing[label]}", flush=True)
            continue
        recorded[label] = record(label)
        print(
            label,
            {s: sorted({v["status"] for v in checks.values()}) for s, checks in recorded[label].items()},
            flush=True,
        )
    if args.write:
        RECORD.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
