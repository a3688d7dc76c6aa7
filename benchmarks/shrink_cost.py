"""What shrinking a failure costs: every seeded bug audited with and without shrinking.

    python benchmarks/shrink_cost.py [--profile dev|ci]

For each mutant of reference_models/mutants.py, its suite is audited twice in this
process, alternating: once as usual (Hypothesis generates, then shrinks the failure),
once with generation only. The difference is the shrinking's cost; the table also says
how many cases each run evaluated. A check stops shrinking after
``RunContext.shrink_seconds`` (60 s by default) and reports the smallest failing case
found by then; the last line says whether any mutant came near that budget.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from maskcheck import audit  # noqa: E402
from maskcheck.harness.audits import runner  # noqa: E402
from maskcheck.harness.engine.profile_names import PROFILE_NAMES  # noqa: E402
from maskcheck.harness.engine.suite import RunContext  # noqa: E402
from maskcheck.reference_models.mutants import MUTANTS  # noqa: E402


def timed_audit(name: str, suite: str, profile: str, shrink: bool) -> tuple[float, int]:
    """Seconds and cases of one audit of mutant ``name`` under ``suite``."""
    original = runner.RunContext
    runner.RunContext = functools.partial(RunContext, shrink=shrink)  # type: ignore[misc]
    try:
        started = time.perf_counter()
        result = audit(f"mutant:{name}", [suite], profile=profile)
        return time.perf_counter() - started, result.suite(suite).cases
    finally:
        runner.RunContext = original  # type: ignore[misc]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dev", choices=PROFILE_NAMES)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the median is reported (default: 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"shrinking cost per seeded bug, profile {args.profile}, torch {torch.__version__}, 1 thread")
    print(f"  {'mutant':<38} {'suite':<16} {'shrunk s':>9} {'unshrunk s':>11} {'shrinking s':>12} {'cases':>12}")
    costs = []
    for name, mutant in MUTANTS.items():
        runs: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
        timed_audit(name, mutant.suite, args.profile, False)  # warm-up: building the model, first kernels
        for _ in range(args.repeats):
            for shrink in (False, True):
                runs[shrink].append(timed_audit(name, mutant.suite, args.profile, shrink))
        shrunk = statistics.median(s for s, _ in runs[True])
        unshrunk = statistics.median(s for s, _ in runs[False])
        costs.append(shrunk - unshrunk)
        cases = f"{runs[True][0][1]} vs {runs[False][0][1]}"
        print(
            f"  {name:<38} {mutant.suite:<16} {shrunk:>9.2f} {unshrunk:>11.2f} {shrunk - unshrunk:>12.2f} {cases:>12}"
        )
    budget = RunContext.__dataclass_fields__["shrink_seconds"].default
    print(
        f"  shrinking: median {statistics.median(costs):.2f} s, most {max(costs):.2f} s a seeded bug (budget {budget:g} s a check)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
