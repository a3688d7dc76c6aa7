"""``maskcheck compare SPEC_A SPEC_B``: two implementations of one model, check by check."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..engine.profile_names import PROFILE_NAMES


def add_parser(sub: Any) -> None:
    compare = sub.add_parser(
        "compare",
        help="compare two implementations of one model on every suite's cases, down to the first differing module",
        description="Run the suites' cases (padded, packed, cached decoding, serving operations) on two models with "
        "the same inputs and compare their log-probabilities at the positions the suites protect, against the "
        "tolerance model's threshold. A check where they part is shrunk to its smallest case and replayed with "
        "hooks on both models: the report names the first module whose output differs.",
        epilog="Exit codes: 0 the two agree on every check compared; 1 they part (or a check errored); 2 usage "
        "or loading error, or no check compared anything. "
        "Example: maskcheck compare hf:./llama hf:./llama --attn-implementation eager,sdpa",
    )
    compare.add_argument(
        "spec_a", help="model A (the reference): ref:PRESET, mutant:NAME, hf:DIR or module:pkg.mod:factory"
    )
    compare.add_argument("spec_b", help="model B (the implementation under test), a spec as for A")
    compare.add_argument(
        "--suites",
        help="comma-separated suites (default: causal, padding, cross_attention, "
        "loss_masking, packing, kv_cache, serving)",
    )
    compare.add_argument("--profile", default="ci", choices=PROFILE_NAMES, help="case counts (default: ci)")
    compare.add_argument("--examples", type=int, help="cases per check (default: from the profile)")
    compare.add_argument("--seed", type=int, default=0, help="seed for case generation (default: 0)")
    compare.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    compare.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype of both")
    compare.add_argument(
        "--attn-implementation",
        help="hf: A's and B's attention backends, comma-separated (eager,sdpa); one name sets both",
    )
    compare.add_argument(
        "--map",
        dest="module_map",
        help="JSON file (or inline JSON) of A's module names to B's, for trees that differ (default: by name, "
        "else by order and shape)",
    )
    compare.add_argument(
        "--weights",
        help="load A's weights into B first: 'same' (the same names) or a JSON file of A's tensor names to B's "
        "(null drops a tensor); every tensor must be placed and every parameter of B loaded",
    )
    compare.add_argument("--json", dest="json_path", help="write the comparison as JSON here")
    compare.add_argument(
        "--report",
        dest="report_dir",
        default="maskcheck-report",
        help="where each parting check's reproduction goes, repro-compare-SUITE-CHECK/ with a pytest file that "
        "fails on its own (default: maskcheck-report)",
    )
    compare.add_argument(
        "--picture",
        help="PNG path: where A and B part, per module and position, on the first failing check's smallest case",
    )


def draw_first_parting(result: Any, path: str) -> str | None:
    from ..compare.picture import draw_parting

    for suite in result.suites:
        for check in suite.checks:
            found = check.first_difference
            if found is not None and found.profile:
                title = f"{suite.name}/{check.name}: where B parts from A\nA: {result.a}\nB: {result.b}"
                return str(draw_parting(found, path, title))
    return None


def cmd_compare(args: argparse.Namespace) -> int:
    from ..adapters.specs import LoadOptions, SpecError, load_adapter
    from ..compare.render import render_comparison
    from ..compare.run import CompareError, compare
    from ..compare.weights import WeightsMismatch, name_map
    from ..engine.registry import UnknownSuiteError
    from .quiet import quiet_transformers

    quiet_transformers()
    try:
        attn = (args.attn_implementation or "").split(",") if args.attn_implementation else [None]
        if len(attn) > 2:
            raise ValueError("--attn-implementation takes one backend or two (A's,B's)")
        attn_a, attn_b = attn[0], attn[-1]
        module_map = name_map(args.module_map, "--map")
        weights: Any = False
        if args.weights == "same":
            weights = True
        elif args.weights is not None:
            weights = name_map(args.weights, "--weights")
        a = load_adapter(args.spec_a, LoadOptions(device=args.device, dtype=args.dtype, attn_implementation=attn_a))
        b = load_adapter(args.spec_b, LoadOptions(device=args.device, dtype=args.dtype, attn_implementation=attn_b))
        result = compare(
            a,
            b,
            args.suites.split(",") if args.suites else None,
            profile=args.profile,
            seed=args.seed,
            examples=args.examples,
            module_map=module_map,
            weights=weights,
            progress=lambda suite: print(f"comparing {suite} ...", file=sys.stderr),
            bundle_dir=args.report_dir,
        )
    except (SpecError, UnknownSuiteError, CompareError, WeightsMismatch, ValueError, OSError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    print(render_comparison(result))
    if args.picture:
        drawn = draw_first_parting(result, args.picture)
        print(f"picture: {drawn}" if drawn else "picture: not drawn (no check parts at a module laid out by position)")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result.exit_code
