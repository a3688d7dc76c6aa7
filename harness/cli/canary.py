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
        "fixed false-alarm rate, whether its own loss goes below that bound. Exit 1 if a canary fires, warns (a loss "
        "computed wrongly, or a pipeline that did not train enough to show a leak) or cannot run.",
    )
    canary.add_argument("specs", nargs="+", metavar="spec", help=SPEC_HELP + "; several run one after another")
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
    from ..audits.canary import CanarySettings

    if args.steps < 2 or not 0 < args.alpha < 1:
        print("maskcheck: error: --steps must be at least 2 and --alpha between 0 and 1", file=sys.stderr)
        return 2
    settings = CanarySettings(steps=args.steps, window=min(50, args.steps), alpha=args.alpha)
    results, failed = [], False
    for spec in args.specs:
        ran = _run_spec(spec, args, settings)
        if ran is None:
            return 2
        results += [r for r in ran if r is not None]
        failed |= any(r is None or r.status != "pass" for r in ran)
    if args.report_dir:
        from ..audits.canary import draw_losses

        out = Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "canary.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
        draw_losses(results, out / "canary.png", f"leak canary: {', '.join(args.specs)}")
        print(f"report: {out / 'canary.json'}, {out / 'canary.png'}")
    return 1 if failed else 0


def _run_spec(spec: str, args: argparse.Namespace, settings: Any) -> list[Any] | None:
    """The result of every chosen canary on ``spec``, printed as it comes (None for a canary
    that could not run); None for a spec that cannot be built, a usage error."""
    from ..adapters.specs import SpecError, call_factory
    from ..audits.canary import CANARIES, CanaryError
    from ..audits.canary_api import resolve_pipeline

    try:
        run, own = resolve_pipeline(_pipeline(spec, call_factory))
    except (SpecError, CanaryError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return None
    results = []
    for canary in list(CANARIES) if args.canary == "all" else [args.canary or own]:
        print(f"maskcheck canary {canary} on {spec}: {settings.steps} steps ...", file=sys.stderr, flush=True)
        try:
            result = run(canary, settings, args.seed)
        except CanaryError as exc:
            print(f"{spec}  {canary:<16} ERROR  {exc}")
            results.append(None)
            continue
        result.label = f"{spec} {canary}"
        results.append(result)
        print(f"{spec}  {canary:<16} {result.status.upper():<5}  {result.message}")
        for note in result.notes:
            print(f"    measured: {note}")
    return results


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
