"""``maskcheck compare`` of eager against sdpa attention across the architecture sweep's CI subset.

For each type of the subset (tests/test_architectures.py), the shrunk random-init model is
built with ``attn_implementation="eager"`` and again with ``"sdpa"``, with the same weights,
and compared on the mask and cache suites. A type that has no sdpa path is said so. A
disagreement between transformers' two backends is a finding about transformers, confirmed
with plain transformers calls before it is written down (docs/compare.md).

    python scripts/sweep/compare_backends.py [--types gpt2,llama] [--profile dev]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

SUITES = ["causal", "padding", "packing", "kv_cache", "serving"]


def subset() -> list[str]:
    from test_architectures import SUBSET

    return [p.values[0] if hasattr(p, "values") else p[0] for p in SUBSET]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", help="comma-separated model types (default: the sweep's CI subset)")
    parser.add_argument("--profile", default="dev")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from maskcheck.harness.compare.run import compare
    from maskcheck.reference_models.hf_tiny import shrunk_model

    types = args.types.split(",") if args.types else subset()
    print(f"{'type':<14} {'status':<8} {'seconds':>7}  parting checks (first differing module)")
    for model_type in types:
        started = time.perf_counter()
        try:
            eager = shrunk_model(model_type, "causal-lm", "eager")
            sdpa = shrunk_model(model_type, "causal-lm", "sdpa")
        except Exception as exc:  # noqa: BLE001 - a type without an sdpa path is said, not skipped silently
            print(f"{model_type:<14} {'n/a':<8} {0:>7.1f}  sdpa not built: {str(exc).splitlines()[0][:100]}")
            continue
        sdpa.load_state_dict(eager.state_dict())
        result = compare(eager, sdpa, SUITES, profile=args.profile)
        parting = [
            f"{s.name}/{c.name}" + (f" ({c.first_difference.a_name})" if c.first_difference else f": {c.message[:120]}")
            for s in result.suites
            for c in s.checks
            if c.status in ("fail", "error")
        ]
        took = time.perf_counter() - started
        print(f"{model_type:<14} {result.status:<8} {took:>7.1f}  {'; '.join(parting) or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
