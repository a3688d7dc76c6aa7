"""``maskcheck canary``: the leak canary on a training pipeline (harness/audits/canary.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SPEC_HELP = (
    "the pipeline: pipeline:NAME (maskcheck's own, 'maskcheck list' names them) or module:pkg.mod:factory, "
    "whose factory returns a training step step(batch) -> loss (or (loss, logits)), a (step, canary) pair, "
    "a transformers Trainer, or a model (trained with AdamW on its own loss)"
)


def add_parser(sub: Any) -> None:
    canary = sub.add_parser(
        "canary",
        help="train a pipeline on data no leak-free pipeline can beat, and test its loss against that bound",
        description="Feed a training pipeline synthetic data whose best leak-free loss is known (i.i.d. uniform "
        "tokens; a document packed twice in one row; twin rows in a batch) and decide, with a one-sided test at a "
        "fixed false-alarm rate, whether its own loss goes below that bound. Exit 1 if a canary fires.",
    )
    canary.add_argument("spec", help=SPEC_HELP)
    canary.add_argument(
        "--canary",
        choices=["uniform", "twin_documents", "twin_rows", "all"],
        help="which canary (default: the pipeline's own; uniform for a model or a step)",
    )
    canary.add_argument("--steps", type=int, default=300, help="training steps, one fresh batch each (default: 300)")
    canary.add_argument("--seed", type=int, default=0, help="seeds the canary's data (default: 0)")
    canary.add_argument("--alpha", type=float, default=1e-3, help="false-alarm rate per canary (default: 0.001)")
    canary.add_argument("--report", dest="report_dir", help="write canary.json and canary.png here")


def cmd_canary(args: argparse.Namespace) -> int:
    from ..adapters.specs import SpecError, call_factory
    from ..audits.canary import CANARIES, CanaryError, CanarySettings, draw_losses, resolve_pipeline

    if args.steps < 2 or not 0 < args.alpha < 1:
        print("maskcheck: error: --steps must be at least 2 and --alpha between 0 and 1", file=sys.stderr)
        return 2
    try:
        pipeline = _pipeline(args.spec, call_factory)
        run, own = resolve_pipeline(pipeline)
    except (SpecError, CanaryError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    settings = CanarySettings(steps=args.steps, window=min(50, args.steps), alpha=args.alpha)
    chosen = list(CANARIES) if args.canary == "all" else [args.canary or own]
    results = []
    for canary in chosen:
        print(f"maskcheck canary {canary} on {args.spec}: {settings.steps} steps ...", file=sys.stderr, flush=True)
        try:
            result = run(canary, settings, args.seed)
        except CanaryError as exc:
            print(f"{canary:<16} ERROR  {exc}")
            return 2
        result.label = canary
        results.append(result)
        print(f"{canary:<16} {result.status.upper():<5}  {result.message}")
    if args.report_dir:
        out = Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "canary.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
        draw_losses(results, out / "canary.png", f"leak canary: {args.spec}")
        print(f"report: {out / 'canary.json'}, {out / 'canary.png'}")
    return 1 if any(r.status == "fail" for r in results) else 0


def _pipeline(spec: str, call_factory: Any) -> Any:
    from ..adapters.specs import SpecError

    scheme, _, target = spec.partition(":")
    if scheme == "pipeline":
        from ...reference_models.pipelines import PIPELINES

        if target not in PIPELINES:
            raise SpecError(f"unknown pipeline {target!r}; known: {', '.join(PIPELINES)}")
        return PIPELINES[target][0]()
    if scheme == "module":
        return call_factory(target)
    raise SpecError(f"a canary spec is pipeline:NAME or module:pkg.mod:factory, got {spec!r}")
