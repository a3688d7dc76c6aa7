"""Mutation score: seeded bugs caught by their suite, and false positives on clean models.

    python scripts/mutation_score.py [--dtype bfloat16] [--profile quick]      (or: make mutation-score)

Every seeded bug in reference_models/mutants.py must fail the suite named after it,
on the check it records; every clean model (reference presets, tiny Hugging Face
models under eager and sdpa) must fail no suite. Exits 1 unless the score is 100%
with zero false positives. ``--dtype`` runs every model, seeded and clean, in that dtype
(the thresholds follow it); ``--profile`` draws that profile's cases (default: the audit's, ``dev``).
With ``--allow-misses`` it scores a profile that is not meant to catch every bug (``quick``)
and exits 1 only on a false positive.
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore")

import torch

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.specs import LoadOptions
from maskcheck.harness.engine.profile_names import PROFILE_NAMES
from maskcheck.harness.engine.registry import suite_names
from maskcheck.reference_models import PRESETS
from maskcheck.reference_models.heads import CLEAN_HEADS
from maskcheck.reference_models.hf_tiny import TINY_CONFIGS, tiny_model
from maskcheck.reference_models.mutants import CLEAN_PATTERNS, MUTANTS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    parser.add_argument("--profile", choices=PROFILE_NAMES, default="dev")
    parser.add_argument("--allow-misses", action="store_true", help="exit 1 only on a false positive")
    args = parser.parse_args()
    options = LoadOptions(dtype=args.dtype)
    started = time.perf_counter()
    suites = suite_names()
    print(f"Seeded bugs ({len(MUTANTS)}), profile {args.profile}{' in ' + args.dtype if args.dtype else ''}:")
    caught = 0
    missing = {name: mutant.missing() for name, mutant in MUTANTS.items() if mutant.missing()}
    installed = {mutant.requires for mutant in MUTANTS.values() if mutant.requires and not mutant.missing()}
    for name, mutant in MUTANTS.items():
        if name in missing:
            print(f"  {'skipped':<7} {name:<34} {missing[name]}")
            continue
        result = audit(f"mutant:{name}", [mutant.suite], options=options, profile=args.profile)
        check = next((c for c in result.suite(mutant.suite).checks if c.name == mutant.check), None)
        hit = check is not None and check.status == "fail"
        caught += hit
        print(
            f"  {'caught' if hit else 'MISSED':<7} {name:<34} {mutant.suite}/{mutant.check}  case={check.case if check else None}"
        )
    print(f"\nClean models (suites: {', '.join(suites)}):")
    false_positives = 0
    modules = [  # plain modules: an object cache, a module-state cache with and without a mask, torchtune's
        "module:maskcheck.reference_models.plain:plain_decoder",
        "module:maskcheck.reference_models.scratch:ScratchDecoder",
        "module:maskcheck.reference_models.scratch:ScratchDecoderTakingMask",
        *(["module:maskcheck.reference_models.torchtune_decoders:tiny_torchtune"] if "torchtune" in installed else []),
        *CLEAN_PATTERNS,  # a prefix LM, Llama 4's chunks
    ]
    clean = (
        [(f"ref:{p}", f"ref:{p}") for p in PRESETS]
        + [(f"hf:{n}/{impl}", (n, impl)) for n in TINY_CONFIGS for impl in ("eager", "sdpa")]
        + [(spec, spec) for spec in modules]
        + [(spec.rsplit(":", 1)[1], spec) for spec in CLEAN_HEADS]  # classifiers, rewards, embeddings, taggers
    )
    for label, target in clean:
        if isinstance(target, str):
            result = audit(target, suites, options=options, profile=args.profile)
        else:
            model = tiny_model(*target)
            result = audit(
                HFAdapter(model.to(getattr(torch, args.dtype)) if args.dtype else model), suites, profile=args.profile
            )
        bad = [
            f"{s.name}/{c.name}" for s in result.suites for c in s.checks if c.status in ("fail", "error", "not_run")
        ]
        false_positives += bool(bad)
        statuses = " ".join(f"{s.name}={s.status}" for s in result.suites)
        print(f"  {'FALSE POSITIVE' if bad else 'clean':<14} {label:<36} {statuses}")
    ran = len(MUTANTS) - len(missing)
    skipped = (
        f" ({len(missing)} not built here: {', '.join(sorted({MUTANTS[n].requires for n in missing}))} missing)"
        if missing
        else ""
    )
    print(
        f"\nmutation score: {caught}/{ran} = {caught / ran:.0%}{skipped}; false positives: {false_positives}/{len(clean)} "
        f"clean models ({time.perf_counter() - started:.0f}s)"
    )
    return 0 if (args.allow_misses or caught == ran) and false_positives == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
