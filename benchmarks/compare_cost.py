"""What a compare costs against one audit of the same model, measured in the same run.

    python benchmarks/compare_cost.py [--runs 3] [--profile ci] [--pair llama]

The tiny Llama of ``reference_models/hf_tiny.py`` (or ``--pair mistral``) in its eager and
sdpa backends: ``maskcheck.compare(eager, sdpa)`` and ``maskcheck.audit(eager)`` on
compare's default suites, each in its own process, alternating, ``--runs`` times each.
Each process times the call alone (imports and model building are out) with one torch
thread, as a pytest-xdist worker. Prints each run, the medians and the ratio compare /
audit; the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
from maskcheck import audit
from maskcheck.harness.compare.run import DEFAULT_SUITES, compare
from maskcheck.reference_models.hf_tiny import tiny_model

what, pair, profile = sys.argv[1], sys.argv[2], sys.argv[3]
a, b = tiny_model(pair, "eager"), tiny_model(pair, "sdpa")
started = time.perf_counter()
if what == "compare":
    status = compare(a, b, DEFAULT_SUITES, profile=profile).status
else:
    status = audit(a, list(DEFAULT_SUITES), profile=profile).status
print(json.dumps({"seconds": time.perf_counter() - started, "status": status}))
"""


def timed(what: str, pair: str, profile: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, what, pair, profile], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"the {what} run failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each, alternating (default: 3)")
    parser.add_argument("--profile", default="ci", help="the profile both run under (default: ci)")
    parser.add_argument("--pair", default="llama", choices=["llama", "mistral"], help="the tiny model (default: llama)")
    args = parser.parse_args(argv)
    seconds: dict[str, list[float]] = {"compare": [], "audit": []}
    for run in range(1, args.runs + 1):
        for what in ("compare", "audit"):
            measured = timed(what, args.pair, args.profile)
            seconds[what].append(measured["seconds"])
            print(f"run {run}: {what:<8} {measured['seconds']:6.2f} s  ({measured['status']})", flush=True)
    compare_s, audit_s = (statistics.median(seconds[what]) for what in ("compare", "audit"))
    ratios = [c / a for c, a in zip(seconds["compare"], seconds["audit"])]
    print(
        f"tiny {args.pair}, eager vs sdpa, profile {args.profile}, medians of {args.runs}: compare {compare_s:.2f} s, "
        f"audit of A {audit_s:.2f} s, ratio {compare_s / audit_s:.2f} (per run {min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
