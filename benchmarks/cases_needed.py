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
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
import warnings
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from maskcheck import audit  # noqa: E402
from maskcheck.reference_models.mutants import MUTANTS  # noqa: E402


class ForwardCounter:
    """Counts the forwards and input tokens of every ``nn.Module`` subclass the audit calls at top level."""

    def __init__(self) -> None:
        self.forwards = 0
        self.tokens = 0
        self.depth = 0
        self.original = torch.nn.Module.__call__
        counter = self

        @functools.wraps(self.original)
        def call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if counter.depth:
                return counter.original(module, *args, **kwargs)
            counter.depth += 1
            try:
                ids = kwargs.get("input_ids", args[0] if args else None)
                counter.forwards += 1
                if isinstance(ids, torch.Tensor):
                    counter.tokens += ids.numel()
                return counter.original(module, *args, **kwargs)
            finally:
                counter.depth -= 1

        torch.nn.Module.__call__ = call  # type: ignore[method-assign]

    def remove(self) -> None:
        torch.nn.Module.__call__ = self.original  # type: ignore[method-assign]


def needed(name: str, profile: str, counts: list[int]) -> tuple[int | None, int, int, float]:
    """(the smallest count that catches ``name``, forwards, tokens, seconds) of the audit that caught it."""
    mutant = MUTANTS[name]
    for count in counts:
        counter = ForwardCounter()
        started = time.perf_counter()
        try:
            result = audit(f"mutant:{name}", [mutant.suite], profile=profile, examples=count)
        finally:
            counter.remove()
        seconds = time.perf_counter() - started
        check = next((c for c in result.suite(mutant.suite).checks if c.name == mutant.check), None)
        if check is not None and check.status == "fail":
            return count, counter.forwards, counter.tokens, seconds
    return None, counter.forwards, counter.tokens, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="ci", choices=["dev", "ci", "thorough"])
    parser.add_argument("--counts", default="1,2,3,4,6,8,12,20", help="case counts to try, ascending")
    parser.add_argument("--only", default="", help="comma-separated seeded bugs (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    counts = sorted(int(c) for c in args.counts.split(","))
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
        count, forwards, tokens, seconds = needed(name, args.profile, counts)
        if count is None:
            missed.append(name)
        else:
            largest[mutant.suite] = max(largest[mutant.suite], count)
        shown, check = "MISSED" if count is None else str(count), f"{mutant.suite}/{mutant.check}"
        print(
            f"  {name:<40} {check:<36} {shown:>5} {forwards:>8} {tokens:>7} {seconds:>6.1f}",
            flush=True,
        )
    print("\nthe most cases a seeded bug of each suite needed:")
    for suite, count in sorted(largest.items()):
        print(f"  {suite:<16} {count}")
    if missed:
        print(f"missed at every count: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
