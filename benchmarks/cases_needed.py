"""How many cases a check needs to catch each seeded bug: what a profile's case count is sized by.

    python benchmarks/cases_needed.py [--profile ci] [--counts 1,2,3,4,6,8,12,20]

For every seeded bug (reference_models/mutants.py) it audits the bug's suite, on every
call path, with each case count of ``--counts`` in turn (``audit(examples=N)``: the
minimal case first, then N - 1 drawn ones), and prints the smallest count at which the
bug's recorded check fails, with the forwards and tokens that audit made. A count is
tried only while the smaller ones missed, so a bug caught by its minimal case costs one
audit. ``MISSED`` means no count up to the largest caught it. The last lines give, per
suite, the largest count any of its bugs needed: a profile that draws fewer cases than
that loses a bug of the catalogue.

``--sweep`` measures the same on real architectures: for every model type of the
architecture sweep's CI subset (tests/test_architectures.py, ``SUBSET``; ``--only`` picks
some), it audits the sweep's suites at the profile's own count, then at each count of
``--counts`` below it, and prints the smallest count whose every check has the status it
has at the profile's count (``-`` where none below it does): what a real model's findings
need, where the seeded catalogue says what a known bug needs.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from audit_overhead import count  # noqa: E402  (this folder is on sys.path when run as a script)

from maskcheck.harness.engine.profile_names import PROFILE_NAMES  # noqa: E402
from maskcheck.reference_models.mutants import MUTANTS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.test_architectures: the sweep's CI subset and its records


def needed(name: str, profile: str, counts: list[int]) -> tuple[int | None, int, int, float]:
    """(the smallest count that catches ``name``, forwards, tokens, seconds) of the audit that caught it."""
    mutant = MUTANTS[name]
    for examples in counts:
        started = time.perf_counter()
        tallies, result = count(f"mutant:{name}", profile, [mutant.suite], examples)
        seconds = time.perf_counter() - started
        total = sum(tallies.values(), collections.Counter())
        check = next((c for c in result.suite(mutant.suite).checks if c.name == mutant.check), None)
        if check is not None and check.status == "fail":
            return examples, total["forwards"], total["tokens"], seconds
    return None, total["forwards"], total["tokens"], seconds


def statuses(result: object) -> dict[tuple[str, str], str]:
    return {(suite.name, check.name): check.status for suite in result.suites for check in suite.checks}


def sweep_needed(model_type: str, task: str, profile: str, counts: list[int]) -> tuple[int | None, dict, float]:
    """(the smallest count of ``counts`` whose checks all keep their status at the profile's
    own count, that count's statuses, seconds of the profile's audit) for one shrunk type."""
    from maskcheck.harness.adapters.hf import HFAdapter
    from maskcheck.harness.engine.profiles import examples_of
    from maskcheck.harness.engine.registry import suite_names
    from maskcheck.reference_models.hf_tiny import shrunk_model
    from tests.test_architectures import recorded

    suites = suite_names(lambda suite: suite.in_sweep)
    model = shrunk_model(model_type, task, level=recorded(model_type, task).get("shrink", "full"))
    adapter = HFAdapter(model, f"hf-type:{model_type}", task=task)
    started = time.perf_counter()
    full = statuses(count(adapter, profile, suites)[1])
    seconds = time.perf_counter() - started
    for examples in [c for c in counts if c < examples_of(profile)]:
        if statuses(count(adapter, profile, suites, examples)[1]) == full:
            return examples, full, seconds
    return None, full, seconds


def sweep_main(profile: str, counts: list[int], only: list[str]) -> int:
    from tests.test_architectures import SUBSET

    types = [tuple(getattr(entry, "values", entry)) for entry in SUBSET]
    types = [t for t in types if not only or t[0] in only]
    print(f"profile {profile}, counts {counts}, torch {torch.__version__}, 1 thread: the sweep's CI subset")
    print(f"  {'type':<14} {'task':<10} {'needs':>5} {'s':>6}  statuses other than pass at the profile's count")
    needs: list[int | None] = []
    for model_type, task in types:
        examples, full, seconds = sweep_needed(model_type, task, profile, counts)
        needs.append(examples)
        findings = ", ".join(f"{s}/{c}={v}" for (s, c), v in full.items() if v not in ("pass", "not_applicable"))
        print(f"  {model_type:<14} {task:<10} {examples or '-':>5} {seconds:>6.1f}  {findings}", flush=True)
    most = "the profile's own" if None in needs else max(needs, default=0)
    print(f"\nthe most cases a type of the subset needed: {most}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="ci", choices=PROFILE_NAMES)
    parser.add_argument("--counts", default="1,2,3,4,6,8,12,20", help="case counts to try, ascending")
    parser.add_argument("--only", default="", help="comma-separated seeded bugs, or model types (default: all)")
    parser.add_argument("--sweep", action="store_true", help="the sweep's CI subset instead of the seeded bugs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        counts = sorted(int(c) for c in args.counts.split(","))
    except ValueError:
        parser.error(f"--counts takes positive integers separated by commas, not {args.counts!r}")
    if counts[0] < 1:
        parser.error("--counts takes positive integers")
    if args.sweep:
        return sweep_main(args.profile, counts, [n for n in args.only.split(",") if n])
    names = [n for n in args.only.split(",") if n] or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        parser.error(f"unknown seeded bug(s): {', '.join(unknown)}; see reference_models/mutants.py")
    largest: dict[str, int] = collections.defaultdict(int)
    missed = []
    print(f"profile {args.profile}, counts {counts}, torch {torch.__version__}, 1 thread")
    print(f"  {'seeded bug':<40} {'suite/check':<36} {'needs':>5} {'forwards':>8} {'tokens':>7} {'s':>6}")
    for name in names:
        mutant = MUTANTS[name]
        needs, forwards, tokens, seconds = needed(name, args.profile, counts)
        if needs is None:
            missed.append(name)
        else:
            largest[mutant.suite] = max(largest[mutant.suite], needs)
        shown, check = "MISSED" if needs is None else str(needs), f"{mutant.suite}/{mutant.check}"
        print(
            f"  {name:<40} {check:<36} {shown:>5} {forwards:>8} {tokens:>7} {seconds:>6.1f}",
            flush=True,
        )
    print("\nthe most cases a seeded bug of each suite needed:")
    for suite, needs in sorted(largest.items()):
        print(f"  {suite:<16} {needs}")
    if missed:
        print(f"missed at every count: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
