"""Calibrate the leak canary offline: its false-alarm rate on clean pipelines over many
seeds against the nominal one, how often each seeded pipeline bug fires, and what a run
costs. Prints a table for docs/canary.md and can draw its picture.

    python scripts/canary_calibration.py --seeds 100                 # clean pipelines, 100 data seeds each
    python scripts/canary_calibration.py --seeds 20 --leaking        # the seeded bugs too
    python scripts/canary_calibration.py --picture docs/canary-loss-curves.png

A seed draws the canary's data; the pipelines' weights are their fixed seed-0 tiny models,
so what varies is what the test sees, batch by batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from maskcheck.harness.audits.canary import CanarySettings, draw_losses
from maskcheck.harness.audits.canary_api import resolve_pipeline
from maskcheck.reference_models.pipelines import PIPELINES


def calibrate(names: list[str], seeds: int, settings: CanarySettings) -> None:
    print("| pipeline | leaks | seeds | fired | rate | nominal | median s a run |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        factory, leaks = PIPELINES[name]
        fired, seconds = 0, []
        for seed in range(seeds):
            started = time.perf_counter()
            run, canary = resolve_pipeline(factory())
            result = run(canary, settings, seed)
            seconds.append(time.perf_counter() - started)
            fired += result.status != "pass"  # a warning (inconclusive, a loss computed wrongly) is an alarm too
            print(f"  {name} seed {seed}: {result.status} {result.message[:100]}", file=sys.stderr, flush=True)
        nominal = "-" if leaks else f"{settings.alpha:g}"
        print(
            f"| {name} | {'yes' if leaks else 'no'} | {seeds} | {fired} | {fired / seeds:.3g} | {nominal} | "
            f"{statistics.median(seconds):.1f} |",
            flush=True,
        )


def picture(path: str, settings: CanarySettings) -> None:
    results = []
    for name in ("clean_decoder", "causal_off_by_one", "clean_packing", "packing_across_documents"):
        run, canary = resolve_pipeline(PIPELINES[name][0]())
        result = run(canary, settings, 0)
        result.label = f"{name} ({canary})"
        results.append(result)
    draw_losses(results, path, "leak canary: clean and leaking pipelines against the bound")
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--leaking", action="store_true", help="the seeded pipeline bugs too")
    parser.add_argument("--pipelines", help="comma-separated names (default: the clean ones, and with --leaking all)")
    parser.add_argument("--steps", type=int, default=CanarySettings().steps)
    parser.add_argument("--picture", help="draw the loss curves of two clean and two leaking pipelines to this PNG")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = CanarySettings(steps=args.steps)
    if args.picture:
        picture(args.picture, settings)
        return 0
    names = (
        args.pipelines.split(",")
        if args.pipelines
        else [n for n, (_, leaks) in PIPELINES.items() if args.leaking or not leaks]
    )
    calibrate(names, args.seeds, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
